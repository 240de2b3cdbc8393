//! Live migration's API objects (KubeVirt v1.9.0's
//! `staging/src/kubevirt.io/api/core/v1/types.go`):
//!
//! - `status.migrationState` of a VMI ([`MigrationState`], Go's
//!   `VirtualMachineInstanceMigrationState`): written by the migration controller (the
//!   hand-off) and by both nodes' handlers. Every key is optional and left out when empty,
//!   as Go's `omitempty` has it; keys this type does not know are kept.
//! - [`VirtualMachineInstanceMigration`] (`vmim`): the request to move one VMI, and how far
//!   it got.

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

use super::{Condition, Extra, Time, VirtualMachineInstance};

/// `spec` of a `VirtualMachineInstanceMigration`.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstanceMigration",
    plural = "virtualmachineinstancemigrations",
    singular = "virtualmachineinstancemigration",
    shortname = "vmim",
    shortname = "vmims",
    category = "all",
    namespaced,
    status = "VirtualMachineInstanceMigrationStatus",
    schema = "manual",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase","description":"The current phase of VM instance migration"}"#,
    printcolumn = r#"{"name":"VMI","type":"string","jsonPath":".spec.vmiName","description":"The name of the VMI to perform the migration on"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationSpec {
    /// The VMI to move, in the migration's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vmi_name: Option<String>,
    /// Restricts the target nodes further (the VMI's own selector wins on a clash).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added_node_selector: Option<BTreeMap<String, String>>,
    /// `system-critical`, `user-triggered` or `system-maintenance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<String>,
    /// The decentralized kind's (`sendTo`, `receive`): kept, not served.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `VirtualMachineInstanceMigrationPhase`.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum MigrationPhase {
    #[default]
    #[serde(rename = "")]
    Unset,
    Pending,
    Scheduling,
    Scheduled,
    PreparingTarget,
    TargetReady,
    Running,
    Succeeded,
    Failed,
    WaitingForSync,
    Synchronizing,
}

impl MigrationPhase {
    pub fn is_final(self) -> bool {
        matches!(self, MigrationPhase::Succeeded | MigrationPhase::Failed)
    }
}

/// `status` of a `VirtualMachineInstanceMigration`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceMigrationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<MigrationPhase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<MigrationPhaseTransition>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The VMI's migration state, copied once the migration is over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<MigrationState>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigrationPhaseTransition {
    pub phase: MigrationPhase,
    pub phase_transition_timestamp: Time,
}

impl VirtualMachineInstanceMigration {
    pub fn phase(&self) -> MigrationPhase {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or_default()
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MigrationState {
    /// The `VirtualMachineInstanceMigration`'s UID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_uid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pod: Option<String>,
    /// The target handler's migration address and its listeners' ports, by the port they
    /// stand for (`"49152"`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node_address: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_direct_migration_node_ports: Option<std::collections::BTreeMap<String, i32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node_domain_detected: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node_domain_ready_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_timestamp: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_requested: Option<bool>,
    /// `Aborting`, `Succeeded` or `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_status: Option<String>,
    /// `PreCopy`, `PostCopy` or `Paused`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The resolved migration configuration (`MigrationConfiguration`, camelCase keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_configuration: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl MigrationState {
    pub fn is_completed(&self) -> bool {
        self.completed == Some(true)
    }

    pub fn is_failed(&self) -> bool {
        self.failed == Some(true)
    }

    /// `isMigrationDone`: ended, one way or the other.
    pub fn is_done(&self) -> bool {
        self.end_timestamp.is_some() && (self.is_completed() || self.is_failed())
    }
}

/// Errors reading `status.migrationState`.
#[derive(Debug, thiserror::Error)]
#[error("status.migrationState is malformed: {0}")]
pub struct MalformedMigrationState(#[from] serde_json::Error);

impl VirtualMachineInstance {
    /// `status.migrationState`, typed; `Ok(None)` when there is none.
    pub fn migration_state(&self) -> Result<Option<MigrationState>, MalformedMigrationState> {
        match self
            .status
            .as_ref()
            .and_then(|s| s.migration_state.as_ref())
        {
            None | Some(Value::Null) => Ok(None),
            Some(v) => Ok(Some(MigrationState::deserialize(v)?)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_kubevirts_keys_and_keeps_unknown_ones() {
        let json = serde_json::json!({
            "migrationUid": "m1", "sourceNode": "a", "targetNode": "b",
            "targetNodeAddress": "10.0.0.2",
            "targetDirectMigrationNodePorts": {"41234": 49152},
            "startTimestamp": "2026-12-05T10:00:00Z",
            "completed": true, "endTimestamp": "2026-12-05T10:00:01Z",
            "targetState": {"domainName": "x"}
        });
        let state: MigrationState = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(state.migration_uid.as_deref(), Some("m1"));
        assert!(state.is_done() && state.is_completed() && !state.is_failed());
        assert_eq!(
            state.target_direct_migration_node_ports.as_ref().unwrap()["41234"],
            49152
        );
        assert_eq!(serde_json::to_value(&state).unwrap(), json);
        assert!(
            serde_json::from_value::<MigrationState>(serde_json::json!({"completed": "yes"}))
                .is_err()
        );
    }
}
