//! The handler's notify server (`kubevirt.notify.v1.Notify` + `kubevirt.notify.info.NotifyInfo`)
//! on `<kubevirt-share-dir>/domain-notify.sock` (proto/CONTRACT.md §1.6, §3.1).
//!
//! Launchers push domain events (fed into the [`DomainCache`]) and Kubernetes events (handed
//! to a [`K8sEventSink`], which checks the VMI and records them).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use proto::domain::Domain;
use proto::grpc::notify::info::notify_info_server::{NotifyInfo, NotifyInfoServer};
use proto::grpc::notify::info::{NotifyInfoRequest, NotifyInfoResponse};
use proto::grpc::notify::v1::notify_server::{Notify, NotifyServer};
use proto::grpc::notify::v1::{self as notifyv1, DomainEventRequest, K8sEventRequest, Response};
use serde::Deserialize;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Status};

use super::cache::{DomainCache, EventType};

/// The socket name under the share dir.
pub const NOTIFY_SOCKET: &str = "domain-notify.sock";

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
/// (`"VMI not found"` when the VMI or its UID does not match).
pub trait K8sEventSink: Send + Sync + 'static {
    fn record(&self, event: &K8sEvent) -> Result<(), String>;
}

struct NotifyService {
    cache: Arc<DomainCache>,
    events: Arc<dyn K8sEventSink>,
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

/// Applies one `HandleDomainEvent` request to the cache. `Err` is the message of a
/// `success=false` reply. Launcher input is untrusted: anything malformed is an error,
/// never a panic.
pub fn handle_domain_event(
    cache: &DomainCache,
    request: &DomainEventRequest,
) -> Result<(), String> {
    let Some(event) = EventType::parse(&request.event_type) else {
        // KubeVirt ignores unknown types silently.
        tracing::debug!(event_type = %request.event_type, "ignoring unknown domain event type");
        return Ok(());
    };
    if event == EventType::Error {
        tracing::warn!(
            status = %String::from_utf8_lossy(&request.status_json),
            "launcher reported a watch error, listing launchers again"
        );
        cache.request_relist();
        return Ok(());
    }
    let text = std::str::from_utf8(&request.domain_json)
        .map_err(|e| format!("domain JSON is not UTF-8: {e}"))?;
    let domain = Domain::from_json(text).map_err(|e| format!("invalid domain JSON: {e}"))?;
    if domain.object_meta.name.is_empty() || domain.object_meta.namespace.is_empty() {
        return Err("domain event without ObjectMeta name/namespace".into());
    }
    tracing::debug!(
        key = %domain.key(),
        event = %request.event_type,
        state = ?domain.status.status,
        reason = ?domain.status.reason,
        "domain event"
    );
    cache.apply(event, domain);
    Ok(())
}

/// Decodes a `HandleK8sEvent` payload (a core/v1 Event's JSON).
pub fn parse_k8s_event(bytes: &[u8]) -> Result<K8sEvent, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("invalid event JSON: {e}"))
}

impl NotifyService {
    fn domain_event(&self, request: &DomainEventRequest) -> Result<(), String> {
        handle_domain_event(&self.cache, request)
    }

    fn k8s_event(&self, request: &K8sEventRequest) -> Result<(), String> {
        let event = parse_k8s_event(&request.event_json)?;
        self.events.record(&event)
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
pub fn start(
    dir: &Path,
    cache: Arc<DomainCache>,
    events: Arc<dyn K8sEventSink>,
) -> Result<NotifyServerHandle, NotifyServerError> {
    let path = dir.join(NOTIFY_SOCKET);
    std::fs::create_dir_all(dir).map_err(|e| NotifyServerError::Socket(dir.to_path_buf(), e))?;
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(NotifyServerError::Socket(path, e));
        }
        _ => {}
    }
    let listener = crate::launchers::socket::SocketPath::new(&path)
        .and_then(|short| tokio::net::UnixListener::bind(short.path()))
        .map_err(|e| NotifyServerError::Socket(path.clone(), e))?;
    let service = NotifyService { cache, events };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(NotifyServer::new(service))
            .add_service(NotifyInfoServer::new(InfoService))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
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
}
