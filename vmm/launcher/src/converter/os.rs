//! Machine type, firmware, boot (a kernel the VMI names, or its boot disk), SMBIOS and the
//! ACPI feature.
//!
//! As KubeVirt's `compute/os.go` and `compute/sysinfo.go`: the OS element carries the
//! kernel-boot artifacts when the VMI names them, `OS.SMBios` in `sysinfo` mode and the
//! `SysInfo` the SMBIOS tables are made of (the VMI's firmware UUID and serial, the cluster's
//! SMBIOS settings the handler sends, the VMI's chassis). A VMI without kernel boot boots its
//! disk: the VMM reads the boot disk's boot loader configuration instead of running
//! firmware, so an EFI VMI gets `Firmware: efi` and no loader or NVRAM file.

use super::{Context, ConvertError, Result};
use proto::domain::{Bios, DomainSpec, Empty, Features, Os, OsType, SmBios, SysInfo, SysInfoEntry};
use proto::kubevirt::VirtualMachineInstance;

/// The cluster's SMBIOS settings (`VirtualMachineOptions.VirtualMachineSMBios`, from the
/// `KubeVirt` CR; KubeVirt's defaults are manufacturer and family `KubeVirt`, product `None`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SmbiosSettings {
    pub manufacturer: String,
    pub product: String,
    pub version: String,
    pub sku: String,
    pub family: String,
}

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
    let firmware = proto::contract::boot_disk::firmware(vmi)
        .map_err(|r| ConvertError::new(r.field, r.reason))?;
    let (firmware_attr, bios) = match firmware {
        proto::contract::boot_disk::Firmware::Efi => ("efi".to_string(), None),
        proto::contract::boot_disk::Firmware::Bios { use_serial } => (
            String::new(),
            use_serial.then(|| Bios {
                use_serial: "yes".into(),
            }),
        ),
    };
    let mut os = Os {
        firmware: firmware_attr,
        r#type: OsType {
            os: "hvm".into(),
            arch: "x86_64".into(),
            machine,
        },
        smbios: Some(SmBios {
            mode: "sysinfo".into(),
        }),
        bios,
        ..Default::default()
    };
    match &ctx.kernel_boot {
        Some(kb) => {
            os.kernel = kb.kernel_link.to_string_lossy().into_owned();
            os.initrd = kb
                .initrd_link
                .as_ref()
                .map(|p| p.to_string_lossy().into_owned())
                .unwrap_or_default();
            os.kernel_args = kb.args.clone();
        }
        // The boot disk is the disk with the lowest boot order (the disks carry it), or the
        // first: checked here so that a VMI that cannot boot is refused by its field.
        None => {
            proto::contract::boot_disk::choose(vmi)
                .map_err(|r| ConvertError::new(r.field, r.reason))?;
        }
    }
    spec.os = Some(os);
    spec.sys_info = Some(sys_info(vmi, &spec.uuid, ctx.smbios.as_ref()));
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

/// KubeVirt's `SysInfoDomainConfigurator`: the system entries (UUID — the domain's, which is
/// the firmware UUID —, serial if set, then the cluster's settings) and the chassis.
fn sys_info(vmi: &VirtualMachineInstance, uuid: &str, smbios: Option<&SmbiosSettings>) -> SysInfo {
    let entry = |name: &str, value: &str| SysInfoEntry {
        name: name.into(),
        value: value.into(),
    };
    let mut system = vec![entry("uuid", uuid)];
    if let Some(serial) = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.serial.as_deref())
        .filter(|s| !s.is_empty())
    {
        system.push(entry("serial", serial));
    }
    if let Some(s) = smbios {
        system.extend([
            entry("manufacturer", &s.manufacturer),
            entry("family", &s.family),
            entry("product", &s.product),
            entry("sku", &s.sku),
            entry("version", &s.version),
        ]);
    }
    let chassis = vmi
        .spec
        .domain
        .extra
        .get("chassis")
        .filter(|c| !c.is_null())
        .map(|c| {
            ["manufacturer", "version", "serial", "asset", "sku"]
                .into_iter()
                .map(|name| entry(name, c.get(name).and_then(|v| v.as_str()).unwrap_or("")))
                .collect()
        })
        .unwrap_or_default();
    SysInfo {
        r#type: "smbios".into(),
        system,
        chassis,
        ..Default::default()
    }
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
    fn without_kernel_boot_the_disk_boots_as_bios_or_efi() {
        let mut spec = DomainSpec::default();
        let disk = "domain:\n  devices:\n    disks:\n    - name: root\nvolumes:\n- name: root\n  containerDisk:\n    image: x";
        configure(&vmi(disk), &Context::default(), &mut spec).unwrap();
        let os = spec.os.clone().unwrap();
        assert!(os.kernel.is_empty() && os.firmware.is_empty() && os.bios.is_none());
        let efi = disk.replace(
            "domain:\n",
            "domain:\n  firmware:\n    bootloader:\n      efi:\n        secureBoot: false\n",
        );
        configure(&vmi(&efi), &Context::default(), &mut spec).unwrap();
        assert_eq!(spec.os.clone().unwrap().firmware, "efi");
        let serial = disk.replace(
            "domain:\n",
            "domain:\n  firmware:\n    bootloader:\n      bios:\n        useSerial: true\n",
        );
        configure(&vmi(&serial), &Context::default(), &mut spec).unwrap();
        assert_eq!(spec.os.unwrap().bios.unwrap().use_serial, "yes");
    }

    #[test]
    fn sysinfo_as_kubevirt_writes_it() {
        let mut spec = DomainSpec {
            uuid: "5f0b6a0a-2a8c-4d7e-8a1e-7c3d9f7b2e10".into(),
            ..Default::default()
        };
        let ctx = Context {
            smbios: Some(SmbiosSettings {
                manufacturer: "KubeVirt".into(),
                product: "None".into(),
                family: "KubeVirt".into(),
                ..Default::default()
            }),
            ..ctx()
        };
        configure(
            &vmi("domain:\n  firmware:\n    serial: s-1\n  chassis:\n    asset: a-9"),
            &ctx,
            &mut spec,
        )
        .unwrap();
        assert_eq!(spec.os.unwrap().smbios.unwrap().mode, "sysinfo");
        let info = spec.sys_info.unwrap();
        assert_eq!(info.r#type, "smbios");
        let names: Vec<(&str, &str)> = info
            .system
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("uuid", "5f0b6a0a-2a8c-4d7e-8a1e-7c3d9f7b2e10"),
                ("serial", "s-1"),
                ("manufacturer", "KubeVirt"),
                ("family", "KubeVirt"),
                ("product", "None"),
                ("sku", ""),
                ("version", "")
            ]
        );
        assert_eq!(info.chassis.len(), 5);
        assert_eq!(info.chassis[3].value, "a-9");
    }

    #[test]
    fn refusals_name_the_field() {
        let mut spec = DomainSpec::default();
        let err = configure(&vmi("domain: {}"), &Context::default(), &mut spec).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.disks");
        let err = configure(
            &vmi("domain:\n  firmware:\n    bootloader:\n      efi: {}"),
            &ctx(),
            &mut spec,
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.firmware.bootloader.efi.secureBoot");
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
