//! The launcher pod's memory overhead: KubeVirt v1.9.0's estimate for the KVM backend
//! (`pkg/hypervisor/kvm/hypervisorbackend.go` `GetMemoryOverhead`).

use super::{TemplateError, vcpus_for_overhead};
use crate::quantity::{Format, Qty};
use proto::kubevirt::VirtualMachineInstance;

const MI: u64 = 1 << 20;

/// RSS estimates of the processes in the compute container, in MiB: virt-launcher-monitor 25,
/// virt-launcher 100, virtlogd 25, virtqemud 40, qemu 30 (`QemuOverhead` at v1.9.0).
pub(crate) const FIXED_OVERHEAD_MIB: u64 = 25 + 100 + 25 + 40 + 30;

/// The overhead as apimachinery computes it, including the format its sum ends up with (the
/// first non-zero term decides it; see [`Qty::plus`]), multiplied by the cluster's
/// `additionalGuestMemoryOverheadRatio` if there is one.
pub(crate) fn memory_overhead(
    vmi: &VirtualMachineInstance,
    arch: &str,
    ratio: Option<f64>,
) -> Result<Qty, TemplateError> {
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
    let exec_probe = |probe: &Option<serde_json::Value>| {
        probe
            .as_ref()
            .is_some_and(|p| p.get("exec").is_some_and(|e| !e.is_null()))
    };
    let liveness = exec_probe(&vmi.spec.liveness_probe);
    let readiness = exec_probe(&vmi.spec.readiness_probe);
    for probe in [liveness, readiness] {
        if probe {
            overhead = overhead.plus(Qty::mebibytes(10));
        }
    }
    if liveness || readiness {
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

    if let Some(added) = domain
        .memory
        .as_ref()
        .and_then(|m| m.extra.get("reservedOverhead"))
        .and_then(|r| r.get("addedOverhead"))
    {
        let text = added.as_str().ok_or_else(|| {
            TemplateError::Invalid("memory.reservedOverhead.addedOverhead".into())
        })?;
        let added = Qty::parse(&proto::kubevirt::Quantity(text.to_string())).map_err(|e| {
            TemplateError::Invalid(format!("memory.reservedOverhead.addedOverhead: {e}"))
        })?;
        overhead = overhead.plus(added);
    }

    if let Some(ratio) = ratio {
        overhead = overhead.plus(ratio_addition(overhead, ratio));
    }
    Ok(overhead)
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
            mib(memory_overhead(&migratable, "amd64", None).unwrap()),
            268.0
        );

        let two = vmi(json!({"domain": {
            "devices": {}, "cpu": {"cores": 2},
            "memory": {"guest": "2Gi"}, "resources": {"requests": {"memory": "2Gi"}}}}));
        assert_eq!(mib(memory_overhead(&two, "amd64", None).unwrap()), 280.0);

        let eight = vmi(json!({"domain": {
            "devices": {}, "cpu": {"sockets": 2, "cores": 4, "threads": 1},
            "memory": {"guest": "8Gi"}, "resources": {"requests": {"memory": "8Gi"}}}}));
        assert_eq!(mib(memory_overhead(&eight, "amd64", None).unwrap()), 340.0);
    }

    #[test]
    fn each_term_counts() {
        let base = json!({"devices": {}, "memory": {"guest": "128Mi"}});
        let mut no_video = base.clone();
        no_video["devices"]["autoattachGraphicsDevice"] = json!(false);
        assert_eq!(
            mib(memory_overhead(&vmi(json!({"domain": no_video})), "amd64", None).unwrap()),
            236.0
        );
        assert_eq!(
            mib(memory_overhead(&vmi(json!({"domain": base.clone()})), "arm64", None).unwrap()),
            396.0
        );

        let probed = vmi(json!({"domain": base.clone(),
            "livenessProbe": {"exec": {"command": ["true"]}},
            "readinessProbe": {"httpGet": {"port": 80}}}));
        assert_eq!(
            mib(memory_overhead(&probed, "amd64", None).unwrap()),
            268.0 + 110.0
        );

        let mut tpm = base.clone();
        tpm["devices"]["tpm"] = json!({});
        assert_eq!(
            mib(memory_overhead(&vmi(json!({"domain": tpm})), "amd64", None).unwrap()),
            321.0
        );

        let mut dedicated = base.clone();
        dedicated["cpu"] = json!({"cores": 2, "dedicatedCpuPlacement": true});
        assert_eq!(
            mib(memory_overhead(&vmi(json!({"domain": dedicated})), "amd64", None).unwrap()),
            376.0
        );

        let mut reserved = base;
        reserved["memory"]["reservedOverhead"] = json!({"addedOverhead": "1Gi"});
        assert_eq!(
            mib(memory_overhead(&vmi(json!({"domain": reserved})), "amd64", None).unwrap()),
            1292.0
        );
    }

    /// `additionalGuestMemoryOverheadRatio: "1.5"` on vmi-migratable's 268 Mi: 281019 kB
    /// (rounded up) × 0.5 = 140509 kB added, truncated as KubeVirt's float conversion does.
    #[test]
    fn the_overhead_ratio_multiplies_the_overhead() {
        let migratable = vmi(json!({"domain": {"devices": {}, "memory": {"guest": "128Mi"}}}));
        let base = memory_overhead(&migratable, "amd64", None).unwrap();
        let raised = memory_overhead(&migratable, "amd64", Some(1.5)).unwrap();
        assert_eq!(base.value(), 268 * u128::from(MI));
        assert_eq!(raised.value(), 268 * u128::from(MI) + 140_509_000);
        assert_eq!(
            raised.format,
            Format::BinarySi,
            "the sum keeps the overhead's format"
        );
        assert_eq!(
            memory_overhead(&migratable, "amd64", Some(1.0)).unwrap(),
            base
        );
    }

    #[test]
    fn vcpus_from_resources_when_no_topology() {
        let from_limit = vmi(json!({"domain": {"devices": {},
            "resources": {"limits": {"cpu": "3"}, "requests": {"cpu": "1"}}}}));
        // 3 vCPUs: 220 + 24 + 8 + 32.
        assert_eq!(
            mib(memory_overhead(&from_limit, "amd64", None).unwrap()),
            284.0
        );
    }

    #[test]
    fn bad_request_memory_is_an_error() {
        let bad =
            vmi(json!({"domain": {"devices": {}, "resources": {"requests": {"memory": "lots"}}}}));
        assert!(memory_overhead(&bad, "amd64", None).is_err());
    }
}
