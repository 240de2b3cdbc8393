//! virt-handler in Kubernetes mode against a real API server (etcd + kube-apiserver from
//! `integration::controlplane`), with a real launcher in a real pod-like sandbox: the test
//! plays the controller (VMI Scheduled to this node, `activePods`) and the kubelet (pod
//! directories, network namespace, launcher process). The handler must bring the VMI to
//! Running with its status written, shut the VM down when the VMI is deleted, and never
//! touch a VMI of another node.
//!
//! Needs root, /dev/kvm and the control plane binaries (`integration/controlplane/build.sh`);
//! fails (never skips) without them.

#[path = "../../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{demo, helper_binaries, require_root_and_kvm};
use handler::launchers::PodPaths;
use handler_standalone::{netpod, pod};
use integration::controlplane;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use proto::kubevirt::{Phase, VirtualMachineInstance};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(120);

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn vmi_manifest(name: &str, node: &str, grace: i64) -> VirtualMachineInstance {
    let text = std::fs::read_to_string(
        common::workspace_root().join("images/examples/vmi-testguest-kernel-boot.yaml"),
    )
    .expect("example manifest");
    let mut vmi = proto::kubevirt::parse_vmi(&text).expect("example VMI");
    vmi.metadata.name = Some(name.into());
    vmi.metadata.namespace = None;
    vmi.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("kubevirt.io/nodeName".into(), node.into());
    vmi.spec.termination_grace_period_seconds = Some(grace);
    vmi
}

async fn schedule(api: &Api<VirtualMachineInstance>, name: &str, node: &str, pod_uid: &str) {
    // The controller's part: Scheduled on `node` with its launcher pod.
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {
            "phase": "Scheduled",
            "nodeName": node,
            "activePods": {pod_uid: node},
            "runtimeUser": 107,
            "migrationTransport": "Unix",
            "conditions": [{"type": "Ready", "status": "True"}],
        }})),
    )
    .await
    .expect("schedule the VMI");
}

async fn wait_phase(
    api: &Api<VirtualMachineInstance>,
    name: &str,
    phase: Phase,
) -> VirtualMachineInstance {
    let deadline = Instant::now() + WAIT;
    loop {
        let vmi = api.get(name).await.expect("get VMI");
        if vmi.phase() == phase {
            return vmi;
        }
        assert!(
            Instant::now() < deadline,
            "VMI {name} not {phase} within {WAIT:?}: {:?}",
            vmi.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn alive(pid: u32) -> bool {
    pod::process_start_time(pid).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handler_runs_a_scheduled_vmi_and_stops_it_on_delete() {
    require_root_and_kvm();
    let (monitor, _) = helper_binaries();
    let cp = match controlplane::shared().await {
        Ok(cp) => cp,
        Err(e) => panic!(
            "cannot run the test control plane: {e:#}\nbuild it with: {}",
            controlplane::build_script().display()
        ),
    };
    let ns = cp.create_namespace("handler").await.expect("namespace");
    let client = cp.client().expect("client");
    let api: Api<VirtualMachineInstance> = Api::namespaced(client, &ns);
    let node = format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let images = demo("kube-mode", 30);
    let dir = images.dir.path();

    // Ours, and one of another node that must stay untouched.
    let mine = api
        .create(&PostParams::default(), &vmi_manifest("mine", &node, 30))
        .await
        .expect("create VMI");
    let theirs = api
        .create(
            &PostParams::default(),
            &vmi_manifest("theirs", "other-node", 30),
        )
        .await
        .expect("create VMI");
    let pod_uid = uuid::Uuid::new_v4().to_string();
    schedule(&api, "mine", &node, &pod_uid).await;
    schedule(
        &api,
        "theirs",
        "other-node",
        &uuid::Uuid::new_v4().to_string(),
    )
    .await;
    let theirs_version = api
        .get("theirs")
        .await
        .expect("get")
        .metadata
        .resource_version;

    // The kubelet's part: the pod of "mine" with its launcher.
    let pods_dir = dir.join("pods");
    let paths = PodPaths::new(&pods_dir, &pod_uid);
    let scheduled = api.get("mine").await.expect("get");
    pod::create_dirs(&paths, 107).expect("pod dirs");
    let network = netpod::create(&pod_uid).await.expect("pod network");
    let mut binds = pod::volume_binds(&paths);
    binds.extend(
        pod::image_binds(
            &scheduled,
            &[
                ("localhost/test-guest:latest".into(), images.guest.clone()),
                ("localhost/test-disk:latest".into(), images.disk.clone()),
            ],
        )
        .expect("image binds"),
    );
    let plan = pod::LaunchPlan {
        launcher: monitor.clone(),
        args: pod::launcher_args(&scheduled),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        binds,
        hostname: "mine".into(),
        uid: 107,
        log: paths.pod_dir.join("launcher.log"),
    };
    let launcher_pid = pod::spawn_launcher(&plan, &network).expect("launcher");

    // The handler, as the DaemonSet runs it (paths moved under the test dir).
    let handler = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_virt-handler"))
            .env("KUBECONFIG", cp.kubeconfig_path())
            .env("RUST_LOG", "info")
            .arg("--hostname-override")
            .arg(&node)
            .arg("--pods-dir")
            .arg(&pods_dir)
            .arg("--kubevirt-share-dir")
            .arg(dir.join("share"))
            .arg("--kubevirt-private-dir")
            .arg(dir.join("private"))
            .args(["--watchdog-timeout", "5"])
            // Never the host's kubelet: device plugins in the test dir (no kubelet there).
            .arg("--device-plugin-dir")
            .arg(dir.join("device-plugins"))
            .arg("--host-root")
            .arg(dir.join("host-root"))
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start virt-handler"),
    );

    let running = wait_phase(&api, "mine", Phase::Running).await;
    let status = running.status.clone().expect("status");
    assert_eq!(
        status.node_name.as_deref(),
        Some(node.as_str()),
        "nodeName untouched"
    );
    assert!(
        status
            .conditions
            .iter()
            .any(|c| c.condition_type == "Ready"),
        "the controller's Ready condition is kept"
    );
    assert!(
        status
            .phase_transition_timestamps
            .iter()
            .any(|t| t.phase == Phase::Running)
    );
    let iface = status.interfaces.first().expect("interface status");
    assert_eq!(iface.name.as_deref(), Some("default"));
    assert_eq!(
        iface.ip_address.as_deref(),
        Some(network.pod_ip().to_string().as_str()),
        "pod IP reported"
    );
    assert!(iface.mac.is_some());
    assert_eq!(
        status.machine.as_ref().map(|m| m.machine_type.as_str()),
        Some("q35")
    );
    // The VMI-wide migration facts, through the API server: the handler's conditions after
    // the controller's (which stays first), without times, and the handler's two fields.
    let types: Vec<&str> = status
        .conditions
        .iter()
        .map(|c| c.condition_type.as_str())
        .collect();
    assert_eq!(
        types,
        ["Ready", "LiveMigratable", "StorageLiveMigratable"],
        "{status:?}"
    );
    assert_eq!(status.conditions[1].status, "True", "{status:?}");
    assert!(status.conditions[1].last_transition_time.is_none());
    assert_eq!(status.migration_method.as_deref(), Some("BlockMigration"));
    assert_eq!(status.selinux_context.as_deref(), Some("none"));
    assert_eq!(
        api.get("theirs")
            .await
            .expect("get")
            .metadata
            .resource_version,
        theirs_version,
        "a VMI of another node is never touched"
    );
    let _ = (mine, theirs);

    // Deleting the VMI shuts the VM down: the launcher finishes and exits.
    api.delete("mine", &DeleteParams::default())
        .await
        .expect("delete VMI");
    let deadline = Instant::now() + Duration::from_secs(90);
    while alive(launcher_pid) {
        // Reap it: this test started it.
        let _ = nix::sys::wait::waitpid(
            nix::unistd::Pid::from_raw(i32::try_from(launcher_pid).expect("a pid fits pid_t")),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        assert!(
            Instant::now() < deadline,
            "the launcher did not stop after the VMI was deleted"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ghost = dir.join("private/ghost-records");
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::fs::read_dir(&ghost).map(|d| d.count()).unwrap_or(0) > 0 {
        assert!(Instant::now() < deadline, "ghost record not cleaned up");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    drop(handler);
    netpod::delete_host_veth(&network.host_veth)
        .await
        .expect("remove veth");
    assert!(
        !Path::new("/sys/class/net")
            .join(&network.host_veth)
            .exists()
    );
}
