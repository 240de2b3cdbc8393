//! What KubeVirt's admission would decide about a new VMI, in a deployment without virt-api:
//! what the feature gates forbid (`hostDisk` without `HostDisk`, with KubeVirt's message),
//! plus what this project adds: a VMI its launcher cannot run is refused before any pod
//! exists (`proto::contract::runnable`).
//!
//! The launcher receives the VMI as stored: with the webhook's defaults when the VM controller
//! created it, as written when someone created it directly. Both must run, so both are checked.

use crate::template::TemplateConfig;
use proto::contract::runnable::{self, Refusal};
use proto::kubevirt::VirtualMachineInstance;

/// Why this project's launcher cannot run `vmi`, if it cannot: the first of [`refusals`].
pub fn refusal(vmi: &VirtualMachineInstance, config: &TemplateConfig) -> Option<Refusal> {
    let Refusals { gates, runnable } = refusals(vmi, config);
    gates.into_iter().next().or(runnable)
}

/// Everything admission holds against a VMI.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Refusals {
    /// KubeVirt's own rules for gated features, every one, with KubeVirt's messages
    /// (`proto::contract::feature_gates::refusals`).
    pub gates: Vec<Refusal>,
    /// The first thing this project's launcher cannot run, in the VMI as stored or once
    /// defaulted (`proto::contract::runnable`).
    pub runnable: Option<Refusal>,
}

impl Refusals {
    pub fn is_empty(&self) -> bool {
        self.gates.is_empty() && self.runnable.is_none()
    }
}

/// Every reason admission refuses `vmi`: what the configuration's feature gates forbid and
/// what the launcher cannot run. virt-api's validating webhook answers with all of them;
/// the controller acts on the first.
pub fn refusals(vmi: &VirtualMachineInstance, config: &TemplateConfig) -> Refusals {
    let gates = proto::contract::feature_gates::refusals(vmi, &config.feature_gates);
    let runnable = runnable::check(vmi).err().or_else(|| {
        let mut defaulted = vmi.clone();
        crate::defaults::apply_vmi(&mut defaulted, config);
        runnable::check(&defaulted).err()
    });
    Refusals { gates, runnable }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(spec: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "n"},
            "spec": spec,
        }))
        .expect("a VMI")
    }

    fn kernel_boot() -> serde_json::Value {
        json!({"kernelBoot": {"container": {"image": "k", "kernelPath": "/vmlinuz"}}})
    }

    #[test]
    fn the_stored_vmi_and_its_defaulted_form_must_both_run() {
        let runs = vmi(
            json!({"domain": {"devices": {}, "memory": {"guest": "64Mi"},
            "firmware": kernel_boot()}}),
        );
        assert_eq!(refusal(&runs, &TemplateConfig::default()), None);
        // Refused as written: EFI with Secure Boot (on unless turned off).
        let efi = vmi(
            json!({"domain": {"devices": {}, "memory": {"guest": "64Mi"},
            "firmware": {"bootloader": {"efi": {}}}}}),
        );
        assert_eq!(
            refusal(&efi, &TemplateConfig::default()).unwrap().field,
            "spec.domain.firmware.bootloader.efi.secureBoot"
        );
        // Runs as written, refused once defaulted: the cluster's CPU model is a named one.
        let config = TemplateConfig {
            cpu_model: Some("Haswell".into()),
            ..TemplateConfig::default()
        };
        assert_eq!(
            refusal(&runs, &config).unwrap().field,
            "spec.domain.cpu.model"
        );
    }

    /// The security review's probe: a hostDisk in a node directory, refused without the gate.
    #[test]
    fn host_disks_need_the_host_disk_gate() {
        let probe = vmi(json!({
            "domain": {"devices": {"disks": [{"name": "root"}, {"name": "probe"}]},
                       "memory": {"guest": "64Mi"}, "firmware": kernel_boot()},
            "volumes": [
                {"name": "root", "containerDisk": {"image": "disk"}},
                {"name": "probe", "hostDisk": {"path": "/etc/kubevirt-probe/disk.img",
                                                "type": "DiskOrCreate", "capacity": "1Gi"}},
            ],
        }));
        let refused = refusal(&probe, &TemplateConfig::default()).unwrap();
        assert_eq!(
            (refused.field.as_str(), refused.reason.as_str()),
            ("spec.volumes[1]", "HostDisk feature gate is not enabled")
        );
        let gated = TemplateConfig {
            feature_gates: proto::contract::feature_gates::FeatureGates::parse("HostDisk"),
            ..TemplateConfig::default()
        };
        assert_eq!(refusal(&probe, &gated), None);
    }
}
