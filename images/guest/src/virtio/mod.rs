//! PLACEHOLDER created by the vmm helper so the guest builds before the
//! virtio checks exist. The virtio helper owns `images/guest/src/virtio/` and
//! replaces this file.
//!
//! Interface the guest's main calls (keep it):
//!   pub fn run_checks(devices: &[(u64 /*base*/, u32 /*irq*/)], cmdline: &[u8],
//!                     r: &mut dyn crate::report::Reporter)
//! Helpers available to it: `crate::report::{Reporter, Detail}`,
//! `crate::cmdline::{value, check_selected, check_named}`,
//! `crate::io::{mmio_read32, mmio_write32, ...}`,
//! `crate::irq::{route, wait, take, sleep_ms}` (IOAPIC pin N -> bounded wait).

use crate::report::Reporter;

/// Runs the virtio checks for these devices (none yet: reports nothing).
pub fn run_checks(devices: &[(u64, u32)], cmdline: &[u8], r: &mut dyn Reporter) {
    let _ = (devices, cmdline, r);
}
