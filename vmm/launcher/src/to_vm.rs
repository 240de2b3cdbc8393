//! Domain → the VMM's configuration. The domain is what the handler sees;
//! this is the one place that decides what the VMM actually gets from it.
//!
//! Every field of the domain's spec is read here and is either mapped onto
//! the [`VmConfig`], refused by name when its value asks for something the
//! VMM does not do, or listed in [`NO_VMM_EFFECT`] with the reason it needs
//! no VMM setting. The domain's structs are destructured without `..`, so a
//! field added to `proto::domain` does not compile until it is handled
//! here, and keys the proto does not know (its `extra` maps) are refused.
//! The tests walk every field of a full domain and check which of the three
//! it is.

use proto::domain::{
    BackingStore, BackingStoreFormat, BootOrder, Console, ConsoleTarget, Cpu, Devices, Disk,
    DiskDriver, DiskSource, DiskTarget, Domain, DomainSpec, Features, Interface, InterfaceDriver,
    InterfaceSource, InterfaceTarget, LinkState, Mac, MemoryAmount, Model, Mtu, Os, OsType, Rng,
    RngBackend, Serial, SerialSource, SerialTarget as DomainSerialTarget, SmBios, SysInfo,
    SysInfoEntry, Vcpu, Vcpus, VcpusVcpu,
};
use proto::kubevirt::Extra;
use std::path::{Path, PathBuf};
use vmm::{
    BootDisk, BootFirmware, DiskBacking, DiskCache, DiskConfig, DiskFormat, KernelSource,
    NetConfig, SerialTarget, Smbios, SmbiosChassis, VmConfig,
};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ToVmError {
    #[error("domain has no {0}")]
    Missing(&'static str),
    /// `field` is the domain path, as in `Devices.Disks[0].Driver.Type`.
    #[error("{field}: {reason}")]
    Refused { field: String, reason: String },
}

fn refuse<T>(field: impl Into<String>, reason: impl Into<String>) -> Result<T, ToVmError> {
    Err(ToVmError::Refused {
        field: field.into(),
        reason: reason.into(),
    })
}

/// Domain fields (paths without indices; a path covers what is below it)
/// that need no VMM setting, and why.
pub const NO_VMM_EFFECT: &[(&str, &str)] = &[
    ("Name", "libvirt's domain name; the launcher's business"),
    ("Metadata", "KubeVirt's bookkeeping stored with the domain"),
    (
        "CPU.Topology",
        "the VMM presents its vCPUs as a flat list of APIC ids; sockets, cores and threads are not reflected in CPUID",
    ),
    (
        "VCPU.Placement",
        "where vCPU threads run is the host scheduler's",
    ),
    (
        "VCPUs.VCPU.Hotpluggable",
        "no CPU hot-plug (SyncVirtualMachineCPUs is refused)",
    ),
    ("VCPUs.VCPU.Order", "no CPU hot-plug"),
    (
        "Features.ACPI",
        "reported for the handler (soft reboot); the VMM always gives the guest its ACPI tables, power button and S5",
    ),
    (
        "Features.APIC",
        "the VMM always gives the guest local APICs and an IOAPIC",
    ),
    (
        "OS.Type.Machine",
        "the VMM has one machine, q35-like: a PCI host bridge (ECAM), virtio-pci, legacy ports",
    ),
    (
        "OS.BIOS.UseSerial",
        "SeaBIOS's own output: no firmware runs (the boot disk's configuration is read, not run)",
    ),
    (
        "Devices.Emulator",
        "QEMU's binary; the VMM runs inside the launcher",
    ),
    (
        "Devices.Disks.Target.Device",
        "a naming hint: the guest names virtio disks in probe order, which is the domain's order",
    ),
    (
        "Devices.Disks.Alias",
        "the disk's name in statistics and events",
    ),
    (
        "Devices.Disks.Driver.IO",
        "how QEMU submits I/O (native, threads); the VMM's I/O threads are its own",
    ),
    (
        "Devices.Interfaces.Alias",
        "the interface's name in statistics and events",
    ),
    (
        "Devices.Interfaces.BootOrder",
        "no network (PXE) boot: a disk boots (admission refuses a boot order on interfaces alone)",
    ),
    ("Devices.Interfaces.Rom", "no option ROM: no firmware"),
    (
        "Devices.Interfaces.Driver.Name",
        "QEMU's backend (vhost or userspace); the VMM's device is its own",
    ),
    ("Devices.Serials.Alias", "the device's name"),
    (
        "Devices.Serials.Log",
        "the launcher, not the VMM, copies the console into this file",
    ),
    (
        "Devices.Consoles.Type",
        "the console is the serial port's unix socket",
    ),
    ("Devices.Consoles.Alias", "the device's name"),
];

/// Keys of an `extra` map: fields the proto does not model are refused.
fn refuse_extra(at: &str, extra: &Extra) -> Result<(), ToVmError> {
    match extra.keys().next() {
        Some(key) => refuse(
            join(at, key),
            "not known to this launcher: the VMM cannot honour it",
        ),
        None => Ok(()),
    }
}

fn join(at: &str, key: &str) -> String {
    if at.is_empty() {
        key.to_string()
    } else {
        format!("{at}.{key}")
    }
}

/// Bytes of a libvirt memory amount (`b`, `KiB`, `MiB`, ... and the
/// decimal `KB`, `MB`, ...); `None` for an unknown unit or an overflow.
pub(crate) fn memory_bytes(amount: &MemoryAmount) -> Option<u64> {
    let scale: u64 = match amount.unit.as_str() {
        "b" | "bytes" => 1,
        "KB" => 1000,
        "MB" => 1000 * 1000,
        "GB" => 1000 * 1000 * 1000,
        "TB" => 1000 * 1000 * 1000 * 1000,
        // libvirt's default unit.
        "k" | "KiB" | "" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        "T" | "TiB" => 1 << 40,
        _ => return None,
    };
    amount.value.checked_mul(scale)
}

/// Fields without a VMM setting when the domain boots a kernel directly (they choose or
/// shape the boot disk's boot otherwise).
pub const NO_VMM_EFFECT_WITH_KERNEL: &[(&str, &str)] = &[(
    "Devices.Disks.BootOrder",
    "a kernel given directly is booted: no disk is chosen",
)];

/// Builds the VMM configuration of `domain`.
pub fn vm_config(domain: &Domain) -> Result<VmConfig, ToVmError> {
    let DomainSpec {
        r#type,
        name: _,
        uuid,
        memory,
        current_memory,
        os,
        cpu,
        vcpu,
        vcpus,
        features,
        sys_info,
        devices,
        metadata: _,
        extra,
    } = &domain.spec;
    refuse_extra("", extra)?;
    if !(r#type.is_empty() || r#type == "kvm") {
        return refuse("Type", format!("{type:?}: the VMM runs on KVM only"));
    }
    let (mut config, smbios_mode) = boot(os.as_ref().ok_or(ToVmError::Missing("OS"))?)?;
    config.memory_mib = memory_mib(memory.as_ref(), current_memory.as_ref())?;
    if let Some(cpu) = cpu {
        check_cpu(cpu)?;
    }
    config.vcpus = online_vcpus(vcpu.as_ref(), vcpus.as_ref())?;
    if let Some(Features {
        acpi: _,
        apic: _,
        extra,
    }) = features
    {
        refuse_extra("Features", extra)?;
    }
    if let Some(devices) = devices {
        map_devices(devices, &mut config)?;
    }
    if let KernelSource::Disk(boot) = &mut config.kernel {
        boot.disk = boot_disk(devices.as_ref())?;
    }
    config.smbios = smbios(uuid, sys_info.as_ref(), smbios_mode)?;
    Ok(config)
}

/// The disk to boot: the lowest boot order, else the first disk (as libvirt hands
/// KubeVirt's boot order to the firmware).
fn boot_disk(devices: Option<&Devices>) -> Result<usize, ToVmError> {
    let disks = devices.map(|d| d.disks.as_slice()).unwrap_or_default();
    if disks.is_empty() {
        return refuse("OS.Kernel", "no kernel and no disk to boot");
    }
    Ok(disks
        .iter()
        .enumerate()
        .filter_map(|(i, d)| d.boot_order.as_ref().map(|BootOrder { order }| (*order, i)))
        .min()
        .map_or(0, |(_, i)| i))
}

/// The SMBIOS tables: `SysInfo`'s system and chassis entries (libvirt's `sysinfo` mode),
/// the system UUID the domain's (libvirt refuses a `sysinfo` UUID that differs).
fn smbios(uuid: &str, info: Option<&SysInfo>, mode: bool) -> Result<Smbios, ToVmError> {
    let parse = |text: &str, at: &str| {
        parse_uuid(text).ok_or_else(|| ToVmError::Refused {
            field: at.to_string(),
            reason: format!("{text:?} is not a UUID"),
        })
    };
    let domain_uuid = (!uuid.is_empty())
        .then(|| parse(uuid, "UUID"))
        .transpose()?;
    let mut out = Smbios::default();
    out.system.uuid = domain_uuid;
    let Some(SysInfo {
        r#type,
        system,
        bios,
        base_board,
        chassis,
    }) = info
    else {
        return Ok(out);
    };
    if !mode {
        return refuse("SysInfo", "given, but OS.SMBios does not select sysinfo");
    }
    if r#type != "smbios" {
        return refuse("SysInfo.Type", format!("{type:?}: only smbios"));
    }
    for (key, list) in [("BIOS", bios), ("BaseBoard", base_board)] {
        if !list.is_empty() {
            return refuse(
                format!("SysInfo.{key}"),
                "KubeVirt writes none: the VMM writes its own BIOS record and no baseboard",
            );
        }
    }
    for (i, SysInfoEntry { name, value }) in system.iter().enumerate() {
        let at = format!("SysInfo.System[{i}]");
        let field = match name.as_str() {
            "manufacturer" => &mut out.system.manufacturer,
            "product" => &mut out.system.product,
            "version" => &mut out.system.version,
            "serial" => &mut out.system.serial,
            "sku" => &mut out.system.sku,
            "family" => &mut out.system.family,
            "uuid" => {
                let entry = parse(value, &format!("{at}.Value"))?;
                if domain_uuid.is_some_and(|d| d != entry) {
                    return refuse("UUID", format!("differs from the sysinfo UUID {value}"));
                }
                out.system.uuid = Some(entry);
                continue;
            }
            other => {
                return refuse(
                    format!("{at}.Name"),
                    format!("{other:?}: not a system entry"),
                );
            }
        };
        *field = value.clone();
    }
    for (i, SysInfoEntry { name, value }) in chassis.iter().enumerate() {
        let SmbiosChassis {
            manufacturer,
            version,
            serial,
            asset,
            sku,
        } = &mut out.chassis;
        let field = match name.as_str() {
            "manufacturer" => manufacturer,
            "version" => version,
            "serial" => serial,
            "asset" => asset,
            "sku" => sku,
            other => {
                return refuse(
                    format!("SysInfo.Chassis[{i}].Name"),
                    format!("{other:?}: not a chassis entry"),
                );
            }
        };
        *field = value.clone();
    }
    Ok(out)
}

/// A UUID in its canonical text form (8-4-4-4-12 hex digits), as bytes.
fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    let groups: Vec<usize> = text.split('-').map(str::len).collect();
    if groups != [8, 4, 4, 4, 12] || hex.len() != 32 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

/// Direct kernel boot (kernel, initrd, command line), or the boot disk as the firmware
/// `Firmware` names (BIOS by default). Also whether `OS.SMBios` selects `sysinfo`.
fn boot(os: &Os) -> Result<(VmConfig, bool), ToVmError> {
    let Os {
        firmware,
        r#type:
            OsType {
                os: os_type,
                arch,
                machine: _,
            },
        smbios,
        // SeaBIOS's output option: no firmware runs here (NO_VMM_EFFECT).
        bios: _,
        kernel,
        initrd,
        kernel_args,
        extra,
    } = os;
    let smbios_mode = match smbios {
        None => false,
        Some(SmBios { mode }) if mode == "sysinfo" => true,
        Some(SmBios { mode }) => {
            return refuse(
                "OS.SMBios.Mode",
                format!("{mode:?}: only sysinfo (the VMM writes the domain's SysInfo)"),
            );
        }
    };
    let boot_firmware = match firmware.as_str() {
        "" | "bios" => BootFirmware::Bios,
        "efi" => BootFirmware::Efi,
        other => return refuse("OS.Firmware", format!("{other:?}: bios or efi")),
    };
    refuse_extra("OS", extra)?;
    if os_type != "hvm" {
        return refuse("OS.Type.OS", format!("{os_type:?}: only hvm"));
    }
    if !(arch.is_empty() || arch == "x86_64") {
        return refuse("OS.Type.Arch", format!("{arch:?}: only x86_64"));
    }
    if kernel.is_empty() {
        // The boot disk's entry brings its own initrd and command line.
        if !initrd.is_empty() {
            return refuse("OS.Initrd", "an initrd without a kernel");
        }
        if !kernel_args.is_empty() {
            return refuse("OS.KernelArgs", "kernel arguments without a kernel");
        }
        let config = VmConfig::new(KernelSource::Disk(BootDisk {
            // Chosen once the disks are mapped.
            disk: 0,
            firmware: boot_firmware,
        }));
        return Ok((config, smbios_mode));
    }
    let mut config = VmConfig::new(KernelSource::Path(PathBuf::from(kernel)));
    config.initrd = (!initrd.is_empty()).then(|| PathBuf::from(initrd));
    // The VMM appends the virtio-mmio device announcements itself.
    config.cmdline = if kernel_args.is_empty() {
        vmm::config::DEFAULT_CMDLINE.to_string()
    } else {
        kernel_args.clone()
    };
    Ok((config, smbios_mode))
}

/// Guest RAM in MiB (rounded up). Without a balloon the guest always has
/// all of it: a current memory below the maximum is refused.
fn memory_mib(
    memory: Option<&MemoryAmount>,
    current: Option<&MemoryAmount>,
) -> Result<u64, ToVmError> {
    let memory = memory.ok_or(ToVmError::Missing("Memory"))?;
    let bytes = memory_bytes(memory).ok_or_else(|| ToVmError::Refused {
        field: "Memory.Unit".into(),
        reason: format!("{:?} is not a libvirt memory unit", memory.unit),
    })?;
    if let Some(current) = current {
        let current_bytes = memory_bytes(current).ok_or_else(|| ToVmError::Refused {
            field: "CurrentMemory.Unit".into(),
            reason: format!("{:?} is not a libvirt memory unit", current.unit),
        })?;
        if current_bytes != bytes {
            return refuse(
                "CurrentMemory",
                format!("{current_bytes} bytes, not the {bytes} of Memory: the VMM has no balloon"),
            );
        }
    }
    Ok(bytes.div_ceil(1 << 20))
}

fn check_cpu(cpu: &Cpu) -> Result<(), ToVmError> {
    let Cpu {
        mode,
        model,
        topology: _,
        extra,
    } = cpu;
    refuse_extra("CPU", extra)?;
    // The VMM passes the host's KVM-supported CPUID through: host-model and
    // host-passthrough both mean that; named models are not emulated.
    if !matches!(mode.as_str(), "" | "host-model" | "host-passthrough") {
        return refuse(
            "CPU.Mode",
            format!("{mode:?}: only host-model or host-passthrough"),
        );
    }
    if !model.is_empty() {
        return refuse(
            "CPU.Model",
            format!("{model:?}: named models are not emulated"),
        );
    }
    Ok(())
}

/// The vCPUs the VM starts with: `VCPU.CPUs`, or with a hot-plug list
/// (`VCPUs`) the enabled ones, which must be the first.
fn online_vcpus(vcpu: Option<&Vcpu>, vcpus: Option<&Vcpus>) -> Result<u8, ToVmError> {
    let total = match vcpu {
        Some(Vcpu { placement: _, cpus }) => *cpus,
        None => 1,
    };
    let online = match vcpus {
        None => total,
        Some(Vcpus { vcpu: list }) => {
            if list.len() as u64 != u64::from(total) {
                return refuse(
                    "VCPU.CPUs",
                    format!("{total}, but VCPUs lists {} vCPUs", list.len()),
                );
            }
            let mut online = 0u32;
            for (i, entry) in list.iter().enumerate() {
                let VcpusVcpu {
                    id,
                    enabled,
                    hotpluggable: _,
                    order: _,
                } = entry;
                let at = format!("VCPUs.VCPU[{i}]");
                if int_cast::u32_to_usize(*id) != i {
                    return refuse(format!("{at}.ID"), format!("{id}, expected {i}"));
                }
                match (enabled.as_str(), int_cast::u32_to_usize(online) == i) {
                    ("yes", true) => online += 1,
                    ("no", _) => {}
                    ("yes", false) => {
                        return refuse(
                            format!("{at}.Enabled"),
                            "enabled after a disabled vCPU: the VMM starts the first N",
                        );
                    }
                    (other, _) => {
                        return refuse(format!("{at}.Enabled"), format!("{other:?}: yes or no"));
                    }
                }
            }
            online
        }
    };
    u8::try_from(online)
        .ok()
        .filter(|v| *v >= 1 && *v <= vmm::config::MAX_VCPUS)
        .map_or_else(
            || {
                refuse(
                    "VCPU.CPUs",
                    format!("{online} vCPUs: 1 to {}", vmm::config::MAX_VCPUS),
                )
            },
            Ok,
        )
}

fn map_devices(devices: &Devices, config: &mut VmConfig) -> Result<(), ToVmError> {
    let Devices {
        emulator: _,
        interfaces,
        channels,
        disks,
        serials,
        consoles,
        rng,
        extra,
    } = devices;
    refuse_extra("Devices", extra)?;
    if !channels.is_empty() {
        return refuse(
            "Devices.Channels",
            "no guest agent or other channel devices",
        );
    }
    for (i, disk) in disks.iter().enumerate() {
        config
            .disks
            .push(disk_config(disk, &format!("Devices.Disks[{i}]"))?);
    }
    for (i, iface) in interfaces.iter().enumerate() {
        config
            .nets
            .push(net_config(iface, &format!("Devices.Interfaces[{i}]"))?);
    }
    config.serial = serial_target(serials)?;
    for (i, console) in consoles.iter().enumerate() {
        check_console(console, &format!("Devices.Consoles[{i}]"))?;
    }
    if let Some(rng) = rng {
        check_rng(rng)?;
        config.rng = true;
    }
    Ok(())
}

fn disk_config(disk: &Disk, at: &str) -> Result<DiskConfig, ToVmError> {
    let Disk {
        device,
        r#type,
        source: DiskSource { dev, file },
        target: DiskTarget { bus, device: _ },
        serial,
        driver,
        read_only,
        alias: _,
        backing_store,
        boot_order: _,
        extra,
    } = disk;
    refuse_extra(at, extra)?;
    if device != "disk" {
        return refuse(format!("{at}.Device"), format!("{device:?}: only disk"));
    }
    let path = match (r#type.as_str(), file.is_empty(), dev.is_empty()) {
        ("file", false, true) => file,
        ("block", true, false) => dev,
        ("file" | "block", _, _) => {
            return refuse(
                format!("{at}.Source"),
                format!(
                    "a {type} disk needs exactly Source.{}",
                    if r#type == "file" { "File" } else { "Dev" }
                ),
            );
        }
        (other, _, _) => return refuse(format!("{at}.Type"), format!("{other:?}: file or block")),
    };
    if !(bus.is_empty() || bus == "virtio") {
        return refuse(format!("{at}.Target.Bus"), format!("{bus:?}: only virtio"));
    }
    let mut config = DiskConfig::new(path, DiskFormat::Raw);
    config.read_only = read_only.is_some();
    config.serial = serial.clone();
    // Without a driver element QEMU would use a raw image and ignore discards.
    config.discard = false;
    config.cache = DiskCache::None;
    if let Some(driver) = driver {
        driver_options(driver, &format!("{at}.Driver"), &mut config)?;
    }
    if let Some(store) = backing_store {
        config.backing = backing_policy(store, &format!("{at}.BackingStore"))?;
    }
    Ok(config)
}

/// The one backing file an overlay may open: the file the domain names, as
/// the format it names, and nothing below it (libvirt hands QEMU the chain
/// the same way, instead of letting it follow the names in the images).
/// The check is on resolved paths: the container-disk link leads into the
/// image volume, so the directory allowed is the one the file really lies
/// in, resolved when the file exists (the launcher converts after it
/// created the files). Unresolved, the open fails on the missing file.
fn backing_policy(store: &BackingStore, at: &str) -> Result<DiskBacking, ToVmError> {
    let BackingStore {
        r#type,
        format,
        source,
    } = store;
    if r#type != "file" {
        return refuse(format!("{at}.Type"), format!("{type:?}: only file"));
    }
    let format = match format {
        Some(BackingStoreFormat { r#type }) => match r#type.as_str() {
            "raw" => DiskFormat::Raw,
            "qcow2" => DiskFormat::Qcow2,
            other => {
                return refuse(
                    format!("{at}.Format.Type"),
                    format!("{other:?}: raw or qcow2"),
                );
            }
        },
        None => {
            return refuse(
                format!("{at}.Format"),
                "required: a backing file's format is never guessed",
            );
        }
    };
    let Some(DiskSource { dev, file }) = source else {
        return refuse(format!("{at}.Source"), "required");
    };
    if !dev.is_empty() {
        return refuse(
            format!("{at}.Source.Dev"),
            "a backing file, not a block device",
        );
    }
    let file = Path::new(file);
    if !file.is_absolute() {
        return refuse(
            format!("{at}.Source.File"),
            format!("{file:?}: must be an absolute path"),
        );
    }
    let resolved = file.canonicalize().unwrap_or_else(|_| file.to_path_buf());
    let dir = resolved.parent().unwrap_or(Path::new("/")).to_path_buf();
    Ok(DiskBacking::Within { dir, format })
}

fn driver_options(driver: &DiskDriver, at: &str, config: &mut DiskConfig) -> Result<(), ToVmError> {
    let DiskDriver {
        cache,
        error_policy,
        io: _,
        name,
        r#type,
        discard,
    } = driver;
    if !(name.is_empty() || name == "qemu") {
        return refuse(format!("{at}.Name"), format!("{name:?}: only qemu"));
    }
    config.format = match r#type.as_str() {
        "raw" | "" => DiskFormat::Raw,
        "qcow2" => DiskFormat::Qcow2,
        other => return refuse(format!("{at}.Type"), format!("{other:?}: raw or qcow2")),
    };
    // Unset until the launcher has probed for direct I/O
    // (`disks::cache_mode`); KubeVirt's first choice is `none`.
    config.cache = match cache.as_str() {
        "" => DiskCache::None,
        mode => mode
            .parse()
            .or_else(|e: String| refuse(format!("{at}.Cache"), e))?,
    };
    // The VMM reports I/O errors to the guest (`report`). `stop`, KubeVirt's
    // default, would pause the VM instead; it is accepted with that
    // difference (see `docs/converter-vs-kubevirt.md`). `ignore` and `enospace` are refused.
    if !matches!(error_policy.as_str(), "" | "stop" | "report") {
        return refuse(
            format!("{at}.ErrorPolicy"),
            format!("{error_policy:?}: I/O errors are reported to the guest"),
        );
    }
    config.discard = match discard.as_str() {
        "unmap" => true,
        "ignore" | "" => false,
        other => {
            return refuse(
                format!("{at}.Discard"),
                format!("{other:?}: unmap or ignore"),
            );
        }
    };
    Ok(())
}

fn net_config(iface: &Interface, at: &str) -> Result<NetConfig, ToVmError> {
    let Interface {
        r#type,
        source:
            InterfaceSource {
                network,
                device,
                bridge,
                mode,
            },
        target,
        model,
        mac,
        mtu,
        boot_order: _,
        link_state,
        alias: _,
        driver,
        rom: _,
        extra,
    } = iface;
    refuse_extra(at, extra)?;
    if r#type != "ethernet" {
        return refuse(
            format!("{at}.Type"),
            format!("{type:?}: only ethernet (a tap the launcher opens)"),
        );
    }
    for (key, value) in [
        ("Network", network),
        ("Device", device),
        ("Bridge", bridge),
        ("Mode", mode),
    ] {
        if !value.is_empty() {
            return refuse(
                format!("{at}.Source.{key}"),
                "an ethernet interface has no source",
            );
        }
    }
    let Some(InterfaceTarget {
        device: tap,
        managed,
    }) = target
    else {
        return Err(ToVmError::Missing("interface target"));
    };
    if !(managed.is_empty() || managed == "no") {
        return refuse(
            format!("{at}.Target.Managed"),
            "the VMM opens an existing tap, it does not create one",
        );
    }
    match model {
        Some(Model { r#type: m })
            if matches!(
                m.as_str(),
                "virtio" | "virtio-non-transitional" | "virtio-transitional"
            ) => {}
        Some(Model { r#type: m }) => {
            return refuse(format!("{at}.Model.Type"), format!("{m:?}: only virtio"));
        }
        None => {
            return refuse(
                format!("{at}.Model"),
                "no model (QEMU's default is an rtl8139): only virtio",
            );
        }
    }
    let mut config = NetConfig::new(tap.clone());
    if let Some(Mac { mac }) = mac {
        config.mac = Some(
            vmm::config::parse_mac(mac).ok_or_else(|| ToVmError::Refused {
                field: format!("{at}.MAC.MAC"),
                reason: format!("{mac:?} is not a MAC address"),
            })?,
        );
    }
    if let Some(Mtu { size }) = mtu {
        config.mtu = Some(
            size.parse::<u16>()
                .ok()
                .filter(|m| *m >= 68)
                .ok_or_else(|| ToVmError::Refused {
                    field: format!("{at}.MTU.Size"),
                    reason: format!("{size:?} is not an MTU (68 to 65535)"),
                })?,
        );
    }
    if let Some(LinkState { state }) = link_state {
        config.link_up = match state.as_str() {
            "up" | "" => true,
            "down" => false,
            other => {
                return refuse(
                    format!("{at}.LinkState.State"),
                    format!("{other:?}: up or down"),
                );
            }
        };
    }
    if let Some(InterfaceDriver { name: _, queues }) = driver
        && queues.is_some_and(|q| q > 1)
    {
        return refuse(
            format!("{at}.Driver.Queues"),
            "one queue pair per interface (no multiqueue)",
        );
    }
    Ok(config)
}

/// The VMM's one 8250 UART (COM1): at most one serial, on port 0, whose
/// unix socket the VMM listens on.
fn serial_target(serials: &[Serial]) -> Result<SerialTarget, ToVmError> {
    if serials.len() > 1 {
        return refuse("Devices.Serials", "one serial port (COM1)");
    }
    let Some(serial) = serials.first() else {
        return Ok(SerialTarget::Null);
    };
    let at = "Devices.Serials[0]";
    let Serial {
        r#type,
        target,
        source,
        alias: _,
        log: _,
    } = serial;
    if let Some(DomainSerialTarget { port: Some(port) }) = target
        && *port != 0
    {
        return refuse(
            format!("{at}.Target.Port"),
            format!("{port}: only port 0 (COM1)"),
        );
    }
    if r#type != "unix" {
        return refuse(format!("{at}.Type"), format!("{type:?}: only unix"));
    }
    let Some(SerialSource { mode, path }) = source else {
        return refuse(format!("{at}.Source"), "a unix serial needs a socket path");
    };
    if !(mode.is_empty() || mode == "bind") {
        return refuse(
            format!("{at}.Source.Mode"),
            format!("{mode:?}: the VMM listens (bind)"),
        );
    }
    if path.is_empty() {
        return refuse(format!("{at}.Source.Path"), "empty");
    }
    Ok(SerialTarget::UnixSocket(PathBuf::from(path)))
}

/// A console is the serial port seen from outside: only `serial` port 0.
fn check_console(console: &Console, at: &str) -> Result<(), ToVmError> {
    let Console {
        r#type: _,
        target,
        alias: _,
    } = console;
    if let Some(ConsoleTarget { r#type, port }) = target {
        if let Some(t) = r#type
            && t != "serial"
        {
            return refuse(
                format!("{at}.Target.Type"),
                format!("{t:?}: only serial (no virtio console)"),
            );
        }
        if let Some(p) = port
            && *p != 0
        {
            return refuse(format!("{at}.Target.Port"), format!("{p}: only port 0"));
        }
    }
    Ok(())
}

/// virtio-rng fed by the host kernel's CSPRNG (`getrandom`), which is what
/// `/dev/urandom` and, since Linux 5.6, `/dev/random` give.
fn check_rng(rng: &Rng) -> Result<(), ToVmError> {
    let Rng { model, backend } = rng;
    if !matches!(
        model.as_str(),
        "virtio" | "virtio-non-transitional" | "virtio-transitional"
    ) {
        return refuse("Devices.Rng.Model", format!("{model:?}: only virtio"));
    }
    if let Some(RngBackend { model, source }) = backend {
        if model != "random" {
            return refuse(
                "Devices.Rng.Backend.Model",
                format!("{model:?}: only random"),
            );
        }
        if !matches!(source.as_str(), "" | "/dev/urandom" | "/dev/random") {
            return refuse(
                "Devices.Rng.Backend.Source",
                format!("{source:?}: the host's kernel CSPRNG only"),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
