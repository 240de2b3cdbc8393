//! Live migration on the two-node cluster (`scripts/cluster.sh up --nodes 2`, kubevirt-rs
//! deployed): `kubectl create` of a `VirtualMachineInstanceMigration` moves a running VM to
//! the other node — the controller's target pod, both handlers, both launchers, the stream
//! over mutual TLS between the handlers' pods — and `kubectl drain` of that node moves it
//! back (virt-api's eviction webhook, the evacuation controller). The guest is the same
//! guest throughout: after both moves a soft reboot finds it alive on the last node (it
//! answers Ctrl-Alt-Del) and it boots once, there, afterwards.
//!
//! Needs root and /dev/kvm; fails (never skips) when the cluster or the deployment cannot
//! be brought up. Named to run after the single-node cluster binaries (cargo runs test
//! binaries by name): they take over a cluster kept up between binaries, and a second node
//! would break their single-node assumptions.

use std::path::Path;
use std::time::{Duration, Instant};

use integration::cluster::{self, Cluster, NODE_NAME, NODE2_NAME};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, PostParams};
use proto::kubevirt::{
    MigrationPhase, Phase, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
};
use serde_json::{Value, json};

const TIMEOUT: Duration = Duration::from_secs(240);

async fn wait_for<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    integration::wait_for_within(what, TIMEOUT, check).await
}

/// Prints what a reader of a failed run needs — the migrations, the VMI, the pods and where
/// they run, the namespace's events, the control plane's and both handlers' logs — when the
/// test panics while this guard lives.
struct DumpOnFailure<'a> {
    cluster: &'a Cluster,
    namespace: String,
}

impl Drop for DumpOnFailure<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let ns = self.namespace.as_str();
        let kubevirt = cluster::kubevirt::NAMESPACE;
        let dumps: [&[&str]; 8] = [
            &["get", "nodes", "-o", "wide"],
            &["-n", ns, "get", "vmim,vmi,pods", "-o", "wide"],
            &["-n", ns, "get", "vmim", "-o", "yaml"],
            &["-n", ns, "get", "vmi", "-o", "yaml"],
            &["-n", ns, "get", "events", "--sort-by=.lastTimestamp"],
            &["-n", kubevirt, "get", "pods", "-o", "wide"],
            &[
                "-n",
                kubevirt,
                "logs",
                "-l",
                "kubevirt.io=virt-controller",
                "--prefix",
                "--tail=400",
            ],
            &[
                "-n",
                kubevirt,
                "logs",
                "-l",
                "kubevirt.io=virt-handler",
                "--prefix",
                "--tail=400",
            ],
        ];
        for args in dumps {
            let output = self.cluster.kubectl_output(args);
            eprintln!(
                "==== kubectl {}\n{}",
                args.join(" "),
                output.unwrap_or_else(|e| format!("{e:#}"))
            );
        }
    }
}

/// `images/examples/vm-testguest.yaml` as a VM that may move: `host-passthrough` (this
/// project publishes no host-model CPU identity, so host-model VMIs are not migratable) and
/// `evictionStrategy: LiveMigrate`.
fn migratable_vm(name: &str) -> VirtualMachine {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/examples/vm-testguest.yaml");
    let text = std::fs::read_to_string(&path).expect("the example VM");
    let mut vm: Value = serde_yaml::from_str(&text).expect("a YAML VirtualMachine");
    vm["metadata"] = json!({"name": name});
    vm["spec"]["runStrategy"] = json!("Always");
    let template = &mut vm["spec"]["template"];
    template["metadata"]["labels"]["kubevirt.io/vm"] = json!(name);
    template["spec"]["domain"]["cpu"]["model"] = json!("host-passthrough");
    template["spec"]["evictionStrategy"] = json!("LiveMigrate");
    serde_json::from_value(vm).expect("a VirtualMachine")
}

fn node_of(vmi: &VirtualMachineInstance) -> String {
    vmi.status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn console_of(cluster: &Cluster, namespace: &str, pod: &str) -> String {
    cluster
        .kubectl_output(&["-n", namespace, "logs", pod, "-c", "guest-console-log"])
        .unwrap_or_default()
}

/// The running launcher pod of the VMI on `node`.
async fn pod_on(pods: &Api<Pod>, vmi_uid: &str, node: &str) -> Option<Pod> {
    pods.list(&ListParams::default().labels(&format!("kubevirt.io/created-by={vmi_uid}")))
        .await
        .ok()?
        .items
        .into_iter()
        .find(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
}

/// Waits until the VMI runs on `node` with its migration completed, and returns it.
async fn moved_to(
    vmis: &Api<VirtualMachineInstance>,
    name: &str,
    node: &str,
) -> VirtualMachineInstance {
    wait_for(&format!("the VMI handed over to {node}"), || async {
        vmis.get_opt(name).await.ok().flatten().filter(|v| {
            let label = v
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubevirt.io/nodeName"))
                .map(String::as_str);
            let done = v
                .migration_state()
                .ok()
                .flatten()
                .is_some_and(|s| s.is_completed() && !s.is_failed());
            node_of(v) == node && label == Some(node) && done && v.phase() == Phase::Running
        })
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vm_moves_to_the_other_node_and_a_drain_moves_it_back() {
    let cluster = match cluster::shared_with_nodes(2).await {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot bring up the two-node test cluster: {e:#}"),
    };
    cluster::kubevirt::deploy(cluster, &[NODE_NAME, NODE2_NAME])
        .await
        .unwrap_or_else(|e| panic!("cannot deploy kubevirt-rs on the two-node cluster: {e:#}"));
    let ns = cluster
        .create_namespace("migrate")
        .await
        .expect("namespace");
    let _dump = DumpOnFailure {
        cluster,
        namespace: ns.clone(),
    };
    let client = cluster.client().expect("client");
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let migrations: Api<VirtualMachineInstanceMigration> = Api::namespaced(client.clone(), &ns);

    vms.create(&PostParams::default(), &migratable_vm("mover"))
        .await
        .expect("the VM");
    let vmi = wait_for("the VMI running and migratable", || async {
        vmis.get_opt("mover").await.ok().flatten().filter(|v| {
            v.phase() == Phase::Running
                && v.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.condition_type == "LiveMigratable" && c.status == "True")
                })
        })
    })
    .await;
    let uid = vmi.metadata.uid.clone().unwrap();
    let first = node_of(&vmi);
    let second = if first == NODE_NAME {
        NODE2_NAME
    } else {
        NODE_NAME
    }
    .to_string();
    assert_eq!(
        vmi.status.as_ref().unwrap().migration_method.as_deref(),
        Some("BlockMigration"),
        "a container disk is copied"
    );
    let source_pod = pod_on(&pods, &uid, &first).await.expect("the launcher pod");
    let source_pod_name = source_pod.metadata.name.clone().unwrap();
    wait_for("the guest's checks on the console", || async {
        console_of(cluster, &ns, &source_pod_name)
            .contains("DONE passed=")
            .then_some(())
    })
    .await;

    // kubectl create: the VM moves to the other node.
    let migration = json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        "metadata": {"name": "move-over"}, "spec": {"vmiName": "mover"},
    });
    let file = std::env::temp_dir().join(format!("vmim-{ns}.json"));
    std::fs::write(&file, migration.to_string()).unwrap();
    cluster
        .kubectl_output(&["-n", &ns, "create", "-f", &file.to_string_lossy()])
        .expect("kubectl create the migration");
    let started = Instant::now();
    let moved = moved_to(&vmis, "mover", &second).await;
    let done = wait_for("the migration Succeeded", || async {
        migrations
            .get_opt("move-over")
            .await
            .ok()
            .flatten()
            .filter(|m| m.phase() == MigrationPhase::Succeeded)
    })
    .await;
    eprintln!(
        "migrated {first} -> {second} in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    let state = serde_json::to_value(moved.migration_state().unwrap().unwrap()).unwrap();
    assert_eq!(state["sourceNode"], first);
    assert_eq!(state["targetNode"], second);
    assert_eq!(state["mode"], "PreCopy");
    assert_eq!(state["migrationUid"], json!(done.metadata.uid));
    for key in [
        "startTimestamp",
        "endTimestamp",
        "targetNodeDomainReadyTimestamp",
        "targetNodeAddress",
    ] {
        assert!(state[key].is_string(), "{key} missing: {state}");
    }
    assert_eq!(
        moved.metadata.uid.as_deref(),
        Some(uid.as_str()),
        "the same VMI"
    );
    // virt-api put its label and finalizer on; the finalizer went once it was over.
    assert_eq!(
        done.metadata.labels.as_ref().unwrap()["kubevirt.io/vmi-name"],
        "mover"
    );
    // The source pod completes; the guest went on: no boot on the target's console.
    wait_for("the source pod Succeeded", || async {
        let pod = pods.get_opt(&source_pod_name).await.ok().flatten();
        pod.is_none_or(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Succeeded"))
            .then_some(())
    })
    .await;
    let target_pod = pod_on(&pods, &uid, &second)
        .await
        .expect("the target pod runs");
    let target_pod_name = target_pod.metadata.name.clone().unwrap();
    let console = console_of(cluster, &ns, &target_pod_name);
    assert!(
        !console.contains("TEST serial"),
        "the guest booted again on {second}:\n{console}"
    );

    // kubectl drain of that node: the eviction becomes an evacuation, the VM moves back.
    let drain = cluster.kubectl_output(&[
        "drain",
        &second,
        "--pod-selector=kubevirt.io=virt-launcher",
        "--delete-emptydir-data",
        "--timeout=240s",
    ]);
    let uncordon = cluster.kubectl_output(&["uncordon", &second]);
    drain.expect("kubectl drain");
    uncordon.expect("kubectl uncordon");
    let back = moved_to(&vmis, "mover", &first).await;
    assert_eq!(back.metadata.uid.as_deref(), Some(uid.as_str()));
    let evacuations: Vec<VirtualMachineInstanceMigration> = migrations
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|m| {
            m.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kubevirt.io/evacuationMigration"))
                == Some(&second)
        })
        .collect();
    assert_eq!(evacuations.len(), 1, "one evacuation migration");
    assert_eq!(evacuations[0].phase(), MigrationPhase::Succeeded);

    // The same guest, alive on the first node again: it answers Ctrl-Alt-Del (soft reboot)
    // before it boots, once, there.
    let last_pod = pod_on(&pods, &uid, &first)
        .await
        .expect("the launcher pod back on the first node");
    let last_pod_name = last_pod.metadata.name.clone().unwrap();
    assert_ne!(last_pod_name, source_pod_name);
    let output = cluster
        .virtctl()
        .args(["-n", &ns, "soft-reboot", "mover"])
        .output()
        .expect("virtctl");
    assert!(output.status.success(), "virtctl soft-reboot: {output:?}");
    let console = wait_for("the guest to answer and boot again", || async {
        let console = console_of(cluster, &ns, &last_pod_name);
        console.contains("DONE passed=").then_some(console)
    })
    .await;
    let answered = console
        .find("SHUTDOWN requested")
        .expect("the running guest answered");
    let booted = console.find("TEST serial").expect("a boot");
    assert!(
        answered < booted,
        "the guest booted before it answered:\n{console}"
    );
    assert_eq!(console.matches("TEST serial").count(), 1, "{console}");

    vms.delete("mover", &Default::default())
        .await
        .expect("delete the VM");
    wait_for("the VMI gone", || async {
        vmis.get_opt("mover")
            .await
            .ok()
            .flatten()
            .is_none()
            .then_some(())
    })
    .await;
}
