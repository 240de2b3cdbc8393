//! `vmm run` and `vmm selftest` with virtio devices, checked against the host
//! side: the bytes in the disk files (raw read directly, qcow2 through
//! qemu-img), and the selftest's tap in a private network namespace.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

/// Where and what the guest's block check writes (images/guest/src/virtio/blk.rs).
const TEST_SECTOR: usize = 1;
const MAGIC: &[u8] = b"virtio-blk-test\n";

fn pattern(i: usize) -> u8 {
    MAGIC
        .get(i)
        .copied()
        .unwrap_or(i.to_le_bytes()[0].wrapping_mul(31) ^ 0x5a)
}

fn assert_sector_has_pattern(image: &[u8]) {
    let sector = &image[TEST_SECTOR * 512..TEST_SECTOR * 512 + 512];
    let expected: Vec<u8> = (0..512).map(pattern).collect();
    assert_eq!(
        sector,
        &expected[..],
        "sector {TEST_SECTOR} does not hold the guest's pattern"
    );
}

fn qemu_img(args: &[&str]) -> std::process::Output {
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img is needed (Debian package qemu-utils)");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn raw_disk(dir: &Path, name: &str, bytes: u64) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::File::create(&path)
        .unwrap()
        .set_len(bytes)
        .unwrap();
    path
}

#[test]
fn every_disk_kind_and_the_rng_work_through_vmm_run() {
    let dir = tempdir();
    let raw = raw_disk(dir.path(), "rw.raw", 1 << 20);
    let qcow2 = dir.path().join("rw.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", qcow2.to_str().unwrap(), "2M"]);
    let ro = raw_disk(dir.path(), "ro.raw", 1 << 20);

    let out = run_guest(&[
        "--vcpus",
        "2",
        "--disk",
        &format!("path={},format=raw", raw.display()),
        "--disk",
        &format!("path={},format=qcow2", qcow2.display()),
        "--disk",
        &format!("path={},format=raw,readonly=on", ro.display()),
        "--rng",
        "--cmdline",
        "exit=poweroff",
    ]);
    let text = stdout(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{text}\nstderr:\n{}",
        stderr(&out)
    );
    for check in [
        "virtio-blk-write",
        "virtio-blk-irq",
        "virtio-blk-flush",
        "virtio-blk-read",
        "virtio-blk-bounds",
        "virtio-blk1-write",
        "virtio-blk1-read",
        "virtio-blk2-ro",
        "virtio-rng-read",
    ] {
        assert_pass(&out, check);
    }
    assert!(
        text.contains("TEST virtio-blk-write PASS sector=1 capacity=2048"),
        "{text}"
    );
    assert!(
        text.contains("TEST virtio-blk1-write PASS sector=1 capacity=4096"),
        "{text}"
    );

    assert_sector_has_pattern(&std::fs::read(&raw).unwrap());
    // The qcow2 image is still consistent and holds the data.
    qemu_img(&["check", "-q", qcow2.to_str().unwrap()]);
    let converted = dir.path().join("converted.raw");
    qemu_img(&[
        "convert",
        "-O",
        "raw",
        qcow2.to_str().unwrap(),
        converted.to_str().unwrap(),
    ]);
    assert_sector_has_pattern(&std::fs::read(&converted).unwrap());
    // The read-only disk was not written.
    assert!(
        std::fs::read(&ro).unwrap().iter().all(|&b| b == 0),
        "the read-only disk changed"
    );
}

#[test]
fn a_qcow2_file_given_as_raw_stays_raw() {
    // The format comes from the command line only: a raw disk whose content
    // looks like qcow2 (as a guest could write it) is not interpreted.
    let dir = tempdir();
    let image = dir.path().join("looks-like.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        image.to_str().unwrap(),
        "64M",
    ]);
    let before = std::fs::read(&image).unwrap();
    let out = run_guest(&[
        "--disk",
        &format!("path={},format=raw", image.display()),
        "--cmdline",
        "checks=virtio-blk",
    ]);
    let sectors = before.len() / 512;
    assert!(
        stdout(&out).contains(&format!(
            "TEST virtio-blk-write PASS sector=1 capacity={sectors}"
        )),
        "the guest did not see the file as {sectors} raw sectors:\n{}",
        stdout(&out)
    );
    let after = std::fs::read(&image).unwrap();
    assert_eq!(
        &after[..512],
        &before[..512],
        "the qcow2 header in sector 0 changed"
    );
    assert_sector_has_pattern(&after);
}

#[test]
fn a_missing_disk_is_a_clear_error() {
    let out = run_guest(&["--disk", "path=/nonexistent/disk.raw,format=raw"]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("disk /nonexistent/disk.raw"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_corrupt_qcow2_disk_is_refused() {
    let dir = tempdir();
    let bad = dir.path().join("bad.qcow2");
    let mut bytes = b"QFI\xfb".to_vec();
    bytes.resize(4096, 0xee);
    std::fs::write(&bad, bytes).unwrap();
    let out = run_guest(&["--disk", &format!("path={},format=qcow2", bad.display())]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(stderr(&out).contains("bad.qcow2"), "{}", stderr(&out));
}

#[test]
fn selftest_passes_with_every_device() {
    assert_eq!(
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() },
        0,
        "the selftest test needs root (private network namespace and tap)"
    );
    let mut cmd = vmm();
    cmd.arg("selftest");
    let out = run_with_timeout(cmd, std::time::Duration::from_secs(120));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    for line in [
        "PASS smp cpus=2",
        "PASS virtio-blk-write",
        "PASS virtio-net-tx",
        "PASS virtio-net-rx len=33 payload=hello from the host",
        "PASS virtio-rng-read",
        "PASS host-disk-contents",
        "PASS host-net-rx",
        "PASS vm-exit guest power-off with exit code 0",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(line)),
            "no {line:?} in:\n{text}"
        );
    }
    assert!(!text.contains("FAIL") && !text.contains("SKIP"), "{text}");
}
