//! Live migration on the node (`handler/docs/migration.md`): the source and target roles of
//! KubeVirt v1.9.0's handler as decisions ([`source`], [`target`]), carried out by the
//! agent, and the proxies that carry a migration's stream between the two nodes'
//! handlers ([`proxy`]).

pub mod proxy;
pub mod source;
pub mod target;

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use proto::kubevirt::{MigrationState, VirtualMachineInstance, well_known};

use proxy::{SourceListener, TargetListener};

/// How this node takes part in migrations.
#[derive(Debug, Clone)]
pub struct MigrationSettings {
    /// The address target listeners bind and publish as `targetNodeAddress` (KubeVirt:
    /// the handler pod's IP, `--pod-ip-address`, or the migration network's).
    pub address: IpAddr,
    pub tls: MigrationTls,
}

/// The proxies' transport between the handlers.
#[derive(Debug, Clone)]
pub enum MigrationTls {
    /// Plain TCP (KubeVirt's `disableTLS`; tests).
    Plain,
    /// Mutual TLS with the install's certificates, read when a migration needs them: they
    /// are written by virt-api, which may come up after the handler, and rotate.
    Files {
        /// `tls.crt`/`tls.key`: the handlers' serving certificate (the target side).
        server_dir: PathBuf,
        /// `tls.crt`/`tls.key`: the handlers' client certificate (the source side).
        client_dir: PathBuf,
        ca_bundle: PathBuf,
    },
}

/// Why the migration certificates cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("migration certificates: {0}")]
pub struct TlsError(String);

impl MigrationTls {
    fn read(path: &std::path::Path) -> Result<String, TlsError> {
        std::fs::read_to_string(path).map_err(|e| TlsError(format!("{}: {e}", path.display())))
    }

    /// The certificate, key (`tls.crt`, `tls.key` of the server or the client directory)
    /// and CA bundle, read now; `None`: plain.
    fn pems(&self, client: bool) -> Result<Option<[String; 3]>, TlsError> {
        let MigrationTls::Files {
            server_dir,
            client_dir,
            ca_bundle,
        } = self
        else {
            return Ok(None);
        };
        let dir = if client { client_dir } else { server_dir };
        Ok(Some([
            Self::read(&dir.join("tls.crt"))?,
            Self::read(&dir.join("tls.key"))?,
            Self::read(ca_bundle)?,
        ]))
    }

    /// The target listener's configuration (`None`: plain).
    pub fn server(&self) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
        let Some([cert, key, ca]) = self.pems(false)? else {
            return Ok(None);
        };
        handler_api::migration_server_config(&cert, &key, &ca)
            .map(|config| Some(Arc::new(config)))
            .map_err(|e| TlsError(e.to_string()))
    }

    /// The source proxy's configuration (`None`: plain).
    pub fn client(&self) -> Result<Option<Arc<rustls::ClientConfig>>, TlsError> {
        let Some([cert, key, ca]) = self.pems(true)? else {
            return Ok(None);
        };
        handler_api::migration_client_config(&cert, &key, &ca)
            .map(|config| Some(Arc::new(config)))
            .map_err(|e| TlsError(e.to_string()))
    }
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
    // Anyone who may create a VMI may write its status on KubeVirt's CRD, but the label
    // only KubeVirt's service accounts may set (virt-api's restricted labels): both roles
    // need it, so no user's status sends a guest to an address of their choosing.
    let label = vmi
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(well_known::MIGRATION_TARGET_NODE_NAME_LABEL));
    let handed_off = label.is_some() && label.map(String::as_str) == state.target_node.as_deref();
    if handed_off && state.target_node.as_deref() == Some(node) {
        return Ok(Some(Role::Target(state)));
    }
    let runs_here = vmi
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_some_and(|n| n == node);
    // Once over (the target took its label away), the source only stops its proxy.
    if runs_here && state.source_node.as_deref() == Some(node) && (handed_off || state.is_done()) {
        return Ok(Some(Role::Source(state)));
    }
    Ok(None)
}

/// The proxies this node runs, by VMI UID.
#[derive(Default)]
pub(crate) struct Proxies {
    targets: Mutex<HashMap<String, TargetListener>>,
    sources: Mutex<HashMap<String, SourceListener>>,
    /// VMI key → UID of the proxies started, so that a clean-up that no longer knows the
    /// VMI's UID (the VMI is gone, no domain was left) still stops them.
    uids: Mutex<HashMap<String, String>>,
}

impl Proxies {
    pub(crate) fn target_port(&self, uid: &str) -> Option<u16> {
        lock(&self.targets).get(uid).map(|l| l.port)
    }

    pub(crate) fn set_target(&self, key: &str, uid: &str, listener: TargetListener) {
        lock(&self.uids).insert(key.to_string(), uid.to_string());
        lock(&self.targets).insert(uid.to_string(), listener);
    }

    pub(crate) fn source_target(&self, uid: &str) -> Option<std::net::SocketAddr> {
        lock(&self.sources).get(uid).map(|l| l.target)
    }

    pub(crate) fn set_source(&self, key: &str, uid: &str, listener: SourceListener) {
        lock(&self.uids).insert(key.to_string(), uid.to_string());
        lock(&self.sources).insert(uid.to_string(), listener);
    }

    pub(crate) fn stop_target(&self, uid: &str) {
        lock(&self.targets).remove(uid);
    }

    pub(crate) fn stop_source(&self, uid: &str) {
        lock(&self.sources).remove(uid);
    }

    /// Stops whatever runs for `key`'s VMI (by `uid`, or the UID recorded for `key`).
    pub(crate) fn forget(&self, key: &str, uid: &str) {
        let recorded = lock(&self.uids).remove(key);
        for uid in [Some(uid.to_string()), recorded].into_iter().flatten() {
            self.stop_target(&uid);
            self.stop_source(&uid);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Single inserts and removals: a poisoned map is consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(label: Option<&str>, state: serde_json::Value) -> VirtualMachineInstance {
        let mut labels = serde_json::Map::new();
        if let Some(node) = label {
            labels.insert(
                well_known::MIGRATION_TARGET_NODE_NAME_LABEL.into(),
                json!(node),
            );
        }
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "n", "labels": labels},
            "spec": {"domain": {"devices": {}}},
            "status": {"nodeName": "a", "migrationState": state},
        }))
        .unwrap()
    }

    #[test]
    fn both_roles_need_the_label_only_kubevirt_may_set() {
        let state = json!({"migrationUid": "m", "sourceNode": "a", "targetNode": "b",
                           "targetNodeAddress": "10.9.9.9", "targetDirectMigrationNodePorts": {"1": 49152}});
        assert!(matches!(
            role(&vmi(Some("b"), state.clone()), "a"),
            Ok(Some(Role::Source(_)))
        ));
        assert!(matches!(
            role(&vmi(Some("b"), state.clone()), "b"),
            Ok(Some(Role::Target(_)))
        ));
        // A status written by the VMI's owner alone moves nothing.
        assert_eq!(role(&vmi(None, state.clone()), "a").unwrap(), None);
        assert_eq!(role(&vmi(Some("c"), state.clone()), "a").unwrap(), None);
        // Over: the source only stops its proxy, whatever the label.
        let done = json!({"migrationUid": "m", "sourceNode": "a", "targetNode": "b",
                          "endTimestamp": "2026-12-05T10:00:00Z", "failed": true});
        assert!(matches!(
            role(&vmi(None, done), "a"),
            Ok(Some(Role::Source(_)))
        ));
        assert!(role(&vmi(None, json!({"completed": "no"})), "a").is_err());
    }
}
