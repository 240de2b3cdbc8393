//! One split virtqueue of 8 entries in a page of guest memory, plus the
//! static memory all virtio checks share (one device is driven at a time and
//! reset before the next, so the host never touches memory we reuse).

use core::ptr::{read_volatile, write_volatile};

use crate::irq;

/// Entries per queue: small, so the guest touches little memory.
pub const QUEUE_SIZE: u16 = 8;

const DESC_OFFSET: u64 = 0x000;
const AVAIL_OFFSET: u64 = 0x100;
const USED_OFFSET: u64 = 0x200;
/// Bytes of a queue page the rings use (zeroed at set-up).
const RINGS_END: usize = 0x300;

const DESC_F_NEXT: u16 = 1;
const DESC_F_WRITE: u16 = 2;

/// Queue pages for up to four queues (the checks use 0 and 1; the devices kept
/// running for `rng=`, `blk=` and `net=tick` have their own: 0, 1, 2 and 3), then data
/// buffers.
#[repr(C, align(4096))]
pub struct Pool {
    queues: [[u8; 4096]; 4],
    pub buffers: [u8; 4 * 4096],
}

static mut POOL: Pool = Pool {
    queues: [[0; 4096]; 4],
    buffers: [0; 4 * 4096],
};

/// Guest-physical address of queue page `index` (0 to 3); the guest runs
/// identity mapped, so it is also the pointer value.
fn queue_page(index: usize) -> u64 {
    // SAFETY: only the address is taken (no reference is created) and
    // `index & 3` keeps the index in bounds.
    unsafe { (&raw mut POOL.queues[index & 3]) as u64 }
}

/// Guest-physical address of the data buffer area (16 KiB).
pub fn buffers() -> u64 {
    // SAFETY: only the address is taken; no reference is created.
    unsafe { (&raw mut POOL.buffers) as u64 }
}

/// Size of the buffer area.
pub const BUFFERS_LEN: u64 = 4 * 4096;

pub fn write8(addr: u64, v: u8) {
    // SAFETY: callers pass addresses inside the pool.
    unsafe { write_volatile(addr as *mut u8, v) }
}
pub fn read8(addr: u64) -> u8 {
    // SAFETY: see write8.
    unsafe { read_volatile(addr as *const u8) }
}
fn write16(addr: u64, v: u16) {
    // SAFETY: see write8; ring fields are naturally aligned.
    unsafe { write_volatile(addr as *mut u16, v) }
}
fn read16(addr: u64) -> u16 {
    // SAFETY: see write16.
    unsafe { read_volatile(addr as *const u16) }
}
pub fn write32(addr: u64, v: u32) {
    // SAFETY: see write16.
    unsafe { write_volatile(addr as *mut u32, v) }
}
pub fn read32(addr: u64) -> u32 {
    // SAFETY: see write16.
    unsafe { read_volatile(addr as *const u32) }
}
pub fn write64(addr: u64, v: u64) {
    // SAFETY: see write16.
    unsafe { write_volatile(addr as *mut u64, v) }
}

/// Fills `len` bytes at `addr` with `byte`.
pub fn fill(addr: u64, len: usize, byte: u8) {
    // SAFETY: callers pass ranges inside the pool; memset is our own.
    unsafe { core::ptr::write_bytes(addr as *mut u8, byte, len) }
}

/// A buffer in a chain: address, length, device-writable.
#[derive(Clone, Copy)]
pub struct Buf {
    pub addr: u64,
    pub len: u32,
    pub writable: bool,
}

pub struct Queue {
    page: u64,
    next_desc: u16,
    avail_idx: u16,
    used_seen: u16,
}

impl Queue {
    /// Queue `index` (0 to 3) of the pool, with zeroed rings.
    pub fn new(index: usize) -> Queue {
        let page = queue_page(index);
        fill(page, RINGS_END, 0);
        Queue {
            page,
            next_desc: 0,
            avail_idx: 0,
            used_seen: 0,
        }
    }

    /// Descriptor table, available ring, used ring.
    pub fn addresses(&self) -> (u64, u64, u64) {
        (
            self.page + DESC_OFFSET,
            self.page + AVAIL_OFFSET,
            self.page + USED_OFFSET,
        )
    }

    /// Writes `bufs` as one chain and makes it available (the caller then
    /// notifies). Returns the head index. At most `QUEUE_SIZE` descriptors
    /// may be outstanding; callers keep far below.
    pub fn add(&mut self, bufs: &[Buf]) -> u16 {
        let head = self.next_desc;
        let n = bufs.len() as u16;
        for (i, b) in bufs.iter().enumerate() {
            let index = (head + i as u16) % QUEUE_SIZE;
            let next = (index + 1) % QUEUE_SIZE;
            let mut flags = if b.writable { DESC_F_WRITE } else { 0 };
            if (i as u16) + 1 < n {
                flags |= DESC_F_NEXT;
            }
            let d = self.page + DESC_OFFSET + u64::from(index) * 16;
            write64(d, b.addr);
            write32(d + 8, b.len);
            write16(d + 12, flags);
            write16(d + 14, next);
        }
        self.next_desc = (head + n) % QUEUE_SIZE;
        let slot = self.page + AVAIL_OFFSET + 4 + u64::from(self.avail_idx % QUEUE_SIZE) * 2;
        write16(slot, head);
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        self.avail_idx = self.avail_idx.wrapping_add(1);
        write16(self.page + AVAIL_OFFSET + 2, self.avail_idx);
        head
    }

    /// Whether the device's used index is exactly the number of used elements taken:
    /// nothing used twice or skipped.
    pub fn used_in_step(&self) -> bool {
        read16(self.page + USED_OFFSET + 2) == self.used_seen
    }

    /// The next used element (descriptor id, length), if any.
    pub fn take_used(&mut self) -> Option<(u32, u32)> {
        let used = self.page + USED_OFFSET;
        if read16(used + 2) == self.used_seen {
            return None;
        }
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        let elem = used + 4 + u64::from(self.used_seen % QUEUE_SIZE) * 8;
        self.used_seen = self.used_seen.wrapping_add(1);
        Some((read32(elem), read32(elem + 4)))
    }

    /// Polls the used ring: right away, then once per millisecond (the vCPU
    /// halts in between) for up to `timeout_ms`.
    pub fn wait_used(&mut self, timeout_ms: u32) -> Option<(u32, u32)> {
        if let Some(u) = self.take_used() {
            return Some(u);
        }
        for _ in 0..timeout_ms {
            irq::sleep_ms(1);
            if let Some(u) = self.take_used() {
                return Some(u);
            }
        }
        None
    }
}
