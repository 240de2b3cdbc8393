//! Getting a vCPU thread out of `KVM_RUN`.
//!
//! With the in-kernel irqchip a halted vCPU sleeps inside `KVM_RUN`, so
//! pausing or stopping the VM needs a signal. The handler also sets the
//! thread's `kvm_run.immediate_exit`, which closes the race where the signal
//! lands just before the thread enters `KVM_RUN` (it then returns at once
//! with EINTR instead of sleeping).

use std::cell::Cell;
use std::sync::OnceLock;

use kvm_bindings::kvm_run;
use kvm_ioctls::VcpuFd;
use vmm_sys_util::signal::{SIGRTMIN, register_signal_handler};

thread_local! {
    /// This thread's vCPU `kvm_run` page, or null.
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

/// The signal used to kick vCPU threads.
pub(crate) fn signal_number() -> libc::c_int {
    SIGRTMIN()
}

extern "C" fn on_kick(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // Only touches this thread's own const-initialised TLS slot and the
    // mapped kvm_run page: async-signal-safe.
    let run = KVM_RUN.with(|slot| slot.get());
    if !run.is_null() {
        // SAFETY: the pointer is this thread's vCPU kvm_run mapping,
        // registered by `register_current` and cleared before the VcpuFd is
        // dropped.
        unsafe { std::ptr::write_volatile(&mut (*run).immediate_exit, 1) };
    }
}

/// Installs the kick signal handler (once per process).
pub(crate) fn install_handler() -> std::io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| register_signal_handler(signal_number(), on_kick).map_err(|e| e.errno()))
        .map_err(std::io::Error::from_raw_os_error)
}

/// Makes kicks of this thread set `immediate_exit` on `vcpu`.
pub(crate) fn register_current(vcpu: &mut VcpuFd) {
    let run: *mut kvm_run = vcpu.get_kvm_run();
    KVM_RUN.with(|slot| slot.set(run));
}

/// Forgets this thread's vCPU (before its VcpuFd goes away).
pub(crate) fn unregister_current() {
    KVM_RUN.with(|slot| slot.set(std::ptr::null_mut()));
}

/// Sends the kick signal to a thread. The thread must not have been joined.
pub(crate) fn kick(thread: libc::pthread_t) {
    // SAFETY: the caller guarantees the thread id is still valid (not joined).
    let rc = unsafe { libc::pthread_kill(thread, signal_number()) };
    if rc != 0 {
        tracing::warn!(
            "kicking vCPU thread failed: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
}
