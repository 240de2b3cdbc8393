//! I/O buffers cut from one anonymous mapping, optionally on transparent
//! huge pages.
//!
//! Why huge pages: a request buffer that lies in one physically contiguous
//! range reaches the host disk as one segment instead of one per 4 KiB page.
//! Virtual disks (the usual case for a KubeVirt node that is itself a cloud
//! VM) pay per segment: on the build VM, 64 KiB O_DIRECT reads at depth 64
//! ran 1.7x faster from a huge-page buffer than from 4 KiB pages
//! (`vmm/block/docs/benchmarks.md`). QEMU and Cloud Hypervisor advise huge pages for
//! guest RAM for the same reason; our virtio-blk moves data through bounce
//! buffers, so those are what must be huge.
//!
//! Written by hand over `libc::mmap`: the buffers must be 2 MiB aligned,
//! advised with `MADV_HUGEPAGE`, and shared out as disjoint slots to threads;
//! the allocator API gives none of that.

use std::io;
use std::sync::Arc;

/// The size of a transparent huge page on x86-64 (and its alignment).
pub const HUGE_PAGE: usize = 2 << 20;

const SMALL_PAGE: usize = 4096;

/// One anonymous mapping; unmapped when the last slot cut from it goes.
struct Mapping {
    addr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory; `IoBuffer` hands out each byte
// range to exactly one owner, so sharing the `Mapping` between threads only
// shares the right to unmap it at the end.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: no byte is reachable through a shared `Mapping`,
// only through the one `IoBuffer` slot that owns it.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// `len` bytes of zeroed memory, aligned to `align` (a power of two, at
    /// least a page).
    fn new(len: usize, align: usize) -> io::Result<Mapping> {
        let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "I/O buffers too large");
        let len = len
            .max(1)
            .checked_next_multiple_of(align)
            .ok_or_else(too_large)?;
        // Over-allocate by `align`, then give back what lies outside the
        // aligned range.
        let reserve = len.checked_add(align - SMALL_PAGE).ok_or_else(too_large)?;
        // SAFETY: a fresh private anonymous mapping; no existing memory is
        // touched.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = base.cast::<u8>();
        let head = (base as usize).next_multiple_of(align) - base as usize;
        let tail = reserve - head - len;
        // SAFETY: `head + len + tail == reserve`: every pointer below stays
        // inside the mapping just made. The head and tail lie outside the
        // part kept, and unmapping page-aligned parts of a mapping is
        // allowed; a failure would only leave them mapped (a leak).
        let start = unsafe {
            let start = base.add(head);
            if head > 0 {
                libc::munmap(base.cast(), head);
            }
            if tail > 0 {
                libc::munmap(start.add(len).cast(), tail);
            }
            start
        };
        Ok(Mapping { addr: start, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the range is the mapping made in `new`, and no slot of it
        // is left (they hold the `Arc`).
        unsafe { libc::munmap(self.addr.cast(), self.len) };
    }
}

/// Which pages back the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    /// Ordinary 4 KiB pages, resident only where touched.
    Small,
    /// Transparent huge pages where the host has them (the mapping is
    /// rounded up to 2 MiB and advised `MADV_HUGEPAGE`; without THP the
    /// advice fails harmlessly and small pages are used).
    Huge,
    /// Laid out as for `Huge` (2 MiB aligned and sized) but on small pages
    /// until [`IoBuffer::make_huge`]: buffers that may stay little used cost
    /// only the pages touched, not a whole huge page at the first request.
    HugeOnDemand,
}

/// A zeroed, 4 KiB-aligned buffer for one request at a time, owned by one
/// thread at a time. Slots of one `io_buffers` call share a mapping.
pub struct IoBuffer {
    map: Arc<Mapping>,
    offset: usize,
    len: usize,
}

impl IoBuffer {
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: `offset..offset + len` lies inside the mapping (checked
        // in `io_buffers`), no other `IoBuffer` covers it, and `&mut self`
        // makes this the only live reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.map.addr.add(self.offset), self.len) }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Moves the whole mapping this buffer shares with its siblings onto a
    /// transparent huge page now, contents kept (`MADV_HUGEPAGE`, then
    /// `MADV_COLLAPSE`, Linux 6.1). Safe while other threads use their
    /// slots: the kernel collapses under its own locks, as khugepaged does.
    /// An error (no THP on the host, an older kernel, no free huge page)
    /// leaves small pages, which work the same, only slower on disks that
    /// pay per segment.
    pub fn make_huge(&self) -> io::Result<()> {
        for advice in [libc::MADV_HUGEPAGE, libc::MADV_COLLAPSE] {
            // SAFETY: advice on the mapping this buffer holds alive; neither
            // changes its contents.
            if unsafe { libc::madvise(self.map.addr.cast(), self.map.len, advice) } != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// `count` disjoint buffers of `len` bytes each (empty ones when `len` is
/// 0), every one 4 KiB aligned (`len` rounded up to 4 KiB between slots),
/// from one mapping. Fails only when the memory cannot be had.
pub fn io_buffers(count: usize, len: usize, pages: Pages) -> io::Result<Vec<IoBuffer>> {
    let too_large = || io::Error::new(io::ErrorKind::OutOfMemory, "I/O buffers too large");
    let stride = len
        .checked_next_multiple_of(SMALL_PAGE)
        .ok_or_else(too_large)?;
    let total = stride.checked_mul(count).ok_or_else(too_large)?;
    let align = match pages {
        Pages::Small => SMALL_PAGE,
        Pages::Huge | Pages::HugeOnDemand => HUGE_PAGE,
    };
    let map = Mapping::new(total, align)?;
    if pages == Pages::Huge {
        // SAFETY: advice on the range just mapped; it changes no contents.
        // EINVAL (a kernel without THP) leaves small pages: nothing to do.
        unsafe { libc::madvise(map.addr.cast(), map.len, libc::MADV_HUGEPAGE) };
    }
    let map = Arc::new(map);
    Ok((0..count)
        .map(|i| IoBuffer {
            map: map.clone(),
            offset: i * stride,
            len,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Field `key` (such as `VmFlags:`) of the /proc/self/smaps entry that
    /// holds `addr`, trimmed.
    fn smaps_field(addr: usize, key: &str) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((lo, hi)) = range.split_once('-')
                && let (Ok(lo), Ok(hi)) =
                    (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
            {
                inside = (lo..hi).contains(&addr);
            } else if inside && let Some(value) = line.strip_prefix(key) {
                return value.trim().to_string();
            }
        }
        panic!("no mapping holds {addr:#x}");
    }

    fn vm_flags(addr: usize) -> String {
        smaps_field(addr, "VmFlags:")
    }

    fn anon_huge_kib(addr: usize) -> u64 {
        let kib = smaps_field(addr, "AnonHugePages:");
        kib.trim_end_matches(" kB").parse().unwrap()
    }

    #[test]
    fn slots_are_aligned_disjoint_and_zeroed() {
        for pages in [Pages::Small, Pages::Huge, Pages::HugeOnDemand] {
            let mut slots = io_buffers(9, 65536, pages).unwrap();
            assert_eq!(slots.len(), 9);
            let first = slots[0].as_mut_slice().as_ptr() as usize;
            if pages != Pages::Small {
                assert_eq!(first % HUGE_PAGE, 0);
            }
            for (i, s) in slots.iter_mut().enumerate() {
                assert_eq!(s.len(), 65536);
                let b = s.as_mut_slice();
                assert_eq!(b.as_ptr() as usize % SMALL_PAGE, 0);
                assert!(b.iter().all(|&x| x == 0), "slot {i} not zeroed");
                b.fill(u8::try_from(i + 1).expect("a few slots"));
            }
            for (i, s) in slots.iter_mut().enumerate() {
                assert!(
                    s.as_mut_slice().iter().all(|&x| usize::from(x) == i + 1),
                    "slot {i} was overwritten by another slot"
                );
            }
        }
    }

    #[test]
    fn odd_lengths_keep_every_slot_page_aligned() {
        let mut slots = io_buffers(3, 5000, Pages::Small).unwrap();
        for s in &mut slots {
            assert_eq!(s.len(), 5000);
            assert_eq!(s.as_mut_slice().as_ptr() as usize % SMALL_PAGE, 0);
        }
        let mut empty = io_buffers(2, 0, Pages::Huge).unwrap();
        assert!(empty[1].is_empty());
        assert!(empty[1].as_mut_slice().is_empty());
    }

    #[test]
    fn huge_buffers_are_advised_huge_pages() {
        let mut huge = io_buffers(2, 65536, Pages::Huge).unwrap();
        let mut small = io_buffers(2, 65536, Pages::Small).unwrap();
        // "hg": the VMA carries MADV_HUGEPAGE (whatever the host's THP mode).
        let addr = huge[1].as_mut_slice().as_ptr() as usize;
        assert!(
            vm_flags(addr).split(' ').any(|f| f == "hg"),
            "{}",
            vm_flags(addr)
        );
        let addr = small[1].as_mut_slice().as_ptr() as usize;
        assert!(!vm_flags(addr).split(' ').any(|f| f == "hg"));
    }

    #[test]
    fn on_demand_buffers_stay_small_until_made_huge_and_keep_their_contents() {
        let mut slots = io_buffers(9, 65536, Pages::HugeOnDemand).unwrap();
        let addr = slots[0].as_mut_slice().as_ptr() as usize;
        assert_eq!(addr % HUGE_PAGE, 0);
        for (i, s) in slots.iter_mut().enumerate() {
            s.as_mut_slice()
                .fill(u8::try_from(i + 1).expect("a few slots"));
        }
        assert!(!vm_flags(addr).split(' ').any(|f| f == "hg"));
        assert_eq!(anon_huge_kib(addr), 0, "a huge page before make_huge");
        // Needs THP on the host (`enabled` = madvise or always), as on the
        // machines this project tests on.
        slots[3].make_huge().expect("MADV_COLLAPSE");
        assert!(vm_flags(addr).split(' ').any(|f| f == "hg"));
        // At least ours: once advised, the kernel may merge the mapping with
        // another test's huge one next to it into one smaps entry.
        assert!(anon_huge_kib(addr) >= 2048, "{} kB", anon_huge_kib(addr));
        for (i, s) in slots.iter_mut().enumerate() {
            assert!(
                s.as_mut_slice().iter().all(|&x| usize::from(x) == i + 1),
                "slot {i} lost its contents"
            );
        }
    }

    #[test]
    fn impossible_sizes_are_an_error_not_an_abort() {
        let e = io_buffers(1024, 1 << 62, Pages::Huge).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        let e = io_buffers(usize::MAX, 4096, Pages::Small).err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        // Representable, but more than the address space can map.
        assert!(io_buffers(1, 1 << 56, Pages::Small).is_err());
    }

    #[test]
    fn the_mapping_lives_while_any_slot_does() {
        let mut slots = io_buffers(4, 4096, Pages::Huge).unwrap();
        let mut last = slots.pop().unwrap();
        drop(slots);
        // Other threads may own slots: move this one to another thread.
        std::thread::spawn(move || {
            last.as_mut_slice().fill(7);
            assert!(last.as_mut_slice().iter().all(|&b| b == 7));
        })
        .join()
        .unwrap();
    }
}
