//! What KubeVirt's admission would decide about a new VMI, in a deployment without virt-api,
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
        // Refused as written.
        let efi = vmi(
            json!({"domain": {"devices": {}, "memory": {"guest": "64Mi"},
            "firmware": {"bootloader": {"efi": {}}}}}),
        );
        assert_eq!(
            refusal(&efi, &TemplateConfig::default()).unwrap().field,
            "spec.domain.firmware.bootloader.efi"
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
}
