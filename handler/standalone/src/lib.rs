//! Standalone mode: `virt-handler standalone VMI.yaml...` on a node without Kubernetes.
//!
//! The handler plays the parts it would otherwise find in a cluster:
//! - the API server and controller ([`store`]): admits each manifest's VMI (UID, node label,
//!   phase `Scheduled` on this node, its launcher pod in `activePods`), applies status
//!   writes, shows phase transitions and events;
//! - the kubelet ([`pod`], [`netpod`]): per VMI a pod directory tree laid out like the
//!   kubelet's, a network namespace with `eth0` on a veth, and the launcher started in it
//!   as user 107; it reaps launchers and removes pods whose VMI is over.
//!
//! Then the ordinary agent drives every VMI exactly as in a cluster. Ctrl-C or SIGTERM
//! deletes the VMIs (graceful shutdown through the agent) and removes everything created.
//! A handler killed without that (SIGKILL, crash) leaves the launchers running; started
//! again with the same state directory and manifests, it adopts them without touching the
//! VMs.

pub mod console;
pub mod netpod;
pub mod pod;
pub mod store;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::jiff::Timestamp;
use proto::kubevirt::ready::LauncherPod;
use proto::kubevirt::{
    Condition, Phase, PhaseTransitionTimestamp, Time, VirtualMachineInstance,
    VirtualMachineInstanceStatus, well_known,
};
use tokio::sync::watch;

use console::ConsoleLines;
use handler::agent::{Agent, AgentConfig};
use handler::domains::{DomainCache, notify};
use handler::launchers::{LauncherPaths, Launchers, PodPaths};
use handler::metrics::Metrics;
use handler::vmis::{EventKind, StatusWriter, VmiStore};
use pod::{LaunchPlan, PodRecord};
use store::{StandaloneStore, StatusOutput, say};

/// What `virt-handler standalone` was asked to do.
#[derive(Debug, Clone)]
pub struct StandaloneOptions {
    pub manifests: Vec<PathBuf>,
    /// `--image NAME=PATH`: container-disk and kernel-boot images.
    pub images: Vec<(String, PathBuf)>,
    pub state_dir: PathBuf,
    pub node: String,
    /// `virt-launcher-monitor`.
    pub launcher: PathBuf,
    pub status_output: StatusOutput,
    /// Stop (gracefully) once every VMI's console printed a line containing this.
    pub stop_after_console: Option<String>,
    pub resync_period: Duration,
    pub watchdog_timeout: Duration,
    pub metrics: Option<SocketAddr>,
    /// KubeVirt's feature gates that are on (`hostDisk` needs `HostDisk`).
    pub feature_gates: proto::contract::feature_gates::FeatureGates,
}

/// The state directory's layout.
#[derive(Debug, Clone)]
pub struct StateDirs {
    pub root: PathBuf,
    pub pods: PathBuf,
    pub share: PathBuf,
    pub private: PathBuf,
    pub vmis: PathBuf,
}

impl StateDirs {
    pub fn new(root: &Path) -> Self {
        StateDirs {
            root: root.to_path_buf(),
            pods: root.join("pods"),
            share: root.join("kubevirt"),
            private: root.join("kubevirt-private"),
            vmis: root.join("vmis"),
        }
    }

    pub fn create(&self) -> Result<()> {
        for d in [&self.pods, &self.share, &self.private, &self.vmis] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(())
    }

    fn pod_record(&self, pod_uid: &str) -> PathBuf {
        self.pods.join(pod_uid).join("pod.json")
    }
}

/// The API server's and controller's defaults for a VMI scheduled to `node` with the
/// launcher pod `pod_uid`.
pub fn admit_vmi(
    mut vmi: VirtualMachineInstance,
    node: &str,
    pod_uid: &str,
) -> VirtualMachineInstance {
    let now = Time(Timestamp::now());
    let meta = &mut vmi.metadata;
    if meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".into());
    }
    if meta.uid.as_deref().unwrap_or("").is_empty() {
        meta.uid = Some(uuid::Uuid::new_v4().to_string());
    }
    meta.resource_version = Some("1".into());
    meta.creation_timestamp = Some(now.clone());
    meta.labels
        .get_or_insert_with(Default::default)
        .insert(well_known::NODE_NAME_LABEL.into(), node.into());
    let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
    if !finalizers
        .iter()
        .any(|f| f == well_known::FOREGROUND_DELETE_FINALIZER)
    {
        finalizers.push(well_known::FOREGROUND_DELETE_FINALIZER.into());
    }
    let timestamps = [Phase::Pending, Phase::Scheduling, Phase::Scheduled]
        .into_iter()
        .map(|phase| PhaseTransitionTimestamp {
            phase,
            phase_transition_timestamp: now.clone(),
            extra: Default::default(),
        })
        .collect();
    vmi.status = Some(VirtualMachineInstanceStatus {
        node_name: Some(node.into()),
        phase: Some(Phase::Scheduled),
        phase_transition_timestamps: timestamps,
        active_pods: Some(BTreeMap::from([(pod_uid.to_string(), node.to_string())])),
        runtime_user: Some(u64::from(well_known::NON_ROOT_UID)),
        migration_transport: Some("Unix".into()),
        qos_class: Some("Burstable".into()),
        ..Default::default()
    });
    vmi
}

/// A VMI the launcher cannot run, as admitted and then given up: `Failed` without a pod
/// or a node, `Synchronized=False` (`FailedCreate`) and not `Ready`.
fn refuse_vmi(mut vmi: VirtualMachineInstance, message: &str) -> VirtualMachineInstance {
    let now = Time(Timestamp::now());
    let meta = &mut vmi.metadata;
    if meta.namespace.as_deref().unwrap_or("").is_empty() {
        meta.namespace = Some("default".into());
    }
    if meta.uid.as_deref().unwrap_or("").is_empty() {
        meta.uid = Some(uuid::Uuid::new_v4().to_string());
    }
    meta.resource_version = Some("1".into());
    meta.creation_timestamp = Some(now.clone());
    let condition = |kind: &str, reason: &str, message: &str| Condition {
        condition_type: kind.into(),
        status: "False".into(),
        last_probe_time: None,
        last_transition_time: Some(now.clone()),
        reason: Some(reason.into()),
        message: Some(message.into()),
        extra: Default::default(),
    };
    vmi.status = Some(VirtualMachineInstanceStatus {
        phase: Some(Phase::Failed),
        phase_transition_timestamps: [Phase::Pending, Phase::Failed]
            .into_iter()
            .map(|phase| PhaseTransitionTimestamp {
                phase,
                phase_transition_timestamp: now.clone(),
                extra: Default::default(),
            })
            .collect(),
        conditions: vec![
            condition("Synchronized", "FailedCreate", message),
            condition(
                "Ready",
                "PodNotExists",
                "virt-launcher pod has not yet been scheduled",
            ),
        ],
        ..Default::default()
    });
    vmi
}

/// A pod this handler looks after.
struct ManagedPod {
    record: PodRecord,
    console: Option<tokio::task::JoinHandle<()>>,
    final_since: Option<Instant>,
    terminated: bool,
}

fn read_records(dirs: &StateDirs) -> Vec<PodRecord> {
    let Ok(entries) = std::fs::read_dir(&dirs.pods) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("pod.json")).ok())
        .filter_map(|b| serde_json::from_slice::<PodRecord>(&b).ok())
        .collect()
}

fn write_record(dirs: &StateDirs, record: &PodRecord) -> Result<()> {
    let path = dirs.pod_record(&record.pod_uid);
    std::fs::write(&path, serde_json::to_vec_pretty(record)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// Removes a pod: its veth (and with it the namespace's eth0), its directories.
async fn remove_pod(dirs: &StateDirs, record: &PodRecord) {
    if let Err(e) = netpod::delete_host_veth(&record.host_veth).await {
        tracing::warn!(pod = %record.pod_uid, error = %e, "cannot delete the pod's veth");
    }
    let dir = dirs.pods.join(&record.pod_uid);
    if let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "cannot remove pod directory");
    }
}

/// Creates the pod of `vmi` and starts its launcher.
pub async fn start_pod(
    options: &StandaloneOptions,
    dirs: &StateDirs,
    vmi: &VirtualMachineInstance,
    pod_uid: &str,
) -> Result<PodRecord> {
    let key = handler::vmis::key_of(vmi);
    let paths = PodPaths::new(&dirs.pods, pod_uid);
    let uid = handler::launchers::runtime_user(vmi);
    let started = Instant::now();
    let image_binds = pod::image_binds(vmi, &options.images)?;
    pod::create_dirs(&paths, uid)?;
    let network = netpod::create(pod_uid)
        .await
        .with_context(|| format!("creating the network of pod {pod_uid}"))?;
    let network_ready = Instant::now();
    let mut binds = pod::volume_binds(&paths);
    binds.extend(image_binds);
    let name = vmi.metadata.name.clone().unwrap_or_default();
    let hostname = vmi
        .spec
        .hostname
        .clone()
        .unwrap_or_else(|| name.chars().take(63).collect());
    let plan = LaunchPlan {
        launcher: options.launcher.clone(),
        args: pod::launcher_args(vmi),
        env: vec![
            (
                "PATH".into(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into(),
            ),
            (
                "POD_NAME".into(),
                format!("virt-launcher-{name}-{}", &pod_uid[..5.min(pod_uid.len())]),
            ),
            ("XDG_CACHE_HOME".into(), "/var/run/kubevirt-private".into()),
            ("XDG_CONFIG_HOME".into(), "/var/run/kubevirt-private".into()),
            ("XDG_RUNTIME_DIR".into(), "/var/run".into()),
            (
                "RUST_LOG".into(),
                std::env::var("LAUNCHER_LOG").unwrap_or_else(|_| "info".into()),
            ),
        ],
        binds,
        hostname,
        uid,
        log: paths.pod_dir.join("launcher.log"),
    };
    let pid = match pod::spawn_launcher(&plan, &network) {
        Ok(pid) => pid,
        Err(e) => {
            let _ = netpod::delete_host_veth(&network.host_veth).await;
            return Err(e.into());
        }
    };
    tracing::debug!(
        target: handler::takeover::TARGET,
        %key,
        dirs_and_network_ms = (network_ready - started).as_secs_f64() * 1e3,
        spawn_ms = network_ready.elapsed().as_secs_f64() * 1e3,
        "kubelet: pod created, launcher started"
    );
    let record = PodRecord {
        pod_uid: pod_uid.to_string(),
        vmi_key: key.clone(),
        vmi_uid: vmi.metadata.uid.clone().unwrap_or_default(),
        pid,
        start_time: pod::process_start_time(pid).unwrap_or(0),
        host_veth: network.host_veth.clone(),
        subnet: network.subnet,
    };
    write_record(dirs, &record)?;
    say(&format!(
        "[{key}] pod {pod_uid}: launcher pid {pid}, pod IP {}, log {}",
        network.pod_ip(),
        plan.log.display()
    ));
    Ok(record)
}

/// Runs standalone mode until every VMI is over, or a signal / `--stop-after-console`
/// stops it.
pub async fn run(options: StandaloneOptions) -> Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("standalone mode creates network namespaces and mounts: run it as root");
    }
    if !options.launcher.exists() {
        bail!(
            "launcher {} not found (build it with `cargo build -p virt-launcher --bins`, or pass --launcher)",
            options.launcher.display()
        );
    }
    let dirs = StateDirs::new(&options.state_dir);

    // Parse every manifest before touching anything.
    let mut manifests = Vec::new();
    for path in &options.manifests {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let vmi = proto::kubevirt::parse_vmi(&text)
            .with_context(|| format!("parsing {}", path.display()))?;
        if vmi.metadata.name.as_deref().unwrap_or("").is_empty() {
            bail!("{}: the VMI has no metadata.name", path.display());
        }
        let key = handler::vmis::key_of(&admit_vmi(vmi.clone(), &options.node, "x"));
        if manifests
            .iter()
            .any(|(_, other): &(PathBuf, VirtualMachineInstance)| {
                handler::vmis::key_of(&admit_vmi(other.clone(), &options.node, "x")) == key
            })
        {
            bail!("{}: a VMI named {key} is given twice", path.display());
        }
        manifests.push((path.clone(), vmi));
    }

    dirs.create()?;
    if options.status_output == StatusOutput::StateDir {
        say(&format!(
            "status files in {}",
            dirs.root.join(store::STATUS_DIR).display()
        ));
    }
    let (store, vmi_changes) = StandaloneStore::new(&dirs.vmis, &dirs.root, options.status_output);
    let store = Arc::new(store);
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
        &options.node,
        hub.clone(),
    ));
    let notify_server = notify::start(&dirs.share, hub)?;
    let metrics_task = match options.metrics {
        Some(addr) => Some(handler::metrics::serve(Arc::clone(&metrics), addr).await?.1),
        None => None,
    };

    // Pods of an earlier run: adopt those whose VMI is given again and whose launcher
    // lives; the rest are left to the agent (VMI gone => shut down) or removed.
    let mut pods: BTreeMap<String, ManagedPod> = BTreeMap::new();
    let earlier = read_records(&dirs);
    let mut started = Vec::new();
    for (_, manifest_vmi) in manifests {
        let key = handler::vmis::key_of(&admit_vmi(manifest_vmi.clone(), &options.node, "x"));
        // What the launcher cannot run never gets a pod: as the controller reports a
        // failed pod render (`Synchronized=False`, `FailedCreate`, a Warning event), and
        // since no one will change this VMI here, it ends `Failed`.
        let admitted = proto::contract::feature_gates::check(&manifest_vmi, &options.feature_gates)
            .and_then(|()| proto::contract::runnable::check(&manifest_vmi));
        if let Err(refusal) = admitted {
            let message = format!("failed to render launch manifest: {refusal}");
            say(&format!("[{key}] refused: {refusal}"));
            let vmi = refuse_vmi(manifest_vmi, &message);
            store.admit(vmi.clone());
            store.record_event(&vmi, EventKind::Warning, "FailedCreate", &message);
            continue;
        }
        let adopted = earlier
            .iter()
            .find(|r| r.vmi_key == key && pod::launcher_alive(r))
            .and_then(|r| store.load_persisted(&key).map(|v| (r.clone(), v)))
            .filter(|(r, v)| v.metadata.uid.as_deref() == Some(r.vmi_uid.as_str()));
        if let Some((record, vmi)) = adopted {
            say(&format!(
                "[{key}] adopting running launcher pid {} (pod {})",
                record.pid, record.pod_uid
            ));
            store.admit(vmi);
            pods.insert(
                record.pod_uid.clone(),
                ManagedPod {
                    record,
                    console: None,
                    final_since: None,
                    terminated: false,
                },
            );
            continue;
        }
        let pod_uid = uuid::Uuid::new_v4().to_string();
        let vmi = admit_vmi(manifest_vmi, &options.node, &pod_uid);
        started.push((vmi, pod_uid));
    }
    for record in &earlier {
        if pods.contains_key(&record.pod_uid) {
            continue;
        }
        if pod::launcher_alive(record) {
            // Its VMI is not given again: the agent shuts it down (VMI gone) through the
            // ghost record; the pod is removed once the launcher exits.
            say(&format!(
                "[{}] VMI not given again: shutting down its launcher pid {}",
                record.vmi_key, record.pid
            ));
            pods.insert(
                record.pod_uid.clone(),
                ManagedPod {
                    record: record.clone(),
                    console: None,
                    final_since: Some(Instant::now()),
                    terminated: false,
                },
            );
        } else {
            remove_pod(&dirs, record).await;
        }
    }

    let mut config = AgentConfig::new(&options.node, dirs.private.clone());
    config.resync_period = options.resync_period;
    config.watchdog_timeout = options.watchdog_timeout;
    let agent = Agent::new(
        config,
        store.clone(),
        store.clone(),
        Arc::clone(&cache),
        Arc::clone(&launchers),
        Arc::clone(&metrics),
    );
    let (stop_agent, agent_stopped) = watch::channel(false);
    let agent_task =
        tokio::spawn(Arc::clone(&agent).run(cache_changes, vmi_changes, agent_stopped));

    let mut failure = None;
    for (vmi, pod_uid) in started {
        let key = handler::vmis::key_of(&vmi);
        match start_pod(&options, &dirs, &vmi, &pod_uid).await {
            Ok(record) => {
                store.admit(vmi);
                pods.insert(
                    pod_uid,
                    ManagedPod {
                        record,
                        console: None,
                        final_since: None,
                        terminated: false,
                    },
                );
            }
            Err(e) => {
                say(&format!("[{key}] cannot start its pod: {e:#}"));
                let _ = std::fs::remove_dir_all(dirs.pods.join(&pod_uid));
                failure = Some(e);
                break;
            }
        }
    }

    let lines = Arc::new(ConsoleLines::watching(options.stop_after_console.clone()));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let mut stopping: Option<Instant> = None;
    if failure.is_some() {
        stopping = Some(Instant::now());
        for key in store.keys() {
            store.mark_deleted(&key);
        }
    }
    let max_grace = store
        .keys()
        .iter()
        .filter_map(|k| store.get(k))
        .map(|v| v.grace_period_seconds())
        .max()
        .unwrap_or(30);
    let stop_deadline = Duration::from_secs(u64::try_from(max_grace).unwrap_or(30) + 60);
    let mut tick = tokio::time::interval(Duration::from_millis(250));

    loop {
        tokio::select! {
            _ = sigint.recv() => {}
            _ = sigterm.recv() => {}
            _ = tick.tick() => {
                supervise(&dirs, &store, &mut pods, &lines).await;
                if pods.is_empty() {
                    break;
                }
                if stopping.is_none()
                    && let Some(text) = &options.stop_after_console
                    && !store.keys().is_empty()
                    && store.keys().iter().all(|k| lines.has_shown(k))
                {
                    say(&format!("every console printed {text:?}: stopping"));
                    stopping = Some(Instant::now());
                    for key in store.keys() {
                        store.mark_deleted(&key);
                    }
                }
                if let Some(since) = stopping
                    && since.elapsed() > stop_deadline
                {
                    say("graceful stop took too long: killing the remaining launchers");
                    for pid in pods.values().filter_map(|p| p.record.launcher_pid()) {
                        // The launcher leads its own session: kill the whole pod.
                        let _ = nix::sys::signal::kill(
                            nix::unistd::Pid::from_raw(-pid.as_raw()),
                            nix::sys::signal::Signal::SIGKILL,
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    supervise(&dirs, &store, &mut pods, &lines).await;
                    for p in std::mem::take(&mut pods).into_values() {
                        remove_pod(&dirs, &p.record).await;
                    }
                    break;
                }
                continue;
            }
        }
        if stopping.is_none() {
            say("stopping: shutting the VMs down gracefully (again to force)");
            stopping = Some(Instant::now());
            for key in store.keys() {
                store.mark_deleted(&key);
            }
        } else if stopping.is_some_and(|since| since.elapsed() > Duration::from_secs(1)) {
            // A second signal (not the duplicate some tools send at once) forces.
            say("forced stop");
            stopping = Some(Instant::now() - stop_deadline - Duration::from_secs(1));
        }
    }

    let _ = stop_agent.send(true);
    let _ = agent_task.await;
    if let Err(e) = notify_server.stop().await {
        tracing::warn!(error = %e, "notify server stopped with an error");
    }
    if let Some(t) = metrics_task {
        t.abort();
    }
    // A run whose VMIs did not all succeed fails, naming them.
    let failed: Vec<String> = store
        .keys()
        .into_iter()
        .filter(|k| store.get(k).is_some_and(|v| v.phase() == Phase::Failed))
        .collect();
    // Everything created under the state directory goes but the status files (they are
    // the output; `status/` keeps the state directory itself).
    for key in store.keys() {
        store.remove(&key);
    }
    for d in [&dirs.pods, &dirs.share, &dirs.private, &dirs.vmis] {
        let _ = std::fs::remove_dir_all(d);
    }
    let _ = std::fs::remove_dir(&dirs.root);
    match failure {
        Some(e) => Err(e),
        None if !failed.is_empty() => bail!("VMI(s) ended Failed: {}", failed.join(", ")),
        None => Ok(()),
    }
}

/// The kubelet's loop: reap launchers, start consoles, ask finished launchers to stop,
/// remove pods whose launcher is gone and whose VMI is over.
async fn supervise(
    dirs: &StateDirs,
    store: &Arc<StandaloneStore>,
    pods: &mut BTreeMap<String, ManagedPod>,
    lines: &Arc<ConsoleLines>,
) {
    let mut removed = Vec::new();
    for (pod_uid, pod) in pods.iter_mut() {
        let pid = pod.record.launcher_pid();
        // Reap our own children; adopted launchers are not ours (ECHILD is fine).
        if let Some(pid) = pid {
            let _ = nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
        let alive = pod::launcher_alive(&pod.record);
        let vmi = store.get(&pod.record.vmi_key);
        // The controller deletes the pod of a VMI that is over, and of a deleted VMI that
        // never ran (nothing for the handler to shut down).
        let over = match &vmi {
            None => true,
            Some(v) => {
                v.phase().is_final()
                    || (v.metadata.deletion_timestamp.is_some() && v.phase() != Phase::Running)
            }
        };
        // The pod as the controller sees it: going down once its VMI is over or its
        // launcher is gone; else ready when the launcher's cmd socket exists (renamed from
        // the init socket once it answers), as the kubelet's readiness probe would say.
        if vmi.is_some() {
            let socket = PodPaths::new(&dirs.pods, &pod.record.pod_uid).launcher_socket();
            let seen = if over || !alive || pod.terminated {
                LauncherPod::GoingDown
            } else if socket.exists() {
                LauncherPod::Up(Some(("True", "", "")))
            } else {
                LauncherPod::Up(Some((
                    "False",
                    "ContainersNotReady",
                    "containers with unready status: [compute]",
                )))
            };
            store.sync_ready(&pod.record.vmi_key, seen);
        }
        if alive
            && pod.console.is_none()
            && vmi.as_ref().is_some_and(|v| v.phase() == Phase::Running)
        {
            let record = pod.record.clone();
            pod.console = Some(console::follow(
                record.vmi_key.clone(),
                record.pid,
                record.vmi_uid.clone(),
                Arc::clone(lines),
                move || pod::launcher_alive(&record),
            ));
        }
        if over && pod.final_since.is_none() {
            pod.final_since = Some(Instant::now());
        }
        if alive
            && let Some(since) = pod.final_since
            && !pod.terminated
            && since.elapsed() > Duration::from_secs(10)
            && let Some(pid) = pid
        {
            // The controller deletes the pod of a finished VMI; the kubelet sends SIGTERM.
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            pod.terminated = true;
        }
        if !alive && over {
            removed.push(pod_uid.clone());
        }
    }
    for pod_uid in removed {
        if let Some(pod) = pods.remove(&pod_uid) {
            if let Some(c) = pod.console {
                c.abort();
            }
            remove_pod(dirs, &pod.record).await;
            let key = &pod.record.vmi_key;
            if let Some(vmi) = store.get(key) {
                store.sync_ready(key, LauncherPod::Missing);
                say(&format!("[{key}] pod removed; VMI {}", vmi.phase()));
            } else {
                say(&format!("[{key}] pod removed"));
            }
        }
    }
}
