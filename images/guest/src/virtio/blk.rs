//! virtio-blk checks: write, interrupt, flush, read back, bounds.

use crate::irq;
use crate::report::{Detail, Reporter};

use super::Name;
use super::queue::{Buf, Queue, buffers, fill, read8, write8, write32, write64};
use super::transport::Device;

/// Sector the check writes (byte offset 512 in the disk file).
pub const TEST_SECTOR: u64 = 1;
const SECTOR_SIZE: usize = 512;
/// First bytes of the pattern, so a host can spot it in a disk image.
pub const PATTERN_MAGIC: &[u8; 16] = b"virtio-blk-test\n";

pub(super) const T_IN: u32 = 0;
pub(super) const T_OUT: u32 = 1;
pub(super) const T_FLUSH: u32 = 4;
const T_GET_ID: u32 = 8;
/// VIRTIO_BLK_ID_BYTES.
const ID_BYTES: usize = 20;
const T_DISCARD: u32 = 11;
const T_WRITE_ZEROES: u32 = 13;
pub(super) const S_OK: u8 = 0;
const S_IOERR: u8 = 1;
/// VIRTIO_BLK_F_RO, _DISCARD, _WRITE_ZEROES.
const F_RO: u32 = 1 << 5;
const F_DISCARD: u32 = 1 << 13;
const F_WRITE_ZEROES: u32 = 1 << 14;
/// Sector the write-zeroes check clears (the host test expects zeroes).
pub const ZEROES_SECTOR: u64 = 2;
/// Sector the discard check discards (contents afterwards unspecified).
pub const DISCARD_SECTOR: u64 = 3;
/// Longest wait for a request (they complete during the notification).
const REQUEST_TIMEOUT_MS: u32 = 1000;
const IRQ_TIMEOUT_MS: u32 = 1000;

/// Byte `i` of the test sector; the host-side test computes the same.
pub fn pattern(i: usize) -> u8 {
    if i < PATTERN_MAGIC.len() {
        PATTERN_MAGIC[i]
    } else {
        (i as u8).wrapping_mul(31) ^ 0x5a
    }
}

pub(super) struct Blk {
    pub(super) dev: Device,
    pub(super) queue: Queue,
}

impl Blk {
    /// One request: header, optional data buffer, status. Returns the
    /// status byte, or None if the device never returned the chain.
    pub(super) fn request(&mut self, kind: u32, sector: u64, data: Option<Buf>) -> Option<u8> {
        self.raw_request(kind, sector, data, true)
            .map(|(status, _)| status)
    }

    /// Like `request`, with the status buffer's direction chosen by the
    /// caller; returns the status byte and the used length.
    fn raw_request(
        &mut self,
        kind: u32,
        sector: u64,
        data: Option<Buf>,
        status_writable: bool,
    ) -> Option<(u8, u32)> {
        let hdr = buffers();
        write32(hdr, kind);
        write32(hdr + 4, 0);
        write64(hdr + 8, sector);
        let status = hdr + 16;
        write8(status, 0xff);
        let header = Buf {
            addr: hdr,
            len: 16,
            writable: false,
        };
        let st = Buf {
            addr: status,
            len: 1,
            writable: status_writable,
        };
        match data {
            Some(d) => self.queue.add(&[header, d, st]),
            None => self.queue.add(&[header, st]),
        };
        self.dev.notify(0);
        let (_, used_len) = self.queue.wait_used(REQUEST_TIMEOUT_MS)?;
        Some((read8(status), used_len))
    }
}

fn status_detail(d: &mut Detail, status: Option<u8>) {
    match status {
        Some(s) => d.str("status=").dec(u64::from(s)),
        None => d.str("no completion"),
    };
}

pub fn check(dev: &Device, irq_pin: u32, index: usize, evil: bool, r: &mut dyn Reporter) {
    let queue = Queue::new(0);
    let features = match dev.initialize(F_RO | F_DISCARD | F_WRITE_ZEROES, &[&queue]) {
        Ok(f) => f,
        Err(e) => {
            r.result(Name::new("virtio-blk", index, "init").as_str(), false, e);
            dev.reset();
            return;
        }
    };
    let mut blk = Blk {
        dev: dev.clone(),
        queue,
    };
    let read_only = features & F_RO != 0;
    let capacity = u64::from(dev.config32(0)) | u64::from(dev.config32(4)) << 32;
    let routed = dev.route_interrupt(irq_pin);
    irq::take(irq_pin);

    let data = buffers() + SECTOR_SIZE as u64;
    for i in 0..SECTOR_SIZE {
        write8(data + i as u64, pattern(i));
    }
    let out = Buf {
        addr: data,
        len: SECTOR_SIZE as u32,
        writable: false,
    };
    let status = blk.request(T_OUT, TEST_SECTOR, Some(out));
    let mut d = Detail::new();
    d.str("sector=")
        .dec(TEST_SECTOR)
        .str(" capacity=")
        .dec(capacity)
        .str(" ");
    status_detail(&mut d, status);
    if read_only {
        r.result(
            Name::new("virtio-blk", index, "ro").as_str(),
            status == Some(S_IOERR),
            d.as_str(),
        );
    } else {
        r.result(
            Name::new("virtio-blk", index, "write").as_str(),
            status == Some(S_OK),
            d.as_str(),
        );
    }

    // The completion above raised the device interrupt (if routable).
    let mut d = Detail::new();
    let fired = routed && irq::wait(irq_pin, IRQ_TIMEOUT_MS);
    let int_status = dev.ack_interrupt();
    d.str("pin=")
        .dec(u64::from(irq_pin))
        .str(if routed { " fired=" } else { " unroutable" })
        .dec(u64::from(fired))
        .str(" isr=")
        .dec(u64::from(int_status));
    r.result(
        Name::new("virtio-blk", index, "irq").as_str(),
        fired && int_status & 1 != 0,
        d.as_str(),
    );

    let status = blk.request(T_FLUSH, 0, None);
    let mut d = Detail::new();
    status_detail(&mut d, status);
    r.result(
        Name::new("virtio-blk", index, "flush").as_str(),
        status == Some(S_OK),
        d.as_str(),
    );

    if features & F_WRITE_ZEROES != 0 {
        segment_request(&mut blk, T_WRITE_ZEROES, ZEROES_SECTOR, index, "zeroes", r);
    }
    if features & F_DISCARD != 0 {
        segment_request(&mut blk, T_DISCARD, DISCARD_SECTOR, index, "discard", r);
    }

    let back = buffers() + 2 * SECTOR_SIZE as u64;
    fill(back, SECTOR_SIZE, 0);
    let input = Buf {
        addr: back,
        len: SECTOR_SIZE as u32,
        writable: true,
    };
    let status = blk.request(T_IN, TEST_SECTOR, Some(input));
    let mut mismatch = None;
    if !read_only {
        for i in 0..SECTOR_SIZE {
            if read8(back + i as u64) != pattern(i) {
                mismatch = Some(i);
                break;
            }
        }
    }
    let mut d = Detail::new();
    status_detail(&mut d, status);
    if let Some(i) = mismatch {
        d.str(" mismatch at byte ").dec(i as u64);
    }
    r.result(
        Name::new("virtio-blk", index, "read").as_str(),
        status == Some(S_OK) && mismatch.is_none(),
        d.as_str(),
    );

    read_id(&mut blk, index, r);
    batch(&mut blk, read_only, index, r);

    // One sector at the capacity: just past the end.
    input_past_end(&mut blk, capacity, input, index, r);
    if evil {
        misbehave(&mut blk, input, index, r);
    }
    dev.reset();
}

/// Two reads of the test sector made available together and announced
/// with one notification (as a Linux guest does with a deep queue): the
/// device runs them concurrently and must answer both, each with the data.
fn batch(blk: &mut Blk, read_only: bool, index: usize, r: &mut dyn Reporter) {
    let area = buffers() + 8192;
    let mut statuses = [0u64; 2];
    for (n, status) in statuses.iter_mut().enumerate() {
        let hdr = area + 32 * n as u64;
        write32(hdr, T_IN);
        write32(hdr + 4, 0);
        write64(hdr + 8, TEST_SECTOR);
        *status = hdr + 16;
        write8(*status, 0xff);
        let data = area + 512 * (n as u64 + 1);
        fill(data, SECTOR_SIZE, 0);
        blk.queue.add(&[
            Buf {
                addr: hdr,
                len: 16,
                writable: false,
            },
            Buf {
                addr: data,
                len: SECTOR_SIZE as u32,
                writable: true,
            },
            Buf {
                addr: *status,
                len: 1,
                writable: true,
            },
        ]);
    }
    blk.dev.notify(0);
    let completed = (0..2)
        .filter(|_| blk.queue.wait_used(REQUEST_TIMEOUT_MS).is_some())
        .count();
    let mut ok = completed == 2;
    let mut d = Detail::new();
    d.str("completed=").dec(completed as u64);
    for (n, status) in statuses.iter().enumerate() {
        let s = read8(*status);
        d.str(" status=").dec(u64::from(s));
        ok &= s == S_OK;
        let data = area + 512 * (n as u64 + 1);
        if !read_only && (0..SECTOR_SIZE).any(|i| read8(data + i as u64) != pattern(i)) {
            d.str(" mismatch in read ").dec(n as u64);
            ok = false;
        }
    }
    r.result(
        Name::new("virtio-blk", index, "batch").as_str(),
        ok,
        d.as_str(),
    );
}

/// Guest misbehaviour the device must survive (`checks=virtio-evil`): a
/// buffer outside guest memory, a read-only status byte after a writable
/// data buffer, a queue register written after DRIVER_OK, a notification
/// for a queue that does not exist. Each bad request must come back
/// untouched, and the device must still serve a good request afterwards.
fn misbehave(blk: &mut Blk, input: Buf, index: usize, r: &mut dyn Reporter) {
    let mut d = Detail::new();
    let mut ok = true;
    // Far above any RAM the VMM gives us and inside no device window.
    let outside = Buf {
        addr: 0x7f_0000_0000,
        len: SECTOR_SIZE as u32,
        writable: true,
    };
    let res = blk.raw_request(T_IN, 0, Some(outside), true);
    d.str("outside=");
    ok &= verdict(&mut d, res == Some((0xff, 0)));
    let res = blk.raw_request(T_IN, 0, Some(input), false);
    d.str(" ro-status=");
    ok &= verdict(&mut d, res == Some((0xff, 0)));
    // A queue size after DRIVER_OK must be ignored; queue 7 does not exist.
    blk.dev.write_queue_size_late(3);
    blk.dev.notify(7);
    let res = blk.request(T_IN, 0, Some(input));
    d.str(" after=");
    ok &= verdict(&mut d, res == Some(S_OK) && !blk.dev.needs_reset());
    r.result(
        Name::new("virtio-blk", index, "evil").as_str(),
        ok,
        d.as_str(),
    );
}

fn verdict(d: &mut Detail, ok: bool) -> bool {
    d.str(if ok { "ok" } else { "WRONG" });
    ok
}

/// A discard or write-zeroes request for one sector (one
/// `virtio_blk_discard_write_zeroes` segment, no flags).
fn segment_request(
    blk: &mut Blk,
    kind: u32,
    sector: u64,
    index: usize,
    what: &str,
    r: &mut dyn Reporter,
) {
    let seg = buffers() + 3 * SECTOR_SIZE as u64;
    write64(seg, sector);
    write32(seg + 8, 1);
    write32(seg + 12, 0);
    let data = Buf {
        addr: seg,
        len: 16,
        writable: false,
    };
    let status = blk.request(kind, 0, Some(data));
    let mut d = Detail::new();
    d.str("sector=").dec(sector).str(" ");
    status_detail(&mut d, status);
    r.result(
        Name::new("virtio-blk", index, what).as_str(),
        status == Some(S_OK),
        d.as_str(),
    );
}

/// GET_ID: the device's serial, up to 20 bytes.
fn read_id(blk: &mut Blk, index: usize, r: &mut dyn Reporter) {
    let id = buffers() + 3 * SECTOR_SIZE as u64;
    fill(id, ID_BYTES, 0);
    let buf = Buf {
        addr: id,
        len: ID_BYTES as u32,
        writable: true,
    };
    let status = blk.request(T_GET_ID, 0, Some(buf));
    let mut d = Detail::new();
    status_detail(&mut d, status);
    d.str(" id=");
    for i in 0..ID_BYTES as u64 {
        let b = read8(id + i);
        if b == 0 {
            break;
        }
        d.bytes(&[if (0x21..0x7f).contains(&b) { b } else { b'.' }]);
    }
    r.result(
        Name::new("virtio-blk", index, "id").as_str(),
        status == Some(S_OK),
        d.as_str(),
    );
}

fn input_past_end(blk: &mut Blk, capacity: u64, input: Buf, index: usize, r: &mut dyn Reporter) {
    let status = blk.request(T_IN, capacity, Some(input));
    let mut d = Detail::new();
    d.str("sector=").dec(capacity).str(" ");
    status_detail(&mut d, status);
    r.result(
        Name::new("virtio-blk", index, "bounds").as_str(),
        status == Some(S_IOERR) && !blk.dev.needs_reset(),
        d.as_str(),
    );
}
