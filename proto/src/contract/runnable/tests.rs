use super::*;
use serde_json::{Value, json};

/// A VMI this launcher runs: kernel boot, a virtio container disk, masquerade on the pod
/// network, 128Mi.
fn base() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "t", "namespace": "ns"},
        "spec": {
            "domain": {
                "memory": {"guest": "128Mi"},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0",
                    "container": {"image": "kernel:1", "kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initrd"}}},
                "devices": {
                    "disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                    "interfaces": [{"name": "default", "masquerade": {}, "ports": [{"port": 80}]}],
                },
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "root", "containerDisk": {"image": "disk:1"}}],
        },
    })
}

/// `base()` with the JSON at each pointer replaced (a `null` removes the key).
fn with(changes: &[(&str, Value)]) -> VirtualMachineInstance {
    let mut value = base();
    for (pointer, new) in changes {
        let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
        let mut slot = &mut value;
        for part in parent.split('/').skip(1) {
            slot = match slot {
                Value::Array(items) => &mut items[part.parse::<usize>().expect("an index")],
                other => other
                    .as_object_mut()
                    .expect("an object")
                    .entry(part)
                    .or_insert(json!({})),
            };
        }
        match (slot, new) {
            (Value::Object(map), Value::Null) => {
                map.remove(key);
            }
            (Value::Object(map), new) => {
                map.insert(key.to_string(), new.clone());
            }
            (Value::Array(items), new) => {
                let index = key.parse::<usize>().expect("an index");
                if index == items.len() {
                    items.push(new.clone());
                } else {
                    items[index] = new.clone();
                }
            }
            (other, _) => panic!("cannot set {pointer} in {other}"),
        }
    }
    serde_json::from_value(value).expect("a VMI")
}

#[test]
fn the_base_vmi_runs() {
    assert_eq!(check(&with(&[])), Ok(()));
}

/// A name, changes to the base VMI, the field the refusal must name (`None`: it runs).
type Row = (
    &'static str,
    Vec<(&'static str, Value)>,
    Option<&'static str>,
);

/// Each row changes the base VMI and names the field the refusal must name.
#[test]
fn refusals_name_the_field() {
    let rows: Vec<Row> = vec![
        (
            "no name",
            vec![("/metadata/name", json!(null))],
            Some("metadata.name"),
        ),
        (
            "hook sidecars",
            vec![(
                "/metadata/annotations",
                json!({"hooks.kubevirt.io/hookSidecars": "[]"}),
            )],
            Some("metadata.annotations[hooks.kubevirt.io/hookSidecars]"),
        ),
        (
            "arm64",
            vec![("/spec/architecture", json!("arm64"))],
            Some("spec.architecture"),
        ),
        ("amd64", vec![("/spec/architecture", json!("amd64"))], None),
        (
            "pc-q35 machine",
            vec![("/spec/domain/machine", json!({"type": "pc-q35-rhel9.6.0"}))],
            None,
        ),
        (
            "i440fx",
            vec![("/spec/domain/machine", json!({"type": "pc-i440fx-2.0"}))],
            Some("spec.domain.machine.type"),
        ),
        (
            "SEV",
            vec![("/spec/domain/launchSecurity", json!({"sev": {}}))],
            Some("spec.domain.launchSecurity.sev"),
        ),
        (
            "EFI with Secure Boot (KubeVirt's default)",
            vec![("/spec/domain/firmware/bootloader", json!({"efi": {}}))],
            Some("spec.domain.firmware.bootloader.efi.secureBoot"),
        ),
        (
            "EFI without Secure Boot",
            vec![(
                "/spec/domain/firmware/bootloader",
                json!({"efi": {"secureBoot": false}}),
            )],
            None,
        ),
        (
            "no kernel boot: the disk boots",
            vec![("/spec/domain/firmware", json!(null))],
            None,
        ),
        (
            "no kernel boot, a cloud-init disk first",
            vec![
                ("/spec/domain/firmware", json!(null)),
                (
                    "/spec/volumes/0",
                    json!({"name": "root", "cloudInitNoCloud": {"userData": "#cloud-config"}}),
                ),
            ],
            Some("spec.domain.devices.disks[0]"),
        ),
        (
            "kernel arguments without a kernel",
            vec![("/spec/domain/firmware/kernelBoot/container", json!(null))],
            Some("spec.domain.firmware.kernelBoot.kernelArgs"),
        ),
        (
            "kernel boot without a container or arguments: the disk boots",
            vec![("/spec/domain/firmware/kernelBoot", json!({}))],
            None,
        ),
        (
            "no kernel path",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/kernelPath",
                json!(null),
            )],
            Some("spec.domain.firmware.kernelBoot.container.kernelPath"),
        ),
        (
            "kernel path leaves the image",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/kernelPath",
                json!("/boot/../../etc/passwd"),
            )],
            Some("spec.domain.firmware.kernelBoot.container.kernelPath"),
        ),
        (
            "kernel path is the image root",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/kernelPath",
                json!("/"),
            )],
            Some("spec.domain.firmware.kernelBoot.container.kernelPath"),
        ),
        (
            "initrd named like the kernel",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/initrdPath",
                json!("/other/vmlinuz"),
            )],
            Some("spec.domain.firmware.kernelBoot.container.initrdPath"),
        ),
        (
            "no initrd",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/initrdPath",
                json!(null),
            )],
            None,
        ),
        (
            "zero cores",
            vec![("/spec/domain/cpu", json!({"cores": 0}))],
            Some("spec.domain.cpu"),
        ),
        (
            "255 vCPUs",
            vec![("/spec/domain/cpu", json!({"sockets": 255}))],
            Some("spec.domain.cpu"),
        ),
        (
            "254 vCPUs",
            vec![("/spec/domain/cpu", json!({"sockets": 2, "cores": 127}))],
            None,
        ),
        (
            "named model",
            vec![("/spec/domain/cpu", json!({"model": "Skylake"}))],
            Some("spec.domain.cpu.model"),
        ),
        (
            "host-passthrough",
            vec![("/spec/domain/cpu", json!({"model": "host-passthrough"}))],
            None,
        ),
        (
            "dedicated CPUs",
            vec![("/spec/domain/cpu", json!({"dedicatedCpuPlacement": true}))],
            Some("spec.domain.cpu.dedicatedCpuPlacement"),
        ),
        (
            "realtime",
            vec![("/spec/domain/cpu", json!({"realtime": {}}))],
            Some("spec.domain.cpu.realtime"),
        ),
        (
            "optional and forbidden CPU features",
            vec![(
                "/spec/domain/cpu",
                json!({"features": [{"name": "avx", "policy": "optional"}, {"name": "pcid", "policy": "forbid"}]}),
            )],
            None,
        ),
        (
            "a CPU feature required by default (no node carries the label it selects)",
            vec![(
                "/spec/domain/cpu",
                json!({"features": [{"name": "pcid", "policy": "forbid"}, {"name": "vmx"}]}),
            )],
            Some("spec.domain.cpu.features[1].policy"),
        ),
        (
            "a CPU feature required explicitly",
            vec![(
                "/spec/domain/cpu",
                json!({"features": [{"name": "vmx", "policy": "require"}]}),
            )],
            Some("spec.domain.cpu.features[0].policy"),
        ),
        (
            "a disabled CPU feature",
            vec![(
                "/spec/domain/cpu",
                json!({"features": [{"name": "vmx", "policy": "disable"}]}),
            )],
            Some("spec.domain.cpu.features[0].policy"),
        ),
        (
            "hugepages",
            vec![("/spec/domain/memory/hugepages", json!({"pageSize": "2Mi"}))],
            Some("spec.domain.memory.hugepages"),
        ),
        (
            "no memory",
            vec![("/spec/domain/memory", json!(null))],
            Some("spec.domain.memory.guest"),
        ),
        (
            "memory from the request",
            vec![
                ("/spec/domain/memory", json!(null)),
                (
                    "/spec/domain/resources",
                    json!({"requests": {"memory": "64Mi"}}),
                ),
            ],
            None,
        ),
        (
            "8Mi",
            vec![("/spec/domain/memory/guest", json!("8Mi"))],
            Some("spec.domain.memory.guest"),
        ),
        (
            "bad quantity",
            vec![("/spec/domain/memory/guest", json!("lots"))],
            Some("spec.domain.memory.guest"),
        ),
        (
            "a GPU",
            vec![("/spec/domain/devices/gpus", json!([{"name": "g"}]))],
            Some("spec.domain.devices.gpus"),
        ),
        (
            "no GPUs",
            vec![("/spec/domain/devices/gpus", json!([]))],
            None,
        ),
        (
            "a TPM",
            vec![("/spec/domain/devices/tpm", json!({}))],
            Some("spec.domain.devices.tpm"),
        ),
        (
            "SATA disk",
            vec![("/spec/domain/devices/disks/0/disk/bus", json!("sata"))],
            Some("spec.domain.devices.disks[0].disk.bus"),
        ),
        (
            "cdrom",
            vec![(
                "/spec/domain/devices/disks/0",
                json!({"name": "root", "cdrom": {}}),
            )],
            Some("spec.domain.devices.disks[0].cdrom"),
        ),
        (
            "unknown cache",
            vec![("/spec/domain/devices/disks/0/cache", json!("unsafe"))],
            Some("spec.domain.devices.disks[0].cache"),
        ),
        (
            "writeback",
            vec![("/spec/domain/devices/disks/0/cache", json!("writeback"))],
            None,
        ),
        (
            "disk without volume",
            vec![("/spec/domain/devices/disks/0/name", json!("other"))],
            Some("spec.domain.devices.disks[0].name"),
        ),
        (
            "configMap volume",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "configMap": {"name": "c"}}),
            )],
            Some("spec.volumes[0].configMap"),
        ),
        (
            "sysprep volume",
            vec![("/spec/volumes/0", json!({"name": "root", "sysprep": {}}))],
            Some("spec.volumes[0].sysprep"),
        ),
        (
            "dataVolume",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "dataVolume": {"name": "dv"}}),
            )],
            None,
        ),
        (
            "hotpluggable dataVolume",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "dataVolume": {"name": "dv", "hotpluggable": true}}),
            )],
            Some("spec.volumes[0].dataVolume.hotpluggable"),
        ),
        (
            "ephemeral without PVC",
            vec![("/spec/volumes/0", json!({"name": "root", "ephemeral": {}}))],
            Some("spec.volumes[0].ephemeral"),
        ),
        (
            "host disk to create without a capacity",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "hostDisk": {"path": "/d/disk.img", "type": "DiskOrCreate"}}),
            )],
            Some("spec.volumes[0].hostDisk.capacity"),
        ),
        (
            "empty disk with a bad capacity",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "emptyDisk": {"capacity": "x"}}),
            )],
            Some("spec.volumes[0].emptyDisk.capacity"),
        ),
        (
            "multus network",
            vec![(
                "/spec/networks/0",
                json!({"name": "default", "multus": {"networkName": "n"}}),
            )],
            Some("spec.networks[0].multus"),
        ),
        (
            "two interfaces",
            vec![(
                "/spec/domain/devices/interfaces/1",
                json!({"name": "b", "masquerade": {}}),
            )],
            Some("spec.domain.devices.interfaces"),
        ),
        (
            "bridge",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default", "bridge": {}}),
            )],
            None,
        ),
        (
            "SR-IOV",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default", "sriov": {}}),
            )],
            Some("spec.domain.devices.interfaces[0].sriov"),
        ),
        (
            "no binding",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default"}),
            )],
            Some("spec.domain.devices.interfaces[0]"),
        ),
        (
            "e1000",
            vec![("/spec/domain/devices/interfaces/0/model", json!("e1000"))],
            Some("spec.domain.devices.interfaces[0].model"),
        ),
        (
            "interface without network",
            vec![("/spec/networks/0/name", json!("other"))],
            Some("spec.domain.devices.interfaces[0].name"),
        ),
        (
            "reserved MAC",
            vec![(
                "/spec/domain/devices/interfaces/0/macAddress",
                json!("02:00:00:00:00:00"),
            )],
            Some("spec.domain.devices.interfaces[0].macAddress"),
        ),
        (
            "bad MAC",
            vec![(
                "/spec/domain/devices/interfaces/0/macAddress",
                json!("+2:00:00:00:00:01"),
            )],
            Some("spec.domain.devices.interfaces[0].macAddress"),
        ),
        (
            "port 0",
            vec![(
                "/spec/domain/devices/interfaces/0/ports",
                json!([{"port": 0}]),
            )],
            Some("spec.domain.devices.interfaces[0].ports[0].port"),
        ),
        (
            "port twice",
            vec![(
                "/spec/domain/devices/interfaces/0/ports",
                json!([{"port": 22}, {"port": 22, "protocol": "tcp"}]),
            )],
            Some("spec.domain.devices.interfaces[0].ports[1].port"),
        ),
        (
            "same port, TCP and UDP",
            vec![(
                "/spec/domain/devices/interfaces/0/ports",
                json!([{"port": 53}, {"port": 53, "protocol": "UDP"}]),
            )],
            None,
        ),
        (
            "SCTP",
            vec![(
                "/spec/domain/devices/interfaces/0/ports",
                json!([{"port": 53, "protocol": "SCTP"}]),
            )],
            Some("spec.domain.devices.interfaces[0].ports[0].protocol"),
        ),
        (
            "guest network too small",
            vec![(
                "/spec/networks/0/pod",
                json!({"vmNetworkCIDR": "10.0.0.0/31"}),
            )],
            Some("spec.networks[0].pod.vmNetworkCIDR"),
        ),
        (
            "guest network not a network address",
            vec![(
                "/spec/networks/0/pod",
                json!({"vmNetworkCIDR": "10.0.0.1/24"}),
            )],
            Some("spec.networks[0].pod.vmNetworkCIDR"),
        ),
        (
            "IPv6 guest network",
            vec![(
                "/spec/networks/0/pod",
                json!({"vmNetworkCIDR": "10.1.0.0/24", "vmIPv6NetworkCIDR": "fd10::/64"}),
            )],
            None,
        ),
        (
            "exec readiness probe",
            vec![(
                "/spec/readinessProbe",
                json!({"exec": {"command": ["true"]}}),
            )],
            Some("spec.readinessProbe.exec"),
        ),
        (
            "guest-agent liveness probe",
            vec![("/spec/livenessProbe", json!({"guestAgentPing": {}}))],
            Some("spec.livenessProbe.guestAgentPing"),
        ),
        (
            "TCP probe",
            vec![("/spec/readinessProbe", json!({"tcpSocket": {"port": 22}}))],
            None,
        ),
        (
            "password credential",
            vec![(
                "/spec/accessCredentials",
                json!([{"userPassword": {"source": {"secret": {"secretName": "s"}}}}]),
            )],
            Some("spec.accessCredentials[0].userPassword"),
        ),
        (
            "SSH key through the guest agent",
            vec![(
                "/spec/accessCredentials",
                json!([{"sshPublicKey": {"source": {"secret": {"secretName": "s"}},
                    "propagationMethod": {"qemuGuestAgent": {"users": ["u"]}}}}]),
            )],
            Some("spec.accessCredentials[0].sshPublicKey.propagationMethod.qemuGuestAgent"),
        ),
        (
            "SSH key through NoCloud without a NoCloud volume",
            vec![(
                "/spec/accessCredentials",
                json!([{"sshPublicKey": {"source": {"secret": {"secretName": "s"}},
                    "propagationMethod": {"noCloud": {}}}}]),
            )],
            Some("spec.accessCredentials[0].sshPublicKey.propagationMethod.noCloud"),
        ),
        (
            "SSH key through NoCloud",
            vec![
                (
                    "/spec/accessCredentials",
                    json!([{"sshPublicKey": {"source": {"secret": {"secretName": "s"}},
                        "propagationMethod": {"noCloud": {}}}}]),
                ),
                (
                    "/spec/volumes/1",
                    json!({"name": "ci", "cloudInitNoCloud": {"userData": "#cloud-config"}}),
                ),
            ],
            None,
        ),
        (
            "secret name with a slash",
            vec![
                (
                    "/spec/accessCredentials",
                    json!([{"sshPublicKey": {"source": {"secret": {"secretName": "../x"}},
                        "propagationMethod": {"configDrive": {}}}}]),
                ),
                (
                    "/spec/volumes/1",
                    json!({"name": "ci", "cloudInitConfigDrive": {"userData": "#cloud-config"}}),
                ),
            ],
            Some("spec.accessCredentials[0].sshPublicKey.source.secret.secretName"),
        ),
        (
            "a volume name that leaves the directory",
            vec![
                ("/spec/volumes/0/name", json!("../x")),
                ("/spec/domain/devices/disks/0/name", json!("../x")),
            ],
            Some("spec.volumes[0].name"),
        ),
        (
            "an absolute volume name",
            vec![
                ("/spec/volumes/0/name", json!("/etc/passwd")),
                ("/spec/domain/devices/disks/0/name", json!("/etc/passwd")),
            ],
            Some("spec.volumes[0].name"),
        ),
        (
            "an upper-case volume name",
            vec![
                ("/spec/volumes/0/name", json!("Root")),
                ("/spec/domain/devices/disks/0/name", json!("Root")),
            ],
            Some("spec.volumes[0].name"),
        ),
        (
            "an empty volume name",
            vec![
                ("/spec/volumes/0/name", json!("")),
                ("/spec/domain/devices/disks/0/name", json!("")),
            ],
            Some("spec.volumes[0].name"),
        ),
        (
            "a disk name that is no label",
            vec![("/spec/domain/devices/disks/1", json!({"name": "a.b"}))],
            Some("spec.domain.devices.disks[1].name"),
        ),
        (
            "a 63-character volume name",
            vec![
                ("/spec/volumes/0/name", json!("a".repeat(63))),
                ("/spec/domain/devices/disks/0/name", json!("a".repeat(63))),
            ],
            None,
        ),
        (
            "a 64-character volume name",
            vec![
                ("/spec/volumes/0/name", json!("a".repeat(64))),
                ("/spec/domain/devices/disks/0/name", json!("a".repeat(64))),
            ],
            Some("spec.volumes[0].name"),
        ),
        (
            "two volumes of one name",
            vec![(
                "/spec/volumes/1",
                json!({"name": "root", "cloudInitNoCloud": {"userData": "#cloud-config"}}),
            )],
            Some("spec.volumes[1].name"),
        ),
        (
            "two disks of one name",
            vec![(
                "/spec/domain/devices/disks/1",
                json!({"name": "root", "disk": {"bus": "virtio"}}),
            )],
            Some("spec.domain.devices.disks[1].name"),
        ),
    ];
    for (name, changes, want) in rows {
        let got = check(&with(&changes));
        assert_eq!(
            got.as_ref().err().map(|r| r.field.as_str()),
            want,
            "{name}: {got:?}"
        );
        if let Err(refusal) = got {
            assert!(!refusal.reason.is_empty(), "{name}");
            assert_eq!(
                refusal.to_string(),
                format!("{}: {}", refusal.field, refusal.reason)
            );
        }
    }
}

/// Random JSON in the places the check reads never makes it panic.
#[test]
fn random_values_never_panic() {
    let pieces = [
        json!(null),
        json!(0),
        json!(-1),
        json!(4294967295u64),
        json!("x"),
        json!(""),
        json!("/"),
        json!([]),
        json!([{}]),
        json!({}),
        json!({"a": null}),
        json!(true),
    ];
    let pointers = [
        "/spec/domain/cpu/cores",
        "/spec/domain/cpu/features",
        "/spec/domain/cpu/model",
        "/spec/domain/memory/hugepages",
        "/spec/domain/launchSecurity",
        "/spec/domain/firmware/bootloader",
        "/spec/domain/firmware/kernelBoot/container/kernelPath",
        "/spec/domain/devices/interfaces/0/macAddress",
        "/spec/domain/devices/interfaces/0/ports",
        "/spec/networks/0/pod",
        "/spec/readinessProbe",
        "/spec/accessCredentials",
        "/spec/volumes/0/hostDisk",
        "/spec/volumes/0/name",
        "/spec/domain/devices/disks/0/name",
    ];
    for pointer in pointers {
        for piece in &pieces {
            let mut value = serde_json::to_value(with(&[])).unwrap();
            if let Some(slot) = value.pointer_mut(pointer) {
                *slot = piece.clone();
            } else if let Some((parent, key)) = pointer.rsplit_once('/')
                && let Some(Value::Object(map)) = value.pointer_mut(parent)
            {
                map.insert(key.to_string(), piece.clone());
            }
            if let Ok(vmi) = serde_json::from_value::<VirtualMachineInstance>(value) {
                let _ = check(&vmi);
            }
        }
    }
}

/// The project's demo VMI runs; KubeVirt's kernel-boot example runs; so do its disk-booted
/// examples, by BIOS or EFI without Secure Boot; Secure Boot is refused.
#[test]
fn examples() {
    let parse = |text| crate::kubevirt::parse_vmi(text).expect("the example parses");
    let demo = parse(include_str!(
        "../../../../images/examples/vmi-testguest.yaml"
    ));
    assert_eq!(check(&demo), Ok(()));
    let demo_kernel_boot = parse(include_str!(
        "../../../../images/examples/vmi-testguest-kernel-boot.yaml"
    ));
    assert_eq!(check(&demo_kernel_boot), Ok(()));
    let kernel_boot = parse(include_str!("../../../tests/testdata/vmi-kernel-boot.yaml"));
    assert_eq!(check(&kernel_boot), Ok(()));
    let migratable = parse(include_str!("../../../tests/testdata/vmi-migratable.yaml"));
    assert_eq!(check(&migratable), Ok(()));
    let alpine_efi = parse(include_str!("../../../tests/testdata/vmi-alpine-efi.yaml"));
    assert_eq!(check(&alpine_efi), Ok(()));
    let secure_boot = parse(include_str!("../../../tests/testdata/vmi-secureboot.yaml"));
    assert_eq!(
        check(&secure_boot).unwrap_err().field,
        "spec.domain.firmware.bootloader.efi.secureBoot"
    );
}

#[test]
fn volume_names_are_dns_labels() {
    for good in ["a", "0", "root", "disk-0", "a1-b2", &"x".repeat(63)] {
        assert_eq!(volume_name(good), Ok(()), "{good}");
    }
    for bad in [
        "",
        "-a",
        "a-",
        "A",
        "a_b",
        "a.b",
        "..",
        ".",
        "../x",
        "/x",
        "a/b",
        "a\0b",
        " a",
        "é",
        &"x".repeat(64),
    ] {
        assert!(volume_name(bad).is_err(), "{bad:?}");
    }
    let refusal = check(&with(&[(
        "/spec/volumes/1",
        json!({"name": "root", "emptyDisk": {"capacity": "1Gi"}}),
    )]))
    .unwrap_err();
    assert_eq!(
        refusal.reason,
        "spec.volumes[1] and spec.volumes[0] must not have the same name"
    );
}
