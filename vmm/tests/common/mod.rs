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
