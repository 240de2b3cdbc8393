//! virtio-net end to end: `vmm run --net tap=...` inside a private network
//! namespace; the test reads the guest's frame off the tap with a packet
//! socket and answers with a frame of its own, which the guest reports.
//!
//! Needs root (tap devices, network namespaces): fails, never skips, without.

mod common;

use common::*;
use std::os::fd::AsRawFd;
use std::process::{Command, Output};
use std::time::Duration;
use virtio_devices::net::test_tap::{Wire, create_tap, frame as test_frame, ifreq, in_new_netns};

/// The guest's frames (images/guest/src/virtio/net.rs).
const GUEST_PAYLOAD: &[u8] = b"hello from the test guest";
const HOST_PAYLOAD: &[u8] = b"hello guest, this is the host";
const MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0x01];
const MAC_ARG: &str = "52:54:00:aa:bb:01";
const HOST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xfe];

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

        wire.send(&test_frame(HOST_MAC, MAC, HOST_PAYLOAD));

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
        let guest_mac: [u8; 6] = frame[6..12].try_into().unwrap();
        wire.send(&test_frame(HOST_MAC, guest_mac, HOST_PAYLOAD));
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
        ifr.ifr_ifru.ifru_flags = libc::c_short::try_from(libc::IFF_TAP | libc::IFF_NO_PI)
            .expect("the tap flags fit a short");
        assert_eq!(
            // SAFETY: valid fd and ifreq.
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
