//! Two nodes' handlers move a running VMI between two real launcher pods on this machine:
//! each node has its own agent, pods directory, notify server and domain cache; they share
//! one VMI store, as two handlers share the API server. The test plays the migration
//! controller's part (the target pod and the hand-off patch, as
//! `vmm/launcher/docs/migration-contract.md` §5.3 has it); everything after that is the
//! handlers' own: the target pod's network, SyncMigrationTarget, the target listener and
//! its published port, the source proxy in the source pod, MigrateVirtualMachine, the
//! hand-over to the target node, Finalize, the clean-up, and the source launcher's end; and
//! a source launcher killed mid-migration, which the target side must end as failed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "../../tests/common/mod.rs"]
mod common;
use common::{demo, helper_binaries, require_root_and_kvm};

use handler::agent::{Agent, AgentConfig};
use handler::domains::{DomainCache, notify};
use handler::launchers::{LauncherPaths, Launchers, PodPaths};
use handler::metrics::Metrics;
use handler::migration::MigrationSettings;
use handler::vmis::{StatusWriter, VmiStore};
use handler_standalone::pod::{PodRecord, launcher_alive};
use handler_standalone::store::{StandaloneStore, StatusOutput};
use handler_standalone::{StandaloneOptions, StateDirs, admit_vmi, start_pod};
use proto::kubevirt::{Phase, VirtualMachineInstance, well_known};
use tokio::sync::{mpsc, watch};

const TIMEOUT: Duration = Duration::from_secs(120);
/// The guest writes its disk and 4 MiB of memory every tick and counts its disk writes
/// (`blk ok N`) on its console.
const KERNEL_ARGS: &str = "console=ttyS0 checks=serial exit=tick wait=600 dirty=4 blk=tick";
const MIGRATION_UID: &str = "5e7c0d1e-0000-4000-8000-000000000001";

/// One node: its state directories and the agent's pieces.
struct Node {
    name: &'static str,
    dirs: StateDirs,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    notify: notify::NotifyServerHandle,
}

fn start_node(
    name: &'static str,
    root: &Path,
    store: &Arc<StandaloneStore>,
    changes: mpsc::UnboundedReceiver<String>,
) -> Node {
    let dirs = StateDirs::new(&root.join(name));
    dirs.create().unwrap();
    let (cache, cache_changes) = DomainCache::new();
    let cache = Arc::new(cache);
    let metrics = Arc::new(Metrics::new());
    let hub = notify::NotifyHub::new(Arc::clone(&cache), store.clone(), Arc::clone(&metrics));
    let launchers = Arc::new(Launchers::new(
        LauncherPaths {
            pods_dir: dirs.pods.clone(),
            share_dir: dirs.share.clone(),
            ghost_dir: dirs.private.join("ghost-records"),
        },
        name,
        hub.clone(),
    ));
    let notify = notify::start(&dirs.share, hub).unwrap();
    let mut config = AgentConfig::new(name, dirs.private.clone());
    config.watchdog_timeout = Duration::from_secs(5);
    // The handlers talk over loopback; their mutual TLS is `migration_proxy`'s test.
    config.migration = Some(MigrationSettings {
        address: "127.0.0.1".parse().unwrap(),
        tls: handler::migration::MigrationTls::Plain,
    });
    let agent = Agent::new(
        config,
        store.clone(),
        store.clone(),
        cache,
        launchers,
        metrics,
    );
    let (stop, stopped) = watch::channel(false);
    let task = tokio::spawn(agent.run(cache_changes, changes, stopped));
    Node {
        name,
        dirs,
        stop,
        task,
        notify,
    }
}

/// Every VMI change goes to both nodes' agents (each watches what it needs).
fn fan_out(
    mut changes: mpsc::UnboundedReceiver<String>,
) -> (
    mpsc::UnboundedReceiver<String>,
    mpsc::UnboundedReceiver<String>,
) {
    let (a_tx, a_rx) = mpsc::unbounded_channel();
    let (b_tx, b_rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(key) = changes.recv().await {
            let _ = a_tx.send(key.clone());
            let _ = b_tx.send(key);
        }
    });
    (a_rx, b_rx)
}

async fn wait_until<T>(what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn serial_log(dirs: &StateDirs, pod: &PodRecord) -> String {
    let path: PathBuf = PodPaths::new(&dirs.pods, &pod.pod_uid)
        .empty_dir("private")
        .join(&pod.vmi_uid)
        .join("virt-serial0-log");
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The last `blk ok N` on a console.
fn last_blk(text: &str) -> u64 {
    text.rsplit("blk ok ")
        .next()
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn migration_state(vmi: &VirtualMachineInstance) -> serde_json::Value {
    vmi.status
        .as_ref()
        .and_then(|s| s.migration_state.clone())
        .unwrap_or_default()
}

fn label<'a>(vmi: &'a VirtualMachineInstance, name: &str) -> Option<&'a str> {
    vmi.metadata.labels.as_ref()?.get(name).map(String::as_str)
}

fn reap(pod: &PodRecord) -> bool {
    if let Some(pid) = pod.launcher_pid() {
        let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
    }
    !launcher_alive(pod)
}

/// The tests of this binary one at a time: each runs two launcher pods with a guest that
/// keeps writing (two cores).
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Two nodes, and a VMI running on node-a whose guest writes its disk and memory.
struct TwoNodes {
    _root: tempfile::TempDir,
    _demo: common::Demo,
    store: Arc<StandaloneStore>,
    node_a: Node,
    node_b: Node,
    options_b: StandaloneOptions,
    key: String,
    source: PodRecord,
    source_pod_uid: String,
}

impl TwoNodes {
    async fn start(name: &str) -> TwoNodes {
        let (monitor, _) = helper_binaries();
        let demo = demo(name, 5);
        let root = tempfile::tempdir().unwrap();
        let (store, changes) = StandaloneStore::new(
            &root.path().join("vmis"),
            root.path(),
            StatusOutput::StateDir,
        );
        let store = Arc::new(store);
        let (to_a, to_b) = fan_out(changes);
        let node_a = start_node("node-a", root.path(), &store, to_a);
        let node_b = start_node("node-b", root.path(), &store, to_b);
        let options = |node: &Node| StandaloneOptions {
            manifests: Vec::new(),
            images: vec![
                ("localhost/test-guest:latest".into(), demo.guest.clone()),
                ("localhost/test-disk:latest".into(), demo.disk.clone()),
            ],
            state_dir: node.dirs.root.clone(),
            node: node.name.into(),
            launcher: monitor.clone(),
            status_output: StatusOutput::StateDir,
            stop_after_console: None,
            resync_period: Duration::from_secs(300),
            watchdog_timeout: Duration::from_secs(5),
            metrics: None,
            feature_gates: Default::default(),
        };
        let text = std::fs::read_to_string(&demo.manifest)
            .unwrap()
            .replace("exit=halt wait=600", "exit=tick wait=600")
            .replace(
                "console=ttyS0 checks=serial,bootparams,idt,mem,smbios,rtc,virtio-blk,virtio-rng exit=tick wait=600",
                KERNEL_ARGS,
            );
        assert!(
            text.contains(KERNEL_ARGS),
            "the example's kernel arguments changed"
        );
        let source_pod_uid = uuid::Uuid::new_v4().to_string();
        let vmi = admit_vmi(
            proto::kubevirt::parse_vmi(&text).unwrap(),
            "node-a",
            &source_pod_uid,
        );
        let key = handler::vmis::key_of(&vmi);
        let source = start_pod(&options(&node_a), &node_a.dirs, &vmi, &source_pod_uid)
            .await
            .unwrap();
        store.admit(vmi);
        wait_until("the VMI runs on node-a", || {
            store.get(&key).filter(|v| v.phase() == Phase::Running)
        })
        .await;
        let options_b = options(&node_b);
        TwoNodes {
            _root: root,
            _demo: demo,
            store,
            node_a,
            node_b,
            options_b,
            key,
            source,
            source_pod_uid,
        }
    }

    /// The controller's part: a target pod on node-b, then the hand-off with the
    /// migration's `configuration`. Returns the target pod.
    async fn migrate(&self, configuration: serde_json::Value) -> PodRecord {
        let target_pod_uid = uuid::Uuid::new_v4().to_string();
        let running = self.store.get(&self.key).unwrap();
        let mut target_view = running.clone();
        target_view.status.as_mut().unwrap().active_pods = Some(BTreeMap::from([(
            target_pod_uid.clone(),
            "node-b".to_string(),
        )]));
        let target = start_pod(
            &self.options_b,
            &self.node_b.dirs,
            &target_view,
            &target_pod_uid,
        )
        .await
        .unwrap();
        let name = running.metadata.name.clone().unwrap();
        let source_pod_name = format!("virt-launcher-{name}-{}", &self.source_pod_uid[..5]);
        let target_pod_name = format!("virt-launcher-{name}-{}", &target_pod_uid[..5]);
        let hand_off = serde_json::json!({
            "metadata": {"labels": {well_known::MIGRATION_TARGET_NODE_NAME_LABEL: "node-b"}},
            "status": {
                "activePods": {&self.source_pod_uid: "node-a", &target_pod_uid: "node-b"},
                "migrationState": {
                    "migrationUid": MIGRATION_UID,
                    "sourceNode": "node-a",
                    "targetNode": "node-b",
                    "sourcePod": source_pod_name,
                    "targetPod": target_pod_name,
                    "migrationConfiguration": configuration,
                }
            }
        });
        self.store.patch_vmi(&running, &hand_off).await.unwrap();
        target
    }

    async fn stop(self, pods: &[&PodRecord]) {
        for node in [self.node_a, self.node_b] {
            let _ = node.stop.send(true);
            let _ = node.task.await;
            let _ = node.notify.stop().await;
        }
        for pod in pods {
            let _ = handler_standalone::netpod::delete_host_veth(&pod.host_veth).await;
        }
    }
}

/// SIGKILL for a pod's processes: the monitor and everything below it (as a container's
/// end takes its whole process tree).
fn kill_pod(pod: &PodRecord) {
    fn descendants(pid: u32, into: &mut Vec<u32>) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                into.push(child);
                descendants(child, into);
            }
        }
    }
    let mut pids = vec![pod.pid];
    descendants(pod.pid, &mut pids);
    for pid in pids
        .into_iter()
        .filter_map(|pid| libc::pid_t::try_from(pid).ok())
        .filter(|pid| *pid > 1)
    {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_vmi_moves_to_the_other_node_and_its_guest_goes_on() {
    require_root_and_kvm();
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = TwoNodes::start("migrating").await;
    let (store, key, source) = (&nodes.store, nodes.key.clone(), &nodes.source);
    let node_a = &nodes.node_a;
    let node_b = &nodes.node_b;
    // What migration admission reads: the source says the VMI can migrate (no CPU model,
    // masquerade), copying its container disk.
    let running_status = store.get(&key).and_then(|v| v.status).unwrap();
    let migratable = |status: &proto::kubevirt::VirtualMachineInstanceStatus| {
        let condition = |kind: &str| {
            status
                .conditions
                .iter()
                .find(|c| c.condition_type == kind)
                .map(|c| c.status.clone())
        };
        (
            condition("LiveMigratable"),
            condition("StorageLiveMigratable"),
            status.migration_method.clone(),
        )
    };
    let says_migratable = (
        Some("True".to_string()),
        Some("True".to_string()),
        Some("BlockMigration".to_string()),
    );
    assert_eq!(
        migratable(&running_status),
        says_migratable,
        "{running_status:?}"
    );
    let before = wait_until("the guest writes its disk", || {
        let log = serial_log(&node_a.dirs, source);
        (last_blk(&log) >= 3).then_some(log)
    })
    .await;
    assert!(before.contains("TEST serial PASS"), "{before}");

    // The controller's part: a target pod on node-b, then the hand-off.
    let started = Instant::now();
    let target = nodes.migrate(serde_json::json!({})).await;

    // The handlers' part, watched through the VMI.
    let moved = wait_until("the VMI is handed over to node-b and completed", || {
        store.get(&key).filter(|v| {
            migration_state(v)["completed"] == true
                && label(v, well_known::MIGRATION_TARGET_NODE_NAME_LABEL).is_none()
        })
    })
    .await;
    println!("migrated and cleaned up in {:?}", started.elapsed());
    let state = migration_state(&moved);
    assert_eq!(
        moved.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-b")
    );
    assert_eq!(label(&moved, well_known::NODE_NAME_LABEL), Some("node-b"));
    assert_eq!(moved.phase(), Phase::Running);
    assert_eq!(migratable(moved.status.as_ref().unwrap()), says_migratable);
    assert_eq!(state["targetNodeAddress"], "127.0.0.1");
    assert_eq!(state["mode"], "PreCopy");
    assert_eq!(state["targetNodeDomainDetected"], true);
    for key in [
        "startTimestamp",
        "endTimestamp",
        "targetNodeDomainReadyTimestamp",
    ] {
        assert!(state[key].is_string(), "{key} missing: {state}");
    }
    assert!(state.get("failed").is_none(), "{state}");
    let ports = state["targetDirectMigrationNodePorts"].as_object().unwrap();
    assert_eq!(
        ports.values().collect::<Vec<_>>(),
        [&serde_json::json!(49152)]
    );

    // The source launcher was told to go, and went; its proxy socket with it.
    wait_until("the source launcher exits", || reap(source).then_some(())).await;
    // The guest goes on on node-b: its disk counter continues, no boot.
    let last_on_source = last_blk(&serial_log(&node_a.dirs, source));
    let after = wait_until("the guest writes its disk on node-b", || {
        let log = serial_log(&node_b.dirs, &target);
        (last_blk(&log) > last_on_source + 2).then_some(log)
    })
    .await;
    assert!(
        !after.contains("TEST serial"),
        "the guest booted again on node-b: {after}"
    );
    assert!(
        !after.contains("blk FAIL") && !after.contains("dirty FAIL"),
        "{after}"
    );

    // node-b owns it now: deleting the VMI stops the VM there.
    store.mark_deleted(&key);
    wait_until("the target launcher exits", || reap(&target).then_some(())).await;
    let source = source.clone();
    nodes.stop(&[&source, &target]).await;
}

/// The source launcher dies while the guest moves (a slow migration, 1 MiB/s): the target's
/// incoming domain goes away, and the target handler ends the migration failed — nothing
/// else could (the source cannot report, and the source node's main loop leaves a VMI
/// alone while its migration has started and not ended). Then the source node finds its VM
/// gone (the VMI fails, as any VM whose launcher died) and the target launcher is let go.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_source_launcher_that_dies_mid_migration_ends_the_migration_failed() {
    require_root_and_kvm();
    let _one = ONE_AT_A_TIME.lock().await;
    let nodes = TwoNodes::start("dying-source").await;
    let key = nodes.key.clone();
    wait_until("the guest writes its disk", || {
        (last_blk(&serial_log(&nodes.node_a.dirs, &nodes.source)) >= 2).then_some(())
    })
    .await;
    let target = nodes
        .migrate(serde_json::json!({"bandwidthPerMigration": "1Mi"}))
        .await;
    wait_until("the guest on its way (started, seen by the target)", || {
        nodes.store.get(&key).filter(|v| {
            let state = migration_state(v);
            state["startTimestamp"].is_string() && state["targetNodeDomainDetected"] == true
        })
    })
    .await;
    kill_pod(&nodes.source);
    let failed = wait_until("the migration ends failed", || {
        nodes.store.get(&key).filter(|v| {
            let state = migration_state(v);
            state["failed"] == true && state["completed"] == true
        })
    })
    .await;
    let state = migration_state(&failed);
    assert!(state["endTimestamp"].is_string(), "{state}");
    assert_eq!(
        failed.status.as_ref().unwrap().node_name.as_deref(),
        Some("node-a"),
        "never handed over"
    );
    assert_eq!(label(&failed, well_known::NODE_NAME_LABEL), Some("node-a"));
    wait_until("the target launcher is let go and exits", || {
        reap(&target).then_some(())
    })
    .await;
    wait_until("the VMI fails on node-a (its VM died)", || {
        nodes.store.get(&key).filter(|v| v.phase() == Phase::Failed)
    })
    .await;
    let source = nodes.source.clone();
    let _ = reap(&source);
    nodes.stop(&[&source, &target]).await;
}
