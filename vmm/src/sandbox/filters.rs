//! The seccomp filter of each VMM thread kind, built with `seccompiler`
//! (rust-vmm; Firecracker's and Cloud Hypervisor's) from Rust rules.
//!
//! Each list is what the thread's code does once it runs (checked under
//! `strace -f` on every device path and with `--seccomp=log`), grouped by
//! why. Arguments are filtered where a system call could do far more than
//! the thread needs: `ioctl` only with the request numbers used, `mmap` and
//! `mprotect` never executable, `futex` only the operations glibc and std
//! use (no PI or requeue operations), `madvise` only the advice glibc and
//! the block engine give, `prctl` and `seccomp` only to name a thread and
//! to add a filter, `clone` only for threads, `tgkill` only the vCPU kick
//! and only to this process's threads. Nothing opens a file, creates a
//! socket, executes a program or changes credentials.
//!
//! Under every allowlist lie two refusal layers ([`compile_layers`]): calls
//! that must fail with an error the caller handles rather than trap.
//!
//! - glibc reads files lazily from whichever thread gets there first
//!   (`/sys/devices/system/cpu/online` when a thread needs a new malloc
//!   arena, `/proc/sys/vm/overcommit_memory` when an arena's heap shrinks;
//!   Cloud Hypervisor met both). Trapping those would end the VMM at
//!   random. So every allowlist lets a read-only `openat` through, and a
//!   layer answers it `EACCES`: glibc falls back, no file is ever opened,
//!   and any other `openat` still traps.
//! - `clone3` takes its flags in a structure seccomp cannot read, so it
//!   cannot be limited to threads as `clone` is: a layer answers it
//!   `ENOSYS` (as Chromium's and the container runtimes' default profiles
//!   do), glibc's `pthread_create` then falls back to `clone`, whose flags
//!   the allowlists check. Kinds that never start threads do not list
//!   `clone3` at all: there it traps.
//!
//! seccompiler gives one program one answer for every call it matches, so
//! each errno is its own small program. The kernel runs every filter of a
//! thread and keeps the strongest answer (kill, then trap, then errno, then
//! log, then allow; between two errnos, the newer filter's): the layers
//! answer only what the allowlist lets through, and the allowlist goes on
//! last.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule,
};
use vmm_sys_util::{ioctl_io_nr, ioctl_ior_nr, ioctl_iow_nr, ioctl_iowr_nr};

use super::{SeccompMode, ThreadKind};

const KVMIO: u32 = 0xAE;
ioctl_io_nr!(KVM_RUN, KVMIO, 0x80);
ioctl_ior_nr!(KVM_GET_REGS, KVMIO, 0x81, kvm_bindings::kvm_regs);
// Instructions KVM cannot emulate, finished by the VMM (`kvm::emulation`).
ioctl_iow_nr!(KVM_SET_REGS, KVMIO, 0x82, kvm_bindings::kvm_regs);
ioctl_ior_nr!(KVM_GET_SREGS, KVMIO, 0x83, kvm_bindings::kvm_sregs);
ioctl_iowr_nr!(KVM_TRANSLATE, KVMIO, 0x85, kvm_bindings::kvm_translation);
ioctl_ior_nr!(KVM_GET_FPU, KVMIO, 0x8c, kvm_bindings::kvm_fpu);
ioctl_ior_nr!(
    KVM_GET_VCPU_EVENTS,
    KVMIO,
    0x9f,
    kvm_bindings::kvm_vcpu_events
);
ioctl_iow_nr!(
    KVM_SET_VCPU_EVENTS,
    KVMIO,
    0xa0,
    kvm_bindings::kvm_vcpu_events
);
// A vCPU's state, read while the VM is paused for a migration (`kvm::vcpu_state`).
// Writing it is not allowed here: a migration target's vCPU thread restores its state
// before it enters the sandbox (`vcpu_threads`).
ioctl_iowr_nr!(KVM_GET_MSRS, KVMIO, 0x88, kvm_bindings::kvm_msrs);
ioctl_ior_nr!(KVM_GET_LAPIC, KVMIO, 0x8e, kvm_bindings::kvm_lapic_state);
ioctl_ior_nr!(KVM_GET_MP_STATE, KVMIO, 0x98, kvm_bindings::kvm_mp_state);
ioctl_ior_nr!(KVM_GET_DEBUGREGS, KVMIO, 0xa1, kvm_bindings::kvm_debugregs);
ioctl_ior_nr!(KVM_GET_XSAVE, KVMIO, 0xa4, kvm_bindings::kvm_xsave);
ioctl_ior_nr!(KVM_GET_XCRS, KVMIO, 0xa6, kvm_bindings::kvm_xcrs);
// On the VM: MSI-X messages the guest programs (`pci::msi`) and the queue
// ioeventfds that follow a virtio-pci BAR (`devices::virtio_pci`).
ioctl_iow_nr!(
    KVM_SET_GSI_ROUTING,
    KVMIO,
    0x6a,
    kvm_bindings::kvm_irq_routing
);
ioctl_iow_nr!(KVM_IOEVENTFD, KVMIO, 0x79, kvm_bindings::kvm_ioeventfd);

/// The `ioctl` requests of a vCPU thread: `KVM_RUN`, what the VMM's
/// emulation reads and writes, the VM's routing and ioeventfd updates
/// that follow the guest's MSI-X and BAR programming, and reading the vCPU's own
/// state for a migration.
pub(super) fn vcpu_ioctls() -> [u64; 16] {
    [
        KVM_RUN(),
        KVM_GET_REGS(),
        KVM_SET_REGS(),
        KVM_GET_SREGS(),
        KVM_TRANSLATE(),
        KVM_GET_FPU(),
        KVM_GET_VCPU_EVENTS(),
        KVM_SET_VCPU_EVENTS(),
        KVM_SET_GSI_ROUTING(),
        KVM_IOEVENTFD(),
        KVM_GET_MSRS(),
        KVM_GET_LAPIC(),
        KVM_GET_MP_STATE(),
        KVM_GET_DEBUGREGS(),
        KVM_GET_XSAVE(),
        KVM_GET_XCRS(),
    ]
}

/// A non-negative libc constant as the 64-bit value seccomp compares an
/// argument with (in const context: a negative one fails the build).
pub(super) const fn arg(value: libc::c_int) -> u64 {
    match value.to_le_bytes() {
        [a, b, c, d] if d < 0x80 => u64::from_le_bytes([a, b, c, d, 0, 0, 0, 0]),
        _ => panic!("a negative constant as a system call argument"),
    }
}

/// The `futex` operations glibc and std make (seen under `strace -f` on
/// every thread kind, and glibc 2.36's sources): std's `Mutex`, `Condvar`,
/// `Once` and thread parking wait with `FUTEX_WAIT_BITSET_PRIVATE` and wake
/// with `FUTEX_WAKE_PRIVATE`; glibc's internal locks (malloc arenas, the
/// loader's) wait with `FUTEX_WAIT_PRIVATE`; `pthread_join` waits on the
/// thread's id word with a shared `FUTEX_WAIT_BITSET | FUTEX_CLOCK_REALTIME`
/// (the kernel wakes it when the thread ends). Firecracker allows the same
/// private ones plus shared `FUTEX_WAIT`/`FUTEX_WAKE` for musl's join. Not
/// the priority-inheritance and requeue operations (`FUTEX_LOCK_PI`,
/// `FUTEX_CMP_REQUEUE_PI`, ...), the futex code behind most of its
/// privilege escalations (CVE-2014-3153, CVE-2021-3347).
pub(super) const FUTEX_OPS: [u64; 4] = [
    arg(libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG),
    arg(libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG),
    arg(libc::FUTEX_WAIT_BITSET | libc::FUTEX_PRIVATE_FLAG),
    arg(libc::FUTEX_WAIT_BITSET | libc::FUTEX_CLOCK_REALTIME),
];

/// The `madvise` advice any thread gives: `MADV_DONTNEED` (glibc returns a
/// finished thread's stack and trims a malloc arena's heap with it) and
/// `MADV_HUGEPAGE` (glibc's malloc with `glibc.malloc.hugetlb=1`). Not
/// `MADV_REMOVE`, `MADV_HWPOISON`, `MADV_MERGEABLE`, `MADV_DONTFORK`, ...
pub(super) const MADVISE: [u64; 2] = [arg(libc::MADV_DONTNEED), arg(libc::MADV_HUGEPAGE)];

/// And on a virtio-blk device thread: its bounce buffers move onto a huge
/// page once batches come (`IoBuffer::make_huge`: `MADV_HUGEPAGE`, then
/// `MADV_COLLAPSE`).
pub(super) const MADVISE_BLOCK: [u64; 1] = [arg(libc::MADV_COLLAPSE)];

/// What a call outside the filter gets, or `None` for no filter.
pub(super) fn mismatch_action(mode: SeccompMode) -> Option<SeccompAction> {
    match mode {
        SeccompMode::None => None,
        SeccompMode::Log => Some(SeccompAction::Log),
        SeccompMode::Trap => Some(SeccompAction::Trap),
    }
}

/// One syscall's entry: allowed outright (no rules) or when one rule
/// matches.
type Rules = Vec<(i64, Vec<SeccompRule>)>;

fn cond(arg: u8, op: Op, value: u64) -> SeccompCondition {
    // Argument indexes here are 0..=5: always valid.
    SeccompCondition::new(arg, Len::Dword, op, value).expect("argument index in 0..=5")
}

fn rule(conditions: Vec<SeccompCondition>) -> SeccompRule {
    SeccompRule::new(conditions).expect("a rule with conditions")
}

/// `syscall(arg == value)` for each value.
fn arg_in(arg: u8, values: &[u64]) -> Vec<SeccompRule> {
    values
        .iter()
        .map(|&v| rule(vec![cond(arg, Op::Eq, v)]))
        .collect()
}

/// Never executable memory: a guest exploit cannot map shellcode.
pub(super) const PROT_EXEC: u64 = arg(libc::PROT_EXEC);

/// Memory management, locks, time, logging and ending a thread: what any
/// Rust thread of this program does (the allocator, std's synchronisation,
/// `tracing` to stderr, the thread's own exit).
fn base() -> Rules {
    let no_exec = || vec![rule(vec![cond(2, Op::MaskedEq(PROT_EXEC), 0)])];
    vec![
        (libc::SYS_brk, vec![]),
        (libc::SYS_mmap, no_exec()),
        (libc::SYS_mprotect, no_exec()),
        (libc::SYS_munmap, vec![]),
        (libc::SYS_mremap, vec![]),
        (libc::SYS_madvise, arg_in(2, &MADVISE)),
        (libc::SYS_futex, arg_in(1, &FUTEX_OPS)),
        (libc::SYS_sched_yield, vec![]),
        // Also the CMOS RTC's reads on the vCPU threads (normally through the vDSO).
        (libc::SYS_clock_gettime, vec![]),
        (libc::SYS_clock_nanosleep, vec![]),
        (libc::SYS_nanosleep, vec![]),
        (libc::SYS_gettid, vec![]),
        (libc::SYS_getrandom, vec![]),
        // glibc sizes a new thread's malloc arena by the CPUs it may run on.
        (libc::SYS_sched_getaffinity, vec![]),
        // Closing a descriptor: std checks it is open first (debug builds).
        (libc::SYS_fcntl, arg_in(1, &[arg(libc::F_GETFD)])),
        (libc::SYS_write, vec![]),
        (libc::SYS_close, vec![]),
        (libc::SYS_rt_sigprocmask, vec![]),
        (libc::SYS_rt_sigreturn, vec![]),
        (libc::SYS_sigaltstack, vec![]),
        (libc::SYS_restart_syscall, vec![]),
        (libc::SYS_exit, vec![]),
        (libc::SYS_exit_group, vec![]),
        // glibc's lazy reads (see the module's doc): let through here,
        // refused with EACCES by a layer.
        (libc::SYS_openat, read_only_open()),
    ]
}

/// The flags of glibc's internal reads (and of `File::open`).
const READ_ONLY_OPEN: u64 = arg(libc::O_RDONLY | libc::O_CLOEXEC);

/// `openat(_, _, O_RDONLY | O_CLOEXEC)` and no other flags.
fn read_only_open() -> Vec<SeccompRule> {
    vec![rule(vec![cond(2, Op::Eq, READ_ONLY_OPEN)])]
}

/// A refusal layer: the calls of `map` fail with `errno`, every other call
/// passes on to the filters below and above it.
fn errno_layer(
    map: BTreeMap<i64, Vec<SeccompRule>>,
    errno: libc::c_int,
) -> seccompiler::Result<BpfProgram> {
    let errno = u32::try_from(errno).expect("errno values are positive");
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        SeccompAction::Errno(errno),
        std::env::consts::ARCH
            .try_into()
            .map_err(seccompiler::Error::Backend)?,
    )
    .map_err(seccompiler::Error::Backend)?;
    filter.try_into().map_err(seccompiler::Error::Backend)
}

/// A read-only `openat` fails with `EACCES` (glibc's lazy reads fall back).
fn compile_refused_reads() -> seccompiler::Result<BpfProgram> {
    errno_layer(
        [(libc::SYS_openat, read_only_open())].into_iter().collect(),
        libc::EACCES,
    )
}

/// `clone3` fails with `ENOSYS` (glibc falls back to `clone`). Also under
/// the launcher's denylist, whose other answers are a trap.
pub(super) fn compile_no_clone3() -> seccompiler::Result<BpfProgram> {
    errno_layer(
        [(libc::SYS_clone3, vec![])].into_iter().collect(),
        libc::ENOSYS,
    )
}

/// The refusal layers every VMM thread gets under its allowlist, in the
/// order installed (see the module's doc).
pub(super) fn compile_layers() -> seccompiler::Result<Vec<BpfProgram>> {
    Ok(vec![compile_refused_reads()?, compile_no_clone3()?])
}

/// Starting a thread that adds its own, narrower, filter: the parent's
/// `clone3`/`clone`/`mmap`, the child's set-up by glibc and std (robust
/// list, rseq, alternate signal stack, name) before it enters its sandbox.
fn spawns_threads() -> Rules {
    let clone_thread = arg(libc::CLONE_THREAD);
    vec![
        // Listed so that the layer's ENOSYS answers it, not a trap: glibc
        // then falls back to clone.
        (libc::SYS_clone3, vec![]),
        // Only with CLONE_THREAD: no fork, and no new namespaces (which a
        // thread cannot have).
        (
            libc::SYS_clone,
            vec![rule(vec![cond(
                0,
                Op::MaskedEq(clone_thread),
                clone_thread,
            )])],
        ),
        (libc::SYS_set_robust_list, vec![]),
        (libc::SYS_rseq, vec![]),
        (
            libc::SYS_prctl,
            arg_in(0, &[arg(libc::PR_SET_NAME), arg(libc::PR_SET_NO_NEW_PRIVS)]),
        ),
        // Only adding a filter to oneself: no TSYNC, no listener.
        (
            libc::SYS_seccomp,
            vec![rule(vec![
                cond(0, Op::Eq, u64::from(libc::SECCOMP_SET_MODE_FILTER)),
                cond(1, Op::Eq, 0),
            ])],
        ),
    ]
}

/// Waiting for eventfds (queue notifications, wake-ups) and reading them.
fn event_loop() -> Rules {
    vec![
        (libc::SYS_poll, vec![]),
        (libc::SYS_ppoll, vec![]),
        (libc::SYS_read, vec![]),
    ]
}

/// Console output to the clients of the serial socket (std sends with
/// MSG_NOSIGNAL).
fn console_clients() -> Rules {
    vec![
        (libc::SYS_sendto, vec![]),
        (libc::SYS_sendmsg, vec![]),
        // Hanging up a client that cannot keep up (see `SocketConsole::broadcast`).
        (libc::SYS_shutdown, vec![]),
    ]
}

/// The vCPU kick: a real-time signal to a thread of this process, thread
/// group `pid` (glibc's `pthread_kill` sends `tgkill(getpid(), tid, sig)`).
/// seccomp compares with constants only, so the filter is built for the
/// process it runs in (see `Sandbox::new`).
fn kicks_vcpus(pid: u32) -> Rules {
    // Real-time signal numbers are positive: the same bits as a sign extension.
    let kick = u64::from(crate::kick::signal_number().cast_unsigned());
    vec![
        (libc::SYS_getpid, vec![]),
        (
            libc::SYS_tgkill,
            vec![rule(vec![
                cond(0, Op::Eq, u64::from(pid)),
                cond(2, Op::Eq, kick),
            ])],
        ),
    ]
}

/// I/O on a disk image opened at start-up.
fn disk_io() -> Rules {
    vec![
        (libc::SYS_pread64, vec![]),
        (libc::SYS_pwrite64, vec![]),
        (libc::SYS_preadv, vec![]),
        (libc::SYS_pwritev, vec![]),
        (libc::SYS_fdatasync, vec![]),
        (libc::SYS_fsync, vec![]),
        (libc::SYS_fallocate, vec![]),
        (libc::SYS_fstat, vec![]),
        (libc::SYS_statx, vec![]),
        (libc::SYS_newfstatat, vec![]),
    ]
}

/// The rules of `kind` in process `pid`.
fn rules(kind: ThreadKind, pid: u32) -> Rules {
    let mut rules = base();
    match kind {
        ThreadKind::Vcpu => {
            rules.push((libc::SYS_ioctl, arg_in(1, &vcpu_ioctls())));
            rules.extend(kicks_vcpus(pid));
            rules.extend(console_clients());
        }
        ThreadKind::VirtioBlock => {
            rules.push((libc::SYS_madvise, arg_in(2, &MADVISE_BLOCK)));
            rules.extend(event_loop());
            rules.extend(disk_io());
            rules.extend(spawns_threads());
        }
        ThreadKind::BlockIo => {
            rules.push((libc::SYS_read, vec![]));
            rules.extend(disk_io());
        }
        ThreadKind::VirtioNet | ThreadKind::VirtioRng | ThreadKind::IrqResample => {
            rules.extend(event_loop());
        }
        ThreadKind::ConsoleAccept => {
            // And everything its input threads do (they inherit this filter).
            rules.push((libc::SYS_poll, vec![]));
            rules.push((libc::SYS_ppoll, vec![]));
            rules.push((libc::SYS_accept4, vec![]));
            rules.push((libc::SYS_accept, vec![]));
            rules.push((libc::SYS_read, vec![]));
            rules.push((libc::SYS_recvfrom, vec![]));
            rules.push((
                libc::SYS_fcntl,
                arg_in(
                    1,
                    &[
                        arg(libc::F_DUPFD_CLOEXEC),
                        arg(libc::F_GETFL),
                        arg(libc::F_SETFL),
                    ],
                ),
            ));
            rules.push((libc::SYS_ioctl, arg_in(1, &[libc::FIONBIO])));
            rules.push((libc::SYS_shutdown, vec![]));
            rules.extend(console_clients());
            rules.extend(spawns_threads());
        }
        ThreadKind::ConsoleInput => {
            rules.push((libc::SYS_poll, vec![]));
            rules.push((libc::SYS_ppoll, vec![]));
            rules.push((libc::SYS_read, vec![]));
            rules.push((libc::SYS_recvfrom, vec![]));
            rules.push((libc::SYS_shutdown, vec![]));
        }
        ThreadKind::Control => {
            rules.push((libc::SYS_rt_sigtimedwait, vec![]));
            rules.push((libc::SYS_read, vec![]));
            // Removing the console socket (after checking it is still the
            // one this VM bound) and hanging up its clients at the end.
            rules.push((libc::SYS_statx, vec![]));
            rules.push((libc::SYS_newfstatat, vec![]));
            rules.push((libc::SYS_unlink, vec![]));
            rules.push((libc::SYS_unlinkat, vec![]));
            rules.push((libc::SYS_shutdown, vec![]));
            rules.extend(kicks_vcpus(pid));
        }
        ThreadKind::BootLoader => {
            // Reads of the boot disk opened before (its backing files too), nothing else:
            // no writes, no syncs, no space changes.
            rules.push((libc::SYS_pread64, vec![]));
            rules.push((libc::SYS_preadv, vec![]));
            rules.push((libc::SYS_read, vec![]));
            rules.push((libc::SYS_fstat, vec![]));
        }
    }
    rules
}

/// What a process that embeds the VMM (the launcher: its gRPC server,
/// DHCP server, file and VM set-up) must never do. A denylist, not an
/// allowlist: that process's legitimate calls are open-ended (it creates
/// files, sockets, VMs), while these have no use in it and are the usual
/// ways out of a sandbox or into the host. Also denied: `clone` without
/// `CLONE_THREAD` (a fork); and `clone3` fails with `ENOSYS` (a layer of
/// its own, see [`host_denylist_programs`]).
pub(super) const HOST_DENYLIST: &[i64] = &[
    libc::SYS_execve,
    libc::SYS_execveat,
    libc::SYS_fork,
    libc::SYS_vfork,
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_pidfd_getfd,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_unshare,
    libc::SYS_setns,
    libc::SYS_open_tree,
    libc::SYS_move_mount,
    libc::SYS_fsopen,
    libc::SYS_fsconfig,
    libc::SYS_fsmount,
    libc::SYS_fspick,
    libc::SYS_mount_setattr,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_reboot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_iopl,
    libc::SYS_ioperm,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_personality,
];

/// The denylist program: the calls above get `action`, the rest pass.
fn compile_host_denylist(action: SeccompAction) -> seccompiler::Result<BpfProgram> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> =
        HOST_DENYLIST.iter().map(|&nr| (nr, Vec::new())).collect();
    // clone without CLONE_THREAD is a fork.
    map.insert(
        libc::SYS_clone,
        vec![rule(vec![cond(
            0,
            Op::MaskedEq(arg(libc::CLONE_THREAD)),
            0,
        )])],
    );
    let filter = SeccompFilter::new(
        map,
        SeccompAction::Allow,
        action,
        std::env::consts::ARCH
            .try_into()
            .map_err(seccompiler::Error::Backend)?,
    )
    .map_err(seccompiler::Error::Backend)?;
    filter.try_into().map_err(seccompiler::Error::Backend)
}

/// The launcher's programs, in the order installed: the denylist (its calls
/// get `action`) and the `clone3` layer. `clone3` cannot be denied with the
/// rest: a trap would end the launcher at its first thread, where `ENOSYS`
/// makes glibc fall back to `clone`, which the denylist checks.
pub(super) fn host_denylist_programs(
    action: SeccompAction,
) -> seccompiler::Result<Vec<BpfProgram>> {
    Ok(vec![compile_host_denylist(action)?, compile_no_clone3()?])
}

/// The BPF program of `kind` in process `pid`: its calls allowed, the rest
/// `mismatch`.
pub(super) fn compile(
    kind: ThreadKind,
    mismatch: SeccompAction,
    pid: u32,
) -> seccompiler::Result<BpfProgram> {
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for (nr, mut conditions) in rules(kind, pid) {
        // A syscall listed twice: unconditional wins, else rules add up.
        match map.get_mut(&nr) {
            Some(existing) if existing.is_empty() || conditions.is_empty() => existing.clear(),
            Some(existing) => existing.append(&mut conditions),
            None => {
                map.insert(nr, conditions);
            }
        }
    }
    let filter = SeccompFilter::new(
        map,
        mismatch,
        SeccompAction::Allow,
        std::env::consts::ARCH
            .try_into()
            .map_err(seccompiler::Error::Backend)?,
    )
    .map_err(seccompiler::Error::Backend)?;
    filter.try_into().map_err(seccompiler::Error::Backend)
}

/// The system calls `kind` may make, for tests.
#[cfg(test)]
pub(super) fn allowed(kind: ThreadKind) -> Vec<i64> {
    let mut v: Vec<i64> = rules(kind, std::process::id())
        .into_iter()
        .map(|(nr, _)| nr)
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}
