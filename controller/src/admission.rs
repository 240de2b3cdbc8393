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

/// Why this project's launcher cannot run `vmi`, if it cannot.
pub fn refusal(vmi: &VirtualMachineInstance, config: &TemplateConfig) -> Option<Refusal> {
    if let Err(refusal) = proto::contract::feature_gates::check(vmi, &config.feature_gates) {
        return Some(refusal);
    }
    runnable::check(vmi).err().or_else(|| {
        let mut defaulted = vmi.clone();
        crate::defaults::apply_vmi(&mut defaulted, config);
        runnable::check(&defaulted).err()
    })
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
