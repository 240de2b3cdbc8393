//! The defaults KubeVirt's API webhook gives every VMI at creation (v1.9.0
//! `pkg/defaults/defaults.go` `SetDefaultVirtualMachineInstance`, `pkg/defaults/arm64.go`,
//! and `mutators/vmi-mutator.go`, the parts that shape the launcher pod or the guest). This
//! deployment has no virt-api: the VM controller applies them to the VMIs it creates, and the
//! template renders from a defaulted copy.
//!
//! Not applied: the amd64 disk bus default (`sata` for a disk without a bus,
//! `setDefaultAmd64DisksBus`): this project's launcher has virtio disks only, and reads a disk
//! without a bus as virtio.

use crate::template::TemplateConfig;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proto::kubevirt::{
    Cpu, Disk, EmptyBinding, FeatureState, Features, Firmware, Interface, Machine, Memory, Network,
    PodNetwork, VirtualMachineInstance, VirtualMachineInstanceSpec, quantity,
};
use serde_json::json;

/// `kubevirt.io/pci-topology-version`: which PCI hotplug-port layout the VM was created with.
pub(crate) const PCI_TOPOLOGY_VERSION_ANNOTATION: &str = "kubevirt.io/pci-topology-version";
/// The layout the webhook gives new VMIs (`PciTopologyVersionV3`).
pub(crate) const PCI_TOPOLOGY_VERSION: &str = "v3";
/// `v1.DefaultCPUModel`, the model of a VMI that names none (amd64).
pub(crate) const DEFAULT_CPU_MODEL: &str = "host-model";
/// The model of an arm64 VMI that names none (`defaultCPUModelArm64`).
pub(crate) const DEFAULT_CPU_MODEL_ARM64: &str = "host-passthrough";

/// `virtconfig.DefaultCPURequest` (`100m`), in milli-CPUs.
const DEFAULT_CPU_REQUEST_MILLI: u128 = 100;

/// The machine type for an architecture (`GetMachineType` defaults).
pub(crate) fn default_machine_type(arch: &str) -> &'static str {
    match arch {
        "arm64" => "virt",
        "s390x" => "s390-ccw-virtio",
        _ => "q35",
    }
}

/// Applies the webhook's defaults to a new VMI: the spec's, then the metadata's.
pub(crate) fn apply_vmi(vmi: &mut VirtualMachineInstance, config: &TemplateConfig) {
    apply(&mut vmi.spec, config);
    apply_metadata(&mut vmi.metadata, &vmi.spec);
}

/// The annotation the webhook adds (`setDefaultPciTopologyVersion`), where the machine
/// supports PCIe hotplug (`SupportsPCIeHotplug`: amd64 q35 or arm64 virt).
pub(crate) fn apply_metadata(metadata: &mut ObjectMeta, spec: &VirtualMachineInstanceSpec) {
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

/// Applies the webhook's spec defaults in place; fields already set are kept.
pub fn apply(spec: &mut VirtualMachineInstanceSpec, config: &TemplateConfig) {
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
        let nonzero = |q: &Option<proto::kubevirt::Quantity>| {
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
        let pick = |map: Option<&std::collections::BTreeMap<String, proto::kubevirt::Quantity>>| {
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
        let from = |map: Option<&std::collections::BTreeMap<String, proto::kubevirt::Quantity>>| {
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
        apply(&mut s, &TemplateConfig::default());
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
        let config = TemplateConfig {
            cpu_request: Some(proto::kubevirt::Quantity("2".into())),
            eviction_strategy: Some("LiveMigrate".into()),
            ..TemplateConfig::default()
        };
        let mut s = spec(json!({"domain": {"devices": {}}}));
        apply(&mut s, &config);
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
            apply(&mut s, &config);
            let v = serde_json::to_value(&s).unwrap();
            assert_eq!(
                v["domain"]["resources"]["requests"]["cpu"],
                kept["domain"]["resources"]["requests"]["cpu"],
                "{kept}"
            );
            assert_eq!(v["evictionStrategy"], json!("None"));
        }
        let default = TemplateConfig {
            cpu_request: Some(proto::kubevirt::Quantity("0.1".into())),
            ..TemplateConfig::default()
        };
        let mut s = spec(json!({"domain": {"devices": {}}}));
        apply(&mut s, &default);
        assert!(s.domain.resources.is_none());
    }

    #[test]
    fn set_fields_are_kept() {
        let mut s = spec(json!({"architecture": "arm64",
            "domain": {"devices": {"autoattachPodInterface": false}, "cpu": {"cores": 4},
                       "resources": {"limits": {"cpu": "3", "memory": "2Gi"}},
                       "features": {"acpi": {"enabled": false}}}}));
        apply(&mut s, &TemplateConfig::default());
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
        apply(
            &mut s,
            &TemplateConfig {
                default_network_interface: "masquerade".into(),
                ..TemplateConfig::default()
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
        let config = TemplateConfig {
            cpu_model: Some("Haswell".into()),
            ..TemplateConfig::default()
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
        apply(&mut once, &TemplateConfig::default());
        let mut twice = once.clone();
        apply(&mut twice, &TemplateConfig::default());
        assert_eq!(once, twice);
    }
}
