//! Helpers of the VMM library's tests. Every test here runs real KVM: a
//! machine without a usable /dev/kvm fails them, loudly.

#![allow(dead_code)] // each test binary uses a different subset

use std::sync::Arc;

use vmm::KernelSource;

/// Fails the test unless /dev/kvm can be opened read-write.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!("these tests need a usable /dev/kvm (they never skip): {e}");
    }
}

/// A private temporary directory for one test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vmm-test-")
        .tempdir()
        .expect("cannot create a temp dir")
}

/// The embedded test guest as a kernel.
pub fn test_guest_kernel() -> KernelSource {
    KernelSource::Bytes(Arc::from(test_guest::ELF))
}

/// Runs `qemu-img` (Debian's qemu-utils, a cross-check here) and returns its output.
pub fn qemu_img(args: &[&str]) -> String {
    let out = std::process::Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img is required for this test (Debian package qemu-utils)");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A new qcow2 overlay `name` in `dir` over the raw `base` (a container disk's shape).
pub fn qcow2_overlay(
    dir: &std::path::Path,
    name: &str,
    base: &std::path::Path,
) -> std::path::PathBuf {
    let overlay = dir.join(name);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        "-F",
        "raw",
        overlay.to_str().unwrap(),
    ]);
    overlay
}
