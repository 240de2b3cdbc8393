//! virtio-net end to end: `vmm run --net tap=...` inside a private network
//! namespace; the test reads the guest's frame off the tap with a packet
//! socket and answers with a frame of its own, which the guest reports.
//!
//! Needs root (tap devices, network namespaces): fails, never skips, without.

mod common;

use common::*;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The guest's frames (images/guest/src/virtio/net.rs).
const ETHERTYPE: u16 = 0x88b5;
const GUEST_PAYLOAD: &[u8] = b"hello from the test guest";
const HOST_PAYLOAD: &[u8] = b"hello guest, this is the host";
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0x01];
const MAC_ARG: &str = "52:54:00:aa:bb:01";
const HOST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xfe];

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "virtio-net tests need root: they create a tap in a private network namespace"
    );
}

/// Runs `f` on a new thread that has its own network namespace; processes
/// and threads it starts inherit it.
fn in_new_netns<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    require_root();
    std::thread::spawn(move || {
        // SAFETY: unshare changes only the calling thread.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        assert_eq!(
            rc,
            0,
            "unshare(CLONE_NEWNET): {}",
            io::Error::last_os_error()
        );
        // Keep IPv6 autoconfiguration frames off the tap.
        for knob in ["all", "default"] {
            let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1");
        }
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

fn ifreq(name: &str) -> libc::ifreq {
    // SAFETY: ifreq is plain old data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    ifr
}

/// A persistent tap, up, like netsetup leaves it for the launcher.
fn create_tap(name: &str) {
    let tun = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .expect("open /dev/net/tun");
    let mut ifr = ifreq(name);
    ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: valid fd and ifreq for the calls.
    unsafe {
        assert_eq!(libc::ioctl(tun.as_raw_fd(), libc::TUNSETIFF, &mut ifr), 0);
        assert_eq!(
            libc::ioctl(tun.as_raw_fd(), libc::TUNSETPERSIST, 1 as libc::c_ulong),
            0
        );
    }
    drop(tun);
    // SAFETY: a datagram socket for interface ioctls.
    let sock = unsafe { OwnedFd::from_raw_fd(libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0)) };
    let mut ifr = ifreq(name);
    // SAFETY: valid fd and ifreq.
    unsafe {
        assert_eq!(
            libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr),
            0
        );
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(
            libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &mut ifr),
            0
        );
    }
}

/// A packet socket bound to the tap: the host end of the guest's wire.
struct Wire(OwnedFd);

impl Wire {
    fn bind(name: &str) -> Wire {
        let proto = (libc::ETH_P_ALL as u16).to_be();
        // SAFETY: creating a socket.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, i32::from(proto)) };
        assert!(raw >= 0, "packet socket: {}", io::Error::last_os_error());
        // SAFETY: a fresh fd we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let cname = std::ffi::CString::new(name).unwrap();
        // SAFETY: valid C string.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        assert_ne!(index, 0);
        // SAFETY: plain old data.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        // SAFETY: addr is a sockaddr_ll of the size given.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            )
        };
        assert_eq!(rc, 0, "bind: {}", io::Error::last_os_error());
        Wire(fd)
    }

    fn send(&self, frame: &[u8]) {
        // SAFETY: frame is valid for its length.
        let n = unsafe { libc::send(self.0.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        assert_eq!(
            n,
            frame.len() as isize,
            "send: {}",
            io::Error::last_os_error()
        );
    }

    /// The next frame with the test ethertype coming from the guest.
    fn recv(&self, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 70000];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let mut pfd = libc::pollfd {
                fd: self.0.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut pfd, 1, left.as_millis() as i32 + 1) } <= 0 {
                continue;
            }
            // SAFETY: plain old data.
            let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
            let mut from_len = std::mem::size_of::<libc::sockaddr_ll>() as u32;
            // SAFETY: buffers valid for the sizes given.
            let n = unsafe {
                libc::recvfrom(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                    (&mut from as *mut libc::sockaddr_ll).cast(),
                    &mut from_len,
                )
            };
            if n >= 14
                && from.sll_pkttype != libc::PACKET_OUTGOING
                && buf[12..14] == ETHERTYPE.to_be_bytes()
            {
                return Some(buf[..n as usize].to_vec());
            }
        }
    }
}

/// Starts `vmm run` (in the caller's namespace) on a thread of its own.
fn spawn_vmm(args: Vec<String>) -> std::thread::JoinHandle<Output> {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let mut cmd: Command = vmm();
    cmd.arg("run").arg("--kernel").arg(&kernel).args(&args);
    std::thread::spawn(move || {
        let out = run_with_timeout(cmd, Duration::from_secs(120));
        drop(dir);
        out
    })
}

#[test]
fn the_guest_sends_a_frame_and_receives_the_answer() {
    in_new_netns(|| {
        create_tap("vmm-net0");
        let wire = Wire::bind("vmm-net0");
        let vmm = spawn_vmm(vec![
            "--cmdline".into(),
            "checks=virtio-net exit=poweroff net.rx_ms=20000".into(),
            "--net".into(),
            format!("tap=vmm-net0,mac={MAC_ARG}"),
        ]);
        let frame = wire
            .recv(Duration::from_secs(60))
            .expect("no frame from the guest on the tap");
        assert_eq!(frame[..6], [0xff; 6], "broadcast destination");
        assert_eq!(frame[6..12], MAC, "the configured MAC is the source");
        assert_eq!(&frame[14..], GUEST_PAYLOAD);

        let mut answer = Vec::new();
        answer.extend_from_slice(&MAC);
        answer.extend_from_slice(&HOST_MAC);
        answer.extend_from_slice(&ETHERTYPE.to_be_bytes());
        answer.extend_from_slice(HOST_PAYLOAD);
        wire.send(&answer);

        let out = vmm.join().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "stdout:\n{}\nstderr:\n{}",
            stdout(&out),
            stderr(&out)
        );
        assert_pass(&out, "virtio-net-tx");
        assert_pass(&out, "virtio-net-rx");
        let text = stdout(&out);
        assert!(text.contains(&format!("mac={MAC_ARG}")), "{text}");
        let rx = text
            .lines()
            .find(|l| l.starts_with("TEST virtio-net-rx"))
            .unwrap();
        assert!(
            rx.contains(&format!(
                "payload={}",
                String::from_utf8_lossy(HOST_PAYLOAD)
            )),
            "{rx}"
        );
    });
}

#[test]
fn every_device_at_once() {
    in_new_netns(|| {
        create_tap("vmm-all");
        let wire = Wire::bind("vmm-all");
        let dir = tempdir();
        let disk = dir.path().join("disk.raw");
        std::fs::write(&disk, vec![0u8; 256 * 1024]).unwrap();
        let vmm = spawn_vmm(vec![
            "--cmdline".into(),
            "exit=poweroff net.rx_ms=20000".into(),
            "--disk".into(),
            format!("path={},format=raw", disk.display()),
            "--net".into(),
            format!("tap=vmm-all,mac={MAC_ARG}"),
            "--rng".into(),
        ]);
        let frame = wire.recv(Duration::from_secs(60)).expect("guest frame");
        let mut answer = frame[6..12].to_vec();
        answer.extend_from_slice(&HOST_MAC);
        answer.extend_from_slice(&ETHERTYPE.to_be_bytes());
        answer.extend_from_slice(HOST_PAYLOAD);
        wire.send(&answer);
        let out = vmm.join().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}\n{}",
            stdout(&out),
            stderr(&out)
        );
        for check in [
            "virtio-blk-write",
            "virtio-blk-read",
            "virtio-net-tx",
            "virtio-net-rx",
            "virtio-rng-read",
        ] {
            assert_pass(&out, check);
        }
        assert!(!stdout(&out).contains(" FAIL"), "{}", stdout(&out));
        let bytes = std::fs::read(&disk).unwrap();
        assert_eq!(&bytes[512..528], b"virtio-blk-test\n");
    });
}

#[test]
fn without_an_answer_the_receive_check_fails_and_says_so() {
    in_new_netns(|| {
        create_tap("vmm-net1");
        let vmm = spawn_vmm(vec![
            "--cmdline".into(),
            "checks=virtio-net exit=poweroff net.rx_ms=300".into(),
            "--net".into(),
            "tap=vmm-net1".into(),
        ]);
        let out = vmm.join().unwrap();
        assert_ne!(out.status.code(), Some(0), "a failed check fails the run");
        assert_pass(&out, "virtio-net-tx");
        assert!(
            stdout(&out).contains("TEST virtio-net-rx FAIL no frame within 300 ms"),
            "{}",
            stdout(&out)
        );
    });
}

#[test]
fn a_tap_that_cannot_be_opened_is_a_vmm_error_not_a_guest_failure() {
    in_new_netns(|| {
        // Attached (single queue) by someone else: TUNSETIFF answers EBUSY.
        let holder = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .unwrap();
        let mut ifr = ifreq("vmm-busy");
        ifr.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: valid fd and ifreq.
        assert_eq!(
            unsafe { libc::ioctl(holder.as_raw_fd(), libc::TUNSETIFF, &mut ifr) },
            0
        );
        let out = spawn_vmm(vec!["--net".into(), "tap=vmm-busy".into()])
            .join()
            .unwrap();
        assert_eq!(out.status.code(), Some(126), "stderr:\n{}", stderr(&out));
        assert!(stderr(&out).contains("vmm-busy"), "{}", stderr(&out));
        assert!(!stdout(&out).contains("BOOT"), "the guest never starts");
        drop(holder);
    });
}
