//! What libvirt adds to a domain when it defines and starts it. KubeVirt's
//! handler never sees its converter's output directly: it sees the domain
//! XML libvirt reports for the running domain, read back by the Go launcher
//! (`util.GetDomainSpecWithRuntimeInfo`). This launcher has no libvirt, so
//! it fills in the same parts itself.

use proto::domain::{Domain, MemoryAmount};

/// libvirt keeps memory in KiB and always writes `<currentMemory>` (the
/// balloon target; all of the memory without a balloon). The handler
/// reports it as `status.memory.guestCurrent`.
pub(crate) fn as_libvirt_defines(domain: &mut Domain) {
    let spec = &mut domain.spec;
    let Some(memory) = spec.memory.as_ref() else {
        return;
    };
    let Some(bytes) = crate::to_vm::memory_bytes(memory) else {
        return; // refused by `to_vm`, with the field named
    };
    let kib = MemoryAmount {
        value: bytes.div_ceil(1024),
        unit: "KiB".into(),
    };
    spec.current_memory = Some(kib.clone());
    spec.memory = Some(kib);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_in_kib_with_a_current_memory() {
        let mut d = Domain::new("ns", "n", "u");
        d.spec.memory = Some(MemoryAmount::bytes(64 << 20));
        as_libvirt_defines(&mut d);
        let kib = MemoryAmount {
            value: 65536,
            unit: "KiB".into(),
        };
        assert_eq!(d.spec.memory.as_ref(), Some(&kib));
        assert_eq!(d.spec.current_memory.as_ref(), Some(&kib));
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(
            json["Spec"]["CurrentMemory"],
            serde_json::json!({"Value": 65536, "Unit": "KiB"})
        );
    }
}
