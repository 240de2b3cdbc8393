//! vCPUs: sockets × cores × threads (each 1 by default), CPU mode, and the
//! hot-plug headroom of `maxSockets`, as KubeVirt's
//! `pkg/virt-launcher/virtwrap/converter/compute/cpu.go` writes them.

use super::{ConvertError, Result};
use proto::domain::{Cpu, CpuTopology, DomainSpec, Vcpu, Vcpus, VcpusVcpu};
use proto::kubevirt::VirtualMachineInstance;

/// The VMM's limit (8-bit xAPIC ids).
const MAX_VCPUS: u32 = vmm::config::MAX_VCPUS as u32;

pub(crate) fn configure(vmi: &VirtualMachineInstance, spec: &mut DomainSpec) -> Result<()> {
    let cpu = vmi.spec.domain.cpu.clone().unwrap_or_default();
    let topology = CpuTopology {
        sockets: cpu.sockets.unwrap_or(1),
        cores: cpu.cores.unwrap_or(1),
        threads: cpu.threads.unwrap_or(1),
    };
    let vcpus = topology
        .sockets
        .checked_mul(topology.cores)
        .and_then(|v| v.checked_mul(topology.threads))
        .filter(|v| (1..=MAX_VCPUS).contains(v))
        .ok_or_else(|| {
            ConvertError::new(
                "spec.domain.cpu",
                format!("sockets × cores × threads must be between 1 and {MAX_VCPUS}"),
            )
        })?;
    let model = cpu.model.clone().unwrap_or_else(|| "host-model".into());
    // The VMM passes the host's KVM-supported CPUID through: host-model and
    // host-passthrough both mean that; named models are not emulated.
    if model != "host-model" && model != "host-passthrough" {
        return Err(ConvertError::new(
            "spec.domain.cpu.model",
            format!("{model:?} is not supported: use host-model or host-passthrough"),
        ));
    }
    let (topology, vcpus, hotplug) = match cpu.max_sockets.filter(|m| *m != 0) {
        Some(max_sockets) => with_hotplug_headroom(topology, vcpus, max_sockets)?,
        None => (topology, vcpus, None),
    };
    spec.cpu = Some(Cpu {
        mode: model,
        topology: Some(topology),
        ..Default::default()
    });
    spec.vcpu = Some(Vcpu {
        placement: "static".into(),
        cpus: vcpus,
    });
    spec.vcpus = hotplug;
    Ok(())
}

/// `maxSockets`: the domain declares `maxSockets` sockets' worth of vCPUs,
/// the requested ones enabled; those past the first socket can be
/// unplugged and the disabled ones plugged (KubeVirt's
/// `domainVCPUTopologyForHotplug`).
fn with_hotplug_headroom(
    requested: CpuTopology,
    enabled: u32,
    max_sockets: u32,
) -> Result<(CpuTopology, u32, Option<Vcpus>)> {
    const FIELD: &str = "spec.domain.cpu.maxSockets";
    if max_sockets < requested.sockets {
        return Err(ConvertError::new(
            FIELD,
            format!(
                "{max_sockets} is less than the {} sockets requested",
                requested.sockets
            ),
        ));
    }
    let per_socket = requested.cores * requested.threads;
    let total = per_socket
        .checked_mul(max_sockets)
        .filter(|t| *t <= MAX_VCPUS)
        .ok_or_else(|| {
            ConvertError::new(
                FIELD,
                format!("maxSockets × cores × threads must be at most {MAX_VCPUS}"),
            )
        })?;
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
    let vcpus = (0..total)
        .map(|id| VcpusVcpu {
            id,
            enabled: yes_no(id < enabled),
            hotpluggable: yes_no(id >= per_socket),
            order: 0,
        })
        .collect();
    let topology = CpuTopology {
        sockets: max_sockets,
        ..requested
    };
    Ok((topology, total, Some(Vcpus { vcpu: vcpus })))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;

    #[test]
    fn topology_defaults_and_products() {
        let mut spec = DomainSpec::default();
        configure(&vmi("domain: {}"), &mut spec).unwrap();
        assert_eq!(spec.vcpu.as_ref().unwrap().cpus, 1);
        assert_eq!(spec.cpu.as_ref().unwrap().mode, "host-model");
        configure(
            &vmi("domain:\n  cpu:\n    sockets: 2\n    cores: 2"),
            &mut spec,
        )
        .unwrap();
        assert_eq!(spec.vcpu.unwrap().cpus, 4);
    }

    #[test]
    fn max_sockets_declares_hotplug_headroom() {
        let mut spec = DomainSpec::default();
        configure(
            &vmi("domain:\n  cpu:\n    sockets: 2\n    cores: 2\n    maxSockets: 4"),
            &mut spec,
        )
        .unwrap();
        // KubeVirt: all maxSockets' vCPUs declared, the requested 4 online,
        // those of the first socket not hot-pluggable.
        assert_eq!(spec.vcpu.as_ref().unwrap().cpus, 8);
        assert_eq!(
            spec.cpu
                .as_ref()
                .unwrap()
                .topology
                .as_ref()
                .unwrap()
                .sockets,
            4
        );
        let list = &spec.vcpus.as_ref().unwrap().vcpu;
        let flags: Vec<_> = list
            .iter()
            .map(|v| (v.id, v.enabled.as_str(), v.hotpluggable.as_str()))
            .collect();
        assert_eq!(
            flags,
            [
                (0, "yes", "no"),
                (1, "yes", "no"),
                (2, "yes", "yes"),
                (3, "yes", "yes"),
                (4, "no", "yes"),
                (5, "no", "yes"),
                (6, "no", "yes"),
                (7, "no", "yes"),
            ]
        );
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(
            json["VCPUs"]["VCPU"][4],
            serde_json::json!({"ID": 4, "Enabled": "no", "Hotpluggable": "yes", "Order": 0})
        );
        // No maxSockets: no list, as KubeVirt.
        configure(&vmi("domain:\n  cpu:\n    sockets: 2"), &mut spec).unwrap();
        assert!(spec.vcpus.is_none());
        let err = configure(
            &vmi("domain:\n  cpu:\n    sockets: 2\n    maxSockets: 1"),
            &mut spec,
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.cpu.maxSockets");
        let err = configure(
            &vmi("domain:\n  cpu:\n    cores: 64\n    maxSockets: 4"),
            &mut spec,
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.cpu.maxSockets");
    }

    #[test]
    fn impossible_cpus_are_refused() {
        let mut spec = DomainSpec::default();
        let err = configure(&vmi("domain:\n  cpu:\n    cores: 0"), &mut spec).unwrap_err();
        assert_eq!(err.field, "spec.domain.cpu");
        let err = configure(
            &vmi("domain:\n  cpu:\n    cores: 4294967295\n    sockets: 2"),
            &mut spec,
        )
        .unwrap_err();
        assert_eq!(err.field, "spec.domain.cpu");
        let err = configure(&vmi("domain:\n  cpu:\n    model: Skylake"), &mut spec).unwrap_err();
        assert_eq!(err.field, "spec.domain.cpu.model");
    }
}
