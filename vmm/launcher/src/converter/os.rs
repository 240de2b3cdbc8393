//! Machine type, firmware and direct kernel boot, and the ACPI feature.
//!
//! The VMM boots a kernel directly (Linux 64-bit boot protocol); it has no
//! BIOS or UEFI firmware, so a VMI must use `firmware.kernelBoot`.

use super::{Context, ConvertError, Result};
use proto::domain::{DomainSpec, Empty, Features, Os, OsType};
use proto::kubevirt::VirtualMachineInstance;

pub(crate) fn configure(
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    spec: &mut DomainSpec,
) -> Result<()> {
    let domain = &vmi.spec.domain;
    let machine = domain
        .machine
        .as_ref()
        .map(|m| m.machine_type.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "q35".into());
    if !(machine == "q35" || machine.starts_with("pc-q35")) {
        return Err(ConvertError::new(
            "spec.domain.machine.type",
            format!("{machine:?} is not supported: only q35"),
        ));
    }
    if let Some(arch) = vmi.spec.architecture.as_deref()
        && arch != "amd64"
        && !arch.is_empty()
    {
        return Err(ConvertError::new(
            "spec.architecture",
            format!("{arch:?} is not supported: only amd64"),
        ));
    }
    if let Some(loader) = domain.firmware.as_ref().and_then(|f| f.bootloader.as_ref()) {
        let which = loader
            .as_object()
            .and_then(|o| o.keys().next().cloned())
            .unwrap_or_default();
        return Err(ConvertError::new(
            format!("spec.domain.firmware.bootloader.{which}"),
            "firmware boot is not supported: use firmware.kernelBoot",
        ));
    }
    let Some(kb) = &ctx.kernel_boot else {
        return Err(ConvertError::new(
            "spec.domain.firmware.kernelBoot",
            "required: this launcher boots guests by direct kernel boot only (no BIOS or UEFI to boot a disk)",
        ));
    };
    spec.os = Some(Os {
        r#type: OsType {
            os: "hvm".into(),
            arch: "x86_64".into(),
            machine,
        },
        kernel: kb.kernel_link.to_string_lossy().into_owned(),
        initrd: kb
            .initrd_link
            .as_ref()
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or_default(),
        kernel_args: kb.args.clone(),
        ..Default::default()
    });
    // ACPI is on when the VMI enables it (the API server defaults it on).
    let acpi = domain
        .features
        .as_ref()
        .and_then(|f| f.acpi.as_ref())
        .is_some_and(|a| a.enabled != Some(false));
    if acpi {
        spec.features = Some(Features {
            acpi: Some(Empty {}),
            ..Default::default()
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;
    use crate::disks::KernelBoot;

    fn ctx() -> Context {
        Context {
            kernel_boot: Some(KernelBoot {
                kernel: "/var/run/kubevirt-kernel-boot/boot/vmlinuz".into(),
                initrd: None,
                kernel_link: "/var/run/kubevirt/container-disks/kernel-boot/vmlinuz".into(),
                initrd_link: None,
                args: "console=ttyS0".into(),
            }),
            ..Default::default()
        }
    }

    #[test]
    fn kernel_boot_and_acpi() {
        let mut spec = DomainSpec::default();
        configure(
            &vmi("domain:\n  features:\n    acpi: {}"),
            &ctx(),
            &mut spec,
        )
        .unwrap();
        let os = spec.os.unwrap();
        assert_eq!(os.r#type.machine, "q35");
        // The launcher view, as KubeVirt names it.
        assert_eq!(
            os.kernel,
            "/var/run/kubevirt/container-disks/kernel-boot/vmlinuz"
        );
        assert_eq!(os.kernel_args, "console=ttyS0");
        assert!(spec.features.unwrap().acpi.is_some());
    }

    #[test]
    fn refusals_name_the_field() {
        let mut spec = DomainSpec::default();
        let err = configure(&vmi("domain: {}"), &Context::default(), &mut spec).unwrap_err();
        assert_eq!(err.field, "spec.domain.firmware.kernelBoot");
        let err = configure(
            &vmi("domain:\n  firmware:\n    bootloader:\n      efi: {}"),
            &ctx(),
            &mut spec,
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.firmware.bootloader.efi");
        let err = configure(
            &vmi("domain:\n  machine:\n    type: pc-i440fx"),
            &ctx(),
            &mut spec,
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.machine.type");
        let err =
            configure(&vmi("architecture: arm64\ndomain: {}"), &ctx(), &mut spec).unwrap_err();
        assert_eq!(err.field, "spec.architecture");
    }
}
