//! vCPUs: sockets × cores × threads (each 1 by default), CPU mode.

use super::{ConvertError, Result};
use proto::domain::{Cpu, CpuTopology, DomainSpec, Vcpu};
use proto::kubevirt::VirtualMachineInstance;

/// The VMM's limit (8-bit xAPIC ids).
const MAX_VCPUS: u32 = vmm::config::MAX_VCPUS as u32;

pub fn configure(vmi: &VirtualMachineInstance, spec: &mut DomainSpec) -> Result<()> {
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
    spec.cpu = Some(Cpu {
        mode: model,
        topology: Some(topology),
        ..Default::default()
    });
    spec.vcpu = Some(Vcpu {
        placement: "static".into(),
        cpus: vcpus,
    });
    Ok(())
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
