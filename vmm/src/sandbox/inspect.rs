//! Reading a running thread's seccomp filters back, for tests that check a
//! VMM's threads from outside (`vmm run`'s and the launcher's): which
//! programs each thread runs under, to compare with the programs the VMM
//! builds for that process ([`programs_for_process`]). `/proc` shows only
//! how many (`Seccomp_filters:`), which a thread missing its allowlist but
//! holding another filter also passes.
//!
//! `PTRACE_SECCOMP_GET_FILTER` (Linux 4.4, `CONFIG_CHECKPOINT_RESTORE`):
//! the caller needs `CAP_SYS_ADMIN` and no seccomp filter of its own, and
//! the thread must be in a ptrace stop. The thread is seized, interrupted
//! for the moment of the reads and let go; a signal that arrived meanwhile
//! is delivered on release (a vCPU kick is not lost).

use std::collections::HashMap;
use std::io;

use seccompiler::{BpfProgram, sock_filter};

use super::{Sandbox, SandboxConfig, SandboxError, SeccompMode, ThreadKind, filters};

/// The programs the VMM's sandbox builds for one process, under `mode`.
pub struct Programs {
    /// The refusal layers, in the order installed, on every thread that
    /// does not inherit its parent's.
    pub layers: Vec<BpfProgram>,
    /// Each kind's allowlist (none under [`SeccompMode::None`]).
    pub allowlists: HashMap<ThreadKind, BpfProgram>,
}

impl Programs {
    /// What a thread of `kind` holds, oldest first: the refusal layers and its allowlist,
    /// or for a thread started by another (its parent kind), the parent's layers and
    /// allowlist, then its own (no allowlists under [`SeccompMode::None`]).
    pub fn for_thread(&self, kind: ThreadKind) -> Vec<BpfProgram> {
        let mut programs = self.layers.clone();
        let allowlist = |k| self.allowlists.get(&k).cloned();
        programs.extend(kind.parent().and_then(allowlist));
        programs.extend(allowlist(kind));
        programs
    }
}

/// The programs of a VMM in process `pid` (its `tgkill` rule names it).
pub fn programs_for_process(mode: SeccompMode, pid: u32) -> Result<Programs, SandboxError> {
    let config = SandboxConfig {
        seccomp: mode,
        ..SandboxConfig::disabled()
    };
    let sandbox = Sandbox::build(config, Vec::new(), pid, filters::mismatch_action(mode))?;
    Ok(Programs {
        layers: sandbox.layers,
        allowlists: sandbox.filters,
    })
}

/// `PTRACE_SECCOMP_GET_FILTER` (`linux/ptrace.h`; not in the libc crate).
const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;

/// The seccomp programs thread `tid` runs under, oldest first.
pub fn thread_filters(tid: u32) -> io::Result<Vec<BpfProgram>> {
    let tid = libc::pid_t::try_from(tid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "not a thread id"))?;
    let last_error = |what: &str| {
        let e = io::Error::last_os_error();
        io::Error::new(e.kind(), format!("{what} of thread {tid}: {e}"))
    };
    // SAFETY: ptrace requests on another thread with integer arguments.
    if unsafe { libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0) } != 0 {
        return Err(last_error("PTRACE_SEIZE"));
    }
    let mut redeliver = 0;
    let result = (|| {
        // SAFETY: as above.
        if unsafe { libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0) } != 0 {
            return Err(last_error("PTRACE_INTERRUPT"));
        }
        let mut status = 0;
        // SAFETY: waits for the tracee; writes the status into the local.
        if unsafe { libc::waitpid(tid, &mut status, libc::__WALL) } != tid {
            return Err(last_error("waitpid"));
        }
        if !libc::WIFSTOPPED(status) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!("thread {tid} ended"),
            ));
        }
        // A stop for a signal (not the interrupt's event stop): hand the
        // signal back on release.
        if status >> 16 != libc::PTRACE_EVENT_STOP {
            redeliver = libc::WSTOPSIG(status);
        }
        let mut programs = Vec::new();
        for index in 0usize.. {
            // SAFETY: with a null buffer the kernel only returns the
            // program's length in instructions.
            let len = unsafe {
                libc::ptrace(
                    PTRACE_SECCOMP_GET_FILTER,
                    tid,
                    index,
                    std::ptr::null_mut::<sock_filter>(),
                )
            };
            if len < 0 {
                // Index 0 is the oldest (the kernel counts back from the
                // newest); ENOENT past the newest.
                let e = io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::ENOENT) {
                    break;
                }
                return Err(io::Error::new(
                    e.kind(),
                    format!("PTRACE_SECCOMP_GET_FILTER of thread {tid}: {e}"),
                ));
            }
            let len = usize::try_from(len).expect("a non-negative length");
            let mut program = vec![
                sock_filter {
                    code: 0,
                    jt: 0,
                    jf: 0,
                    k: 0,
                };
                len
            ];
            // SAFETY: the buffer holds `len` instructions, the length the
            // kernel just reported for this filter (filters never change).
            let copied = unsafe {
                libc::ptrace(PTRACE_SECCOMP_GET_FILTER, tid, index, program.as_mut_ptr())
            };
            if copied < 0 {
                return Err(last_error("PTRACE_SECCOMP_GET_FILTER"));
            }
            programs.push(program);
        }
        Ok(programs)
    })();
    // SAFETY: releases the tracee, delivering the signal it stopped for.
    unsafe { libc::ptrace(libc::PTRACE_DETACH, tid, 0, redeliver) };
    result
}

/// The kind of a VMM thread by the name the VMM gives it (its `comm`), or
/// `None` for a thread the VMM did not start (an embedding program names
/// its own control threads).
pub fn kind_of_thread(name: &str) -> Option<ThreadKind> {
    let numbered = |prefix: &str| {
        name.strip_prefix(prefix)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match name {
        "virtio-blk" => Some(ThreadKind::VirtioBlock),
        "virtio-net" => Some(ThreadKind::VirtioNet),
        "virtio-rng" => Some(ThreadKind::VirtioRng),
        "serial-accept" => Some(ThreadKind::ConsoleAccept),
        "serial-input" => Some(ThreadKind::ConsoleInput),
        "boot-disk" => Some(ThreadKind::BootLoader),
        "acpi-ged" => Some(ThreadKind::IrqResample),
        _ if numbered("vcpu") => Some(ThreadKind::Vcpu),
        _ if numbered("virtio-blk-io") => Some(ThreadKind::BlockIo),
        _ => None,
    }
}
