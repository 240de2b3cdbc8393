//! `Status` of a domain: lifecycle state, its reason and guest information.

use crate::kubevirt::Extra;
use serde::{Deserialize, Serialize};

/// Lifecycle state strings (`api.LifeCycle`).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LifeCycle {
    /// The handler treats an empty state as a dead domain: never emit it.
    #[default]
    #[serde(rename = "")]
    Empty,
    NoState,
    Running,
    Blocked,
    Paused,
    /// Go's constant `Shutdown`; the string is `ShuttingDown`.
    ShuttingDown,
    Shutoff,
    Crashed,
    PMSuspended,
    /// Launcher unreachable: the handler skips the VMI.
    Unknown,
}

/// Why the domain is in its state (`api.StateChangeReason`); the union of the
/// reasons of every state, with KubeVirt's strings.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum StateChangeReason {
    #[default]
    #[serde(rename = "")]
    Empty,
    Unknown,
    User,
    Shutdown,
    Destroyed,
    Migrated,
    Crashed,
    Panicked,
    Saved,
    Failed,
    FromSnapshot,
    NonExistent,
    Migration,
    Save,
    Dump,
    IOError,
    Watchdog,
    ShuttingDown,
    Snapshot,
    StartingUp,
    Postcopy,
    PostcopyFailed,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct DomainStatus {
    #[serde(default)]
    pub status: LifeCycle,
    #[serde(default)]
    pub reason: StateChangeReason,
    /// Guest-agent interface data; `null` without an agent.
    #[serde(default)]
    pub interfaces: Option<Vec<InterfaceStatus>>,
    #[serde(rename = "OSInfo", default)]
    pub os_info: GuestOsInfo,
    #[serde(rename = "FSFreezeStatus", default)]
    pub fs_freeze_status: FsFreeze,
    #[serde(default)]
    pub guest_panic_info: Option<GuestPanicInfo>,
    #[serde(default)]
    pub panic_count: i64,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct InterfaceStatus {
    #[serde(default)]
    pub mac: String,
    #[serde(default)]
    pub ip: String,
    #[serde(rename = "IPs", default)]
    pub ips: Option<Vec<String>>,
    #[serde(default)]
    pub interface_name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct GuestOsInfo {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_release: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pretty_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
}

/// Filesystem freeze state: `""`, `frozen` or `thawed`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct FsFreeze {
    #[serde(rename = "Status", default)]
    pub status: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct GuestPanicInfo {
    #[serde(rename = "Type", default)]
    pub panic_type: String,
    #[serde(default)]
    pub arg1: u64,
    #[serde(default)]
    pub arg2: u64,
    #[serde(default)]
    pub arg3: u64,
    #[serde(default)]
    pub arg4: u64,
    #[serde(default)]
    pub arg5: u64,
}
