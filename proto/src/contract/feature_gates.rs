//! KubeVirt's feature gates that decide what a VMI may ask for, and the admission rules
//! behind them (`pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go`).
//!
//! KubeVirt reads the gates from the `KubeVirt` CR's `developerConfiguration.featureGates`
//! and `disabledFeatureGates`; so does virt-controller here (`controller::kubevirt_cr`), over
//! its `--feature-gates` flag, which standalone mode also takes. Whether a gate is on follows
//! KubeVirt's `featuregate.IsEnabled`: GA gates always, a listed gate, else a beta gate unless
//! disabled. A VMI asking for a feature whose gate is off is refused when it is admitted,
//! before any pod exists.

use std::collections::BTreeSet;

use super::runnable::Refusal;
use crate::kubevirt::{VirtualMachineInstance, quantity};

/// `hostDisk` volumes: a file on the node, in a `hostPath` of its directory (alpha in
/// KubeVirt, off by default: the pod gets write access to a node directory).
pub const HOST_DISK: &str = "HostDisk";
/// Launcher pods run as root.
pub const ROOT: &str = "Root";
/// `spec.domain.devices.autoattachVSOCK` (alpha).
pub const VSOCK: &str = "VSOCK";
/// `spec.domain.memory.reservedOverhead` (alpha).
pub const RESERVED_OVERHEAD_MEMLOCK: &str = "ReservedOverheadMemlock";
/// `spec.domain.rebootPolicy` (beta).
pub const REBOOT_POLICY: &str = "RebootPolicy";
/// The `kubevirt.io/ignitiondata` annotation (alpha).
pub const IGNITION: &str = "ExperimentalIgnitionSupport";
/// containerDisks and kernel-boot images as Kubernetes image volumes (beta).
pub const IMAGE_VOLUME: &str = "ImageVolume";
/// Launcher flags, each named by its gate.
pub const LIBVIRT_HOOKS_SERVER_AND_CLIENT: &str = "LibvirtHooksServerAndClient";
pub const POD_SECONDARY_INTERFACE_NAMING_UPGRADE: &str = "PodSecondaryInterfaceNamingUpgrade";
pub const VGPU_LIVE_MIGRATION: &str = "VGPULiveMigration";
pub const VM_STATS_COLLECTOR: &str = "VMStatsCollector";
pub const FIRMWARE_AUTO_SELECTION: &str = "FirmwareAutoSelection";
/// The memory overhead as a pod annotation and in the VMI's status (beta).
pub const VMI_MEMORY_OVERHEAD_REPORT: &str = "VmiMemoryOverheadReport";

/// v1.9.0's beta gates: on unless disabled (`featuregate/active.go`).
pub const BETA: &[&str] = &[
    LIBVIRT_HOOKS_SERVER_AND_CLIENT,
    IMAGE_VOLUME,
    "Snapshot",
    "WorkloadEncryptionSEV",
    "KubevirtSeccompProfile",
    "NodeRestriction",
    "GPUsWithDRA",
    "HostDevicesWithDRA",
    "DeclarativeHotplugVolumes",
    "PasstBinding",
    POD_SECONDARY_INTERFACE_NAMING_UPGRADE,
    "ExternalNetResourceInjection",
    REBOOT_POLICY,
    "Template",
    VMI_MEMORY_OVERHEAD_REPORT,
    "OptOutRoleAggregation",
];

/// v1.9.0's GA gates: always on (`featuregate/inactive.go`).
pub const GA: &[&str] = &[
    "LiveMigration",
    "SRIOVLiveMigration",
    "NonRoot",
    "PSA",
    "CPUNodeDiscovery",
    "NUMA",
    "CommonInstancetypesDeploymentGate",
    "GPU",
    "HotplugNICs",
    "BochsDisplayForEFIGuests",
    "VMLiveUpdateFeatures",
    "NetworkBindingPlugins",
    "DynamicPodInterfaceNaming",
    "VolumesUpdateStrategy",
    "VolumeMigration",
    "DisableCustomSELinuxPolicy",
    "AutoResourceLimitsGate",
    "ClusterProfiler",
    "VMPersistentState",
    "VMExport",
    "PersistentReservation",
    "InstancetypeReferencePolicy",
    "EnableVirtioFsConfigVolumes",
    "ExpandDisks",
    "PanicDevices",
    "LiveUpdateNADRef",
    "VideoConfig",
    "SecureExecution",
    "MigrationPriorityQueue",
];

/// The gates as a cluster configures them: the ones listed as enabled and as disabled.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeSet<String>,
    disabled: BTreeSet<String>,
}

impl FeatureGates {
    /// A comma-separated list of enabled gates (`HostDisk,Root`); blanks are ignored.
    pub fn parse(list: &str) -> FeatureGates {
        FeatureGates {
            enabled: list
                .split(',')
                .map(str::trim)
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect(),
            disabled: BTreeSet::new(),
        }
    }

    /// `developerConfiguration.featureGates` and `disabledFeatureGates`.
    pub fn from_lists(enabled: &[String], disabled: &[String]) -> FeatureGates {
        FeatureGates {
            enabled: enabled.iter().cloned().collect(),
            disabled: disabled.iter().cloned().collect(),
        }
    }

    /// Whether `gate` is on, as KubeVirt's `featuregate.IsEnabled` decides: GA, else listed
    /// as enabled, else not listed as disabled and beta.
    pub fn enabled(&self, gate: &str) -> bool {
        GA.contains(&gate)
            || self.enabled.contains(gate)
            || (!self.disabled.contains(gate) && BETA.contains(&gate))
    }

    pub fn enable(&mut self, gate: &str) {
        self.enabled.insert(gate.to_string());
    }

    /// The gates listed as enabled.
    pub fn listed(&self) -> impl Iterator<Item = &str> {
        self.enabled.iter().map(String::as_str)
    }

    /// A gate listed both as enabled and as disabled (KubeVirt's operator refuses that).
    pub fn contradiction(&self) -> Option<&str> {
        self.enabled
            .intersection(&self.disabled)
            .next()
            .map(String::as_str)
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
    match refusals(vmi, gates).into_iter().next() {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

/// Every reason the gates, or KubeVirt's rules for a gated feature, refuse `vmi`, in the
/// order KubeVirt's admission lists them (its webhook answers with all of them as status
/// causes). Each reason is KubeVirt's message, the field its cause's field.
pub fn refusals(vmi: &VirtualMachineInstance, gates: &FeatureGates) -> Vec<Refusal> {
    let mut refused = Vec::new();
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        let Some(host_disk) = &volume.host_disk else {
            continue;
        };
        let field = format!("spec.volumes[{i}]");
        if !gates.enabled(HOST_DISK) {
            refused.push(Refusal::new(
                field.clone(),
                format!("{HOST_DISK} feature gate is not enabled"),
            ));
        }
        let field = format!("{field}.hostDisk");
        // The pod mounts the file's directory as a hostPath: an absolute path, and not the
        // node's root.
        let path = std::path::Path::new(&host_disk.path);
        if host_disk.path.is_empty() {
            refused.push(Refusal::new(
                format!("{field}.path"),
                format!("{field}.path is required for hostDisk volume"),
            ));
        } else if !path.is_absolute()
            || path.parent().is_none_or(|p| p == std::path::Path::new("/"))
        {
            refused.push(Refusal::new(
                format!("{field}.path"),
                format!(
                    "{:?} must be an absolute path to a file below a directory other than /",
                    host_disk.path
                ),
            ));
        }
        let capacity = match host_disk
            .capacity
            .as_ref()
            .map(quantity::to_bytes)
            .transpose()
        {
            Ok(bytes) => bytes.unwrap_or(0),
            Err(e) => {
                refused.push(Refusal::new(format!("{field}.capacity"), e.to_string()));
                0
            }
        };
        match host_disk.disk_type.as_str() {
            "Disk" if capacity != 0 => refused.push(Refusal::new(
                format!("{field}.capacity"),
                format!(
                    "{field}.capacity is allowed to pass only with {field}.type equal to 'DiskOrCreate'"
                ),
            )),
            "Disk" | "DiskOrCreate" => {}
            other => refused.push(Refusal::new(
                format!("{field}.type"),
                format!(
                    "{field}.type has invalid value '{other}', allowed are 'Disk' or 'DiskOrCreate'"
                ),
            )),
        }
    }
    let domain = &vmi.spec.domain;
    if domain.devices.autoattach_vsock == Some(true) && !gates.enabled(VSOCK) {
        refused.push(Refusal::new(
            "spec.domain.devices.autoattachVSOCK",
            format!("{VSOCK} feature gate is not enabled in kubevirt-config"),
        ));
    }
    if domain
        .memory
        .as_ref()
        .and_then(|m| m.extra.get("reservedOverhead"))
        .is_some_and(|r| !r.is_null())
        && !gates.enabled(RESERVED_OVERHEAD_MEMLOCK)
    {
        refused.push(Refusal::new(
            "spec.domain.memory.reservedOverhead",
            "Reserved overhead memlock feature gate is not enabled in kubevirt-config",
        ));
    }
    if domain
        .extra
        .get("rebootPolicy")
        .is_some_and(|r| !r.is_null())
        && !gates.enabled(REBOOT_POLICY)
    {
        refused.push(Refusal::new(
            "spec.domain.rebootPolicy",
            format!(
                "RebootPolicy is specified but the {REBOOT_POLICY} feature gate is not enabled"
            ),
        ));
    }
    let ignition = vmi
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(IGNITION_ANNOTATION))
        .is_some_and(|v| !v.is_empty());
    if ignition && !gates.enabled(IGNITION) {
        refused.push(Refusal::new(
            "metadata.annotations",
            format!(
                "{IGNITION} feature gate is not enabled in kubevirt-config, invalid entry metadata.annotations.{IGNITION_ANNOTATION}"
            ),
        ));
    }
    refused
}

/// `v1.IgnitionAnnotation`.
const IGNITION_ANNOTATION: &str = "kubevirt.io/ignitiondata";

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

    /// KubeVirt answers with every cause: here the gate, then the path of the same volume.
    #[test]
    fn every_refusal_is_listed() {
        let vmi = host_disk(serde_json::json!({"path": "", "type": "Disk"}));
        let fields: Vec<String> = refusals(&vmi, &FeatureGates::default())
            .into_iter()
            .map(|r| r.field)
            .collect();
        assert_eq!(
            fields,
            ["spec.volumes[1]", "spec.volumes[1].hostDisk.path"],
            "{fields:?}"
        );
        assert!(
            refusals(
                &host_disk(serde_json::json!({"path": "/d/x", "type": "Disk"})),
                &FeatureGates::parse("HostDisk")
            )
            .is_empty()
        );
    }

    #[test]
    fn gates_are_on_as_kubevirt_decides() {
        let none = FeatureGates::default();
        assert!(!none.enabled(HOST_DISK), "alpha: off unless listed");
        assert!(none.enabled(IMAGE_VOLUME), "beta: on unless disabled");
        assert!(none.enabled("GPU"), "GA: always on");
        let listed = FeatureGates::from_lists(
            &["HostDisk".into(), "GPU".into()],
            &["ImageVolume".into(), "GPU".into()],
        );
        assert!(listed.enabled(HOST_DISK));
        assert!(!listed.enabled(IMAGE_VOLUME));
        assert!(listed.enabled("GPU"), "a GA gate cannot be disabled");
        assert_eq!(listed.contradiction(), Some("GPU"));
        assert_eq!(none.contradiction(), None);
        // Listed beats disabled, as in KubeVirt.
        assert!(FeatureGates::from_lists(&["Root".into()], &["Root".into()]).enabled(ROOT));
    }

    #[test]
    fn gated_vmi_fields_are_refused_without_their_gate() {
        let vmi = |patch: serde_json::Value| -> VirtualMachineInstance {
            let mut v = serde_json::json!({
                "metadata": {"name": "v"},
                "spec": {"domain": {"devices": {}, "memory": {"guest": "64Mi"}}},
            });
            json_patch(&mut v, &patch);
            serde_json::from_value(v).unwrap()
        };
        for (patch, gate, field) in [
            (
                serde_json::json!({"spec": {"domain": {"devices": {"autoattachVSOCK": true}}}}),
                VSOCK,
                "spec.domain.devices.autoattachVSOCK",
            ),
            (
                serde_json::json!({"spec": {"domain": {"memory": {"reservedOverhead": {"addedOverhead": "1Gi"}}}}}),
                RESERVED_OVERHEAD_MEMLOCK,
                "spec.domain.memory.reservedOverhead",
            ),
            (
                serde_json::json!({"metadata": {"annotations": {"kubevirt.io/ignitiondata": "{}"}}}),
                IGNITION,
                "metadata.annotations",
            ),
        ] {
            let v = vmi(patch);
            assert_eq!(
                check(&v, &FeatureGates::default()).unwrap_err().field,
                field
            );
            assert_eq!(check(&v, &FeatureGates::parse(gate)), Ok(()), "{gate}");
        }
        // RebootPolicy is beta: refused only when disabled.
        let reboot = vmi(serde_json::json!({"spec": {"domain": {"rebootPolicy": "Terminate"}}}));
        assert_eq!(check(&reboot, &FeatureGates::default()), Ok(()));
        let disabled = FeatureGates::from_lists(&[], &[REBOOT_POLICY.into()]);
        assert_eq!(
            check(&reboot, &disabled).unwrap_err().field,
            "spec.domain.rebootPolicy"
        );
    }

    fn json_patch(target: &mut serde_json::Value, patch: &serde_json::Value) {
        match (target, patch) {
            (serde_json::Value::Object(t), serde_json::Value::Object(p)) => {
                for (k, v) in p {
                    json_patch(t.entry(k.clone()).or_insert(serde_json::Value::Null), v);
                }
            }
            (t, p) => *t = p.clone(),
        }
    }
}
