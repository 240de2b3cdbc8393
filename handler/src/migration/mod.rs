//! Live migration on the node (`handler/docs/migration.md`): the source and target roles of
//! KubeVirt v1.9.0's handler as decisions ([`source`], [`target`]), carried out by the
//! agent, and the proxies that carry a migration's stream between the two nodes'
//! handlers ([`proxy`]).

pub mod proxy;
pub mod source;
pub mod target;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use proto::kubevirt::{MigrationState, VirtualMachineInstance, well_known};

use proxy::{SourceListener, TargetListener};

/// How this node takes part in migrations.
#[derive(Debug, Clone)]
pub struct MigrationSettings {
    /// The address target listeners bind and publish as `targetNodeAddress` (KubeVirt:
    /// the handler pod's IP, `--pod-ip-address`, or the migration network's).
    pub address: IpAddr,
    /// Mutual TLS between the handlers; `None` for both is KubeVirt's `disableTLS`.
    pub server_tls: Option<Arc<rustls::ServerConfig>>,
    pub client_tls: Option<Arc<rustls::ClientConfig>>,
}

/// This node's part in a VMI's migration.
#[derive(Debug, Clone, PartialEq)]
pub enum Role {
    /// The VMI is labelled for this node as the target of `state`'s migration.
    Target(MigrationState),
    /// The VMI runs here and `state` names this node as the source.
    Source(MigrationState),
}

/// The role of `node` in `vmi`'s migration, if any.
pub fn role(vmi: &VirtualMachineInstance, node: &str) -> Result<Option<Role>, String> {
    let state = match vmi.migration_state() {
        Ok(Some(state)) => state,
        Ok(None) => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let labelled_target = vmi
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(well_known::MIGRATION_TARGET_NODE_NAME_LABEL))
        .is_some_and(|n| n == node);
    if labelled_target && state.target_node.as_deref() == Some(node) {
        return Ok(Some(Role::Target(state)));
    }
    let runs_here = vmi
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| n == node);
    if runs_here && state.source_node.as_deref() == Some(node) {
        return Ok(Some(Role::Source(state)));
    }
    Ok(None)
}

/// The proxies this node runs, by VMI UID.
#[derive(Default)]
pub(crate) struct Proxies {
    targets: Mutex<HashMap<String, TargetListener>>,
    sources: Mutex<HashMap<String, SourceListener>>,
}

impl Proxies {
    pub(crate) fn target_port(&self, uid: &str) -> Option<u16> {
        lock(&self.targets).get(uid).map(|l| l.port)
    }

    pub(crate) fn set_target(&self, uid: &str, listener: TargetListener) {
        lock(&self.targets).insert(uid.to_string(), listener);
    }

    pub(crate) fn source_target(&self, uid: &str) -> Option<std::net::SocketAddr> {
        lock(&self.sources).get(uid).map(|l| l.target)
    }

    pub(crate) fn set_source(&self, uid: &str, listener: SourceListener) {
        lock(&self.sources).insert(uid.to_string(), listener);
    }

    pub(crate) fn stop_target(&self, uid: &str) {
        lock(&self.targets).remove(uid);
    }

    pub(crate) fn stop_source(&self, uid: &str) {
        lock(&self.sources).remove(uid);
    }

    pub(crate) fn forget(&self, uid: &str) {
        self.stop_target(uid);
        self.stop_source(uid);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts and removals: a poisoned map is consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
