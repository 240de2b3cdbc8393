//! Guest memory: `memory.guest`, else the memory request, else the limit.

use super::{ConvertError, Result};
use proto::contract::runnable;
use proto::domain::{DomainSpec, MemoryAmount};
use proto::kubevirt::VirtualMachineInstance;

pub(crate) fn configure(vmi: &VirtualMachineInstance, spec: &mut DomainSpec) -> Result<()> {
    let bytes = guest_memory_bytes(vmi)?;
    spec.memory = Some(MemoryAmount::bytes(bytes));
    Ok(())
}

/// The guest's memory size in bytes, whole MiB (`proto::contract::runnable`'s rule, which
/// admission and the controller's pod sizing share).
pub(crate) fn guest_memory_bytes(vmi: &VirtualMachineInstance) -> Result<u64> {
    runnable::guest_memory_bytes(vmi).map_err(|r| ConvertError::new(r.field, r.reason))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;

    #[test]
    fn memory_sources_in_kubevirt_order() {
        let v = vmi(
            "domain:\n  memory:\n    guest: 128Mi\n  resources:\n    requests:\n      memory: 1Gi",
        );
        let mut spec = DomainSpec::default();
        configure(&v, &mut spec).unwrap();
        assert_eq!(
            spec.memory,
            Some(MemoryAmount {
                value: 128 << 20,
                unit: "b".into()
            })
        );
        let v = vmi("domain:\n  resources:\n    requests:\n      memory: 64Mi");
        assert_eq!(guest_memory_bytes(&v).unwrap(), 64 << 20);
        let v = vmi("domain:\n  resources:\n    limits:\n      memory: 32Mi");
        assert_eq!(guest_memory_bytes(&v).unwrap(), 32 << 20);
        // 1024M is not whole MiB: rounded up.
        let v = vmi("domain:\n  memory:\n    guest: 1024M");
        assert_eq!(guest_memory_bytes(&v).unwrap(), 977 << 20);
    }

    #[test]
    fn bad_memory_names_the_field() {
        let err = guest_memory_bytes(&vmi("domain: {}")).unwrap_err();
        assert_eq!(err.field, "spec.domain.memory.guest");
        let err = guest_memory_bytes(&vmi("domain:\n  memory:\n    guest: lots")).unwrap_err();
        assert_eq!(err.field, "spec.domain.memory.guest");
        let err = guest_memory_bytes(&vmi("domain:\n  memory:\n    guest: 1Mi")).unwrap_err();
        assert!(err.reason.contains("minimum"));
    }
}
