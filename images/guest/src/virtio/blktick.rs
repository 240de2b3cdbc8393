//! `blk=tick` (with `exit=tick`): the first virtio-blk is kept running instead of
//! checked. Every 25 ticks the guest writes sector [`FIRST_SECTOR`] + n (its n-th
//! write, [`tick_pattern`]), flushes, and reads back the sector of write n / 2 (made
//! long before: across a live migration, on the source) and checks it. `blk ok N`
//! for each round that checks out, `TEST blk-tick FAIL` otherwise (live migration's
//! tests: the disk's contents and the device's queue go on where they were). Uses
//! queue page 1, so that it runs beside `rng=tick` (page 0); other virtio checks
//! must not run (`checks=serial`).

use crate::report::{Detail, Reporter};

use super::blk::{Blk, S_OK, T_FLUSH, T_IN, T_OUT};
use super::queue::{Buf, Queue, buffers, read8, write8};
use super::transport::Device;

// Shared with the host's side (`test_guest::blktick`).
#[path = "blktick_pattern.rs"]
mod pattern;
pub use pattern::{FIRST_SECTOR, SECTOR, tick_pattern};

struct Ticking {
    blk: Blk,
    writes: u64,
    failed: bool,
}

/// Written once during the checks, then only used from the waiting loop on the boot
/// vCPU: the guest is single-threaded there.
static mut TICKING: Option<Ticking> = None;

/// Sets `dev` up and keeps it for [`tick`].
pub fn keep(dev: &Device, r: &mut dyn Reporter) {
    let queue = Queue::new(1);
    if !super::keep_device(dev, 0, &[&queue], "virtio-blk-tick", r) {
        return;
    }
    // SAFETY: see `TICKING`.
    unsafe {
        TICKING = Some(Ticking {
            blk: Blk {
                dev: dev.clone(),
                queue,
            },
            writes: 0,
            failed: false,
        })
    };
}

/// One write, a flush, and a read of an earlier write (every 25 ticks).
pub fn tick() {
    // SAFETY: see `TICKING`.
    let Some(t) = (unsafe { (*(&raw mut TICKING)).as_mut() }) else {
        return;
    };
    if t.failed {
        return;
    }
    // `Blk::request` puts its header at the start of the buffers: data after it.
    let data = buffers() + SECTOR;
    let n = t.writes;
    for i in 0..SECTOR {
        write8(data + i, tick_pattern(n, i));
    }
    let sector = |buf_writable| Buf {
        addr: data,
        len: SECTOR as u32,
        writable: buf_writable,
    };
    let wrote = t.blk.request(T_OUT, FIRST_SECTOR + n, Some(sector(false)));
    let flushed = t.blk.request(T_FLUSH, 0, None);
    let earlier = n / 2;
    let read = t.blk.request(T_IN, FIRST_SECTOR + earlier, Some(sector(true)));
    let mismatch = (0..SECTOR).find(|&i| read8(data + i) != tick_pattern(earlier, i));
    let mut d = Detail::new();
    if wrote == Some(S_OK) && flushed == Some(S_OK) && read == Some(S_OK) && mismatch.is_none() {
        t.writes += 1;
        d.str("blk ok ").dec(t.writes).str("\n");
    } else {
        t.failed = true;
        d.str("TEST blk-tick FAIL write ").dec(n);
        match mismatch {
            Some(i) if read == Some(S_OK) => {
                d.str(" read back write ").dec(earlier).str(" differs at byte ").dec(i)
            }
            _ => d.str(" a request failed or did not complete"),
        };
        d.str("\n");
    }
    crate::serial::write(d.as_bytes());
}
