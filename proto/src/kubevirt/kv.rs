//! `KubeVirt`: the one install of KubeVirt in a cluster and its cluster-wide configuration
//! (`spec.configuration`, KubeVirt's `KubeVirtConfiguration`), with the install's progress in
//! `status` (`staging/src/kubevirt.io/api/core/v1/types.go`, v1.9.0).
//!
//! Only the fields this project reads or writes are modelled; every other one stays in an
//! `extra` map, so a status write never drops what someone else put there.

use super::vmi::Condition;
use super::{Extra, Quantity};
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The install (`spec`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "KubeVirt",
    plural = "kubevirts",
    singular = "kubevirt",
    shortname = "kv",
    shortname = "kvs",
    category = "all",
    namespaced,
    status = "KubeVirtStatus",
    schema = "manual",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtSpec {
    /// Pull policy of KubeVirt's own images (virt-controller, virt-handler, ...); launcher
    /// pods take `configuration.imagePullPolicy`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub configuration: Option<KubeVirtConfiguration>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeVirtConfiguration`: what every component reads.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_request: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub developer_configuration: Option<DeveloperConfiguration>,
    /// Pull policy of the launcher pods' containers.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(rename = "network", skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkConfiguration>,
    /// Deprecated: `architectureConfiguration.<arch>.ovmfPath`; wins over it when set.
    #[serde(rename = "ovmfPath", skip_serializing_if = "Option::is_none")]
    pub ovmf_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture_configuration: Option<ArchConfiguration>,
    /// `None`, `LiveMigrate`, `LiveMigrateIfPossible` or `External`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<String>,
    /// A float as a string (`"1.5"`), at least 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub additional_guest_memory_overhead_ratio: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_machine_options: Option<VirtualMachineOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hypervisors: Option<Vec<HypervisorConfiguration>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `DeveloperConfiguration`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DeveloperConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub feature_gates: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled_feature_gates: Option<Vec<String>>,
    /// `LessPVCSpaceToleration`, percent.
    #[serde(
        rename = "pvcTolerateLessSpaceUpToPercent",
        skip_serializing_if = "Option::is_none"
    )]
    pub less_pvc_space_toleration: Option<i64>,
    /// Percent; 100: the guest sees what the pod requests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_overcommit: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selectors: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_emulation: Option<bool>,
    #[serde(rename = "cpuAllocationRatio", skip_serializing_if = "Option::is_none")]
    pub cpu_allocation_ratio: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_verification: Option<DiskVerification>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_verbosity: Option<LogVerbosity>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiskVerification {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_limit: Option<Quantity>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct LogVerbosity {
    #[serde(rename = "virtLauncher", skip_serializing_if = "Option::is_none")]
    pub virt_launcher: Option<u32>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `NetworkConfiguration` (`spec.configuration.network`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkConfiguration {
    /// `bridge`, `masquerade` (or the removed `slirp`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_network_interface: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub permit_bridge_interface_on_pod_network: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `ArchConfiguration`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ArchConfiguration {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub amd64: Option<ArchSpecificConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub arm64: Option<ArchSpecificConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub s390x: Option<ArchSpecificConfiguration>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_architecture: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ArchSpecificConfiguration {
    #[serde(rename = "ovmfPath", skip_serializing_if = "Option::is_none")]
    pub ovmf_path: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineOptions {
    /// Present (`{}`): no `guest-console-log` container unless a VMI asks for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_serial_console_log: Option<serde_json::Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HypervisorConfiguration {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The install's progress (`KubeVirtStatus`), as virt-operator writes it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KubeVirtStatus {
    /// One of [`phase`]'s values; empty until an operator took the object on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub phase: String,
    /// `Available`, `Progressing`, `Degraded`, `Created`, `Synchronized`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_kube_virt_registry: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_kube_virt_version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_kube_virt_registry: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_kube_virt_version: Option<String>,
    /// The generation the components were last deployed for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_architecture: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `KubeVirtPhase` values.
pub mod phase {
    pub const DEPLOYING: &str = "Deploying";
    pub const DEPLOYED: &str = "Deployed";
    pub const DELETING: &str = "Deleting";
    pub const DELETED: &str = "Deleted";
}

/// `KubeVirtConditionType` values.
pub mod condition {
    pub const AVAILABLE: &str = "Available";
    pub const PROGRESSING: &str = "Progressing";
    pub const DEGRADED: &str = "Degraded";
    pub const CREATED: &str = "Created";
    pub const SYNCHRONIZED: &str = "Synchronized";
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A CR as users write it, with fields not modelled here, comes back unchanged.
    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let written = json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {
                "certificateRotateStrategy": {},
                "imagePullPolicy": "IfNotPresent",
                "workloadUpdateStrategy": {"workloadUpdateMethods": ["LiveMigrate"]},
                "configuration": {
                    "developerConfiguration": {
                        "featureGates": ["HostDisk"],
                        "cpuAllocationRatio": 5,
                        "memoryOvercommit": 150,
                        "logVerbosity": {"virtLauncher": 4, "virtHandler": 3},
                        "minimumClusterTSCFrequency": 1000
                    },
                    "additionalGuestMemoryOverheadRatio": "1.5",
                    "evictionStrategy": "LiveMigrate",
                    "imagePullPolicy": "Always",
                    "network": {"defaultNetworkInterface": "masquerade", "binding": {"x": {}}},
                    "architectureConfiguration": {"amd64": {"ovmfPath": "/o", "machineType": "q35"}},
                    "virtualMachineOptions": {"disableSerialConsoleLog": {}},
                    "smbios": {"family": "f"},
                    "migrations": {"bandwidthPerMigration": "64Mi"}
                }
            },
            "status": {
                "phase": "Deployed",
                "conditions": [{"type": "Available", "status": "True", "lastProbeTime": null,
                                "lastTransitionTime": null, "reason": "AllComponentsReady",
                                "message": "All components are ready."}],
                "observedGeneration": 3,
                "operatorVersion": "v1.9.0",
                "generations": [{"group": "apps", "resource": "daemonsets", "name": "virt-handler", "lastGeneration": 1}]
            }
        });
        let kv: KubeVirt = serde_json::from_value(written.clone()).unwrap();
        let config = kv.spec.configuration.as_ref().unwrap();
        let dev = config.developer_configuration.as_ref().unwrap();
        assert_eq!(
            dev.feature_gates.as_deref(),
            Some(&["HostDisk".to_string()][..])
        );
        assert_eq!(dev.cpu_allocation_ratio, Some(5));
        assert_eq!(dev.memory_overcommit, Some(150));
        assert_eq!(dev.log_verbosity.as_ref().unwrap().virt_launcher, Some(4));
        assert_eq!(
            config.additional_guest_memory_overhead_ratio.as_deref(),
            Some("1.5")
        );
        assert_eq!(kv.status.as_ref().unwrap().phase, phase::DEPLOYED);
        let mut back = serde_json::to_value(&kv).unwrap();
        // `null` times are dropped, which reads back the same.
        let conditions = &mut written.clone()["status"]["conditions"][0];
        conditions
            .as_object_mut()
            .unwrap()
            .retain(|_, v| !v.is_null());
        let mut expected = written;
        expected["status"]["conditions"][0] = conditions.clone();
        back["metadata"]
            .as_object_mut()
            .unwrap()
            .retain(|_, v| !v.is_null());
        assert_eq!(back, expected);
    }
}
