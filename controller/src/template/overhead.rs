//! The launcher pod's memory overhead: what the compute container needs beside the guest's
//! RAM. Two models ([`OverheadModel`]): this project's launcher, measured, and KubeVirt
//! v1.9.0's estimate for its QEMU/libvirt launcher (`pkg/hypervisor/kvm/hypervisorbackend.go`
//! `GetMemoryOverhead`), kept for clusters that want KubeVirt's exact pod shape.

use super::{TemplateError, vcpus_for_overhead};
use crate::quantity::{Format, Qty};
use proto::kubevirt::VirtualMachineInstance;

const MI: u64 = 1 << 20;

/// Which estimate sizes the compute container's memory (and the console sidecar's request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OverheadModel {
    /// KubeVirt v1.9.0's numbers for QEMU, libvirt and their helpers (268 MiB for a small
    /// VMI): pods shaped exactly as KubeVirt shapes them.
    #[default]
    KubeVirt,
    /// What this project's launcher measurably needs ([`launcher_overhead`]): about 28 MiB
    /// for a small VMI, so a node fits as many VMs as their guests' memory allows.
    Launcher,
}

impl OverheadModel {
    /// The value of the KubeVirt CR annotation [`OVERHEAD_MODEL_ANNOTATION`].
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "kubevirt" => Some(Self::KubeVirt),
            "launcher" => Some(Self::Launcher),
            _ => None,
        }
    }
}

/// Annotation of the `KubeVirt` CR choosing the model: `launcher` or `kubevirt`. KubeVirt's
/// CR has no field for it (its overhead is a property of its launcher), so it is an
/// annotation in this project's prefix; without it virt-controller's `--memory-overhead`
/// decides (`launcher` as deployed).
pub const OVERHEAD_MODEL_ANNOTATION: &str = "kubevirt-rs.io/memory-overhead-model";

/// The launcher model's fixed part: virt-launcher-monitor and virt-launcher resident beside
/// the guest's RAM, with the kernel memory charged to their container. The image's lean
/// build holds 7.3–7.9 MiB at every guest size from 64 MiB / 1 vCPU to 2 GiB / 8 vCPUs
/// (`vmm/launcher/docs/memory.md`); the unoptimised build the end-to-end tests deploy holds
/// 20.6 MiB and 1.5 MiB of kernel memory (measured by `cluster_e2e`, which checks it against
/// this model). 24 MiB covers both: three times the product's need.
pub(crate) const LAUNCHER_FIXED_MIB: u64 = 24;
/// Per vCPU: its thread's stack and `kvm_run` page (12–48 KiB measured) and the kernel's
/// vCPU state and MMU caches, rounded up.
const LAUNCHER_PER_VCPU_MIB: u64 = 1;
/// Per disk: the 2 MiB huge page of bounce buffers a busy cache=none disk takes on
/// (`block::Pages::HugeOnDemand`).
const LAUNCHER_PER_DISK_MIB: u64 = 2;
/// Per interface: a virtio-net device's frame buffers in the launcher, rounded up.
const LAUNCHER_PER_INTERFACE_MIB: u64 = 1;
/// The guest console sidecar's (`virt-tail`) memory request under the launcher model: it
/// reads one file and writes lines; 2 MiB resident measured (dev build). KubeVirt requests
/// 35M for its Go `virt-tail`.
pub(crate) const LAUNCHER_CONSOLE_REQUEST: &str = "4Mi";

/// The compute container's overhead under `model`, multiplied by `ratio` (the cluster's
/// `additionalGuestMemoryOverheadRatio`) if there is one.
pub(crate) fn memory_overhead(
    vmi: &VirtualMachineInstance,
    arch: &str,
    model: OverheadModel,
    ratio: Option<f64>,
) -> Result<Qty, TemplateError> {
    let overhead = match model {
        OverheadModel::KubeVirt => kubevirt_overhead(vmi, arch)?,
        OverheadModel::Launcher => launcher_overhead(vmi)?,
    };
    Ok(match ratio {
        Some(ratio) => overhead.plus(ratio_addition(overhead, ratio)),
        None => overhead,
    })
}

/// What this project's launcher needs beside the guest's RAM: the fixed part, per vCPU, per
/// disk and per interface, and page tables for the guest's memory: 1/256 of it, the host's
/// page tables of the mapping (8 bytes per 4 KiB page) and KVM's own (as many again). An
/// exec probe adds 10 MiB (its process; KubeVirt adds 100 MiB more once, for its Go
/// `virt-probe`) and `reservedOverhead.addedOverhead` its value; nothing else of KubeVirt's
/// model (QEMU, libvirt, video RAM, VFIO, SEV, swtpm) exists in this launcher or is admitted
/// by it.
fn launcher_overhead(vmi: &VirtualMachineInstance) -> Result<Qty, TemplateError> {
    let domain = &vmi.spec.domain;
    let guest = super::guest_memory_bytes(vmi)?;
    let vcpus = vcpus_for_overhead(vmi)?.max(1);
    let disks = u64::try_from(domain.devices.disks.len()).unwrap_or(u64::MAX);
    let interfaces = u64::try_from(domain.devices.interfaces.len())
        .unwrap_or(u64::MAX)
        .max(u64::from(
            domain.devices.autoattach_pod_interface != Some(false),
        ));
    let mib = LAUNCHER_FIXED_MIB
        .saturating_add(vcpus.saturating_mul(LAUNCHER_PER_VCPU_MIB))
        .saturating_add(disks.saturating_mul(LAUNCHER_PER_DISK_MIB))
        .saturating_add(interfaces.saturating_mul(LAUNCHER_PER_INTERFACE_MIB));
    let overhead = Qty::mebibytes(mib).plus(Qty::bytes(
        u64::try_from(guest.div_ceil(256)).unwrap_or(u64::MAX),
        Format::BinarySi,
    ));
    let probes = Qty::mebibytes(10 * exec_probes(vmi));
    Ok(overhead.plus(probes).plus(reserved_overhead(vmi)?))
}

/// KubeVirt v1.9.0's estimate, including the format its sum ends up with (the first non-zero
/// term decides it; see [`Qty::plus`]).
fn kubevirt_overhead(vmi: &VirtualMachineInstance, arch: &str) -> Result<Qty, TemplateError> {
    /// RSS estimates of the processes in the compute container, in MiB: virt-launcher-monitor 25,
    /// virt-launcher 100, virtlogd 25, virtqemud 40, qemu 30 (`QemuOverhead` at v1.9.0).
    const FIXED_OVERHEAD_MIB: u64 = 25 + 100 + 25 + 40 + 30;

    let domain = &vmi.spec.domain;
    let mut overhead = Qty::ZERO;

    // Page tables: one byte per 512 bytes of the *requested* memory, computed on the
    // request rounded up to kilo-units. Zero when the VMI sets only `memory.guest`.
    let requested = super::resource_qty(domain.resources.as_ref(), Side::Requests, "memory")?
        .map(|q| q.value())
        .unwrap_or(0);
    let kilo = requested.div_ceil(1000);
    let pagetables = (kilo * 1000) / 512;
    overhead = overhead.plus(Qty {
        milli: pagetables * 1000,
        format: Format::DecimalSi,
    });

    overhead = overhead.plus(Qty::mebibytes(FIXED_OVERHEAD_MIB));

    // 8 MiB of CPU tables per vCPU, at least one.
    let vcpus = vcpus_for_overhead(vmi)?.max(1);
    overhead = overhead.plus(Qty::bytes(8 * MI * vcpus, Format::BinarySi));

    // The IO thread.
    overhead = overhead.plus(Qty::mebibytes(8));

    // Video RAM, unless the graphics device is switched off.
    if domain.devices.autoattach_graphics_device != Some(false) {
        overhead = overhead.plus(Qty::mebibytes(32));
    }

    // Two 64 MiB UEFI pflash devices on arm64.
    if arch == "arm64" {
        overhead = overhead.plus(Qty::mebibytes(128));
    }

    // VFIO locks all guest RAM plus the MMIO window.
    if super::has_vfio(vmi) {
        overhead = overhead.plus(Qty::mebibytes(1024));
    }

    if vmi
        .spec
        .volumes
        .iter()
        .any(|v| v.extra.contains_key("downwardMetrics"))
    {
        overhead = overhead.plus(Qty::mebibytes(1));
    }

    // Exec probes run virt-probe: 10 MiB each, plus 100 MiB once.
    let probes = exec_probes(vmi);
    for _ in 0..probes {
        overhead = overhead.plus(Qty::mebibytes(10));
    }
    if probes > 0 {
        overhead = overhead.plus(Qty::mebibytes(100));
    }

    if super::has_sev(vmi) {
        overhead = overhead.plus(Qty::mebibytes(256));
    }

    // swtpm.
    if super::has_tpm(vmi) {
        overhead = overhead.plus(Qty::mebibytes(53));
    }

    if super::is_cpu_dedicated(vmi) || super::wants_guaranteed_qos(vmi)? {
        overhead = overhead.plus(Qty::mebibytes(100));
    }

    Ok(overhead.plus(reserved_overhead(vmi)?))
}

/// How many of the liveness and readiness probes are exec probes (each runs a process in the
/// compute container).
fn exec_probes(vmi: &VirtualMachineInstance) -> u64 {
    let exec_probe = |probe: &Option<serde_json::Value>| {
        probe
            .as_ref()
            .is_some_and(|p| p.get("exec").is_some_and(|e| !e.is_null()))
    };
    u64::from(exec_probe(&vmi.spec.liveness_probe))
        + u64::from(exec_probe(&vmi.spec.readiness_probe))
}

/// `spec.domain.memory.reservedOverhead.addedOverhead`: what the VMI's author adds.
fn reserved_overhead(vmi: &VirtualMachineInstance) -> Result<Qty, TemplateError> {
    let Some(added) = vmi
        .spec
        .domain
        .memory
        .as_ref()
        .and_then(|m| m.extra.get("reservedOverhead"))
        .and_then(|r| r.get("addedOverhead"))
    else {
        return Ok(Qty::ZERO);
    };
    let text = added
        .as_str()
        .ok_or_else(|| TemplateError::Invalid("memory.reservedOverhead.addedOverhead".into()))?;
    Qty::parse(&proto::kubevirt::Quantity(text.to_string()))
        .map_err(|e| TemplateError::Invalid(format!("memory.reservedOverhead.addedOverhead: {e}")))
}

/// `MultiplyMemory`: what multiplying by `ratio` adds, computed on the overhead in whole
/// kilobytes (rounded up) and truncated to a whole kilobyte, as KubeVirt does in floats.
fn ratio_addition(overhead: Qty, ratio: f64) -> Qty {
    let kilo = overhead.milli.div_ceil(1_000_000);
    // Saturating float-to-integer conversion; the configuration allows only finite
    // ratios of at least 1, so the product is finite and not negative.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let added_kilo = (kilo as f64 * (ratio - 1.0)) as u64;
    Qty {
        milli: u128::from(added_kilo) * 1_000_000,
        format: Format::DecimalSi,
    }
}

/// Which map of `spec.domain.resources` to read.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Side {
    Requests,
    Limits,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(spec: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1",
            "kind": "VirtualMachineInstance",
            "metadata": {"name": "t", "namespace": "default"},
            "spec": spec,
        }))
        .expect("valid VMI")
    }

    fn mib(q: Qty) -> f64 {
        q.value() as f64 / MI as f64
    }

    #[test]
    fn worked_examples_of_the_contract() {
        // vmi-migratable: only memory.guest, one vCPU: no page tables.
        let migratable = vmi(json!({"domain": {"devices": {}, "memory": {"guest": "128Mi"}}}));
        assert_eq!(
            mib(memory_overhead(&migratable, "amd64", OverheadModel::KubeVirt, None).unwrap()),
            268.0
        );

        let two = vmi(json!({"domain": {
            "devices": {}, "cpu": {"cores": 2},
            "memory": {"guest": "2Gi"}, "resources": {"requests": {"memory": "2Gi"}}}}));
        assert_eq!(
            mib(memory_overhead(&two, "amd64", OverheadModel::KubeVirt, None).unwrap()),
            280.0
        );

        let eight = vmi(json!({"domain": {
            "devices": {}, "cpu": {"sockets": 2, "cores": 4, "threads": 1},
            "memory": {"guest": "8Gi"}, "resources": {"requests": {"memory": "8Gi"}}}}));
        assert_eq!(
            mib(memory_overhead(&eight, "amd64", OverheadModel::KubeVirt, None).unwrap()),
            340.0
        );
    }

    #[test]
    fn each_term_counts() {
        let base = json!({"devices": {}, "memory": {"guest": "128Mi"}});
        let mut no_video = base.clone();
        no_video["devices"]["autoattachGraphicsDevice"] = json!(false);
        assert_eq!(
            mib(memory_overhead(
                &vmi(json!({"domain": no_video})),
                "amd64",
                OverheadModel::KubeVirt,
                None
            )
            .unwrap()),
            236.0
        );
        assert_eq!(
            mib(memory_overhead(
                &vmi(json!({"domain": base.clone()})),
                "arm64",
                OverheadModel::KubeVirt,
                None
            )
            .unwrap()),
            396.0
        );

        let probed = vmi(json!({"domain": base.clone(),
            "livenessProbe": {"exec": {"command": ["true"]}},
            "readinessProbe": {"httpGet": {"port": 80}}}));
        assert_eq!(
            mib(memory_overhead(&probed, "amd64", OverheadModel::KubeVirt, None).unwrap()),
            268.0 + 110.0
        );

        let mut tpm = base.clone();
        tpm["devices"]["tpm"] = json!({});
        assert_eq!(
            mib(memory_overhead(
                &vmi(json!({"domain": tpm})),
                "amd64",
                OverheadModel::KubeVirt,
                None
            )
            .unwrap()),
            321.0
        );

        let mut dedicated = base.clone();
        dedicated["cpu"] = json!({"cores": 2, "dedicatedCpuPlacement": true});
        assert_eq!(
            mib(memory_overhead(
                &vmi(json!({"domain": dedicated})),
                "amd64",
                OverheadModel::KubeVirt,
                None
            )
            .unwrap()),
            376.0
        );

        let mut reserved = base;
        reserved["memory"]["reservedOverhead"] = json!({"addedOverhead": "1Gi"});
        assert_eq!(
            mib(memory_overhead(
                &vmi(json!({"domain": reserved})),
                "amd64",
                OverheadModel::KubeVirt,
                None
            )
            .unwrap()),
            1292.0
        );
    }

    /// `additionalGuestMemoryOverheadRatio: "1.5"` on vmi-migratable's 268 Mi: 281019 kB
    /// (rounded up) × 0.5 = 140509 kB added, truncated as KubeVirt's float conversion does.
    #[test]
    fn the_overhead_ratio_multiplies_the_overhead() {
        let migratable = vmi(json!({"domain": {"devices": {}, "memory": {"guest": "128Mi"}}}));
        let base = memory_overhead(&migratable, "amd64", OverheadModel::KubeVirt, None).unwrap();
        let raised =
            memory_overhead(&migratable, "amd64", OverheadModel::KubeVirt, Some(1.5)).unwrap();
        assert_eq!(base.value(), 268 * u128::from(MI));
        assert_eq!(raised.value(), 268 * u128::from(MI) + 140_509_000);
        assert_eq!(
            raised.format,
            Format::BinarySi,
            "the sum keeps the overhead's format"
        );
        assert_eq!(
            memory_overhead(&migratable, "amd64", OverheadModel::KubeVirt, Some(1.0)).unwrap(),
            base
        );
    }

    /// The launcher model on the density benchmark's VMI (KubeVirt's perf-scale shape: 90Mi
    /// requested and limited, one vCPU, one disk, the pod interface): 24 fixed + 1 vCPU +
    /// 2 disk + 1 interface + 90 MiB / 256 for page tables.
    #[test]
    fn the_launcher_model_counts_what_the_launcher_holds() {
        let small = vmi(json!({"domain": {
            "devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                        "interfaces": [{"name": "default", "masquerade": {}}]},
            "resources": {"requests": {"memory": "90Mi", "cpu": "100m"},
                          "limits": {"memory": "90Mi", "cpu": "100m"}}}}));
        let overhead = memory_overhead(&small, "amd64", OverheadModel::Launcher, None).unwrap();
        assert_eq!(overhead.value(), (28 << 20) + (90 << 20) / 256);

        // Page tables grow with the guest (memory.guest first), vCPUs and disks count.
        let big = vmi(json!({"domain": {
            "cpu": {"sockets": 2, "cores": 4},
            "devices": {"disks": [{"name": "a"}, {"name": "b"}], "autoattachPodInterface": false},
            "memory": {"guest": "8Gi"}, "resources": {"requests": {"memory": "1Gi"}}}}));
        let overhead = memory_overhead(&big, "amd64", OverheadModel::Launcher, None).unwrap();
        assert_eq!(mib(overhead), 24.0 + 8.0 + 4.0 + 0.0 + 32.0);

        // Exec probes and the author's reserved overhead add; video RAM, arm64's pflash,
        // TPM and guaranteed QoS (KubeVirt's terms for its own helpers) do not.
        let extras = vmi(json!({"domain": {
            "devices": {"autoattachPodInterface": false, "tpm": {}},
            "memory": {"guest": "256Mi", "reservedOverhead": {"addedOverhead": "100Mi"}},
            "resources": {"requests": {"memory": "256Mi", "cpu": "1"},
                          "limits": {"memory": "256Mi", "cpu": "1"}}},
            "livenessProbe": {"exec": {"command": ["true"]}}}));
        let overhead = memory_overhead(&extras, "arm64", OverheadModel::Launcher, None).unwrap();
        assert_eq!(mib(overhead), 24.0 + 1.0 + 1.0 + 10.0 + 100.0);

        // additionalGuestMemoryOverheadRatio applies to this model too.
        let raised = memory_overhead(&small, "amd64", OverheadModel::Launcher, Some(2.0)).unwrap();
        assert!(raised.value() >= 2 * ((28 << 20) + (90 << 20) / 256) - 1000);
    }

    #[test]
    fn the_model_names_of_the_annotation() {
        assert_eq!(
            OverheadModel::parse("launcher"),
            Some(OverheadModel::Launcher)
        );
        assert_eq!(
            OverheadModel::parse("kubevirt"),
            Some(OverheadModel::KubeVirt)
        );
        assert_eq!(OverheadModel::parse("KubeVirt"), None);
    }

    #[test]
    fn vcpus_from_resources_when_no_topology() {
        let from_limit = vmi(json!({"domain": {"devices": {},
            "resources": {"limits": {"cpu": "3"}, "requests": {"cpu": "1"}}}}));
        // 3 vCPUs: 220 + 24 + 8 + 32.
        assert_eq!(
            mib(memory_overhead(&from_limit, "amd64", OverheadModel::KubeVirt, None).unwrap()),
            284.0
        );
    }

    #[test]
    fn bad_request_memory_is_an_error() {
        let bad =
            vmi(json!({"domain": {"devices": {}, "resources": {"requests": {"memory": "lots"}}}}));
        assert!(memory_overhead(&bad, "amd64", OverheadModel::KubeVirt, None).is_err());
    }
}
