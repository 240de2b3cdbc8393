//! What one hostile notification can make the VMM allocate.
//!
//! The guest fills a 256-entry queue with 256 chains that all point at one
//! indirect table of 65 026 descriptors. Without a bound on chain length
//! the device collected 256 × 65 026 buffers (about 266 MB of buffer
//! lists; with requests that pass parsing, twice that). With chains limited
//! to the queue size (virtio 1.2 §2.7.5.3.1) every chain is refused after
//! 257 descriptors and the notification allocates a few KiB.
//!
//! Its own test binary: the counting allocator sees every allocation of
//! the process, so nothing else may run alongside.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_ring::{
    VIRTIO_RING_F_INDIRECT_DESC, VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE,
};
use virtio_devices::GuestMemoryMmap;
use virtio_devices::block::{Block, BlockOptions};
use virtio_devices::fuzz::MemDisk;
use virtio_devices::{InterruptTrigger, MmioTransport};
use vm_memory::{Bytes, GuestAddress};

/// A descriptor flag as the 16-bit field carries it.
fn flag(f: u32) -> u16 {
    u16::try_from(f).expect("descriptor flags are 16 bits")
}

/// Counts live heap bytes and their high-water mark.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
            PEAK.fetch_max(live, Ordering::SeqCst);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

struct NoIrq;
impl InterruptTrigger for NoIrq {
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

const QUEUE: u16 = 256;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const HDR: u64 = 0x8000;
const DATA: u64 = 0x9000;
const STATUS: u64 = 0xf000;
const TABLE: u64 = 0x10_0000;
/// The measured attack: one table shared by every head.
const TABLE_ENTRIES: u64 = 65_026;

fn desc(mem: &GuestMemoryMmap, at: u64, addr: u64, len: u32, flags: u16, next: u16) {
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&addr.to_le_bytes());
    raw[8..12].copy_from_slice(&len.to_le_bytes());
    raw[12..14].copy_from_slice(&flags.to_le_bytes());
    raw[14..16].copy_from_slice(&next.to_le_bytes());
    mem.write_slice(&raw, GuestAddress(at)).unwrap();
}

fn write32(t: &mut MmioTransport, reg: u32, v: u32) {
    t.write(u64::from(reg), &v.to_le_bytes());
}

fn read32(t: &mut MmioTransport, reg: u32) -> u32 {
    let mut b = [0u8; 4];
    t.read(u64::from(reg), &mut b);
    u32::from_le_bytes(b)
}

#[test]
fn one_notification_with_huge_indirect_chains_allocates_little() {
    let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 4 << 20)]).unwrap();
    // header | 65 024 data buffers | status, chained inside the table.
    let last = TABLE_ENTRIES - 1;
    for i in 0..TABLE_ENTRIES {
        let (addr, len, mut flags) = match i {
            0 => (HDR, 16, 0),
            i if i == last => (STATUS, 1, flag(VRING_DESC_F_WRITE)),
            _ => (DATA, 512, flag(VRING_DESC_F_WRITE)),
        };
        if i < last {
            flags |= flag(VRING_DESC_F_NEXT);
        }
        desc(
            &mem,
            TABLE + 16 * i,
            addr,
            len,
            flags,
            u16::try_from(i + 1).expect("few entries"),
        );
    }
    let header = [0u8; 16]; // VIRTIO_BLK_T_IN at sector 0
    mem.write_slice(&header, GuestAddress(HDR)).unwrap();
    for head in 0..QUEUE {
        desc(
            &mem,
            DESC + 16 * u64::from(head),
            TABLE,
            u32::try_from(16 * TABLE_ENTRIES).expect("a small table"),
            flag(VRING_DESC_F_INDIRECT),
            0,
        );
        mem.write_obj(head.to_le(), GuestAddress(AVAIL + 4 + 2 * u64::from(head)))
            .unwrap();
    }
    mem.write_obj(QUEUE.to_le(), GuestAddress(AVAIL + 2))
        .unwrap();

    let disk = MemDisk::new(1 << 20);
    let options = BlockOptions {
        io_threads: 0,
        ..BlockOptions::default()
    };
    let dev = Block::new(Box::new(disk), options);
    let mut t = MmioTransport::new(Box::new(dev), mem.clone(), Arc::new(NoIrq));
    let ack = VIRTIO_CONFIG_S_ACKNOWLEDGE;
    let driver = ack | VIRTIO_CONFIG_S_DRIVER;
    let features_ok = driver | VIRTIO_CONFIG_S_FEATURES_OK;
    write32(&mut t, VIRTIO_MMIO_STATUS, ack);
    write32(&mut t, VIRTIO_MMIO_STATUS, driver);
    write32(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
    write32(
        &mut t,
        VIRTIO_MMIO_DRIVER_FEATURES,
        1 << VIRTIO_RING_F_INDIRECT_DESC,
    );
    write32(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    write32(
        &mut t,
        VIRTIO_MMIO_DRIVER_FEATURES,
        1 << (VIRTIO_F_VERSION_1 - 32),
    );
    write32(&mut t, VIRTIO_MMIO_STATUS, features_ok);
    write32(&mut t, VIRTIO_MMIO_QUEUE_SEL, 0);
    write32(&mut t, VIRTIO_MMIO_QUEUE_NUM, u32::from(QUEUE));
    write32(
        &mut t,
        VIRTIO_MMIO_QUEUE_DESC_LOW,
        u32::try_from(DESC).expect("below 4 GiB"),
    );
    write32(
        &mut t,
        VIRTIO_MMIO_QUEUE_AVAIL_LOW,
        u32::try_from(AVAIL).expect("below 4 GiB"),
    );
    write32(
        &mut t,
        VIRTIO_MMIO_QUEUE_USED_LOW,
        u32::try_from(USED).expect("below 4 GiB"),
    );
    write32(&mut t, VIRTIO_MMIO_QUEUE_READY, 1);
    write32(
        &mut t,
        VIRTIO_MMIO_STATUS,
        features_ok | VIRTIO_CONFIG_S_DRIVER_OK,
    );
    assert_eq!(
        read32(&mut t, VIRTIO_MMIO_STATUS),
        features_ok | VIRTIO_CONFIG_S_DRIVER_OK
    );

    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    write32(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    let peak = PEAK.load(Ordering::SeqCst) - before;
    println!("peak heap growth during the notification: {peak} bytes");

    // Every chain came back, refused (nothing written), and the device
    // still works.
    let used_idx: u16 = mem.read_obj(GuestAddress(USED + 2)).unwrap();
    assert_eq!(u16::from_le(used_idx), QUEUE);
    for n in 0..u64::from(QUEUE) {
        let len: u32 = mem.read_obj(GuestAddress(USED + 4 + 8 * n + 4)).unwrap();
        assert_eq!(u32::from_le(len), 0, "chain {n}");
    }
    assert_eq!(
        read32(&mut t, VIRTIO_MMIO_STATUS) & VIRTIO_CONFIG_S_NEEDS_RESET,
        0
    );
    // A queue's worth of chains of at most a queue's worth of 16-byte
    // buffers is 1 MiB; the refused chains hold far less.
    assert!(
        peak < 2 << 20,
        "one notification grew the heap by {peak} bytes"
    );
}
