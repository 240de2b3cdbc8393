use super::*;
use proto::domain::{
    Alias, BackingStore, BackingStoreFormat, Bios, Empty, Metadata, Rom, SerialLog,
};
use serde_json::Value;

/// A domain with every field the VMM can run set, built from struct
/// literals without `..`: a field added to `proto::domain` breaks this
/// until it is given a value here, and the walk below then checks it.
fn full_domain() -> Domain {
    let mut domain = Domain::new("ns", "vmi", "uid-1");
    domain.spec = DomainSpec {
        r#type: "kvm".into(),
        name: "ns_vmi".into(),
        uuid: "5f3c9a4e-8b1d-4c2a-9e7f-0a1b2c3d4e5f".into(),
        memory: Some(MemoryAmount {
            value: 131072,
            unit: "KiB".into(),
        }),
        current_memory: Some(MemoryAmount {
            value: 131072,
            unit: "KiB".into(),
        }),
        os: Some(Os {
            firmware: "efi".into(),
            r#type: OsType {
                os: "hvm".into(),
                arch: "x86_64".into(),
                machine: "q35".into(),
            },
            smbios: Some(SmBios {
                mode: "sysinfo".into(),
            }),
            bios: Some(Bios {
                use_serial: "yes".into(),
            }),
            kernel: "/k".into(),
            initrd: "/initrd".into(),
            kernel_args: "console=ttyS0".into(),
            extra: Extra::new(),
        }),
        cpu: Some(Cpu {
            mode: "host-model".into(),
            model: String::new(),
            topology: Some(proto::domain::CpuTopology {
                sockets: 2,
                cores: 1,
                threads: 1,
            }),
            extra: Extra::new(),
        }),
        vcpu: Some(Vcpu {
            placement: "static".into(),
            cpus: 2,
        }),
        vcpus: Some(Vcpus {
            vcpu: vec![
                VcpusVcpu {
                    id: 0,
                    enabled: "yes".into(),
                    hotpluggable: "no".into(),
                    order: 0,
                },
                VcpusVcpu {
                    id: 1,
                    enabled: "no".into(),
                    hotpluggable: "yes".into(),
                    order: 0,
                },
            ],
        }),
        features: Some(Features {
            acpi: Some(Empty {}),
            apic: Some(Empty {}),
            extra: Extra::new(),
        }),
        sys_info: Some(SysInfo {
            r#type: "smbios".into(),
            system: [
                ("uuid", "5f3c9a4e-8b1d-4c2a-9e7f-0a1b2c3d4e5f"),
                ("serial", "VMI-SERIAL"),
                ("manufacturer", "KubeVirt"),
                ("family", "KubeVirt"),
                ("product", "None"),
                ("sku", "sku-1"),
                ("version", "v1"),
            ]
            .into_iter()
            .map(|(name, value)| SysInfoEntry {
                name: name.into(),
                value: value.into(),
            })
            .collect(),
            bios: vec![],
            base_board: vec![],
            chassis: [
                ("manufacturer", "Chassis Inc"),
                ("version", "c1"),
                ("serial", "CH-1"),
                ("asset", "A-1"),
                ("sku", "C-SKU"),
            ]
            .into_iter()
            .map(|(name, value)| SysInfoEntry {
                name: name.into(),
                value: value.into(),
            })
            .collect(),
        }),
        devices: Some(Devices {
            emulator: "/usr/bin/qemu-system-x86_64".into(),
            interfaces: vec![Interface {
                r#type: "ethernet".into(),
                source: InterfaceSource {
                    network: String::new(),
                    device: String::new(),
                    bridge: String::new(),
                    mode: String::new(),
                },
                target: Some(InterfaceTarget {
                    device: "tap0".into(),
                    managed: "no".into(),
                }),
                model: Some(Model {
                    r#type: "virtio-non-transitional".into(),
                }),
                mac: Some(Mac {
                    mac: "0a:58:0a:f4:00:1b".into(),
                }),
                mtu: Some(Mtu {
                    size: "1450".into(),
                }),
                boot_order: Some(BootOrder { order: 2 }),
                link_state: Some(LinkState { state: "up".into() }),
                alias: Some(Alias::user("default")),
                driver: Some(InterfaceDriver {
                    name: "vhost".into(),
                    queues: Some(1),
                }),
                rom: Some(Rom {
                    enabled: "no".into(),
                }),
                extra: Extra::new(),
            }],
            channels: vec![],
            disks: vec![
                Disk {
                    device: "disk".into(),
                    r#type: "file".into(),
                    source: DiskSource {
                        dev: String::new(),
                        file: "/d.qcow2".into(),
                    },
                    target: DiskTarget {
                        bus: "virtio".into(),
                        device: "vda".into(),
                    },
                    serial: "D1SK-SERIAL".into(),
                    driver: Some(DiskDriver {
                        cache: "none".into(),
                        error_policy: "stop".into(),
                        io: "native".into(),
                        name: "qemu".into(),
                        r#type: "qcow2".into(),
                        discard: "unmap".into(),
                    }),
                    read_only: None,
                    alias: Some(Alias::user("root")),
                    backing_store: Some(BackingStore {
                        r#type: "file".into(),
                        format: Some(BackingStoreFormat {
                            r#type: "raw".into(),
                        }),
                        source: Some(DiskSource {
                            dev: String::new(),
                            file: "/base.raw".into(),
                        }),
                    }),
                    boot_order: Some(BootOrder { order: 1 }),
                    extra: Extra::new(),
                },
                Disk {
                    device: "disk".into(),
                    r#type: "block".into(),
                    source: DiskSource {
                        dev: "/dev/vg/data".into(),
                        file: String::new(),
                    },
                    target: DiskTarget {
                        bus: "virtio".into(),
                        device: "vdb".into(),
                    },
                    serial: String::new(),
                    driver: Some(DiskDriver {
                        cache: "writethrough".into(),
                        error_policy: "report".into(),
                        io: String::new(),
                        name: "qemu".into(),
                        r#type: "raw".into(),
                        discard: "ignore".into(),
                    }),
                    read_only: Some(Empty {}),
                    alias: Some(Alias::user("data")),
                    backing_store: None,
                    boot_order: None,
                    extra: Extra::new(),
                },
            ],
            serials: vec![Serial {
                r#type: "unix".into(),
                target: Some(DomainSerialTarget { port: Some(0) }),
                source: Some(SerialSource {
                    mode: "bind".into(),
                    path: "/s".into(),
                }),
                alias: Some(Alias {
                    name: "serial0".into(),
                    user_defined: false,
                }),
                log: Some(SerialLog {
                    file: "/log".into(),
                    append: "on".into(),
                }),
            }],
            consoles: vec![Console {
                r#type: "pty".into(),
                target: Some(ConsoleTarget {
                    r#type: Some("serial".into()),
                    port: Some(0),
                }),
                alias: Some(Alias {
                    name: "console0".into(),
                    user_defined: false,
                }),
            }],
            rng: Some(Rng {
                model: "virtio-non-transitional".into(),
                backend: Some(RngBackend {
                    model: "random".into(),
                    source: "/dev/urandom".into(),
                }),
            }),
            extra: Extra::new(),
        }),
        metadata: Metadata::default(),
        extra: Extra::new(),
    };
    domain
}

/// The full domain booting its disk instead of a kernel: the first disk has the lowest
/// boot order (1), the second 5.
fn disk_boot_domain() -> Domain {
    let mut domain = full_domain();
    let os = domain.spec.os.as_mut().unwrap();
    (os.kernel, os.initrd, os.kernel_args) = Default::default();
    let disks = &mut domain.spec.devices.as_mut().unwrap().disks;
    disks[1].boot_order = Some(BootOrder { order: 5 });
    domain
}

#[test]
fn a_domain_without_a_kernel_boots_the_disk_with_the_lowest_boot_order() {
    assert!(matches!(
        vm_config(&disk_boot_domain()).unwrap().kernel,
        KernelSource::Disk(BootDisk { disk: 0, .. })
    ));
    let mut domain = disk_boot_domain();
    domain.spec.devices.as_mut().unwrap().disks[1].boot_order = Some(BootOrder { order: 0 });
    let config = vm_config(&domain).unwrap();
    assert!(
        matches!(
            config.kernel,
            KernelSource::Disk(BootDisk {
                disk: 1,
                firmware: BootFirmware::Efi
            })
        ),
        "{:?}",
        config.kernel
    );
    assert_eq!(config.cmdline, "");
    assert!(config.initrd.is_none());
    // Without any boot order, the first disk; without Firmware, BIOS.
    let mut domain = disk_boot_domain();
    domain.spec.os.as_mut().unwrap().firmware = String::new();
    domain.spec.devices.as_mut().unwrap().disks.swap(0, 1);
    for disk in &mut domain.spec.devices.as_mut().unwrap().disks {
        disk.boot_order = None;
    }
    assert!(matches!(
        vm_config(&domain).unwrap().kernel,
        KernelSource::Disk(BootDisk {
            disk: 0,
            firmware: BootFirmware::Bios
        })
    ));
    let mut domain = disk_boot_domain();
    domain.spec.devices.as_mut().unwrap().disks.clear();
    assert!(
        vm_config(&domain)
            .unwrap_err()
            .to_string()
            .contains("no disk to boot")
    );
    let mut domain = disk_boot_domain();
    domain.spec.os.as_mut().unwrap().initrd = "/i".into();
    assert!(
        vm_config(&domain)
            .unwrap_err()
            .to_string()
            .starts_with("OS.Initrd")
    );
}

#[test]
fn sysinfo_becomes_the_smbios_tables() {
    let config = vm_config(&full_domain()).unwrap();
    let system = &config.smbios.system;
    assert_eq!(
        (
            system.manufacturer.as_str(),
            system.product.as_str(),
            system.family.as_str(),
            system.serial.as_str(),
            system.sku.as_str(),
            system.version.as_str()
        ),
        ("KubeVirt", "None", "KubeVirt", "VMI-SERIAL", "sku-1", "v1")
    );
    assert_eq!(
        system.uuid,
        Some([
            0x5f, 0x3c, 0x9a, 0x4e, 0x8b, 0x1d, 0x4c, 0x2a, 0x9e, 0x7f, 0x0a, 0x1b, 0x2c, 0x3d,
            0x4e, 0x5f
        ])
    );
    assert_eq!(config.smbios.chassis.asset, "A-1");
    // libvirt refuses a sysinfo UUID other than the domain's.
    let mut domain = full_domain();
    domain.spec.uuid = "00000000-0000-0000-0000-000000000001".into();
    assert!(
        vm_config(&domain)
            .unwrap_err()
            .to_string()
            .starts_with("UUID:")
    );
    // Without SysInfo: the domain's UUID and nothing else.
    let mut domain = full_domain();
    domain.spec.sys_info = None;
    let smbios = vm_config(&domain).unwrap().smbios;
    assert_eq!(smbios.system.manufacturer, "");
    assert!(smbios.system.uuid.is_some());
}

#[test]
fn a_full_domain_maps_onto_the_vmm() {
    let config = vm_config(&full_domain()).unwrap();
    assert_eq!(config.memory_mib, 128);
    assert_eq!(config.vcpus, 1, "only the enabled vCPU starts");
    assert_eq!(config.cmdline, "console=ttyS0");
    assert_eq!(
        config.initrd.as_deref(),
        Some(std::path::Path::new("/initrd"))
    );
    let [root, data] = &config.disks[..] else {
        panic!("{:?}", config.disks)
    };
    assert_eq!(root.path, PathBuf::from("/d.qcow2"));
    assert_eq!(root.format, DiskFormat::Qcow2);
    assert_eq!(root.serial, "D1SK-SERIAL");
    assert!(root.discard && !root.read_only);
    assert_eq!(root.cache, DiskCache::None);
    // The overlay may open the backing file the domain names (here, one
    // that does not exist: its directory as named), and nothing else.
    assert_eq!(
        root.backing,
        vmm::DiskBacking::Within {
            dir: PathBuf::from("/"),
            format: DiskFormat::Raw
        }
    );
    assert_eq!(data.backing, vmm::DiskBacking::Forbid);
    assert_eq!(data.path, PathBuf::from("/dev/vg/data"));
    assert_eq!(data.format, DiskFormat::Raw);
    assert!(!data.discard && data.read_only);
    assert_eq!(data.cache, DiskCache::WriteThrough);
    let net = &config.nets[0];
    assert_eq!(net.tap, "tap0");
    assert_eq!(net.mac, Some([0x0a, 0x58, 0x0a, 0xf4, 0, 0x1b]));
    assert_eq!(net.mtu, Some(1450));
    assert!(net.link_up);
    assert!(config.rng);
    assert!(
        matches!(config.serial, SerialTarget::UnixSocket(ref p) if p == std::path::Path::new("/s"))
    );
}

/// Every leaf of `value` as (domain path with indices, path without).
fn leaves(value: &Value, at: &str, out: &mut Vec<(String, String)>) {
    let strip = |p: &str| {
        let mut s = String::new();
        let mut skip = false;
        for c in p.chars() {
            match c {
                '[' => skip = true,
                ']' => skip = false,
                c if !skip => s.push(c),
                _ => {}
            }
        }
        s
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (k, v) in map {
                leaves(v, &join(at, k), out);
            }
        }
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                leaves(v, &format!("{at}[{i}]"), out);
            }
        }
        _ => out.push((at.to_string(), strip(at))),
    }
}

fn pointer(path: &str) -> String {
    let mut p = String::new();
    for part in path.split('.') {
        match part.split_once('[') {
            Some((key, rest)) => {
                p.push('/');
                p.push_str(key);
                for index in rest.split('[') {
                    p.push('/');
                    p.push_str(index.trim_end_matches(']'));
                }
            }
            None => {
                p.push('/');
                p.push_str(part);
            }
        }
    }
    p
}

/// A different value of the same kind (an empty element is removed).
fn mutate(spec: &mut Value, path: &str) {
    let ptr = pointer(path);
    let replacement = match spec.pointer(&ptr).unwrap() {
        Value::String(_) => Some(Value::String("x-unusual".into())),
        Value::Number(n) => Some(Value::from(n.as_u64().unwrap() + 1)),
        Value::Bool(b) => Some(Value::Bool(!*b)),
        Value::Object(_) | Value::Null => None,
        Value::Array(_) => unreachable!("arrays are walked into"),
    };
    match replacement {
        Some(v) => *spec.pointer_mut(&ptr).unwrap() = v,
        None => {
            let (parent, key) = ptr.rsplit_once('/').unwrap();
            spec.pointer_mut(parent)
                .unwrap()
                .as_object_mut()
                .unwrap()
                .remove(key);
        }
    }
}

fn config_of(spec: Value) -> Result<String, ToVmError> {
    let mut domain = full_domain();
    domain.spec = serde_json::from_value(spec).unwrap();
    vm_config(&domain).map(|c| format!("{c:?}"))
}

/// Changing `path` of `domain` changes the VMM's configuration, is refused naming it, or
/// is without effect: the paths without effect that are not in `no_effect` are returned,
/// those in it are added to `seen`.
fn walk_domain(
    domain: &Domain,
    no_effect: &[(&'static str, &'static str)],
    seen: &mut std::collections::BTreeSet<&'static str>,
) -> Vec<String> {
    let spec = serde_json::to_value(&domain.spec).unwrap();
    let baseline = config_of(spec.clone()).unwrap();
    let mut fields = Vec::new();
    leaves(&spec, "", &mut fields);
    assert!(fields.len() > 60, "{}", fields.len());
    let mut unexplained = Vec::new();
    for (path, bare) in &fields {
        let mut changed = spec.clone();
        mutate(&mut changed, path);
        // Removing an element the domain always writes (such as an empty
        // interface `Source`) changes nothing the domain can express.
        let reparsed: DomainSpec = serde_json::from_value(changed.clone()).unwrap();
        if serde_json::to_value(&reparsed).unwrap() == spec {
            continue;
        }
        let listed = no_effect
            .iter()
            .find(|(p, _)| bare == p || bare.starts_with(&format!("{p}.")));
        match config_of(changed) {
            Ok(config) if config != baseline => {
                assert!(
                    listed.is_none(),
                    "{path} changes the VMM but is listed as without effect"
                );
            }
            Ok(_) => match listed {
                Some((p, _)) => {
                    seen.insert(*p);
                }
                None => unexplained.push(path.clone()),
            },
            Err(ToVmError::Refused { field, .. }) => {
                let names_it = path == &field
                    || path.starts_with(&format!("{field}."))
                    || path.starts_with(&format!("{field}["))
                    // Memory and CurrentMemory must agree; a disagreement
                    // is reported on CurrentMemory.
                    || (path == "Memory.Value" && field == "CurrentMemory");
                assert!(names_it, "changing {path} is refused naming {field}");
            }
            Err(e) => panic!("changing {path}: {e}"),
        }
    }
    unexplained
}

/// The walk: each field of the full domain, changed, either changes the
/// VMM's configuration (mapped), makes it refuse the domain naming the
/// field or one of its parents (refused), or is listed in `NO_VMM_EFFECT`;
/// for a kernel given directly also `NO_VMM_EFFECT_WITH_KERNEL`. Both a
/// kernel-booting and a disk-booting domain are walked.
#[test]
fn every_domain_field_is_mapped_refused_or_explained() {
    let mut seen = std::collections::BTreeSet::new();
    let with_kernel: Vec<(&str, &str)> = NO_VMM_EFFECT
        .iter()
        .chain(NO_VMM_EFFECT_WITH_KERNEL)
        .copied()
        .collect();
    let unexplained = walk_domain(&full_domain(), &with_kernel, &mut seen);
    assert!(
        unexplained.is_empty(),
        "silently dropped (kernel boot): {unexplained:?}"
    );
    // One boot order staying the lowest and the other staying above it changes nothing;
    // which disk boots is tested on its own (above).
    let with_disk: Vec<(&str, &str)> = NO_VMM_EFFECT
        .iter()
        .copied()
        .chain([(
            "Devices.Disks.BootOrder",
            "the booted disk keeps the lowest order",
        )])
        .collect();
    let unexplained = walk_domain(&disk_boot_domain(), &with_disk, &mut seen);
    assert!(
        unexplained.is_empty(),
        "silently dropped (disk boot): {unexplained:?}"
    );
    // Every entry of the lists is a real field of the full domains.
    for (p, _) in NO_VMM_EFFECT.iter().chain(NO_VMM_EFFECT_WITH_KERNEL) {
        assert!(seen.contains(p), "{p} is not a field the walk found");
    }
}

/// A key the proto does not model (kept in an `extra` map) is refused by
/// name wherever it appears.
#[test]
fn unknown_keys_are_refused_by_name() {
    let spec = serde_json::to_value(&full_domain().spec).unwrap();
    let mut objects = Vec::new();
    fn walk(v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                out.push(at.to_string());
                for (k, v) in map {
                    walk(v, &join(at, k), out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    walk(v, &format!("{at}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    walk(&spec, "", &mut objects);
    let mut refused = 0;
    for at in objects {
        let mut changed = spec.clone();
        let ptr = if at.is_empty() {
            String::new()
        } else {
            pointer(&at)
        };
        changed
            .pointer_mut(&ptr)
            .unwrap()
            .as_object_mut()
            .unwrap()
            .insert("XUnknownField".into(), Value::from(1));
        let parsed: DomainSpec = serde_json::from_value(changed).unwrap();
        let kept = serde_json::to_string(&parsed)
            .unwrap()
            .contains("XUnknownField");
        let mut domain = full_domain();
        domain.spec = parsed;
        match vm_config(&domain) {
            Err(ToVmError::Refused { field, .. }) => {
                assert_eq!(field, join(&at, "XUnknownField"));
                refused += 1;
            }
            // The proto has no place for it: the key never reached the domain.
            Ok(_) => assert!(!kept, "{at}.XUnknownField kept and ignored"),
            Err(e) => panic!("{at}: {e}"),
        }
    }
    // Spec, OS, CPU, Features, Devices, both disks and the interface.
    assert_eq!(refused, 8);
}

#[test]
fn devices_the_vmm_lacks_are_refused() {
    let mut domain = full_domain();
    let devices = domain.spec.devices.as_mut().unwrap();
    devices.channels.push(proto::domain::Channel {
        r#type: "unix".into(),
        source: None,
        target: None,
    });
    let err = vm_config(&domain).unwrap_err();
    assert!(
        matches!(err, ToVmError::Refused { ref field, .. } if field == "Devices.Channels"),
        "{err}"
    );

    let mut domain = full_domain();
    domain.spec.devices.as_mut().unwrap().interfaces[0]
        .source
        .bridge = "br0".into();
    let err = vm_config(&domain).unwrap_err();
    assert!(
        err.to_string()
            .contains("Devices.Interfaces[0].Source.Bridge"),
        "{err}"
    );

    let mut domain = full_domain();
    let serials = &mut domain.spec.devices.as_mut().unwrap().serials;
    serials.push(serials[0].clone());
    assert!(
        vm_config(&domain)
            .unwrap_err()
            .to_string()
            .contains("Devices.Serials")
    );
}

#[test]
fn values_each_field_takes() {
    let with = |f: &dyn Fn(&mut Domain)| {
        let mut d = full_domain();
        f(&mut d);
        vm_config(&d)
    };
    // Cache modes; unknown ones are refused.
    for (mode, cache) in [
        ("", DiskCache::None),
        ("none", DiskCache::None),
        ("writethrough", DiskCache::WriteThrough),
        ("writeback", DiskCache::WriteBack),
    ] {
        let config = with(&|d| disk0(d).driver.as_mut().unwrap().cache = mode.into()).unwrap();
        assert_eq!(config.disks[0].cache, cache, "{mode:?}");
    }
    let err = with(&|d| disk0(d).driver.as_mut().unwrap().cache = "unsafe".into()).unwrap_err();
    assert!(
        err.to_string().contains("Devices.Disks[0].Driver.Cache"),
        "{err}"
    );
    // Discard: libvirt's default (no attribute) is QEMU's `ignore`.
    let config = with(&|d| disk0(d).driver.as_mut().unwrap().discard = String::new()).unwrap();
    assert!(!config.disks[0].discard);
    // Link down and no MTU.
    let config = with(&|d| {
        let iface = &mut d.spec.devices.as_mut().unwrap().interfaces[0];
        iface.link_state = Some(LinkState {
            state: "down".into(),
        });
        iface.mtu = None;
    })
    .unwrap();
    assert!(!config.nets[0].link_up);
    assert_eq!(config.nets[0].mtu, None);
    // Memory in bytes, as KubeVirt's converter writes it, without a current.
    let config = with(&|d| {
        d.spec.memory = Some(MemoryAmount::bytes(64 << 20));
        d.spec.current_memory = None;
    })
    .unwrap();
    assert_eq!(config.memory_mib, 64);
    // Without a hot-plug list every declared vCPU starts.
    let config = with(&|d| d.spec.vcpus = None).unwrap();
    assert_eq!(config.vcpus, 2);
    let err = with(&|d| d.spec.vcpus.as_mut().unwrap().vcpu[1].enabled = "yes".into());
    assert_eq!(err.unwrap().vcpus, 2);
    let err = with(&|d| {
        let list = &mut d.spec.vcpus.as_mut().unwrap().vcpu;
        list[0].enabled = "no".into();
        list[1].enabled = "yes".into();
    })
    .unwrap_err();
    assert!(err.to_string().contains("VCPUs.VCPU[1].Enabled"), "{err}");
    assert_eq!(
        with(&|d| d.spec.os = None).unwrap_err(),
        ToVmError::Missing("OS")
    );
}

fn disk0(d: &mut Domain) -> &mut Disk {
    &mut d.spec.devices.as_mut().unwrap().disks[0]
}

#[test]
fn memory_units_are_libvirts() {
    let amount = |value, unit: &str| MemoryAmount {
        value,
        unit: unit.into(),
    };
    assert_eq!(memory_bytes(&amount(131072, "KiB")), Some(128 << 20));
    assert_eq!(memory_bytes(&amount(131072, "")), Some(128 << 20));
    assert_eq!(memory_bytes(&amount(2, "GiB")), Some(2 << 30));
    assert_eq!(memory_bytes(&amount(3, "MB")), Some(3_000_000));
    assert_eq!(memory_bytes(&amount(5, "b")), Some(5));
    assert_eq!(memory_bytes(&amount(5, "parsecs")), None);
    assert_eq!(memory_bytes(&amount(u64::MAX, "KiB")), None);
}
