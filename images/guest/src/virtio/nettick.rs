//! `net=tick` (with `exit=tick`): the first virtio-net is kept running instead of
//! checked. Two receive buffers stay posted; every 25 ticks the guest sends a
//! broadcast frame with the test ethertype and the payload `tick N` (`net tx N`
//! printed once the device took it), and prints `net rx <payload>` for each test frame
//! that arrived meanwhile, giving the buffer back. `TEST net-tick FAIL` when a frame
//! is not taken (live migration's tests: on the target the device goes on with its
//! queues, through the target's own tap). Uses queue pages 2 and 3 and the upper half
//! of the buffers, so that it runs beside `rng=tick` and `blk=tick`.

use crate::report::{Detail, Reporter};

use super::net::{F_MAC, HDR_LEN, RX_BUF_LEN, build_frame, is_test_frame, post_rx};
use super::queue::{BUFFERS_LEN, QUEUE_SIZE, Buf, Queue, buffers, read8};
use super::transport::Device;

const RX_QUEUE: u32 = 0;
const TX_QUEUE: u32 = 1;
const RX_BUFFERS: u64 = 2;
const TX_TIMEOUT_MS: u32 = 1000;

/// Receive buffers: in the upper half of the buffer area, which the other kept devices
/// leave alone (the device writes them whenever a frame comes).
fn rx_base() -> u64 {
    buffers() + BUFFERS_LEN / 2
}

/// The frame sent: after the receive buffers.
fn tx_buf() -> u64 {
    rx_base() + RX_BUFFERS * u64::from(RX_BUF_LEN)
}

struct Ticking {
    dev: Device,
    rx: Queue,
    tx: Queue,
    rx_addr: [u64; QUEUE_SIZE as usize],
    mac: [u8; 6],
    sent: u64,
    failed: bool,
}

/// Written once during the checks, then only used from the waiting loop on the boot
/// vCPU: the guest is single-threaded there.
static mut TICKING: Option<Ticking> = None;

/// Sets `dev` up, posts the receive buffers, and keeps it for [`tick`].
pub fn keep(dev: &Device, r: &mut dyn Reporter) {
    let mut rx = Queue::new(2);
    let tx = Queue::new(3);
    if !super::keep_device(dev, F_MAC, &[&rx, &tx], "virtio-net-tick", r) {
        return;
    }
    let mut mac = [0u8; 6];
    for (i, b) in (0u64..).zip(mac.iter_mut()) {
        *b = dev.config8(i);
    }
    let mut rx_addr = [0u64; QUEUE_SIZE as usize];
    for i in 0..RX_BUFFERS {
        post_rx(&mut rx, &mut rx_addr, rx_base() + i * u64::from(RX_BUF_LEN));
    }
    dev.notify(RX_QUEUE);
    // SAFETY: see `TICKING`.
    unsafe {
        TICKING = Some(Ticking {
            dev: dev.clone(),
            rx,
            tx,
            rx_addr,
            mac,
            sent: 0,
            failed: false,
        })
    };
}

/// Prints what arrived, gives the buffers back, and sends one frame (every 25 ticks).
pub fn tick() {
    // SAFETY: see `TICKING`.
    let Some(t) = (unsafe { (*(&raw mut TICKING)).as_mut() }) else {
        return;
    };
    if t.failed {
        return;
    }
    let mut reposted = false;
    while let Some((id, used_len)) = t.rx.take_used() {
        let addr = t.rx_addr[(id % u32::from(QUEUE_SIZE)) as usize];
        let frame = addr + HDR_LEN;
        let len = u64::from(used_len).saturating_sub(HDR_LEN);
        if is_test_frame(frame, len) {
            let mut d = Detail::new();
            d.str("net rx ");
            for i in 14..len.min(14 + 32) {
                let b = read8(frame + i);
                d.bytes(&[if (0x20..0x7f).contains(&b) { b } else { b'.' }]);
            }
            d.str("\n");
            crate::serial::write(d.as_bytes());
        }
        post_rx(&mut t.rx, &mut t.rx_addr, addr);
        reposted = true;
    }
    if reposted {
        t.dev.notify(RX_QUEUE);
    }
    let mut payload = Detail::new();
    payload.str("tick ").dec(t.sent + 1);
    let len = build_frame(tx_buf(), &t.mac, payload.as_bytes());
    t.tx.add(&[Buf {
        addr: tx_buf(),
        len,
        writable: false,
    }]);
    t.dev.notify(TX_QUEUE);
    let mut d = Detail::new();
    if t.tx.wait_used(TX_TIMEOUT_MS).is_some() {
        t.sent += 1;
        d.str("net tx ").dec(t.sent).str("\n");
    } else {
        t.failed = true;
        d.str("TEST net-tick FAIL frame ")
            .dec(t.sent + 1)
            .str(" not taken\n");
    }
    crate::serial::write(d.as_bytes());
}
