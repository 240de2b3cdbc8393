//! virtio-net against a real tap in a private network namespace: frames the
//! guest sends are read from the tap with a packet socket, frames injected
//! through the socket must appear in the guest's receive buffers.
//!
//! Needs root (tap devices, namespaces); fails, never skips, without it.

use std::time::{Duration, Instant};

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET;
use vm_memory::{Bytes, GuestAddress};

use super::test_tap::{TEST_ETHERTYPE as ETHERTYPE, Wire, create_tap, frame, in_new_netns};
use super::*;
use crate::testing::{Desc, GuestDriver, MEM_SIZE, MmioDriver, test_memory};

const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
const PEER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xab, 0xcd, 0xef];

const RX_BUFS: u64 = 0x10_0000;
const TX_BUFS: u64 = 0x20_0000;
const RX_BUF_LEN: u32 = 2048;

struct Harness<'a> {
    mem: &'a GuestMemoryMmap,
    mmio: MmioDriver,
    rxq: GuestDriver<'a>,
    txq: GuestDriver<'a>,
    wire: Wire,
    rx_seen: u16,
    rx_posted: u64,
    counters: Arc<NetCounters>,
}

impl<'a> Harness<'a> {
    fn new(mem: &'a GuestMemoryMmap, tap: &str) -> Self {
        Harness::with_options(
            mem,
            tap,
            NetOptions {
                mac: GUEST_MAC,
                mtu: None,
                link_up: true,
            },
        )
    }

    fn with_options(mem: &'a GuestMemoryMmap, tap: &str, options: NetOptions) -> Self {
        create_tap(tap);
        let net = Net::with_options(tap, options).expect("open the tap");
        let counters = net.counters();
        let mut mmio = MmioDriver::new(Box::new(net), mem);
        let rxq = GuestDriver::at(mem, 16, 0x1000);
        let txq = GuestDriver::at(mem, 16, 0x8000);
        mmio.bring_up(0, &[&rxq, &txq]);
        Harness {
            mem,
            mmio,
            rxq,
            txq,
            wire: Wire::bind(tap),
            rx_seen: 0,
            rx_posted: 0,
            counters,
        }
    }

    /// Posts `n` receive buffers of `len` bytes and notifies.
    fn post_rx(&mut self, n: usize, len: u32) {
        for _ in 0..n {
            let addr = RX_BUFS + (self.rx_posted % 16) * 0x1_0000;
            self.rxq.add_chain(&[Desc::write(addr, len)]);
            self.rx_posted += 1;
        }
        self.mmio.notify(u32::from(RX_QUEUE));
    }

    /// Waits for the next used receive buffer; returns (used length, bytes).
    fn next_rx(&mut self, timeout: Duration) -> Option<(u32, Vec<u8>)> {
        let deadline = Instant::now() + timeout;
        while self.rxq.used_idx() == self.rx_seen {
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let (id, len) = self.rxq.used_elem(self.rx_seen);
        self.rx_seen = self.rx_seen.wrapping_add(1);
        // The descriptor id tells which buffer; read its address back.
        let mut raw = [0u8; 8];
        self.mem
            .read_slice(
                &mut raw,
                GuestAddress(self.rxq.desc_table() + u64::from(id) * 16),
            )
            .unwrap();
        let addr = u64::from_le_bytes(raw);
        let mut bytes = vec![0u8; len as usize];
        self.mem.read_slice(&mut bytes, GuestAddress(addr)).unwrap();
        Some((len, bytes))
    }

    /// Next received frame with our ethertype (header stripped and checked).
    fn next_frame(&mut self, timeout: Duration) -> Option<Vec<u8>> {
        loop {
            let (len, bytes) = self.next_rx(timeout)?;
            assert!(len as usize >= VNET_HDR_LEN, "used length {len}");
            let mut hdr = [0u8; VNET_HDR_LEN];
            hdr[10] = 1; // num_buffers
            assert_eq!(bytes[..VNET_HDR_LEN], hdr);
            let f = &bytes[VNET_HDR_LEN..];
            if f.len() >= 14 && f[12..14] == ETHERTYPE.to_be_bytes() {
                return Some(f.to_vec());
            }
        }
    }

    /// Sends `descs` on the transmit queue; returns the used length.
    fn send(&mut self, descs: &[Desc]) -> u32 {
        let before = self.txq.used_idx();
        self.txq.add_chain(descs);
        self.mmio.notify(u32::from(TX_QUEUE));
        assert_eq!(
            self.txq.used_idx(),
            before.wrapping_add(1),
            "transmit chain returned"
        );
        self.txq.used_elem(before).1
    }

    fn tx_frame(&self, at: u64, f: &[u8], hdr: [u8; VNET_HDR_LEN]) -> u32 {
        self.mem.write_slice(&hdr, GuestAddress(at)).unwrap();
        self.mem
            .write_slice(f, GuestAddress(at + VNET_HDR_LEN as u64))
            .unwrap();
        u32::try_from(VNET_HDR_LEN + f.len()).expect("a test frame is small")
    }
}

#[test]
fn the_mac_is_in_the_config_space() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-mac");
        let mut b = [0u8; 8];
        h.mmio.read_config(0, &mut b);
        assert_eq!(b[..6], GUEST_MAC);
        // status: VIRTIO_NET_S_LINK_UP; no MTU offered.
        assert_eq!(b[6..8], [1, 0]);
        let features = h.mmio.device_features();
        assert_ne!(features & feature_bit(VIRTIO_NET_F_STATUS), 0);
        assert_eq!(features & feature_bit(VIRTIO_NET_F_MTU), 0);
    });
}

#[test]
fn the_mtu_is_offered_when_configured() {
    in_new_netns(|| {
        let mem = test_memory();
        let options = NetOptions {
            mac: GUEST_MAC,
            mtu: Some(1450),
            link_up: true,
        };
        let mut h = Harness::with_options(&mem, "vt-mtu", options);
        assert_ne!(h.mmio.device_features() & feature_bit(VIRTIO_NET_F_MTU), 0);
        let mut mtu = [0u8; 2];
        h.mmio.read_config(10, &mut mtu);
        assert_eq!(u16::from_le_bytes(mtu), 1450);
    });
}

#[test]
fn a_link_that_is_down_passes_no_frame() {
    in_new_netns(|| {
        let mem = test_memory();
        let options = NetOptions {
            mac: GUEST_MAC,
            mtu: None,
            link_up: false,
        };
        let mut h = Harness::with_options(&mem, "vt-down", options);
        let mut status = [0u8; 2];
        h.mmio.read_config(6, &mut status);
        assert_eq!(status, [0, 0], "no VIRTIO_NET_S_LINK_UP");
        // Sent: the chain comes back, nothing reaches the tap.
        let f = frame(GUEST_MAC, [0xff; 6], b"no carrier");
        let total = h.tx_frame(TX_BUFS, &f, [0; VNET_HDR_LEN]);
        assert_eq!(h.send(&[Desc::read(TX_BUFS, total)]), 0);
        assert_eq!(h.wire.recv(Duration::from_millis(300)), None);
        // Received: buffers stay with the device, nothing is delivered.
        h.post_rx(2, RX_BUF_LEN);
        h.wire
            .send(&frame(PEER_MAC, GUEST_MAC, b"nobody hears this"));
        assert_eq!(h.next_rx(Duration::from_millis(500)), None);
        let c = h.counters.snapshot();
        assert_eq!((c.tx_pkts, c.tx_drop, c.rx_pkts), (0, 1, 0));
    });
}

#[test]
fn a_guest_frame_reaches_the_tap() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-tx");
        let f = frame(
            GUEST_MAC,
            [0xff; 6],
            b"hello from the guest, over virtio-net",
        );
        let total = h.tx_frame(TX_BUFS, &f, [0; VNET_HDR_LEN]);
        // Header and frame split over two descriptors, mid-frame.
        let used = h.send(&[
            Desc::read(TX_BUFS, 20),
            Desc::read(TX_BUFS + 20, total - 20),
        ]);
        assert_eq!(used, 0);
        assert_eq!(h.wire.recv(Duration::from_secs(2)).as_deref(), Some(&f[..]));
        assert_eq!(h.mmio.interrupts(), 1);
        // Counted as Ethernet bytes, without the virtio-net header.
        let c = h.counters.snapshot();
        assert_eq!((c.tx_pkts, c.tx_bytes, c.tx_drop), (1, f.len() as u64, 0));
    });
}

#[test]
fn bad_transmit_chains_are_returned_and_nothing_is_sent() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-txbad");
        let f = frame(GUEST_MAC, [0xff; 6], b"must not be sent");
        let total = h.tx_frame(TX_BUFS, &f, [0; VNET_HDR_LEN]);
        let mut gso = [0u8; VNET_HDR_LEN];
        gso[1] = 1; // VIRTIO_NET_HDR_GSO_TCPV4
        h.tx_frame(TX_BUFS + 0x1000, &f, gso);
        let mut csum = [0u8; VNET_HDR_LEN];
        csum[0] = 1; // VIRTIO_NET_HDR_F_NEEDS_CSUM
        h.tx_frame(TX_BUFS + 0x2000, &f, csum);
        let cases: Vec<Vec<Desc>> = vec![
            vec![
                Desc::read(TX_BUFS, 16),
                Desc::write(TX_BUFS + 16, total - 16),
            ],
            vec![Desc::read(
                TX_BUFS,
                u32::try_from(MIN_FRAME - 1).expect("a frame length"),
            )],
            vec![Desc::read(
                TX_BUFS,
                u32::try_from(MAX_FRAME + 1).expect("a frame length"),
            )],
            vec![Desc::read(TX_BUFS + 0x1000, total)],
            vec![Desc::read(TX_BUFS + 0x2000, total)],
            vec![Desc::read(MEM_SIZE - 10, total)],
            vec![Desc::read(u64::MAX - 20, total)],
        ];
        let refused = cases.len() as u64;
        for c in cases {
            assert_eq!(h.send(&c), 0, "{c:?}");
        }
        assert_eq!(h.wire.recv(Duration::from_millis(300)), None);
        // A good frame still goes out afterwards.
        h.send(&[Desc::read(TX_BUFS, total)]);
        assert_eq!(h.wire.recv(Duration::from_secs(2)).as_deref(), Some(&f[..]));
        let c = h.counters.snapshot();
        assert_eq!((c.tx_drop, c.tx_pkts, c.tx_errs), (refused, 1, 0));
    });
}

#[test]
fn a_frame_from_the_tap_lands_in_a_guest_buffer() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-rx");
        h.post_rx(4, RX_BUF_LEN);
        let f = frame(
            PEER_MAC,
            GUEST_MAC,
            b"hello guest, from the host side of the tap",
        );
        h.wire.send(&f);
        assert_eq!(
            h.next_frame(Duration::from_secs(2)).as_deref(),
            Some(&f[..])
        );
        assert!(h.mmio.interrupts() >= 1);
        // At least this frame (the host may send its own, such as IPv6
        // neighbour discovery, through the tap too).
        let c = h.counters.snapshot();
        assert!(c.rx_pkts >= 1 && c.rx_bytes >= f.len() as u64, "{c:?}");
        assert_eq!(c.tx_pkts, 0);
    });
}

/// CPU time (user + system, in clock ticks) used so far by thread `tid`.
fn thread_cpu_ticks(tid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap();
    // Fields after the parenthesised name; utime and stime are fields 14, 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn frames_wait_without_spinning_while_the_guest_queue_is_full_then_flow_again() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-bp");
        let tid = h.mmio.transport.thread_id().unwrap();
        // 40 frames and no receive buffer at all.
        let frames: Vec<Vec<u8>> = (0..40u8)
            .map(|i| frame(PEER_MAC, GUEST_MAC, &[i; 64]))
            .collect();
        for f in &frames {
            h.wire.send(f);
        }
        let before = thread_cpu_ticks(tid);
        std::thread::sleep(Duration::from_millis(500));
        let spent = thread_cpu_ticks(tid) - before;
        assert!(
            spent <= 5,
            "device thread used {spent} ticks while waiting for buffers"
        );
        assert_eq!(h.rxq.used_idx(), 0);
        // Buffers come back in batches; every frame arrives, in order. A batch that
        // brings no frame at all means frames were lost: fail rather than post
        // buffers forever.
        let mut got = Vec::new();
        while got.len() < frames.len() {
            h.post_rx(8, RX_BUF_LEN);
            let before = got.len();
            for _ in 0..8 {
                match h.next_frame(Duration::from_secs(2)) {
                    Some(f) => got.push(f),
                    None => break,
                }
                if got.len() == frames.len() {
                    break;
                }
            }
            assert!(
                got.len() > before,
                "no frame within 2 s of posting buffers: {} of {} arrived",
                got.len(),
                frames.len()
            );
        }
        assert_eq!(got, frames);
        assert_eq!(h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
    });
}

#[test]
fn bad_receive_chains_are_skipped_and_oversized_frames_dropped() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-rxbad");
        // A device-readable receive buffer, then one too small for the
        // first frame but right for the second.
        h.rxq.add_chain(&[Desc::read(RX_BUFS, RX_BUF_LEN)]);
        h.rxq.add_chain(&[Desc::write(RX_BUFS + 0x1_0000, 30)]);
        h.mmio.notify(u32::from(RX_QUEUE));
        let big = frame(PEER_MAC, GUEST_MAC, &[7; 100]);
        h.wire.send(&big);
        // The readable chain comes back empty.
        let (len, _) = h.next_rx(Duration::from_secs(2)).unwrap();
        assert_eq!(len, 0);
        let small = frame(PEER_MAC, GUEST_MAC, &[9; 4]);
        h.wire.send(&small);
        let (len, bytes) = h.next_rx(Duration::from_secs(2)).unwrap();
        assert_eq!(len, 30);
        assert_eq!(bytes[VNET_HDR_LEN..], small[..]);
        assert_eq!(h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET, 0);
        // The big frame did not fit the buffer that was left.
        assert!(h.counters.snapshot().rx_drop >= 1);
    });
}

#[test]
fn pause_holds_frames_until_resume() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-pause");
        h.post_rx(2, RX_BUF_LEN);
        h.mmio.transport.pause();
        let f = frame(PEER_MAC, GUEST_MAC, b"while paused");
        h.wire.send(&f);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(
            h.rxq.used_idx(),
            0,
            "nothing written to the guest while paused"
        );
        h.mmio.transport.resume();
        assert_eq!(
            h.next_frame(Duration::from_secs(2)).as_deref(),
            Some(&f[..])
        );
    });
}

#[test]
fn reset_stops_receiving_and_the_device_comes_back() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-reset");
        assert!(h.with_net(|n| n.rx.is_some()));
        h.post_rx(2, RX_BUF_LEN);
        h.mmio.set_status(0);
        assert!(h.with_net(|n| n.rx.is_none() && n.watched_fd().is_none()));
        // Nothing reaches the buffers of the reset device; the frame waits
        // in the tap.
        let waiting = frame(PEER_MAC, GUEST_MAC, b"after the reset");
        h.wire.send(&waiting);
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(h.rxq.used_idx(), 0);
        h.rxq = GuestDriver::at(&mem, 16, 0x1000);
        h.txq = GuestDriver::at(&mem, 16, 0x8000);
        h.rx_seen = 0;
        h.rx_posted = 0;
        let (rxq, txq) = (
            GuestDriver::at(&mem, 16, 0x1000),
            GuestDriver::at(&mem, 16, 0x8000),
        );
        h.mmio.bring_up(0, &[&rxq, &txq]);
        h.post_rx(2, RX_BUF_LEN);
        let f = frame(PEER_MAC, GUEST_MAC, b"after bring-up");
        h.wire.send(&f);
        assert_eq!(
            h.next_frame(Duration::from_secs(2)).as_deref(),
            Some(&waiting[..])
        );
        assert_eq!(
            h.next_frame(Duration::from_secs(2)).as_deref(),
            Some(&f[..])
        );
    });
}

#[test]
fn bad_tap_names_and_busy_taps_are_errors() {
    in_new_netns(|| {
        for name in ["", "sixteen-chars-xx", "nul\0name"] {
            assert!(matches!(
                Net::new(name, GUEST_MAC),
                Err(NetError::Tap(TapError::BadName(_)))
            ));
        }
        // A single-queue tap already attached elsewhere cannot be opened twice.
        let first = Net::new("vt-busy", GUEST_MAC).expect("first open");
        let err = Net::new("vt-busy", GUEST_MAC)
            .err()
            .expect("second open must fail");
        assert!(
            matches!(
                err,
                NetError::Tap(TapError::Ioctl {
                    op: "TUNSETIFF",
                    ..
                })
            ),
            "{err}"
        );
        drop(first);
    });
}

impl Harness<'_> {
    /// Runs `f` on the device behind the transport, for white-box checks.
    fn with_net<R>(&self, f: impl FnOnce(&Net) -> R) -> R {
        let dev = self.mmio.transport.device();
        let any: &dyn std::any::Any = &*dev;
        f(any
            .downcast_ref::<Net>()
            .expect("the harness device is a Net"))
    }
}

#[test]
fn a_broken_receive_ring_puts_the_device_in_needs_reset() {
    in_new_netns(|| {
        let mem = test_memory();
        let mut h = Harness::new(&mem, "vt-broken");
        // The driver claims 100 new buffers in a 16-entry ring.
        h.rxq.set_avail_idx(100);
        h.mmio.notify(u32::from(RX_QUEUE));
        h.wire
            .send(&frame(PEER_MAC, GUEST_MAC, b"into a broken ring"));
        let deadline = Instant::now() + Duration::from_secs(2);
        while h.mmio.status() & VIRTIO_CONFIG_S_NEEDS_RESET == 0 {
            assert!(Instant::now() < deadline, "no NEEDS_RESET after a bad ring");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(h.mmio.interrupts() >= 1, "a config interrupt announces it");
        assert_eq!(h.rxq.used_idx(), 0);
        // The device stopped; a reset brings it back.
        assert!(h.with_net(|n| n.rx.is_none()));
        h.mmio.set_status(0);
        let (rxq, txq) = (
            GuestDriver::at(&mem, 16, 0x1000),
            GuestDriver::at(&mem, 16, 0x8000),
        );
        h.rxq = GuestDriver::at(&mem, 16, 0x1000);
        h.txq = GuestDriver::at(&mem, 16, 0x8000);
        h.mmio.bring_up(0, &[&rxq, &txq]);
        h.rx_seen = 0;
        h.rx_posted = 0;
        h.post_rx(1, RX_BUF_LEN);
        let f = frame(PEER_MAC, GUEST_MAC, b"after the reset");
        h.wire.send(&f);
        assert_eq!(
            h.next_frame(Duration::from_secs(2)).as_deref(),
            Some(&f[..])
        );
    });
}

/// A VM restarted after a guest reboot opens the same tap again while the old VM's handle
/// still lives (the launcher keeps it until the new VM runs): closing the device lets go of
/// the tap. Without that the second open fails with EBUSY (a single-queue tap has one
/// opener), the restart fails and the VMI with it.
#[test]
fn a_closed_device_lets_go_of_its_tap() {
    in_new_netns(|| {
        create_tap("vt-close");
        let options = || NetOptions {
            mac: GUEST_MAC,
            mtu: None,
            link_up: true,
        };
        let mut first = Net::with_options("vt-close", options()).expect("the first open");
        let busy = Net::with_options("vt-close", options()).err();
        assert!(
            busy.as_ref()
                .is_some_and(|e| e.to_string().contains("busy")),
            "a second opener of a live tap: {busy:?}"
        );
        first.close();
        let second = Net::with_options("vt-close", options());
        assert!(second.is_ok(), "after close: {:?}", second.err());
        // The closed device serves nothing and fails nothing.
        assert_eq!(first.watched_fd(), None);
        assert!(first.process_fd().is_err());
    });
}
