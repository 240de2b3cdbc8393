//! The defaults KubeVirt's API webhook stores in every new VMI (v1.9.0
//! `pkg/defaults/defaults.go` `SetDefaultVirtualMachineInstance`, `pkg/defaults/arm64.go`,
//! and `mutators/vmi-mutator.go`, the parts that shape the launcher pod or the guest), and in
//! every new VM's template (`SetVirtualMachineDefaults`, `mutators/vm-mutator.go`).
//!
//! Written once, here, for every writer: virt-api's mutating webhook stores them when a VM or
//! VMI is created; virt-controller applies them to the VMIs it creates and writes them into
//! a VMI stored without them (created while virt-api was absent) before its first pod; its
//! template renders from a defaulted copy. Standalone mode (`handler/standalone`) does not
//! apply them yet: it runs the VMI it is given as written.
//!
//! Not applied: the amd64 disk bus default (`sata` for a disk without a bus,
//! `setDefaultAmd64DisksBus`): this project's launcher has virtio disks only, and reads a disk
//! without a bus as virtio. CPU and memory hotplug defaults (`maxSockets`, `maxGuest`): only
//! with the `LiveUpdate` rollout strategy, which is not served. Hyper-V feature dependencies:
//! the launcher refuses Hyper-V enlightenments.

use crate::kubevirt::well_known::NON_ROOT_UID;
use crate::kubevirt::{
    Cpu, Disk, EmptyBinding, FeatureState, Features, Firmware, Interface, Machine, Memory, Network,
    Phase, PhaseTransitionTimestamp, PodNetwork, Time, VirtualMachine, VirtualMachineInstance,
    VirtualMachineInstanceSpec, VirtualMachineInstanceStatus, quantity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

/// The cluster's configuration the defaults depend on (the `KubeVirt` CR's fields, as the
/// controller reads them: `controller::kubevirt_cr`). [`Config::default`] is v1.9.0's
/// defaults without a CR.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `architectureConfiguration.defaultArchitecture` (`amd64`).
    pub default_architecture: String,
    /// `cpuModel`: the model of VMIs that name none (amd64); none: `host-model`.
    pub cpu_model: Option<String>,
    /// `cpuRequest`: given to VMIs without a CPU request, unless it is KubeVirt's default
    /// (`100m`, which changes nothing).
    pub cpu_request: Option<crate::kubevirt::Quantity>,
    /// `evictionStrategy`, stored in VMIs that name none (`None`).
    pub eviction_strategy: Option<String>,
    /// `network.defaultNetworkInterface`: `bridge` (KubeVirt's default) or `masquerade`.
    pub default_network_interface: String,
    /// The `Root` feature gate: without it the webhook stores `status.runtimeUser: 107`.
    pub root: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            default_architecture: "amd64".into(),
            cpu_model: None,
            cpu_request: None,
            eviction_strategy: Some("None".into()),
            default_network_interface: "bridge".into(),
            root: false,
        }
    }
}

/// `kubevirt.io/pci-topology-version`: which PCI hotplug-port layout the VM was created with.
pub const PCI_TOPOLOGY_VERSION_ANNOTATION: &str = "kubevirt.io/pci-topology-version";
/// The layout the webhook gives new VMIs (`PciTopologyVersionV3`).
pub const PCI_TOPOLOGY_VERSION: &str = "v3";
/// `v1.DefaultCPUModel`, the model of a VMI that names none (amd64).
pub const DEFAULT_CPU_MODEL: &str = "host-model";
/// The model of an arm64 VMI that names none (`defaultCPUModelArm64`).
pub const DEFAULT_CPU_MODEL_ARM64: &str = "host-passthrough";

/// `virtconfig.DefaultCPURequest` (`100m`), in milli-CPUs.
const DEFAULT_CPU_REQUEST_MILLI: u128 = 100;

/// The machine type for an architecture (`GetMachineType` defaults).
pub fn default_machine_type(arch: &str) -> &'static str {
    match arch {
        "arm64" => "virt",
        "s390x" => "s390-ccw-virtio",
        _ => "q35",
    }
}

/// Applies the webhook's defaults to a new VMI: the spec's, then the metadata's.
pub fn apply_vmi(vmi: &mut VirtualMachineInstance, config: &Config) {
    apply_spec(&mut vmi.spec, config);
    apply_metadata(&mut vmi.metadata, &vmi.spec);
}

/// The annotation the webhook adds (`setDefaultPciTopologyVersion`), where the machine
/// supports PCIe hotplug (`SupportsPCIeHotplug`: amd64 q35 or arm64 virt).
pub fn apply_metadata(metadata: &mut ObjectMeta, spec: &VirtualMachineInstanceSpec) {
    let arch_ok = matches!(
        spec.architecture.as_deref(),
        None | Some("amd64" | "arm64" | "")
    );
    let machine_ok = spec
        .domain
        .machine
        .as_ref()
        .is_none_or(|m| m.machine_type.contains("q35") || m.machine_type.starts_with("virt"));
    if arch_ok && machine_ok {
        metadata
            .annotations
            .get_or_insert_with(Default::default)
            .entry(PCI_TOPOLOGY_VERSION_ANNOTATION.to_string())
            .or_insert_with(|| PCI_TOPOLOGY_VERSION.to_string());
    }
}

/// Applies the webhook's spec defaults in place; fields already set are kept
/// (`SetDefaultVirtualMachineInstanceSpec` and what `SetDefaultVirtualMachineInstance` adds).
pub fn apply_spec(spec: &mut VirtualMachineInstanceSpec, config: &Config) {
    // Architecture, then the machine type that goes with it.
    let arch = spec
        .architecture
        .get_or_insert_with(|| config.default_architecture.clone())
        .clone();
    let machine = spec.domain.machine.get_or_insert_with(Machine::default);
    if machine.machine_type.is_empty() {
        machine.machine_type = default_machine_type(&arch).to_string();
    }

    // A CPU limit without a request: the request is the limit.
    if let Some(resources) = spec.domain.resources.as_mut() {
        let limit = resources
            .limits
            .as_ref()
            .and_then(|l| l.get("cpu"))
            .cloned();
        let requested = resources
            .requests
            .as_ref()
            .and_then(|r| r.get("cpu"))
            .cloned();
        let nonzero = |q: &Option<crate::kubevirt::Quantity>| {
            q.as_ref()
                .is_some_and(|q| quantity::to_milli(q).is_ok_and(|m| m > 0))
        };
        if let Some(limit) = limit
            .clone()
            .filter(|_| nonzero(&limit) && !nonzero(&requested))
        {
            resources
                .requests
                .get_or_insert_with(Default::default)
                .insert("cpu".into(), limit);
        }
    }

    // The cluster's `cpuRequest`, unless it is KubeVirt's default, for VMIs that request
    // no CPU and do not want dedicated CPUs.
    if let Some(cpu_request) = config
        .cpu_request
        .as_ref()
        .filter(|q| quantity::to_milli(q).is_ok_and(|m| m != DEFAULT_CPU_REQUEST_MILLI))
    {
        let dedicated = spec
            .domain
            .cpu
            .as_ref()
            .and_then(|c| c.dedicated_cpu_placement)
            == Some(true);
        let requested = spec
            .domain
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .is_some_and(|r| r.contains_key("cpu"));
        if !requested && !dedicated {
            spec.domain
                .resources
                .get_or_insert_with(Default::default)
                .requests
                .get_or_insert_with(Default::default)
                .insert("cpu".into(), cpu_request.clone());
        }
    }

    // Guest memory from the memory request, else the limit.
    let memory = spec.domain.memory.get_or_insert_with(Memory::default);
    if memory.guest.is_none() {
        let resources = spec.domain.resources.as_ref();
        let pick = |map: Option<&std::collections::BTreeMap<String, crate::kubevirt::Quantity>>| {
            map.and_then(|m| m.get("memory"))
                .filter(|q| quantity::to_milli(q).is_ok_and(|m| m > 0))
                .cloned()
        };
        memory.guest = pick(resources.and_then(|r| r.requests.as_ref()))
            .or_else(|| pick(resources.and_then(|r| r.limits.as_ref())));
    }

    // CPU topology: sockets from the CPU limit or request, one core, one thread.
    let resources = spec.domain.resources.clone();
    let cpu = spec.domain.cpu.get_or_insert_with(Cpu::default);
    let unset = |v: Option<u32>| v.unwrap_or(0) == 0;
    if unset(cpu.cores) && unset(cpu.sockets) && unset(cpu.threads) {
        let from = |map: Option<&std::collections::BTreeMap<String, crate::kubevirt::Quantity>>| {
            map.and_then(|m| m.get("cpu"))
                .and_then(|q| quantity::to_milli(q).ok())
                .map(|milli| u32::try_from(milli.div_ceil(1000)).unwrap_or(u32::MAX))
        };
        let sockets = from(resources.as_ref().and_then(|r| r.limits.as_ref()))
            .or_else(|| from(resources.as_ref().and_then(|r| r.requests.as_ref())))
            .unwrap_or(1);
        cpu.sockets = Some(sockets);
        cpu.cores = Some(1);
        cpu.threads = Some(1);
    }

    // Container disks: `Always` for `:latest` or untagged images, else `IfNotPresent`.
    for volume in &mut spec.volumes {
        if let Some(disk) = volume.container_disk.as_mut()
            && disk.image_pull_policy.as_deref().is_none_or(str::is_empty)
        {
            let always = disk.image.ends_with(":latest") || !disk.image.contains([':', '@']);
            disk.image_pull_policy = Some(if always { "Always" } else { "IfNotPresent" }.into());
        }
    }

    // The cluster's eviction strategy (`None` by default).
    if spec.eviction_strategy.is_none() {
        spec.eviction_strategy = config.eviction_strategy.clone();
    }

    // The pod network with the cluster's default binding when nothing is listed.
    if spec.domain.devices.autoattach_pod_interface != Some(false)
        && spec.networks.is_empty()
        && spec.domain.devices.interfaces.is_empty()
    {
        let mut interface = Interface {
            name: "default".into(),
            ..Default::default()
        };
        if config.default_network_interface == "masquerade" {
            interface.masquerade = Some(EmptyBinding::default());
        } else {
            interface.bridge = Some(EmptyBinding::default());
        }
        spec.domain.devices.interfaces.push(interface);
        spec.networks.push(Network {
            name: "default".into(),
            pod: Some(PodNetwork::default()),
            ..Default::default()
        });
    }

    // A volume without a disk becomes a plain disk; a disk without a target is a `disk`.
    let missing: Vec<String> = spec
        .volumes
        .iter()
        .filter(|v| !spec.domain.devices.disks.iter().any(|d| d.name == v.name))
        .map(|v| v.name.clone())
        .collect();
    for name in missing {
        spec.domain.devices.disks.push(Disk {
            name,
            ..Default::default()
        });
    }
    for disk in &mut spec.domain.devices.disks {
        if disk.disk.is_none() && disk.cdrom.is_none() && disk.lun.is_none() {
            disk.disk = Some(Default::default());
        }
    }

    // The CPU model: the cluster's, else host-passthrough on arm64 (which also boots UEFI
    // with secure boot off and has virtio disks), else host-model (`setDefaultCPUArch`).
    let arm64 = spec.architecture.as_deref() == Some("arm64");
    if arm64 {
        let cpu = spec.domain.cpu.get_or_insert_with(Cpu::default);
        if cpu.model.as_deref().is_none_or(str::is_empty) {
            cpu.model = Some(DEFAULT_CPU_MODEL_ARM64.into());
        }
        let firmware = spec.domain.firmware.get_or_insert_with(Firmware::default);
        let loader = firmware
            .bootloader
            .get_or_insert_with(|| json!({"efi": {}}));
        if let Some(efi) = loader.get_mut("efi").and_then(|e| e.as_object_mut()) {
            efi.entry("secureBoot").or_insert(json!(false));
        }
        for disk in &mut spec.domain.devices.disks {
            if let Some(target) = disk.disk.as_mut()
                && target.bus.as_deref().is_none_or(str::is_empty)
            {
                target.bus = Some("virtio".into());
            }
            if let Some(target) = disk.cdrom.as_mut()
                && target.bus.as_deref().is_none_or(str::is_empty)
            {
                target.bus = Some("virtio".into());
            }
        }
    }
    let cpu = spec.domain.cpu.get_or_insert_with(Cpu::default);
    if cpu.model.as_deref().is_none_or(str::is_empty) {
        cpu.model = Some(
            config
                .cpu_model
                .clone()
                .filter(|m| !m.is_empty())
                .unwrap_or_else(|| DEFAULT_CPU_MODEL.into()),
        );
    }

    // `features: {}` means ACPI on.
    let features = spec.domain.features.get_or_insert_with(Features::default);
    if features.acpi.is_none() {
        features.acpi = Some(FeatureState {
            enabled: Some(true),
            ..Default::default()
        });
    }
}

/// The status the webhook stores in a new VMI (`vmi-mutator.go` on create, and
/// `setGuestMemoryStatus`, `setCurrentCPUTopologyStatus`, `markAsNonroot`), from its
/// defaulted spec: phase `Pending` with its transition time, the runtime user (107 without
/// the `Root` gate; with it what the creator wrote, else 0), the guest memory and the CPU
/// topology. As the webhook, the phase is `Pending` whatever the creator wrote; other fields
/// already there are kept (the runtime user only with `Root`).
pub fn apply_vmi_status(vmi: &mut VirtualMachineInstance, config: &Config, now: &Time) {
    let spec = vmi.spec.clone();
    let status = vmi.status.get_or_insert_with(Default::default);
    status_from_spec(status, &spec);
    if config.root {
        status.runtime_user.get_or_insert(0);
    } else {
        status.runtime_user = Some(NON_ROOT_UID.into());
    }
    status.phase = Some(Phase::Pending);
    status
        .phase_transition_timestamps
        .push(PhaseTransitionTimestamp {
            phase: Phase::Pending,
            phase_transition_timestamp: now.clone(),
            extra: Default::default(),
        });
}

/// `status.currentCPUTopology`, as KubeVirt spells the key (the typed
/// `current_cpu_topology` field serializes as `currentCpuTopology`).
pub const CURRENT_CPU_TOPOLOGY: &str = "currentCPUTopology";

/// The status fields that follow from the defaulted `spec` (`setGuestMemoryStatus`,
/// `setCurrentCPUTopologyStatus`), where the status has none yet.
pub fn status_from_spec(
    status: &mut VirtualMachineInstanceStatus,
    spec: &VirtualMachineInstanceSpec,
) {
    if let Some(guest) = spec.domain.memory.as_ref().and_then(|m| m.guest.clone()) {
        let memory = status.memory.get_or_insert_with(Default::default);
        if memory.guest_at_boot.is_none() {
            memory.guest_at_boot = Some(guest.clone());
            memory.guest_current = Some(guest.clone());
            memory.guest_requested = Some(guest);
        }
    }
    if !status.extra.contains_key(CURRENT_CPU_TOPOLOGY)
        && let Some(cpu) = &spec.domain.cpu
    {
        // `v1.CPUTopology`: zero counts are left out (`omitempty`).
        let topology: serde_json::Map<String, serde_json::Value> = [
            ("cores", cpu.cores),
            ("sockets", cpu.sockets),
            ("threads", cpu.threads),
        ]
        .into_iter()
        .filter_map(|(key, n)| n.filter(|n| *n != 0).map(|n| (key.to_string(), json!(n))))
        .collect();
        status.extra.insert(
            CURRENT_CPU_TOPOLOGY.into(),
            serde_json::Value::Object(topology),
        );
    }
}

/// The defaults the webhook stores in a VM (`vm-mutator.go`): the template's architecture
/// and machine type, at every write; at creation (`create`) also the template's firmware
/// UUID and serial (`firmware` gives them, KubeVirt draws random UUIDs: the caller draws)
/// and its PCI topology annotation.
pub fn apply_vm(
    vm: &mut VirtualMachine,
    config: &Config,
    create: bool,
    firmware: impl FnOnce() -> (String, String),
) {
    let template = &mut vm.spec.template;
    let spec = template.spec.get_or_insert_with(Default::default);
    if create {
        let fw = spec.domain.firmware.get_or_insert_with(Firmware::default);
        let (uuid, serial) = firmware();
        if fw.uuid.as_deref().is_none_or(str::is_empty) {
            fw.uuid = Some(uuid);
        }
        if fw.serial.as_deref().is_none_or(str::is_empty) {
            fw.serial = Some(serial);
        }
    }
    let arch = spec
        .architecture
        .clone()
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| config.default_architecture.clone());
    spec.architecture = Some(arch.clone());
    let machine = spec.domain.machine.get_or_insert_with(Machine::default);
    if machine.machine_type.is_empty() {
        machine.machine_type = default_machine_type(&arch).to_string();
    }
    if create {
        let spec = spec.clone();
        apply_metadata(
            template.metadata.get_or_insert_with(Default::default),
            &spec,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> VirtualMachineInstanceSpec {
        serde_json::from_value(value).expect("valid spec")
    }

    #[test]
    fn an_empty_spec_gets_the_webhooks_defaults() {
        let mut s = spec(
            json!({"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}},
            "volumes": [{"name": "root", "containerDisk": {"image": "quay.io/x/disk:v1"}},
                        {"name": "latest", "containerDisk": {"image": "quay.io/x/disk"}}]}),
        );
        apply_spec(&mut s, &Config::default());
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["architecture"], json!("amd64"));
        assert_eq!(v["domain"]["machine"], json!({"type": "q35"}));
        assert_eq!(
            v["domain"]["cpu"],
            json!({"sockets": 1, "cores": 1, "threads": 1, "model": "host-model"})
        );
        assert_eq!(v["domain"]["memory"]["guest"], json!("1Gi"));
        assert_eq!(
            v["volumes"][0]["containerDisk"]["imagePullPolicy"],
            json!("IfNotPresent")
        );
        assert_eq!(
            v["volumes"][1]["containerDisk"]["imagePullPolicy"],
            json!("Always")
        );
        assert_eq!(
            v["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "bridge": {}}])
        );
        assert_eq!(v["networks"], json!([{"name": "default", "pod": {}}]));
        assert_eq!(
            v["domain"]["devices"]["disks"],
            json!([{"name": "root", "disk": {}}, {"name": "latest", "disk": {}}])
        );
        assert_eq!(v["domain"]["features"], json!({"acpi": {"enabled": true}}));
        assert_eq!(v["evictionStrategy"], json!("None"));
    }

    /// `cpuRequest` and `evictionStrategy` of the cluster (`setDefaultResourceRequests`,
    /// `setDefaultEvictionStrategy`); KubeVirt's default `100m` changes nothing.
    #[test]
    fn the_clusters_cpu_request_and_eviction_strategy() {
        let config = Config {
            cpu_request: Some(crate::kubevirt::Quantity("2".into())),
            eviction_strategy: Some("LiveMigrate".into()),
            ..Config::default()
        };
        let mut s = spec(json!({"domain": {"devices": {}}}));
        apply_spec(&mut s, &config);
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["domain"]["resources"]["requests"]["cpu"], json!("2"));
        // The topology comes after it, from the request.
        assert_eq!(v["domain"]["cpu"]["sockets"], json!(2));
        assert_eq!(v["evictionStrategy"], json!("LiveMigrate"));
        for kept in [
            json!({"domain": {"devices": {}, "resources": {"requests": {"cpu": "500m"}}}, "evictionStrategy": "None"}),
            json!({"domain": {"devices": {}, "cpu": {"dedicatedCpuPlacement": true}}, "evictionStrategy": "None"}),
        ] {
            let mut s = spec(kept.clone());
            apply_spec(&mut s, &config);
            let v = serde_json::to_value(&s).unwrap();
            assert_eq!(
                v["domain"]["resources"]["requests"]["cpu"],
                kept["domain"]["resources"]["requests"]["cpu"],
                "{kept}"
            );
            assert_eq!(v["evictionStrategy"], json!("None"));
        }
        let default = Config {
            cpu_request: Some(crate::kubevirt::Quantity("0.1".into())),
            ..Config::default()
        };
        let mut s = spec(json!({"domain": {"devices": {}}}));
        apply_spec(&mut s, &default);
        assert!(s.domain.resources.is_none());
    }

    #[test]
    fn set_fields_are_kept() {
        let mut s = spec(json!({"architecture": "arm64",
            "domain": {"devices": {"autoattachPodInterface": false}, "cpu": {"cores": 4},
                       "resources": {"limits": {"cpu": "3", "memory": "2Gi"}},
                       "features": {"acpi": {"enabled": false}}}}));
        apply_spec(&mut s, &Config::default());
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["domain"]["machine"], json!({"type": "virt"}));
        // arm64: host-passthrough, UEFI without secure boot.
        assert_eq!(
            v["domain"]["cpu"],
            json!({"cores": 4, "model": "host-passthrough"})
        );
        assert_eq!(
            v["domain"]["firmware"],
            json!({"bootloader": {"efi": {"secureBoot": false}}})
        );
        assert_eq!(v["domain"]["resources"]["requests"], json!({"cpu": "3"}));
        assert_eq!(v["domain"]["memory"]["guest"], json!("2Gi"));
        assert!(v["domain"]["devices"].get("interfaces").is_none());
        assert_eq!(v["domain"]["features"]["acpi"]["enabled"], json!(false));
        // Sockets from the CPU limit when no topology is given.
        let mut s = spec(json!({"domain": {"devices": {}, "resources": {"limits": {"cpu": "2"}}}}));
        apply_spec(
            &mut s,
            &Config {
                default_network_interface: "masquerade".into(),
                ..Config::default()
            },
        );
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["domain"]["cpu"]["sockets"], json!(2));
        assert_eq!(
            v["domain"]["devices"]["interfaces"],
            json!([{"name": "default", "masquerade": {}}])
        );
    }

    #[test]
    fn the_cluster_cpu_model_and_the_pci_topology_annotation() {
        let config = Config {
            cpu_model: Some("Haswell".into()),
            ..Config::default()
        };
        let mut vmi: VirtualMachineInstance = serde_json::from_value(
            json!({"metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}}}),
        )
        .unwrap();
        apply_vmi(&mut vmi, &config);
        assert_eq!(
            vmi.spec.domain.cpu.unwrap().model.as_deref(),
            Some("Haswell")
        );
        assert_eq!(
            vmi.metadata.annotations.unwrap()[PCI_TOPOLOGY_VERSION_ANNOTATION],
            "v3"
        );
        // Not for machines without PCIe hotplug; an existing value is kept.
        let mut vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "metadata": {"name": "v", "annotations": {PCI_TOPOLOGY_VERSION_ANNOTATION: "v2"}},
            "spec": {"domain": {"devices": {}}}}))
        .unwrap();
        apply_vmi(&mut vmi, &config);
        assert_eq!(
            vmi.metadata.annotations.unwrap()[PCI_TOPOLOGY_VERSION_ANNOTATION],
            "v2"
        );
        let mut vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "metadata": {"name": "v"},
            "spec": {"architecture": "s390x", "domain": {"devices": {}}}}))
        .unwrap();
        apply_vmi(&mut vmi, &config);
        assert!(vmi.metadata.annotations.is_none());
    }

    #[test]
    fn defaults_are_idempotent() {
        let mut once = spec(
            json!({"domain": {"devices": {}}, "volumes": [{"name": "d", "emptyDisk": {"capacity": "1Gi"}}]}),
        );
        apply_spec(&mut once, &Config::default());
        let mut twice = once.clone();
        apply_spec(&mut twice, &Config::default());
        assert_eq!(once, twice);
    }

    /// The status the webhook stores: phase Pending with its time, the runtime user, the
    /// guest memory and topology from the defaulted spec.
    #[test]
    fn the_status_of_a_new_vmi() {
        let now = Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH);
        let mut vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "metadata": {"name": "v"},
            "spec": {"domain": {"devices": {}, "resources": {"requests": {"memory": "1Gi"}}}},
            "status": {"phase": "Running", "runtimeUser": 0}}))
        .unwrap();
        apply_vmi(&mut vmi, &Config::default());
        apply_vmi_status(&mut vmi, &Config::default(), &now);
        assert_eq!(
            serde_json::to_value(&vmi.status).unwrap(),
            json!({
                "phase": "Pending",
                "phaseTransitionTimestamps": [
                    {"phase": "Pending", "phaseTransitionTimestamp": "1970-01-01T00:00:00Z"}],
                "runtimeUser": 107,
                "memory": {"guestAtBoot": "1Gi", "guestCurrent": "1Gi", "guestRequested": "1Gi"},
                "currentCPUTopology": {"cores": 1, "sockets": 1, "threads": 1},
            })
        );
        // With Root, what the creator wrote (0 when nothing).
        let root = Config {
            root: true,
            ..Config::default()
        };
        let mut vmi: VirtualMachineInstance = serde_json::from_value(
            json!({"metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}}}),
        )
        .unwrap();
        apply_vmi_status(&mut vmi, &root, &now);
        assert_eq!(vmi.status.unwrap().runtime_user, Some(0));
    }

    /// A new VM: firmware UUID and serial, architecture, machine type and the PCI topology
    /// annotation of its template; an update only architecture and machine type.
    #[test]
    fn the_defaults_of_a_vm() {
        let vm = || -> VirtualMachine {
            serde_json::from_value(json!({
                "metadata": {"name": "vm"},
                "spec": {"runStrategy": "Always", "template": {"spec": {"domain": {"devices": {}}}}}}))
            .unwrap()
        };
        let mut created = vm();
        apply_vm(&mut created, &Config::default(), true, || {
            ("u".into(), "s".into())
        });
        assert_eq!(
            serde_json::to_value(&created.spec.template).unwrap(),
            json!({
                "metadata": {"annotations": {PCI_TOPOLOGY_VERSION_ANNOTATION: "v3"}},
                "spec": {"architecture": "amd64",
                         "domain": {"devices": {}, "machine": {"type": "q35"},
                                    "firmware": {"uuid": "u", "serial": "s"}}},
            })
        );
        let mut updated = vm();
        apply_vm(&mut updated, &Config::default(), false, || {
            unreachable!("no firmware on update")
        });
        assert_eq!(
            serde_json::to_value(&updated.spec.template).unwrap(),
            json!({"spec": {"architecture": "amd64",
                            "domain": {"devices": {}, "machine": {"type": "q35"}}}})
        );
        // A firmware UUID already there is kept.
        let mut kept = vm();
        kept.spec.template.spec.as_mut().unwrap().domain.firmware = Some(Firmware {
            uuid: Some("mine".into()),
            ..Default::default()
        });
        apply_vm(&mut kept, &Config::default(), true, || {
            ("u".into(), "s".into())
        });
        let firmware = kept.spec.template.spec.unwrap().domain.firmware.unwrap();
        assert_eq!(
            (firmware.uuid.as_deref(), firmware.serial.as_deref()),
            (Some("mine"), Some("s"))
        );
    }
}
