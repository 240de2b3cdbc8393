//! The VM-wide state KVM keeps, for migration: the in-kernel interrupt controllers
//! (both PICs and the IOAPIC), the PIT, the kvmclock; and the dirty-page log of guest
//! memory that live migration copies by.

use kvm_bindings::{
    KVM_IRQCHIP_IOAPIC, KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_MEM_LOG_DIRTY_PAGES,
    kvm_clock_data, kvm_irqchip, kvm_pit_state2, kvm_userspace_memory_region,
};
use kvm_ioctls::VmFd;
use virtio_devices::GuestMemoryMmap;
use vm_memory::bitmap::AtomicBitmap;
use vm_memory::{Address, GuestMemoryBackend, GuestMemoryRegion};

use crate::wire::{Decoder, Encoder, FormatError};

const CHIPS: [u32; 3] = [
    KVM_IRQCHIP_PIC_MASTER,
    KVM_IRQCHIP_PIC_SLAVE,
    KVM_IRQCHIP_IOAPIC,
];

fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Interrupt controllers, PIT and clock of a VM whose vCPUs are paused.
pub(crate) fn save(vm: &VmFd, e: &mut Encoder) -> Result<(), String> {
    for chip_id in CHIPS {
        let mut chip = kvm_irqchip {
            chip_id,
            ..Default::default()
        };
        vm.get_irqchip(&mut chip).map_err(kvm("KVM_GET_IRQCHIP"))?;
        e.pod(&chip);
    }
    e.pod(&vm.get_pit2().map_err(kvm("KVM_GET_PIT2"))?);
    e.pod(&vm.get_clock().map_err(kvm("KVM_GET_CLOCK"))?);
    Ok(())
}

/// What [`save`] wrote, checked for its shape; KVM checks the values when it is set.
pub(crate) struct VmState {
    chips: [kvm_irqchip; 3],
    pit: kvm_pit_state2,
    clock: kvm_clock_data,
}

impl VmState {
    pub(crate) fn decode(d: &mut Decoder) -> Result<VmState, FormatError> {
        let chips: [kvm_irqchip; 3] = [d.pod()?, d.pod()?, d.pod()?];
        for (chip, expected) in chips.iter().zip(CHIPS) {
            if chip.chip_id != expected {
                return Err(FormatError::Invalid(format!(
                    "interrupt controller {} where {expected} belongs",
                    chip.chip_id
                )));
            }
        }
        Ok(VmState {
            chips,
            pit: d.pod()?,
            clock: d.pod()?,
        })
    }

    /// Sets the state into a VM that has its irqchip and PIT and whose vCPUs have not run.
    pub(crate) fn restore(&self, vm: &VmFd) -> Result<(), String> {
        for chip in &self.chips {
            vm.set_irqchip(chip).map_err(kvm("KVM_SET_IRQCHIP"))?;
        }
        vm.set_pit2(&self.pit).map_err(kvm("KVM_SET_PIT2"))?;
        // Only the clock's value: which of KVM's flags were valid on the source says
        // nothing about this VM.
        let clock = kvm_clock_data {
            clock: self.clock.clock,
            ..Default::default()
        };
        vm.set_clock(&clock).map_err(kvm("KVM_SET_CLOCK"))
    }
}

/// Turns KVM's dirty-page log of every guest memory slot on or off (the slots as
/// `memory::create` registered them: one per region, in order).
pub(crate) fn log_dirty_pages(vm: &VmFd, memory: &GuestMemoryMmap, on: bool) -> Result<(), String> {
    for (slot, region) in memory.iter().enumerate() {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| format!("guest memory region: {e}"))?;
        let region = kvm_userspace_memory_region {
            slot: u32::try_from(slot).map_err(|_| format!("memory slot {slot}"))?,
            flags: if on { KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the same host range `memory::create` registered for this slot,
        // owned by the VM's memory for as long as the VM exists; only the flags change.
        unsafe { vm.set_user_memory_region(region) }.map_err(kvm("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(())
}

/// The pages written since the last call (or since the log was turned on) by the guest
/// (KVM's dirty log) or by the VMM and its devices (the memory's own bitmap), as guest
/// physical addresses of 4 KiB pages, in order; reading clears both.
pub(crate) fn take_dirty_pages(vm: &VmFd, memory: &GuestMemoryMmap) -> Result<Vec<u64>, String> {
    let mut pages = Vec::new();
    for (slot, region) in memory.iter().enumerate() {
        let slot = u32::try_from(slot).map_err(|_| format!("memory slot {slot}"))?;
        let len = usize::try_from(region.len()).map_err(|_| "memory slot size".to_string())?;
        let mut bitmap = vm
            .get_dirty_log(slot, len)
            .map_err(kvm("KVM_GET_DIRTY_LOG"))?;
        for (word, vmm) in bitmap.iter_mut().zip(vmm_bitmap(region).get_and_reset()) {
            *word |= vmm;
        }
        push_pages(
            &mut pages,
            region.start_addr().raw_value(),
            region.len(),
            &bitmap,
        );
    }
    Ok(pages)
}

/// A region's dirty bitmap itself (the region trait's `bitmap()` gives a view of it).
fn vmm_bitmap(region: &vm_memory::GuestRegionMmap<AtomicBitmap>) -> &AtomicBitmap {
    vm_memory::mmap::MmapRegion::bitmap(region)
}

/// Forgets what the VMM and its devices wrote so far (a migration's full copy is about
/// to send everything).
pub(crate) fn clear_vmm_dirty_pages(memory: &GuestMemoryMmap) {
    for region in memory.iter() {
        vmm_bitmap(region).reset();
    }
}

/// The pages the VMM and its devices wrote since the last call (not the guest's).
#[cfg(test)]
fn take_vmm_dirty_pages(memory: &GuestMemoryMmap) -> Vec<u64> {
    let mut pages = Vec::new();
    for region in memory.iter() {
        let bitmap = vmm_bitmap(region).get_and_reset();
        push_pages(
            &mut pages,
            region.start_addr().raw_value(),
            region.len(),
            &bitmap,
        );
    }
    pages
}

/// The pages whose bits are set in `bitmap` (bit n of word w: page 64 w + n of the
/// region at `base`, `len` bytes long).
fn push_pages(pages: &mut Vec<u64>, base: u64, len: u64, bitmap: &[u64]) {
    for (word_index, &word) in bitmap.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            let bit = u64::from(bits.trailing_zeros());
            bits &= bits - 1;
            let page = int_cast::usize_to_u64(word_index) * 64 + bit;
            if page * crate::wire::PAGE < len {
                pages.push(base + page * crate::wire::PAGE);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn what_the_vmm_writes_through_guest_memory_is_marked_dirty() {
        let memory = GuestMemoryMmap::from_ranges(&[
            (GuestAddress(0), 1 << 20),
            (GuestAddress(4 << 20), 1 << 20),
        ])
        .unwrap();
        clear_vmm_dirty_pages(&memory);
        assert!(take_vmm_dirty_pages(&memory).is_empty());
        memory.write_obj(7u8, GuestAddress(0x5003)).unwrap();
        memory
            .write_slice(&[1u8; 8192], GuestAddress(0x10ff0))
            .unwrap();
        memory
            .write_obj(9u64, GuestAddress((4 << 20) + 0x2000))
            .unwrap();
        assert_eq!(
            take_vmm_dirty_pages(&memory),
            vec![0x5000, 0x10000, 0x11000, 0x12000, (4 << 20) + 0x2000]
        );
        // Taken is cleared; reads mark nothing.
        let _: u64 = memory.read_obj(GuestAddress(0x5000)).unwrap();
        assert!(take_vmm_dirty_pages(&memory).is_empty());
    }
}
