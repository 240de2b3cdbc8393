//! `devices.disks[]` → domain disks on virtio, named `vda`, `vdb`, ...

use super::{Context, ConvertError, Result};
use proto::domain::{
    Alias, BackingStore, BackingStoreFormat, BootOrder, Devices, Disk, DiskDriver, DiskSource,
    DiskTarget, Empty,
};
use proto::kubevirt::VirtualMachineInstance;

pub(crate) fn configure(
    vmi: &VirtualMachineInstance,
    ctx: &Context,
    devices: &mut Devices,
) -> Result<()> {
    for (i, disk) in vmi.spec.domain.devices.disks.iter().enumerate() {
        let field = format!("spec.domain.devices.disks[{i}]");
        if disk.cdrom.is_some() || disk.lun.is_some() {
            let kind = if disk.cdrom.is_some() { "cdrom" } else { "lun" };
            return Err(ConvertError::new(
                format!("{field}.{kind}"),
                "only disk devices on virtio are supported",
            ));
        }
        let target = disk.disk.clone().unwrap_or_default();
        let bus = target.bus.as_deref().unwrap_or("virtio");
        if bus != "virtio" {
            return Err(ConvertError::new(
                format!("{field}.disk.bus"),
                format!("bus {bus:?} is not supported: only virtio"),
            ));
        }
        if !vmi.spec.volumes.iter().any(|v| v.name == disk.name) {
            return Err(ConvertError::new(
                format!("{field}.name"),
                format!("no volume named {:?}", disk.name),
            ));
        }
        let plan = ctx.disks.get(&disk.name).ok_or_else(|| {
            ConvertError::new(format!("{field}.name"), "the volume could not be prepared")
        })?;
        let read_only = target.readonly == Some(true);
        let source = if plan.kind == "block" {
            DiskSource {
                dev: plan.path.to_string_lossy().into_owned(),
                ..Default::default()
            }
        } else {
            DiskSource {
                file: plan.path.to_string_lossy().into_owned(),
                ..Default::default()
            }
        };
        devices.disks.push(Disk {
            device: "disk".into(),
            r#type: plan.kind.into(),
            source,
            target: DiskTarget {
                bus: "virtio".into(),
                device: virtio_device_name(i),
            },
            serial: disk.serial.clone().unwrap_or_default(),
            driver: Some(DiskDriver {
                cache: disk.cache.clone().unwrap_or_default(),
                error_policy: disk.error_policy.clone().unwrap_or_else(|| "stop".into()),
                io: disk.io.clone().unwrap_or_default(),
                name: "qemu".into(),
                r#type: plan.format.name().into(),
                discard: if read_only {
                    String::new()
                } else {
                    "unmap".into()
                },
            }),
            read_only: read_only.then_some(Empty {}),
            alias: Some(Alias::user(&disk.name)),
            backing_store: plan.backing.as_ref().map(|(path, format)| BackingStore {
                r#type: "file".into(),
                format: Some(BackingStoreFormat {
                    r#type: format.name().into(),
                }),
                source: Some(DiskSource {
                    file: path.to_string_lossy().into_owned(),
                    ..Default::default()
                }),
            }),
            boot_order: disk.boot_order.map(|order| BootOrder { order }),
            ..Default::default()
        });
    }
    Ok(())
}

/// `vda`, ..., `vdz`, `vdaa`, ... as Linux names virtio disks.
pub(crate) fn virtio_device_name(index: usize) -> String {
    let mut suffix = Vec::new();
    let mut n = index + 1;
    while n > 0 {
        n -= 1;
        suffix.push(b"abcdefghijklmnopqrstuvwxyz"[n % 26]);
        n /= 26;
    }
    suffix.reverse();
    format!("vd{}", String::from_utf8_lossy(&suffix))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;
    use crate::disks::plan;
    use crate::paths::Paths;

    fn ctx_for(v: &VirtualMachineInstance) -> Context {
        let paths = Paths::default();
        let disks = (0..v.spec.volumes.len())
            .filter_map(|i| plan(&paths, v, i).ok())
            .map(|p| (p.volume.clone(), p))
            .collect();
        Context {
            paths,
            disks,
            ..Default::default()
        }
    }

    #[test]
    fn device_names() {
        assert_eq!(virtio_device_name(0), "vda");
        assert_eq!(virtio_device_name(25), "vdz");
        assert_eq!(virtio_device_name(26), "vdaa");
    }

    #[test]
    fn container_disk_becomes_an_overlay_at_kubevirt_paths() {
        let v = vmi(
            "domain:\n  devices:\n    disks:\n    - name: containerdisk\n      disk:\n        bus: virtio\n    - name: scratch\n      disk:\n        readonly: true\nvolumes:\n- name: containerdisk\n  containerDisk:\n    image: x\n- name: scratch\n  emptyDisk:\n    capacity: 10Mi",
        );
        let mut devices = Devices::default();
        configure(&v, &ctx_for(&v), &mut devices).unwrap();
        let d = &devices.disks[0];
        assert_eq!(
            d.source.file,
            "/var/run/kubevirt-ephemeral-disks/disk-data/containerdisk/disk.qcow2"
        );
        assert_eq!(d.target.device, "vda");
        assert_eq!(d.driver.as_ref().unwrap().r#type, "qcow2");
        let backing = d.backing_store.as_ref().unwrap();
        assert_eq!(
            backing.source.as_ref().unwrap().file,
            "/var/run/kubevirt/container-disks/disk_0.img"
        );
        assert_eq!(d.alias, Some(Alias::user("containerdisk")));
        let e = &devices.disks[1];
        assert_eq!(e.source.file, "/var/run/libvirt/empty-disks/scratch.qcow2");
        assert_eq!(e.target.device, "vdb");
        assert!(e.read_only.is_some());
    }

    #[test]
    fn refusals_name_the_field() {
        let v = vmi(
            "domain:\n  devices:\n    disks:\n    - name: a\n      disk:\n        bus: sata\nvolumes:\n- name: a\n  emptyDisk:\n    capacity: 1Mi",
        );
        let err = configure(&v, &ctx_for(&v), &mut Devices::default()).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.disks[0].disk.bus");
        let v = vmi(
            "domain:\n  devices:\n    disks:\n    - name: a\n      cdrom: {}\nvolumes:\n- name: a\n  emptyDisk:\n    capacity: 1Mi",
        );
        let err = configure(&v, &ctx_for(&v), &mut Devices::default()).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.disks[0].cdrom");
        let v = vmi("domain:\n  devices:\n    disks:\n    - name: missing\nvolumes: []");
        let err = configure(&v, &ctx_for(&v), &mut Devices::default()).unwrap_err();
        assert_eq!(err.field, "spec.domain.devices.disks[0].name");
    }
}
