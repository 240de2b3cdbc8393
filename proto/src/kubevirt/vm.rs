//! `VirtualMachine`: a VM that outlives its runs; each run is a VMI.

use super::Extra;
use super::vmi::{Condition, VirtualMachineInstanceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachine",
    plural = "virtualmachines",
    singular = "virtualmachine",
    shortname = "vm",
    shortname = "vms",
    category = "all",
    namespaced,
    status = "VirtualMachineStatus",
    schema = "manual",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Status","type":"string","jsonPath":".status.printableStatus"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type=='Ready')].status"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    /// Deprecated in favour of `runStrategy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<bool>,
    pub template: VirtualMachineInstanceTemplateSpec,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_volume_templates: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instancetype: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// When the VM controller keeps a VMI running.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RunStrategy {
    Always,
    RerunOnFailure,
    Halted,
    Manual,
    Once,
    WaitAsReceiver,
    #[serde(rename = "")]
    Unknown,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct VirtualMachineInstanceTemplateSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<VirtualMachineInstanceSpec>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl VirtualMachine {
    /// The condition of this type, if the status has it.
    pub fn condition(&self, condition_type: &str) -> Option<&Condition> {
        Condition::find(self.status.as_ref()?.conditions.as_slice(), condition_type)
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// `Stopped`, `Starting`, `Running`, `Paused`, `Stopping`, `CrashLoopBackOff`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub printable_status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub created: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub run_strategy: Option<RunStrategy>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desired_generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_failure: Option<Value>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub state_change_requests: Vec<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}
