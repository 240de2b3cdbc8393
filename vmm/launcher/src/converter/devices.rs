//! Devices this launcher cannot provide are refused up front; the RNG.

use super::{ConvertError, Result};
use proto::domain::{Devices, Rng, RngBackend};
use proto::kubevirt::VirtualMachineInstance;

/// `spec.domain.devices` keys that ask for hardware the VMM does not emulate.
const UNSUPPORTED_DEVICES: &[&str] = &[
    "gpus",
    "hostDevices",
    "filesystems",
    "watchdog",
    "tpm",
    "sound",
    "inputs",
    "clientPassthrough",
    "downwardMetrics",
    "video",
    "panicDevices",
];

pub(crate) fn refuse_unsupported(vmi: &VirtualMachineInstance) -> Result<()> {
    let devices = &vmi.spec.domain.devices;
    for key in UNSUPPORTED_DEVICES {
        if let Some(value) = devices.extra.get(*key) {
            let empty = value.is_null() || value.as_array().is_some_and(|a| a.is_empty());
            if !empty {
                return Err(ConvertError::new(
                    format!("spec.domain.devices.{key}"),
                    "this device is not supported by this launcher",
                ));
            }
        }
    }
    if vmi
        .spec
        .domain
        .cpu
        .as_ref()
        .and_then(|c| c.dedicated_cpu_placement)
        == Some(true)
    {
        return Err(ConvertError::new(
            "spec.domain.cpu.dedicatedCpuPlacement",
            "CPU pinning is not supported by this launcher",
        ));
    }
    Ok(())
}

/// `devices.rng: {}` → a virtio RNG fed from the host's `/dev/urandom`.
pub(crate) fn configure_rng(vmi: &VirtualMachineInstance, devices: &mut Devices) {
    if vmi.spec.domain.devices.rng.is_some() {
        devices.rng = Some(Rng {
            model: "virtio-non-transitional".into(),
            backend: Some(RngBackend {
                model: "random".into(),
                source: "/dev/urandom".into(),
            }),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;

    #[test]
    fn rng_when_asked() {
        let mut d = Devices::default();
        configure_rng(&vmi("domain:\n  devices:\n    rng: {}"), &mut d);
        assert_eq!(d.rng.unwrap().backend.unwrap().source, "/dev/urandom");
        let mut d = Devices::default();
        configure_rng(&vmi("domain: {}"), &mut d);
        assert!(d.rng.is_none());
    }

    #[test]
    fn unsupported_hardware_is_named() {
        let err = refuse_unsupported(&vmi(
            "domain:\n  devices:\n    gpus:\n    - name: g\n      deviceName: x",
        ))
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.gpus");
        let err = refuse_unsupported(&vmi("domain:\n  cpu:\n    dedicatedCpuPlacement: true"))
            .unwrap_err();
        assert_eq!(err.field, "spec.domain.cpu.dedicatedCpuPlacement");
        assert!(refuse_unsupported(&vmi("domain:\n  devices:\n    gpus: []")).is_ok());
    }
}
