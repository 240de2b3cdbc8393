//! The host end of the selftest's network check: a tap in a private network
//! namespace and a raw packet socket on it, which sends the guest a frame and
//! watches for the guest's frame.
//!
//! The tap comes from netsetup; the packet socket is a few libc calls (no
//! crate in our set wraps AF_PACKET).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

/// Ethertype of the test frames (IEEE 802 local experimental), as the guest uses.
pub(crate) const ETHERTYPE: u16 = 0x88b5;
/// What the guest sends (images/guest/src/virtio/net.rs `TX_PAYLOAD`).
pub(crate) const GUEST_PAYLOAD: &[u8] = b"hello from the test guest";
/// What the host sends the guest.
pub(crate) const HOST_PAYLOAD: &[u8] = b"hello from the host";
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const SEND_EVERY: Duration = Duration::from_millis(200);

/// Moves this thread (and every thread it starts later) into a new, empty
/// network namespace. Needs CAP_SYS_ADMIN.
pub(crate) fn enter_private_netns() -> io::Result<()> {
    // SAFETY: unshare takes only flags.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Turns off IPv6 on the link (no router solicitations for the guest to
/// wade through) and brings it up (netsetup's link API is async rtnetlink;
/// one ioctl does it here).
pub(crate) fn prepare_link(name: &str) -> io::Result<()> {
    let sysctl = format!("/proc/sys/net/ipv6/conf/{name}/disable_ipv6");
    // No IPv6 in this kernel is fine too.
    let _ = std::fs::write(sysctl, "1");
    virtio_devices::net::host_link::set_up(name)
}

/// A raw socket on one link, for frames of [`ETHERTYPE`] only.
struct PacketSocket {
    fd: OwnedFd,
}

impl PacketSocket {
    fn bind(name: &str) -> io::Result<Self> {
        let fd = virtio_devices::net::host_link::packet_socket(name, ETHERTYPE)?;
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        let len = libc::socklen_t::try_from(std::mem::size_of::<libc::timeval>())
            .map_err(io::Error::other)?;
        // SAFETY: SO_RCVTIMEO takes a timeval of this size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::from_ref(&timeout).cast::<libc::c_void>(),
                len,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(PacketSocket { fd })
    }

    fn send(&self, frame: &[u8]) -> io::Result<()> {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    }

    /// One frame, or None after the receive timeout.
    fn recv(&self, buf: &mut [u8]) -> Option<usize> {
        // SAFETY: the buffer is valid and writable for its length.
        let n = unsafe { libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        usize::try_from(n).ok()
    }
}

fn host_frame() -> Vec<u8> {
    let mut frame = vec![0xff; 6];
    frame.extend_from_slice(&HOST_MAC);
    frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
    frame.extend_from_slice(HOST_PAYLOAD);
    frame
}

/// Whether a frame is the guest's test frame.
pub(crate) fn is_guest_frame(frame: &[u8]) -> bool {
    frame.len() >= 14 + GUEST_PAYLOAD.len()
        && frame[12..14] == ETHERTYPE.to_be_bytes()
        && &frame[14..14 + GUEST_PAYLOAD.len()] == GUEST_PAYLOAD
}

/// Sends the guest a frame every 200 ms and records whether the guest's
/// frame arrived, until stopped.
pub(crate) struct Peer {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<bool>,
}

impl Peer {
    pub(crate) fn start(link: &str) -> io::Result<Peer> {
        let socket = PacketSocket::bind(link)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop_t = stop.clone();
        let thread = std::thread::Builder::new()
            .name("selftest-net".into())
            .spawn(move || {
                let frame = host_frame();
                let mut buf = [0u8; 2048];
                let mut seen_guest = false;
                let mut last_send = std::time::Instant::now() - SEND_EVERY;
                while !stop_t.load(Ordering::SeqCst) {
                    if last_send.elapsed() >= SEND_EVERY {
                        if let Err(e) = socket.send(&frame) {
                            tracing::debug!("selftest: sending a frame to the guest failed: {e}");
                        }
                        last_send = std::time::Instant::now();
                    }
                    if let Some(n) = socket.recv(&mut buf) {
                        seen_guest |= is_guest_frame(&buf[..n]);
                    }
                }
                seen_guest
            })?;
        Ok(Peer { stop, thread })
    }

    /// Stops; returns whether the guest's frame arrived.
    pub(crate) fn finish(self) -> bool {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_guest_test_frame_is_recognised() {
        let mut frame = vec![0xff; 6];
        frame.extend_from_slice(&[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        frame.extend_from_slice(&ETHERTYPE.to_be_bytes());
        frame.extend_from_slice(GUEST_PAYLOAD);
        assert!(is_guest_frame(&frame));
        assert!(!is_guest_frame(&frame[..frame.len() - 1]));
        assert!(!is_guest_frame(&host_frame()));
        let mut other = frame.clone();
        other[12] = 0x08;
        assert!(!is_guest_frame(&other));
        assert!(!is_guest_frame(&[]));
    }
}
