//! A VM's boot milestones, for the boot benchmark.
//!
//! Each milestone keeps the first CLOCK_MONOTONIC time its VM reached it (in nanoseconds,
//! 0 = not yet). One timeline per VM (`VmHandle::timeline`): a launcher that starts a new
//! VM after a reset reports the new VM's times, not the first's. `vmm run` prints its VM's
//! on stderr when the environment has `VMM_TIMINGS=1`, so a harness can subtract its own
//! CLOCK_MONOTONIC reading taken just before it started the process.

use std::sync::atomic::{AtomicU64, Ordering};

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

/// The milestones of one VM.
#[derive(Debug, Default)]
pub struct BootTimeline {
    first_kvm_run: AtomicU64,
    first_serial_byte: AtomicU64,
    vm_exit: AtomicU64,
}

fn mark(slot: &AtomicU64) {
    if slot.load(Ordering::Relaxed) == 0 {
        let _ = slot.compare_exchange(0, monotonic_ns(), Ordering::Relaxed, Ordering::Relaxed);
    }
}

impl BootTimeline {
    pub(crate) fn mark_first_kvm_run(&self) {
        mark(&self.first_kvm_run);
    }

    pub(crate) fn mark_first_serial_byte(&self) {
        mark(&self.first_serial_byte);
    }

    pub(crate) fn mark_vm_exit(&self) {
        mark(&self.vm_exit);
    }

    /// `VMM_TIMING first_kvm_run_ns=.. first_serial_byte_ns=.. vm_exit_ns=..`
    pub fn report_line(&self) -> String {
        format!(
            "VMM_TIMING first_kvm_run_ns={} first_serial_byte_ns={} vm_exit_ns={}",
            self.first_kvm_run.load(Ordering::Relaxed),
            self.first_serial_byte.load(Ordering::Relaxed),
            self.vm_exit.load(Ordering::Relaxed)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::BootTimeline;

    #[test]
    fn each_milestone_keeps_its_first_time_and_timelines_are_apart() {
        let first = BootTimeline::default();
        let second = BootTimeline::default();
        assert_eq!(
            first.report_line(),
            "VMM_TIMING first_kvm_run_ns=0 first_serial_byte_ns=0 vm_exit_ns=0"
        );
        first.mark_first_kvm_run();
        let line = first.report_line();
        first.mark_first_kvm_run();
        assert_eq!(first.report_line(), line, "the first time is kept");
        assert!(!line.contains("first_kvm_run_ns=0 "), "{line}");
        assert_eq!(
            second.report_line(),
            "VMM_TIMING first_kvm_run_ns=0 first_serial_byte_ns=0 vm_exit_ns=0",
            "another VM's timeline is its own"
        );
    }
}
