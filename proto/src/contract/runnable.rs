//! What this project's launcher can run, written once.
//!
//! KubeVirt's launcher runs almost any VMI its API admits; ours runs a small VMM that boots
//! a kernel (one the VMI names, or the one its boot disk's boot loader configuration
//! chooses: [`super::boot_disk`]), so some VMIs KubeVirt admits can never run here. [`check`] says which, as a pure
//! function of the VMI, and every process that could start a VMI asks it first:
//!
//! - the controller, before it renders a launcher pod (a refused VMI gets a condition and an
//!   event, and no pod);
//! - the launcher's converter, before it converts the VMI into a domain;
//! - the handler's standalone mode, before it creates a pod for a manifest.
//!
//! The launcher keeps its own, more detailed refusals, but every VMI it refuses for what the
//! VMI says (not for what it found in the pod) is refused here too: a test in the launcher
//! runs both on a table of VMIs and fails when they disagree.
//!
//! Besides what the launcher cannot convert, [`check`] refuses what it would silently run
//! wrong: memory backed by hugepages, memory encryption (SEV/SNP/TDX), CPU features to
//! require (no node carries CPU-feature labels), disable or force, probes and credentials that need a guest agent, hook sidecars.

use crate::kubevirt::{Interface, Network, VirtualMachineInstance, Volume, quantity};
use serde_json::Value;
use std::path::{Component, Path};

/// Why a VMI cannot run here: the dotted path of the field and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The dotted path of the field, e.g. `spec.domain.devices.disks[0].disk.bus`.
    pub field: String,
    /// Why, as a sentence a VMI's author can act on.
    pub reason: String,
}

impl Refusal {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Refusal {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for Refusal {}

/// The most vCPUs the VMM runs (8-bit xAPIC ids; `vmm::config::MAX_VCPUS`).
pub const MAX_VCPUS: u32 = 254;

/// The smallest guest the launcher boots (the boot structures need a few MiB).
pub const MIN_GUEST_MEMORY_BYTES: u64 = 16 << 20;

/// The interface bindings the launcher can wire to the pod network: masquerade, and bridge
/// (added by the bridge binding in the launcher and netsetup).
pub const POD_NETWORK_BINDINGS: &[&str] = &["masquerade", "bridge"];

/// `spec.domain.devices` entries for hardware the VMM does not emulate.
pub const UNSUPPORTED_DEVICES: &[&str] = &[
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

/// The annotation that asks for hook sidecars (`hooks.HookSidecarListAnnotationName`).
const HOOK_SIDECARS_ANNOTATION: &str = "hooks.kubevirt.io/hookSidecars";

/// The first reason `vmi` cannot run on this project's launcher, if any.
pub fn check(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    if vmi.metadata.name.as_deref().is_none_or(str::is_empty) {
        return Err(Refusal::new("metadata.name", "is required"));
    }
    if vmi
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(HOOK_SIDECARS_ANNOTATION))
    {
        return Err(Refusal::new(
            format!("metadata.annotations[{HOOK_SIDECARS_ANNOTATION}]"),
            "hook sidecars are not supported: this launcher has no libvirt domain to hook into",
        ));
    }
    machine(vmi)?;
    firmware(vmi)?;
    cpu(vmi)?;
    memory(vmi)?;
    devices(vmi)?;
    names(vmi)?;
    disks(vmi)?;
    volumes(vmi)?;
    interfaces(vmi)?;
    probes(vmi)?;
    access_credentials(vmi)?;
    Ok(())
}

fn machine(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    if let Some(arch) = vmi.spec.architecture.as_deref()
        && !arch.is_empty()
        && arch != "amd64"
    {
        return Err(Refusal::new(
            "spec.architecture",
            format!("{arch:?} is not supported: only amd64"),
        ));
    }
    let machine = vmi
        .spec
        .domain
        .machine
        .as_ref()
        .map(|m| m.machine_type.as_str())
        .filter(|m| !m.is_empty())
        .unwrap_or("q35");
    if !(machine == "q35" || machine.starts_with("pc-q35")) {
        return Err(Refusal::new(
            "spec.domain.machine.type",
            format!("{machine:?} is not supported: only q35"),
        ));
    }
    if let Some(security) = vmi
        .spec
        .domain
        .extra
        .get("launchSecurity")
        .filter(|v| !v.is_null())
    {
        let which = security
            .as_object()
            .and_then(|o| o.iter().find(|(_, v)| !v.is_null()).map(|(k, _)| k.clone()));
        let field = match which {
            Some(kind) => format!("spec.domain.launchSecurity.{kind}"),
            None => "spec.domain.launchSecurity".to_string(),
        };
        return Err(Refusal::new(
            field,
            "memory encryption (SEV, SNP, TDX) is not supported by this launcher",
        ));
    }
    Ok(())
}

/// Kernel boot as KubeVirt admits it, or a disk to boot with a firmware this launcher
/// stands in for (`boot_disk`).
fn firmware(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let field = super::kernel_boot::FIELD;
    let Some(kernel_boot) = super::kernel_boot::kernel_boot(vmi) else {
        super::boot_disk::firmware(vmi)?;
        super::boot_disk::choose(vmi)?;
        return Ok(());
    };
    let Some(container) = &kernel_boot.container else {
        // KubeVirt's admission: kernel arguments need a kernel to pass them to.
        if kernel_boot
            .kernel_args
            .as_deref()
            .is_some_and(|a| !a.is_empty())
        {
            return Err(Refusal::new(
                format!("{field}.kernelArgs"),
                "kernel arguments cannot be provided without an external kernel",
            ));
        }
        super::boot_disk::firmware(vmi)?;
        super::boot_disk::choose(vmi)?;
        return Ok(());
    };
    super::boot_disk::firmware(vmi)?;
    if container.image.is_empty() {
        return Err(Refusal::new(
            format!("{field}.container.image"),
            "is required",
        ));
    }
    let Some(kernel) = container.kernel_path.as_deref() else {
        return Err(Refusal::new(
            format!("{field}.container.kernelPath"),
            "required: an initrd alone is not booted (boot the disk instead, without kernelBoot)",
        ));
    };
    let kernel = image_file(kernel, &format!("{field}.container.kernelPath"))?;
    if let Some(initrd) = container.initrd_path.as_deref() {
        let initrd = image_file(initrd, &format!("{field}.container.initrdPath"))?;
        if initrd == kernel {
            return Err(Refusal::new(
                format!("{field}.container.initrdPath"),
                "kernel and initrd must have different file names",
            ));
        }
    }
    Ok(())
}

/// The file name of a path inside the kernel-boot image; refuses paths that could leave it
/// (`..`), name the image's root, or are empty.
fn image_file<'a>(path: &'a str, field: &str) -> Result<&'a str, Refusal> {
    let relative = Path::new(path.trim_start_matches('/'));
    let inside = relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    match relative.file_name().and_then(|n| n.to_str()) {
        Some(name) if inside => Ok(name),
        _ => Err(Refusal::new(
            field,
            format!("{path:?} must be a file path inside the image"),
        )),
    }
}

fn cpu(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let Some(cpu) = vmi.spec.domain.cpu.as_ref() else {
        return Ok(());
    };
    let vcpus = [cpu.sockets, cpu.cores, cpu.threads]
        .iter()
        .try_fold(1u32, |product, n| product.checked_mul(n.unwrap_or(1)));
    if !vcpus.is_some_and(|n| (1..=MAX_VCPUS).contains(&n)) {
        return Err(Refusal::new(
            "spec.domain.cpu",
            format!("sockets × cores × threads must be between 1 and {MAX_VCPUS}"),
        ));
    }
    if let Some(model) = cpu.model.as_deref()
        && model != "host-model"
        && model != "host-passthrough"
    {
        return Err(Refusal::new(
            "spec.domain.cpu.model",
            format!(
                "{model:?} is not supported: use host-model or host-passthrough (the VMM gives the guest the host's CPU)"
            ),
        ));
    }
    if cpu.dedicated_cpu_placement == Some(true) {
        return Err(Refusal::new(
            "spec.domain.cpu.dedicatedCpuPlacement",
            "CPU pinning is not supported by this launcher",
        ));
    }
    if cpu.extra.get("realtime").is_some_and(|r| !r.is_null()) {
        return Err(Refusal::new(
            "spec.domain.cpu.realtime",
            "realtime vCPUs are not supported by this launcher",
        ));
    }
    let features = match cpu.extra.get("features") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(features)) => features.as_slice(),
        Some(_) => {
            return Err(Refusal::new("spec.domain.cpu.features", "must be a list"));
        }
    };
    for (i, feature) in features.iter().enumerate() {
        let field = format!("spec.domain.cpu.features[{i}]");
        if feature.get("name").and_then(Value::as_str).is_none() {
            return Err(Refusal::new(format!("{field}.name"), "is required"));
        }
        // A required feature (the default policy) becomes a `cpu-feature.node.kubevirt.io/`
        // node selector, and our handler writes no such label (the guest's CPUID is the
        // VMM's, not the host's libvirt host-model): such a pod could never be scheduled.
        // Forbidden features keep the pod off nodes with the label (so off none), optional
        // ones change nothing; hiding or adding a feature is not done.
        let policy = feature.get("policy").and_then(Value::as_str).unwrap_or("");
        match policy {
            "optional" | "forbid" => {}
            "" | "require" => {
                return Err(Refusal::new(
                    format!("{field}.policy"),
                    "requiring a CPU feature is not supported: no node is labelled with CPU features (cpu-feature.node.kubevirt.io/), so the pod could never be scheduled; use optional",
                ));
            }
            _ => {
                return Err(Refusal::new(
                    format!("{field}.policy"),
                    format!(
                        "{policy:?} is not supported: the guest's CPU features are not changed per VMI, so only optional and forbid can be honoured"
                    ),
                ));
            }
        }
    }
    Ok(())
}

fn memory(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let domain = &vmi.spec.domain;
    if domain
        .memory
        .as_ref()
        .is_some_and(|m| m.hugepages.as_ref().is_some_and(|h| !h.is_null()))
    {
        return Err(Refusal::new(
            "spec.domain.memory.hugepages",
            "hugepages are not supported: this launcher backs guest memory with ordinary pages",
        ));
    }
    guest_memory_bytes(vmi).map(drop)
}

/// Where the guest's memory size comes from, in KubeVirt's order: `memory.guest`, else the
/// memory request, else the limit (the field's path and its quantity); `None` without any.
pub fn guest_memory_source(
    vmi: &VirtualMachineInstance,
) -> Option<(&'static str, crate::kubevirt::Quantity)> {
    let domain = &vmi.spec.domain;
    let resources = domain.resources.as_ref();
    let from = |map: Option<&std::collections::BTreeMap<String, crate::kubevirt::Quantity>>| {
        map.and_then(|m| m.get("memory")).cloned()
    };
    if let Some(q) = domain.memory.as_ref().and_then(|m| m.guest.clone()) {
        Some(("spec.domain.memory.guest", q))
    } else if let Some(q) = from(resources.and_then(|r| r.requests.as_ref())) {
        Some(("spec.domain.resources.requests.memory", q))
    } else {
        from(resources.and_then(|r| r.limits.as_ref()))
            .map(|q| ("spec.domain.resources.limits.memory", q))
    }
}

/// The guest's RAM as this launcher maps it: [`guest_memory_source`] in whole MiB (rounded
/// up), at least [`MIN_GUEST_MEMORY_BYTES`].
pub fn guest_memory_bytes(vmi: &VirtualMachineInstance) -> Result<u64, Refusal> {
    let Some((field, size)) = guest_memory_source(vmi) else {
        return Err(Refusal::new(
            "spec.domain.memory.guest",
            "no guest memory: set memory.guest or resources.requests.memory",
        ));
    };
    let bytes = quantity::to_bytes(&size).map_err(|e| Refusal::new(field, e.to_string()))?;
    if bytes < MIN_GUEST_MEMORY_BYTES {
        return Err(Refusal::new(
            field,
            format!("{} is below the minimum of 16Mi", size.0),
        ));
    }
    Ok(bytes.div_ceil(1 << 20) << 20)
}

fn devices(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let devices = &vmi.spec.domain.devices;
    for key in UNSUPPORTED_DEVICES {
        if devices.extra.get(*key).is_some_and(non_empty) {
            return Err(Refusal::new(
                format!("spec.domain.devices.{key}"),
                "this device is not supported by this launcher",
            ));
        }
    }
    Ok(())
}

/// Volume and disk names as KubeVirt's admission takes them (`validateVolumes` in
/// `pkg/virt-api/webhooks/validating-webhook/admitters/vmi-create-admitter.go`,
/// `ValidateDisks` in `pkg/storage/admitters/disks.go`): unique, and DNS-1123 labels (the API
/// documents volume names as `DNS_LABEL`s; admission checks the disk of the same name). The
/// launcher builds file names from volume names, so a name that is no label (`../x`, `/x`)
/// would be a path out of its directories: it checks the same rule again
/// ([`volume_name`]).
fn names(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let volumes = vmi.spec.volumes.iter().map(|v| v.name.as_str());
    let disks = vmi
        .spec
        .domain
        .devices
        .disks
        .iter()
        .map(|d| d.name.as_str());
    for (list, names) in [
        ("spec.volumes", volumes.collect::<Vec<_>>()),
        ("spec.domain.devices.disks", disks.collect()),
    ] {
        for (i, name) in names.iter().enumerate() {
            let field = format!("{list}[{i}].name");
            volume_name(name).map_err(|reason| Refusal::new(&field, reason))?;
            if let Some(first) = names[..i].iter().position(|other| other == name) {
                return Err(Refusal::new(
                    field,
                    format!("{list}[{i}] and {list}[{first}] must not have the same name"),
                ));
            }
        }
    }
    Ok(())
}

/// The longest DNS-1123 label.
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;

/// Whether `name` can name a volume: a DNS-1123 label (at most 63 characters, lower-case
/// letters, digits and `-`, starting and ending with a letter or digit), as KubeVirt's
/// admission requires. Such a name is always one plain path component. `Err` says why not.
pub fn volume_name(name: &str) -> Result<(), String> {
    if name.len() > DNS1123_LABEL_MAX_LENGTH {
        return Err(format!(
            "{name:?} must be no more than {DNS1123_LABEL_MAX_LENGTH} characters"
        ));
    }
    let alphanumeric = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = name.as_bytes();
    let label = match (bytes.first(), bytes.last()) {
        (Some(&first), Some(&last)) => {
            alphanumeric(first)
                && alphanumeric(last)
                && bytes.iter().all(|&b| alphanumeric(b) || b == b'-')
        }
        _ => false,
    };
    if !label {
        return Err(format!(
            "{name:?} is not a lowercase RFC 1123 label: lower-case letters, digits and '-', \
             starting and ending with a letter or digit ('[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        ));
    }
    Ok(())
}

fn disks(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    for (i, disk) in vmi.spec.domain.devices.disks.iter().enumerate() {
        let field = format!("spec.domain.devices.disks[{i}]");
        if disk.cdrom.is_some() || disk.lun.is_some() {
            let kind = if disk.cdrom.is_some() { "cdrom" } else { "lun" };
            return Err(Refusal::new(
                format!("{field}.{kind}"),
                "only disk devices on virtio are supported",
            ));
        }
        let bus = disk
            .disk
            .as_ref()
            .and_then(|d| d.bus.as_deref())
            .unwrap_or("virtio");
        if bus != "virtio" {
            return Err(Refusal::new(
                format!("{field}.disk.bus"),
                format!("bus {bus:?} is not supported: only virtio"),
            ));
        }
        if let Some(cache) = disk.cache.as_deref()
            && !matches!(cache, "" | "none" | "writethrough" | "writeback")
        {
            return Err(Refusal::new(
                format!("{field}.cache"),
                format!("unknown cache mode {cache:?} (none, writethrough or writeback)"),
            ));
        }
        if !vmi.spec.volumes.iter().any(|v| v.name == disk.name) {
            return Err(Refusal::new(
                format!("{field}.name"),
                format!("no volume named {:?}", disk.name),
            ));
        }
    }
    Ok(())
}

fn volumes(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        volume_source(volume, &format!("spec.volumes[{i}]"))?;
    }
    Ok(())
}

/// The volume kinds the launcher turns into disks: container disks, ephemeral PVCs, PVCs and
/// DataVolumes (their PVCs), host disks, empty disks, cloud-init NoCloud and ConfigDrive.
fn volume_source(volume: &Volume, field: &str) -> Result<(), Refusal> {
    // A hotpluggable volume is not in the launcher pod: it would be attached to the running
    // VM, which this launcher cannot do.
    let hotpluggable = [
        (
            "persistentVolumeClaim",
            volume
                .persistent_volume_claim
                .as_ref()
                .is_some_and(|p| p.hotpluggable == Some(true)),
        ),
        (
            "dataVolume",
            volume
                .data_volume
                .as_ref()
                .and_then(|d| d.get("hotpluggable"))
                .and_then(Value::as_bool)
                == Some(true),
        ),
    ];
    if let Some((kind, _)) = hotpluggable.iter().find(|(_, hot)| *hot) {
        return Err(Refusal::new(
            format!("{field}.{kind}.hotpluggable"),
            "volume hotplug is not supported by this launcher",
        ));
    }
    if volume.container_disk.is_some()
        || volume.persistent_volume_claim.is_some()
        || volume.data_volume.is_some()
        || volume.cloud_init_no_cloud.is_some()
        || volume.cloud_init_config_drive.is_some()
    {
        return Ok(());
    }
    if let Some(ephemeral) = &volume.ephemeral {
        if ephemeral.persistent_volume_claim.is_none() {
            return Err(Refusal::new(
                format!("{field}.ephemeral"),
                "needs persistentVolumeClaim",
            ));
        }
        return Ok(());
    }
    if let Some(host) = &volume.host_disk {
        if Path::new(&host.path).file_name().is_none() {
            return Err(Refusal::new(
                format!("{field}.hostDisk.path"),
                format!("{:?} has no file name", host.path),
            ));
        }
        match host.disk_type.as_str() {
            "Disk" => {}
            "DiskOrCreate" => {
                let capacity = host.capacity.as_ref().ok_or_else(|| {
                    Refusal::new(
                        format!("{field}.hostDisk.capacity"),
                        "required for type DiskOrCreate",
                    )
                })?;
                quantity::to_bytes(capacity).map_err(|e| {
                    Refusal::new(format!("{field}.hostDisk.capacity"), e.to_string())
                })?;
            }
            other => {
                return Err(Refusal::new(
                    format!("{field}.hostDisk.type"),
                    format!("{other:?} is not Disk or DiskOrCreate"),
                ));
            }
        }
        return Ok(());
    }
    if let Some(empty) = &volume.empty_disk {
        quantity::to_bytes(&empty.capacity)
            .map_err(|e| Refusal::new(format!("{field}.emptyDisk.capacity"), e.to_string()))?;
        return Ok(());
    }
    let kind = [
        ("configMap", volume.config_map.is_some()),
        ("secret", volume.secret.is_some()),
        ("serviceAccount", volume.service_account.is_some()),
        ("downwardAPI", volume.downward_api.is_some()),
    ]
    .into_iter()
    .find(|(_, present)| *present)
    .map(|(k, _)| k.to_string())
    .or_else(|| volume.extra.keys().next().cloned())
    .unwrap_or_else(|| "(no source)".into());
    Err(Refusal::new(
        format!("{field}.{kind}"),
        "this volume type is not supported by this launcher",
    ))
}

fn interfaces(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let spec = &vmi.spec;
    for (i, network) in spec.networks.iter().enumerate() {
        if network.pod.is_none() {
            let kind = if network.multus.is_some() {
                "multus"
            } else {
                network.extra.keys().next().map_or("(no source)", |k| k)
            };
            return Err(Refusal::new(
                format!("spec.networks[{i}].{kind}"),
                "only the pod network is supported",
            ));
        }
    }
    let interfaces = &spec.domain.devices.interfaces;
    if interfaces.len() > 1 {
        return Err(Refusal::new(
            "spec.domain.devices.interfaces",
            "only one interface (on the pod network) is supported",
        ));
    }
    for (i, iface) in interfaces.iter().enumerate() {
        let field = format!("spec.domain.devices.interfaces[{i}]");
        let network = spec
            .networks
            .iter()
            .enumerate()
            .find(|(_, n)| n.name == iface.name)
            .map(|(j, n)| (format!("spec.networks[{j}]"), n));
        interface(iface, &field, network)?;
    }
    Ok(())
}

fn interface(
    iface: &Interface,
    field: &str,
    network: Option<(String, &Network)>,
) -> Result<(), Refusal> {
    match iface.binding_name() {
        Some(binding) if POD_NETWORK_BINDINGS.contains(&binding) => {}
        Some(other) => {
            return Err(Refusal::new(
                format!("{field}.{other}"),
                "only the masquerade and bridge bindings are supported",
            ));
        }
        None => {
            return Err(Refusal::new(
                field,
                "needs a binding (masquerade: {} or bridge: {})",
            ));
        }
    }
    let Some((network_field, network)) = network else {
        return Err(Refusal::new(
            format!("{field}.name"),
            format!("no network named {:?}", iface.name),
        ));
    };
    let model = iface.model.as_deref().unwrap_or("virtio");
    if model != "virtio" {
        return Err(Refusal::new(
            format!("{field}.model"),
            format!("model {model:?} is not supported: only virtio"),
        ));
    }
    if let Some(mac) = &iface.mac_address {
        if !is_mac(mac) {
            return Err(Refusal::new(
                format!("{field}.macAddress"),
                format!("{mac:?} is not a MAC address"),
            ));
        }
        if mac.eq_ignore_ascii_case(super::pod_network::BRIDGE_MAC) {
            return Err(Refusal::new(
                format!("{field}.macAddress"),
                format!(
                    "{} is reserved for the pod bridge",
                    super::pod_network::BRIDGE_MAC
                ),
            ));
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    for (p, port) in iface.ports.iter().enumerate() {
        let field = format!("{field}.ports[{p}]");
        if !(1..=65535).contains(&port.port) {
            return Err(Refusal::new(
                format!("{field}.port"),
                format!("{} is not a port number (1-65535)", port.port),
            ));
        }
        let protocol = port
            .protocol
            .as_deref()
            .unwrap_or("TCP")
            .to_ascii_uppercase();
        if protocol != "TCP" && protocol != "UDP" {
            return Err(Refusal::new(
                format!("{field}.protocol"),
                format!("{protocol:?} is not supported: TCP or UDP"),
            ));
        }
        if !seen.insert((port.port, protocol)) {
            return Err(Refusal::new(
                format!("{field}.port"),
                format!("port {} is forwarded twice", port.port),
            ));
        }
    }
    if iface.masquerade.is_some()
        && let Some(pod) = &network.pod
    {
        cidr::<ipnet::Ipv4Net>(
            pod.vm_network_cidr.as_deref(),
            &format!("{network_field}.pod.vmNetworkCIDR"),
            30,
        )?;
        cidr::<ipnet::Ipv6Net>(
            pod.vm_ipv6_network_cidr.as_deref(),
            &format!("{network_field}.pod.vmIPv6NetworkCIDR"),
            126,
        )?;
    }
    Ok(())
}

/// Masquerade's guest network: a network address with room for the gateway and the guest.
fn cidr<N>(text: Option<&str>, field: &str, max_prefix: u8) -> Result<(), Refusal>
where
    N: std::str::FromStr + IpNetwork,
    N::Err: std::fmt::Display,
{
    let Some(text) = text else {
        return Ok(());
    };
    let net: N = text
        .parse()
        .map_err(|e| Refusal::new(field, format!("{text:?}: {e}")))?;
    if net.prefix() > max_prefix {
        return Err(Refusal::new(
            field,
            format!("{text} is too small: at most /{max_prefix}"),
        ));
    }
    if !net.is_network_address() {
        return Err(Refusal::new(
            field,
            format!("{text} must be given by its network address"),
        ));
    }
    Ok(())
}

/// What [`cidr`] needs of `ipnet`'s two network types.
trait IpNetwork {
    fn prefix(&self) -> u8;
    fn is_network_address(&self) -> bool;
}

impl IpNetwork for ipnet::Ipv4Net {
    fn prefix(&self) -> u8 {
        self.prefix_len()
    }
    fn is_network_address(&self) -> bool {
        self.network() == self.addr()
    }
}

impl IpNetwork for ipnet::Ipv6Net {
    fn prefix(&self) -> u8 {
        self.prefix_len()
    }
    fn is_network_address(&self) -> bool {
        self.network() == self.addr()
    }
}

/// Six pairs of hex digits separated by colons.
fn is_mac(text: &str) -> bool {
    let parts: Vec<&str> = text.split(':').collect();
    parts.len() == 6
        && parts
            .iter()
            .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// HTTP and TCP probes are the kubelet's (they reach the guest through the pod network);
/// exec and guest-agent probes go through a guest agent this launcher does not have.
fn probes(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    for (field, probe) in [
        ("spec.readinessProbe", &vmi.spec.readiness_probe),
        ("spec.livenessProbe", &vmi.spec.liveness_probe),
    ] {
        let Some(probe) = probe.as_ref().filter(|p| !p.is_null()) else {
            continue;
        };
        for kind in ["exec", "guestAgentPing"] {
            if probe.get(kind).is_some_and(|v| !v.is_null()) {
                return Err(Refusal::new(
                    format!("{field}.{kind}"),
                    "needs a guest agent, which this launcher does not have: use an httpGet or tcpSocket probe",
                ));
            }
        }
    }
    Ok(())
}

/// SSH keys through cloud-init (NoCloud or ConfigDrive) are written into the ISO by the
/// launcher; keys and passwords through the guest agent are not possible here.
fn access_credentials(vmi: &VirtualMachineInstance) -> Result<(), Refusal> {
    let credentials = match vmi.spec.extra.get("accessCredentials") {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(Refusal::new("spec.accessCredentials", "must be a list")),
    };
    for (i, credential) in credentials.iter().enumerate() {
        let field = format!("spec.accessCredentials[{i}]");
        if credential.get("userPassword").is_some_and(|v| !v.is_null()) {
            return Err(Refusal::new(
                format!("{field}.userPassword"),
                "passwords are set through the guest agent, which this launcher does not have",
            ));
        }
        let Some(ssh) = credential.get("sshPublicKey").filter(|v| !v.is_null()) else {
            return Err(Refusal::new(
                field,
                "needs sshPublicKey (the only kind of credential this launcher can propagate)",
            ));
        };
        match ssh.pointer("/source/secret/secretName") {
            Some(Value::String(name))
                if !name.is_empty()
                    && name != "."
                    && name != ".."
                    && !name.contains(['/', '\0']) => {}
            _ => {
                return Err(Refusal::new(
                    format!("{field}.sshPublicKey.source.secret.secretName"),
                    "must name a secret",
                ));
            }
        }
        let method = ssh
            .get("propagationMethod")
            .and_then(Value::as_object)
            .and_then(|m| {
                m.iter()
                    .find(|(_, v)| !v.is_null())
                    .map(|(k, _)| k.as_str())
            });
        let has_volume = |pick: fn(&Volume) -> bool| vmi.spec.volumes.iter().any(pick);
        match method {
            Some("noCloud") if has_volume(|v| v.cloud_init_no_cloud.is_some()) => {}
            Some("configDrive") if has_volume(|v| v.cloud_init_config_drive.is_some()) => {}
            Some(kind @ ("noCloud" | "configDrive")) => {
                return Err(Refusal::new(
                    format!("{field}.sshPublicKey.propagationMethod.{kind}"),
                    format!(
                        "needs a cloudInit{} volume to carry the keys",
                        upper_first(kind)
                    ),
                ));
            }
            Some(other) => {
                return Err(Refusal::new(
                    format!("{field}.sshPublicKey.propagationMethod.{other}"),
                    "only noCloud and configDrive propagation are supported (the guest agent is not)",
                ));
            }
            None => {
                return Err(Refusal::new(
                    format!("{field}.sshPublicKey.propagationMethod"),
                    "is required",
                ));
            }
        }
    }
    Ok(())
}

fn upper_first(text: &str) -> String {
    let mut chars = text.chars();
    chars
        .next()
        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
        .unwrap_or_default()
}

fn non_empty(value: &Value) -> bool {
    !(value.is_null() || value.as_array().is_some_and(|a| a.is_empty()))
}

#[cfg(test)]
mod tests;
