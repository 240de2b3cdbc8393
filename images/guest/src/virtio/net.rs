//! virtio-net checks: send one frame, receive one.

use crate::cmdline;
use crate::report::{Detail, Reporter};

use super::Name;
use super::queue::{BUFFERS_LEN, Buf, QUEUE_SIZE, Queue, buffers, fill, read8, write8};
use super::transport::Device;

/// IEEE 802 local experimental ethertype used by the test frames.
pub const ETHERTYPE: u16 = 0x88b5;
/// Payload of the frame the guest sends.
pub const TX_PAYLOAD: &[u8] = b"hello from the test guest";
/// VIRTIO_NET_F_MAC.
pub(super) const F_MAC: u32 = 1 << 5;
/// virtio_net_hdr_v1.
pub(super) const HDR_LEN: u64 = 12;
/// A receive buffer holds a whole standard frame (no mergeable buffers).
pub(super) const RX_BUF_LEN: u32 = 2048;
const RX_BUFFERS: u64 = 2;
const TX_TIMEOUT_MS: u32 = 1000;
const DEFAULT_RX_MS: u32 = 5000;
/// Frames of other types the guest skips before giving up.
const MAX_SKIPPED: u32 = 16;

pub fn check(dev: &Device, index: usize, cmdline: &[u8], r: &mut dyn Reporter) {
    let mut rxq = Queue::new(0);
    let mut txq = Queue::new(1);
    if let Err(e) = dev.initialize(F_MAC, &[&rxq, &txq]) {
        r.result(Name::new("virtio-net", index, "init").as_str(), false, e);
        dev.reset();
        return;
    }
    let mut mac = [0u8; 6];
    for (i, b) in mac.iter_mut().enumerate() {
        *b = dev.config8(i as u64);
    }

    // Receive buffers first, so a reply to our frame finds them.
    let rx_base = buffers();
    let mut rx_addr = [0u64; QUEUE_SIZE as usize];
    for i in 0..RX_BUFFERS {
        post_rx(&mut rxq, &mut rx_addr, rx_base + i * u64::from(RX_BUF_LEN));
    }
    dev.notify(0);

    let tx = buffers() + BUFFERS_LEN - 1024;
    let len = build_frame(tx, &mac, TX_PAYLOAD);
    txq.add(&[Buf {
        addr: tx,
        len,
        writable: false,
    }]);
    dev.notify(1);
    let sent = txq.wait_used(TX_TIMEOUT_MS).is_some();
    let mut d = Detail::new();
    d.str("mac=");
    for (i, b) in mac.iter().enumerate() {
        if i > 0 {
            d.str(":");
        }
        hex2(&mut d, *b);
    }
    d.str(" len=").dec(u64::from(len));
    r.result(
        Name::new("virtio-net", index, "tx").as_str(),
        sent && !dev.needs_reset(),
        d.as_str(),
    );

    let rx_ms = cmdline::value(cmdline, "net.rx_ms")
        .and_then(cmdline::parse_u64)
        .map(|v| v.min(u64::from(u32::MAX)) as u32)
        .unwrap_or(DEFAULT_RX_MS);
    let name = Name::new("virtio-net", index, "rx");
    for _ in 0..MAX_SKIPPED {
        let Some((id, used_len)) = rxq.wait_used(rx_ms) else {
            let mut d = Detail::new();
            d.str("no frame within ").dec(u64::from(rx_ms)).str(" ms");
            r.result(name.as_str(), false, d.as_str());
            dev.reset();
            return;
        };
        let addr = rx_addr[(id % u32::from(QUEUE_SIZE)) as usize];
        let frame = addr + HDR_LEN;
        let frame_len = u64::from(used_len).saturating_sub(HDR_LEN);
        if is_test_frame(frame, frame_len) {
            let mut d = Detail::new();
            d.str("len=").dec(frame_len).str(" payload=");
            for i in 14..frame_len.min(14 + 64) {
                let b = read8(frame + i);
                d.bytes(&[if (0x20..0x7f).contains(&b) { b } else { b'.' }]);
            }
            r.result(name.as_str(), true, d.as_str());
            dev.reset();
            return;
        }
        // Something else (host chatter): give the buffer back, keep waiting.
        post_rx(&mut rxq, &mut rx_addr, addr);
        dev.notify(0);
    }
    r.result(name.as_str(), false, "only frames of other types arrived");
    dev.reset();
}

/// Whether the received frame at `frame` (after the virtio-net header) has the test
/// ethertype.
pub(super) fn is_test_frame(frame: u64, len: u64) -> bool {
    len >= 14 && read8(frame + 12) == (ETHERTYPE >> 8) as u8 && read8(frame + 13) == ETHERTYPE as u8
}

pub(super) fn post_rx(q: &mut Queue, rx_addr: &mut [u64; QUEUE_SIZE as usize], addr: u64) {
    fill(addr, HDR_LEN as usize, 0);
    let head = q.add(&[Buf {
        addr,
        len: RX_BUF_LEN,
        writable: true,
    }]);
    rx_addr[usize::from(head % QUEUE_SIZE)] = addr;
}

/// virtio-net header, broadcast destination, our MAC, ethertype, payload.
/// Returns the chain length.
pub(super) fn build_frame(at: u64, mac: &[u8; 6], payload: &[u8]) -> u32 {
    fill(at, HDR_LEN as usize, 0);
    let frame = at + HDR_LEN;
    for i in 0..6 {
        write8(frame + i, 0xff);
        write8(frame + 6 + i, mac[i as usize]);
    }
    write8(frame + 12, (ETHERTYPE >> 8) as u8);
    write8(frame + 13, ETHERTYPE as u8);
    for (i, &b) in payload.iter().enumerate() {
        write8(frame + 14 + i as u64, b);
    }
    (HDR_LEN as usize + 14 + payload.len()) as u32
}

fn hex2(d: &mut Detail, b: u8) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    d.bytes(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]);
}
