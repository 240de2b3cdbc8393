//! Sends domain events and Kubernetes events about the VMI to the handler's notify socket
//! (`kubevirt.notify.v1.Notify/HandleDomainEvent`, `HandleK8sEvent`).
//!
//! The handler injects its notify pipe into the pod only when it first talks
//! to the launcher, and replaces it when it restarts. So, as the Go launcher
//! does, every event is retried: re-dial and resend, polling each second,
//! for up to 20 s; a reply with `success != true` counts as a failure.

use crate::manager::{DomainEvent, Notification, VmiEvent};
use proto::grpc::notify::info::{NotifyInfoRequest, notify_info_client::NotifyInfoClient};
use proto::grpc::notify::v1::{
    DomainEventRequest, K8sEventRequest, NOTIFY_VERSION, notify_client::NotifyClient,
};
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tonic::transport::Channel;

const RETRY_EVERY: Duration = Duration::from_secs(1);
const PER_TRY: Duration = Duration::from_secs(5);
const BUDGET: Duration = Duration::from_secs(20);

pub(crate) struct Notifier {
    socket: PathBuf,
    client: Option<NotifyClient<Channel>>,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NotifyError {
    #[error("cannot reach {0}: {1}")]
    Connect(PathBuf, String),
    #[error("no compatible notify version (handler speaks {0:?})")]
    Version(Vec<u32>),
    #[error("failed to notify domain event: {0}")]
    Rejected(String),
    #[error("notify call failed: {0}")]
    Call(#[from] tonic::Status),
    #[error("timed out")]
    Timeout,
}

impl Notifier {
    pub(crate) fn new(socket: PathBuf) -> Self {
        Notifier {
            socket,
            client: None,
        }
    }

    async fn connect(&mut self) -> Result<&mut NotifyClient<Channel>, NotifyError> {
        if self.client.is_none() {
            let channel = crate::server::unix_channel(&self.socket)
                .await
                .map_err(|e| NotifyError::Connect(self.socket.clone(), e.to_string()))?;
            let versions = NotifyInfoClient::new(channel.clone())
                .info(NotifyInfoRequest {})
                .await?
                .into_inner()
                .supported_notify_versions;
            if proto::grpc::highest_compatible_version(&versions, &[NOTIFY_VERSION]).is_none() {
                return Err(NotifyError::Version(versions));
            }
            self.client = Some(NotifyClient::new(channel));
        }
        Ok(self.client.as_mut().expect("client was just set"))
    }

    async fn try_send(&mut self, request: Request) -> Result<(), NotifyError> {
        let client = self.connect().await?;
        let reply = match request {
            Request::Domain(request) => client.handle_domain_event(request).await?,
            Request::Vmi(request) => client.handle_k8s_event(request).await?,
        }
        .into_inner();
        if reply.success {
            Ok(())
        } else {
            Err(NotifyError::Rejected(reply.message))
        }
    }

    /// Sends one domain event, retrying within the budget.
    pub(crate) async fn send(&mut self, event: &DomainEvent) -> Result<(), NotifyError> {
        self.send_request(Request::Domain(DomainEventRequest {
            domain_json: event.domain.to_json().into_bytes(),
            status_json: Vec::new(),
            event_type: event.event_type.to_string(),
        }))
        .await
    }

    /// Sends one Kubernetes event, retrying within the budget.
    pub(crate) async fn send_vmi_event(&mut self, event: &VmiEvent) -> Result<(), NotifyError> {
        self.send_request(Request::Vmi(K8sEventRequest {
            event_json: event.to_json().into_bytes(),
        }))
        .await
    }

    async fn send_request(&mut self, request: Request) -> Result<(), NotifyError> {
        let deadline = tokio::time::Instant::now() + BUDGET;
        loop {
            let attempt = tokio::time::timeout(PER_TRY, self.try_send(request.clone())).await;
            let error = match attempt {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) => e,
                Err(_) => NotifyError::Timeout,
            };
            // Drop the connection: the pipe may have been replaced.
            self.client = None;
            if tokio::time::Instant::now() + RETRY_EVERY >= deadline {
                return Err(error);
            }
            tracing::debug!("domain event not delivered yet: {error}");
            tokio::time::sleep(RETRY_EVERY).await;
        }
    }
}

#[derive(Clone)]
enum Request {
    Domain(DomainEventRequest),
    Vmi(K8sEventRequest),
}

/// What the notifier has done so far, for the launcher's exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Progress {
    /// Events dealt with (delivered, or given up on after the retries).
    pub(crate) processed: u64,
    /// The final "domain gone" event was dealt with (the Go launcher's
    /// "final delete notification sent", which also counts a send that
    /// failed).
    pub(crate) gone: bool,
}

/// Delivers events in order until the channel closes, publishing its
/// progress after each one.
pub(crate) async fn run(
    socket: PathBuf,
    mut events: mpsc::UnboundedReceiver<Notification>,
    progress: watch::Sender<Progress>,
) {
    let mut notifier = Notifier::new(socket);
    while let Some(notification) = events.recv().await {
        let gone = match &notification {
            Notification::Domain(event) => {
                match notifier.send(event).await {
                    Ok(()) => tracing::debug!(
                        "sent {} {:?}/{:?}",
                        event.event_type,
                        event.domain.status.status,
                        event.domain.status.reason
                    ),
                    Err(e) => tracing::warn!("domain event {} dropped: {e}", event.event_type),
                }
                event.domain.is_gone()
            }
            Notification::Vmi(event) => {
                if let Err(e) = notifier.send_vmi_event(event).await {
                    tracing::warn!("event {} about the VMI dropped: {e}", event.reason);
                }
                false
            }
        };
        progress.send_modify(|p| {
            p.processed += 1;
            p.gone |= gone;
        });
    }
}
