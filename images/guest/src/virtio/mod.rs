//! virtio-mmio drivers and the virtio checks of the test guest.
//!
//! Every `virtio_mmio.device=` entry is probed; each device found is driven
//! through one small split virtqueue (polled, with the device interrupt
//! checked once for block) and then reset. Checks, one `TEST` line each:
//!
//! - block (`virtio-blk`): `virtio-blk-write` writes [`blk::pattern`] to
//!   sector [`blk::TEST_SECTOR`] (a read-only disk must refuse it instead:
//!   `virtio-blk-ro`), `virtio-blk-irq` (the used-buffer interrupt arrived),
//!   `virtio-blk-flush`, `virtio-blk-zeroes` (write-zeroes on sector
//!   [`blk::ZEROES_SECTOR`]) and `virtio-blk-discard` (sector
//!   [`blk::DISCARD_SECTOR`]) when the device offers them,
//!   `virtio-blk-read` (reads the sector back and compares), `virtio-blk-id`
//!   (GET_ID, prints the serial),
//!   `virtio-blk-bounds` (a read at the capacity must fail with IOERR). A
//!   second disk's names carry its number: `virtio-blk1-write`.
//! - net (`virtio-net`): `virtio-net-tx` sends one broadcast frame with
//!   ethertype 0x88b5 and payload [`net::TX_PAYLOAD`]; `virtio-net-rx` waits
//!   (`net.rx_ms=`, default 5000) for a frame with that ethertype and prints
//!   its payload.
//! - rng (`virtio-rng`): 64 bytes, not all equal.
//!
//! `checks=` selects device types by those names; without it all run.
//! `virtio-blk-bench` (only when named) streams requests for measuring the
//! VMM (see `blkbench`). `virtio-blk-fill` (only when named) fills the first
//! disk with checkable blocks across resets (see `blkfill`).
//! `virtio-evil` (only when named) adds `virtio-blk-evil`: requests a
//! well-behaved driver never sends (a buffer outside guest memory, a
//! read-only status byte, a queue register written after DRIVER_OK, a
//! notification for a missing queue) must come back untouched and leave the
//! device working.

mod blk;
mod blkbench;
mod blktick;
mod blkfill;
mod net;
mod nettick;
pub mod pci;
mod queue;
mod rng;
mod transport;

pub use blktick::tick as blk_tick;
pub use nettick::tick as net_tick;
pub use rng::tick as rng_tick;

use crate::cmdline;
use crate::report::{Detail, Reporter};
use transport::{Device, ID_BLOCK, ID_NET, ID_RNG};

/// Sets up a device that a `*=tick` mode keeps running (`rng`, `blk`, `net`), reported as
/// `name`; `false` (reported failing, the device reset) when it does not start.
fn keep_device(
    dev: &Device,
    features: u32,
    queues: &[&queue::Queue],
    name: &str,
    r: &mut dyn Reporter,
) -> bool {
    match dev.initialize(features, queues) {
        Ok(_) => {
            r.result(name, true, "kept running");
            true
        }
        Err(e) => {
            r.result(name, false, e);
            dev.reset();
            false
        }
    }
}

/// The IOAPIC-free pin whose vector virtio-pci interrupts use here.
const PCI_IRQ_PIN: u32 = 20;

/// Runs the virtio checks for the virtio-mmio devices given (`(base,
/// irq)` per device), then for the virtio-pci functions on bus 0.
pub fn run_checks(devices: &[(u64, u32)], cmdline: &[u8], r: &mut dyn Reporter) {
    let mut counts = Counts::default();
    for &(base, irq) in devices {
        match Device::probe(base) {
            Ok((dev, id)) => check_device(&dev, id, irq, &mut counts, cmdline, r),
            Err(e) => {
                let mut d = Detail::new();
                d.str(e).str(" at ").hex(base);
                r.result("virtio-probe", false, d.as_str());
            }
        }
    }
    // Bus 0 exists only with the PCI transport: no host bridge, no scan.
    if crate::pci::read32(0, 0) == 0xffff_ffff {
        return;
    }
    for slot in 1..32u8 {
        match pci::PciDevice::probe(slot) {
            None => {}
            Some(Ok((dev, id))) => {
                check_device(&Device::Pci(dev), id, PCI_IRQ_PIN, &mut counts, cmdline, r)
            }
            Some(Err(e)) => {
                let mut d = Detail::new();
                d.str(e).str(" in slot ").dec(u64::from(slot));
                r.result("virtio-probe", false, d.as_str());
            }
        }
    }
}

#[derive(Default)]
struct Counts {
    blk: usize,
    net: usize,
    rng: usize,
    /// Block devices seen (the fill check drives the first).
    blk_seen: usize,
}

fn check_device(
    dev: &Device,
    id: u32,
    irq: u32,
    counts: &mut Counts,
    cmdline: &[u8],
    r: &mut dyn Reporter,
) {
    let (blk_count, net_count, rng_count) = (&mut counts.blk, &mut counts.net, &mut counts.rng);
    {
        match id {
            ID_BLOCK if *blk_count == 0 && cmdline::value(cmdline, "blk") == Some(b"tick") => {
                blktick::keep(dev, r);
                *blk_count += 1;
            }
            ID_BLOCK if cmdline::check_selected(cmdline, "virtio-blk") => {
                let evil = cmdline::check_named(cmdline, "virtio-evil");
                blk::check(dev, irq, *blk_count, evil, r);
                *blk_count += 1;
            }
            ID_NET if *net_count == 0 && cmdline::value(cmdline, "net") == Some(b"tick") => {
                nettick::keep(dev, r);
                *net_count += 1;
            }
            ID_NET if cmdline::check_selected(cmdline, "virtio-net") => {
                net::check(dev, *net_count, cmdline, r);
                *net_count += 1;
            }
            ID_RNG if *rng_count == 0 && cmdline::value(cmdline, "rng") == Some(b"tick") => {
                rng::keep(dev, r);
                *rng_count += 1;
            }
            ID_RNG if cmdline::check_selected(cmdline, "virtio-rng") => {
                rng::check(dev, *rng_count, r);
                *rng_count += 1;
            }
            // Empty slots (ID 0), device types we have no check for, and
            // checks not selected.
            _ => {}
        }
        if id == ID_BLOCK && cmdline::check_named(cmdline, "virtio-blk-bench") {
            blkbench::run(&dev, irq, cmdline, r);
        }
        if id == ID_BLOCK
            && counts.blk_seen == 0
            && cmdline::check_named(cmdline, "virtio-blk-fill")
        {
            blkfill::run(dev, cmdline, r);
        }
        if id == ID_BLOCK {
            counts.blk_seen += 1;
        }
    }
}

/// `<kind><n>-<what>` (no number for the first device of a kind), e.g.
/// `virtio-blk-write`, `virtio-blk1-write`.
pub struct Name {
    buf: [u8; 40],
    len: usize,
}

impl Name {
    pub fn new(kind: &str, index: usize, what: &str) -> Name {
        let mut n = Name {
            buf: [0; 40],
            len: 0,
        };
        n.push(kind.as_bytes());
        if index > 0 {
            // At most 16 devices: two digits.
            if index >= 10 {
                n.push(&[b'0' + (index / 10) as u8]);
            }
            n.push(&[b'0' + (index % 10) as u8]);
        }
        n.push(b"-");
        n.push(what.as_bytes());
        n
    }

    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if self.len < self.buf.len() {
                self.buf[self.len] = b;
                self.len += 1;
            }
        }
    }

    pub fn as_str(&self) -> &str {
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("virtio-?")
    }
}
