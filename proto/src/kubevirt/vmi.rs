//! `VirtualMachineInstance`: one running VM, its spec and its status.

use super::{Extra, Quantity, Time};
use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// What the VM looks like and how it is wired (`spec`).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kubevirt.io",
    version = "v1",
    kind = "VirtualMachineInstance",
    plural = "virtualmachineinstances",
    singular = "virtualmachineinstance",
    shortname = "vmi",
    shortname = "vmis",
    category = "all",
    namespaced,
    status = "VirtualMachineInstanceStatus",
    schema = "manual",
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.interfaces[0].ipAddress"}"#,
    printcolumn = r#"{"name":"NodeName","type":"string","jsonPath":".status.nodeName"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceSpec {
    pub domain: DomainSpec,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<Network>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub subdomain: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,
    /// `Paused` starts the VM paused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_strategy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eviction_strategy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub architecture: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scheduler_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dns_config: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub liveness_probe: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readiness_probe: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.domain`: the virtual hardware.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DomainSpec {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Cpu>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<Memory>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub firmware: Option<Firmware>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub features: Option<Features>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clock: Option<Value>,
    #[serde(default)]
    pub devices: Devices,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRequirements {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub requests: Option<BTreeMap<String, Quantity>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limits: Option<BTreeMap<String, Quantity>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overcommit_guest_overhead: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Cpu {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cores: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sockets: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sockets: Option<u32>,
    /// `host-model` (default), `host-passthrough`, or a named model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedicated_cpu_placement: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub isolate_emulator_thread: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Memory {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_guest: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hugepages: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Machine {
    /// Machine type, `q35` by default.
    #[serde(rename = "type", default, skip_serializing_if = "String::is_empty")]
    pub machine_type: String,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Firmware {
    /// SMBIOS UUID of the VM.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// `{bios: {...}}` or `{efi: {...}}`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_boot: Option<KernelBoot>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `firmware.kernelBoot`: boot a kernel (and initrd) from a container image.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KernelBoot {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_args: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<KernelBootContainer>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct KernelBootContainer {
    pub image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub initrd_path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Features {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi: Option<FeatureState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub apic: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub smm: Option<FeatureState>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hyperv: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A feature switch; absent `enabled` means enabled (KubeVirt's default).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct FeatureState {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.domain.devices`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Devices {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<Disk>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// Present (`rng: {}`) when the VM gets a virtio RNG.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rng: Option<Rng>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_pod_interface: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_graphics_device: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_serial_console: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub log_serial_console: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_mem_balloon: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoattach_input_device: Option<bool>,
    #[serde(rename = "autoattachVSOCK", skip_serializing_if = "Option::is_none")]
    pub autoattach_vsock: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_interface_multiqueue: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_multi_queue: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub use_virtio_transitional: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable_hotplug: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Rng {
    #[serde(flatten)]
    pub extra: Extra,
}

/// `devices.disks[]`: how a volume appears in the guest.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk: Option<DiskTarget>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lun: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cdrom: Option<CdRomTarget>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shareable: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dedicated_io_thread: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DiskTarget {
    /// `virtio` (default), `sata`, `scsi`, `usb`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CdRomTarget {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bus: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readonly: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tray: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `devices.interfaces[]`: a guest NIC and how it binds to its network.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub masquerade: Option<EmptyBinding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bridge: Option<EmptyBinding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sriov: Option<EmptyBinding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passt_binding: Option<EmptyBinding>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub binding: Option<PluginBinding>,
    /// `virtio` (default), `e1000`, ...
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<Port>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_order: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhcp_options: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acpi_index: Option<u32>,
    /// `up` (default) or `down`, or `absent` for hot-unplug.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Interface {
    /// The binding method's name as KubeVirt spells it in messages.
    pub fn binding_name(&self) -> Option<&str> {
        if self.masquerade.is_some() {
            Some("masquerade")
        } else if self.bridge.is_some() {
            Some("bridge")
        } else if self.sriov.is_some() {
            Some("sriov")
        } else if self.passt_binding.is_some() {
            Some("passtBinding")
        } else {
            self.binding.as_ref().map(|b| b.name.as_str())
        }
    }
}

/// A binding with no options, written `masquerade: {}`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct EmptyBinding {
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PluginBinding {
    pub name: String,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A port forwarded to the guest (masquerade binding).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Port {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP` (default) or `UDP`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    pub port: i32,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.networks[]`: where an interface's traffic goes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct Network {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodNetwork>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multus: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodNetwork {
    #[serde(rename = "vmNetworkCIDR", skip_serializing_if = "Option::is_none")]
    pub vm_network_cidr: Option<String>,
    #[serde(rename = "vmIPv6NetworkCIDR", skip_serializing_if = "Option::is_none")]
    pub vm_ipv6_network_cidr: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.volumes[]`: where a disk's bytes come from.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Volume {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk: Option<ContainerDiskSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ephemeral: Option<EphemeralVolumeSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_volume: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_disk: Option<HostDisk>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub empty_disk: Option<EmptyDiskSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_init_no_cloud: Option<CloudInitSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cloud_init_config_drive: Option<CloudInitSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub config_map: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_account: Option<Value>,
    #[serde(rename = "downwardAPI", skip_serializing_if = "Option::is_none")]
    pub downward_api: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ContainerDiskSource {
    pub image: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_secret: Option<String>,
    /// Path of the disk inside the image (default: the single file in `/disk`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PersistentVolumeClaimSource {
    pub claim_name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub read_only: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hotpluggable: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EphemeralVolumeSource {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim: Option<PersistentVolumeClaimSource>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct HostDisk {
    pub path: String,
    /// `Disk` or `DiskOrCreate`.
    #[serde(rename = "type")]
    pub disk_type: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct EmptyDiskSource {
    pub capacity: Quantity,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `cloudInitNoCloud` and `cloudInitConfigDrive`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CloudInitSource {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_data_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_base64: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub network_data_secret_ref: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The lifecycle phase of a VMI (`status.phase`), in KubeVirt's order.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Phase {
    #[default]
    #[serde(rename = "")]
    Unset,
    Pending,
    Scheduling,
    Scheduled,
    Running,
    Succeeded,
    Failed,
    WaitingForSync,
    Unknown,
}

impl Phase {
    /// `Succeeded` and `Failed` are final: nothing brings the VMI back.
    pub fn is_final(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Unset => "",
            Phase::Pending => "Pending",
            Phase::Scheduling => "Scheduling",
            Phase::Scheduled => "Scheduled",
            Phase::Running => "Running",
            Phase::Succeeded => "Succeeded",
            Phase::Failed => "Failed",
            Phase::WaitingForSync => "WaitingForSync",
            Phase::Unknown => "Unknown",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `status`: what the VMI is doing now.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineInstanceStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transition_timestamps: Vec<PhaseTransitionTimestamp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<InterfaceStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_os_info: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_state: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_method: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub migration_transport: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qos_class: Option<String>,
    /// Pod UID -> node name of the launcher pods.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_pods: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volume_status: Vec<VolumeStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fs_freeze_status: Option<String>,
    /// 107 for non-root VMIs, 0 for root.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime_user: Option<u64>,
    #[serde(rename = "VSOCKCID", skip_serializing_if = "Option::is_none")]
    pub vsock_cid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub selinux_context: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub machine: Option<Machine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryStatus>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_cpu_topology: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub launcher_container_image_version: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub condition_type: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<Time>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransitionTimestamp {
    pub phase: Phase,
    pub phase_transition_timestamp: Time,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status.interfaces[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ip_addresses: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_interface_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface_name: Option<String>,
    /// `domain`, `guest-agent`, `multus-status`, joined by `, `.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub info_source: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_count: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link_state: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `status.volumeStatus[]`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    pub name: String,
    #[serde(default)]
    pub target: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_disk_volume: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_info: Option<Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemoryStatus {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_at_boot: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_current: Option<Quantity>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub guest_requested: Option<Quantity>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Condition {
    /// The condition of this type in a status's list (KubeVirt keeps at most one per type).
    pub fn find<'a>(conditions: &'a [Condition], condition_type: &str) -> Option<&'a Condition> {
        conditions
            .iter()
            .find(|c| c.condition_type == condition_type)
    }

    /// Whether its status is `True`.
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

impl VirtualMachineInstance {
    /// The condition of this type, if the status has it.
    pub fn condition(&self, condition_type: &str) -> Option<&Condition> {
        Condition::find(self.status.as_ref()?.conditions.as_slice(), condition_type)
    }

    /// The phase, `Unset` when there is no status yet.
    pub fn phase(&self) -> Phase {
        self.status
            .as_ref()
            .and_then(|s| s.phase)
            .unwrap_or_default()
    }

    /// `terminationGracePeriodSeconds`, or KubeVirt's default of 30 s.
    pub fn grace_period_seconds(&self) -> i64 {
        self.spec
            .termination_grace_period_seconds
            .unwrap_or(super::well_known::DEFAULT_GRACE_PERIOD_SECONDS)
    }
}
