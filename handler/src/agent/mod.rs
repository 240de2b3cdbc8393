//! The node agent: one work queue of VMI keys, fed by VMI changes, domain changes and the
//! periodic resync; each reconcile reads the facts afresh, asks [`crate::sync`] what to
//! do, does it, and writes the status the facts imply.

mod migration;
pub mod queue;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use proto::domain::{Domain, LifeCycle};
use proto::kubevirt::{Phase, VirtualMachineInstance};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use crate::domains::{CacheChange, CacheChanges, DomainCache};
use crate::launchers::arrivals::SocketArrivals;
use crate::launchers::{CmdError, LauncherClient, Launchers, PodPaths, VmiCommand, runtime_user};
use crate::metrics::Metrics;
use crate::podside::{self, PodInterfaceCache};
use crate::sync::{self, Action, Facts, LauncherState, ShutdownStep};
use crate::takeover::{self, Takeovers};
use crate::vmis::status::{self, StatusInputs};
use crate::vmis::{EventKind, StatusWriteError, StatusWriter, VmiStore};

pub use queue::WorkQueue;

/// `--domain-resync-period-seconds` default.
pub(crate) const DEFAULT_RESYNC_PERIOD: Duration = Duration::from_secs(300);
/// `--watchdog-timeout` default.
pub(crate) const DEFAULT_WATCHDOG_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// This node (`--hostname-override`).
    pub node: String,
    /// GetDomain on every launcher this often.
    pub resync_period: Duration,
    /// A launcher socket that cannot be dialled for this long counts as gone.
    pub watchdog_timeout: Duration,
    /// Concurrent reconciles (different keys only): KubeVirt's handler runs 10
    /// (`vmController.Run(10, stop)` in `cmd/virt-handler/virt-handler.go`).
    pub workers: usize,
    /// `/var/run/kubevirt-private` on the handler's side (pod-interface cache).
    pub private_dir: PathBuf,
    /// Set up the pod network and device ownership before the first sync. Off only for
    /// tests that drive a launcher without a pod.
    pub prepare_pod: bool,
    /// How this node takes part in live migrations; `None`: it does not (a migration
    /// to or from it waits).
    pub migration: Option<crate::migration::MigrationSettings>,
}

impl AgentConfig {
    pub fn new(node: &str, private_dir: PathBuf) -> Self {
        AgentConfig {
            node: node.to_string(),
            resync_period: DEFAULT_RESYNC_PERIOD,
            watchdog_timeout: DEFAULT_WATCHDOG_TIMEOUT,
            workers: 10,
            private_dir,
            prepare_pod: true,
            migration: None,
        }
    }
}

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    #[error(transparent)]
    Cmd(#[from] CmdError),
    #[error(transparent)]
    PodSide(#[from] podside::PodSideError),
    #[error("launcher of {0} is not reachable")]
    NoClient(String),
    #[error("cannot prepare the pod of {key}: {reason}")]
    PodPreparation { key: String, reason: String },
    #[error(transparent)]
    Status(#[from] StatusWriteError),
}

/// What a reconcile asks of the queue afterwards.
enum After {
    Done,
    Requeue(Duration),
}

pub struct Agent {
    config: AgentConfig,
    store: Arc<dyn VmiStore>,
    writer: Arc<dyn StatusWriter>,
    cache: Arc<DomainCache>,
    launchers: Arc<Launchers>,
    queue: Arc<WorkQueue>,
    metrics: Arc<Metrics>,
    pod_ifaces: PodInterfaceCache,
    /// When each launcher socket first failed to answer the watchdog.
    unreachable_since: Mutex<BTreeMap<String, Instant>>,
    /// How often each VMI has looked for its launcher so far.
    launcher_polls: LauncherPolls,
    /// The debug trace's start of each VMI's takeover.
    takeovers: Takeovers,
    /// What was done once per VMI UID.
    done_once: DoneOnce,
    /// VMIs whose launcher accepted SyncVirtualMachine and whose domain is not reported yet.
    domain_awaited: DomainAwaited,
    /// The last failed sync of each VMI, until its status leaves that error behind.
    last_sync_error: LastSyncError,
    /// The migration proxies this node runs.
    proxies: crate::migration::Proxies,
    /// Wakes a VMI when its launcher socket appears; `None` when inotify is unavailable
    /// (then only the looks of `launcher_polls` find it).
    arrivals: Option<Arc<SocketArrivals>>,
}

/// The error of a VMI's last failed sync, by key, with the UID it was for. A launcher that cannot start the VM
/// (a disk with nothing to boot) fails the sync and reports its domain crashed at about
/// the same time: when the write carrying the error loses to another writer (a
/// conflict), the reconcile that follows sees the crash, not the error, and the VMI
/// would end `Failed` without the reason. The write that makes it `Failed` uses this.
/// Keyed by the VMI's key, so a VMI deleted before it ran or failed leaves no entry behind
/// (its key is forgotten when the VMI is gone); the UID keeps a newer VMI of the same name
/// from inheriting the error.
#[derive(Default)]
struct LastSyncError(Mutex<BTreeMap<String, (String, String)>>);

impl LastSyncError {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (String, String)>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set(&self, key: &str, uid: &str, error: String) {
        self.lock()
            .insert(key.to_string(), (uid.to_string(), error));
    }

    fn get(&self, key: &str, uid: &str) -> Option<String> {
        self.lock()
            .get(key)
            .filter(|(for_uid, _)| for_uid == uid)
            .map(|(_, error)| error.clone())
    }

    fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}

/// The growing interval at which a VMI looks for its launcher socket: 10 ms, doubling up
/// to KubeVirt's fixed second. A launcher is usually up within tens of milliseconds of its
/// pod, and a new socket triggers nothing else (no watch on pod directories), so the first
/// looks come fast; a pod that takes long costs at most one look a second.
#[derive(Default)]
struct LauncherPolls(Mutex<BTreeMap<String, u32>>);

impl LauncherPolls {
    const FIRST: Duration = Duration::from_millis(10);
    const MAX: Duration = Duration::from_secs(1);

    /// While the sockets directory is watched, looks are only the fallback: at least this
    /// apart.
    const WATCHED_MIN: Duration = Duration::from_millis(250);

    /// The wait before the next look for `key`'s launcher (and counts this one).
    fn next(&self, key: &str) -> Duration {
        let mut polls = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = polls.entry(key.to_string()).or_insert(0);
        let wait = crate::backoff::doubling(Self::FIRST, *n, Self::MAX);
        *n = n.saturating_add(1);
        wait
    }

    fn forget(&self, key: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(key);
    }
}

/// What is done once per VMI UID, not on every reconcile that decides `Update` or
/// `Shutdown` again before the launcher's answer arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Once {
    /// The pod network and device ownership (KubeVirt keeps its network set-up state
    /// per VMI UID, `pkg/network/setup/netconf.go`, and skips interfaces already set up).
    PodPrepared,
    /// The `Created` event: SyncVirtualMachine is sent again until the domain shows up.
    DefinedEvent,
    /// The `ShuttingDown` event: the shutdown is signalled again at each recheck.
    ShutdownEvent,
}

#[derive(Default)]
struct DoneOnce(Mutex<HashSet<(String, Once)>>);

impl DoneOnce {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<(String, Once)>> {
        // Single inserts and removals: a poisoned set is consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn is_done(&self, uid: &str, what: Once) -> bool {
        self.lock().contains(&(uid.to_string(), what))
    }

    /// Marks `what` done for `uid`; true the first time.
    fn mark(&self, uid: &str, what: Once) -> bool {
        self.lock().insert((uid.to_string(), what))
    }

    fn forget(&self, uid: &str) {
        self.lock().retain(|(u, _)| u != uid);
    }
}

/// When the launcher of each VMI UID accepted a SyncVirtualMachine that defines its
/// domain, until the domain is reported. Reconciles in between (the VMI changed: its pod
/// turned ready, a condition was written) would send the same Sync again to a launcher
/// busy starting the VM, and the domain event arriving meanwhile would wait for that
/// call to end before its reconcile runs (seen: 0.4 s of 1.7 s with 20 VMIs starting).
/// They wait for the event instead, and send again only if none came within
/// [`DomainAwaited::PATIENCE`].
#[derive(Default)]
struct DomainAwaited(Mutex<HashMap<String, Instant>>);

impl DomainAwaited {
    const PATIENCE: Duration = Duration::from_secs(5);

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        // Single inserts and removals: a poisoned map is consistent.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How much longer `uid` waits for its domain before a Sync is sent again; `None`
    /// when no Sync is waiting for an answer.
    fn left(&self, uid: &str) -> Option<Duration> {
        let mut awaited = self.lock();
        let left = Self::PATIENCE.checked_sub(awaited.get(uid)?.elapsed());
        if left.is_none_or(|l| l.is_zero()) {
            awaited.remove(uid);
            return None;
        }
        left
    }

    fn start(&self, uid: &str) {
        self.lock().insert(uid.to_string(), Instant::now());
    }

    fn forget(&self, uid: &str) {
        self.lock().remove(uid);
    }
}

impl Agent {
    pub fn new(
        config: AgentConfig,
        store: Arc<dyn VmiStore>,
        writer: Arc<dyn StatusWriter>,
        cache: Arc<DomainCache>,
        launchers: Arc<Launchers>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let pod_ifaces = PodInterfaceCache::new(&config.private_dir);
        Arc::new(Agent {
            config,
            store,
            writer,
            cache,
            launchers,
            queue: WorkQueue::new(),
            metrics,
            pod_ifaces,
            unreachable_since: Mutex::new(BTreeMap::new()),
            launcher_polls: LauncherPolls::default(),
            takeovers: Takeovers::default(),
            done_once: DoneOnce::default(),
            domain_awaited: DomainAwaited::default(),
            last_sync_error: LastSyncError::default(),
            proxies: Default::default(),
            arrivals: match SocketArrivals::new() {
                Ok(a) => Some(Arc::new(a)),
                Err(e) => {
                    tracing::warn!(error = %e, "no inotify: launcher sockets are only looked for periodically");
                    None
                }
            },
        })
    }

    pub fn queue(&self) -> &Arc<WorkQueue> {
        &self.queue
    }

    pub fn cache(&self) -> &Arc<DomainCache> {
        &self.cache
    }

    pub fn launchers(&self) -> &Arc<Launchers> {
        &self.launchers
    }

    /// Runs until `shutdown` turns true: the initial list, the workers, the event
    /// forwarding, the resync and the watchdog.
    pub async fn run(
        self: Arc<Self>,
        mut cache_changes: CacheChanges,
        mut vmi_changes: mpsc::UnboundedReceiver<String>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        self.list_domains().await;
        for key in self.store.keys() {
            self.queue.add(&key);
        }
        let arrivals = self.arrivals.clone().map(|arrivals| {
            let queue = Arc::clone(&self.queue);
            tokio::spawn(async move {
                if let Err(e) = arrivals.run(move |key| queue.add(key)).await {
                    tracing::warn!(error = %e, "the launcher socket watch failed; looking periodically");
                }
            })
        });
        let mut workers = Vec::new();
        for _ in 0..self.config.workers.max(1) {
            let me = Arc::clone(&self);
            workers.push(tokio::spawn(async move {
                while let Some(key) = me.queue.get().await {
                    me.process(&key).await;
                    me.queue.done(&key);
                }
            }));
        }
        let mut resync = tokio::time::interval(self.config.resync_period);
        resync.tick().await;
        let watchdog_every = self.config.watchdog_timeout / 3 + Duration::from_secs(1);
        let mut watchdog = tokio::time::interval(watchdog_every.min(self.config.watchdog_timeout));
        loop {
            tokio::select! {
                change = cache_changes.recv() => match change {
                    Some(CacheChange::Key(key)) => self.queue.add(&key),
                    Some(CacheChange::Relist) => self.list_domains().await,
                    None => break,
                },
                key = vmi_changes.recv() => match key {
                    Some(key) => self.queue.add(&key),
                    None => break,
                },
                _ = resync.tick() => self.resync_domains().await,
                _ = watchdog.tick() => self.watchdog().await,
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
            }
        }
        self.queue.shut_down();
        for w in workers {
            let _ = w.await;
        }
        if let Some(a) = arrivals {
            a.abort();
        }
    }

    /// The informer's List: ask every known launcher (ghost records) for its domain.
    pub(crate) async fn list_domains(&self) {
        for record in self.launchers.ghosts().list() {
            let key = record.key();
            if !crate::podfs::entry_exists(&record.socket_file)
                && self.launchers.ghosts().is_current(&record)
            {
                self.cache.set(
                    &key,
                    Domain::gone(
                        &record.namespace,
                        &record.name,
                        &record.uid,
                        proto::kubevirt::Time(Timestamp::now()),
                    ),
                );
                continue;
            }
            let reply = match self.launchers.client_for_uid(&record.uid).await {
                Some(client) => client.get_domain().await,
                None => Err(CmdError::Connect {
                    path: record.socket_file.clone(),
                    reason: "cannot connect".into(),
                }),
            };
            match reply {
                Ok(Some(domain)) => self.cache.set(&key, domain),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(%key, error = %e, "GetDomain failed while listing; state Unknown");
                    self.metrics.launcher_error("GetDomain");
                    let mut unknown = Domain::new(&record.namespace, &record.name, &record.uid);
                    unknown.status.status = LifeCycle::Unknown;
                    self.cache.set(&key, unknown);
                }
            }
        }
    }

    /// The periodic resync: GetDomain on every known launcher; `""` is ignored here.
    pub(crate) async fn resync_domains(&self) {
        for record in self.launchers.ghosts().list() {
            if let Some(client) = self.launchers.client_for_uid(&record.uid).await {
                match client.get_domain().await {
                    Ok(Some(domain)) => self.cache.set(&record.key(), domain),
                    Ok(None) => {}
                    Err(e) => {
                        self.metrics.launcher_error("GetDomain");
                        tracing::debug!(key = %record.key(), error = %e, "resync GetDomain failed");
                    }
                }
            }
        }
    }

    /// Dials every known launcher socket; one that stays unreachable past the watchdog
    /// timeout gets the unresponsive marker and a deletion-marked domain.
    pub async fn watchdog(&self) {
        for record in self.launchers.ghosts().list() {
            let socket = record.socket_file.clone();
            let reachable = tokio::time::timeout(
                Duration::from_secs(5),
                self.launchers.socket_reachable(&socket),
            )
            .await
            .unwrap_or(false);
            let mut since = self
                .unreachable_since
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if reachable {
                since.remove(&record.uid);
                continue;
            }
            let first = *since.entry(record.uid.clone()).or_insert_with(Instant::now);
            if first.elapsed() >= self.config.watchdog_timeout {
                since.remove(&record.uid);
                drop(since);
                // The VMI's launcher changed meanwhile (it came back to this node): the
                // dead socket is not its launcher any more, and the new one must not be
                // reported gone.
                if !self.launchers.ghosts().is_current(&record) {
                    continue;
                }
                self.launchers.mark_unresponsive(&socket);
                tracing::warn!(key = %record.key(), uid = %record.uid, "launcher unresponsive (watchdog)");
                // A domain already gone keeps the time it went (a migration target waits a
                // while from that time before it reports the stream broken).
                let already_gone = self
                    .cache
                    .get(&record.key())
                    .is_some_and(|d| d.is_gone() && d.spec.metadata.kubevirt.uid == record.uid);
                if !already_gone {
                    self.cache.set(
                        &record.key(),
                        Domain::gone(
                            &record.namespace,
                            &record.name,
                            &record.uid,
                            proto::kubevirt::Time(Timestamp::now()),
                        ),
                    );
                }
            }
        }
    }

    /// One reconcile of `key`, with metrics and requeueing.
    pub async fn process(&self, key: &str) {
        let started = Instant::now();
        let result = self
            .reconcile(key)
            .instrument(takeover::reconcile_span(key))
            .await;
        self.metrics.observe_sync(started.elapsed());
        match result {
            Ok(After::Done) => self.queue.forget(key),
            Ok(After::Requeue(after)) => {
                self.queue.forget(key);
                self.queue.add_after(key, after);
            }
            Err(ReconcileError::Status(StatusWriteError::Conflict)) => {
                // Another writer changed the VMI: read it again and recompute.
                tracing::debug!(%key, "status write conflict, reconciling again");
                self.queue.add_rate_limited(key);
            }
            Err(e) => {
                tracing::warn!(%key, error = %e, "reconcile failed, retrying with back-off");
                self.queue.add_rate_limited(key);
            }
        }
    }

    async fn reconcile(&self, key: &str) -> Result<After, ReconcileError> {
        let vmi = self.store.get(key);
        let domain = self.cache.get(key);
        if vmi
            .as_ref()
            .is_some_and(|v| matches!(v.phase(), Phase::Scheduled | Phase::Scheduling))
        {
            self.takeovers.begin(key);
        }
        let lookup = match &vmi {
            Some(v) => Some(takeover::step("launcher_lookup", self.launchers.lookup(v)).await),
            None => None,
        };
        let launcher_state = lookup
            .as_ref()
            .map(|l| l.state)
            .unwrap_or(LauncherState::Unresponsive);
        let now = Timestamp::now();
        let facts = Facts {
            vmi: vmi.as_ref(),
            domain: domain.as_ref(),
            launcher: launcher_state,
            node: &self.config.node,
            now,
        };
        let action = sync::decide(&facts);
        let phase = sync::calculate_phase(&facts);
        tracing::info!(
            %key,
            uid = vmi.as_ref().and_then(|v| v.metadata.uid.as_deref()).unwrap_or(""),
            vmi_phase = %vmi.as_ref().map(|v| v.phase()).unwrap_or_default(),
            domain = ?domain.as_ref().map(|d| (d.status.status, d.status.reason, d.is_gone())),
            launcher = ?launcher_state,
            ?action,
            "decision"
        );

        let client = lookup.as_ref().and_then(|l| l.client.clone());
        let process = lookup.as_ref().and_then(|l| l.process.clone());
        if let Some(v) = &vmi
            && let Some(after) = self
                .migration_step(key, v, domain.as_ref(), client.as_ref(), process.as_ref())
                .await?
        {
            return Ok(after);
        }
        let outcome = self
            .act(key, &action, vmi.as_ref(), domain.as_ref(), client, process)
            .await;
        let (after, sync_error) = match outcome {
            Ok(after) => (after, None),
            Err(e) => {
                if let ReconcileError::Cmd(cmd) = &e {
                    self.metrics.launcher_error(cmd_name(&action));
                    tracing::debug!(%key, error = %cmd, "launcher call failed");
                }
                (After::Done, Some(e))
            }
        };

        let Some(vmi) = vmi else {
            self.metrics.set_phase(key, None);
            self.last_sync_error.forget(key);
            return sync_error.map_or(Ok(after), Err);
        };
        // A domain that migrated away says nothing about the VMI any more: the target
        // node reports it.
        let migrated_away = domain.as_ref().is_some_and(|d| {
            d.status.status == LifeCycle::Shutoff
                && d.status.reason == proto::domain::StateChangeReason::Migrated
        });
        if !action.updates_status() || migrated_away {
            return sync_error.map_or(Ok(after), Err);
        }
        if let Some(err) = &sync_error {
            self.writer
                .record_event(&vmi, EventKind::Warning, "SyncFailed", &err.to_string());
        }
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let error_text = match &sync_error {
            Some(e) => {
                let text = e.to_string();
                self.last_sync_error.set(key, &uid, text.clone());
                Some(text)
            }
            None if phase == Phase::Failed => self.last_sync_error.get(key, &uid),
            None => None,
        };
        let inputs = StatusInputs {
            phase,
            sync_error: error_text,
            pod_interfaces: self.pod_ifaces.load(&uid),
        };
        let current = vmi.status.clone().unwrap_or_default();
        if let Some(new_status) = status::compute_status(&vmi, domain.as_ref(), &inputs, now)
            && status::owned_fields_differ(&current, &new_status)
        {
            takeover::step("status_write", self.writer.write_status(&vmi, &new_status)).await?;
            let old_phase = vmi.phase();
            let new_phase = new_status.phase.unwrap_or_default();
            if new_phase == Phase::Running || new_phase.is_final() {
                // Written (final) or outlived (the VM runs): no later write needs it.
                self.last_sync_error.forget(key);
            }
            if old_phase != new_phase {
                tracing::info!(%key, from = %old_phase, to = %new_phase, "phase changed");
                if new_phase == Phase::Running {
                    self.takeovers.running(key);
                }
                match new_phase {
                    Phase::Running => self.writer.record_event(
                        &vmi,
                        EventKind::Normal,
                        "Started",
                        "VirtualMachineInstance started.",
                    ),
                    Phase::Succeeded => self.writer.record_event(
                        &vmi,
                        EventKind::Normal,
                        "Stopped",
                        "The VirtualMachineInstance was shut down.",
                    ),
                    Phase::Failed => self.writer.record_event(
                        &vmi,
                        EventKind::Warning,
                        "Stopped",
                        "The VirtualMachineInstance crashed.",
                    ),
                    _ => {}
                }
            }
            self.metrics.set_phase(key, Some(new_phase));
        } else {
            self.metrics.set_phase(key, Some(vmi.phase()));
        }
        sync_error.map_or(Ok(after), Err)
    }

    async fn act(
        &self,
        key: &str,
        action: &Action,
        vmi: Option<&VirtualMachineInstance>,
        domain: Option<&Domain>,
        client: Option<LauncherClient>,
        process: Option<std::sync::Arc<crate::launchers::LauncherProcess>>,
    ) -> Result<After, ReconcileError> {
        let uid = vmi
            .and_then(|v| v.metadata.uid.clone())
            .or_else(|| domain.map(|d| d.spec.metadata.kubevirt.uid.clone()))
            .unwrap_or_default();
        if *action != Action::WaitForLauncher {
            self.launcher_polls.forget(key);
            if let Some(a) = &self.arrivals {
                a.forget(key);
            }
        }
        match action {
            Action::Nothing(_) | Action::Ignore(_) => Ok(After::Done),
            Action::WaitForLauncher => {
                let mut wait = self.launcher_polls.next(key);
                if let Some(vmi) = vmi
                    && self.watch_for_launcher(key, vmi)
                {
                    wait = wait.max(LauncherPolls::WATCHED_MIN);
                }
                tracing::debug!(target: takeover::TARGET, wait_ms = wait.as_millis(), "launcher not up yet: looking again");
                Ok(After::Requeue(wait))
            }
            Action::CleanupStale { old_uid } => {
                if self.launchers.is_unresponsive(old_uid) {
                    self.cleanup(key, old_uid);
                    Ok(After::Requeue(Duration::ZERO))
                } else {
                    Ok(After::Requeue(Duration::from_secs(1)))
                }
            }
            Action::Update => {
                let vmi = vmi.expect("Update is only decided for an existing VMI");
                let client = client.ok_or_else(|| ReconcileError::NoClient(key.to_string()))?;
                let starting = vmi.phase() != Phase::Running;
                let defining = domain.is_none_or(|d| d.is_gone());
                if !defining {
                    self.domain_awaited.forget(&uid);
                } else if let Some(left) = self.domain_awaited.left(&uid) {
                    tracing::debug!(target: takeover::TARGET, left_ms = left.as_millis(), "SyncVirtualMachine accepted: waiting for the domain event");
                    return Ok(After::Requeue(left));
                }
                if starting
                    && self.config.prepare_pod
                    && !self.done_once.is_done(&uid, Once::PodPrepared)
                {
                    let process = process.ok_or_else(|| ReconcileError::PodPreparation {
                        key: key.to_string(),
                        reason: "the launcher's process is not known".into(),
                    })?;
                    let owner = runtime_user(vmi);
                    let vmi = vmi.clone();
                    let cache = self.pod_ifaces.clone();
                    takeover::step(
                        "pod_preparation",
                        prepare_pod(key, move || podside::prepare(&vmi, &process, owner, &cache)),
                    )
                    .await?;
                    self.done_once.mark(&uid, Once::PodPrepared);
                }
                takeover::step("sync_virtual_machine", client.sync_virtual_machine(vmi)).await?;
                if defining {
                    self.domain_awaited.start(&uid);
                }
                if defining && self.done_once.mark(&uid, Once::DefinedEvent) {
                    self.writer.record_event(
                        vmi,
                        EventKind::Normal,
                        "Created",
                        "VirtualMachineInstance defined.",
                    );
                }
                Ok(After::Done)
            }
            Action::Shutdown(step) => {
                let client = self.client_or_uid(client, &uid).await?;
                let target = self.vmi_for_command(vmi, key, &uid);
                ignore_disconnect(client.ping().await)?;
                match step {
                    ShutdownStep::Shutdown { recheck } => {
                        ignore_disconnect(client.send(VmiCommand::Shutdown, &target).await)?;
                        if let Some(v) = vmi
                            && self.done_once.mark(&uid, Once::ShutdownEvent)
                        {
                            self.writer.record_event(
                                v,
                                EventKind::Normal,
                                "ShuttingDown",
                                "Signaled Graceful Shutdown",
                            );
                        }
                        Ok(After::Requeue(*recheck))
                    }
                    ShutdownStep::Wait { recheck } => Ok(After::Requeue(*recheck)),
                    ShutdownStep::Kill => {
                        ignore_disconnect(client.send(VmiCommand::Kill, &target).await)?;
                        if let Some(v) = vmi {
                            self.writer.record_event(
                                v,
                                EventKind::Normal,
                                "Deleted",
                                "VirtualMachineInstance stopping",
                            );
                        }
                        Ok(After::Requeue(Duration::from_secs(5)))
                    }
                }
            }
            Action::ForceDestroy => {
                let client = self.client_or_uid(client, &uid).await?;
                let target = self.vmi_for_command(vmi, key, &uid);
                ignore_disconnect(client.send(VmiCommand::Kill, &target).await)?;
                Ok(After::Requeue(Duration::from_secs(1)))
            }
            Action::Delete => {
                // A launcher that is already gone has nothing left to delete.
                if let Ok(client) = self.client_or_uid(client, &uid).await {
                    let target = self.vmi_for_command(vmi, key, &uid);
                    ignore_disconnect(client.ping().await)?;
                    ignore_disconnect(client.send(VmiCommand::Delete, &target).await)?;
                    if let Some(v) = vmi {
                        self.writer.record_event(
                            v,
                            EventKind::Normal,
                            "Deleted",
                            "Signaled Deletion",
                        );
                    }
                }
                self.cleanup(key, &uid);
                Ok(After::Done)
            }
            Action::Cleanup | Action::CleanupMigratedAway => {
                self.cleanup(key, &uid);
                Ok(After::Done)
            }
        }
    }

    /// Watches the sockets directories of `vmi`'s pods for its launcher socket. True when
    /// the watch will tell: every directory is watched and no socket is there yet (a
    /// socket that exists but did not answer is looked at again by the polls).
    fn watch_for_launcher(&self, key: &str, vmi: &VirtualMachineInstance) -> bool {
        let Some(arrivals) = &self.arrivals else {
            return false;
        };
        let pods_dir = &self.launchers.paths().pods_dir;
        let pods = crate::launchers::socket::active_pods_on_node(vmi, &self.config.node);
        if pods.len() != 1 {
            return false;
        }
        let pod = PodPaths::new(pods_dir, pods[0]);
        match arrivals.watch(key, pods_dir, &pod.sockets_dir()) {
            Ok(true) => !crate::podfs::entry_exists(&pod.launcher_socket()),
            Ok(false) => false,
            Err(e) => {
                tracing::debug!(%key, error = %e, "cannot watch the launcher's sockets directory");
                false
            }
        }
    }

    /// Local clean-up after a domain is gone: client, pipe, ghost record, caches.
    fn cleanup(&self, key: &str, uid: &str) {
        if let Some(a) = &self.arrivals {
            a.forget(key);
        }
        self.proxies.forget(key, uid);
        self.takeovers.forget(key);
        self.done_once.forget(uid);
        self.domain_awaited.forget(uid);
        if uid.is_empty() {
            self.cache.forget(key);
            return;
        }
        self.launchers.cleanup(uid);
        self.pod_ifaces.remove(uid);
        self.cache.forget_uid(key, uid);
    }

    async fn client_or_uid(
        &self,
        client: Option<LauncherClient>,
        uid: &str,
    ) -> Result<LauncherClient, ReconcileError> {
        match client {
            Some(c) => Ok(c),
            None => self
                .launchers
                .client_for_uid(uid)
                .await
                .ok_or_else(|| ReconcileError::NoClient(uid.to_string())),
        }
    }

    /// The VMI to send with a command; for a VMI already gone, a minimal one with the
    /// domain's name and UID (what the launcher needs to find its domain).
    fn vmi_for_command(
        &self,
        vmi: Option<&VirtualMachineInstance>,
        key: &str,
        uid: &str,
    ) -> VirtualMachineInstance {
        if let Some(v) = vmi {
            return v.clone();
        }
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        let mut v = VirtualMachineInstance::new(name, Default::default());
        v.metadata.namespace = Some(namespace.to_string());
        v.metadata.uid = Some(uid.to_string());
        v
    }
}

/// Runs the pod's preparation (netsetup enters the pod's namespace on its own thread and
/// blocks); its error, or its panic, is reported as a failed preparation of `key`'s pod.
async fn prepare_pod<T: Send + 'static>(
    key: &str,
    prepare: impl FnOnce() -> Result<T, podside::PodSideError> + Send + 'static,
) -> Result<T, ReconcileError> {
    let done =
        tokio::task::spawn_blocking(prepare)
            .await
            .map_err(|e| ReconcileError::PodPreparation {
                key: key.to_string(),
                reason: format!("the preparation task failed: {e}"),
            })?;
    Ok(done?)
}

fn cmd_name(action: &Action) -> &'static str {
    match action {
        Action::Update => "SyncVirtualMachine",
        Action::Shutdown(ShutdownStep::Kill) | Action::ForceDestroy => "KillVirtualMachine",
        Action::Shutdown(_) => "ShutdownVirtualMachine",
        Action::Delete => "DeleteVirtualMachine",
        _ => "none",
    }
}

/// Shutdown, kill and delete ignore a launcher that went away mid-call.
fn ignore_disconnect(result: Result<(), CmdError>) -> Result<(), CmdError> {
    match result {
        Err(e) if e.is_disconnected() => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_sync_error_is_its_vmis_only_and_goes_with_it() {
        let kept = LastSyncError::default();
        kept.set("ns/a", "uid-1", "cannot boot disk".into());
        assert_eq!(
            kept.get("ns/a", "uid-1").as_deref(),
            Some("cannot boot disk")
        );
        // A newer VMI of the same name does not inherit it.
        assert_eq!(kept.get("ns/a", "uid-2"), None);
        kept.forget("ns/a");
        assert_eq!(kept.get("ns/a", "uid-1"), None);
        assert!(kept.lock().is_empty());
    }

    #[tokio::test]
    async fn a_failed_pod_preparation_says_so() {
        let panicked = prepare_pod::<()>("ns/v", || panic!("netlink went away"))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            panicked.starts_with("cannot prepare the pod of ns/v: the preparation task failed"),
            "{panicked}"
        );
        let failed = prepare_pod::<()>("ns/v", || Err(podside::PodSideError::InvalidPort(0)))
            .await
            .unwrap_err()
            .to_string();
        assert_eq!(failed, "invalid port 0 in interface ports");
        assert_eq!(prepare_pod("ns/v", || Ok(7)).await.unwrap(), 7);
    }

    #[test]
    fn launcher_polls_start_fast_grow_to_a_second_and_restart_when_forgotten() {
        let polls = LauncherPolls::default();
        let waits: Vec<u128> = (0..9).map(|_| polls.next("ns/a").as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 80, 160, 320, 640, 1000, 1000]);
        assert_eq!(polls.next("ns/b"), Duration::from_millis(10), "per key");
        for _ in 0..100 {
            polls.next("ns/a");
        }
        assert_eq!(polls.next("ns/a"), Duration::from_secs(1), "no overflow");
        polls.forget("ns/a");
        assert_eq!(polls.next("ns/a"), Duration::from_millis(10));
    }
}
