//! Guest memory: `memory.guest`, else the memory request, else the limit.

use super::{ConvertError, Result};
use proto::domain::{DomainSpec, MemoryAmount};
use proto::kubevirt::{Quantity, VirtualMachineInstance, quantity};

/// Smallest guest this launcher starts (the boot structures need a few MiB).
const MIN_GUEST_BYTES: u64 = 16 << 20;

pub(crate) fn configure(vmi: &VirtualMachineInstance, spec: &mut DomainSpec) -> Result<()> {
    let bytes = guest_memory_bytes(vmi)?;
    spec.memory = Some(MemoryAmount::bytes(bytes));
    Ok(())
}

/// The guest's memory size in bytes, and the field it came from.
pub(crate) fn guest_memory_bytes(vmi: &VirtualMachineInstance) -> Result<u64> {
    let domain = &vmi.spec.domain;
    let request = |map: Option<&std::collections::BTreeMap<String, Quantity>>| {
        map.and_then(|m| m.get("memory")).cloned()
    };
    let resources = domain.resources.as_ref();
    let (field, q) = if let Some(q) = domain.memory.as_ref().and_then(|m| m.guest.clone()) {
        ("spec.domain.memory.guest", q)
    } else if let Some(q) = request(resources.and_then(|r| r.requests.as_ref())) {
        ("spec.domain.resources.requests.memory", q)
    } else if let Some(q) = request(resources.and_then(|r| r.limits.as_ref())) {
        ("spec.domain.resources.limits.memory", q)
    } else {
        return Err(ConvertError::new(
            "spec.domain.memory.guest",
            "no guest memory: set memory.guest or resources.requests.memory",
        ));
    };
    let bytes = quantity::to_bytes(&q).map_err(|e| ConvertError::new(field, e.to_string()))?;
    if bytes < MIN_GUEST_BYTES {
        return Err(ConvertError::new(
            field,
            format!("{} is below the minimum of 16Mi", q.0),
        ));
    }
    // Guest RAM is mapped in whole MiB.
    Ok(bytes.div_ceil(1 << 20) << 20)
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
