//! The handler's gRPC sides against real tonic peers on unix sockets: the cmd client
//! against a small in-test launcher (`Cmd` + `CmdInfo`), and the notify server (plus the
//! notify pipe) against a real tonic client, checking the contract's error semantics.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use handler::domains::notify::{self, K8sEvent, K8sEventSink, NotifyHub, VmiIdentity};
use handler::domains::pipe::NotifyPipe;
use handler::domains::{CacheChange, DomainCache};
use handler::launchers::client::{LauncherClient, unix_channel};
use handler::launchers::{CmdError, VmiCommand};
use handler::metrics::Metrics;
use proto::domain::{Domain, LifeCycle};
use proto::grpc::cmd::info::cmd_info_server::{CmdInfo, CmdInfoServer};
use proto::grpc::cmd::info::{CmdInfoRequest, CmdInfoResponse};
use proto::grpc::cmd::v1::cmd_server::CmdServer;
use proto::grpc::cmd::v1::{self as cmdv1};
use proto::grpc::notify::info::NotifyInfoRequest;
use proto::grpc::notify::info::notify_info_client::NotifyInfoClient;
use proto::grpc::notify::v1::notify_client::NotifyClient;
use proto::grpc::notify::v1::{DomainEventRequest, K8sEventRequest};
use proto::kubevirt::VirtualMachineInstance;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// What the fake launcher answers.
#[derive(Clone, Default)]
struct Behaviour {
    versions: Vec<u32>,
    /// `Some(msg)`: SyncVirtualMachine replies OK + success=false + msg.
    sync_fails_with: Option<String>,
    /// GetDomain's `domain` string; `None` = no `response` sub-message at all.
    domain: String,
    omit_domain_response: bool,
    /// DeleteVirtualMachine never answers (for disconnect tests).
    delete_hangs: bool,
}

/// Calls the fake launcher received: RPC name and VMI request (if it had one).
type Received = Arc<Mutex<Vec<(String, Option<cmdv1::VmiRequest>)>>>;

#[derive(Clone, Default)]
struct FakeLauncher {
    behaviour: Arc<Mutex<Behaviour>>,
    received: Received,
}

impl FakeLauncher {
    fn record(&self, name: &str, request: Option<cmdv1::VmiRequest>) {
        self.received
            .lock()
            .expect("lock")
            .push((name.to_string(), request));
    }
    fn behaviour(&self) -> Behaviour {
        self.behaviour.lock().expect("lock").clone()
    }
}

fn ok() -> cmdv1::Response {
    cmdv1::Response {
        success: true,
        message: String::new(),
    }
}

impl_fake_cmd!(FakeLauncher {
            async fn sync_virtual_machine(
                &self,
                r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("SyncVirtualMachine", Some(r.into_inner()));
                Ok(Response::new(match self.behaviour().sync_fails_with {
                    Some(message) => cmdv1::Response { success: false, message },
                    None => ok(),
                }))
            }
            async fn shutdown_virtual_machine(
                &self,
                r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("ShutdownVirtualMachine", Some(r.into_inner()));
                Ok(Response::new(ok()))
            }
            async fn kill_virtual_machine(
                &self,
                r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("KillVirtualMachine", Some(r.into_inner()));
                Err(Status::internal("kill exploded"))
            }
            async fn delete_virtual_machine(
                &self,
                r: Request<cmdv1::VmiRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("DeleteVirtualMachine", Some(r.into_inner()));
                if self.behaviour().delete_hangs {
                    std::future::pending::<()>().await;
                }
                Ok(Response::new(ok()))
            }
            async fn ping(
                &self,
                _r: Request<cmdv1::EmptyRequest>,
            ) -> Result<Response<cmdv1::Response>, Status> {
                self.record("Ping", None);
                Ok(Response::new(ok()))
            }
            async fn get_domain(
                &self,
                _r: Request<cmdv1::EmptyRequest>,
            ) -> Result<Response<cmdv1::DomainResponse>, Status> {
                let b = self.behaviour();
                Ok(Response::new(cmdv1::DomainResponse {
                    response: (!b.omit_domain_response).then(ok),
                    domain: b.domain,
                }))
            }
});

#[tonic::async_trait]
impl CmdInfo for FakeLauncher {
    async fn info(&self, _r: Request<CmdInfoRequest>) -> Result<Response<CmdInfoResponse>, Status> {
        Ok(Response::new(CmdInfoResponse {
            supported_cmd_versions: self.behaviour().versions,
        }))
    }
}

struct Served {
    _dir: tempfile::TempDir,
    socket: PathBuf,
    fake: FakeLauncher,
    /// Dropping the sender ends the launcher's runtime, closing every connection as a
    /// dying launcher process would.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Served {
    fn kill(&mut self) {
        self.stop.take();
    }
}

async fn serve(behaviour: Behaviour) -> Served {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("launcher-sock");
    serve_at(behaviour, dir, socket).await
}

/// A fake launcher listening on `socket` (whose directories exist); `dir` lives as long.
async fn serve_at(behaviour: Behaviour, dir: tempfile::TempDir, socket: PathBuf) -> Served {
    let fake = FakeLauncher {
        behaviour: Arc::new(Mutex::new(behaviour)),
        ..Default::default()
    };
    let (cmd, info) = (fake.clone(), fake.clone());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let path = socket.clone();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::UnixListener::bind(&path).expect("bind");
            ready_tx.send(()).expect("ready");
            tokio::spawn(async move {
                tonic::transport::Server::builder()
                    .add_service(CmdServer::new(cmd))
                    .add_service(CmdInfoServer::new(info))
                    .serve_with_incoming(UnixListenerStream::new(listener))
                    .await
                    .expect("serve");
            });
            let _ = stopped.await;
        });
        runtime.shutdown_background();
    });
    ready_rx.recv().expect("launcher thread ready");
    Served {
        _dir: dir,
        socket,
        fake,
        stop: Some(stop),
    }
}

fn v1() -> Behaviour {
    Behaviour {
        versions: vec![1],
        ..Default::default()
    }
}

fn vmi() -> VirtualMachineInstance {
    proto::kubevirt::parse_vmi(
        r#"{"metadata":{"name":"vmi","namespace":"default","uid":"u-1"},
            "spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}}]}},
                    "networks":[{"name":"default","pod":{}}]},
            "status":{"phase":"Scheduled"}}"#,
    )
    .expect("vmi")
}

#[tokio::test]
async fn negotiation_picks_the_highest_common_version_or_fails() {
    let s = serve(Behaviour {
        versions: vec![3, 1, 2],
        ..Default::default()
    })
    .await;
    let client = LauncherClient::connect(&s.socket).await.expect("connect");
    assert_eq!(client.version(), 1);

    let s = serve(Behaviour {
        versions: vec![2],
        ..Default::default()
    })
    .await;
    let err = LauncherClient::connect(&s.socket)
        .await
        .expect_err("no common version");
    assert!(matches!(err, CmdError::NoCompatibleVersion { .. }), "{err}");
    assert!(
        err.to_string().contains("no compatible version found"),
        "{err}"
    );
}

#[tokio::test]
async fn sync_sends_the_vmi_json_and_kubevirts_options() {
    let s = serve(v1()).await;
    let client = LauncherClient::connect(&s.socket).await.expect("connect");
    client.sync_virtual_machine(&vmi()).await.expect("sync");
    let received = s.fake.received.lock().expect("lock").clone();
    let (name, request) = received.last().expect("a call");
    assert_eq!(name, "SyncVirtualMachine");
    let request = request.clone().expect("request");
    let json = request.vmi.expect("vmi").vmi_json;
    let sent: VirtualMachineInstance = serde_json::from_slice(&json).expect("VMI JSON");
    assert_eq!(sent.metadata.uid.as_deref(), Some("u-1"));
    let options = request.options.expect("options");
    assert_eq!(
        options
            .interface_domain_attachment
            .get("default")
            .map(String::as_str),
        Some("tap")
    );
    assert_eq!(options.mem_balloon_stats_period, 10);
    assert!(options.disks_info.is_empty());
}

#[tokio::test]
async fn success_false_is_a_server_error_even_without_message() {
    for message in ["boom", ""] {
        let s = serve(Behaviour {
            sync_fails_with: Some(message.to_string()),
            ..v1()
        })
        .await;
        let client = LauncherClient::connect(&s.socket).await.expect("connect");
        let err = client
            .sync_virtual_machine(&vmi())
            .await
            .expect_err("fails");
        assert_eq!(
            err.to_string(),
            format!("server error. command SyncVirtualMachine failed: \"{message}\"")
        );
        assert!(!err.is_disconnected());
    }
}

#[tokio::test]
async fn unimplemented_and_other_statuses_are_classified() {
    let s = serve(v1()).await;
    let client = LauncherClient::connect(&s.socket).await.expect("connect");
    let err = client
        .send(VmiCommand::Pause, &vmi())
        .await
        .expect_err("unimplemented");
    assert!(matches!(err, CmdError::Unimplemented { .. }), "{err:?}");
    let err = client
        .send(VmiCommand::Kill, &vmi())
        .await
        .expect_err("internal");
    assert!(
        err.to_string()
            .starts_with("unknown error encountered sending command KillVirtualMachine: "),
        "{err}"
    );
    assert!(err.to_string().contains("kill exploded"), "{err}");
    client
        .send(VmiCommand::Shutdown, &vmi())
        .await
        .expect("shutdown");
    client.ping().await.expect("ping");
}

#[tokio::test]
async fn get_domain_empty_valid_invalid_and_absent_response() {
    let s = serve(v1()).await;
    let client = LauncherClient::connect(&s.socket).await.expect("connect");
    assert_eq!(client.get_domain().await.expect("empty"), None);

    let mut d = Domain::new("default", "vmi", "u-1");
    d.status.status = LifeCycle::Running;
    s.fake.behaviour.lock().expect("lock").domain = d.to_json();
    assert_eq!(client.get_domain().await.expect("domain"), Some(d.clone()));

    s.fake.behaviour.lock().expect("lock").omit_domain_response = true;
    assert_eq!(
        client.get_domain().await.expect("absent response is fine"),
        Some(d)
    );

    s.fake.behaviour.lock().expect("lock").domain = "{not json".into();
    assert!(matches!(
        client.get_domain().await,
        Err(CmdError::InvalidDomain(_))
    ));
}

#[tokio::test]
async fn a_launcher_that_goes_away_mid_call_is_a_disconnect() {
    let mut s = serve(Behaviour {
        delete_hangs: true,
        ..v1()
    })
    .await;
    let client = LauncherClient::connect(&s.socket).await.expect("connect");
    let call = {
        let client = client.clone();
        tokio::spawn(async move { client.send(VmiCommand::Delete, &vmi()).await })
    };
    // Wait until the launcher has the call, then take the launcher away.
    for _ in 0..100 {
        if s.fake
            .received
            .lock()
            .expect("lock")
            .iter()
            .any(|(n, _)| n == "DeleteVirtualMachine")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    s.kill();
    let err = tokio::time::timeout(Duration::from_secs(10), call)
        .await
        .expect("the call ends")
        .expect("task")
        .expect_err("disconnected");
    assert!(err.is_disconnected(), "{err:?}");
}

#[tokio::test]
async fn connecting_to_a_missing_socket_fails_fast() {
    let dir = tempfile::tempdir().expect("tempdir");
    let started = std::time::Instant::now();
    let err = LauncherClient::connect(&dir.path().join("nothing"))
        .await
        .expect_err("no socket");
    assert!(matches!(err, CmdError::Connect { .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

/// A VMI that migrated away from this node and comes back as a migration's target: its
/// old pod (completed, still in `activePods`) lies beside the new one. The client of the
/// old launcher, whose socket is gone, must give way to the new launcher's socket — the
/// cluster's drain stalled for good on it (the target waited on the dead launcher).
#[tokio::test]
async fn a_vmi_back_on_this_node_reaches_its_new_launcher_not_the_old_one() {
    use handler::launchers::{LauncherPaths, Launchers, PodPaths};
    use handler::sync::LauncherState;
    let root = tempfile::tempdir().expect("tempdir");
    let pods_dir = root.path().join("pods");
    let (cache, _changes) = DomainCache::new();
    let sink = Arc::new(Sink {
        vmi_uid: "u-1".into(),
        recorded: Mutex::new(Vec::new()),
    });
    let hub = NotifyHub::new(Arc::new(cache), sink, Arc::new(Metrics::new()));
    let launchers = Launchers::new(
        LauncherPaths {
            pods_dir: pods_dir.clone(),
            share_dir: root.path().join("share"),
            ghost_dir: root.path().join("ghosts"),
        },
        "n1",
        hub,
    )
    .without_notify_pipes();
    let launcher_in_pod = |pod: &str| {
        let socket = PodPaths::new(&pods_dir, pod).launcher_socket();
        std::fs::create_dir_all(socket.parent().unwrap()).expect("sockets dir");
        socket
    };
    let with_pods = |pods: serde_json::Value| {
        let mut v = serde_json::to_value(vmi()).unwrap();
        v["status"] = serde_json::json!({"phase": "Running", "activePods": pods});
        serde_json::from_value::<VirtualMachineInstance>(v).unwrap()
    };

    // The first stay: one pod, its launcher answers.
    let old_socket = launcher_in_pod("pod-old");
    let mut old = serve_at(v1(), tempfile::tempdir().unwrap(), old_socket.clone()).await;
    let first = with_pods(serde_json::json!({"pod-old": "n1"}));
    assert_eq!(launchers.lookup(&first).await.state, LauncherState::Ready);
    // It migrated away: its launcher exits and takes its socket along.
    old.kill();
    std::fs::remove_file(&old_socket).expect("the old launcher's socket goes");
    assert_eq!(
        launchers.lookup(&first).await.state,
        LauncherState::Unresponsive
    );

    // Back as a migration's target: the new pod's launcher is the one reached.
    let back = with_pods(serde_json::json!({"pod-old": "n1", "pod-new": "n1"}));
    let new = serve_at(
        v1(),
        tempfile::tempdir().unwrap(),
        launcher_in_pod("pod-new"),
    )
    .await;
    let found = launchers.lookup(&back).await;
    assert_eq!(found.state, LauncherState::Ready);
    found.client.expect("a client").ping().await.expect("ping");
    assert!(
        new.fake
            .received
            .lock()
            .unwrap()
            .iter()
            .any(|(name, _)| name == "Ping"),
        "the new launcher answered"
    );
}

// ---- notify server

struct Sink {
    vmi_uid: String,
    recorded: Mutex<Vec<K8sEvent>>,
}

impl K8sEventSink for Sink {
    fn record(&self, event: &K8sEvent) -> Result<(), String> {
        if event.involved_object.uid != self.vmi_uid {
            return Err("VMI not found".into());
        }
        self.recorded.lock().expect("lock").push(event.clone());
        Ok(())
    }
}

async fn notify_client(socket: &Path) -> NotifyClient<tonic::transport::Channel> {
    NotifyClient::new(
        unix_channel(socket, Duration::from_secs(2))
            .await
            .expect("channel"),
    )
}

fn event(kind: &str, domain: &Domain) -> DomainEventRequest {
    DomainEventRequest {
        domain_json: domain.to_json().into_bytes(),
        status_json: Vec::new(),
        event_type: kind.into(),
    }
}

#[tokio::test]
async fn notify_server_feeds_the_cache_and_answers_like_kubevirt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (cache, mut changes) = DomainCache::new();
    let cache = Arc::new(cache);
    let sink = Arc::new(Sink {
        vmi_uid: "u-1".into(),
        recorded: Mutex::new(Vec::new()),
    });
    let hub = NotifyHub::new(Arc::clone(&cache), sink.clone(), Arc::new(Metrics::new()));
    let server = notify::start(dir.path(), hub.clone()).expect("start");
    let socket = dir.path().join("domain-notify.sock");
    assert_eq!(server.path, socket);

    let mut info = NotifyInfoClient::new(
        unix_channel(&socket, Duration::from_secs(2))
            .await
            .expect("ch"),
    );
    let versions = info
        .info(NotifyInfoRequest {})
        .await
        .expect("info")
        .into_inner();
    assert_eq!(versions.supported_notify_versions, vec![1]);

    let mut client = notify_client(&socket).await;
    let mut d = Domain::new("default", "vmi", "u-1");
    d.status.status = LifeCycle::Running;
    let reply = client
        .handle_domain_event(event("ADDED", &d))
        .await
        .expect("rpc")
        .into_inner();
    assert!(reply.success, "{}", reply.message);
    assert_eq!(
        changes.recv().await,
        Some(CacheChange::Key("default/vmi".into()))
    );
    assert_eq!(cache.get("default/vmi"), Some(d.clone()));

    // Unknown types are ignored, successfully.
    let reply = client
        .handle_domain_event(event("BOOKMARK", &d))
        .await
        .expect("rpc")
        .into_inner();
    assert!(reply.success);
    assert!(changes.try_recv().is_err());

    // Garbage is refused with success=false (the launcher retries).
    let reply = client
        .handle_domain_event(DomainEventRequest {
            domain_json: b"{\"ObjectMeta\": 5".to_vec(),
            status_json: Vec::new(),
            event_type: "MODIFIED".into(),
        })
        .await
        .expect("rpc")
        .into_inner();
    assert!(!reply.success);
    assert!(
        reply.message.contains("invalid domain JSON"),
        "{}",
        reply.message
    );

    let reply = client
        .handle_domain_event(DomainEventRequest {
            domain_json: Vec::new(),
            status_json: br#"{"kind":"Status","message":"gone"}"#.to_vec(),
            event_type: "ERROR".into(),
        })
        .await
        .expect("rpc")
        .into_inner();
    assert!(reply.success);
    assert_eq!(changes.recv().await, Some(CacheChange::Relist));

    let k8s = |uid: &str| K8sEventRequest {
        event_json: serde_json::json!({
            "involvedObject": {"kind": "VirtualMachineInstance", "apiVersion": "kubevirt.io/v1",
                               "namespace": "default", "name": "vmi", "uid": uid},
            "type": "Warning", "reason": "GuestPanicked", "message": "panic"
        })
        .to_string()
        .into_bytes(),
    };
    let reply = client
        .handle_k8s_event(k8s("u-1"))
        .await
        .expect("rpc")
        .into_inner();
    assert!(reply.success);
    let reply = client
        .handle_k8s_event(k8s("other"))
        .await
        .expect("rpc")
        .into_inner();
    assert!(!reply.success);
    assert_eq!(reply.message, "VMI not found");
    assert_eq!(sink.recorded.lock().expect("lock").len(), 1);

    // Through a notify pipe placed elsewhere, owned by another user.
    let pipe_dir = tempfile::tempdir().expect("tempdir");
    let pipe_path = pipe_dir
        .path()
        .join("var/run/kubevirt/domain-notify-pipe.sock");
    // The pipe goes into an existing pod directory; it never creates one.
    let pod_vmi = VmiIdentity {
        namespace: "default".into(),
        name: "vmi".into(),
        uid: "u-1".into(),
    };
    assert!(NotifyPipe::start(&pipe_path, hub.clone(), pod_vmi.clone(), Some(107)).is_err());
    std::fs::create_dir_all(pipe_path.parent().expect("parent")).expect("mkdir");
    let pipe = NotifyPipe::start(&pipe_path, hub, pod_vmi, Some(107)).expect("pipe");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(&pipe_path).expect("pipe file").uid(), 107);
    let mut via_pipe = notify_client(&pipe_path).await;
    d.status.status = LifeCycle::Paused;
    let reply = via_pipe
        .handle_domain_event(event("MODIFIED", &d))
        .await
        .expect("rpc")
        .into_inner();
    assert!(reply.success);
    assert_eq!(
        changes.recv().await,
        Some(CacheChange::Key("default/vmi".into()))
    );
    assert_eq!(
        cache.get("default/vmi").map(|d| d.status.status),
        Some(LifeCycle::Paused)
    );
    drop(pipe);
    assert!(!pipe_path.exists(), "the pipe's socket file goes with it");

    server.stop().await.expect("stop");
    assert!(!socket.exists());
}

/// A malicious launcher, speaking gRPC through its pod's notify pipe: it cannot change
/// another VMI's domain (forged state, deletion), record events about it, grow the cache
/// with names of its choosing, ask for relists in a loop, or hold more than the pipe's
/// connections and message size; each dropped event is counted on `/metrics`.
#[tokio::test]
async fn a_launcher_pod_reports_about_its_own_vmi_only() {
    let (cache, mut changes) = DomainCache::new();
    let cache = Arc::new(cache);
    let metrics = Arc::new(Metrics::new());
    // The recorder knows both VMIs: only the pipe's binding keeps B's events out.
    struct Both(Mutex<Vec<K8sEvent>>);
    impl K8sEventSink for Both {
        fn record(&self, event: &K8sEvent) -> Result<(), String> {
            self.0.lock().expect("lock").push(event.clone());
            Ok(())
        }
    }
    let sink = Arc::new(Both(Mutex::new(Vec::new())));
    let hub = NotifyHub::new(Arc::clone(&cache), sink.clone(), Arc::clone(&metrics));

    // Tenant B's VM runs; its domain is in the cache.
    let mut victim = Domain::new("tenant-b", "vm-b", "uid-b");
    victim.status.status = LifeCycle::Running;
    cache.set("tenant-b/vm-b", victim.clone());
    assert_eq!(
        changes.recv().await,
        Some(CacheChange::Key("tenant-b/vm-b".into()))
    );

    // Tenant A's pod and its pipe.
    let pod = tempfile::tempdir().expect("tempdir");
    let pipe_path = pod.path().join("domain-notify-pipe.sock");
    let own = VmiIdentity {
        namespace: "tenant-a".into(),
        name: "vm-a".into(),
        uid: "uid-a".into(),
    };
    let _pipe = NotifyPipe::start(&pipe_path, hub, own, None).expect("pipe");
    let mut attacker = notify_client(&pipe_path).await;

    // Forged states and a deletion of B's domain, under B's name and UID.
    let mut forged = victim.clone();
    forged.status.status = LifeCycle::Shutoff;
    for request in [
        event("MODIFIED", &forged),
        event("DELETED", &forged),
        event(
            "ADDED",
            &Domain::gone(
                "tenant-b",
                "vm-b",
                "uid-b",
                proto::kubevirt::Time(k8s_openapi::jiff::Timestamp::now()),
            ),
        ),
    ] {
        let reply = attacker
            .handle_domain_event(request)
            .await
            .expect("rpc")
            .into_inner();
        assert!(!reply.success);
        assert!(
            reply.message.contains("not this pod's VMI"),
            "{}",
            reply.message
        );
    }
    assert_eq!(cache.get("tenant-b/vm-b"), Some(victim.clone()));
    // Its own name with another UID.
    let reply = attacker
        .handle_domain_event(event("MODIFIED", &Domain::new("tenant-a", "vm-a", "uid-b")))
        .await
        .expect("rpc")
        .into_inner();
    assert!(!reply.success);
    // A thousand new names: none is kept.
    for i in 0..1000 {
        let reply = attacker
            .handle_domain_event(event(
                "ADDED",
                &Domain::new("tenant-a", &format!("x{i}"), "uid-a"),
            ))
            .await
            .expect("rpc")
            .into_inner();
        assert!(!reply.success);
    }
    assert_eq!(cache.len(), 1);
    assert!(changes.try_recv().is_err(), "no reconcile was queued");
    // An event about B.
    let about_b = K8sEventRequest {
        event_json: serde_json::json!({
            "involvedObject": {"namespace": "tenant-b", "name": "vm-b", "uid": "uid-b"},
            "type": "Warning", "reason": "Forged", "message": "x"
        })
        .to_string()
        .into_bytes(),
    };
    let reply = attacker
        .handle_k8s_event(about_b)
        .await
        .expect("rpc")
        .into_inner();
    assert!(!reply.success);
    assert!(sink.0.lock().expect("lock").is_empty());

    // Its own domain is taken (an empty UID is filled in with the pod's).
    let mut mine = Domain::new("tenant-a", "vm-a", "");
    mine.status.status = LifeCycle::Running;
    let reply = attacker
        .handle_domain_event(event("ADDED", &mine))
        .await
        .expect("rpc")
        .into_inner();
    assert!(reply.success, "{}", reply.message);
    assert_eq!(
        changes.recv().await,
        Some(CacheChange::Key("tenant-a/vm-a".into()))
    );
    assert_eq!(
        cache
            .get("tenant-a/vm-a")
            .map(|d| d.spec.metadata.kubevirt.uid),
        Some("uid-a".into())
    );

    // A relist, then no second one right after.
    let error = || DomainEventRequest {
        domain_json: Vec::new(),
        status_json: b"{}".to_vec(),
        event_type: "ERROR".into(),
    };
    let first = attacker
        .handle_domain_event(error())
        .await
        .expect("rpc")
        .into_inner();
    assert!(first.success);
    assert_eq!(changes.recv().await, Some(CacheChange::Relist));
    let second = attacker
        .handle_domain_event(error())
        .await
        .expect("rpc")
        .into_inner();
    assert!(!second.success);
    assert!(changes.try_recv().is_err());

    // A message over the bound is refused by gRPC itself.
    let mut huge = event("MODIFIED", &mine);
    huge.status_json = vec![b' '; notify::MAX_MESSAGE_BYTES + 1];
    let status = attacker
        .handle_domain_event(huge)
        .await
        .expect_err("too large");
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status}");

    // Every drop is counted.
    let text = metrics.encode();
    for (reason, count) in [("identity", 1005), ("rate", 1)] {
        let line = format!(
            r#"kubevirt_handler_notify_events_rejected_total{{reason="{reason}"}} {count}"#
        );
        assert!(text.contains(&line), "{line} in {text}");
    }

    // Connections: the pipe serves PIPE_CONNECTIONS at once; the next waits for one to
    // close.
    drop(attacker);
    let mut held = Vec::new();
    for _ in 0..notify::PIPE_CONNECTIONS {
        let mut client = notify_client(&pipe_path).await;
        let reply = client
            .handle_domain_event(event("MODIFIED", &mine))
            .await
            .expect("rpc")
            .into_inner();
        assert!(reply.success);
        held.push(client);
    }
    let waiting = {
        let pipe_path = pipe_path.clone();
        let mine = mine.clone();
        tokio::spawn(async move {
            let mut client = notify_client(&pipe_path).await;
            client.handle_domain_event(event("MODIFIED", &mine)).await
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        !waiting.is_finished(),
        "a connection past the bound is not served"
    );
    held.pop();
    let reply = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("served once a connection closed")
        .expect("join")
        .expect("rpc")
        .into_inner();
    assert!(reply.success);
}
