//! The desired state: this node's VMIs, and where their status goes.
//!
//! The agent reads VMIs through [`VmiStore`] and writes status through [`StatusWriter`], so
//! the same agent runs against Kubernetes ([`kube`]) and against manifests on disk
//! (the standalone mode).

pub mod kube;
pub(crate) mod migratable;
pub mod status;

use std::future::Future;
use std::pin::Pin;

use proto::kubevirt::{VirtualMachineInstance, VirtualMachineInstanceStatus};

use crate::domains::notify::{K8sEvent, K8sEventSink};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The VMIs the agent may act on, keyed `<namespace>/<name>`.
pub trait VmiStore: Send + Sync + 'static {
    fn get(&self, key: &str) -> Option<VirtualMachineInstance>;
    fn keys(&self) -> Vec<String>;
}

/// `Normal` or `Warning`, as Kubernetes events have it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Normal => "Normal",
            EventKind::Warning => "Warning",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StatusWriteError {
    /// Someone else changed the VMI since it was read: read again and retry.
    #[error("the VMI changed since it was read (conflict)")]
    Conflict,
    #[error("the VMI no longer exists")]
    Gone,
    #[error("cannot write the VMI status: {0}")]
    Other(String),
}

/// Where the agent's results go.
pub trait StatusWriter: Send + Sync + 'static {
    /// Writes the fields the handler owns (see [`status::HANDLER_OWNED_FIELDS`]) from
    /// `status` onto the VMI as read in `vmi`, leaving every other field as it is.
    fn write_status<'a>(
        &'a self,
        vmi: &'a VirtualMachineInstance,
        status: &'a VirtualMachineInstanceStatus,
    ) -> BoxFuture<'a, Result<(), StatusWriteError>>;

    /// Applies a migration step's change to the VMI as read in `vmi` (a JSON merge patch
    /// of its `status` and of `metadata.labels`/`annotations`): refused with
    /// [`StatusWriteError::Conflict`] when the VMI changed since. Migration state is
    /// shared with the controller and the other node, so it is patched key by key rather
    /// than written whole.
    fn patch_vmi<'a>(
        &'a self,
        vmi: &'a VirtualMachineInstance,
        patch: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), StatusWriteError>>;

    /// Records an event about the VMI (best effort).
    fn record_event(
        &self,
        vmi: &VirtualMachineInstance,
        kind: EventKind,
        reason: &str,
        message: &str,
    );
}

/// Launchers' Kubernetes events, recorded by any store that can record events: the VMI
/// must exist with the event's UID (else `"VMI not found"`, KubeVirt's answer).
impl<T: VmiStore + StatusWriter> K8sEventSink for T {
    fn record(&self, event: &K8sEvent) -> Result<(), String> {
        let about = &event.involved_object;
        let vmi = self
            .get(&format!("{}/{}", about.namespace, about.name))
            .filter(|v| v.metadata.uid.as_deref() == Some(about.uid.as_str()))
            .ok_or_else(|| "VMI not found".to_string())?;
        let kind = if event.event_type == "Warning" {
            EventKind::Warning
        } else {
            EventKind::Normal
        };
        self.record_event(&vmi, kind, &event.reason, &event.message);
        Ok(())
    }
}

/// `<namespace>/<name>` of a VMI.
pub fn key_of(vmi: &VirtualMachineInstance) -> String {
    format!(
        "{}/{}",
        vmi.metadata.namespace.as_deref().unwrap_or_default(),
        vmi.metadata.name.as_deref().unwrap_or_default()
    )
}
