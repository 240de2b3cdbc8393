//! What a VMI without `firmware.kernelBoot` boots: which disk, and as which firmware.
//!
//! KubeVirt hands the VMI's boot order to libvirt and the firmware (SeaBIOS, or OVMF for
//! `bootloader.efi`) boots the image's own boot loader. This project's launcher has no
//! firmware stage: it reads the boot disk and boots the entry the disk's boot loader
//! configuration chooses (`vmm/disk-boot`). The disk is chosen by KubeVirt's rules: the
//! disk with the lowest `bootOrder`, or without any `bootOrder` the first disk in spec
//! order. Written once here: the launcher boots it, admission (`runnable`) refuses what
//! cannot be a boot disk before a pod exists.

use super::runnable::Refusal;
use crate::kubevirt::VirtualMachineInstance;
use serde_json::Value;

/// The firmware a VMI asks for (`spec.domain.firmware.bootloader`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Firmware {
    /// SeaBIOS in KubeVirt, the default; `useSerial` sends its output to the serial port.
    Bios { use_serial: bool },
    /// OVMF in KubeVirt (`bootloader.efi`), without Secure Boot.
    Efi,
}

/// The chosen boot disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootDisk {
    /// The index into `spec.domain.devices.disks`.
    pub index: usize,
    /// The disk's (and its volume's) name.
    pub name: String,
}

/// `spec.domain.firmware.bootloader` as this launcher boots it. `efi` with Secure Boot (on
/// unless `secureBoot: false`, as in KubeVirt) is refused: no signature is checked here.
pub fn firmware(vmi: &VirtualMachineInstance) -> Result<Firmware, Refusal> {
    let field = "spec.domain.firmware.bootloader";
    let Some(loader) = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.bootloader.as_ref())
        .filter(|l| !l.is_null())
    else {
        return Ok(Firmware::Bios { use_serial: false });
    };
    let Some(map) = loader.as_object() else {
        return Err(Refusal::new(field, "must be an object (bios or efi)"));
    };
    let set = |v: &&Value| !v.is_null();
    match (map.get("bios").filter(set), map.get("efi").filter(set)) {
        (Some(_), Some(_)) => Err(Refusal::new(field, "bios and efi are exclusive")),
        (Some(bios), None) => Ok(Firmware::Bios {
            use_serial: bios.get("useSerial").and_then(Value::as_bool) == Some(true),
        }),
        (None, Some(efi)) => {
            if efi.get("secureBoot").and_then(Value::as_bool) != Some(false) {
                return Err(Refusal::new(
                    format!("{field}.efi.secureBoot"),
                    "Secure Boot is not supported: this launcher boots the disk's kernel without checking signatures; set secureBoot: false",
                ));
            }
            Ok(Firmware::Efi)
        }
        (None, None) => match map.keys().next() {
            Some(other) => Err(Refusal::new(
                format!("{field}.{other}"),
                "unknown boot loader (bios or efi)",
            )),
            None => Ok(Firmware::Bios { use_serial: false }),
        },
    }
}

/// The disk a VMI boots from: `None` when it boots a kernel directly.
pub fn choose(vmi: &VirtualMachineInstance) -> Result<Option<BootDisk>, Refusal> {
    if super::kernel_boot::container(vmi).is_some() {
        return Ok(None);
    }
    let disks = &vmi.spec.domain.devices.disks;
    let ordered = disks
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.boot_order.map(|order| (order, i)))
        .min();
    let index = match ordered {
        Some((_, index)) => index,
        None => {
            if let Some((i, _)) = vmi
                .spec
                .domain
                .devices
                .interfaces
                .iter()
                .enumerate()
                .find(|(_, iface)| iface.boot_order.is_some())
            {
                return Err(Refusal::new(
                    format!("spec.domain.devices.interfaces[{i}].bootOrder"),
                    "network (PXE) boot is not supported: give a disk a bootOrder, or boot a kernel",
                ));
            }
            if disks.is_empty() {
                return Err(Refusal::new(
                    "spec.domain.devices.disks",
                    "nothing to boot: the VMI has no disk and no firmware.kernelBoot",
                ));
            }
            0
        }
    };
    let disk = &disks[index];
    let field = format!("spec.domain.devices.disks[{index}]");
    if let Some(volume) = vmi.spec.volumes.iter().find(|v| v.name == disk.name) {
        let unbootable =
            if volume.cloud_init_no_cloud.is_some() || volume.cloud_init_config_drive.is_some() {
                Some("a cloud-init disk holds configuration, not a system")
            } else if volume.empty_disk.is_some() {
                Some("an empty disk has nothing to boot")
            } else {
                None
            };
        if let Some(reason) = unbootable {
            return Err(Refusal::new(
                field,
                format!("{:?} is the boot disk, but {reason}", disk.name),
            ));
        }
    }
    Ok(Some(BootDisk {
        index,
        name: disk.name.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(spec: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(serde_json::json!({"metadata": {"name": "v"}, "spec": spec}))
            .unwrap()
    }

    fn disks(devices: serde_json::Value, volumes: serde_json::Value) -> VirtualMachineInstance {
        vmi(serde_json::json!({"domain": {"devices": devices}, "volumes": volumes}))
    }

    #[test]
    fn the_lowest_boot_order_else_the_first_disk() {
        let volumes = serde_json::json!([
            {"name": "a", "containerDisk": {"image": "x"}},
            {"name": "b", "persistentVolumeClaim": {"claimName": "c"}},
            {"name": "c", "containerDisk": {"image": "y"}}
        ]);
        let first = disks(
            serde_json::json!({"disks": [{"name": "a"}, {"name": "b"}]}),
            volumes.clone(),
        );
        assert_eq!(
            choose(&first).unwrap().unwrap(),
            BootDisk {
                index: 0,
                name: "a".into()
            }
        );
        let ordered = disks(
            serde_json::json!({"disks": [{"name": "a"}, {"name": "b", "bootOrder": 3}, {"name": "c", "bootOrder": 2}]}),
            volumes,
        );
        assert_eq!(
            choose(&ordered).unwrap().unwrap(),
            BootDisk {
                index: 2,
                name: "c".into()
            }
        );
    }

    #[test]
    fn what_cannot_boot_is_refused_with_its_field() {
        let cloud_init = disks(
            serde_json::json!({"disks": [{"name": "ci"}, {"name": "root"}]}),
            serde_json::json!([{"name": "ci", "cloudInitNoCloud": {"userData": "x"}}, {"name": "root", "containerDisk": {"image": "x"}}]),
        );
        assert_eq!(
            choose(&cloud_init).unwrap_err().field,
            "spec.domain.devices.disks[0]"
        );
        let empty = disks(
            serde_json::json!({"disks": [{"name": "scratch", "bootOrder": 1}]}),
            serde_json::json!([{"name": "scratch", "emptyDisk": {"capacity": "1Gi"}}]),
        );
        assert!(choose(&empty).unwrap_err().reason.contains("empty disk"));
        let none = disks(serde_json::json!({}), serde_json::json!([]));
        assert_eq!(
            choose(&none).unwrap_err().field,
            "spec.domain.devices.disks"
        );
        let pxe = disks(
            serde_json::json!({"disks": [{"name": "a"}], "interfaces": [{"name": "default", "masquerade": {}, "bootOrder": 1}]}),
            serde_json::json!([{"name": "a", "containerDisk": {"image": "x"}}]),
        );
        assert_eq!(
            choose(&pxe).unwrap_err().field,
            "spec.domain.devices.interfaces[0].bootOrder"
        );
    }

    #[test]
    fn firmware_bios_by_default_efi_without_secure_boot() {
        let with = |loader: serde_json::Value| {
            firmware(&vmi(
                serde_json::json!({"domain": {"devices": {}, "firmware": {"bootloader": loader}}}),
            ))
        };
        assert_eq!(
            firmware(&vmi(serde_json::json!({"domain": {"devices": {}}}))),
            Ok(Firmware::Bios { use_serial: false })
        );
        assert_eq!(
            with(serde_json::json!({"bios": {"useSerial": true}})),
            Ok(Firmware::Bios { use_serial: true })
        );
        assert_eq!(
            with(serde_json::json!({"efi": {"secureBoot": false}})),
            Ok(Firmware::Efi)
        );
        assert_eq!(
            with(serde_json::json!({"efi": {}})).unwrap_err().field,
            "spec.domain.firmware.bootloader.efi.secureBoot"
        );
        assert_eq!(
            with(serde_json::json!({"efi": {"secureBoot": true, "persistent": true}}))
                .unwrap_err()
                .field,
            "spec.domain.firmware.bootloader.efi.secureBoot"
        );
        assert!(with(serde_json::json!({"bios": {}, "efi": {"secureBoot": false}})).is_err());
        assert!(with(serde_json::json!({"uboot": {}})).is_err());
    }
}
