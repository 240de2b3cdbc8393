//! Test side of the virtio protocol: a driver that builds descriptor tables
//! and rings in guest memory the way a guest would, and programs an
//! [`MmioTransport`] through its registers.
//!
//! Hand-written rather than `virtio_queue::mock::MockSplitQueue` because the
//! tests need descriptors the mock refuses to build (loops, unknown flags,
//! out-of-memory addresses) and ring placement chosen per queue.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};

use crate::MmioTransport;
use crate::interrupt::tests::CountingTrigger;

/// Guest memory size used by the tests.
pub(crate) const MEM_SIZE: u64 = 4 << 20;

pub(crate) fn test_memory() -> GuestMemoryMmap {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), int_cast::u64_to_usize(MEM_SIZE))])
        .expect("4 MiB of anonymous memory")
}

/// One descriptor as the driver writes it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Desc {
    pub(crate) addr: u64,
    pub(crate) len: u32,
    pub(crate) flags: u16,
    pub(crate) next: u16,
}

impl Desc {
    pub(crate) fn read(addr: u64, len: u32) -> Self {
        Desc {
            addr,
            len,
            flags: 0,
            next: 0,
        }
    }

    pub(crate) fn write(addr: u64, len: u32) -> Self {
        Desc {
            addr,
            len,
            flags: crate::chain::DESC_F_WRITE,
            next: 0,
        }
    }

    pub(crate) fn with_next(mut self, next: u16) -> Self {
        self.flags |= crate::chain::DESC_F_NEXT;
        self.next = next;
        self
    }
}

/// One split virtqueue laid out at `base`: descriptor table, then available
/// ring at `base + 0x1000`, used ring at `base + 0x2000` (enough for 256
/// entries).
pub(crate) struct GuestDriver<'a> {
    mem: &'a GuestMemoryMmap,
    size: u16,
    base: u64,
    next_free: u16,
    avail_idx: u16,
}

impl<'a> GuestDriver<'a> {
    pub(crate) fn new(mem: &'a GuestMemoryMmap, size: u16) -> Self {
        Self::at(mem, size, 0x1000)
    }

    pub(crate) fn at(mem: &'a GuestMemoryMmap, size: u16, base: u64) -> Self {
        assert!(size <= 256, "the test layout holds at most 256 entries");
        let d = GuestDriver {
            mem,
            size,
            base,
            next_free: 0,
            avail_idx: 0,
        };
        // Zero the rings so that indexes start at 0.
        mem.write_slice(&[0u8; 0x3000], GuestAddress(base)).unwrap();
        d
    }

    pub(crate) fn desc_table(&self) -> u64 {
        self.base
    }
    pub(crate) fn avail_ring(&self) -> u64 {
        self.base + 0x1000
    }
    pub(crate) fn used_ring(&self) -> u64 {
        self.base + 0x2000
    }
    pub(crate) fn size(&self) -> u16 {
        self.size
    }

    pub(crate) fn set_desc(&mut self, index: u16, addr: u64, len: u32, flags: u16, next: u16) {
        write_desc(
            self.mem,
            self.base + u64::from(index) * 16,
            Desc {
                addr,
                len,
                flags,
                next,
            },
        );
    }

    pub(crate) fn write_indirect_table(&mut self, addr: u64, descs: &[Desc]) {
        for (i, d) in descs.iter().enumerate() {
            write_desc(self.mem, addr + i as u64 * 16, *d);
        }
    }

    /// Writes `descs` as a linked chain into free table slots and makes it
    /// available. Returns the head index.
    pub(crate) fn add_chain(&mut self, descs: &[Desc]) -> u16 {
        let head = self.next_free;
        let n = u16::try_from(descs.len()).expect("a test chain is short");
        for (i, d) in (0u16..).zip(descs) {
            let index = (head + i) % self.size;
            let mut d = *d;
            if i + 1 < n {
                d = d.with_next((index + 1) % self.size);
            }
            self.set_desc(index, d.addr, d.len, d.flags, d.next);
        }
        self.next_free = (head + n) % self.size;
        self.publish(head);
        head
    }

    /// Puts `head` in the next available ring slot and bumps `avail.idx`.
    pub(crate) fn publish(&mut self, head: u16) {
        let slot = self.avail_ring() + 4 + u64::from(self.avail_idx % self.size) * 2;
        self.mem
            .write_obj(head.to_le(), GuestAddress(slot))
            .unwrap();
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(self.avail_idx);
    }

    /// Writes `avail.idx` directly (to fake a driver that lies about it).
    pub(crate) fn set_avail_idx(&mut self, idx: u16) {
        self.avail_idx = idx;
        self.mem
            .store(
                idx.to_le(),
                GuestAddress(self.avail_ring() + 2),
                Ordering::Release,
            )
            .unwrap();
    }

    /// Sets `avail.flags` (for example `VRING_AVAIL_F_NO_INTERRUPT`).
    pub(crate) fn set_avail_flags(&mut self, flags: u16) {
        self.mem
            .write_obj(flags.to_le(), GuestAddress(self.avail_ring()))
            .unwrap();
    }

    pub(crate) fn used_idx(&self) -> u16 {
        let v: u16 = self
            .mem
            .read_obj(GuestAddress(self.used_ring() + 2))
            .unwrap();
        u16::from_le(v)
    }

    /// The used ring element at position `n`: (descriptor id, length).
    pub(crate) fn used_elem(&self, n: u16) -> (u32, u32) {
        let at = self.used_ring() + 4 + u64::from(n % self.size) * 8;
        let id: u32 = self.mem.read_obj(GuestAddress(at)).unwrap();
        let len: u32 = self.mem.read_obj(GuestAddress(at + 4)).unwrap();
        (u32::from_le(id), u32::from_le(len))
    }

    /// A `Queue` set up for this layout, as the transport would build it.
    pub(crate) fn queue(&self) -> Queue {
        let mut q = Queue::new(256).unwrap();
        q.try_set_size(self.size).unwrap();
        q.try_set_desc_table_address(GuestAddress(self.desc_table()))
            .unwrap();
        q.try_set_avail_ring_address(GuestAddress(self.avail_ring()))
            .unwrap();
        q.try_set_used_ring_address(GuestAddress(self.used_ring()))
            .unwrap();
        q.set_ready(true);
        q
    }
}

fn write_desc(mem: &GuestMemoryMmap, at: u64, d: Desc) {
    let mut raw = [0u8; 16];
    raw[0..8].copy_from_slice(&d.addr.to_le_bytes());
    raw[8..12].copy_from_slice(&d.len.to_le_bytes());
    raw[12..14].copy_from_slice(&d.flags.to_le_bytes());
    raw[14..16].copy_from_slice(&d.next.to_le_bytes());
    mem.write_slice(&raw, GuestAddress(at)).unwrap();
}

/// Register-level helpers for driving an [`MmioTransport`] like a guest.
/// The device runs on its own thread, as in the VMM; [`Self::notify`]
/// returns once the thread has handled the notification.
pub(crate) struct MmioDriver {
    pub(crate) transport: MmioTransport,
    pub(crate) irq: Arc<CountingTrigger>,
    /// The queue eventfds the device thread waits on (KVM's side of an
    /// ioeventfd).
    pub(crate) notifiers: Vec<Arc<vmm_sys_util::eventfd::EventFd>>,
}

impl MmioDriver {
    pub(crate) fn new(device: Box<dyn crate::VirtioDevice>, mem: &GuestMemoryMmap) -> Self {
        Self::named("virtio-test", device, mem)
    }

    /// The same with the device thread named `name` (to tell its log lines apart).
    pub(crate) fn named(
        name: &str,
        device: Box<dyn crate::VirtioDevice>,
        mem: &GuestMemoryMmap,
    ) -> Self {
        let irq = Arc::new(CountingTrigger::default());
        let queues = device.queue_max_sizes().len();
        let (mine, theirs): (Vec<_>, Vec<_>) = (0..queues)
            .map(|_| {
                let e = vmm_sys_util::eventfd::EventFd::new(vmm_sys_util::eventfd::EFD_NONBLOCK)
                    .expect("eventfd");
                let clone = e.try_clone().expect("eventfd clone");
                (Arc::new(clone), e)
            })
            .unzip();
        let transport = MmioTransport::with_thread(
            name,
            device,
            mem.clone(),
            irq.clone(),
            theirs,
            Arc::new(crate::Unsandboxed),
        )
        .expect("device thread");
        MmioDriver {
            transport,
            irq,
            notifiers: mine,
        }
    }

    pub(crate) fn read32(&mut self, offset: u32) -> u32 {
        let mut b = [0u8; 4];
        self.transport.read(u64::from(offset), &mut b);
        u32::from_le_bytes(b)
    }

    pub(crate) fn write32(&mut self, offset: u32, v: u32) {
        self.transport.write(u64::from(offset), &v.to_le_bytes());
    }

    pub(crate) fn status(&mut self) -> u32 {
        self.read32(VIRTIO_MMIO_STATUS)
    }

    pub(crate) fn set_status(&mut self, v: u32) {
        self.write32(VIRTIO_MMIO_STATUS, v);
    }

    pub(crate) fn device_features(&mut self) -> u64 {
        self.write32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 0);
        let lo = self.read32(VIRTIO_MMIO_DEVICE_FEATURES);
        self.write32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 1);
        let hi = self.read32(VIRTIO_MMIO_DEVICE_FEATURES);
        u64::from(hi) << 32 | u64::from(lo)
    }

    pub(crate) fn write_driver_features(&mut self, features: u64) {
        self.write32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        self.write32(VIRTIO_MMIO_DRIVER_FEATURES, int_cast::low_half(features));
        self.write32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        self.write32(VIRTIO_MMIO_DRIVER_FEATURES, (features >> 32) as u32);
    }

    /// ACKNOWLEDGE, DRIVER, features, FEATURES_OK. Returns whether the
    /// device kept FEATURES_OK.
    pub(crate) fn negotiate(&mut self, features: u64) -> bool {
        self.set_status(0);
        self.set_status(VIRTIO_CONFIG_S_ACKNOWLEDGE);
        self.set_status(VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER);
        self.write_driver_features(features);
        self.set_status(
            VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK,
        );
        self.status() & VIRTIO_CONFIG_S_FEATURES_OK != 0
    }

    /// Programs queue `index` with the layout of `q`, marks it ready.
    pub(crate) fn setup_queue(&mut self, index: u32, q: &GuestDriver) {
        self.setup_queue_raw(
            index,
            u32::from(q.size()),
            q.desc_table(),
            q.avail_ring(),
            q.used_ring(),
        );
    }

    pub(crate) fn setup_queue_raw(
        &mut self,
        index: u32,
        size: u32,
        desc: u64,
        avail: u64,
        used: u64,
    ) {
        self.write32(VIRTIO_MMIO_QUEUE_SEL, index);
        self.write32(VIRTIO_MMIO_QUEUE_NUM, size);
        self.write32(VIRTIO_MMIO_QUEUE_DESC_LOW, int_cast::low_half(desc));
        self.write32(VIRTIO_MMIO_QUEUE_DESC_HIGH, (desc >> 32) as u32);
        self.write32(VIRTIO_MMIO_QUEUE_AVAIL_LOW, int_cast::low_half(avail));
        self.write32(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, (avail >> 32) as u32);
        self.write32(VIRTIO_MMIO_QUEUE_USED_LOW, int_cast::low_half(used));
        self.write32(VIRTIO_MMIO_QUEUE_USED_HIGH, (used >> 32) as u32);
        self.write32(VIRTIO_MMIO_QUEUE_READY, 1);
    }

    pub(crate) fn driver_ok(&mut self) {
        let s = self.status();
        self.set_status(s | VIRTIO_CONFIG_S_DRIVER_OK);
    }

    /// Full bring-up with VERSION_1 plus `extra` features and the given
    /// queues. Panics if the device refuses; tests that expect refusal use
    /// the individual steps.
    pub(crate) fn bring_up(&mut self, extra: u64, queues: &[&GuestDriver]) {
        assert!(self.negotiate(crate::device::feature_bit(VIRTIO_F_VERSION_1) | extra));
        for (i, q) in queues.iter().enumerate() {
            self.setup_queue(u32::try_from(i).expect("few queues"), q);
        }
        self.driver_ok();
        assert_eq!(
            self.status(),
            VIRTIO_CONFIG_S_ACKNOWLEDGE
                | VIRTIO_CONFIG_S_DRIVER
                | VIRTIO_CONFIG_S_FEATURES_OK
                | VIRTIO_CONFIG_S_DRIVER_OK,
            "device did not accept DRIVER_OK"
        );
    }

    /// A QueueNotify register write (as an exit), then waits until the
    /// device thread has handled it.
    pub(crate) fn notify(&mut self, queue: u32) {
        self.write32(VIRTIO_MMIO_QUEUE_NOTIFY, queue);
        self.transport.sync();
    }

    /// A notification as KVM delivers it with an ioeventfd (no exit), then
    /// waits until the device thread has handled it.
    pub(crate) fn kick(&mut self, queue: usize) {
        self.notifiers[queue].write(1).expect("eventfd write");
        self.transport.sync();
    }

    pub(crate) fn interrupts(&self) -> usize {
        self.irq.count.load(Ordering::SeqCst)
    }

    pub(crate) fn read_config(&mut self, offset: u64, data: &mut [u8]) {
        self.transport
            .read(u64::from(VIRTIO_MMIO_CONFIG) + offset, data);
    }
}

/// Small deterministic generator for the random-input tests (no seed
/// management, no extra dependency; quality is irrelevant here).
pub(crate) struct XorShift(u64);

impl XorShift {
    pub(crate) fn new(seed: u64) -> Self {
        XorShift(seed | 1)
    }

    #[allow(clippy::should_implement_trait)]
    pub(crate) fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}
