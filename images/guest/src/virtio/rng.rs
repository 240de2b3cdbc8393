//! virtio-rng check: 64 bytes of entropy, not all the same. With `rng=tick` (and
//! `exit=tick`) the first RNG is instead kept running: set up once after the checks,
//! asked for 64 bytes every 25 ticks while the guest waits, `rng ok N` printed for each
//! answer, `TEST rng-tick FAIL` for none (live migration's tests: the device and its
//! queue must go on where they were).

use crate::report::{Detail, Reporter};

use super::Name;
use super::queue::{Buf, Queue, buffers, fill, read8};
use super::transport::Device;

const BYTES: u32 = 64;
const TIMEOUT_MS: u32 = 1000;

pub fn check(dev: &Device, index: usize, r: &mut dyn Reporter) {
    let name = Name::new("virtio-rng", index, "read");
    let mut queue = Queue::new(0);
    if let Err(e) = dev.initialize(0, &[&queue]) {
        r.result(name.as_str(), false, e);
        dev.reset();
        return;
    }
    let buf = buffers();
    fill(buf, BYTES as usize, 0);
    queue.add(&[Buf {
        addr: buf,
        len: BYTES,
        writable: true,
    }]);
    dev.notify(0);
    let used = queue.wait_used(TIMEOUT_MS);
    dev.reset();
    let mut d = Detail::new();
    let Some((_, len)) = used else {
        r.result(name.as_str(), false, "no completion");
        return;
    };
    let first = read8(buf);
    let mut distinct = false;
    let mut head: u64 = 0;
    for i in 0..BYTES.min(len) as u64 {
        let b = read8(buf + i);
        distinct |= b != first;
        if i < 8 {
            head = head << 8 | u64::from(b);
        }
    }
    d.str("bytes=").dec(u64::from(len)).str(" first=").hex(head);
    r.result(name.as_str(), len == BYTES && distinct, d.as_str());
}

/// The RNG kept running for `rng=tick`, and its answers so far.
struct Ticking {
    dev: Device,
    queue: Queue,
    answers: u64,
    failed: bool,
}

/// Written once during the checks, then only read and updated from the waiting loop,
/// on the boot vCPU: the guest is single-threaded there.
static mut TICKING: Option<Ticking> = None;

/// Sets `dev` up and keeps it for [`tick`] instead of the check.
pub fn keep(dev: &Device, r: &mut dyn Reporter) {
    let queue = Queue::new(0);
    if !super::keep_device(dev, 0, &[&queue], "virtio-rng-tick", r) {
        return;
    }
    // SAFETY: see `TICKING`.
    unsafe {
        TICKING = Some(Ticking {
            dev: dev.clone(),
            queue,
            answers: 0,
            failed: false,
        })
    };
}

/// One request to the kept RNG (called every 25 ticks).
pub fn tick() {
    // SAFETY: see `TICKING`.
    let Some(t) = (unsafe { (*(&raw mut TICKING)).as_mut() }) else {
        return;
    };
    if t.failed {
        return;
    }
    let buf = buffers();
    fill(buf, BYTES as usize, 0);
    t.queue.add(&[Buf {
        addr: buf,
        len: BYTES,
        writable: true,
    }]);
    t.dev.notify(0);
    let mut d = Detail::new();
    match t.queue.wait_used(TIMEOUT_MS) {
        Some((_, len)) if len == BYTES && t.queue.used_in_step() => {
            t.answers += 1;
            d.str("rng ok ").dec(t.answers).str("\n");
        }
        other => {
            t.failed = true;
            d.str("TEST rng-tick FAIL answer ")
                .dec(t.answers + 1)
                .str(match other {
                    Some((_, len)) if len != BYTES => " short",
                    Some(_) => " out of step with the used ring",
                    None => " missing",
                })
                .str("\n");
        }
    }
    crate::serial::write(d.as_bytes());
}
