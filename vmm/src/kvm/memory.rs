//! Guest RAM: anonymous host mappings (touched lazily) registered with KVM.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use virtio_devices::GuestMemoryMmap;
use vm_memory::{Address, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::layout::ram_ranges;
use super::{Error, Result};

/// Allocates `mem_bytes` of guest RAM laid out around the MMIO hole and
/// registers every region as a KVM memory slot.
pub(crate) fn create(vm: &VmFd, mem_bytes: u64) -> Result<GuestMemoryMmap> {
    let ranges: Vec<(GuestAddress, usize)> = ram_ranges(mem_bytes)
        .into_iter()
        .map(|(start, len)| {
            Ok((
                GuestAddress(start),
                usize::try_from(len).map_err(|_| Error::MemorySize(mem_bytes))?,
            ))
        })
        .collect::<Result<_>>()?;
    let mem = GuestMemoryMmap::from_ranges(&ranges).map_err(Error::Memory)?;
    for (slot, region) in mem.iter().enumerate() {
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(Error::MemoryRegion)?;
        let region = kvm_userspace_memory_region {
            slot: u32::try_from(slot).map_err(|_| Error::MemorySlot(slot))?,
            flags: 0,
            guest_phys_addr: region.start_addr().raw_value(),
            memory_size: region.len(),
            userspace_addr: host as u64,
        };
        // SAFETY: the host range belongs to `mem`, which the VM keeps alive
        // for as long as the VM fd exists (both live in `Vm`); the regions do
        // not overlap.
        unsafe { vm.set_user_memory_region(region) }
            .map_err(super::kvm_err("KVM_SET_USER_MEMORY_REGION"))?;
    }
    Ok(mem)
}
