//! The agent's whole loop (work queue, launcher lookup, cmd client, notify server, domain
//! cache, status writes) against an in-test launcher that keeps a domain and reports it
//! over the real notify socket. Covers what the test guest cannot show: a guest that
//! ignores the shutdown request is killed once the grace period expires (VMI Failed), and
//! a restarted agent rebuilds its state from the launcher without acting on the VM.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use handler::agent::{Agent, AgentConfig};
use handler::domains::{DomainCache, notify};
use handler::launchers::client::unix_channel;
use handler::launchers::{LauncherPaths, Launchers, PodPaths};
use handler::metrics::Metrics;
use handler::vmis::VmiStore;
use handler_standalone::admit_vmi;
use handler_standalone::store::{StandaloneStore, StatusOutput};
use k8s_openapi::jiff::Timestamp;
use proto::domain::{Domain, Empty, Features, GracePeriodMetadata, LifeCycle, StateChangeReason};
use proto::grpc::cmd::info::cmd_info_server::{CmdInfo, CmdInfoServer};
use proto::grpc::cmd::info::{CmdInfoRequest, CmdInfoResponse};
use proto::grpc::cmd::v1::cmd_server::CmdServer;
use proto::grpc::cmd::v1::{self as cmdv1};
use proto::grpc::notify::v1::DomainEventRequest;
use proto::grpc::notify::v1::notify_client::NotifyClient;
use proto::kubevirt::ready::LauncherPod;
use proto::kubevirt::{Phase, Time, VirtualMachineInstance};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

const NODE: &str = "node-a";

/// A launcher with one domain, reporting changes to the handler's notify socket.
#[derive(Clone)]
struct FakeVm {
    state: Arc<Mutex<FakeState>>,
    notify_socket: PathBuf,
}

struct FakeState {
    domain: Option<Domain>,
    ignore_shutdown: bool,
    /// How long after a Sync that defines the domain it is reported (a VM starting).
    added_after: Duration,
    /// A Sync that fails with this message, reporting the domain crashed first (as the
    /// launcher does for a disk with nothing to boot).
    fail_sync: Option<String>,
    /// Run inside Sync, before it answers: another writer changing the VMI meanwhile.
    during_sync: Option<Arc<dyn Fn() + Send + Sync>>,
    calls: Vec<(String, Instant)>,
}

impl FakeVm {
    fn calls(&self) -> Vec<String> {
        self.state
            .lock()
            .expect("lock")
            .calls
            .iter()
            .map(|(c, _)| c.clone())
            .collect()
    }

    fn call_time(&self, name: &str) -> Option<Instant> {
        self.state
            .lock()
            .expect("lock")
            .calls
            .iter()
            .find(|(c, _)| c == name)
            .map(|(_, t)| *t)
    }

    fn record(&self, name: &str) {
        self.state
            .lock()
            .expect("lock")
            .calls
            .push((name.to_string(), Instant::now()));
    }

    /// Sends one event as the Go launcher does (retrying until the server answers).
    async fn emit(&self, kind: &str, domain: &Domain) {
        let request = DomainEventRequest {
            domain_json: domain.to_json().into_bytes(),
            status_json: Vec::new(),
            event_type: kind.into(),
        };
        for _ in 0..50 {
            if let Ok(channel) = unix_channel(&self.notify_socket, Duration::from_secs(1)).await
                && let Ok(reply) = NotifyClient::new(channel)
                    .handle_domain_event(request.clone())
                    .await
                && reply.get_ref().success
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("the handler's notify server never took the event");
    }

    fn vmi_of(request: &cmdv1::VmiRequest) -> VirtualMachineInstance {
        let json = &request.vmi.as_ref().expect("vmi").vmi_json;
        serde_json::from_slice(json).expect("VMI JSON from the handler")
    }

    /// Changes the domain and, like the Go launcher, reports it only if it changed.
    async fn change(&self, f: impl FnOnce(&mut Domain)) {
        let domain = {
            let mut s = self.state.lock().expect("lock");
            let Some(d) = s.domain.as_mut() else {
                return;
            };
            let before = d.clone();
            f(d);
            if *d == before {
                return;
            }
            d.clone()
        };
        self.emit("MODIFIED", &domain).await;
    }
}

fn ok() -> Response<cmdv1::Response> {
    Response::new(cmdv1::Response {
        success: true,
        message: String::new(),
    })
}

impl_fake_cmd!(FakeVm {
            async fn sync_virtual_machine(
                &self,
                r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("Sync");
                let vmi = Self::vmi_of(r.get_ref());
                let (fail, during) = {
                    let s = self.state.lock().expect("lock");
                    (s.fail_sync.clone(), s.during_sync.clone())
                };
                if let Some(message) = fail {
                    let mut d = Domain::new(
                        vmi.metadata.namespace.as_deref().unwrap_or_default(),
                        vmi.metadata.name.as_deref().unwrap_or_default(),
                        vmi.metadata.uid.as_deref().unwrap_or_default(),
                    );
                    d.status.status = LifeCycle::Shutoff;
                    d.status.reason = StateChangeReason::Crashed;
                    self.state.lock().expect("lock").domain = Some(d.clone());
                    self.emit("ADDED", &d).await;
                    if let Some(during) = during {
                        during();
                    }
                    return Ok(Response::new(cmdv1::Response { success: false, message }));
                }
                let created = {
                    let mut s = self.state.lock().expect("lock");
                    if s.domain.is_none() {
                        let mut d = Domain::new(
                            vmi.metadata.namespace.as_deref().unwrap_or_default(),
                            vmi.metadata.name.as_deref().unwrap_or_default(),
                            vmi.metadata.uid.as_deref().unwrap_or_default(),
                        );
                        d.status.status = LifeCycle::Running;
                        d.status.reason = StateChangeReason::Unknown;
                        d.spec.features = Some(Features { acpi: Some(Empty {}), ..Default::default() });
                        d.spec.metadata.kubevirt.grace_period = Some(GracePeriodMetadata {
                            deletion_grace_period_seconds: vmi.grace_period_seconds(),
                            ..Default::default()
                        });
                        s.domain = Some(d.clone());
                        Some(d)
                    } else {
                        None
                    }
                };
                if let Some(d) = created {
                    let delay = self.state.lock().expect("lock").added_after;
                    if delay.is_zero() {
                        self.emit("ADDED", &d).await;
                    } else {
                        let me = self.clone();
                        tokio::spawn(async move {
                            tokio::time::sleep(delay).await;
                            me.record("Added");
                            me.emit("ADDED", &d).await;
                        });
                    }
                }
                Ok(ok())
            }
            async fn shutdown_virtual_machine(
                &self,
                _r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("Shutdown");
                let ignore = self.state.lock().expect("lock").ignore_shutdown;
                self.change(|d| {
                    if let Some(g) = d.spec.metadata.kubevirt.grace_period.as_mut()
                        && g.deletion_timestamp.is_none()
                    {
                        g.deletion_timestamp = Some(Time(Timestamp::now()));
                    }
                    if !ignore {
                        d.status.status = LifeCycle::Shutoff;
                        d.status.reason = StateChangeReason::Shutdown;
                    }
                })
                .await;
                Ok(ok())
            }
            async fn kill_virtual_machine(
                &self,
                _r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("Kill");
                self.change(|d| {
                    d.status.status = LifeCycle::Shutoff;
                    d.status.reason = StateChangeReason::Destroyed;
                })
                .await;
                Ok(ok())
            }
            async fn delete_virtual_machine(
                &self,
                r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("Delete");
                let vmi = Self::vmi_of(r.get_ref());
                self.state.lock().expect("lock").domain = None;
                let gone = Domain::gone(
                    vmi.metadata.namespace.as_deref().unwrap_or_default(),
                    vmi.metadata.name.as_deref().unwrap_or_default(),
                    vmi.metadata.uid.as_deref().unwrap_or_default(),
                    Time(Timestamp::now()),
                );
                self.emit("MODIFIED", &gone).await;
                Ok(ok())
            }
            async fn ping(
                &self,
                _r: Request<cmdv1::EmptyRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                Ok(ok())
            }
            async fn get_domain(
                &self,
                _r: Request<cmdv1::EmptyRequest>,
            ) -> Result<Response<cmdv1::DomainResponse>, Status> {
                self.record("GetDomain");
                let domain = self.state.lock().expect("lock").domain.as_ref().map(Domain::to_json);
                Ok(Response::new(cmdv1::DomainResponse {
                    response: Some(cmdv1::Response { success: true, message: String::new() }),
                    domain: domain.unwrap_or_default(),
                }))
            }
});

#[tonic::async_trait]
impl CmdInfo for FakeVm {
    async fn info(&self, _r: Request<CmdInfoRequest>) -> Result<Response<CmdInfoResponse>, Status> {
        Ok(Response::new(CmdInfoResponse {
            supported_cmd_versions: vec![1],
        }))
    }
}

/// The node: state dirs, the fake launcher's socket in a kubelet-style pod dir.
struct Node {
    dir: tempfile::TempDir,
    pod_uid: String,
    fake: FakeVm,
}

impl Node {
    fn paths(&self) -> LauncherPaths {
        LauncherPaths {
            pods_dir: self.dir.path().join("pods"),
            share_dir: self.dir.path().join("share"),
            ghost_dir: self.dir.path().join("private/ghost-records"),
        }
    }

    fn start(ignore_shutdown: bool) -> Node {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod_uid = uuid::Uuid::new_v4().to_string();
        let fake = FakeVm {
            state: Arc::new(Mutex::new(FakeState {
                domain: None,
                ignore_shutdown,
                added_after: Duration::ZERO,
                fail_sync: None,
                during_sync: None,
                calls: Vec::new(),
            })),
            notify_socket: dir.path().join("share/domain-notify.sock"),
        };
        let socket = PodPaths::new(&dir.path().join("pods"), &pod_uid).launcher_socket();
        std::fs::create_dir_all(socket.parent().expect("dir")).expect("mkdir");
        let short = handler::launchers::socket::SocketPath::new(&socket).expect("path");
        let listener = tokio::net::UnixListener::bind(short.path()).expect("bind");
        let (cmd, info) = (fake.clone(), fake.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(CmdServer::new(cmd))
                .add_service(CmdInfoServer::new(info))
                .serve_with_incoming(UnixListenerStream::new(listener))
                .await
                .expect("serve");
        });
        Node { dir, pod_uid, fake }
    }

    /// Starts an agent (with its own cache, launchers and notify server) on this node.
    fn agent(&self) -> (Arc<StandaloneStore>, RunningAgent) {
        self.agent_with(|_| {}, None)
    }

    /// `existing`: a VMI the API server already has when the agent starts (as after a
    /// handler restart, where the agent runs once its VMI store is synced).
    fn agent_with(
        &self,
        configure: impl FnOnce(&mut AgentConfig),
        existing: Option<VirtualMachineInstance>,
    ) -> (Arc<StandaloneStore>, RunningAgent) {
        let (store, vmi_changes) = StandaloneStore::new(
            &self.dir.path().join("vmis"),
            self.dir.path(),
            StatusOutput::Stdout,
        );
        let store = Arc::new(store);
        if let Some(vmi) = existing {
            store.admit(vmi);
        }
        let (cache, cache_changes) = DomainCache::new();
        let cache = Arc::new(cache);
        // The fake launcher lives in this process, whose root is the host's.
        let metrics = Arc::new(Metrics::new());
        let hub = notify::NotifyHub::new(Arc::clone(&cache), store.clone(), Arc::clone(&metrics));
        let launchers =
            Arc::new(Launchers::new(self.paths(), NODE, hub.clone()).without_notify_pipes());
        let server = notify::start(&self.paths().share_dir, hub).expect("notify server");
        let mut config = AgentConfig::new(NODE, self.dir.path().join("private"));
        config.prepare_pod = false;
        configure(&mut config);
        let agent = Agent::new(
            config,
            store.clone(),
            store.clone(),
            cache,
            launchers,
            metrics,
        );
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(agent.run(cache_changes, vmi_changes, stopped));
        (
            store,
            RunningAgent {
                stop,
                task,
                server: Some(server),
            },
        )
    }

    fn vmi(&self, grace: i64) -> VirtualMachineInstance {
        let vmi = proto::kubevirt::parse_vmi(&format!(
            r#"{{"metadata":{{"name":"vmi","namespace":"ns"}},
                "spec":{{"terminationGracePeriodSeconds":{grace},"domain":{{"devices":{{}}}}}}}}"#
        ))
        .expect("vmi");
        admit_vmi(vmi, NODE, &self.pod_uid)
    }
}

struct RunningAgent {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    server: Option<notify::NotifyServerHandle>,
}

impl RunningAgent {
    async fn stop(mut self) {
        let _ = self.stop.send(true);
        let _ = (&mut self.task).await;
        if let Some(s) = self.server.take() {
            s.stop().await.expect("notify server stops");
        }
    }
}

async fn wait_phase(store: &StandaloneStore, key: &str, phase: Phase) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.get(key).map(|v| v.phase()) != Some(phase) {
        assert!(
            Instant::now() < deadline,
            "{key} not {phase}: {:?}",
            store.get(key).and_then(|v| v.status)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ghosts(dir: &Path) -> usize {
    std::fs::read_dir(dir.join("private/ghost-records"))
        .map(|d| d.count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_ignoring_shutdown_is_killed_after_the_grace_period() {
    let node = Node::start(true);
    let (store, agent) = node.agent();
    let key = store.admit(node.vmi(2));
    wait_phase(&store, &key, Phase::Running).await;
    assert_eq!(ghosts(node.dir.path()), 1, "ghost record written");

    store.mark_deleted(&key);
    // ACPI present and a grace period: a kill means the VMI failed.
    wait_phase(&store, &key, Phase::Failed).await;
    let calls = node.fake.calls();
    let first_shutdown = node.fake.call_time("Shutdown").expect("Shutdown sent");
    let kill = node
        .fake
        .call_time("Kill")
        .expect("Kill sent after the grace period");
    // The shutdown's start is kept in domain metadata as a Kubernetes time (whole
    // seconds), so the kill comes between grace - 1 s and grace after the first request.
    let waited = kill - first_shutdown;
    assert!(
        waited >= Duration::from_millis(950) && waited < Duration::from_secs(8),
        "killed {waited:?} after the first shutdown, grace is 2 s; calls {calls:?}"
    );
    // Shutdown is repeated at most every few seconds while waiting, not in a loop.
    let shutdowns = calls.iter().filter(|c| c.as_str() == "Shutdown").count();
    assert!(shutdowns <= 3, "{shutdowns} Shutdown calls: {calls:?}");
    wait_for("Delete and clean-up", || {
        node.fake.calls().contains(&"Delete".to_string()) && ghosts(node.dir.path()) == 0
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_honouring_shutdown_succeeds_without_a_kill() {
    let node = Node::start(false);
    let (store, agent) = node.agent();
    let key = store.admit(node.vmi(30));
    wait_phase(&store, &key, Phase::Running).await;
    store.mark_deleted(&key);
    wait_phase(&store, &key, Phase::Succeeded).await;
    wait_for("Delete", || {
        node.fake.calls().contains(&"Delete".to_string())
    })
    .await;
    assert!(!node.fake.calls().contains(&"Kill".to_string()));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_agent_rebuilds_from_the_launcher_and_leaves_the_vm_alone() {
    let node = Node::start(false);
    let (store, agent) = node.agent();
    let key = store.admit(node.vmi(30));
    wait_phase(&store, &key, Phase::Running).await;
    let running = store.get(&key).expect("vmi");
    agent.stop().await;

    // A new agent with empty caches; the VMI as the API server still has it.
    let before = node.fake.calls().len();
    let (store2, agent2) = node.agent_with(|_| {}, Some(running));
    wait_for("GetDomain from the ghost record", || {
        node.fake.calls()[before..].contains(&"GetDomain".to_string())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<String> = node.fake.calls()[before..].to_vec();
    assert!(
        after.iter().all(|c| c == "GetDomain" || c == "Sync"),
        "the restarted agent acted on the VM: {after:?}"
    );
    assert_eq!(store2.get(&key).map(|v| v.phase()), Some(Phase::Running));
    assert_eq!(
        store2.status_writes(&key),
        0,
        "nothing to write: the status is true"
    );
    agent2.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_periodic_resync_asks_every_launcher_for_its_domain() {
    let node = Node::start(false);
    let (store, agent) = node.agent_with(|c| c.resync_period = Duration::from_millis(200), None);
    let key = store.admit(node.vmi(30));
    wait_phase(&store, &key, Phase::Running).await;
    // The start's one write carries the VMI-wide migration facts (no interface, no disk:
    // migratable without copying anything).
    let status = store.get(&key).and_then(|v| v.status).expect("status");
    let condition = |kind: &str| {
        status
            .conditions
            .iter()
            .find(|c| c.condition_type == kind)
            .map(|c| c.status.clone())
    };
    assert_eq!(condition("LiveMigratable").as_deref(), Some("True"));
    assert_eq!(condition("StorageLiveMigratable").as_deref(), Some("True"));
    assert_eq!(status.migration_method.as_deref(), Some("LiveMigration"));
    assert_eq!(status.selinux_context.as_deref(), Some("none"));
    let count = || {
        node.fake
            .calls()
            .iter()
            .filter(|c| c.as_str() == "GetDomain")
            .count()
    };
    // Every 200 ms tick asks the launcher once: at least five asks come (however slow the
    // machine), and never more than the ticks that fit in the time they took (one more for
    // a tick just before the count began whose ask arrived after it).
    let period = Duration::from_millis(200);
    let start = std::time::Instant::now();
    let before = count();
    let deadline = start + Duration::from_secs(20);
    while count() - before < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "{} GetDomain calls in 20 s with a resync every 200 ms",
            count() - before
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let resyncs = count() - before;
    let elapsed = start.elapsed();
    let ticks = elapsed.as_millis() / period.as_millis() + 2;
    assert!(
        u128::try_from(resyncs).expect("count") <= ticks,
        "{resyncs} GetDomain calls in {elapsed:?}: more than the {ticks} resyncs due"
    );
    // An unchanged domain makes no status write.
    assert_eq!(store.status_writes(&key), 1);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_domain_of_an_older_vmi_is_cleaned_up_only_once_its_launcher_is_gone() {
    let node = Node::start(false);
    let (store, agent) = node.agent();
    let old = node.vmi(30);
    let old_uid = old.metadata.uid.clone().expect("uid");
    let key = store.admit(old);
    wait_phase(&store, &key, Phase::Running).await;
    assert_eq!(ghosts(node.dir.path()), 1);

    // The VMI is recreated with the same name (new UID, new pod not started yet) while
    // the old launcher still reports its domain.
    let new_pod = uuid::Uuid::new_v4().to_string();
    // Its pod exists (the kubelet made it); its launcher is still starting.
    let new_sockets = PodPaths::new(&node.dir.path().join("pods"), &new_pod).sockets_dir();
    std::fs::create_dir_all(&new_sockets).expect("new pod dir");
    let fresh = proto::kubevirt::parse_vmi(
        r#"{"metadata":{"name":"vmi","namespace":"ns"},"spec":{"domain":{"devices":{}}}}"#,
    )
    .expect("vmi");
    let fresh = admit_vmi(fresh, NODE, &new_pod);
    assert_ne!(fresh.metadata.uid.as_deref(), Some(old_uid.as_str()));
    let syncs = || {
        node.fake
            .calls()
            .iter()
            .filter(|c| c.as_str() == "Sync")
            .count()
    };
    // The old VMI's own reconciles (a Sync after each status write) settle first: only
    // what the new VMI's arrival triggers counts below.
    let mut syncs_before = syncs();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = syncs();
        if now == syncs_before {
            break;
        }
        syncs_before = now;
    }
    store.admit(fresh);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // The old launcher answers: its domain is left alone and the new VMI waits.
    assert_eq!(ghosts(node.dir.path()), 1, "old launcher still known");
    assert_eq!(syncs(), syncs_before, "nothing sent to the old launcher");
    assert_eq!(store.get(&key).map(|v| v.phase()), Some(Phase::Scheduled));

    // The old launcher goes away (its socket with it): now it is cleaned up.
    let old_socket = PodPaths::new(&node.dir.path().join("pods"), &node.pod_uid).launcher_socket();
    std::fs::remove_file(&old_socket).expect("remove old socket");
    wait_for("the stale launcher's clean-up", || {
        ghosts(node.dir.path()) == 0
    })
    .await;
    assert_eq!(store.get(&key).map(|v| v.phase()), Some(Phase::Scheduled));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_changed_while_its_domain_starts_is_not_synced_again() {
    let node = Node::start(false);
    node.fake.state.lock().expect("lock").added_after = Duration::from_millis(1500);
    let (store, agent) = node.agent();
    let key = store.admit(node.vmi(30));
    wait_for("Sync", || node.fake.calls().contains(&"Sync".to_string())).await;
    // The controller changes the VMI while the VM starts (its pod's readiness).
    for pod in [
        LauncherPod::Missing,
        LauncherPod::GoingDown,
        LauncherPod::Missing,
    ] {
        store.sync_ready(&key, pod);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_phase(&store, &key, Phase::Running).await;
    // Once the domain is reported, each reconcile syncs again (as KubeVirt's).
    let calls = node.fake.calls();
    let before_added = calls.iter().take_while(|c| *c != "Added");
    let syncs = before_added.filter(|c| *c == "Sync").count();
    assert_eq!(
        syncs, 1,
        "Sync sent again before the domain was reported: {calls:?}"
    );
    agent.stop().await;
}

/// A launcher that cannot start the VM reports the domain crashed and fails the sync; the
/// write carrying the error loses to another writer (the controller's `Ready` condition).
/// The VMI still ends `Failed` with the error in its `Synchronized` condition (before, the
/// reconcile after the conflict saw only the crash and the reason was lost).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_sync_that_loses_its_write_still_explains_the_failed_vmi() {
    let node = Node::start(false);
    let (store, agent) = node.agent();
    let vmi = node.vmi(30);
    let key = format!("ns/{}", vmi.metadata.name.as_deref().expect("name"));
    {
        let mut s = node.fake.state.lock().expect("lock");
        s.fail_sync = Some("cannot boot disk \"rootdisk\": nothing to boot".into());
        let (store, key) = (Arc::clone(&store), key.clone());
        s.during_sync = Some(Arc::new(move || {
            store.sync_ready(&key, LauncherPod::Up(Some(("False", "", ""))));
        }));
    }
    store.admit(vmi);
    wait_phase(&store, &key, Phase::Failed).await;
    let status = store.get(&key).and_then(|v| v.status).expect("status");
    let sync = status
        .conditions
        .iter()
        .find(|c| c.condition_type == "Synchronized")
        .unwrap_or_else(|| panic!("no Synchronized condition: {status:?}"));
    assert_eq!(sync.status, "False");
    assert!(
        sync.message
            .as_deref()
            .unwrap_or("")
            .contains("nothing to boot"),
        "{sync:?}"
    );
    agent.stop().await;
}
