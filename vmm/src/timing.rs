//! Timestamps of boot milestones, for the boot benchmark.
//!
//! Each milestone keeps the first CLOCK_MONOTONIC time it was reached (in
//! nanoseconds, 0 = not yet). `vmm run` prints them on stderr when the
//! environment has `VMM_TIMINGS=1`, so a harness can subtract its own
//! CLOCK_MONOTONIC reading taken just before it started the process.

use std::sync::atomic::{AtomicU64, Ordering};

static FIRST_KVM_RUN: AtomicU64 = AtomicU64::new(0);
static FIRST_SERIAL_BYTE: AtomicU64 = AtomicU64::new(0);
static VM_EXIT: AtomicU64 = AtomicU64::new(0);

/// CLOCK_MONOTONIC in nanoseconds.
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec
        .cast_unsigned()
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec.cast_unsigned())
}

fn mark(slot: &AtomicU64) {
    if slot.load(Ordering::Relaxed) == 0 {
        let _ = slot.compare_exchange(0, monotonic_ns(), Ordering::Relaxed, Ordering::Relaxed);
    }
}

pub(crate) fn mark_first_kvm_run() {
    mark(&FIRST_KVM_RUN);
}

pub(crate) fn mark_first_serial_byte() {
    mark(&FIRST_SERIAL_BYTE);
}

pub(crate) fn mark_vm_exit() {
    mark(&VM_EXIT);
}

/// `VMM_TIMING first_kvm_run_ns=.. first_serial_byte_ns=.. vm_exit_ns=..`
pub fn report_line() -> String {
    format!(
        "VMM_TIMING first_kvm_run_ns={} first_serial_byte_ns={} vm_exit_ns={}",
        FIRST_KVM_RUN.load(Ordering::Relaxed),
        FIRST_SERIAL_BYTE.load(Ordering::Relaxed),
        VM_EXIT.load(Ordering::Relaxed)
    )
}
