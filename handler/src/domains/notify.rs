//! The handler's notify server (`kubevirt.notify.v1.Notify` + `kubevirt.notify.info.NotifyInfo`)
//! on `<kubevirt-share-dir>/domain-notify.sock` (contract §1.6, §3.1).
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

impl NotifyService {
    fn domain_event(&self, request: &DomainEventRequest) -> Result<(), String> {
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
            self.cache.request_relist();
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
        self.cache.apply(event, domain);
        Ok(())
    }

    fn k8s_event(&self, request: &K8sEventRequest) -> Result<(), String> {
        let event: K8sEvent = serde_json::from_slice(&request.event_json)
            .map_err(|e| format!("invalid event JSON: {e}"))?;
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
