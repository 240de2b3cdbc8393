//! `checks=virtio-blk-bench`: a stream of block requests for measuring the
//! VMM's cost per request (only when named; not a correctness check).
//!
//! Prints `BENCH virtio-blk start`, then issues `blkbench.n=` requests
//! (default 1000) of `blkbench.kb=` KiB (1..=64, default 4) reading
//! (`blkbench.op=read`, default) or writing (`write`), at consecutive ranges
//! of the disk (`blkbench.pattern=seq`, default) or at random ones aligned
//! to the request size (`rand`, the same pseudo-random sequence every run),
//! `blkbench.depth=` (1 or 2, default 1) per notification, and ends with
//! `TEST virtio-blk-bench PASS requests=.. bytes=..`. The host side
//! (`cargo bench -p vmm-cli --bench blk` and `--bench guest_io`) reads the
//! VMM threads' CPU time at the two lines. `blkbench.hold_ms=` (default 0)
//! then idles that long before the guest goes on (to its exit), so that a
//! harness can read the VMM's threads while they all still exist.
//!
//! After a notification the guest waits for the answer as `blkbench.wait=`
//! says: `spin` (default) polls the used ring (the device answers from its
//! own thread, or before the notification returns), then falls back to
//! 1 ms sleeps; `irq` halts until the device's interrupt, as a real driver
//! does, so the vCPU is idle while the request is on the host. Data buffers
//! sit at 8 MiB: the guest needs at least 16 MiB of RAM.

use crate::cmdline;
use crate::irq;
use crate::report::{Detail, Reporter};
use crate::serial;

use super::queue::{Buf, Queue, buffers, read8, write8, write32, write64};
use super::transport::Device;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const S_OK: u8 = 0;
/// Where the data buffers go (above the guest image and its stacks).
const DATA_AREA: u64 = 8 << 20;
/// Used-ring polls before sleeping.
const SPINS: u32 = 200_000;
const TIMEOUT_MS: u32 = 2000;

fn number(cmdline: &[u8], key: &str, default: u64) -> u64 {
    cmdline::value(cmdline, key)
        .and_then(cmdline::parse_u64)
        .unwrap_or(default)
}

/// How the guest waits for an answer.
#[derive(Clone, Copy)]
enum Wait {
    Spin,
    /// Halt until this IOAPIC pin fires.
    Irq(u32),
}

fn wait(queue: &mut Queue, how: Wait, dev: &Device) -> bool {
    match how {
        Wait::Spin => {
            for _ in 0..SPINS {
                if queue.take_used().is_some() {
                    return true;
                }
            }
            queue.wait_used(TIMEOUT_MS).is_some()
        }
        Wait::Irq(pin) => {
            for _ in 0..TIMEOUT_MS {
                if queue.take_used().is_some() {
                    return true;
                }
                irq::wait(pin, 1);
                dev.ack_interrupt();
            }
            queue.take_used().is_some()
        }
    }
}

pub fn run(dev: &Device, irq_pin: u32, cmdline: &[u8], r: &mut dyn Reporter) {
    let requests = number(cmdline, "blkbench.n", 1000);
    let kb = number(cmdline, "blkbench.kb", 4).clamp(1, 64);
    let depth = number(cmdline, "blkbench.depth", 1).clamp(1, 2);
    let write = cmdline::value(cmdline, "blkbench.op") == Some(&b"write"[..]);
    let random = cmdline::value(cmdline, "blkbench.pattern") == Some(&b"rand"[..]);
    let hold_ms = number(cmdline, "blkbench.hold_ms", 0).min(60_000) as u32;
    let mut queue = Queue::new(0);
    if let Err(e) = dev.initialize(0, &[&queue]) {
        r.result("virtio-blk-bench", false, e);
        dev.reset();
        return;
    }
    // After set-up: on PCI, routing assigns queue 0 an MSI-X vector.
    let how = if cmdline::value(cmdline, "blkbench.wait") == Some(&b"irq"[..])
        && dev.route_interrupt(irq_pin)
    {
        irq::take(irq_pin);
        Wait::Irq(irq_pin)
    } else {
        Wait::Spin
    };
    let capacity = u64::from(dev.config32(0)) | u64::from(dev.config32(4)) << 32;
    let sectors = kb * 2;
    if capacity < sectors * depth {
        r.result("virtio-blk-bench", false, "disk too small");
        dev.reset();
        return;
    }
    let len = (kb * 1024) as u32;
    let slots = capacity / sectors;
    let mut rng = RANDOM_SEED;
    serial::write_str("BENCH virtio-blk start\n");
    let mut sector = 0;
    let mut done = 0u64;
    let mut failed = 0u64;
    while done < requests {
        let batch = depth.min(requests - done);
        for n in 0..batch {
            if random {
                sector = next_random(&mut rng) % slots * sectors;
            } else if sector + sectors > capacity {
                sector = 0;
            }
            let hdr = buffers() + 32 * n;
            write32(hdr, if write { T_OUT } else { T_IN });
            write32(hdr + 4, 0);
            write64(hdr + 8, sector);
            write8(hdr + 16, 0xff);
            queue.add(&[
                Buf {
                    addr: hdr,
                    len: 16,
                    writable: false,
                },
                Buf {
                    addr: DATA_AREA + n * 64 * 1024,
                    len,
                    writable: !write,
                },
                Buf {
                    addr: hdr + 16,
                    len: 1,
                    writable: true,
                },
            ]);
            if !random {
                sector += sectors;
            }
        }
        dev.notify(0);
        for n in 0..batch {
            if !wait(&mut queue, how, dev) || read8(buffers() + 32 * n + 16) != S_OK {
                failed += 1;
            }
        }
        done += batch;
    }
    let mut d = Detail::new();
    d.str("requests=")
        .dec(done)
        .str(" bytes=")
        .dec(done * u64::from(len))
        .str(" failed=")
        .dec(failed)
        .str(match how {
            Wait::Spin => " wait=spin",
            Wait::Irq(_) => " wait=irq",
        })
        .str(if random { " pattern=rand" } else { " pattern=seq" });
    r.result("virtio-blk-bench", failed == 0, d.as_str());
    irq::sleep_ms(hold_ms);
    dev.reset();
}

/// Seed of the random pattern: every run and every VMM sees the same
/// sequence of sectors.
const RANDOM_SEED: u64 = 0x9e37_79b9_7f4a_7c15;

/// xorshift64: a few shifts per number (no multiplication tables, no
/// floats), plenty for spreading requests over a disk.
fn next_random(state: &mut u64) -> u64 {
    let mut x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *state = x;
    x
}
