//! A tap in a private network namespace with a packet socket on its far
//! end: what the virtio-net tests here and the VMM's end-to-end network
//! tests use (with the `testing` feature only). Needs root; fails, never
//! skips, without it.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

/// IEEE 802 local experimental ethertype: nothing else on the tap uses it.
/// The test guest sends and expects it too.
pub(crate) const TEST_ETHERTYPE: u16 = 0x88b5;

/// A frame from `src` to `dst` with the test ethertype.
pub fn frame(src: [u8; 6], dst: [u8; 6], payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&TEST_ETHERTYPE.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

pub(crate) fn require_root() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "virtio-net tests need root: they create tap devices in private network namespaces"
    );
}

/// Runs `f` on a thread of its own inside a new network namespace (only
/// that thread moves; the namespace goes away with its last user).
pub fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    require_root();
    std::thread::spawn(move || {
        // SAFETY: unshare affects only the calling thread's namespaces.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            io::Error::last_os_error()
        );
        // No IPv6 autoconfiguration chatter on the tap (router
        // solicitations would show up as received frames). /proc/sys/net
        // follows the calling thread's namespace.
        for knob in ["all", "default"] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1");
        }
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// An `ifreq` naming interface `name`, for the tap and interface ioctls.
pub fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = libc::c_char::from_ne_bytes([*s]);
    }
    ifr
}

/// Creates persistent tap `name` and sets it up, as netsetup leaves a tap
/// for the launcher.
pub fn create_tap(name: &str) {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("open /dev/net/tun");
    let mut ifr = ifreq(name);
    ifr.ifr_ifru.ifru_flags = const { int_cast::c_short_of_c_int(libc::IFF_TAP | libc::IFF_NO_PI) };
    // SAFETY: valid fd and ifreq for the duration of the calls.
    unsafe {
        assert_eq!(
            libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut ifr),
            0,
            "TUNSETIFF"
        );
        assert_eq!(
            libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong),
            0
        );
    }
    drop(tun);
    super::host_link::set_up(name).unwrap_or_else(|e| panic!("set {name} up: {e}"));
}

/// An AF_PACKET socket on the tap: the far end of the wire.
///
/// Frames it sends skip the tap's queueing discipline (`PACKET_QDISC_BYPASS`) and go
/// straight to the tap driver, which queues them for the tap's reader. Through the
/// qdisc they could be lost without a trace: until the kernel's link watcher has run
/// for the carrier the reader's attach turned on (deferred work that waits for the
/// RTNL lock, which other tests' namespaces hold for long stretches on a loaded
/// machine), the tap's transmit queue still has the `noop` qdisc, which drops every
/// frame while `send` reports success. `IFF_RUNNING` is no sign that it is over: a
/// fresh tap whose link events were not yet handled reports operstate "unknown", which
/// counts as running. Seen in the tests: all 40 frames of a burst counted in the tap's
/// `tx_dropped`, none in its `pfifo_fast` qdisc. Without the qdisc a frame is either
/// queued in the tap or `send` fails (no carrier, tap queue full), so a loss cannot
/// go unnoticed.
pub struct Wire {
    fd: OwnedFd,
}

impl Wire {
    pub fn bind(name: &str) -> Wire {
        let fd = super::host_link::packet_socket(name, super::host_link::ALL_FRAMES)
            .unwrap_or_else(|e| panic!("packet socket on {name}: {e}"));
        let on: libc::c_int = 1;
        // SAFETY: an int option read from `on`, which outlives the call.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_PACKET,
                libc::PACKET_QDISC_BYPASS,
                (&on as *const libc::c_int).cast(),
                const { int_cast::u32_of_usize(std::mem::size_of::<libc::c_int>()) },
            )
        };
        assert_eq!(
            rc,
            0,
            "PACKET_QDISC_BYPASS on {name}: {}",
            io::Error::last_os_error()
        );
        Wire { fd }
    }

    pub fn send(&self, frame: &[u8]) {
        // SAFETY: sends frame.len() bytes from frame.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n,
            isize::try_from(frame.len()).expect("a test frame is small"),
            "send: {}",
            io::Error::last_os_error()
        );
    }

    /// Next incoming frame with our ethertype, sent by the tap's reader (the
    /// guest), within `timeout`.
    pub fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 70000];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let mut pfd = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe {
                libc::poll(
                    &mut pfd,
                    1,
                    i32::try_from(left.as_millis()).unwrap_or(i32::MAX - 1) + 1,
                )
            } <= 0
            {
                continue;
            }
            // SAFETY: sockaddr_ll is plain old data.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len =
                const { int_cast::u32_of_usize(std::mem::size_of::<libc::sockaddr_ll>()) };
            // SAFETY: buffers valid for the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n < 14 || from.sll_pkttype == libc::PACKET_OUTGOING {
                continue;
            }
            // At least 14: checked just above.
            let frame = &buf[..n.cast_unsigned()];
            if frame[12..14] == TEST_ETHERTYPE.to_be_bytes() {
                return Some(frame.to_vec());
            }
        }
    }
}
