//! The handler's notify server (`kubevirt.notify.v1.Notify` + `kubevirt.notify.info.NotifyInfo`):
//! on `<kubevirt-share-dir>/domain-notify.sock` for the node, and on the notify pipe in each
//! launcher pod ([`super::pipe`]) (proto/CONTRACT.md §1.6, §3.1).
//!
//! Launchers push domain events (fed into the [`DomainCache`]) and Kubernetes events (handed
//! to a [`K8sEventSink`], which checks the VMI and records them).
//!
//! A launcher pod is a tenant's: what comes through its pipe is taken only about the pod's own
//! VMI. Each pipe is bound to that VMI ([`VmiIdentity`]: namespace, name, UID); a domain or
//! Kubernetes event about anything else is dropped, answered `success=false` and counted
//! (`kubevirt_handler_notify_events_rejected_total{reason}`), so one pod cannot make the
//! handler shut down or delete another tenant's VM, nor grow the cache with names of its
//! choosing. What one pod can make the handler hold is bounded: [`PIPE_CONNECTIONS`]
//! connections of [`STREAMS_PER_CONNECTION`] requests of at most [`MAX_MESSAGE_BYTES`]; one
//! cache entry (its own); one waiting reconcile (the cache de-duplicates); a relist at most
//! every [`RELIST_INTERVAL`]. The node's own socket is reachable only from the node (the
//! handler's share directory is not mounted into pods); it takes events about any VMI, as
//! KubeVirt's does, within [`MAX_DOMAINS`].

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::Stream;
use proto::domain::Domain;
use proto::grpc::notify::info::notify_info_server::{NotifyInfo, NotifyInfoServer};
use proto::grpc::notify::info::{NotifyInfoRequest, NotifyInfoResponse};
use proto::grpc::notify::v1::notify_server::{Notify, NotifyServer};
use proto::grpc::notify::v1::{self as notifyv1, DomainEventRequest, K8sEventRequest, Response};
use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tonic::transport::server::Connected;
use tonic::{Request, Status};

use super::cache::{DomainCache, EventType, MAX_DOMAINS};
use crate::metrics::Metrics;

/// The socket name under the share dir.
pub(crate) const NOTIFY_SOCKET: &str = "domain-notify.sock";

/// Connections one pod's pipe serves at once. A launcher keeps one; a second covers a
/// reconnect while the first closes. Further connections wait in the listen backlog.
pub const PIPE_CONNECTIONS: usize = 4;
/// Connections the node's own socket serves at once.
pub(crate) const NODE_CONNECTIONS: usize = 64;
/// Requests in flight on one connection (a launcher sends one event at a time).
pub(crate) const STREAMS_PER_CONNECTION: u32 = 4;
/// The largest request taken. A domain's JSON is a few KiB (KubeVirt's, with many disks,
/// some tens of KiB); gRPC's default of 4 MiB would let one pod park 64 MiB in the handler.
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// How often one pod may make the handler list every launcher again (an `ERROR` event).
pub(crate) const RELIST_INTERVAL: Duration = Duration::from_secs(10);

/// A Kubernetes event a launcher asked the handler to record (`core/v1 Event` subset).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct K8sEvent {
    pub involved_object: InvolvedObject,
    #[serde(rename = "type", default)]
    pub event_type: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct InvolvedObject {
    #[serde(default)]
    pub namespace: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub uid: String,
}

/// Records launcher events. `Err(message)` goes back to the launcher as `success=false`
/// (`"VMI not found"` when the VMI or its UID does not match). Implemented once, for every
/// VMI store that can record events (`crate::vmis`).
pub trait K8sEventSink: Send + Sync + 'static {
    fn record(&self, event: &K8sEvent) -> Result<(), String>;
}

/// The VMI a launcher pod runs: the only one its notify pipe may report about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmiIdentity {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

impl VmiIdentity {
    /// `<namespace>/<name>`, the cache key.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What every notify endpoint feeds: the domain cache, the event recorder, the metrics.
#[derive(Clone)]
pub struct NotifyHub {
    cache: Arc<DomainCache>,
    events: Arc<dyn K8sEventSink>,
    metrics: Arc<Metrics>,
}

impl NotifyHub {
    pub fn new(
        cache: Arc<DomainCache>,
        events: Arc<dyn K8sEventSink>,
        metrics: Arc<Metrics>,
    ) -> Self {
        NotifyHub {
            cache,
            events,
            metrics,
        }
    }
}

/// Why an event was dropped; [`Rejection::label`] is the metric's `reason`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Rejection {
    /// About another VMI than the pipe's.
    Identity(String),
    /// A relist asked for sooner than [`RELIST_INTERVAL`] after the last one.
    Rate,
    /// A new domain while the cache holds [`MAX_DOMAINS`].
    Capacity,
    /// Not a domain or event at all.
    Malformed(String),
}

impl Rejection {
    fn label(&self) -> &'static str {
        match self {
            Rejection::Identity(_) => "identity",
            Rejection::Rate => "rate",
            Rejection::Capacity => "capacity",
            Rejection::Malformed(_) => "malformed",
        }
    }

    fn message(self) -> String {
        match self {
            Rejection::Identity(m) | Rejection::Malformed(m) => m,
            Rejection::Rate => format!(
                "a relist was asked for less than {}s ago",
                RELIST_INTERVAL.as_secs()
            ),
            Rejection::Capacity => format!("the domain cache holds {MAX_DOMAINS} domains"),
        }
    }
}

/// What one domain event asks of the cache.
enum DomainEvent {
    Apply(EventType, Box<Domain>),
    Relist(String),
}

fn reply(result: Result<(), String>) -> Response {
    match result {
        Ok(()) => Response {
            success: true,
            message: String::new(),
        },
        Err(message) => Response {
            success: false,
            message,
        },
    }
}

/// Decodes one `HandleDomainEvent` request; `None` for an event type KubeVirt ignores.
/// Launcher input is untrusted: anything malformed is an error, never a panic.
fn decode_domain_event(request: &DomainEventRequest) -> Result<Option<DomainEvent>, Rejection> {
    let Some(event) = EventType::parse(&request.event_type) else {
        // KubeVirt ignores unknown types silently.
        tracing::debug!(event_type = %request.event_type, "ignoring unknown domain event type");
        return Ok(None);
    };
    if event == EventType::Error {
        let status = String::from_utf8_lossy(&request.status_json);
        return Ok(Some(DomainEvent::Relist(
            status.chars().take(200).collect(),
        )));
    }
    let text = std::str::from_utf8(&request.domain_json)
        .map_err(|e| Rejection::Malformed(format!("domain JSON is not UTF-8: {e}")))?;
    let domain = Domain::from_json(text)
        .map_err(|e| Rejection::Malformed(format!("invalid domain JSON: {e}")))?;
    if domain.object_meta.name.is_empty() || domain.object_meta.namespace.is_empty() {
        return Err(Rejection::Malformed(
            "domain event without ObjectMeta name/namespace".into(),
        ));
    }
    Ok(Some(DomainEvent::Apply(event, Box::new(domain))))
}

/// Takes `domain` only about `vmi`: same namespace and name, and each UID it carries either
/// `vmi`'s or empty (then filled in with `vmi`'s: the pipe knows whose domain it is).
fn bind_to(domain: &mut Domain, vmi: &VmiIdentity) -> Result<(), Rejection> {
    if domain.object_meta.namespace != vmi.namespace || domain.object_meta.name != vmi.name {
        return Err(Rejection::Identity(format!(
            "domain {} is not this pod's VMI {}",
            domain.key(),
            vmi.key()
        )));
    }
    for uid in [
        &mut domain.object_meta.uid,
        &mut domain.spec.metadata.kubevirt.uid,
    ] {
        if uid.is_empty() {
            uid.clone_from(&vmi.uid);
        } else if *uid != vmi.uid {
            return Err(Rejection::Identity(format!(
                "domain UID {uid} is not this pod's VMI UID {}",
                vmi.uid
            )));
        }
    }
    Ok(())
}

/// Stores a decoded event, within [`MAX_DOMAINS`].
fn apply(cache: &DomainCache, event: EventType, domain: Domain) -> Result<(), Rejection> {
    let key = domain.key();
    if event != EventType::Deleted && !cache.contains(&key) && cache.len() >= MAX_DOMAINS {
        return Err(Rejection::Capacity);
    }
    tracing::debug!(
        target: crate::takeover::TARGET,
        %key,
        ?event,
        state = ?domain.status.status,
        reason = ?domain.status.reason,
        "domain event"
    );
    cache.apply(event, domain);
    Ok(())
}

/// Applies one `HandleDomainEvent` request from the node's socket (any VMI) to the cache.
/// `Err` is the message of a `success=false` reply.
pub fn handle_domain_event(
    cache: &DomainCache,
    request: &DomainEventRequest,
) -> Result<(), String> {
    match decode_domain_event(request).map_err(Rejection::message)? {
        None => Ok(()),
        Some(DomainEvent::Relist(status)) => {
            tracing::warn!(%status, "launcher reported a watch error, listing launchers again");
            cache.request_relist();
            Ok(())
        }
        Some(DomainEvent::Apply(event, domain)) => {
            apply(cache, event, *domain).map_err(Rejection::message)
        }
    }
}

/// Decodes a `HandleK8sEvent` payload (a core/v1 Event's JSON).
pub fn parse_k8s_event(bytes: &[u8]) -> Result<K8sEvent, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("invalid event JSON: {e}"))
}

/// One notify endpoint: the node's socket (`bound: None`) or a pod's pipe.
struct NotifyService {
    hub: NotifyHub,
    bound: Option<VmiIdentity>,
    last_relist: Mutex<Option<Instant>>,
    /// Whether a refusal was logged at WARN yet (later ones go to DEBUG: the pod decides
    /// how many there are; the metric counts them all).
    warned: AtomicBool,
}

impl NotifyService {
    fn new(hub: NotifyHub, bound: Option<VmiIdentity>) -> Self {
        NotifyService {
            hub,
            bound,
            last_relist: Mutex::new(None),
            warned: AtomicBool::new(false),
        }
    }

    fn refused(&self, rejection: Rejection) -> String {
        self.hub.metrics.notify_event_rejected(rejection.label());
        let pod_vmi = self
            .bound
            .as_ref()
            .map(VmiIdentity::key)
            .unwrap_or_default();
        let reason = rejection.label();
        let message = rejection.message();
        if self.warned.swap(true, Ordering::Relaxed) {
            tracing::debug!(%pod_vmi, reason, %message, "notify event dropped");
        } else {
            tracing::warn!(%pod_vmi, reason, %message, "notify event dropped (further ones at DEBUG, counted in kubevirt_handler_notify_events_rejected_total)");
        }
        message
    }

    fn domain_event(&self, request: &DomainEventRequest) -> Result<(), String> {
        let Some(vmi) = &self.bound else {
            return handle_domain_event(&self.hub.cache, request);
        };
        let outcome = match decode_domain_event(request) {
            Ok(None) => Ok(()),
            Ok(Some(DomainEvent::Relist(status))) => self.relist_from_pod(vmi, &status),
            Ok(Some(DomainEvent::Apply(event, mut domain))) => {
                bind_to(&mut domain, vmi).and_then(|()| apply(&self.hub.cache, event, *domain))
            }
            Err(rejection) => Err(rejection),
        };
        outcome.map_err(|r| self.refused(r))
    }

    fn relist_from_pod(&self, vmi: &VmiIdentity, status: &str) -> Result<(), Rejection> {
        let mut last = self.last_relist.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|at| at.elapsed() < RELIST_INTERVAL) {
            return Err(Rejection::Rate);
        }
        *last = Some(Instant::now());
        tracing::warn!(pod_vmi = %vmi.key(), %status, "launcher reported a watch error, listing launchers again");
        self.hub.cache.request_relist();
        Ok(())
    }

    fn k8s_event(&self, request: &K8sEventRequest) -> Result<(), String> {
        let event = match parse_k8s_event(&request.event_json) {
            Ok(event) => event,
            Err(message) => return Err(self.refused(Rejection::Malformed(message))),
        };
        if let Some(vmi) = &self.bound {
            let about = &event.involved_object;
            if about.namespace != vmi.namespace || about.name != vmi.name || about.uid != vmi.uid {
                return Err(self.refused(Rejection::Identity(format!(
                    "event about {}/{} ({}) is not about this pod's VMI {} ({})",
                    about.namespace,
                    about.name,
                    about.uid,
                    vmi.key(),
                    vmi.uid
                ))));
            }
        }
        self.hub.events.record(&event)
    }
}

#[tonic::async_trait]
impl Notify for NotifyService {
    async fn handle_domain_event(
        &self,
        request: Request<DomainEventRequest>,
    ) -> Result<tonic::Response<Response>, Status> {
        Ok(tonic::Response::new(reply(
            self.domain_event(request.get_ref()),
        )))
    }

    async fn handle_k8s_event(
        &self,
        request: Request<K8sEventRequest>,
    ) -> Result<tonic::Response<Response>, Status> {
        Ok(tonic::Response::new(reply(
            self.k8s_event(request.get_ref()),
        )))
    }
}

struct InfoService;

#[tonic::async_trait]
impl NotifyInfo for InfoService {
    async fn info(
        &self,
        _request: Request<NotifyInfoRequest>,
    ) -> Result<tonic::Response<NotifyInfoResponse>, Status> {
        Ok(tonic::Response::new(NotifyInfoResponse {
            supported_notify_versions: vec![notifyv1::NOTIFY_VERSION],
        }))
    }
}

/// A served connection; the permit it holds returns to the listener when it closes.
struct Limited {
    stream: UnixStream,
    _permit: OwnedSemaphorePermit,
}

impl Connected for Limited {
    type ConnectInfo = <UnixStream as Connected>::ConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

impl AsyncRead for Limited {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Limited {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// The connections of `listener`, at most `limit` at a time: the next one is accepted only
/// once a served one closed.
fn limited_incoming(
    listener: UnixListener,
    limit: usize,
) -> impl Stream<Item = std::io::Result<Limited>> {
    let permits = Arc::new(Semaphore::new(limit));
    futures::stream::unfold((listener, permits), |(listener, permits)| async move {
        let permit = Arc::clone(&permits).acquire_owned().await.ok()?;
        let item = match listener.accept().await {
            Ok((stream, _)) => Ok(Limited {
                stream,
                _permit: permit,
            }),
            Err(e) => {
                // Out of descriptors, say: do not spin.
                tokio::time::sleep(Duration::from_millis(100)).await;
                Err(e)
            }
        };
        Some((item, (listener, permits)))
    })
}

/// Serves the notify services on `listener` until `shutdown` resolves: about any VMI
/// (`bound: None`, the node's socket) or only about `bound` (a pod's pipe).
pub(crate) async fn serve(
    listener: UnixListener,
    hub: NotifyHub,
    bound: Option<VmiIdentity>,
    shutdown: impl std::future::Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let connections = if bound.is_some() {
        PIPE_CONNECTIONS
    } else {
        NODE_CONNECTIONS
    };
    let notify = NotifyServer::new(NotifyService::new(hub, bound))
        .max_decoding_message_size(MAX_MESSAGE_BYTES);
    let info = NotifyInfoServer::new(InfoService).max_decoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(STREAMS_PER_CONNECTION))
        .concurrency_limit_per_connection(STREAMS_PER_CONNECTION as usize)
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .add_service(notify)
        .add_service(info)
        .serve_with_incoming_shutdown(limited_incoming(listener, connections), shutdown)
        .await
}

#[derive(Debug, thiserror::Error)]
pub enum NotifyServerError {
    #[error("cannot prepare notify socket {0}: {1}")]
    Socket(PathBuf, std::io::Error),
    #[error("notify server failed: {0}")]
    Serve(#[from] tonic::transport::Error),
}

/// A bound notify server, ready to serve.
pub struct NotifyServerHandle {
    pub path: PathBuf,
    task: tokio::task::JoinHandle<Result<(), NotifyServerError>>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl NotifyServerHandle {
    /// Stops serving and removes the socket file.
    pub async fn stop(mut self) -> Result<(), NotifyServerError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let result = match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => Err(NotifyServerError::Socket(
                self.path.clone(),
                std::io::Error::other(e.to_string()),
            )),
        };
        let _ = std::fs::remove_file(&self.path);
        result
    }

    /// Whether the server task ended on its own (it should not).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }
}

/// Binds `<dir>/domain-notify.sock` (replacing a stale socket file) and serves it.
pub fn start(dir: &Path, hub: NotifyHub) -> Result<NotifyServerHandle, NotifyServerError> {
    let path = dir.join(NOTIFY_SOCKET);
    std::fs::create_dir_all(dir).map_err(|e| NotifyServerError::Socket(dir.to_path_buf(), e))?;
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(NotifyServerError::Socket(path, e));
        }
        _ => {}
    }
    let listener = proto::unix::SocketPath::new(&path)
        .and_then(|short| UnixListener::bind(short.path()))
        .map_err(|e| NotifyServerError::Socket(path.clone(), e))?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        serve(listener, hub, None, async {
            let _ = stop_rx.await;
        })
        .await?;
        Ok(())
    });
    Ok(NotifyServerHandle {
        path,
        task,
        stop: Some(stop_tx),
    })
}

/// A hub over a fresh cache whose event recorder finds no VMI (unit tests).
#[cfg(test)]
pub(crate) fn test_hub() -> NotifyHub {
    struct NoVmis;
    impl K8sEventSink for NoVmis {
        fn record(&self, _: &K8sEvent) -> Result<(), String> {
            Err("VMI not found".into())
        }
    }
    let (cache, _changes) = DomainCache::new();
    NotifyHub::new(Arc::new(cache), Arc::new(NoVmis), Arc::new(Metrics::new()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::LifeCycle;
    use rand::{Rng, SeedableRng};

    fn request(kind: &str, json: Vec<u8>) -> DomainEventRequest {
        DomainEventRequest {
            domain_json: json,
            status_json: Vec::new(),
            event_type: kind.into(),
        }
    }

    /// The same entry point as the fuzz target (`handler/fuzz`), on random and mutated
    /// input, deterministically: malformed launcher input is an error, never a panic.
    #[test]
    fn random_and_mutated_events_never_panic() {
        let (cache, _rx) = DomainCache::new();
        let mut valid = Domain::new("ns", "vmi", "uid");
        valid.status.status = LifeCycle::Running;
        let valid = valid.to_json().into_bytes();
        assert!(handle_domain_event(&cache, &request("MODIFIED", valid.clone())).is_ok());
        const JSON_BYTES: &[u8] = b"{}[]\",:0-e";
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x6b76);
        for round in 0..3000 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = rng.random_range(0..256);
                (0..len).map(|_| rng.random()).collect()
            } else {
                let mut m = valid.clone();
                for _ in 0..rng.random_range(1..8) {
                    let i = rng.random_range(0..m.len());
                    match rng.random_range(0..3) {
                        0 => m[i] = rng.random(),
                        1 => {
                            m.remove(i);
                        }
                        _ => m.insert(i, JSON_BYTES[rng.random_range(0..JSON_BYTES.len())]),
                    }
                    if m.is_empty() {
                        break;
                    }
                }
                m
            };
            let kind = ["ADDED", "MODIFIED", "DELETED", "ERROR", "X"][round % 5];
            let _ = handle_domain_event(&cache, &request(kind, bytes.clone()));
            let _ = parse_k8s_event(&bytes);
        }
    }

    #[test]
    fn events_without_identity_are_refused() {
        let (cache, _rx) = DomainCache::new();
        let no_name = Domain::new("", "", "uid").to_json().into_bytes();
        assert!(handle_domain_event(&cache, &request("ADDED", no_name)).is_err());
        assert!(handle_domain_event(&cache, &request("ADDED", vec![0xff, 0xfe])).is_err());
        assert!(cache.is_empty());
    }

    #[test]
    fn a_pipe_takes_domains_of_its_vmi_only() {
        let vmi = VmiIdentity {
            namespace: "ns".into(),
            name: "vmi".into(),
            uid: "u-1".into(),
        };
        let mut own = Domain::new("ns", "vmi", "u-1");
        assert_eq!(bind_to(&mut own, &vmi), Ok(()));
        let mut no_uid = Domain::new("ns", "vmi", "");
        assert_eq!(bind_to(&mut no_uid, &vmi), Ok(()));
        assert_eq!(no_uid.spec.metadata.kubevirt.uid, "u-1");
        assert_eq!(no_uid.object_meta.uid, "u-1");
        for mut other in [
            Domain::new("ns", "other", "u-1"),
            Domain::new("other", "vmi", "u-1"),
            Domain::new("ns", "vmi", "u-2"),
        ] {
            let refused = bind_to(&mut other, &vmi);
            assert!(
                matches!(refused, Err(Rejection::Identity(_))),
                "{refused:?}"
            );
        }
        let mut spec_uid_only = Domain::new("ns", "vmi", "u-1");
        spec_uid_only.spec.metadata.kubevirt.uid = "u-2".into();
        assert!(bind_to(&mut spec_uid_only, &vmi).is_err());
    }

    #[test]
    fn the_cache_stops_growing_at_its_bound() {
        let (cache, _rx) = DomainCache::new();
        for i in 0..MAX_DOMAINS {
            let d = Domain::new("ns", &format!("v{i}"), "u")
                .to_json()
                .into_bytes();
            assert!(handle_domain_event(&cache, &request("ADDED", d)).is_ok());
        }
        let one_more = Domain::new("ns", "one-more", "u").to_json().into_bytes();
        assert!(handle_domain_event(&cache, &request("ADDED", one_more.clone())).is_err());
        assert_eq!(cache.len(), MAX_DOMAINS);
        // Known keys still change, and deletions make room.
        let known = Domain::new("ns", "v0", "u").to_json().into_bytes();
        assert!(handle_domain_event(&cache, &request("DELETED", known)).is_ok());
        assert!(handle_domain_event(&cache, &request("ADDED", one_more)).is_ok());
    }
}
