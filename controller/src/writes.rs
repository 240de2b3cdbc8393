//! Counts of the API writes the controllers make, by kind (KubeVirt's CI bounds them: at most
//! 2 PATCH and 10 UPDATE of VMIs per launcher pod created).

use std::sync::atomic::{AtomicU64, Ordering};

/// One kind of write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    VmiCreate,
    VmiPatch,
    VmiStatusPatch,
    VmiDelete,
    PodCreate,
    PodDelete,
    PodPatch,
    VmPatch,
    VmStatusPatch,
    RevisionCreate,
    RevisionDelete,
    Event,
    /// The `KubeVirt` CR's status (phase and conditions).
    KubeVirtStatusPatch,
    /// A `VirtualMachineInstanceMigration`'s status or finalizers.
    MigrationPatch,
}

const KINDS: usize = 14;

impl Write {
    /// Every kind, in declaration order.
    pub(crate) const ALL: [Write; KINDS] = [
        Write::VmiCreate,
        Write::VmiPatch,
        Write::VmiStatusPatch,
        Write::VmiDelete,
        Write::PodCreate,
        Write::PodDelete,
        Write::PodPatch,
        Write::VmPatch,
        Write::VmStatusPatch,
        Write::RevisionCreate,
        Write::RevisionDelete,
        Write::Event,
        Write::KubeVirtStatusPatch,
        Write::MigrationPatch,
    ];
}

/// Thread-safe counters, one per [`Write`].
#[derive(Debug, Default)]
pub struct Writes {
    counts: [AtomicU64; KINDS],
}

impl Writes {
    pub fn record(&self, write: Write) {
        self.counts[write as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, write: Write) -> u64 {
        self.counts[write as usize].load(Ordering::Relaxed)
    }

    /// All VMI writes (create, patches, status patches, delete).
    pub fn vmi_writes(&self) -> u64 {
        [
            Write::VmiCreate,
            Write::VmiPatch,
            Write::VmiStatusPatch,
            Write::VmiDelete,
        ]
        .into_iter()
        .map(|w| self.get(w))
        .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_by_kind() {
        let writes = Writes::default();
        writes.record(Write::VmiPatch);
        writes.record(Write::VmiPatch);
        writes.record(Write::PodCreate);
        writes.record(Write::Event);
        assert_eq!(writes.get(Write::VmiPatch), 2);
        assert_eq!(writes.get(Write::PodCreate), 1);
        assert_eq!(writes.get(Write::Event), 1);
        assert_eq!(writes.vmi_writes(), 2);
    }
}
