//! `Spec` of a domain: the virtual hardware, keyed by Go field names.

use crate::kubevirt::{Extra, Time};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct DomainSpec {
    /// `kvm`; `qemu` means software emulation.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub r#type: String,
    /// `<namespace>_<name>`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(rename = "UUID", default, skip_serializing_if = "String::is_empty")]
    pub uuid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryAmount>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_memory: Option<MemoryAmount>,
    #[serde(rename = "OS", default, skip_serializing_if = "Option::is_none")]
    pub os: Option<Os>,
    #[serde(rename = "CPU", default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(rename = "VCPU", default, skip_serializing_if = "Option::is_none")]
    pub vcpu: Option<Vcpu>,
    /// Each vCPU's state when the VMI allows CPU hot-plug (`maxSockets`):
    /// `VCPU.CPUs` counts them all, the enabled ones are online.
    #[serde(rename = "VCPUs", default, skip_serializing_if = "Option::is_none")]
    pub vcpus: Option<Vcpus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    /// The SMBIOS contents (`OS.SMBios` says they are used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sys_info: Option<SysInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices: Option<Devices>,
    #[serde(default)]
    pub metadata: Metadata,
    #[serde(flatten)]
    pub extra: Extra,
}

/// An amount of memory: `{"Value": 134217728, "Unit": "b"}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct MemoryAmount {
    pub value: u64,
    pub unit: String,
}

impl MemoryAmount {
    pub fn bytes(value: u64) -> Self {
        MemoryAmount {
            value,
            unit: "b".to_string(),
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Os {
    /// `efi` when libvirt selects the firmware (KubeVirt's auto-selection); this project
    /// writes it for an EFI VMI, which boots its disk without a firmware file.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub firmware: String,
    pub r#type: OsType,
    /// `{"Mode": "sysinfo"}`: the SMBIOS tables carry [`DomainSpec::sys_info`].
    #[serde(rename = "SMBios", default, skip_serializing_if = "Option::is_none")]
    pub smbios: Option<SmBios>,
    /// SeaBIOS's options (`useserial`).
    #[serde(rename = "BIOS", default, skip_serializing_if = "Option::is_none")]
    pub bios: Option<Bios>,
    /// Direct kernel boot: kernel, initrd and command line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub initrd: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kernel_args: String,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct SmBios {
    pub mode: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Bios {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub use_serial: String,
}

/// libvirt's `<sysinfo type='smbios'>`: what the SMBIOS tables say.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct SysInfo {
    /// `smbios`.
    pub r#type: String,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub system: Vec<SysInfoEntry>,
    #[serde(rename = "BIOS", default, deserialize_with = "null_as_empty")]
    pub bios: Vec<SysInfoEntry>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub base_board: Vec<SysInfoEntry>,
    #[serde(default, deserialize_with = "null_as_empty")]
    pub chassis: Vec<SysInfoEntry>,
}

impl SysInfo {
    /// The value of system entry `name` (`uuid`, `serial`, `manufacturer`...).
    pub fn system(&self, name: &str) -> Option<&str> {
        self.system
            .iter()
            .find(|e| e.name == name)
            .map(|e| e.value.as_str())
    }
}

/// One `<entry name='…'>value</entry>`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct SysInfoEntry {
    pub name: String,
    pub value: String,
}

/// Go writes a nil slice as `null`.
fn null_as_empty<'de, D>(deserializer: D) -> Result<Vec<SysInfoEntry>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    Ok(Option::<Vec<SysInfoEntry>>::deserialize(deserializer)?.unwrap_or_default())
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct OsType {
    #[serde(rename = "OS")]
    pub os: String,
    #[serde(rename = "Arch", default, skip_serializing_if = "String::is_empty")]
    pub arch: String,
    #[serde(rename = "Machine", default, skip_serializing_if = "String::is_empty")]
    pub machine: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Cpu {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<CpuTopology>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct CpuTopology {
    pub sockets: u32,
    pub cores: u32,
    pub threads: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Vcpu {
    pub placement: String,
    #[serde(rename = "CPUs")]
    pub cpus: u32,
}

/// `<vcpus>`: one entry per possible vCPU.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Vcpus {
    #[serde(rename = "VCPU", default)]
    pub vcpu: Vec<VcpusVcpu>,
}

/// One possible vCPU: `Enabled` and `Hotpluggable` are `yes` or `no`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct VcpusVcpu {
    #[serde(rename = "ID")]
    pub id: u32,
    #[serde(default)]
    pub enabled: String,
    #[serde(default)]
    pub hotpluggable: String,
    #[serde(default)]
    pub order: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Features {
    /// Present (`{}`) when ACPI is on; the handler's phase mapping reads it.
    #[serde(rename = "ACPI", default, skip_serializing_if = "Option::is_none")]
    pub acpi: Option<Empty>,
    #[serde(rename = "APIC", default, skip_serializing_if = "Option::is_none")]
    pub apic: Option<Empty>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// An element with no content, written `{}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Empty {}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Devices {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub emulator: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<Channel>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub serials: Vec<Serial>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consoles: Vec<Console>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A device alias: KubeVirt's device name, `ua-<name>` in libvirt XML.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Alias {
    pub name: String,
    #[serde(default)]
    pub user_defined: bool,
}

impl Alias {
    /// An alias for a device the VMI names (disk, interface).
    pub fn user(name: &str) -> Self {
        Alias {
            name: name.to_string(),
            user_defined: true,
        }
    }

    /// The alias as libvirt XML spells it.
    pub fn xml_name(&self) -> String {
        if self.user_defined {
            format!("ua-{}", self.name)
        } else {
            self.name.clone()
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Interface {
    /// `ethernet` for a tap the launcher opens itself.
    pub r#type: String,
    #[serde(default)]
    pub source: InterfaceSource,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<InterfaceTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<Model>,
    #[serde(rename = "MAC", default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    #[serde(rename = "MTU", default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<Mtu>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<BootOrder>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link_state: Option<LinkState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<InterfaceDriver>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rom: Option<Rom>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct InterfaceSource {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub network: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bridge: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct InterfaceTarget {
    pub device: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub managed: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Model {
    pub r#type: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Mac {
    #[serde(rename = "MAC")]
    pub mac: String,
}

/// MTU; a string in KubeVirt's schema.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Mtu {
    pub size: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct BootOrder {
    pub order: u32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct LinkState {
    pub state: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct InterfaceDriver {
    #[serde(default)]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queues: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Rom {
    pub enabled: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Channel {
    pub r#type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ChannelSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ChannelTarget>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ChannelSource {
    pub mode: String,
    pub path: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ChannelTarget {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub r#type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
    /// `connected` or `disconnected` (guest agent).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub state: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Disk {
    /// `disk`, `cdrom` or `lun`.
    pub device: String,
    /// `file` or `block`.
    pub r#type: String,
    #[serde(default)]
    pub source: DiskSource,
    #[serde(default)]
    pub target: DiskTarget,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub serial: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver: Option<DiskDriver>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_only: Option<Empty>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backing_store: Option<BackingStore>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<BootOrder>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct DiskSource {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub dev: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct DiskTarget {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bus: String,
    /// Guest device name: `vda`, `vdb`, ...
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub device: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct DiskDriver {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cache: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_policy: String,
    #[serde(rename = "IO", default, skip_serializing_if = "String::is_empty")]
    pub io: String,
    #[serde(default)]
    pub name: String,
    /// Image format: `raw` or `qcow2`.
    #[serde(default)]
    pub r#type: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub discard: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct BackingStore {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub r#type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<BackingStoreFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<DiskSource>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct BackingStoreFormat {
    pub r#type: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Serial {
    pub r#type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<SerialTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SerialSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<SerialLog>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct SerialTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct SerialSource {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mode: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct SerialLog {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub file: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub append: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Console {
    pub r#type: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<ConsoleTarget>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<Alias>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct ConsoleTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub r#type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u32>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct Rng {
    /// `virtio-non-transitional`.
    pub model: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<RngBackend>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct RngBackend {
    pub model: String,
    pub source: String,
}

/// `Spec.Metadata`: KubeVirt's own state stored with the domain.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Metadata {
    #[serde(rename = "KubeVirt", default)]
    pub kubevirt: KubeVirtMetadata,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct KubeVirtMetadata {
    /// Must equal the VMI's UID, or the handler cleans the domain up as stale.
    #[serde(rename = "UID", default)]
    pub uid: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<GracePeriodMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<MigrationMetadata>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_credential: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_dump: Option<serde_json::Value>,
}

/// A live migration's progress as the launcher reports it
/// (`pkg/virt-launcher/virtwrap/api/schema.go:MigrationMetadata`): Go field names, every
/// field always present (times `null` until set). Absent until this launcher started or
/// prepared a migration; then it describes the last one.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct MigrationMetadata {
    /// The `VirtualMachineInstanceMigration`'s UID.
    #[serde(rename = "UID", default)]
    pub uid: String,
    #[serde(default)]
    pub start_timestamp: Option<Time>,
    /// The source: the migration ended, either way; the target: the VM runs here.
    #[serde(default)]
    pub end_timestamp: Option<Time>,
    #[serde(default)]
    pub failed: bool,
    #[serde(default)]
    pub failure_reason: String,
    /// `""`, `Aborting`, `Succeeded` or `Failed`.
    #[serde(default)]
    pub abort_status: String,
    /// `PreCopy` (the only mode here), `PostCopy` or `Paused`.
    #[serde(default)]
    pub mode: String,
}

/// The graceful-shutdown state machine's state (see the contract, §3.5).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct GracePeriodMetadata {
    #[serde(default)]
    pub deletion_grace_period_seconds: i64,
    /// Set on the first shutdown request.
    #[serde(default)]
    pub deletion_timestamp: Option<Time>,
    /// Set by a launcher that got SIGTERM: asks the handler to shut down.
    #[serde(default)]
    pub marked_for_graceful_shutdown: Option<bool>,
}
