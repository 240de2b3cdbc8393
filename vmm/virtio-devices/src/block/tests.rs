//! virtio-blk through the whole stack: register bring-up, descriptor chains
//! written into guest memory, notification, used ring, disk contents.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_blk::*;
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
use virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use vm_memory::{Bytes, GuestAddress};

use super::*;
use crate::fuzz::MemDisk;
use crate::testing::{Desc, GuestDriver, MEM_SIZE, MmioDriver, XorShift, test_memory};

const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x11_0000;
const STATUS: u64 = 0x1f_f000;
/// Status byte value the tests pre-fill to see whether the device wrote it.
const UNTOUCHED: u8 = 0xee;
const DISK_SIZE: usize = 64 * 1024;
const DISK_SECTORS: u64 = DISK_SIZE as u64 / 512;

/// A MemDisk the test can inspect while the device owns it.
#[derive(Clone)]
struct SharedDisk(Arc<Mutex<MemDisk>>);

impl DiskBackend for SharedDisk {
    fn size(&self) -> u64 {
        self.0.lock().unwrap().size()
    }
    fn read_only(&self) -> bool {
        self.0.lock().unwrap().read_only()
    }
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> ::block::DiskResult<()> {
        self.0.lock().unwrap().read_at(buf, offset)
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> ::block::DiskResult<()> {
        self.0.lock().unwrap().write_at(buf, offset)
    }
    fn flush(&mut self) -> ::block::DiskResult<()> {
        self.0.lock().unwrap().flush()
    }
    fn discard(&mut self, offset: u64, len: u64) -> ::block::DiskResult<()> {
        self.0.lock().unwrap().discard(offset, len)
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> ::block::DiskResult<()> {
        self.0.lock().unwrap().write_zeroes(offset, len, unmap)
    }
}

struct Harness<'a> {
    mem: &'a GuestMemoryMmap,
    mmio: MmioDriver,
    queue: GuestDriver<'a>,
    disk: Arc<Mutex<MemDisk>>,
    used_seen: u16,
}

impl<'a> Harness<'a> {
    fn new(mem: &'a GuestMemoryMmap, disk: MemDisk, options: BlockOptions) -> Self {
        let disk = Arc::new(Mutex::new(disk));
        let dev = Block::new(Box::new(SharedDisk(disk.clone())), options);
        Self::with_device(mem, dev, disk)
    }

    /// `disk` is what `disk_bytes` shows (the device's disk, or any).
    fn with_device(mem: &'a GuestMemoryMmap, dev: Block, disk: Arc<Mutex<MemDisk>>) -> Self {
        let mut mmio = MmioDriver::new(Box::new(dev), mem);
        let queue = GuestDriver::new(mem, 16);
        mmio.bring_up(0, &[&queue]);
        Harness {
            mem,
            mmio,
            queue,
            disk,
            used_seen: 0,
        }
    }

    fn writable(mem: &'a GuestMemoryMmap) -> Self {
        let mut disk = MemDisk::new(DISK_SIZE);
        for (i, b) in disk.bytes.iter_mut().enumerate() {
            *b = (i / 512).to_le_bytes()[0];
        }
        Self::new(mem, disk, BlockOptions::default())
    }

    fn header(&self, request_type: u32, sector: u64) {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&request_type.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        self.mem.write_slice(&h, GuestAddress(HDR)).unwrap();
    }

    /// Submits a chain, notifies, returns (status byte, used length).
    fn submit(&mut self, descs: &[Desc]) -> (u8, u32) {
        self.mem.write_obj(UNTOUCHED, GuestAddress(STATUS)).unwrap();
        let head = self.queue.add_chain(descs);
        self.mmio.notify(0);
        assert_eq!(
            self.queue.used_idx(),
            self.used_seen.wrapping_add(1),
            "the device must return every chain"
        );
        let (id, len) = self.queue.used_elem(self.used_seen);
        assert_eq!(id, u32::from(head));
        self.used_seen = self.used_seen.wrapping_add(1);
        (self.mem.read_obj(GuestAddress(STATUS)).unwrap(), len)
    }

    /// header | data... | 1-byte status.
    fn request(&mut self, request_type: u32, sector: u64, data: &[Desc]) -> (u8, u32) {
        self.header(request_type, sector);
        let mut descs = vec![Desc::read(HDR, 16)];
        descs.extend_from_slice(data);
        descs.push(Desc::write(STATUS, 1));
        self.submit(&descs)
    }

    /// Puts every request (type, sector, data descriptors) on the ring,
    /// notifies once, and returns each one's (status byte, used length).
    /// Request `i` has its header at `HDR + 16 i` and status at `STATUS + i`.
    fn submit_batch(&mut self, requests: &[(u32, u64, Vec<Desc>)]) -> Vec<(u8, u32)> {
        let mut heads = Vec::new();
        for (i, (request_type, sector, data)) in requests.iter().enumerate() {
            let hdr = HDR + 16 * i as u64;
            let status = STATUS + i as u64;
            let mut h = [0u8; 16];
            h[0..4].copy_from_slice(&request_type.to_le_bytes());
            h[8..16].copy_from_slice(&sector.to_le_bytes());
            self.mem.write_slice(&h, GuestAddress(hdr)).unwrap();
            self.mem.write_obj(UNTOUCHED, GuestAddress(status)).unwrap();
            let mut descs = vec![Desc::read(hdr, 16)];
            descs.extend_from_slice(data);
            descs.push(Desc::write(status, 1));
            heads.push(self.queue.add_chain(&descs));
        }
        self.mmio.notify(0);
        let n = u16::try_from(requests.len()).expect("a test queues few requests");
        assert_eq!(
            self.queue.used_idx(),
            self.used_seen.wrapping_add(n),
            "the device must return every chain of the batch"
        );
        let mut result = vec![(0u8, 0u32); requests.len()];
        for k in 0..n {
            let (id, len) = self.queue.used_elem(self.used_seen.wrapping_add(k));
            let i = heads.iter().position(|&h| u32::from(h) == id).unwrap();
            let status = self.mem.read_obj(GuestAddress(STATUS + i as u64)).unwrap();
            result[i] = (status, len);
        }
        self.used_seen = self.used_seen.wrapping_add(n);
        result
    }

    fn disk_bytes(&self, offset: usize, len: usize) -> Vec<u8> {
        self.disk.lock().unwrap().bytes[offset..offset + len].to_vec()
    }

    fn guest_bytes(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    fn fill_guest(&self, addr: u64, len: usize, byte: u8) {
        self.mem
            .write_slice(&vec![byte; len], GuestAddress(addr))
            .unwrap();
    }

    fn segments(&self, segs: &[(u64, u32, u32)]) -> u32 {
        let mut bytes = Vec::new();
        for (sector, n, flags) in segs {
            bytes.extend_from_slice(&sector.to_le_bytes());
            bytes.extend_from_slice(&n.to_le_bytes());
            bytes.extend_from_slice(&flags.to_le_bytes());
        }
        self.mem.write_slice(&bytes, GuestAddress(DATA)).unwrap();
        u32::try_from(bytes.len()).expect("test data is small")
    }
}

const OK: u8 = int_cast::u8_of_u32(VIRTIO_BLK_S_OK);
const IOERR: u8 = int_cast::u8_of_u32(VIRTIO_BLK_S_IOERR);
const UNSUPP: u8 = int_cast::u8_of_u32(VIRTIO_BLK_S_UNSUPP);

#[test]
fn features_follow_the_disk() {
    let rw = Block::new(Box::new(MemDisk::new(4096)), BlockOptions::default());
    let f = rw.features();
    for bit in [
        VIRTIO_F_VERSION_1,
        VIRTIO_BLK_F_FLUSH,
        VIRTIO_BLK_F_SEG_MAX,
        VIRTIO_BLK_F_BLK_SIZE,
        VIRTIO_BLK_F_DISCARD,
        VIRTIO_BLK_F_WRITE_ZEROES,
    ] {
        assert_ne!(f & feature_bit(bit), 0, "bit {bit}");
    }
    assert_eq!(f & feature_bit(VIRTIO_BLK_F_RO), 0);

    let mut ro_disk = MemDisk::new(4096);
    ro_disk.read_only = true;
    let ro = Block::new(Box::new(ro_disk), BlockOptions::default());
    let f = ro.features();
    assert_ne!(f & feature_bit(VIRTIO_BLK_F_RO), 0);
    assert_eq!(f & feature_bit(VIRTIO_BLK_F_DISCARD), 0);
    assert_eq!(f & feature_bit(VIRTIO_BLK_F_WRITE_ZEROES), 0);

    let plain = Block::new(
        Box::new(MemDisk::new(4096)),
        BlockOptions {
            discard: false,
            write_zeroes: false,
            ..Default::default()
        },
    );
    assert_eq!(plain.features() & feature_bit(VIRTIO_BLK_F_DISCARD), 0);

    // `discard=ignore`: write-zeroes stays, without the unmap permission.
    let mem = test_memory();
    let mut h = Harness::new(
        &mem,
        MemDisk::new(DISK_SIZE),
        BlockOptions {
            discard: false,
            ..Default::default()
        },
    );
    let f = h.mmio.device_features();
    assert_eq!(f & feature_bit(VIRTIO_BLK_F_DISCARD), 0);
    assert_ne!(f & feature_bit(VIRTIO_BLK_F_WRITE_ZEROES), 0);
    let mut may_unmap = [0u8; 1];
    h.mmio.read_config(56, &mut may_unmap);
    assert_eq!(may_unmap, [0], "write_zeroes_may_unmap");
    let mut h = Harness::writable(&mem);
    h.mmio.read_config(56, &mut may_unmap);
    assert_eq!(may_unmap, [1], "write_zeroes_may_unmap");
}

#[test]
fn config_space_reports_capacity_and_limits() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    let mut b8 = [0u8; 8];
    h.mmio.read_config(0, &mut b8);
    assert_eq!(u64::from_le_bytes(b8), DISK_SECTORS);
    let mut b4 = [0u8; 4];
    h.mmio.read_config(12, &mut b4);
    assert_eq!(u32::from_le_bytes(b4), 254, "seg_max");
    h.mmio.read_config(20, &mut b4);
    assert_eq!(u32::from_le_bytes(b4), 512, "blk_size");
    h.mmio.read_config(40, &mut b4);
    assert_eq!(u32::from_le_bytes(b4), MAX_SEGMENTS, "max_discard_seg");
    // Reads straddling the end and far past it.
    h.mmio.read_config(58, &mut b4);
    assert_eq!(b4, [0; 4]);
    h.mmio.read_config(0xe00, &mut b8);
    assert_eq!(b8, [0; 8]);
    // The config space is read-only: a write changes nothing.
    h.mmio.transport.write(0x100, &[0xff; 8]);
    h.mmio.read_config(0, &mut b8);
    assert_eq!(u64::from_le_bytes(b8), DISK_SECTORS);
}

#[test]
fn a_disk_whose_size_is_not_a_sector_multiple_rounds_down() {
    let b = Block::new(Box::new(MemDisk::new(1000)), BlockOptions::default());
    assert_eq!(b.capacity(), 1);
}

#[test]
fn write_then_read_back_across_several_buffers() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    let pattern: Vec<u8> = (0..1024u32).map(|i| (i * 7 + 3).to_le_bytes()[0]).collect();
    mem.write_slice(&pattern, GuestAddress(DATA)).unwrap();
    let (status, len) = h.request(
        VIRTIO_BLK_T_OUT,
        3,
        &[Desc::read(DATA, 512), Desc::read(DATA + 512, 512)],
    );
    assert_eq!((status, len), (OK, 1));
    assert_eq!(h.disk_bytes(3 * 512, 1024), pattern);
    assert_eq!(
        h.disk_bytes(2 * 512, 512),
        vec![2u8; 512],
        "neighbours untouched"
    );
    assert_eq!(h.disk_bytes(5 * 512, 512), vec![5u8; 512]);

    h.fill_guest(0x13_0000, 1024, 0);
    let (status, len) = h.request(
        VIRTIO_BLK_T_IN,
        3,
        &[Desc::write(0x13_0000, 256), Desc::write(0x13_0100, 768)],
    );
    assert_eq!((status, len), (OK, 1025));
    assert_eq!(h.guest_bytes(0x13_0000, 1024), pattern);
}

#[test]
fn large_requests_go_through_the_bounce_buffer_in_chunks() {
    let mem = test_memory();
    let mut disk = MemDisk::new(1 << 20);
    for (i, b) in disk.bytes.iter_mut().enumerate() {
        *b = u8::try_from(i % 251).expect("below 251");
    }
    let expected = disk.bytes[4096..4096 + 200 * 1024].to_vec();
    let mut h = Harness::new(&mem, disk, BlockOptions::default());
    let (status, len) = h.request(VIRTIO_BLK_T_IN, 8, &[Desc::write(0x20_0000, 200 * 1024)]);
    assert_eq!((status, len), (OK, 200 * 1024 + 1));
    assert_eq!(h.guest_bytes(0x20_0000, 200 * 1024), expected);
}

#[test]
fn flush_reaches_the_disk() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    assert_eq!(h.request(VIRTIO_BLK_T_FLUSH, 0, &[]), (OK, 1));
    assert_eq!(h.disk.lock().unwrap().flushes, 1);
}

#[test]
fn stopping_the_transport_flushes_the_disk_and_lets_go_of_it() {
    // The VM's end: the device's thread ends, the disk gets its last flush and is
    // dropped (an image closes), once, whatever the guest did not flush.
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.fill_guest(DATA, 512, 0x42);
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, 1, &[Desc::read(DATA, 512)]),
        (OK, 1)
    );
    assert_eq!(h.disk.lock().unwrap().flushes, 0);
    assert_eq!(Arc::strong_count(&h.disk), 2, "the device holds the disk");
    h.mmio.transport.stop();
    assert_eq!(h.disk.lock().unwrap().flushes, 1);
    assert_eq!(
        Arc::strong_count(&h.disk),
        1,
        "the device let go of the disk"
    );
    assert_eq!(h.disk_bytes(512, 512), vec![0x42; 512]);
    h.mmio.transport.stop();
    assert_eq!(h.disk.lock().unwrap().flushes, 1, "closed once");
}

#[test]
fn write_through_flushes_every_write_and_nothing_else() {
    let mem = test_memory();
    let options = BlockOptions {
        write_through: true,
        ..BlockOptions::default()
    };
    let mut h = Harness::new(&mem, MemDisk::new(DISK_SIZE), options);
    let flushes = |h: &Harness| h.disk.lock().unwrap().flushes;
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, 0, &[Desc::read(DATA, 512)]).0,
        OK
    );
    assert_eq!(flushes(&h), 1, "a write is flushed before it completes");
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 512)]).0,
        OK
    );
    assert_eq!(flushes(&h), 1, "a read is not");
    let n = h.segments(&[(1, 1, 0)]);
    assert_eq!(
        h.request(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[Desc::read(DATA, n)])
            .0,
        OK
    );
    assert_eq!(flushes(&h), 2, "write-zeroes is a write");
    // A refused write is not flushed.
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, DISK_SECTORS, &[Desc::read(DATA, 512)])
            .0,
        IOERR
    );
    assert_eq!(flushes(&h), 2);
}

#[test]
fn counters_count_what_succeeded_and_the_failures() {
    let mem = test_memory();
    let disk = Arc::new(Mutex::new(MemDisk::new(DISK_SIZE)));
    let dev = Block::new(Box::new(SharedDisk(disk.clone())), BlockOptions::default());
    let counters = dev.counters();
    let mut h = Harness::with_device(&mem, dev, disk);
    let fresh = BlockCounts {
        capacity: DISK_SIZE as u64,
        ..BlockCounts::default()
    };
    assert_eq!(counters.snapshot(), fresh);
    let ok = |r: (u8, u32)| assert_eq!(r.0, OK);
    ok(h.request(VIRTIO_BLK_T_OUT, 0, &[Desc::read(DATA, 1024)]));
    ok(h.request(
        VIRTIO_BLK_T_IN,
        0,
        &[Desc::write(DATA, 512), Desc::write(DATA + 4096, 1536)],
    ));
    ok(h.request(VIRTIO_BLK_T_FLUSH, 0, &[]));
    let n = h.segments(&[(1, 2, 0)]);
    ok(h.request(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[Desc::read(DATA, n)]));
    // Not counted: ID and discard requests.
    ok(h.request(VIRTIO_BLK_T_GET_ID, 0, &[Desc::write(DATA, 20)]));
    let n = h.segments(&[(4, 1, 0)]);
    ok(h.request(VIRTIO_BLK_T_DISCARD, 0, &[Desc::read(DATA, n)]));
    // Refused before it runs (past the end): not counted at all.
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, DISK_SECTORS, &[Desc::write(DATA, 512)])
            .0,
        IOERR
    );
    // Failed on the disk: an error, no read.
    h.disk.lock().unwrap().fail = Some(|| DiskError::Io(std::io::Error::other("bad sector")));
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 512)]).0,
        IOERR
    );
    let c = counters.snapshot();
    assert_eq!(
        (
            c.rd_reqs, c.rd_bytes, c.wr_reqs, c.wr_bytes, c.fl_reqs, c.errors
        ),
        (1, 2048, 2, 1024 + 1024, 1, 1),
        "{c:?}"
    );
    assert!(c.rd_total_ns > 0 && c.wr_total_ns > 0 && c.fl_total_ns > 0);
    assert_eq!(c.capacity, DISK_SIZE as u64);
}

#[test]
fn flush_with_data_is_refused() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    assert_eq!(
        h.request(VIRTIO_BLK_T_FLUSH, 0, &[Desc::read(DATA, 512)]).0,
        IOERR
    );
    assert_eq!(h.disk.lock().unwrap().flushes, 0);
}

#[test]
fn get_id_returns_the_serial() {
    let mem = test_memory();
    let mut disk = MemDisk::new(4096);
    disk.read_only = true;
    let mut h = Harness::new(
        &mem,
        disk,
        BlockOptions {
            serial: "disk-0".into(),
            ..Default::default()
        },
    );
    h.fill_guest(DATA, 20, 0xff);
    let (status, len) = h.request(VIRTIO_BLK_T_GET_ID, 0, &[Desc::write(DATA, 20)]);
    assert_eq!((status, len), (OK, 21));
    let mut expected = b"disk-0".to_vec();
    expected.resize(20, 0);
    assert_eq!(h.guest_bytes(DATA, 20), expected);
    // A short buffer gets a prefix, nothing past it.
    h.fill_guest(DATA, 20, 0xff);
    assert_eq!(
        h.request(VIRTIO_BLK_T_GET_ID, 0, &[Desc::write(DATA, 4)]),
        (OK, 5)
    );
    assert_eq!(h.guest_bytes(DATA, 5), b"disk\xff");
    // The device may not write into a read-only buffer.
    h.fill_guest(DATA, 20, 0xff);
    assert_eq!(
        h.request(VIRTIO_BLK_T_GET_ID, 0, &[Desc::read(DATA, 20)]).0,
        IOERR
    );
    assert_eq!(h.guest_bytes(DATA, 20), vec![0xff; 20]);
}

#[test]
fn a_read_past_the_end_fails_without_writing_guest_memory() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    for (sector, len) in [
        (DISK_SECTORS, 512),       // first sector past the end
        (DISK_SECTORS - 1, 1024),  // straddles the end
        (u64::MAX, 512),           // sector + n overflows
        (u64::MAX / 512 + 1, 512), // byte offset would overflow
        (1 << 60, 512),
    ] {
        h.fill_guest(DATA, len as usize, 0xaa);
        let (status, used) = h.request(VIRTIO_BLK_T_IN, sector, &[Desc::write(DATA, len)]);
        assert_eq!((status, used), (IOERR, 1), "sector {sector}");
        assert_eq!(h.guest_bytes(DATA, len as usize), vec![0xaa; len as usize]);
    }
    // The last sector itself is fine.
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, DISK_SECTORS - 1, &[Desc::write(DATA, 512)])
            .0,
        OK
    );
}

#[test]
fn a_write_past_the_end_changes_nothing() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    let before = h.disk_bytes(0, DISK_SIZE);
    h.fill_guest(DATA, 1024, 0x55);
    assert_eq!(
        h.request(
            VIRTIO_BLK_T_OUT,
            DISK_SECTORS - 1,
            &[Desc::read(DATA, 1024)]
        )
        .0,
        IOERR
    );
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, u64::MAX, &[Desc::read(DATA, 512)])
            .0,
        IOERR
    );
    assert_eq!(h.disk_bytes(0, DISK_SIZE), before);
}

#[test]
fn data_length_must_be_whole_sectors() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    let before = h.disk_bytes(0, DISK_SIZE);
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, 0, &[Desc::read(DATA, 511)]).0,
        IOERR
    );
    assert_eq!(
        h.request(
            VIRTIO_BLK_T_OUT,
            0,
            &[Desc::read(DATA, 512), Desc::read(DATA, 100)]
        )
        .0,
        IOERR
    );
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 700)]).0,
        IOERR
    );
    assert_eq!(h.disk_bytes(0, DISK_SIZE), before);
    // Odd buffer sizes are fine when the total is whole sectors.
    assert_eq!(
        h.request(
            VIRTIO_BLK_T_IN,
            0,
            &[Desc::write(DATA, 100), Desc::write(DATA + 100, 412)]
        )
        .0,
        OK
    );
}

#[test]
fn the_device_never_writes_into_a_read_only_buffer() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.fill_guest(DATA, 1024, 0x77);
    // IN with the data buffer not marked writable: refused, buffer intact.
    let (status, _) = h.request(VIRTIO_BLK_T_IN, 1, &[Desc::read(DATA, 512)]);
    assert_eq!(status, IOERR);
    // Mixed: a writable buffer then... not possible (readable after writable
    // is a chain error), so readable then writable data.
    let (status, _) = h.request(
        VIRTIO_BLK_T_IN,
        1,
        &[Desc::read(DATA, 512), Desc::write(DATA + 512, 512)],
    );
    assert_eq!(status, IOERR);
    assert_eq!(h.guest_bytes(DATA, 1024), vec![0x77; 1024]);
}

#[test]
fn write_data_must_be_device_readable() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    let before = h.disk_bytes(0, DISK_SIZE);
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, 0, &[Desc::write(DATA, 512)]).0,
        IOERR
    );
    assert_eq!(h.disk_bytes(0, DISK_SIZE), before);
}

#[test]
fn requests_without_data_are_refused() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    for t in [
        VIRTIO_BLK_T_IN,
        VIRTIO_BLK_T_OUT,
        VIRTIO_BLK_T_GET_ID,
        VIRTIO_BLK_T_DISCARD,
    ] {
        assert_eq!(h.request(t, 0, &[]).0, IOERR, "type {t}");
    }
}

#[test]
fn the_header_must_be_readable_and_16_bytes() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.header(VIRTIO_BLK_T_IN, 0);
    let status = Desc::write(STATUS, 1);
    assert_eq!(
        h.submit(&[Desc::read(HDR, 8), Desc::write(DATA, 512), status])
            .0,
        IOERR
    );
    assert_eq!(
        h.submit(&[Desc::write(HDR, 16), Desc::write(DATA, 512), status])
            .0,
        IOERR
    );
    // Only a status: no header at all.
    assert_eq!(h.submit(&[status]), (IOERR, 1));
    // A longer header descriptor is fine (the extra bytes are ignored).
    assert_eq!(
        h.submit(&[Desc::read(HDR, 32), Desc::write(DATA, 512), status])
            .0,
        OK
    );
}

#[test]
fn the_status_must_be_one_writable_byte() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.header(VIRTIO_BLK_T_FLUSH, 0);
    // Not writable: the device has nowhere to report; used length 0.
    assert_eq!(
        h.submit(&[Desc::read(HDR, 16), Desc::read(STATUS, 1)]),
        (UNTOUCHED, 0)
    );
    assert_eq!(h.disk.lock().unwrap().flushes, 0);
    // Two bytes: refused, the error goes in the last byte.
    mem.write_obj(UNTOUCHED, GuestAddress(STATUS + 1)).unwrap();
    let (first, len) = h.submit(&[Desc::read(HDR, 16), Desc::write(STATUS, 2)]);
    assert_eq!((first, len), (UNTOUCHED, 1));
    assert_eq!(mem.read_obj::<u8>(GuestAddress(STATUS + 1)).unwrap(), IOERR);
    assert_eq!(h.disk.lock().unwrap().flushes, 0);
}

#[test]
fn unknown_request_types_are_unsupported() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    for t in [
        VIRTIO_BLK_T_SCSI_CMD,
        3,
        VIRTIO_BLK_T_SECURE_ERASE,
        VIRTIO_BLK_T_ZONE_APPEND,
        0xdead_beef,
    ] {
        assert_eq!(
            h.request(t, 0, &[Desc::read(DATA, 512)]).0,
            UNSUPP,
            "type {t}"
        );
    }
}

#[test]
fn a_read_only_disk_refuses_writes_and_keeps_its_bytes() {
    let mem = test_memory();
    let mut disk = MemDisk::new(DISK_SIZE);
    disk.bytes.fill(9);
    disk.read_only = true;
    let mut h = Harness::new(&mem, disk, BlockOptions::default());
    h.fill_guest(DATA, 512, 1);
    assert_eq!(
        h.request(VIRTIO_BLK_T_OUT, 0, &[Desc::read(DATA, 512)]).0,
        IOERR
    );
    // Discard and write-zeroes are not offered on a read-only disk.
    let n = h.segments(&[(0, 1, 0)]);
    assert_eq!(
        h.request(VIRTIO_BLK_T_DISCARD, 0, &[Desc::read(DATA, n)]).0,
        UNSUPP
    );
    assert_eq!(
        h.request(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[Desc::read(DATA, n)])
            .0,
        UNSUPP
    );
    assert_eq!(h.disk_bytes(0, DISK_SIZE), vec![9; DISK_SIZE]);
    // Reads still work.
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 512)]).0,
        OK
    );
    assert_eq!(h.guest_bytes(DATA, 512), vec![9; 512]);
}

#[test]
fn discard_and_write_zeroes_segments() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    let n = h.segments(&[(2, 3, 0), (10, 1, 0)]);
    assert_eq!(
        h.request(VIRTIO_BLK_T_DISCARD, 0, &[Desc::read(DATA, n)]),
        (OK, 1)
    );
    assert_eq!(
        h.disk.lock().unwrap().discards,
        vec![(1024, 1536), (5120, 512)]
    );

    let n = h.segments(&[(4, 2, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP)]);
    assert_eq!(
        h.request(VIRTIO_BLK_T_WRITE_ZEROES, 0, &[Desc::read(DATA, n)])
            .0,
        OK
    );
    assert_eq!(h.disk.lock().unwrap().zeroed, vec![(2048, 1024, true)]);
    assert_eq!(h.disk_bytes(2048, 1024), vec![0; 1024]);
    assert_eq!(h.disk_bytes(3072, 512), vec![6; 512]);
}

#[test]
fn bad_segments_are_refused() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    type Case = (u32, Vec<(u64, u32, u32)>, u8);
    let cases: Vec<Case> = vec![
        // The unmap flag is only for write-zeroes.
        (
            VIRTIO_BLK_T_DISCARD,
            vec![(0, 1, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP)],
            UNSUPP,
        ),
        // Reserved flag bits.
        (VIRTIO_BLK_T_WRITE_ZEROES, vec![(0, 1, 2)], UNSUPP),
        // Out of range and overflowing.
        (VIRTIO_BLK_T_DISCARD, vec![(DISK_SECTORS, 1, 0)], IOERR),
        (VIRTIO_BLK_T_WRITE_ZEROES, vec![(u64::MAX, 2, 0)], IOERR),
        (
            VIRTIO_BLK_T_DISCARD,
            vec![(0, MAX_SEGMENT_SECTORS + 1, 0)],
            IOERR,
        ),
        // Too many segments.
        (
            VIRTIO_BLK_T_DISCARD,
            vec![(0, 1, 0); MAX_SEGMENTS as usize + 1],
            IOERR,
        ),
    ];
    for (t, segs, expected) in cases {
        let n = h.segments(&segs);
        assert_eq!(
            h.request(t, 0, &[Desc::read(DATA, n)]).0,
            expected,
            "{t} {segs:?}"
        );
    }
    // Length not a multiple of 16.
    assert_eq!(
        h.request(VIRTIO_BLK_T_DISCARD, 0, &[Desc::read(DATA, 20)])
            .0,
        IOERR
    );
    assert!(h.disk.lock().unwrap().discards.is_empty());
    assert!(h.disk.lock().unwrap().zeroed.is_empty());
}

#[test]
fn backend_errors_map_to_statuses() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.disk.lock().unwrap().fail = Some(|| DiskError::Io(std::io::Error::other("disk gone")));
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 512)]).0,
        IOERR
    );
    assert_eq!(h.request(VIRTIO_BLK_T_FLUSH, 0, &[]).0, IOERR);
    h.disk.lock().unwrap().fail = Some(|| DiskError::Unsupported("discard"));
    let n = h.segments(&[(0, 1, 0)]);
    assert_eq!(
        h.request(VIRTIO_BLK_T_DISCARD, 0, &[Desc::read(DATA, n)]).0,
        UNSUPP
    );
}

/// A guest repeating a request the disk fails (every write on a full host
/// disk): the first failures are logged, then nothing until the interval is
/// over, not one line per request.
#[test]
fn failed_requests_are_logged_at_a_bounded_rate() {
    let capture = crate::LogCapture::global();
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.disk.lock().unwrap().fail = Some(|| DiskError::Io(std::io::Error::other("log-limit probe")));
    for _ in 0..1000 {
        assert_eq!(
            h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 512)]).0,
            IOERR
        );
    }
    let lines = capture.lines_with("log-limit probe");
    assert_eq!(
        u32::try_from(lines.len()),
        Ok(crate::LOG_BURST),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .all(|l| l.contains("WARN") && l.contains("disk request failed")),
        "{lines:#?}"
    );
}

/// A guest that breaks its queue, resets the device and does it again, in a
/// loop: each time the device stops and asks for a reset, and the log gets
/// the first of these, not one line per round.
#[test]
fn a_guest_breaking_its_queue_in_a_loop_gets_a_bounded_log() {
    let capture = crate::LogCapture::global();
    let mem = test_memory();
    let disk = Arc::new(Mutex::new(MemDisk::new(DISK_SIZE)));
    let dev = Block::new(Box::new(SharedDisk(disk)), BlockOptions::default());
    let mut mmio = MmioDriver::named("virtio-blk-logloop", Box::new(dev), &mem);
    for _ in 0..300 {
        let mut queue = GuestDriver::new(&mem, 16);
        mmio.bring_up(0, &[&queue]);
        queue.set_avail_idx(100);
        mmio.notify(0);
        assert_ne!(mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    }
    let lines = capture.lines_with("[virtio-blk-logloop] WARN");
    assert_eq!(
        u32::try_from(lines.len()),
        Ok(crate::LOG_BURST),
        "{lines:#?}"
    );
    assert!(lines.iter().all(|l| l.contains("failed")), "{lines:#?}");
}

#[test]
fn bad_chains_are_returned_and_the_queue_keeps_working() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.header(VIRTIO_BLK_T_IN, 0);
    let bad_chains: Vec<Vec<Desc>> = vec![
        // Data buffer past the end of guest memory (CVE-2019-18960 class).
        vec![
            Desc::read(HDR, 16),
            Desc::write(MEM_SIZE - 256, 512),
            Desc::write(STATUS, 1),
        ],
        // Huge length.
        vec![
            Desc::read(HDR, 16),
            Desc::write(DATA, u32::MAX),
            Desc::write(STATUS, 1),
        ],
        // Address that wraps.
        vec![
            Desc::read(HDR, 16),
            Desc::write(u64::MAX - 100, 512),
            Desc::write(STATUS, 1),
        ],
        // Header outside memory.
        vec![
            Desc::read(MEM_SIZE, 16),
            Desc::write(DATA, 512),
            Desc::write(STATUS, 1),
        ],
        // Zero-length data.
        vec![
            Desc::read(HDR, 16),
            Desc::write(DATA, 0),
            Desc::write(STATUS, 1),
        ],
        // Status outside memory.
        vec![
            Desc::read(HDR, 16),
            Desc::write(DATA, 512),
            Desc::write(MEM_SIZE + 1, 1),
        ],
    ];
    for chain in bad_chains {
        h.fill_guest(DATA, 512, 0x33);
        assert_eq!(h.submit(&chain), (UNTOUCHED, 0), "{chain:?}");
        assert_eq!(h.guest_bytes(DATA, 512), vec![0x33; 512]);
    }
    // A loop: 0 -> 1 -> 0.
    let base = h.queue.used_idx();
    h.queue.set_desc(0, HDR, 16, crate::chain::DESC_F_NEXT, 1);
    h.queue.set_desc(1, DATA, 512, crate::chain::DESC_F_NEXT, 0);
    h.queue.publish(0);
    h.mmio.notify(0);
    assert_eq!(h.queue.used_idx(), base.wrapping_add(1));
    assert_eq!(h.queue.used_elem(base).1, 0);
    h.used_seen = h.used_seen.wrapping_add(1);
    // Still healthy.
    assert_eq!(h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 0, &[Desc::write(DATA, 512)]).0,
        OK
    );
}

#[test]
fn requests_through_an_indirect_table() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.header(VIRTIO_BLK_T_IN, 7);
    let table = 0x18_0000;
    h.queue.write_indirect_table(
        table,
        &[
            Desc::read(HDR, 16).with_next(1),
            Desc::write(DATA, 512).with_next(2),
            Desc::write(STATUS, 1),
        ],
    );
    mem.write_obj(UNTOUCHED, GuestAddress(STATUS)).unwrap();
    h.queue
        .set_desc(0, table, 48, crate::chain::DESC_F_INDIRECT, 0);
    h.queue.publish(0);
    h.mmio.notify(0);
    assert_eq!(h.queue.used_elem(0), (0, 513));
    assert_eq!(mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(), OK);
    assert_eq!(h.guest_bytes(DATA, 512), vec![7; 512]);
}

#[test]
fn interrupts_are_raised_per_batch_and_suppressed_on_request() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    assert_eq!(h.request(VIRTIO_BLK_T_FLUSH, 0, &[]).0, OK);
    assert_eq!(h.mmio.interrupts(), 1);
    // Two requests, one notification: one interrupt.
    h.header(VIRTIO_BLK_T_FLUSH, 0);
    h.queue
        .add_chain(&[Desc::read(HDR, 16), Desc::write(STATUS, 1)]);
    h.queue
        .add_chain(&[Desc::read(HDR, 16), Desc::write(STATUS + 1, 1)]);
    h.mmio.notify(0);
    assert_eq!(h.queue.used_idx(), 3);
    assert_eq!(h.mmio.interrupts(), 2);
    // A polling guest asks for no interrupts and still sees the used ring.
    h.used_seen = 3;
    h.queue
        .set_avail_flags(const { int_cast::u16_of_u32(VRING_AVAIL_F_NO_INTERRUPT) });
    assert_eq!(h.request(VIRTIO_BLK_T_FLUSH, 0, &[]).0, OK);
    assert_eq!(h.mmio.interrupts(), 2);
}

#[test]
fn a_lying_available_index_puts_the_device_in_needs_reset() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.queue.set_avail_idx(100);
    h.mmio.notify(0);
    assert_ne!(h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    assert_eq!(h.queue.used_idx(), 0);
}

#[test]
fn a_head_index_past_the_table_puts_the_device_in_needs_reset() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.queue.publish(16);
    h.mmio.notify(0);
    assert_ne!(h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
}

#[test]
fn the_device_works_again_after_a_reset() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.queue.set_avail_idx(100);
    h.mmio.notify(0);
    assert_ne!(h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    h.queue = GuestDriver::new(&mem, 16);
    let q = GuestDriver::new(&mem, 16);
    h.mmio.bring_up(0, &[&q]);
    h.used_seen = 0;
    assert_eq!(
        h.request(VIRTIO_BLK_T_IN, 1, &[Desc::write(DATA, 512)]).0,
        OK
    );
}

/// Random chains and headers against the full device. Whatever happens, no
/// panic, every chain is returned or the device asks for a reset, and the
/// disk only changes through requests the device accepted: a chain returned
/// with nothing written (used length 0, refused as a whole) or left on the
/// ring when the device asked for a reset changed no byte of it.
#[test]
fn random_requests_never_panic() {
    let mem = test_memory();
    let mut rng = XorShift::new(42);
    for _ in 0..300 {
        let mut h = Harness::writable(&mem);
        for _ in 0..16 {
            let n = 1 + rng.next() % 5;
            let mut descs = Vec::new();
            for _ in 0..n {
                let addr = match rng.next() % 6 {
                    0 => rng.next(),
                    1 => MEM_SIZE - rng.next() % 1024,
                    _ => 0x10_0000 + (rng.next() % 0x10_0000),
                };
                let len = match rng.next() % 5 {
                    0 => int_cast::low_half(rng.next()),
                    1 => 0,
                    2 => 16,
                    3 => 1,
                    _ => 512 * (1 + int_cast::low_half(rng.next()) % 4),
                };
                let mut d = if rng.next().is_multiple_of(2) {
                    Desc::read(addr, len)
                } else {
                    Desc::write(addr, len)
                };
                if rng.next().is_multiple_of(16) {
                    d.flags |= (rng.next() % 8) as u16;
                }
                descs.push(d);
            }
            // Half the chains are shaped as requests (header, data, status), so that
            // many are accepted and some change the disk.
            let shaped = rng.next().is_multiple_of(2);
            if shaped {
                descs = shaped_request(&mut rng);
            }
            let types = [0, 1, 4, 8, 11, 13, int_cast::low_half(rng.next())];
            let request_type = types[(rng.next() % 7) as usize];
            h.header(request_type, rng.next() % (DISK_SECTORS + 4));
            let before = h.disk_bytes(0, DISK_SIZE);
            h.mem.write_obj(UNTOUCHED, GuestAddress(STATUS)).unwrap();
            let head = h.queue.add_chain(&descs);
            h.mmio.notify(0);
            if h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET != 0 {
                assert_eq!(h.disk_bytes(0, DISK_SIZE), before, "{descs:?}");
                break;
            }
            assert_eq!(
                h.queue.used_idx(),
                h.used_seen.wrapping_add(1),
                "the device must return every chain: {descs:?}"
            );
            let (id, len) = h.queue.used_elem(h.used_seen);
            h.used_seen = h.used_seen.wrapping_add(1);
            assert_eq!(id, u32::from(head), "{descs:?}");
            if len == 0 {
                assert_eq!(h.disk_bytes(0, DISK_SIZE), before, "{descs:?}");
            }
            if shaped && h.disk_bytes(0, DISK_SIZE) != before {
                let status: u8 = h.mem.read_obj(GuestAddress(STATUS)).unwrap();
                assert!(
                    status == OK
                        && [
                            VIRTIO_BLK_T_OUT,
                            VIRTIO_BLK_T_DISCARD,
                            VIRTIO_BLK_T_WRITE_ZEROES
                        ]
                        .contains(&request_type),
                    "type {request_type}, status {status}: {descs:?}"
                );
            }
        }
    }
}

/// A chain shaped as a request: the 16-byte header, one to three data buffers in the data
/// area (whole sectors or not, either direction), the status byte; now and then a flag
/// bit set at random.
fn shaped_request(rng: &mut XorShift) -> Vec<Desc> {
    let mut descs = vec![Desc::read(HDR, 16)];
    let mut addr = DATA;
    for _ in 0..=rng.next() % 3 {
        let len = match rng.next() % 4 {
            0 => 16 * (1 + u32::from(rng.next().to_le_bytes()[0] % 4)),
            1 => 1 + u32::from(rng.next().to_le_bytes()[0]),
            _ => 512 * (1 + u32::from(rng.next().to_le_bytes()[0] % 8)),
        };
        descs.push(if rng.next().is_multiple_of(2) {
            Desc::read(addr, len)
        } else {
            Desc::write(addr, len)
        });
        addr += u64::from(len);
    }
    descs.push(Desc::write(STATUS, 1));
    if rng.next().is_multiple_of(8) {
        let i = (rng.next() % 5) as usize % descs.len();
        descs[i].flags |= (rng.next() % 8) as u16;
    }
    descs
}

#[test]
fn fuzz_entry_points_survive_random_bytes() {
    let mut rng = XorShift::new(7);
    for _ in 0..200 {
        let len = (rng.next() % 0x3000) as usize;
        let mut data: Vec<u8> = (0..len).map(|_| rng.next().to_le_bytes()[0]).collect();
        crate::fuzz::blk_queue(&data);
        // Bias towards structure: a small queue index and plausible chains.
        if data.len() > 0x1004 {
            data[0x1002] = 1;
            data[0x1003] = 0;
            data[0x1004] = 0;
            data[0x1005] = 0;
            crate::fuzz::blk_queue(&data);
        }
        crate::fuzz::mmio_registers(&data);
    }
}

/// A disk that records when each operation starts and ends, and whose
/// reads can wait until a number of them are inside at once.
struct ProbeDisk {
    bytes: Mutex<Vec<u8>>,
    events: Mutex<Vec<String>>,
    /// Reads wait (up to `patience`) until this many are in progress.
    rendezvous: usize,
    patience: Duration,
    arrivals: Mutex<usize>,
    arrived: std::sync::Condvar,
    /// Where each read's buffer starts.
    read_buffers: Mutex<Vec<usize>>,
    /// The thread each write ran on.
    write_threads: Mutex<Vec<String>>,
}

impl ProbeDisk {
    fn new(rendezvous: usize, patience: Duration) -> ProbeDisk {
        ProbeDisk {
            patience,
            bytes: Mutex::new(vec![0; DISK_SIZE]),
            events: Mutex::new(Vec::new()),
            rendezvous,
            arrivals: Mutex::new(0),
            arrived: std::sync::Condvar::new(),
            read_buffers: Mutex::new(Vec::new()),
            write_threads: Mutex::new(Vec::new()),
        }
    }

    fn has(&self, event: &str) -> bool {
        self.events.lock().unwrap().iter().any(|e| e == event)
    }

    fn wait_for(&self, event: &str) {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !self.has(event) {
            assert!(std::time::Instant::now() < deadline, "no {event:?}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn log(&self, event: String) {
        self.events.lock().unwrap().push(event);
    }

    fn position(&self, event: &str) -> usize {
        let events = self.events.lock().unwrap();
        events
            .iter()
            .position(|e| e == event)
            .unwrap_or_else(|| panic!("no event {event:?} in {events:?}"))
    }
}

impl ::block::SharedDisk for ProbeDisk {
    fn size(&self) -> u64 {
        DISK_SIZE as u64
    }
    fn read_only(&self) -> bool {
        false
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> ::block::DiskResult<()> {
        self.log(format!("read {offset} start"));
        self.read_buffers
            .lock()
            .unwrap()
            .push(buf.as_ptr() as usize);
        // Reads meet in groups of `rendezvous`: each waits for the rest of
        // its group to arrive.
        let mut arrivals = self.arrivals.lock().unwrap();
        *arrivals += 1;
        let group_end = arrivals.div_ceil(self.rendezvous.max(1)) * self.rendezvous;
        self.arrived.notify_all();
        let (arrivals, timeout) = self
            .arrived
            .wait_timeout_while(arrivals, self.patience, |n| *n < group_end)
            .unwrap();
        drop(arrivals);
        if timeout.timed_out() {
            return Err(DiskError::Io(std::io::Error::other(
                "reads did not overlap",
            )));
        }
        let start = int_cast::u64_to_usize(offset);
        buf.copy_from_slice(&self.bytes.lock().unwrap()[start..start + buf.len()]);
        self.log(format!("read {offset} end"));
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> ::block::DiskResult<()> {
        self.write_threads
            .lock()
            .unwrap()
            .push(std::thread::current().name().unwrap_or("?").to_string());
        self.log(format!("write {offset} start"));
        // Long enough for a request run out of turn to start meanwhile.
        std::thread::sleep(Duration::from_millis(20));
        let start = int_cast::u64_to_usize(offset);
        self.bytes.lock().unwrap()[start..start + buf.len()].copy_from_slice(buf);
        self.log(format!("write {offset} end"));
        Ok(())
    }
    fn flush(&self) -> ::block::DiskResult<()> {
        self.log("flush start".into());
        std::thread::sleep(Duration::from_millis(20));
        self.log("flush end".into());
        Ok(())
    }
    fn discard(&self, _: u64, _: u64) -> ::block::DiskResult<()> {
        Ok(())
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> ::block::DiskResult<()> {
        Ok(())
    }
}

fn probe_harness(mem: &GuestMemoryMmap, disk: Arc<ProbeDisk>, io_threads: usize) -> Harness<'_> {
    let options = BlockOptions {
        io_threads,
        ..BlockOptions::default()
    };
    let dev = Block::shared(disk, options);
    Harness::with_device(mem, dev, Arc::new(Mutex::new(MemDisk::new(DISK_SIZE))))
}

fn four_reads() -> Vec<(u32, u64, Vec<Desc>)> {
    (0..4u64)
        .map(|i| {
            (
                VIRTIO_BLK_T_IN,
                i * 8,
                vec![Desc::write(DATA + i * 4096, 4096)],
            )
        })
        .collect()
}

#[test]
fn the_requests_of_one_notification_are_on_the_disk_at_once() {
    let mem = test_memory();
    // Each read waits until all four are in progress: only concurrent
    // execution lets them finish.
    // Generous: a loaded CI machine may be slow to run the threads.
    let mut h = probe_harness(
        &mem,
        Arc::new(ProbeDisk::new(4, Duration::from_secs(20))),
        4,
    );
    assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
    // Again, on the same threads.
    assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
}

#[test]
fn concurrent_requests_get_their_own_bounce_buffers_on_one_huge_page() {
    let mem = test_memory();
    let disk = Arc::new(ProbeDisk::new(4, Duration::from_secs(20)));
    let mut h = probe_harness(&mem, disk.clone(), 4);
    assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
    let first: std::collections::BTreeSet<usize> =
        disk.read_buffers.lock().unwrap().drain(..).collect();
    // Four requests at once, four buffers: none shared between threads.
    assert_eq!(first.len(), 4, "{first:x?}");
    // Cut from one mapping that starts on a huge page and fits in it.
    let lowest = *first.first().unwrap();
    assert_eq!(lowest % ::block::HUGE_PAGE, 0, "{first:x?}");
    assert!(first.iter().all(|a| a - lowest < ::block::HUGE_PAGE));
    // The threads keep their buffers from batch to batch.
    assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
    let second: std::collections::BTreeSet<usize> =
        disk.read_buffers.lock().unwrap().drain(..).collect();
    assert_eq!(first, second);
}

/// `AnonHugePages` (kB) of the /proc/self/smaps entry that holds `addr`.
fn anon_huge_kib(addr: usize) -> u64 {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let mut inside = false;
    for line in smaps.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((lo, hi)) = range.split_once('-')
            && let (Ok(lo), Ok(hi)) = (usize::from_str_radix(lo, 16), usize::from_str_radix(hi, 16))
        {
            inside = (lo..hi).contains(&addr);
        } else if inside && let Some(kib) = line.strip_prefix("AnonHugePages:") {
            return kib.trim().trim_end_matches(" kB").parse().unwrap();
        }
    }
    panic!("no mapping holds {addr:#x}");
}

#[test]
fn bounce_buffers_move_to_a_huge_page_once_the_guest_keeps_requests_in_flight() {
    let mem = test_memory();
    let disk = Arc::new(ProbeDisk::new(0, Duration::ZERO));
    let mut h = probe_harness(&mem, disk.clone(), 4);
    // Lone requests and a few batches: the buffers stay on small pages.
    for _ in 0..3 {
        assert_eq!(h.submit_batch(&four_reads()[..1]), vec![(OK, 4097)]);
    }
    for _ in 1..HUGE_PAGE_AFTER_BATCHES {
        assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
    }
    let mapping = *disk.read_buffers.lock().unwrap().iter().min().unwrap();
    assert_eq!(mapping % ::block::HUGE_PAGE, 0);
    assert_eq!(anon_huge_kib(mapping), 0, "huge page before the threshold");
    // The batch that reaches the threshold moves them (the host here has
    // transparent huge pages in `madvise` mode).
    assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
    // At least ours: once advised, the kernel may merge the mapping with a
    // neighbouring huge one (another test's) into one smaps entry.
    assert!(
        anon_huge_kib(mapping) >= 2048,
        "{} kB",
        anon_huge_kib(mapping)
    );
    // Requests still land in the guest as before.
    assert_eq!(h.submit_batch(&four_reads()), vec![(OK, 4097); 4]);
}

#[test]
fn without_io_threads_requests_run_one_after_the_other() {
    // The converse of the test above: the probe sees no overlap.
    let mem = test_memory();
    let mut h = probe_harness(
        &mem,
        Arc::new(ProbeDisk::new(2, Duration::from_millis(300))),
        0,
    );
    // The first read waits in vain for the second, which only starts after.
    let got = h.submit_batch(&four_reads()[..2]);
    assert_eq!(got, vec![(IOERR, 1), (OK, 4097)]);
}

#[test]
fn a_flush_waits_for_the_requests_before_it_and_holds_back_the_ones_after() {
    let mem = test_memory();
    let disk = Arc::new(ProbeDisk::new(0, Duration::ZERO));
    let mut h = probe_harness(&mem, disk.clone(), 4);
    h.fill_guest(DATA, 512, 0x11);
    h.fill_guest(DATA + 4096, 512, 0x22);
    h.fill_guest(DATA + 8192, 512, 0x33);
    let got = h.submit_batch(&[
        (VIRTIO_BLK_T_OUT, 0, vec![Desc::read(DATA, 512)]),
        (VIRTIO_BLK_T_OUT, 8, vec![Desc::read(DATA + 4096, 512)]),
        (VIRTIO_BLK_T_FLUSH, 0, vec![]),
        (VIRTIO_BLK_T_OUT, 16, vec![Desc::read(DATA + 8192, 512)]),
        (VIRTIO_BLK_T_IN, 0, vec![Desc::write(DATA + 12288, 512)]),
    ]);
    assert_eq!(got, vec![(OK, 1), (OK, 1), (OK, 1), (OK, 1), (OK, 513)]);
    let flush_start = disk.position("flush start");
    let flush_end = disk.position("flush end");
    assert!(disk.position("write 0 end") < flush_start);
    assert!(disk.position("write 4096 end") < flush_start);
    assert!(disk.position("write 8192 start") > flush_end);
    assert!(disk.position("read 0 start") > flush_end);
    // The read after the flush sees the write before it.
    assert_eq!(h.guest_bytes(DATA + 12288, 512), vec![0x11; 512]);
}

#[test]
fn a_batch_answers_every_request_in_its_own_chain() {
    let mem = test_memory();
    let mut h = Harness::writable(&mem);
    h.fill_guest(DATA + 4096, 512, 0x5a);
    let got = h.submit_batch(&[
        (VIRTIO_BLK_T_IN, 3, vec![Desc::write(DATA, 1024)]),
        // Unknown request type: refused before it runs.
        (0xff, 0, vec![Desc::read(DATA + 2048, 512)]),
        (VIRTIO_BLK_T_OUT, 9, vec![Desc::read(DATA + 4096, 512)]),
        // Past the end of the disk.
        (
            VIRTIO_BLK_T_IN,
            DISK_SECTORS,
            vec![Desc::write(DATA + 8192, 512)],
        ),
        (VIRTIO_BLK_T_GET_ID, 0, vec![Desc::write(DATA + 12288, 20)]),
    ]);
    assert_eq!(got[0], (OK, 1025));
    assert_eq!(got[1].0, UNSUPP);
    assert_eq!(got[2], (OK, 1));
    assert_eq!(got[3].0, IOERR);
    assert_eq!(got[4].0, OK);
    let mut expect = vec![3u8; 512];
    expect.extend(vec![4u8; 512]);
    assert_eq!(h.guest_bytes(DATA, 1024), expect);
    assert_eq!(h.disk_bytes(9 * 512, 512), vec![0x5a; 512]);
}

impl Harness<'_> {
    /// Puts a one-sector write at `sector` on the ring without notifying.
    fn queue_write(&mut self, sector: u64) {
        self.header(VIRTIO_BLK_T_OUT, sector);
        self.mem.write_obj(UNTOUCHED, GuestAddress(STATUS)).unwrap();
        self.queue.add_chain(&[
            Desc::read(HDR, 16),
            Desc::read(DATA, 512),
            Desc::write(STATUS, 1),
        ]);
    }
}

#[test]
fn a_notification_through_the_queue_eventfd_runs_on_the_device_thread() {
    let mem = test_memory();
    let disk = Arc::new(ProbeDisk::new(1, Duration::from_secs(5)));
    let mut h = probe_harness(&mem, disk.clone(), 0);
    h.queue_write(0);
    // As KVM delivers it with an ioeventfd: no register access at all.
    h.mmio.kick(0);
    assert_eq!(h.queue.used_idx(), 1);
    assert_eq!(
        h.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        const { int_cast::u8_of_u32(VIRTIO_BLK_S_OK) }
    );
    assert_eq!(*disk.write_threads.lock().unwrap(), ["virtio-test"]);
}

#[test]
fn a_reset_never_finds_a_request_in_flight() {
    let mem = test_memory();
    let disk = Arc::new(ProbeDisk::new(1, Duration::from_secs(5)));
    let mut h = probe_harness(&mem, disk.clone(), 0);
    h.queue_write(0);
    h.mmio.notifiers[0].write(1).unwrap();
    // The write is on the disk (it takes 20 ms) when the driver resets.
    disk.wait_for("write 0 start");
    h.mmio.set_status(0);
    // The reset waited for it: done and answered, nothing after.
    assert!(
        disk.has("write 0 end"),
        "the reset found the write in flight"
    );
    assert_eq!(h.queue.used_idx(), 1);
    assert_eq!(
        h.mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
        const { int_cast::u8_of_u32(VIRTIO_BLK_S_OK) }
    );
}

#[test]
fn a_pause_waits_for_the_request_in_flight_and_holds_the_next_until_resume() {
    let mem = test_memory();
    let disk = Arc::new(ProbeDisk::new(1, Duration::from_secs(5)));
    let mut h = probe_harness(&mem, disk.clone(), 0);
    h.queue_write(0);
    h.mmio.notifiers[0].write(1).unwrap();
    disk.wait_for("write 0 start");
    h.mmio.transport.pause();
    assert!(
        disk.has("write 0 end"),
        "the pause found the write in flight"
    );
    assert_eq!(h.queue.used_idx(), 1);
    // Notified while paused: nothing touches guest memory or the disk.
    h.queue_write(8);
    h.mmio.kick(0);
    std::thread::sleep(Duration::from_millis(100));
    assert!(!disk.has("write 4096 start"));
    assert_eq!(h.queue.used_idx(), 1);
    h.mmio.transport.resume();
    disk.wait_for("write 4096 end");
    h.mmio.transport.sync();
    assert_eq!(h.queue.used_idx(), 2);
}
