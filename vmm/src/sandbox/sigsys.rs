//! What a trapped system call does: the SIGSYS handler names the call and
//! ends the process with status 159 (128 + SIGSYS, as a shell reports a
//! death by SIGSYS), as Firecracker's handler ends its process. Ending the
//! process, not the thread: a VMM missing a vCPU or device thread would
//! hang the guest.
//!
//! The handler runs on the offending thread, under its filter: it only
//! writes to stderr and calls `exit_group`, which every filter allows.

use std::cell::Cell;
use std::io;
use std::sync::OnceLock;

thread_local! {
    /// The sandbox this thread entered (`ThreadKind` as a name), for the
    /// report; empty for a thread outside the VMM (the launcher's).
    static KIND: Cell<&'static str> = const { Cell::new("") };
}

/// Records which sandbox the calling thread is in, for a trapped call's report.
pub(super) fn set_thread_kind(name: &'static str) {
    KIND.with(|k| k.set(name));
}

/// Process exit status after a trapped system call.
pub(crate) const SIGSYS_EXIT_STATUS: i32 = 128 + libc::SIGSYS;

/// `si_code` of a SIGSYS sent by seccomp.
const SYS_SECCOMP: i32 = 1;

extern "C" fn on_sigsys(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    const PREFIX: &[u8] = b"vmm: a forbidden system call (seccomp) on a ";
    const MIDDLE: &[u8] = b" thread: number ";
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, syscall) = unsafe {
        let info = &*info;
        // `si_syscall` follows `si_call_addr` in the SIGSYS union member:
        // byte offset 24 of siginfo_t on 64-bit Linux (libc does not expose
        // it; Firecracker reads it the same way).
        let raw = (info as *const libc::siginfo_t).cast::<u8>();
        (info.si_code, raw.add(24).cast::<i32>().read_unaligned())
    };
    if code == SYS_SECCOMP {
        // Formatted by hand into a stack buffer: no allocation here. The
        // kind is a const-initialised thread-local: no allocation either.
        let kind = KIND.with(|k| k.get());
        let kind = if kind.is_empty() {
            "launcher/main"
        } else {
            kind
        };
        let mut msg = [0u8; 160];
        let mut at = 0;
        for part in [PREFIX, kind.as_bytes(), MIDDLE] {
            let n = part.len().min(msg.len() - 12 - at);
            msg[at..at + n].copy_from_slice(&part[..n]);
            at += n;
        }
        let mut digits = [0u8; 10];
        let mut n = syscall.unsigned_abs();
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 || len == digits.len() {
                break;
            }
        }
        for i in 0..len {
            msg[at + i] = digits[len - 1 - i];
        }
        msg[at + len] = b'\n';
        // SAFETY: write(2) is async-signal-safe; the buffer outlives it.
        unsafe {
            libc::write(2, msg.as_ptr().cast(), at + len + 1);
        }
    }
    // SAFETY: _exit(2) is async-signal-safe.
    unsafe { libc::_exit(SIGSYS_EXIT_STATUS) };
}

/// Installs the handler (once per process).
pub(super) fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    let installed: &Result<(), i32> = INSTALLED.get_or_init(|| {
        // SAFETY: a zeroed sigaction with our handler; sigemptyset
        // initialises the mask before use.
        unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_sigsys as *const () as usize;
            action.sa_flags = libc::SA_SIGINFO;
            libc::sigemptyset(&mut action.sa_mask);
            if libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
        }
        Ok(())
    });
    installed.map_err(io::Error::from_raw_os_error)
}
