//! KubeVirt's feature gates that decide what a VMI may ask for, and the admission rules
//! behind them (`pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go`).
//!
//! KubeVirt reads the gates from the `KubeVirt` CR's `developerConfiguration.featureGates`;
//! until this project serves that CR, the components take them as a flag
//! (`--feature-gates HostDisk,Root`). Off by default, as in KubeVirt: a VMI asking for a
//! gated feature is refused when it is admitted, before any pod exists.

use std::collections::BTreeSet;

use super::runnable::Refusal;
use crate::kubevirt::{VirtualMachineInstance, quantity};

/// `hostDisk` volumes: a file on the node, in a `hostPath` of its directory (alpha in
/// KubeVirt, off by default: the pod gets write access to a node directory).
pub const HOST_DISK: &str = "HostDisk";
/// Launcher pods run as root.
pub const ROOT: &str = "Root";

/// The gates that are on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates(BTreeSet<String>);

impl FeatureGates {
    /// A comma-separated list of gate names (`HostDisk,Root`); blanks are ignored.
    pub fn parse(list: &str) -> FeatureGates {
        FeatureGates(
            list.split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect(),
        )
    }

    pub fn enabled(&self, gate: &str) -> bool {
        self.0.contains(gate)
    }

    pub fn enable(&mut self, gate: &str) {
        self.0.insert(gate.to_string());
    }
}

impl std::str::FromStr for FeatureGates {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(FeatureGates::parse(s))
    }
}

/// The first reason the gates, or KubeVirt's rules for a gated feature, refuse `vmi`.
pub fn check(vmi: &VirtualMachineInstance, gates: &FeatureGates) -> Result<(), Refusal> {
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        let Some(host_disk) = &volume.host_disk else {
            continue;
        };
        let field = format!("spec.volumes[{i}]");
        if !gates.enabled(HOST_DISK) {
            return Err(Refusal::new(
                field,
                format!("{HOST_DISK} feature gate is not enabled"),
            ));
        }
        let field = format!("{field}.hostDisk");
        if host_disk.path.is_empty() {
            return Err(Refusal::new(
                format!("{field}.path"),
                format!("{field}.path is required for hostDisk volume"),
            ));
        }
        // The pod mounts the file's directory as a hostPath: an absolute path, and not the
        // node's root.
        let path = std::path::Path::new(&host_disk.path);
        if !path.is_absolute() || path.parent().is_none_or(|p| p == std::path::Path::new("/")) {
            return Err(Refusal::new(
                format!("{field}.path"),
                format!(
                    "{:?} must be an absolute path to a file below a directory other than /",
                    host_disk.path
                ),
            ));
        }
        let capacity = host_disk
            .capacity
            .as_ref()
            .map(quantity::to_bytes)
            .transpose()
            .map_err(|e| Refusal::new(format!("{field}.capacity"), e.to_string()))?
            .unwrap_or(0);
        match host_disk.disk_type.as_str() {
            "Disk" if capacity != 0 => {
                return Err(Refusal::new(
                    format!("{field}.capacity"),
                    format!(
                        "{field}.capacity is allowed to pass only with {field}.type equal to 'DiskOrCreate'"
                    ),
                ));
            }
            "Disk" | "DiskOrCreate" => {}
            other => {
                return Err(Refusal::new(
                    format!("{field}.type"),
                    format!(
                        "{field}.type has invalid value '{other}', allowed are 'Disk' or 'DiskOrCreate'"
                    ),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_disk(disk: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "v"},
            "spec": {"domain": {"devices": {}}, "volumes": [
                {"name": "root", "containerDisk": {"image": "x"}},
                {"name": "host", "hostDisk": disk},
            ]},
        }))
        .unwrap()
    }

    #[test]
    fn host_disks_need_the_gate_then_kubevirts_rules() {
        let probe = host_disk(serde_json::json!(
            {"path": "/etc/kubevirt-probe/disk.img", "type": "DiskOrCreate", "capacity": "1Gi"}
        ));
        let off = check(&probe, &FeatureGates::default()).unwrap_err();
        assert_eq!(off.field, "spec.volumes[1]");
        assert_eq!(off.reason, "HostDisk feature gate is not enabled");
        let on = FeatureGates::parse("Root, HostDisk");
        assert!(on.enabled(ROOT));
        assert_eq!(check(&probe, &on), Ok(()));
        for (disk, field) in [
            (
                serde_json::json!({"path": "", "type": "Disk"}),
                "spec.volumes[1].hostDisk.path",
            ),
            (
                serde_json::json!({"path": "disk.img", "type": "Disk"}),
                "spec.volumes[1].hostDisk.path",
            ),
            (
                serde_json::json!({"path": "/disk.img", "type": "Disk"}),
                "spec.volumes[1].hostDisk.path",
            ),
            (
                serde_json::json!({"path": "/d/disk.img", "type": "Disk", "capacity": "1Gi"}),
                "spec.volumes[1].hostDisk.capacity",
            ),
            (
                serde_json::json!({"path": "/d/disk.img", "type": "Block"}),
                "spec.volumes[1].hostDisk.type",
            ),
        ] {
            assert_eq!(
                check(&host_disk(disk.clone()), &on).unwrap_err().field,
                field,
                "{disk}"
            );
        }
    }
}
