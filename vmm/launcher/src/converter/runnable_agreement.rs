//! The shared definition of what this launcher runs (`proto::contract::runnable`) against the
//! launcher itself: on a table of VMIs and on generated ones, the launcher refuses a VMI
//! (from what the VMI says, before it touches the pod) exactly when the shared definition
//! does. The controller refuses with the shared definition before it creates a pod, so a
//! disagreement would mean a pod for a VMI this launcher then refuses.
//!
//! The launcher's side is what `manager::sync` runs before any side effect: a disk plan per
//! volume, the kernel-boot paths, [`super::convert`] and `to_vm::vm_config`, with a pod
//! that has everything (an interface with a MAC, `tap0`).

use super::{Context, PodInterface, convert};
use crate::disks;
use crate::paths::Paths;
use proto::contract::runnable;
use proto::kubevirt::VirtualMachineInstance;
use serde_json::{Value, json};

/// Why the launcher refuses `vmi`, or `None` when it would start it.
fn launcher_refusal(vmi: &VirtualMachineInstance) -> Option<String> {
    let paths = Paths::under(std::path::Path::new("/nonexistent-launcher-root"));
    let mut ctx = Context {
        paths: paths.clone(),
        pod_interface: PodInterface {
            mtu: 1500,
            mac: Some("0a:58:0a:f4:00:1b".into()),
            tap_exists: true,
        },
        ..Default::default()
    };
    for index in 0..vmi.spec.volumes.len() {
        match disks::plan(&paths, vmi, index) {
            Ok(plan) => {
                ctx.disks.insert(plan.volume.clone(), plan);
            }
            Err(e) => return Some(e.to_string()),
        }
    }
    match disks::kernel_boot(&paths, vmi) {
        Ok(kernel_boot) => ctx.kernel_boot = kernel_boot,
        Err(e) => return Some(e.to_string()),
    }
    let domain = match convert(vmi, &ctx) {
        Ok(domain) => domain,
        Err(e) => return Some(e.to_string()),
    };
    crate::to_vm::vm_config(&domain)
        .err()
        .map(|e| e.to_string())
}

/// Fails, naming the VMI, when the two disagree.
fn assert_agree(what: &str, vmi: &VirtualMachineInstance) {
    let shared = runnable::check(vmi).err();
    let launcher = launcher_refusal(vmi);
    assert_eq!(
        shared.is_some(),
        launcher.is_some(),
        "{what}: the shared definition says {shared:?}, the launcher says {launcher:?}\nVMI: {}",
        serde_json::to_string(&vmi.spec).unwrap_or_default()
    );
}

fn base() -> Value {
    json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": "testvmi", "namespace": "ns1", "uid": "11111111-2222-3333-4444-555555555555"},
        "spec": {
            "domain": {
                "memory": {"guest": "128Mi"},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0",
                    "container": {"image": "kernel:1", "kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initrd"}}},
                "devices": {
                    "disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                    "interfaces": [{"name": "default", "masquerade": {}}],
                    "rng": {},
                },
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "root", "containerDisk": {"image": "disk:1"}}],
        },
    })
}

fn vmi_with(changes: &[(&str, Value)]) -> VirtualMachineInstance {
    let mut value = base();
    for (pointer, new) in changes {
        set(&mut value, pointer, new.clone());
    }
    serde_json::from_value(value).expect("a VMI")
}

/// Sets the JSON at `pointer` (creating objects on the way; `null` removes the key).
fn set(value: &mut Value, pointer: &str, new: Value) {
    let (parent, key) = pointer.rsplit_once('/').expect("a pointer");
    let mut slot = value;
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
    match slot {
        Value::Object(map) if new.is_null() => {
            map.remove(key);
        }
        Value::Object(map) => {
            map.insert(key.to_string(), new);
        }
        Value::Array(items) => {
            let index: usize = key.parse().expect("an index");
            if index == items.len() {
                items.push(new);
            } else {
                items[index] = new;
            }
        }
        other => panic!("cannot set {pointer} in {other}"),
    }
}

/// One row per refusal of the launcher (and the cases next to them it accepts).
#[test]
fn the_table_agrees() {
    let rows: Vec<(&str, Vec<(&str, Value)>)> = vec![
        ("the base VMI", vec![]),
        ("no name", vec![("/metadata/name", json!(null))]),
        ("arm64", vec![("/spec/architecture", json!("arm64"))]),
        (
            "virt machine",
            vec![("/spec/domain/machine", json!({"type": "virt"}))],
        ),
        (
            "pc-q35 machine",
            vec![("/spec/domain/machine", json!({"type": "pc-q35-rhel9.6.0"}))],
        ),
        (
            "EFI",
            vec![("/spec/domain/firmware/bootloader", json!({"efi": {}}))],
        ),
        (
            "BIOS",
            vec![("/spec/domain/firmware/bootloader", json!({"bios": {}}))],
        ),
        ("no firmware", vec![("/spec/domain/firmware", json!(null))]),
        (
            "kernel boot without container",
            vec![("/spec/domain/firmware/kernelBoot/container", json!(null))],
        ),
        (
            "no kernel path",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/kernelPath",
                json!(null),
            )],
        ),
        (
            "empty kernel path",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/kernelPath",
                json!(""),
            )],
        ),
        (
            "kernel path with ..",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/kernelPath",
                json!("/a/../b"),
            )],
        ),
        (
            "initrd path with ..",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/initrdPath",
                json!("../x"),
            )],
        ),
        (
            "kernel and initrd alike",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/initrdPath",
                json!("/x/vmlinuz"),
            )],
        ),
        (
            "no initrd",
            vec![(
                "/spec/domain/firmware/kernelBoot/container/initrdPath",
                json!(null),
            )],
        ),
        ("two cores", vec![("/spec/domain/cpu", json!({"cores": 2}))]),
        (
            "zero cores",
            vec![("/spec/domain/cpu", json!({"cores": 0}))],
        ),
        (
            "255 vCPUs",
            vec![("/spec/domain/cpu", json!({"sockets": 5, "cores": 51}))],
        ),
        (
            "254 vCPUs",
            vec![("/spec/domain/cpu", json!({"sockets": 2, "cores": 127}))],
        ),
        (
            "overflowing topology",
            vec![(
                "/spec/domain/cpu",
                json!({"sockets": 65536, "cores": 65536}),
            )],
        ),
        (
            "named CPU model",
            vec![("/spec/domain/cpu", json!({"model": "Haswell"}))],
        ),
        (
            "empty CPU model",
            vec![("/spec/domain/cpu", json!({"model": ""}))],
        ),
        (
            "host-passthrough",
            vec![("/spec/domain/cpu", json!({"model": "host-passthrough"}))],
        ),
        (
            "dedicated CPUs",
            vec![("/spec/domain/cpu", json!({"dedicatedCpuPlacement": true}))],
        ),
        ("no memory", vec![("/spec/domain/memory", json!(null))]),
        (
            "memory from the limit",
            vec![
                ("/spec/domain/memory", json!(null)),
                (
                    "/spec/domain/resources",
                    json!({"limits": {"memory": "256Mi"}}),
                ),
            ],
        ),
        ("15Mi", vec![("/spec/domain/memory/guest", json!("15Mi"))]),
        (
            "fractional memory",
            vec![("/spec/domain/memory/guest", json!("0.5"))],
        ),
        (
            "GPU",
            vec![(
                "/spec/domain/devices/gpus",
                json!([{"name": "g", "deviceName": "x"}]),
            )],
        ),
        (
            "watchdog",
            vec![("/spec/domain/devices/watchdog", json!({"name": "w"}))],
        ),
        (
            "no host devices",
            vec![("/spec/domain/devices/hostDevices", json!([]))],
        ),
        (
            "SATA disk",
            vec![("/spec/domain/devices/disks/0/disk/bus", json!("sata"))],
        ),
        (
            "empty bus",
            vec![("/spec/domain/devices/disks/0/disk/bus", json!(""))],
        ),
        (
            "disk without bus",
            vec![("/spec/domain/devices/disks/0/disk", json!({}))],
        ),
        (
            "cdrom",
            vec![(
                "/spec/domain/devices/disks/0",
                json!({"name": "root", "cdrom": {}}),
            )],
        ),
        (
            "lun",
            vec![(
                "/spec/domain/devices/disks/0",
                json!({"name": "root", "lun": {}}),
            )],
        ),
        (
            "disk without volume",
            vec![("/spec/domain/devices/disks/0/name", json!("nope"))],
        ),
        (
            "cache unsafe",
            vec![("/spec/domain/devices/disks/0/cache", json!("unsafe"))],
        ),
        (
            "cache writethrough",
            vec![("/spec/domain/devices/disks/0/cache", json!("writethrough"))],
        ),
        (
            "configMap",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "configMap": {"name": "c"}}),
            )],
        ),
        (
            "secret",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "secret": {"secretName": "s"}}),
            )],
        ),
        (
            "serviceAccount",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "serviceAccount": {"serviceAccountName": "a"}}),
            )],
        ),
        (
            "downwardAPI",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "downwardAPI": {"fields": []}}),
            )],
        ),
        (
            "sysprep",
            vec![("/spec/volumes/0", json!({"name": "root", "sysprep": {}}))],
        ),
        (
            "volume without source",
            vec![("/spec/volumes/0", json!({"name": "root"}))],
        ),
        (
            "PVC",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "persistentVolumeClaim": {"claimName": "c"}}),
            )],
        ),
        (
            "dataVolume",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "dataVolume": {"name": "dv"}}),
            )],
        ),
        (
            "ephemeral PVC",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}}),
            )],
        ),
        (
            "ephemeral without PVC",
            vec![("/spec/volumes/0", json!({"name": "root", "ephemeral": {}}))],
        ),
        (
            "host disk",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "hostDisk": {"path": "/d/x.img", "type": "Disk"}}),
            )],
        ),
        (
            "host disk /",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "hostDisk": {"path": "/", "type": "Disk"}}),
            )],
        ),
        (
            "host disk, bad type",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "hostDisk": {"path": "/d/x.img", "type": "Block"}}),
            )],
        ),
        (
            "host disk to create, no capacity",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "hostDisk": {"path": "/d/x.img", "type": "DiskOrCreate"}}),
            )],
        ),
        (
            "host disk to create, bad capacity",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "hostDisk": {"path": "/d/x.img", "type": "DiskOrCreate", "capacity": "1.5"}}),
            )],
        ),
        (
            "empty disk",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "emptyDisk": {"capacity": "1Gi"}}),
            )],
        ),
        (
            "empty disk, bad capacity",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "emptyDisk": {"capacity": "big"}}),
            )],
        ),
        (
            "NoCloud",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "cloudInitNoCloud": {"userData": "#cloud-config"}}),
            )],
        ),
        (
            "ConfigDrive",
            vec![(
                "/spec/volumes/0",
                json!({"name": "root", "cloudInitConfigDrive": {"userData": "#cloud-config"}}),
            )],
        ),
        (
            "two interfaces",
            vec![(
                "/spec/domain/devices/interfaces/1",
                json!({"name": "b", "masquerade": {}}),
            )],
        ),
        (
            "no interfaces",
            vec![("/spec/domain/devices/interfaces", json!([]))],
        ),
        (
            "SR-IOV",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default", "sriov": {}}),
            )],
        ),
        (
            "passt",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default", "passtBinding": {}}),
            )],
        ),
        (
            "plugin binding",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default", "binding": {"name": "x"}}),
            )],
        ),
        (
            "no binding",
            vec![(
                "/spec/domain/devices/interfaces/0",
                json!({"name": "default"}),
            )],
        ),
        (
            "multus network",
            vec![(
                "/spec/networks/0",
                json!({"name": "default", "multus": {"networkName": "n"}}),
            )],
        ),
        ("no network", vec![("/spec/networks", json!([]))]),
        (
            "e1000",
            vec![("/spec/domain/devices/interfaces/0/model", json!("e1000"))],
        ),
        (
            "empty model",
            vec![("/spec/domain/devices/interfaces/0/model", json!(""))],
        ),
        (
            "MAC",
            vec![(
                "/spec/domain/devices/interfaces/0/macAddress",
                json!("02:ab:cd:ef:01:23"),
            )],
        ),
        (
            "upper-case MAC",
            vec![(
                "/spec/domain/devices/interfaces/0/macAddress",
                json!("02:AB:CD:EF:01:23"),
            )],
        ),
        (
            "bad MAC",
            vec![(
                "/spec/domain/devices/interfaces/0/macAddress",
                json!("02:ab:cd:ef:01"),
            )],
        ),
        (
            "reserved MAC",
            vec![(
                "/spec/domain/devices/interfaces/0/macAddress",
                json!("02:00:00:00:00:00"),
            )],
        ),
        ("no rng", vec![("/spec/domain/devices/rng", json!(null))]),
        (
            "no serial console",
            vec![("/spec/domain/devices/autoattachSerialConsole", json!(false))],
        ),
        (
            "a volume name that climbs out",
            vec![
                ("/spec/volumes/0/name", json!("../x")),
                ("/spec/domain/devices/disks/0/name", json!("../x")),
            ],
        ),
        (
            "an upper-case volume name",
            vec![
                ("/spec/volumes/0/name", json!("Root")),
                ("/spec/domain/devices/disks/0/name", json!("Root")),
            ],
        ),
        (
            "two volumes of one name",
            vec![(
                "/spec/volumes/1",
                json!({"name": "root", "emptyDisk": {"capacity": "1Mi"}}),
            )],
        ),
    ];
    for (what, changes) in rows {
        assert_agree(what, &vmi_with(&changes));
    }
}

/// The bridge binding (KubeVirt's default on the pod network): accepted by both.
#[test]
fn bridge_on_the_pod_network_agrees() {
    let vmi = vmi_with(&[(
        "/spec/domain/devices/interfaces/0",
        json!({"name": "default", "bridge": {}}),
    )]);
    assert_eq!(runnable::check(&vmi), Ok(()));
    assert_agree("bridge", &vmi);
}

/// VMIs drawn from every dimension above at once (a fixed seed, so failures reproduce).
#[test]
fn generated_vmis_agree() {
    let dimensions: Vec<(&str, Vec<Value>)> = vec![
        (
            "/spec/architecture",
            vec![json!(null), json!("amd64"), json!("arm64"), json!("")],
        ),
        (
            "/spec/domain/machine",
            vec![
                json!(null),
                json!({"type": "q35"}),
                json!({"type": "virt"}),
                json!({"type": ""}),
            ],
        ),
        (
            "/spec/domain/cpu",
            vec![
                json!(null),
                json!({"cores": 2, "sockets": 2}),
                json!({"cores": 0}),
                json!({"threads": 300}),
                json!({"model": "host-model"}),
                json!({"model": "EPYC"}),
                json!({"dedicatedCpuPlacement": true}),
            ],
        ),
        (
            "/spec/domain/memory",
            vec![
                json!({"guest": "128Mi"}),
                json!({"guest": "1Mi"}),
                json!({"guest": "x"}),
                json!(null),
                json!({}),
            ],
        ),
        (
            "/spec/domain/resources",
            vec![
                json!(null),
                json!({"requests": {"memory": "64Mi"}}),
                json!({"limits": {"memory": "2Mi"}}),
            ],
        ),
        (
            "/spec/domain/firmware",
            vec![
                base()["spec"]["domain"]["firmware"].clone(),
                json!(null),
                json!({"kernelBoot": {}}),
                json!({"kernelBoot": {"container": {"image": "k", "kernelPath": "/vmlinuz"}}}),
                json!({"kernelBoot": {"container": {"image": "k", "kernelPath": "../vmlinuz"}}}),
                json!({"kernelBoot": {"container": {"image": "k", "kernelPath": "/a/k", "initrdPath": "/b/k"}}}),
                json!({"bootloader": {"efi": {}}}),
            ],
        ),
        (
            "/spec/domain/devices/disks/0",
            vec![
                json!({"name": "root", "disk": {"bus": "virtio"}}),
                json!({"name": "root"}),
                json!({"name": "root", "disk": {"bus": "scsi"}}),
                json!({"name": "root", "cdrom": {}}),
                json!({"name": "other", "disk": {}}),
                json!({"name": "root", "disk": {}, "cache": "directsync"}),
            ],
        ),
        (
            "/spec/volumes/0",
            vec![
                json!({"name": "root", "containerDisk": {"image": "d"}}),
                json!({"name": "root", "emptyDisk": {"capacity": "1Gi"}}),
                json!({"name": "root", "emptyDisk": {"capacity": "-1"}}),
                json!({"name": "root", "hostDisk": {"path": "/x/d.img", "type": "DiskOrCreate", "capacity": "1Gi"}}),
                json!({"name": "root", "hostDisk": {"path": "", "type": "Disk"}}),
                json!({"name": "root", "configMap": {"name": "c"}}),
                json!({"name": "root", "downwardMetrics": {}}),
                json!({"name": "root", "cloudInitNoCloud": {"userData": "x"}}),
            ],
        ),
        (
            "/spec/domain/devices/interfaces",
            vec![
                json!([{"name": "default", "masquerade": {}}]),
                json!([]),
                json!([{"name": "default", "masquerade": {}, "model": "rtl8139"}]),
                json!([{"name": "default", "sriov": {}}]),
                json!([{"name": "default", "masquerade": {}, "macAddress": "zz:00:00:00:00:00"}]),
                json!([{"name": "default", "masquerade": {}}, {"name": "second", "masquerade": {}}]),
                json!([{"name": "elsewhere", "masquerade": {}}]),
            ],
        ),
        (
            "/spec/networks",
            vec![
                json!([{"name": "default", "pod": {}}]),
                json!([]),
                json!([{"name": "default", "multus": {"networkName": "x"}}]),
            ],
        ),
        (
            "/spec/domain/devices/tpm",
            vec![json!(null), json!({}), json!(null), json!(null)],
        ),
    ];
    // A small linear congruential generator: reproducible without a dependency.
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((state >> 33) as usize) % n
    };
    let mut refused = 0;
    for round in 0..3000 {
        // One to three dimensions away from the base VMI, so that both outcomes are common.
        let mut value = base();
        for _ in 0..=next(3) {
            let (pointer, choices) = &dimensions[next(dimensions.len())];
            let choice = choices[next(choices.len())].clone();
            set(&mut value, pointer, choice);
        }
        let vmi: VirtualMachineInstance = serde_json::from_value(value).expect("a VMI");
        assert_agree(&format!("generated VMI #{round}"), &vmi);
        refused += usize::from(runnable::check(&vmi).is_err());
    }
    // Both outcomes are exercised.
    assert!((300..2700).contains(&refused), "{refused} of 3000 refused");
}
