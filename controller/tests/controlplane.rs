//! The controllers against a real etcd + kube-apiserver + kube-controller-manager (the
//! `integration` crate's control plane). There is no kubelet: the test plays it — it binds
//! launcher pods to a node, marks them Ready without starting anything, and finishes pods
//! that are being deleted — and it plays virt-handler by writing VMI phases.
//! Fails (never skips) when the control plane cannot be built or started.

use controller::leader::{LeaderOptions, LeaderWork, run_when_leader};
use controller::metrics::Metrics;
use controller::run::{Options, run};
use controller::template::TemplateConfig;
use controller::writes::{Write, Writes};
use futures::StreamExt;
use integration::controlplane::{self, ControlPlane};
use integration::wait_for;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use proto::kubevirt::{
    MigrationPhase, Phase, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

const WAIT: Duration = Duration::from_secs(90);
/// A VMI (and so its pod) with this label gets its pod failed by the fake kubelet.
const FAIL_LABEL: &str = "test.kubevirt-rs/fail-pod";
/// A VMI (and so its pod) with this label gets its pod reported Ready only 3 s after it is
/// bound, as a real kubelet starting containers would: until then only a pod change can
/// move the VMI on.
const SLOW_LABEL: &str = "test.kubevirt-rs/slow-pod";

async fn control_plane() -> &'static ControlPlane {
    match controlplane::shared().await {
        Ok(cp) => cp,
        Err(e) => panic!(
            "cannot run the test control plane: {e:#}\nbuild it with: {}",
            controlplane::build_script().display()
        ),
    }
}

/// A namespace, a node, a fake kubelet and (optionally) a controller, all for one test.
struct Setup {
    client: kube::Client,
    namespace: String,
    node: String,
    writes: Arc<Writes>,
    stops: Vec<oneshot::Sender<()>>,
}

impl Setup {
    async fn new(prefix: &str, with_controller: bool) -> Self {
        // Logs with RUST_LOG=controller=debug.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let cp = control_plane().await;
        let namespace = cp.create_namespace(prefix).await.expect("namespace");
        let client = cp.client().expect("client");
        let node = format!("node-{namespace}");
        let nodes: Api<Node> = Api::all(client.clone());
        let object = Node {
            metadata: ObjectMeta {
                name: Some(node.clone()),
                labels: Some([("kubevirt.io/schedulable".to_string(), "true".to_string())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        nodes
            .create(&PostParams::default(), &object)
            .await
            .expect("node");
        let mut setup = Setup {
            client,
            namespace,
            node,
            writes: Arc::new(Writes::default()),
            stops: Vec::new(),
        };
        let (stop, stopped) = oneshot::channel();
        tokio::spawn(fake_kubelet(
            setup.client.clone(),
            setup.namespace.clone(),
            setup.node.clone(),
            stopped,
        ));
        setup.stops.push(stop);
        if with_controller {
            let (stop, stopped) = oneshot::channel::<()>();
            tokio::spawn(run(
                setup.client.clone(),
                setup.options("test-controller"),
                setup.writes.clone(),
                Arc::new(Metrics::new(setup.writes.clone())),
                async move {
                    let _ = stopped.await;
                },
            ));
            setup.stops.push(stop);
        }
        setup
    }

    fn options(&self, identity: &str) -> Options {
        Options {
            template: TemplateConfig {
                launcher_image: "quay.io/kubevirt/virt-launcher:v1.9.0".into(),
                ..TemplateConfig::default()
            },
            namespace: Some(self.namespace.clone()),
            identity: identity.into(),
            // Each test's namespace is its install: its KubeVirt CR, if it makes one.
            kubevirt_namespace: Some(self.namespace.clone()),
        }
    }

    fn api<K>(&self) -> Api<K>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }
}

/// Plays the kubelet for one namespace: binds new launcher pods to `node` and reports them
/// Running and Ready; removes pods that are being deleted (nothing runs, nothing to stop).
async fn fake_kubelet(
    client: kube::Client,
    namespace: String,
    node: String,
    mut stop: oneshot::Receiver<()>,
) {
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let mut events = watcher(pods.clone(), watcher::Config::default()).boxed();
    loop {
        let event = tokio::select! {
            _ = &mut stop => return,
            event = events.next() => event,
        };
        let Some(Ok(event)) = event else { continue };
        let pod = match event {
            watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => pod,
            _ => continue,
        };
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pod.metadata.deletion_timestamp.is_some() {
            let _ = pods
                .delete(
                    &name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await;
            continue;
        }
        let fail = pod
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(FAIL_LABEL))
            .is_some();
        if fail && pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Failed") {
            let status = json!({"status": {"phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory."}});
            let _ = pods
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(&status))
                .await;
            continue;
        }
        if pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_none()
        {
            // A migration's target pod goes to the other node, as its anti-affinity asks
            // (no pod of the same VMI there).
            let labels = pod.metadata.labels.clone().unwrap_or_default();
            let node = match (
                labels.contains_key("kubevirt.io/migrationJobUID"),
                labels.get("kubevirt.io/created-by"),
            ) {
                (true, Some(vmi)) => {
                    let siblings = pods
                        .list(
                            &ListParams::default().labels(&format!("kubevirt.io/created-by={vmi}")),
                        )
                        .await
                        .map(|l| l.items)
                        .unwrap_or_default();
                    let taken = |n: &str| {
                        siblings.iter().any(|p| {
                            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(n)
                        })
                    };
                    if taken(&node) {
                        target_node(&node)
                    } else {
                        node.clone()
                    }
                }
                _ => node.clone(),
            };
            let binding = Binding {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    ..Default::default()
                },
                target: ObjectReference {
                    kind: Some("Node".into()),
                    name: Some(node.clone()),
                    api_version: Some("v1".into()),
                    ..Default::default()
                },
            };
            if let Err(e) = pods
                .create_subresource::<Binding, serde_json::Value>(
                    "binding",
                    &name,
                    &PostParams::default(),
                    &binding,
                )
                .await
                && !matches!(&e, kube::Error::Api(s) if s.code == 409)
            {
                // 409: bound already (a repeated event for the same pod).
                eprintln!("fake kubelet: binding {name}: {e}");
            }
            continue;
        }
        let ready = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if !ready && pod.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Failed") {
            let slow = pod
                .metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(SLOW_LABEL));
            let pods = pods.clone();
            let report = async move {
                if slow {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                }
                report_ready(&pods, &name).await;
            };
            if slow {
                tokio::spawn(report);
            } else {
                report.await;
            }
        }
    }
}

/// The second node of a test: where migration target pods are bound.
fn target_node(node: &str) -> String {
    format!("{node}-target")
}

/// Reports pod `name` Running and Ready with a running `compute` container.
async fn report_ready(pods: &Api<Pod>, name: &str) {
    {
        {
            let now = k8s_openapi::jiff::Timestamp::now().to_string();
            let status = json!({"status": {
                "phase": "Running",
                "conditions": [
                    {"type": "PodScheduled", "status": "True"},
                    {"type": "Ready", "status": "True"},
                    {"type": "ContainersReady", "status": "True"},
                ],
                "containerStatuses": [{
                    "name": "compute", "ready": true, "restartCount": 0,
                    "image": "quay.io/kubevirt/virt-launcher:v1.9.0", "imageID": "",
                    "state": {"running": {"startedAt": now}},
                }],
            }});
            if let Err(e) = pods
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
                .await
            {
                eprintln!("fake kubelet: status of {name}: {e}");
            }
        }
    }
}

fn vm(name: &str, strategy: &str) -> VirtualMachine {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": name},
        "spec": {"runStrategy": strategy, "template": {
            "metadata": {"labels": {"kubevirt.io/vm": name}},
            "spec": {
                "domain": {
                    "devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}],
                                "interfaces": [{"name": "default", "masquerade": {}}]},
                    "memory": {"guest": "128Mi"},
                    // The launcher boots kernels only: a VMI without kernel boot gets no pod.
                    "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0", "container": {
                        "image": "quay.io/kubevirt/alpine-ext-kernel-boot-demo:v1.9.0",
                        "kernelPath": "/boot/vmlinuz-virt", "initrdPath": "/boot/initramfs-virt"}}},
                },
                "networks": [{"name": "default", "pod": {}}],
                "terminationGracePeriodSeconds": 0,
                "volumes": [{"name": "containerdisk", "containerDisk": {"image": "quay.io/kubevirt/alpine-container-disk-demo:v1.9.0"}}],
            }}}
    }))
    .expect("valid VM")
}

async fn get<K>(api: &Api<K>, name: &str) -> Option<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.expect("get")
}

/// Writes a VMI phase as virt-handler would (status subresource).
async fn set_phase(api: &Api<VirtualMachineInstance>, name: &str, phases: &[&str]) {
    for phase in phases {
        let mut vmi = get(api, name).await.expect("the VMI exists");
        let status = vmi.status.get_or_insert_with(Default::default);
        let phase: Phase = serde_json::from_value(json!(phase)).unwrap();
        status.phase = Some(phase);
        status
            .phase_transition_timestamps
            .push(proto::kubevirt::PhaseTransitionTimestamp {
                phase,
                phase_transition_timestamp: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
                extra: Default::default(),
            });
        let patch = json!({"status": {"phase": phase, "phaseTransitionTimestamps": status.phase_transition_timestamps}});
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("status patch");
    }
}

/// The node a VMI was handed to: phase Scheduled, `status.nodeName` and the node label (the
/// label is written right after the status, so the hand-off is complete once both are there).
fn scheduled_on(vmi: &VirtualMachineInstance) -> Option<String> {
    let node = vmi.status.as_ref()?.node_name.clone()?;
    let label = vmi.metadata.labels.as_ref()?.get("kubevirt.io/nodeName")?;
    (vmi.phase() == Phase::Scheduled && *label == node).then_some(node)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_vm_gets_a_vmi_and_pod_handed_to_the_node_and_halted_removes_them() {
    let setup = Setup::new("ctl-always", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let pods: Api<Pod> = setup.api();

    let created = vms
        .create(&PostParams::default(), &vm("testvm", "Always"))
        .await
        .expect("VM");
    let started = Instant::now();
    let vmi = wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "testvm")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    let to_scheduled = started.elapsed();

    // The hand-off: status.nodeName and the label the handler selects on.
    assert_eq!(scheduled_on(&vmi).as_deref(), Some(setup.node.as_str()));
    assert_eq!(
        vmi.metadata.labels.as_ref().unwrap()["kubevirt.io/nodeName"],
        setup.node
    );
    let phases: Vec<Phase> = vmi
        .status
        .as_ref()
        .unwrap()
        .phase_transition_timestamps
        .iter()
        .map(|t| t.phase)
        .collect();
    assert_eq!(
        phases,
        [Phase::Pending, Phase::Scheduling, Phase::Scheduled]
    );
    // From the pod: the launcher image and the QoS class.
    let status = vmi.status.as_ref().unwrap();
    assert_eq!(
        status.launcher_container_image_version.as_deref(),
        Some("quay.io/kubevirt/virt-launcher:v1.9.0")
    );
    assert_eq!(status.qos_class.as_deref(), Some("Burstable"));
    // What the VM controller puts on the VMI.
    let finalizers = vmi.metadata.finalizers.clone().unwrap_or_default();
    assert!(
        finalizers.contains(&"kubevirt.io/virtualMachineControllerFinalize".to_string()),
        "{finalizers:?}"
    );
    assert!(
        finalizers.contains(&"kubevirt.io/foregroundDeleteVirtualMachine".to_string()),
        "{finalizers:?}"
    );
    assert_eq!(
        vmi.metadata.annotations.as_ref().unwrap()["kubevirt.io/vm-generation"],
        "1"
    );
    let vm_uid = created.metadata.uid.clone().unwrap();
    let revision = format!("revision-start-vm-{vm_uid}-1");
    assert_eq!(
        vmi.status
            .as_ref()
            .unwrap()
            .extra
            .get("virtualMachineRevisionName"),
        Some(&json!(revision))
    );
    let revisions: Api<ControllerRevision> = setup.api();
    assert!(
        get(&revisions, &revision).await.is_some(),
        "ControllerRevision {revision}"
    );
    assert_eq!(
        vmi.spec.domain.firmware.as_ref().unwrap().uuid.as_deref(),
        Some(controller::vm::legacy_firmware_uuid("testvm").as_str())
    );

    // One launcher pod, owned by the VMI, bound to the node.
    let launchers = pods
        .list(&ListParams::default().labels("kubevirt.io=virt-launcher"))
        .await
        .unwrap();
    assert_eq!(launchers.items.len(), 1);
    let pod = &launchers.items[0];
    assert_eq!(
        pod.metadata.labels.as_ref().unwrap()["kubevirt.io/created-by"],
        vmi.metadata.uid.clone().unwrap()
    );
    assert_eq!(
        pod.spec.as_ref().unwrap().containers[0]
            .command
            .as_ref()
            .unwrap()[0],
        "/usr/bin/virt-launcher-monitor"
    );
    // Kernel boot: the kernel image mounted where the launcher looks for it.
    let mounts = pod.spec.as_ref().unwrap().containers[0]
        .volume_mounts
        .clone()
        .unwrap();
    assert!(
        mounts.iter().any(|m| m.name == "kernel-boot-volume"
            && m.mount_path == "/var/run/kubevirt-kernel-boot"
            && m.read_only == Some(true)),
        "{mounts:?}"
    );
    // What the webhook and the template report in the VMI's status.
    let status = vmi.status.as_ref().unwrap();
    assert_eq!(status.runtime_user, Some(107));
    assert_eq!(
        status.memory.as_ref().unwrap().extra.get("memoryOverhead"),
        Some(&json!("268Mi"))
    );

    let vm_status = wait_for("VM status Starting", || async {
        get(&vms, "testvm")
            .await
            .and_then(|v| v.status)
            .filter(|s| s.printable_status.as_deref() == Some("Starting"))
    })
    .await;
    assert_eq!(vm_status.created, Some(true));

    let vmi_writes = setup.writes.vmi_writes();
    let pods_created = setup.writes.get(Write::PodCreate);
    eprintln!(
        "benchmark: VM created to VMI Scheduled {to_scheduled:?} (seen by polling every 100 ms); VMI writes {vmi_writes} \
         (patches {}, status patches {}, create {}) for {pods_created} pod(s) created",
        setup.writes.get(Write::VmiPatch),
        setup.writes.get(Write::VmiStatusPatch),
        setup.writes.get(Write::VmiCreate),
    );
    assert_eq!(pods_created, 1);
    // KubeVirt's CI bound: 2 PATCH + 10 UPDATE per pod created.
    assert!(vmi_writes <= 12, "{vmi_writes} VMI writes");

    // The handler reports the guest running: the VMI is Ready (from the pod), so is the VM.
    set_phase(&vmis, "testvm", &["Running"]).await;
    wait_for("VM status Running and ready", || async {
        get(&vms, "testvm")
            .await
            .and_then(|v| v.status)
            .filter(|s| s.printable_status.as_deref() == Some("Running") && s.ready == Some(true))
    })
    .await;

    // Halted: the VMI and its pod go away.
    vms.patch(
        "testvm",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"runStrategy": "Halted"}})),
    )
    .await
    .expect("halt");
    wait_for("the VMI to be gone", || async {
        get(&vmis, "testvm").await.is_none().then_some(())
    })
    .await;
    wait_for("the pods to be gone", || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    wait_for("VM status Stopped", || async {
        get(&vms, "testvm")
            .await
            .and_then(|v| v.status)
            .filter(|s| s.printable_status.as_deref() == Some("Stopped"))
    })
    .await;

    // Deleting the VM removes its finalizer and the VM.
    vms.delete("testvm", &DeleteParams::default())
        .await
        .expect("delete VM");
    wait_for("the VM to be gone", || async {
        get(&vms, "testvm").await.is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rerun_on_failure_restarts_after_failed_but_not_after_succeeded() {
    let setup = Setup::new("ctl-rerun", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    vms.create(&PostParams::default(), &vm("rerun", "RerunOnFailure"))
        .await
        .expect("VM");

    let first = wait_for("the first VMI to be Scheduled", || async {
        get(&vmis, "rerun")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    let first_uid = first.metadata.uid.clone().unwrap();
    // The handler runs it, then it fails.
    set_phase(&vmis, "rerun", &["Running", "Failed"]).await;
    let second = wait_for("a new VMI after the failure", || async {
        get(&vmis, "rerun").await.filter(|v| {
            v.metadata.uid.as_deref() != Some(first_uid.as_str()) && scheduled_on(v).is_some()
        })
    })
    .await;
    let second_uid = second.metadata.uid.clone().unwrap();

    // This one runs and ends well: it is removed and not started again.
    set_phase(&vmis, "rerun", &["Running", "Succeeded"]).await;
    wait_for("the succeeded VMI to be gone", || async {
        match get(&vmis, "rerun").await {
            None => Some(()),
            Some(v) if v.metadata.uid.as_deref() != Some(second_uid.as_str()) => {
                panic!("a VMI was started after Succeeded")
            }
            Some(_) => None,
        }
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        get(&vmis, "rerun").await.is_none(),
        "a VMI was started after Succeeded"
    );
    let status = get(&vms, "rerun").await.unwrap().status.unwrap();
    assert_eq!(status.printable_status.as_deref(), Some("Stopped"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_pod_becomes_a_readable_event() {
    let setup = Setup::new("ctl-psa", true).await;
    // A namespace whose pod security forbids what the launcher needs.
    let namespaces: Api<Namespace> = Api::all(setup.client.clone());
    let labels =
        json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}});
    namespaces
        .patch(
            &setup.namespace,
            &PatchParams::default(),
            &Patch::Merge(&labels),
        )
        .await
        .expect("label namespace");
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "refused"},
        "spec": vm("x", "Always").spec.template.spec,
    }))
    .unwrap();
    vmis.create(&PostParams::default(), &vmi)
        .await
        .expect("VMI");
    let events: Api<k8s_openapi::api::events::v1::Event> = setup.api();
    let note = wait_for("a FailedCreate event on the VMI", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find_map(|e| {
                let about_vmi =
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("refused");
                (about_vmi && e.reason.as_deref() == Some("FailedCreate"))
                    .then(|| e.note.unwrap_or_default())
            })
    })
    .await;
    assert!(note.contains("needs a privileged namespace"), "{note}");
    assert!(note.contains("violates PodSecurity"), "{note}");
    let vmi = get(&vmis, "refused").await.unwrap();
    assert!(
        matches!(vmi.phase(), Phase::Unset | Phase::Pending),
        "{:?}",
        vmi.phase()
    );
    let pods: Api<Pod> = setup.api();
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

/// A VMI this project's launcher cannot run (EFI with Secure Boot, KubeVirt's default for
/// `efi`: no signature is checked here) is refused as KubeVirt reports a failed pod creation: it stays Pending with
/// `Synchronized=False` (reason `FailedCreate`, the message naming the field) and one Warning
/// event, and no pod is ever created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_the_launcher_cannot_run_gets_a_condition_an_event_and_no_pod() {
    let setup = Setup::new("ctl-refuse", true).await;
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let mut spec = serde_json::to_value(vm("x", "Always").spec.template.spec).unwrap();
    spec["domain"]["firmware"] = json!({"bootloader": {"efi": {}}});
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "bios"},
        "spec": spec,
    }))
    .unwrap();
    vmis.create(&PostParams::default(), &vmi)
        .await
        .expect("VMI");
    let synchronized = wait_for("a Synchronized=False condition", || async {
        get(&vmis, "bios").await.and_then(|v| {
            v.status?
                .conditions
                .into_iter()
                .find(|c| c.condition_type == "Synchronized")
        })
    })
    .await;
    assert_eq!(synchronized.status, "False");
    assert_eq!(synchronized.reason.as_deref(), Some("FailedCreate"));
    let message = synchronized.message.unwrap_or_default();
    assert!(
        message.contains("spec.domain.firmware.bootloader.efi.secureBoot")
            && message.contains("Secure Boot"),
        "{message}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = setup.api();
    let refusals = || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bios")
                    && e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some("FailedCreate")
            })
            .collect::<Vec<_>>()
    };
    let event = wait_for("a Warning event naming the field", || async {
        refusals().await.into_iter().next()
    })
    .await;
    let note = event.note.unwrap_or_default();
    assert!(
        note.contains("spec.domain.firmware.bootloader.efi.secureBoot"),
        "{note}"
    );
    // Later reconciles neither create a pod nor repeat the event.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let vmi = get(&vmis, "bios").await.unwrap();
    assert_eq!(vmi.phase(), Phase::Pending);
    assert_eq!(vmi.status.as_ref().unwrap().runtime_user, Some(107));
    let pods: Api<Pod> = setup.api();
    assert!(
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "no launcher pod"
    );
    assert_eq!(setup.writes.get(Write::PodCreate), 0);
    let repeated = refusals().await;
    assert_eq!(repeated.len(), 1, "{repeated:?}");
    assert!(
        repeated[0].series.is_none(),
        "the event was not repeated: {:?}",
        repeated[0].series
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_leader() {
    let setup = Setup::new("ctl-leader", false).await;
    let leading = Arc::new(AtomicUsize::new(0));
    let mut stops = Vec::new();
    let mut tasks = Vec::new();
    for identity in ["replica-a", "replica-b"] {
        let (stop, stopped) = oneshot::channel::<()>();
        stops.push(stop);
        let options = setup.options(identity);
        let client = setup.client.clone();
        let writes = setup.writes.clone();
        let leading = leading.clone();
        let work: LeaderWork = Box::new(move |lost| {
            let (client, options, writes, leading) = (
                client.clone(),
                options.clone(),
                writes.clone(),
                leading.clone(),
            );
            Box::pin(async move {
                leading.fetch_add(1, Ordering::SeqCst);
                let metrics = Arc::new(Metrics::new(writes.clone()));
                run(client, options, writes, metrics, lost).await;
                leading.fetch_sub(1, Ordering::SeqCst);
            })
        });
        tasks.push(tokio::spawn(run_when_leader(
            setup.client.clone(),
            LeaderOptions {
                namespace: setup.namespace.clone(),
                lease_name: "virt-controller".into(),
                identity: identity.into(),
            },
            work,
            async move {
                let _ = stopped.await;
            },
        )));
    }
    let leases: Api<Lease> = setup.api();
    let holder = wait_for("a lease holder", || async {
        get(&leases, "virt-controller")
            .await
            .and_then(|l| l.spec?.holder_identity)
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        leading.load(Ordering::SeqCst),
        1,
        "exactly one replica runs the controllers"
    );

    // The leader does the work, once.
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    vms.create(&PostParams::default(), &vm("led", "Always"))
        .await
        .expect("VM");
    wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "led")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    assert_eq!(setup.writes.get(Write::VmiCreate), 1);

    // The leader goes away; the other replica takes over.
    let leader_index = usize::from(holder != "replica-a");
    let follower = if leader_index == 0 {
        "replica-b"
    } else {
        "replica-a"
    };
    let stop = stops.remove(leader_index);
    let _ = stop.send(());
    let task = tasks.remove(leader_index);
    task.await
        .expect("leader task")
        .expect("leader released the lease");
    wait_for("the other replica to hold the lease", || async {
        get(&leases, "virt-controller")
            .await
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == follower)
    })
    .await;
    wait_for("the new leader to run the controllers", || async {
        (leading.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    for stop in stops {
        let _ = stop.send(());
    }
    for task in tasks {
        task.await
            .expect("replica task")
            .expect("replica released the lease");
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for stop in self.stops.drain(..) {
            let _ = stop.send(());
        }
    }
}

/// Benchmark: `cargo test -p controller --test controlplane benchmark -- --ignored --nocapture`
/// (`CONTROLLER_BENCH_VMS`, default 20). Creates that many `Always` VMs one after the other
/// and reports the time from each VM's creation to its VMI's hand-off (seen through a watch)
/// and the API writes per VMI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run explicitly"]
async fn benchmark_vm_to_scheduled() {
    let count: usize = std::env::var("CONTROLLER_BENCH_VMS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let setup = Setup::new("ctl-bench", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let watch = tokio::spawn(async move {
        let mut events = watcher(vmis, watcher::Config::default()).boxed();
        let mut seen = std::collections::HashSet::new();
        while let Some(event) = events.next().await {
            if let Ok(watcher::Event::Apply(vmi)) = event
                && scheduled_on(&vmi).is_some()
                && seen.insert(vmi.metadata.name.clone().unwrap_or_default())
            {
                let _ = done_tx.send((
                    vmi.metadata.name.clone().unwrap_or_default(),
                    Instant::now(),
                ));
            }
        }
    });
    let mut created_at = std::collections::HashMap::new();
    let start = Instant::now();
    for i in 0..count {
        let name = format!("bench-{i}");
        vms.create(&PostParams::default(), &vm(&name, "Always"))
            .await
            .expect("VM");
        created_at.insert(name, Instant::now());
    }
    let mut latencies = Vec::new();
    while latencies.len() < count {
        let (name, at) = tokio::time::timeout(WAIT, done_rx.recv())
            .await
            .expect("hand-offs in time")
            .expect("watch alive");
        let created = created_at.get(&name).copied().expect("a VM we created");
        latencies.push(at.saturating_duration_since(created));
    }
    let total = start.elapsed();
    watch.abort();
    latencies.sort();
    let median = latencies[latencies.len() / 2];
    let max = latencies[latencies.len() - 1];
    let pods = setup.writes.get(Write::PodCreate).max(1);
    eprintln!(
        "benchmark: {count} VMs handed off in {total:?}; VM created to VMI Scheduled: median \
         {median:?}, max {max:?}; VMI writes per pod created: {:.1} (patches {}, status patches \
         {}, creates {}); pod status patches {}; events {}",
        setup.writes.vmi_writes() as f64 / pods as f64,
        setup.writes.get(Write::VmiPatch),
        setup.writes.get(Write::VmiStatusPatch),
        setup.writes.get(Write::VmiCreate),
        setup.writes.get(Write::PodPatch),
        setup.writes.get(Write::Event),
    );
    assert_eq!(
        setup.writes.get(Write::PodCreate),
        count as u64,
        "one pod per VMI"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_failing_before_hand_off_fails_the_vmi() {
    let setup = Setup::new("ctl-podfail", true).await;
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "doomed", "labels": {FAIL_LABEL: "yes"}},
        "spec": vm("x", "Always").spec.template.spec,
    }))
    .unwrap();
    vmis.create(&PostParams::default(), &vmi)
        .await
        .expect("VMI");
    let failed = wait_for("the VMI to fail", || async {
        get(&vmis, "doomed")
            .await
            .filter(|v| v.phase() == Phase::Failed)
    })
    .await;
    let ready = failed
        .status
        .as_ref()
        .unwrap()
        .conditions
        .iter()
        .find(|c| c.condition_type == "Ready")
        .cloned()
        .expect("a Ready condition");
    assert_eq!(ready.status, "False");
    let message = ready.message.unwrap_or_default();
    assert!(
        message.contains("virt-launcher-doomed-") && message.contains("Evicted"),
        "{message}"
    );
    assert!(
        failed.status.as_ref().unwrap().node_name.is_none(),
        "never handed off"
    );
    // The finished VMI's pod is deleted and its foreground finalizer removed.
    let pods: Api<Pod> = setup.api();
    wait_for("the pod to be gone", || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
            .then_some(())
    })
    .await;
    wait_for("the foreground finalizer to go", || async {
        get(&vmis, "doomed").await.filter(|v| {
            !v.metadata
                .finalizers
                .iter()
                .flatten()
                .any(|f| f == "kubevirt.io/foregroundDeleteVirtualMachine")
        })
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = setup.api();
    let warnings: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.note)
        .collect();
    assert!(
        warnings.iter().any(|n| n.contains("Evicted")),
        "{warnings:?}"
    );
}

/// The `virt-controller` binary itself, two replicas against the control plane's kubeconfig:
/// one leads and hands a VM's VMI to the node; on SIGTERM it releases the Lease and exits,
/// and the other takes over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_replicas_run_and_hand_over_on_sigterm() {
    let setup = Setup::new("ctl-binary", false).await;
    let kubeconfig = control_plane().await.kubeconfig_path().to_path_buf();
    let spawn = |identity: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_virt-controller"))
            .args(["--launcher-image", "quay.io/kubevirt/virt-launcher:v1.9.0"])
            .args(["--watch-namespace", &setup.namespace])
            .args(["--leader-namespace", &setup.namespace])
            .args(["--identity", identity])
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map(KillOnDrop)
            .expect("virt-controller starts")
    };
    let mut replicas = vec![("bin-a", spawn("bin-a")), ("bin-b", spawn("bin-b"))];
    let leases: Api<Lease> = setup.api();
    let holder = wait_for("a lease holder", || async {
        get(&leases, "virt-controller")
            .await
            .and_then(|l| l.spec?.holder_identity)
    })
    .await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    vms.create(&PostParams::default(), &vm("binvm", "Always"))
        .await
        .expect("VM");
    wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "binvm")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;

    let index = replicas
        .iter()
        .position(|(id, _)| *id == holder)
        .expect("a replica holds it");
    let (_, mut leader) = replicas.remove(index);
    let status = integration::terminate(&mut leader.0).await;
    assert!(
        status.success(),
        "the leader exits cleanly on SIGTERM: {status}"
    );
    let follower = replicas[0].0;
    wait_for("the other replica to hold the lease", || async {
        get(&leases, "virt-controller")
            .await
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| h == follower)
    })
    .await;
    // The new leader keeps the VM going: a stop request is served by it.
    vms.patch(
        "binvm",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"runStrategy": "Halted"}})),
    )
    .await
    .expect("halt");
    wait_for("the VMI to be gone", || async {
        get(&vmis, "binvm").await.is_none().then_some(())
    })
    .await;
    drop(replicas);
}

/// A child process that is killed (and reaped) when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `images/deploy/10-virt-controller.yaml` is all the controller needs: with its namespace,
/// ServiceAccount and RBAC applied, the binary started with the Deployment's arguments and
/// acting as that ServiceAccount (impersonated through its kubeconfig) takes the Lease
/// `kubevirt/virt-controller`, reads `cr/kubevirt-cr.yaml`'s KubeVirt CR and writes its
/// status (watching virt-handler's DaemonSet by name), brings a VM with a PVC volume to
/// Scheduled (VMI, revision, pod, readiness gate, PVC look-up, events) and removes it
/// again. A right missing from the
/// ClusterRole or Role makes it fail. (That the API server accepts every manifest in
/// images/deploy is `integration/tests/deploy_manifests.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deploy_manifest_rights_and_arguments_are_enough() {
    let setup = Setup::new("ctl-deploy", false).await;
    let cp = control_plane().await;
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../images/deploy");
    let mut deployment = None;
    for file in ["00-namespace.yaml", "10-virt-controller.yaml"] {
        let text = std::fs::read_to_string(format!("{deploy}/{file}")).expect("manifest");
        for object in integration::manifests::parse(&text).expect(file) {
            if object
                .types
                .as_ref()
                .is_some_and(|t| t.kind == "Deployment")
            {
                deployment = Some(object);
                continue;
            }
            integration::manifests::apply(&setup.client, &object, None, false)
                .await
                .unwrap_or_else(|e| panic!("{file}: {e:#}"));
        }
    }
    let container =
        deployment.expect("a Deployment").data["spec"]["template"]["spec"]["containers"][0].clone();
    let args: Vec<String> = serde_json::from_value(container["args"].clone()).expect("args");
    assert!(
        args.iter().any(|a| a == "--leader-namespace=kubevirt"),
        "{args:?}"
    );

    // The control plane's kubeconfig, acting as the Deployment's ServiceAccount.
    let dir = tempfile::tempdir().unwrap();
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(cp.kubeconfig_path()).unwrap()).unwrap();
    for user in kubeconfig["users"].as_sequence_mut().expect("users") {
        user["user"]["as"] = "system:serviceaccount:kubevirt:virt-controller".into();
    }
    let kubeconfig_path = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig_path,
        serde_yaml::to_string(&kubeconfig).unwrap(),
    )
    .unwrap();
    let identity = format!("deploy-{}", setup.namespace);
    let log = std::fs::File::create(dir.path().join("controller.log")).unwrap();
    // The Deployment's metrics address, moved to a free loopback port for this test.
    let metrics_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    assert!(
        args.iter().any(|a| a.starts_with("--metrics-listen=")),
        "{args:?}"
    );
    let args: Vec<String> = args
        .into_iter()
        .map(|a| {
            if a.starts_with("--metrics-listen=") {
                format!("--metrics-listen=127.0.0.1:{metrics_port}")
            } else {
                a
            }
        })
        .collect();
    let _controller = std::process::Command::new(env!("CARGO_BIN_EXE_virt-controller"))
        .args(&args)
        // Only this test's namespace: other tests run their own controllers.
        .args([
            "--watch-namespace",
            &setup.namespace,
            "--identity",
            &identity,
        ])
        .env("KUBECONFIG", &kubeconfig_path)
        .env("RUST_LOG", "info")
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .map(KillOnDrop)
        .expect("virt-controller starts");
    let log_text =
        || std::fs::read_to_string(dir.path().join("controller.log")).unwrap_or_default();

    let leases: Api<Lease> = Api::namespaced(setup.client.clone(), "kubevirt");
    wait_for("the Lease kubevirt/virt-controller", || async {
        get(&leases, "virt-controller")
            .await
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| *h == identity)
    })
    .await;
    // The install's CR, applied after the rest as the manifest says: the leader reads it
    // and writes its status (no virt-handler DaemonSet here: Deploying).
    let text = std::fs::read_to_string(format!("{deploy}/cr/kubevirt-cr.yaml")).expect("CR");
    for object in integration::manifests::parse(&text).expect("cr/kubevirt-cr.yaml") {
        integration::manifests::apply(&setup.client, &object, None, false)
            .await
            .unwrap_or_else(|e| panic!("cr/kubevirt-cr.yaml: {e:#}"));
    }
    let kubevirts: Api<proto::kubevirt::KubeVirt> =
        Api::namespaced(setup.client.clone(), "kubevirt");
    wait_for("the KubeVirt CR's phase Deploying", || async {
        kubevirt_status(&kubevirts, "kubevirt")
            .await
            .filter(|s| s.phase == "Deploying")
    })
    .await;

    let pvcs: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> = setup.api();
    pvcs.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .unwrap(),
    )
    .await
    .expect("PVC");
    let mut machine = vm("rbacvm", "Always");
    let template = machine.spec.template.spec.as_mut().expect("template spec");
    template
        .domain
        .devices
        .disks
        .push(serde_json::from_value(json!({"name": "data", "disk": {"bus": "virtio"}})).unwrap());
    template.volumes.push(
        serde_json::from_value(
            json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
        )
        .unwrap(),
    );
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    vms.create(&PostParams::default(), &machine)
        .await
        .expect("VM");
    let vmi = wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "rbacvm")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    assert!(vmi.spec.volumes.iter().any(|v| v.name == "data"));
    // The claim behind the PVC volume is recorded in its volume status (virt-handler reads
    // the access modes: a ReadWriteOnce claim is not shared, the VMI not migratable).
    let info = wait_for("the data volume's claim info", || async {
        get(&vmis, "rbacvm")
            .await?
            .status?
            .volume_status
            .into_iter()
            .find(|s| s.name == "data")?
            .persistent_volume_claim_info
    })
    .await;
    assert_eq!(
        info,
        json!({"claimName": "data", "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
               "requests": {"storage": "1Gi"}, "filesystemOverhead": "0.055"})
    );
    // The reconciles that got it there are on /metrics.
    let scrape = || {
        use std::io::{Read, Write};
        let mut stream =
            std::net::TcpStream::connect(("127.0.0.1", metrics_port)).expect("metrics port");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("request");
        let mut text = String::new();
        stream.read_to_string(&mut text).expect("response");
        text
    };
    let text = scrape();
    for metric in [
        r#"kubevirt_controller_reconciles_total{controller="vm",result="ok"}"#,
        r#"kubevirt_controller_reconciles_total{controller="vmi",result="ok"}"#,
        r#"kubevirt_controller_api_writes_total{kind="PodCreate"} 1"#,
    ] {
        assert!(text.contains(metric), "{metric} missing:\n{text}");
    }
    wait_for("the VM's status", || async {
        get(&vms, "rbacvm")
            .await
            .and_then(|v| v.status?.printable_status)
    })
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> = setup.api();
    wait_for("an event from virt-controller", || async {
        events
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reporting_controller.as_deref() == Some("virt-controller"))
    })
    .await;

    vms.patch(
        "rbacvm",
        &PatchParams::default(),
        &Patch::Merge(&json!({"spec": {"runStrategy": "Halted"}})),
    )
    .await
    .expect("halt");
    wait_for("the VMI to be gone", || async {
        get(&vmis, "rbacvm").await.is_none().then_some(())
    })
    .await;
    let text = log_text();
    assert!(
        !text.contains("forbidden"),
        "no request was forbidden:\n{text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_running_vm_removes_vmi_pod_and_vm() {
    let setup = Setup::new("ctl-delete", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let pods: Api<Pod> = setup.api();
    vms.create(&PostParams::default(), &vm("gone", "Always"))
        .await
        .expect("VM");
    wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "gone")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    set_phase(&vmis, "gone", &["Running"]).await;
    vms.delete("gone", &DeleteParams::default())
        .await
        .expect("delete VM");
    wait_for("VM, VMI and pod to be gone", || async {
        let vm_gone = get(&vms, "gone").await.is_none();
        let vmi_gone = get(&vmis, "gone").await.is_none();
        let pods_gone = pods
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty();
        (vm_gone && vmi_gone && pods_gone).then_some(())
    })
    .await;
}

/// `Manual`: only state-change requests (what virt-api's start/stop subresources write)
/// start and stop the VM; each is dropped once served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_vm_follows_start_and_stop_requests() {
    let setup = Setup::new("ctl-manual", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    vms.create(&PostParams::default(), &vm("manual", "Manual"))
        .await
        .expect("VM");
    wait_for("VM status Stopped", || async {
        get(&vms, "manual")
            .await
            .and_then(|v| v.status)
            .filter(|s| s.printable_status.as_deref() == Some("Stopped"))
    })
    .await;
    assert!(
        get(&vmis, "manual").await.is_none(),
        "no VMI without a request"
    );

    let request = |body: serde_json::Value| {
        let vms = vms.clone();
        async move {
            vms.patch_status(
                "manual",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"stateChangeRequests": [body]}})),
            )
            .await
            .expect("state-change request");
        }
    };
    request(json!({"action": "Start"})).await;
    let vmi = wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "manual")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    wait_for("the start request to be dropped", || async {
        get(&vms, "manual")
            .await
            .and_then(|v| v.status)
            .filter(|s| s.state_change_requests.is_empty())
    })
    .await;

    request(json!({"action": "Stop", "uid": vmi.metadata.uid})).await;
    wait_for("the VMI to be gone", || async {
        get(&vmis, "manual").await.is_none().then_some(())
    })
    .await;
    wait_for("the stop request to be dropped", || async {
        get(&vms, "manual")
            .await
            .and_then(|v| v.status)
            .filter(|s| s.state_change_requests.is_empty())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        get(&vmis, "manual").await.is_none(),
        "Manual does not restart by itself"
    );
}

/// A VMI created directly (no VM, no virt-api webhook here) gets the webhook's defaults stored
/// before its pod exists: the handler and the launcher then see KubeVirt's spec (the default
/// pod network and bridge interface, ACPI, the machine type), not a VMI without a NIC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_created_directly_gets_the_webhooks_defaults_stored_before_its_pod() {
    let setup = Setup::new("ctl-defaults", true).await;
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let mut spec = vm("x", "Always")
        .spec
        .template
        .spec
        .expect("a template spec");
    spec.domain.devices.interfaces.clear();
    spec.networks.clear();
    let vmi: VirtualMachineInstance = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "bare"},
        "spec": spec,
    }))
    .unwrap();
    vmis.create(&PostParams::default(), &vmi)
        .await
        .expect("VMI");
    let pods: Api<Pod> = setup.api();
    wait_for("the launcher pod", || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .next()
    })
    .await;
    let stored = get(&vmis, "bare").await.expect("the VMI");
    let value = serde_json::to_value(&stored.spec).unwrap();
    assert_eq!(
        value["domain"]["devices"]["interfaces"],
        json!([{"name": "default", "bridge": {}}]),
        "{value}"
    );
    assert_eq!(
        value["networks"],
        json!([{"name": "default", "pod": {}}]),
        "{value}"
    );
    assert_eq!(value["domain"]["machine"]["type"], json!("q35"), "{value}");
}

/// Launcher pods that come and go within one watch read (created and deleted at once, as a
/// pod of a VMI deleted right after its start) must not silence the controller: the next
/// VMI is still handed to its node once its pod turns Ready, which only a pod change can
/// tell the VMI controller. (kube-runtime 5.0's shared-store subscriber stalled for good on
/// such a pod; the controller no longer uses it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_that_vanish_at_once_do_not_stop_pod_triggers() {
    let setup = Setup::new("ctl-vanish", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let pods: Api<Pod> = setup.api();
    let now = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for round in 0..20 {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("flash-{round}"), "labels": {"kubevirt.io": "virt-launcher"}},
            "spec": {"containers": [{"name": "compute", "image": "none"}]},
        }))
        .unwrap();
        pods.create(&PostParams::default(), &pod)
            .await
            .expect("pod");
        pods.delete(&format!("flash-{round}"), &now)
            .await
            .expect("delete pod");
    }
    let mut slow = vm("after-flash", "Always");
    slow.spec.template.metadata = Some(
        serde_json::from_value(
            json!({"labels": {"kubevirt.io/vm": "after-flash", SLOW_LABEL: "true"}}),
        )
        .unwrap(),
    );
    vms.create(&PostParams::default(), &slow).await.expect("VM");
    wait_for(
        "the VMI to be Scheduled after pods came and went",
        || async {
            get(&vmis, "after-flash")
                .await
                .filter(|v| scheduled_on(v).is_some())
        },
    )
    .await;
}

/// A controller that starts while VMIs run (a restart, a new leader) reconciles nothing
/// before its pod cache is filled: a Running VMI with its pod stays Running, the pod stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_controller_leaves_running_vmis_running() {
    let mut setup = Setup::new("ctl-restart", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let pods: Api<Pod> = setup.api();
    let names: Vec<String> = (0..5).map(|i| format!("keep-{i}")).collect();
    for name in &names {
        vms.create(&PostParams::default(), &vm(name, "Always"))
            .await
            .expect("VM");
    }
    for name in &names {
        wait_for("the VMI to be Scheduled", || async {
            get(&vmis, name).await.filter(|v| scheduled_on(v).is_some())
        })
        .await;
        set_phase(&vmis, name, &["Running"]).await;
    }
    // Stop the first controller (the fake kubelet stays), then start a second one. Other
    // launcher pods (owned by nothing) make its pod list take longer than its VMI list, as
    // on a node with many VMs.
    drop(setup.stops.pop());
    let others = 200;
    futures::stream::iter(0..others)
        .for_each_concurrent(16, |i| {
            let pods = pods.clone();
            let node = setup.node.clone();
            async move {
                let pod: Pod = serde_json::from_value(json!({
                    "metadata": {"name": format!("other-{i}"), "labels": {"kubevirt.io": "virt-launcher"},
                                 "annotations": {"padding": "x".repeat(4096)}},
                    "spec": {"nodeName": node, "containers": [{"name": "compute", "image": "none"}]},
                }))
                .unwrap();
                pods.create(&PostParams::default(), &pod).await.expect("pod");
            }
        })
        .await;
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(run(
        setup.client.clone(),
        setup.options("second-controller"),
        setup.writes.clone(),
        Arc::new(Metrics::new(setup.writes.clone())),
        async move {
            let _ = stopped.await;
        },
    ));
    setup.stops.push(stop);
    // Let it list and reconcile everything (its first reconciles come within a second).
    tokio::time::sleep(Duration::from_secs(5)).await;
    for name in &names {
        let vmi = get(&vmis, name).await.expect("the VMI is kept");
        assert_eq!(vmi.phase(), Phase::Running, "{name}: {:?}", vmi.status);
    }
    let launchers = pods.list(&ListParams::default()).await.unwrap();
    assert_eq!(launchers.items.len(), names.len() + others);
}

/// A VMI of `vm("x")`'s template, `volume` (with a virtio disk) added when given.
fn vmi_with(name: &str, volume: Option<serde_json::Value>) -> VirtualMachineInstance {
    let mut spec = serde_json::to_value(vm("x", "Always").spec.template.spec).unwrap();
    if let Some(volume) = volume {
        let disk = json!({"name": volume["name"], "disk": {"bus": "virtio"}});
        spec["domain"]["devices"]["disks"]
            .as_array_mut()
            .unwrap()
            .push(disk);
        spec["volumes"].as_array_mut().unwrap().push(volume);
    }
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap()
}

/// The launcher pod of VMI `name`, once it exists.
async fn pod_of(pods: &Api<Pod>, name: &str) -> Pod {
    wait_for(&format!("the launcher pod of {name}"), || async {
        pods.list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|p| {
                p.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|r| r.kind == "VirtualMachineInstance" && r.name == name)
            })
    })
    .await
}

fn cpu_request(pod: &Pod) -> String {
    let compute = &pod.spec.as_ref().unwrap().containers[0];
    compute
        .resources
        .as_ref()
        .unwrap()
        .requests
        .as_ref()
        .unwrap()["cpu"]
        .0
        .clone()
}

async fn kubevirt_status(
    api: &Api<proto::kubevirt::KubeVirt>,
    name: &str,
) -> Option<proto::kubevirt::KubeVirtStatus> {
    get(api, name).await.and_then(|kv| kv.status)
}

fn kv_condition<'a>(
    status: &'a proto::kubevirt::KubeVirtStatus,
    kind: &str,
) -> Option<(&'a str, &'a str)> {
    status
        .conditions
        .iter()
        .find(|c| c.condition_type == kind)
        .map(|c| (c.status.as_str(), c.reason.as_deref().unwrap_or_default()))
}

/// The KubeVirt CR is the configuration, as in KubeVirt v1.9.0, and changing it needs no
/// restart: without `HostDisk` in its feature gates a hostDisk VMI is refused (no pod); with
/// it added, a new one gets its pod; `cpuAllocationRatio` 10 → 2 takes a new VMI's CPU
/// request from 100m to 500m while the old pod keeps its own. The leader writes the CR's
/// status as virt-operator does: `Deploying` until virt-handler's DaemonSet (made here, its
/// status written by the test: there is no DaemonSet controller) has every pod ready, then
/// `Deployed` with `observedGeneration`, which also tells the test the controller saw each
/// change. A second CR is told there is an install and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubevirt_cr_is_the_configuration_and_applies_without_a_restart() {
    let setup = Setup::new("ctl-kvcr", true).await;
    let kubevirts: Api<proto::kubevirt::KubeVirt> = setup.api();
    let daemonsets: Api<k8s_openapi::api::apps::v1::DaemonSet> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let pods: Api<Pod> = setup.api();
    let cr = |name: &str, configuration: serde_json::Value| -> proto::kubevirt::KubeVirt {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": name},
            "spec": {"configuration": configuration},
        }))
        .unwrap()
    };
    kubevirts
        .create(
            &PostParams::default(),
            &cr(
                "kubevirt",
                json!({"developerConfiguration": {"featureGates": [], "cpuAllocationRatio": 10}}),
            ),
        )
        .await
        .expect("KubeVirt CR");
    let handler: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "virt-handler"},
        "spec": {"selector": {"matchLabels": {"kubevirt.io": "virt-handler"}},
                 "template": {"metadata": {"labels": {"kubevirt.io": "virt-handler"}},
                              "spec": {"containers": [{"name": "virt-handler", "image": "none"}]}}},
    }))
    .unwrap();
    daemonsets
        .create(&PostParams::default(), &handler)
        .await
        .expect("DaemonSet");
    let handler_pods = |ready: i32| {
        json!({"status": {"desiredNumberScheduled": 1, "numberReady": ready,
                          "currentNumberScheduled": 1, "numberMisscheduled": 0}})
    };
    daemonsets
        .patch_status(
            "virt-handler",
            &PatchParams::default(),
            &Patch::Merge(&handler_pods(0)),
        )
        .await
        .expect("DaemonSet status");
    let deploying = wait_for(
        "phase Deploying while virt-handler is not ready",
        || async {
            kubevirt_status(&kubevirts, "kubevirt")
                .await
                .filter(|s| s.phase == "Deploying" && kv_condition(s, "Created").is_some())
        },
    )
    .await;
    assert_eq!(
        kv_condition(&deploying, "Available"),
        Some(("False", "DeploymentInProgress"))
    );
    assert_eq!(deploying.observed_generation, None);
    daemonsets
        .patch_status(
            "virt-handler",
            &PatchParams::default(),
            &Patch::Merge(&handler_pods(1)),
        )
        .await
        .expect("DaemonSet status");
    let deployed = wait_for("phase Deployed once virt-handler is ready", || async {
        kubevirt_status(&kubevirts, "kubevirt")
            .await
            .filter(|s| s.phase == "Deployed")
    })
    .await;
    assert_eq!(
        kv_condition(&deployed, "Available"),
        Some(("True", "AllComponentsReady"))
    );
    assert_eq!(
        kv_condition(&deployed, "Degraded"),
        Some(("False", "AllComponentsReady"))
    );
    assert_eq!(deployed.observed_generation, Some(1));

    // The CR lists no HostDisk: refused, naming the field, no pod.
    let host_disk = |file: &str| {
        Some(json!({"name": "host", "hostDisk": {
            "path": format!("/var/lib/kubevirt-rs-test/{file}"), "type": "DiskOrCreate", "capacity": "64Mi"}}))
    };
    vmis.create(&PostParams::default(), &vmi_with("hd1", host_disk("1.img")))
        .await
        .expect("VMI");
    vmis.create(&PostParams::default(), &vmi_with("ratio10", None))
        .await
        .expect("VMI");
    let refused = wait_for("hd1's Synchronized=False", || async {
        get(&vmis, "hd1").await.and_then(|v| {
            v.status?
                .conditions
                .into_iter()
                .find(|c| c.condition_type == "Synchronized")
        })
    })
    .await;
    assert_eq!(refused.status, "False");
    assert_eq!(refused.reason.as_deref(), Some("FailedCreate"));
    let message = refused.message.unwrap_or_default();
    assert!(
        message.contains("spec.volumes[1]: HostDisk feature gate is not enabled"),
        "{message}"
    );
    let old_pod = pod_of(&pods, "ratio10").await;
    assert_eq!(cpu_request(&old_pod), "100m");

    // HostDisk on, one vCPU per two host CPUs: the next VMIs, no restart.
    kubevirts
        .patch(
            "kubevirt",
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"spec": {"configuration": {"developerConfiguration": {
                "featureGates": ["HostDisk"], "cpuAllocationRatio": 2}}}}),
            ),
        )
        .await
        .expect("CR patch");
    wait_for("the controller to see generation 2", || async {
        kubevirt_status(&kubevirts, "kubevirt")
            .await
            .filter(|s| s.observed_generation == Some(2))
    })
    .await;
    vmis.create(&PostParams::default(), &vmi_with("hd2", host_disk("2.img")))
        .await
        .expect("VMI");
    vmis.create(&PostParams::default(), &vmi_with("ratio2", None))
        .await
        .expect("VMI");
    let pod = pod_of(&pods, "hd2").await;
    let host_path = pod
        .spec
        .as_ref()
        .unwrap()
        .volumes
        .iter()
        .flatten()
        .find_map(|v| v.host_path.as_ref())
        .expect("the hostDisk's hostPath");
    assert_eq!(host_path.path, "/var/lib/kubevirt-rs-test");
    assert_eq!(cpu_request(&pod_of(&pods, "ratio2").await), "500m");
    let old_pod = get(&pods, &old_pod.metadata.name.unwrap()).await.unwrap();
    assert_eq!(cpu_request(&old_pod), "100m", "existing pods keep theirs");

    // A second CR: both are told there is an install; the first stays the configuration.
    kubevirts
        .create(
            &PostParams::default(),
            &cr(
                "second",
                json!({"developerConfiguration": {"featureGates": []}}),
            ),
        )
        .await
        .expect("second CR");
    for name in ["second", "kubevirt"] {
        wait_for(&format!("{name}'s Synchronized=False"), || async {
            kubevirt_status(&kubevirts, name).await.filter(|s| {
                kv_condition(s, "Synchronized") == Some(("False", "ExistingDeployment"))
            })
        })
        .await;
    }
    let second = kubevirt_status(&kubevirts, "second").await.unwrap();
    assert_eq!(second.phase, "", "a second install is never deployed");
    assert_eq!(
        kubevirt_status(&kubevirts, "kubevirt").await.unwrap().phase,
        "Deployed"
    );
    vmis.create(&PostParams::default(), &vmi_with("hd3", host_disk("3.img")))
        .await
        .expect("VMI");
    pod_of(&pods, "hd3").await;
}

/// Plays both nodes' handlers by writing what they write into the VMI's migration state.
async fn handler_reports(vmis: &Api<VirtualMachineInstance>, name: &str, state: serde_json::Value) {
    let patch = json!({"status": {"migrationState": state}});
    vmis.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("migration state patch");
}

fn vmim(name: &str, vmi: &str) -> VirtualMachineInstanceMigration {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
        // virt-api's mutator puts the finalizer on (no virt-api here).
        "metadata": {"name": name, "finalizers": ["kubevirt.io/migrationJobFinalize"]},
        "spec": {"vmiName": vmi},
    }))
    .expect("valid migration")
}

async fn migration_phase(
    api: &Api<VirtualMachineInstanceMigration>,
    name: &str,
) -> Option<MigrationPhase> {
    get(api, name).await.map(|m| m.phase())
}

/// The migration controller on a real API server: the target pod (labelled, kept off the
/// VMI's node, owned by the VMI), the hand-off to the target node, the phases as the
/// handlers report, the final state and finalizer; then a second migration cancelled by
/// deleting it, which asks the source to abort and removes its target pod.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_hands_off_follows_the_handlers_and_a_deletion_cancels_it() {
    let setup = Setup::new("ctl-migrate", true).await;
    let vms: Api<VirtualMachine> = setup.api();
    let vmis: Api<VirtualMachineInstance> = setup.api();
    let pods: Api<Pod> = setup.api();
    let migrations: Api<VirtualMachineInstanceMigration> = setup.api();
    let target = target_node(&setup.node);
    vms.create(&PostParams::default(), &vm("mover", "Always"))
        .await
        .expect("VM");
    wait_for("the VMI to be Scheduled", || async {
        get(&vmis, "mover")
            .await
            .filter(|v| scheduled_on(v).is_some())
    })
    .await;
    set_phase(&vmis, "mover", &["Running"]).await;

    let created = migrations
        .create(&PostParams::default(), &vmim("move-1", "mover"))
        .await
        .expect("migration");
    let uid = created.metadata.uid.clone().unwrap();
    let vmi = wait_for("the hand-off", || async {
        get(&vmis, "mover").await.filter(|v| {
            v.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("kubevirt.io/migrationTargetNodeName"))
                .is_some()
        })
    })
    .await;
    let vmi_uid = vmi.metadata.uid.clone().unwrap();
    let target_pods = pods
        .list(&ListParams::default().labels(&format!("kubevirt.io/migrationJobUID={uid}")))
        .await
        .unwrap()
        .items;
    assert_eq!(target_pods.len(), 1);
    let target_pod = &target_pods[0];
    let target_name = target_pod.metadata.name.clone().unwrap();
    assert_eq!(
        target_pod.metadata.annotations.as_ref().unwrap()["kubevirt.io/migrationJobName"],
        "move-1"
    );
    assert_eq!(
        target_pod.metadata.owner_references.as_ref().unwrap()[0].uid,
        vmi_uid
    );
    let anti = serde_json::to_value(&target_pod.spec.as_ref().unwrap().affinity).unwrap();
    assert_eq!(
        anti["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
            ["matchExpressions"][0]["values"],
        json!([vmi_uid])
    );
    let source_pod = pods
        .list(&ListParams::default().labels("kubevirt.io=virt-launcher"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.metadata.name.as_deref() != Some(target_name.as_str()))
        .and_then(|p| p.metadata.name)
        .unwrap();
    let labels = vmi.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubevirt.io/migrationTargetNodeName"], target);
    let state = serde_json::to_value(vmi.migration_state().unwrap().unwrap()).unwrap();
    assert_eq!(state["migrationUid"], uid);
    assert_eq!(state["sourceNode"], setup.node);
    assert_eq!(state["targetNode"], target);
    assert_eq!(state["targetPod"], target_name);
    assert_eq!(state["sourcePod"], source_pod);
    assert_eq!(
        state["migrationConfiguration"]["completionTimeoutPerGiB"],
        150
    );
    // Both pods are the VMI's: activePods lists both, the VMI stays Running on its node.
    let vmi = wait_for("both pods listed", || async {
        get(&vmis, "mover").await.filter(|v| {
            v.status
                .as_ref()
                .and_then(|s| s.active_pods.as_ref())
                .is_some_and(|p| p.len() == 2)
        })
    })
    .await;
    assert_eq!(vmi.phase(), Phase::Running);
    assert_eq!(
        vmi.status.as_ref().unwrap().node_name.as_deref(),
        Some(setup.node.as_str())
    );

    // The handlers report; the phases follow.
    for (report, phase) in [
        (json!({}), MigrationPhase::PreparingTarget),
        (
            json!({"targetNodeAddress": "10.0.0.2", "targetDirectMigrationNodePorts": {"41000": 49152}}),
            MigrationPhase::TargetReady,
        ),
        (
            json!({"startTimestamp": "2026-12-05T10:00:00Z", "mode": "PreCopy"}),
            MigrationPhase::Running,
        ),
    ] {
        handler_reports(&vmis, "mover", report).await;
        wait_for(&format!("phase {phase:?}"), || async {
            (migration_phase(&migrations, "move-1").await == Some(phase)).then_some(())
        })
        .await;
    }
    // The target hands over, then finalizes.
    handler_reports(
        &vmis,
        "mover",
        json!({"endTimestamp": "2026-12-05T10:00:01Z", "completed": true}),
    )
    .await;
    let done = wait_for("Succeeded, state kept, finalizer gone", || async {
        get(&migrations, "move-1").await.filter(|m| {
            m.phase() == MigrationPhase::Succeeded
                && m.status
                    .as_ref()
                    .and_then(|s| s.migration_state.as_ref())
                    .is_some_and(|s| s.is_completed())
                && m.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty())
        })
    })
    .await;
    let phases: Vec<MigrationPhase> = done
        .status
        .as_ref()
        .unwrap()
        .phase_transition_timestamps
        .iter()
        .map(|t| t.phase)
        .collect();
    assert_eq!(
        phases,
        [
            MigrationPhase::Pending,
            MigrationPhase::Scheduling,
            MigrationPhase::Scheduled,
            MigrationPhase::PreparingTarget,
            MigrationPhase::TargetReady,
            MigrationPhase::Running,
            MigrationPhase::Succeeded,
        ]
    );
    // The handlers' hand-over: the VMI is the target node's; the target pod is its pod now.
    let moved = json!({"metadata": {"labels": {"kubevirt.io/nodeName": target, "kubevirt.io/migrationTargetNodeName": null}}});
    vmis.patch("mover", &PatchParams::default(), &Patch::Merge(&moved))
        .await
        .unwrap();
    vmis.patch_status(
        "mover",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"nodeName": target}})),
    )
    .await
    .unwrap();
    pods.delete(&source_pod, &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the VMI runs on on the target pod alone", || async {
        get(&vmis, "mover").await.filter(|v| {
            v.status
                .as_ref()
                .and_then(|s| s.active_pods.as_ref())
                .is_some_and(|p| p.len() == 1)
        })
    })
    .await;
    assert_eq!(get(&vmis, "mover").await.unwrap().phase(), Phase::Running);

    // A second migration, cancelled by deleting it after the hand-off.
    migrations
        .create(&PostParams::default(), &vmim("move-2", "mover"))
        .await
        .expect("migration");
    wait_for("the second hand-off", || async {
        (migration_phase(&migrations, "move-2").await == Some(MigrationPhase::PreparingTarget))
            .then_some(())
    })
    .await;
    let second_target = get(&vmis, "mover")
        .await
        .unwrap()
        .migration_state()
        .unwrap()
        .unwrap();
    assert_eq!(second_target.source_node.as_deref(), Some(target.as_str()));
    assert_eq!(
        second_target.target_node.as_deref(),
        Some(setup.node.as_str())
    );
    assert!(
        second_target.completed.is_none(),
        "the first migration's state is gone: {second_target:?}"
    );
    // The source started (as its handler reports), then the migration is deleted.
    handler_reports(
        &vmis,
        "mover",
        json!({"startTimestamp": "2026-12-05T10:00:30Z", "mode": "PreCopy"}),
    )
    .await;
    migrations
        .delete("move-2", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the abort request", || async {
        get(&vmis, "mover")
            .await
            .and_then(|v| v.migration_state().ok().flatten())
            .filter(|s| s.abort_requested == Some(true))
    })
    .await;
    // The source handler reports the abort.
    handler_reports(
        &vmis,
        "mover",
        json!({"failed": true, "completed": true, "abortStatus": "Succeeded", "endTimestamp": "2026-12-05T10:01:00Z", "failureReason": "Live migration has been aborted"}),
    )
    .await;
    wait_for(
        "the cancelled migration is gone with its target pod",
        || async {
            let gone = get(&migrations, "move-2").await.is_none();
            let targets = pods
                .list(&ListParams::default().labels("kubevirt.io/migrationJobUID"))
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|p| {
                    p.metadata.labels.as_ref().unwrap()["kubevirt.io/migrationJobUID"] != uid
                })
                .count();
            (gone && targets == 0).then_some(())
        },
    )
    .await;
    assert_eq!(get(&vmis, "mover").await.unwrap().phase(), Phase::Running);

    // A drain's eviction marks the VMI (virt-api's webhook): the controller migrates it.
    let node = get(&vmis, "mover")
        .await
        .unwrap()
        .status
        .unwrap()
        .node_name
        .unwrap();
    let mark = json!({"status": {
        "evacuationNodeName": node,
        "conditions": [{"type": "LiveMigratable", "status": "True"}, {"type": "Ready", "status": "True"}],
    }});
    vmis.patch_status("mover", &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .unwrap();
    let evacuation = wait_for("the evacuation's migration", || async {
        migrations
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|m| {
                m.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("kubevirt-evacuation-"))
            })
    })
    .await;
    assert_eq!(evacuation.spec.vmi_name.as_deref(), Some("mover"));
    assert_eq!(
        evacuation.metadata.annotations.as_ref().unwrap()["kubevirt.io/evacuationMigration"],
        node
    );
    wait_for("the evacuation hands off", || async {
        (migration_phase(&migrations, evacuation.metadata.name.as_deref().unwrap()).await
            == Some(MigrationPhase::PreparingTarget))
        .then_some(())
    })
    .await;
    // One migration per evacuation, however often the VMI is reconciled.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let count = migrations
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|m| {
            m.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.starts_with("kubevirt-evacuation-"))
        })
        .count();
    assert_eq!(count, 1);
}
