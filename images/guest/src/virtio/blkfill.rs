//! `checks=virtio-blk-fill` (only when named): fills a region of the first
//! disk with self-describing 4 KiB blocks across VM resets, so that the host
//! can check after the run that every block holds what was written last.
//!
//! The run is split into generations, one per boot of the VM: generation
//! `g` (from 1) writes `blkfill.mb=` MiB (default 32) starting
//! `(g - 1) * blkfill.step_mb=` MiB (default half the size, so that
//! generations overlap) past `blkfill.offset_mb=` (default 0). Every block
//! starts with [`MAGIC`], the generation (u32 LE) and the block's number on
//! the disk (u32 LE, byte offset / 4096); the rest of it is [`body`] of the
//! generation. The guest finds its generation by reading the first block of
//! each generation's region: the first one that does not hold its
//! generation's header is the one to write. So the data written before a
//! reset must be readable after it, flushed or not: no flush is ever sent.
//!
//! Before `blkfill.gens=` (default 2) the generation ends the VM with a
//! reset (`blkfill.reset=guest`, the default: through the i8042, 0xFE), or
//! (`host`) prints `BLKFILL gen=<g> written` and keeps rewriting its region
//! with the same bytes until the VMM resets the VM (the launcher's Reset
//! RPC), so that requests are in flight when it does. The last generation
//! reports `TEST virtio-blk-fill PASS gen=<g> ...` and the run goes on to
//! its end (`exit=`).
//!
//! Cheap for an emulated guest (~1 µs per instruction): the two 512 KiB
//! buffers at 8 MiB (the guest needs at least 16 MiB of RAM) are filled once
//! per boot, each request then rewrites only its blocks' 16-byte headers,
//! and two requests go out per notification (a batch on the VMM's I/O
//! threads).

use crate::cmdline;
use crate::report::{Detail, Reporter};
use crate::serial;

use super::queue::{Buf, Queue, buffers, fill, read8, read32, write8, write32, write64};
use super::transport::Device;

const T_IN: u32 = 0;
const T_OUT: u32 = 1;
const S_OK: u8 = 0;
const BLOCK: u64 = 4096;
const SECTOR: u64 = 512;
/// First bytes of every block the check writes.
pub const MAGIC: &[u8; 8] = b"blkfill:";
/// Where the two data buffers go (above the guest image and its stacks).
const DATA_AREA: u64 = 8 << 20;
/// Bytes per request.
const CHUNK: u64 = 512 * 1024;
/// Requests per notification.
const DEPTH: u64 = 2;
/// Longest wait for one request.
const TIMEOUT_MS: u32 = 10_000;
/// Passes over the region while waiting for the host's reset (each pass is
/// tens of requests: minutes, at worst).
const MAX_PASSES: u32 = 2_000;

/// The byte that fills generation `g`'s blocks after their header.
pub fn body(generation: u32) -> u8 {
    0xa5 ^ (generation.to_le_bytes()[0])
}

fn number(cmdline: &[u8], key: &str, default: u64) -> u64 {
    cmdline::value(cmdline, key)
        .and_then(cmdline::parse_u64)
        .unwrap_or(default)
}

struct Fill<'a> {
    dev: &'a Device,
    queue: Queue,
}

impl Fill<'_> {
    /// Sends `chains` (each header, data, status at `buffers() + 32 * n`)
    /// with one notification; true when every one came back with S_OK.
    fn send(&mut self, chains: &[(u32, u64, Buf)]) -> bool {
        for (n, &(kind, sector, data)) in chains.iter().enumerate() {
            let hdr = buffers() + 32 * n as u64;
            write32(hdr, kind);
            write32(hdr + 4, 0);
            write64(hdr + 8, sector);
            write8(hdr + 16, 0xff);
            self.queue.add(&[
                Buf {
                    addr: hdr,
                    len: 16,
                    writable: false,
                },
                data,
                Buf {
                    addr: hdr + 16,
                    len: 1,
                    writable: true,
                },
            ]);
        }
        self.dev.notify(0);
        let mut ok = true;
        for n in 0..chains.len() {
            ok &= self.queue.wait_used(TIMEOUT_MS).is_some();
            ok &= read8(buffers() + 32 * n as u64 + 16) == S_OK;
        }
        ok
    }

    /// Whether the block at byte `offset` holds generation `g`'s header.
    fn holds(&mut self, offset: u64, generation: u32) -> Option<bool> {
        let at = buffers() + 1024;
        fill(at, BLOCK as usize, 0);
        let data = Buf {
            addr: at,
            len: BLOCK as u32,
            writable: true,
        };
        if !self.send(&[(T_IN, offset / SECTOR, data)]) {
            return None;
        }
        let magic = (0..MAGIC.len()).all(|i| read8(at + i as u64) == MAGIC[i]);
        Some(magic && read32(at + 8) == generation && read32(at + 12) == (offset / BLOCK) as u32)
    }

    /// Writes generation `g` over `[start, start + len)`; true when every
    /// request succeeded.
    fn write_region(&mut self, generation: u32, start: u64, len: u64) -> bool {
        let mut offset = start;
        while offset < start + len {
            let mut chains = [(
                0u32,
                0u64,
                Buf {
                    addr: 0,
                    len: 0,
                    writable: false,
                },
            ); DEPTH as usize];
            let mut count = 0;
            while count < DEPTH as usize && offset < start + len {
                let size = CHUNK.min(start + len - offset);
                let buf = DATA_AREA + count as u64 * CHUNK;
                for b in 0..size / BLOCK {
                    let at = buf + b * BLOCK;
                    write32(at + 8, generation);
                    write32(at + 12, ((offset / BLOCK) + b) as u32);
                }
                chains[count] = (
                    T_OUT,
                    offset / SECTOR,
                    Buf {
                        addr: buf,
                        len: size as u32,
                        writable: false,
                    },
                );
                count += 1;
                offset += size;
            }
            if !self.send(&chains[..count]) {
                return false;
            }
        }
        true
    }
}

pub fn run(dev: &Device, cmdline: &[u8], r: &mut dyn Reporter) {
    let size = number(cmdline, "blkfill.mb", 32) << 20;
    let step = number(cmdline, "blkfill.step_mb", size >> 21) << 20;
    let base = number(cmdline, "blkfill.offset_mb", 0) << 20;
    let gens = number(cmdline, "blkfill.gens", 2).clamp(1, 64) as u32;
    let host_reset = cmdline::value(cmdline, "blkfill.reset") == Some(&b"host"[..]);
    let queue = Queue::new(0);
    if let Err(e) = dev.initialize(0, &[&queue]) {
        r.result("virtio-blk-fill", false, e);
        dev.reset();
        return;
    }
    let mut f = Fill { dev, queue };
    let capacity = (u64::from(dev.config32(0)) | u64::from(dev.config32(4)) << 32) * SECTOR;
    let end = base + u64::from(gens - 1) * step + size;
    if size == 0 || size % BLOCK != 0 || step % BLOCK != 0 || end > capacity {
        let mut d = Detail::new();
        d.str("the generations need ")
            .dec(end)
            .str(" bytes, the disk has ")
            .dec(capacity);
        r.result("virtio-blk-fill", false, d.as_str());
        dev.reset();
        return;
    }
    // The first generation whose region does not start with its header.
    let mut generation = 1;
    while generation <= gens {
        let start = base + u64::from(generation - 1) * step;
        match f.holds(start, generation) {
            Some(true) => generation += 1,
            Some(false) => break,
            None => {
                r.result(
                    "virtio-blk-fill",
                    false,
                    "cannot read a region's first block",
                );
                dev.reset();
                return;
            }
        }
    }
    if generation > gens {
        r.result(
            "virtio-blk-fill",
            false,
            "every generation is already written",
        );
        dev.reset();
        return;
    }
    // The buffers: the magic and the body once, the rest per request.
    for n in 0..DEPTH {
        let buf = DATA_AREA + n * CHUNK;
        fill(buf, CHUNK as usize, body(generation));
        for b in 0..CHUNK / BLOCK {
            let at = buf + b * BLOCK;
            for (i, &m) in MAGIC.iter().enumerate() {
                write8(at + i as u64, m);
            }
        }
    }
    let start = base + u64::from(generation - 1) * step;
    let mut d = Detail::new();
    d.str("gen=")
        .dec(u64::from(generation))
        .str(" from=")
        .dec(start)
        .str(" bytes=")
        .dec(size);
    if !f.write_region(generation, start, size) {
        d.str(" a write failed");
        r.result("virtio-blk-fill", false, d.as_str());
        dev.reset();
        return;
    }
    if generation < gens {
        let mut line = Detail::new();
        line.str("BLKFILL gen=")
            .dec(u64::from(generation))
            .str(" written\n");
        serial::write(line.as_bytes());
        if !host_reset {
            // No flush, no device reset: the VM ends with the writes as they are.
            crate::exit::reset();
        }
        for _ in 0..MAX_PASSES {
            if !f.write_region(generation, start, size) {
                d.str(" a rewrite failed");
                r.result("virtio-blk-fill", false, d.as_str());
                dev.reset();
                return;
            }
        }
        d.str(" no reset came");
        r.result("virtio-blk-fill", false, d.as_str());
        dev.reset();
        return;
    }
    r.result("virtio-blk-fill", true, d.as_str());
    dev.reset();
}
