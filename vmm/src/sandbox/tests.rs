//! The filters' rules, each shown by real system calls on a throwaway thread
//! under the filters as [`Sandbox::enter`] installs them (an inheriting kind
//! under its parent's too), with one change: a call outside an allowlist
//! fails with [`FILTERED`] instead of trapping, so one test process can
//! make many. Each probe passes arguments that make the call fail
//! harmlessly, or do nothing, should a broken filter let it through, and
//! the probing thread has no effective capabilities; a probe that could
//! start a process makes sure the child exits at once.

use super::*;
use seccompiler::SeccompAction;
use std::ffi::CString;
use std::os::unix::fs::FileExt;
use vmm_sys_util::{ioctl_io_nr, ioctl_iow_nr};

/// What a call outside an allowlist gets in these tests instead of SIGSYS:
/// an errno none of the probed calls returns by itself, so a probe's
/// result tells the filter's answer from the kernel's.
const FILTERED: i32 = libc::EMEDIUMTYPE;

/// A process and thread id that never exists (pid_max is at most 2^22).
const NOWHERE: i64 = 0x7fff_fff0;

/// The result of a system call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok(i64),
    Err(i32),
}

impl Outcome {
    fn of(rc: i64) -> Outcome {
        if rc == -1 {
            Outcome::Err(io::Error::last_os_error().raw_os_error().unwrap_or(0))
        } else {
            Outcome::Ok(rc)
        }
    }

    fn filtered(self) -> bool {
        self == Outcome::Err(FILTERED)
    }
}

/// A raw system call, for the probes below only: their pointer arguments
/// are null, invalid or to the probe's own locals, which is what makes each
/// call harmless when a filter lets it through.
fn sys(nr: i64, a: [i64; 6]) -> Outcome {
    // SAFETY: see above; no call here writes through a pointer it was not
    // given for that, and none of them is given one.
    Outcome::of(unsafe { libc::syscall(nr, a[0], a[1], a[2], a[3], a[4], a[5]) })
}

/// A system call that may start a child (`fork`, `vfork`, `clone`,
/// `clone3`) should a filter let it through: the child exits at once, in
/// assembly, touching no memory (a `vfork` child shares this stack, a
/// `libc::syscall` child would return into Rust code). The caller reaps a
/// child it got, outside the filters (see [`reap`]).
fn creating_call(nr: i64, a: [i64; 5]) -> Outcome {
    let ret: i64;
    // SAFETY: the syscall ABI's registers; the child path (rax == 0) ends
    // with exit(0) and never returns; the parent gets the child's id or
    // -errno in rax and goes on with every other register as the ABI says.
    unsafe {
        std::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "mov eax, {exit}",
            "xor edi, edi",
            "syscall",
            "ud2",
            "2:",
            exit = const libc::SYS_exit,
            inlateout("rax") nr => ret,
            inlateout("rdi") a[0] => _,
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    if ret < 0 {
        Outcome::Err(i32::try_from(-ret).expect("an errno"))
    } else {
        Outcome::Ok(ret)
    }
}

/// Waits for a child a creating call started (the probe's filters refuse
/// `wait4`, so after the probe thread ends).
fn reap(outcome: Outcome) {
    if let Outcome::Ok(pid) = outcome
        && pid > 0
    {
        let pid = libc::pid_t::try_from(pid).expect("a pid");
        let mut status = 0;
        // SAFETY: waits for our own child; writes its status to the local.
        unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
    }
}

/// `struct clone_args` (Linux 5.3, the first 64 bytes).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
}

/// Raw `clone3` without `CLONE_THREAD`: a fork, if it got through.
fn clone3_fork() -> Outcome {
    let args = CloneArgs {
        exit_signal: filters::arg(libc::SIGCHLD),
        ..CloneArgs::default()
    };
    let size = i64::try_from(std::mem::size_of::<CloneArgs>()).expect("64 bytes");
    let ptr = addr(std::ptr::from_ref(&args));
    creating_call(libc::SYS_clone3, [ptr, size, 0, 0, 0])
}

/// A sandbox whose allowlists answer [`FILTERED`] instead of trapping;
/// no credential change, no Landlock.
fn test_sandbox() -> Arc<Sandbox> {
    let config = SandboxConfig {
        seccomp: SeccompMode::Trap,
        landlock: false,
        unprivileged: None,
        ..SandboxConfig::disabled()
    };
    let filtered = SeccompAction::Errno(FILTERED.cast_unsigned());
    Arc::new(Sandbox::build(config, Vec::new(), std::process::id(), Some(filtered)).unwrap())
}

/// Runs `probe` on a new thread with no effective capabilities, under
/// `enter`: the thread's programs as they would be installed.
fn under<T: Send + 'static>(
    enter: impl FnOnce() + Send + 'static,
    probe: impl FnOnce() -> T + Send + 'static,
) -> T {
    std::thread::spawn(move || {
        caps::clear(None, caps::CapSet::Effective).expect("drop effective capabilities");
        enter();
        probe()
    })
    .join()
    .expect("the probe thread")
}

/// Runs `probe` on a thread of `kind` (entered after its parent).
fn under_kind<T: Send + 'static>(
    sandbox: &Arc<Sandbox>,
    kind: ThreadKind,
    probe: impl FnOnce() -> T + Send + 'static,
) -> T {
    let sandbox = sandbox.clone();
    under(
        move || {
            if let Some(parent) = kind.parent() {
                sandbox.enter(parent).expect("enter the parent's sandbox");
            }
            sandbox.enter(kind).expect("enter the sandbox");
        },
        probe,
    )
}

/// Runs `probe` under the launcher's programs (the denylist answering
/// [`FILTERED`]).
fn under_denylist<T: Send + 'static>(probe: impl FnOnce() -> T + Send + 'static) -> T {
    let programs =
        filters::host_denylist_programs(SeccompAction::Errno(FILTERED.cast_unsigned())).unwrap();
    under(
        move || {
            for program in &programs {
                seccompiler::apply_filter(program).expect("install the denylist");
            }
        },
        probe,
    )
}

/// What a probe's call should get.
#[derive(Clone, Copy, Debug)]
enum Want {
    /// Through the filters (whatever the kernel then says).
    Passes,
    /// Refused by the allowlist (a trap in the VMM).
    Refused,
    /// Exactly this.
    Is(Outcome),
}

impl Want {
    fn when(passes: bool) -> Want {
        if passes { Want::Passes } else { Want::Refused }
    }

    fn check(self, got: Outcome) -> bool {
        match self {
            Want::Passes => !got.filtered(),
            Want::Refused => got.filtered(),
            Want::Is(wanted) => got == wanted,
        }
    }
}

/// What the probes need that they may not look up under a filter.
#[derive(Clone)]
struct Context {
    pid: i64,
    /// An existing file.
    file: Arc<CString>,
}

impl Context {
    fn new(dir: &tempfile::TempDir) -> Context {
        let path = dir.path().join("file");
        std::fs::write(&path, b"x").unwrap();
        Context {
            pid: i64::from(std::process::id()),
            file: Arc::new(CString::new(path.into_os_string().into_encoded_bytes()).unwrap()),
        }
    }
}

type Call = Box<dyn Fn(&Context) -> Outcome + Send + Sync>;

/// One probe: a call and what each thread kind should get.
struct Probe {
    name: String,
    call: Call,
    /// It may have started a child to reap.
    creates: bool,
    want: Box<dyn Fn(ThreadKind) -> Want + Send + Sync>,
}

fn probe(
    name: impl Into<String>,
    want: impl Fn(ThreadKind) -> Want + Send + Sync + 'static,
    call: impl Fn(&Context) -> Outcome + Send + Sync + 'static,
) -> Probe {
    Probe {
        name: name.into(),
        call: Box::new(call),
        creates: false,
        want: Box::new(want),
    }
}

fn creating_probe(
    name: impl Into<String>,
    want: impl Fn(ThreadKind) -> Want + Send + Sync + 'static,
    call: impl Fn(&Context) -> Outcome + Send + Sync + 'static,
) -> Probe {
    Probe {
        creates: true,
        ..probe(name, want, call)
    }
}

fn everywhere(want: Want) -> impl Fn(ThreadKind) -> Want + Send + Sync + 'static {
    move |_| want
}

const KVMIO: u32 = 0xAE;
ioctl_io_nr!(KVM_CREATE_VM, KVMIO, 0x01);
ioctl_io_nr!(KVM_CREATE_VCPU, KVMIO, 0x41);
ioctl_iow_nr!(
    KVM_SET_USER_MEMORY_REGION,
    KVMIO,
    0x46,
    kvm_bindings::kvm_userspace_memory_region
);
ioctl_iow_nr!(KVM_IRQFD, KVMIO, 0x76, kvm_bindings::kvm_irqfd);
ioctl_iow_nr!(KVM_SET_SREGS, KVMIO, 0x84, kvm_bindings::kvm_sregs);
ioctl_iow_nr!(KVM_SET_MSRS, KVMIO, 0x89, kvm_bindings::kvm_msrs);
ioctl_iow_nr!(KVM_SET_FPU, KVMIO, 0x8d, kvm_bindings::kvm_fpu);
ioctl_iow_nr!(KVM_SET_CPUID2, KVMIO, 0x90, kvm_bindings::kvm_cpuid2);

/// `FUTEX_LOCK_PI2` (Linux 5.14; not in the libc crate).
const FUTEX_LOCK_PI2: i32 = 13;

fn i(value: libc::c_int) -> i64 {
    i64::from(value)
}

/// A pointer as a system call argument.
fn addr<T>(pointer: *const T) -> i64 {
    i64::try_from(pointer.addr()).expect("a user-space address")
}

/// An address no futex or madvise call accepts (not 4-byte, not page
/// aligned): an operation the filter lets through fails with EINVAL and
/// does nothing.
const MISALIGNED: i64 = 0x1001;

/// The argument rules of the allowlists, each with a call it allows and one
/// it refuses, per thread kind.
fn argument_probes() -> Vec<Probe> {
    let spawns = |kind: ThreadKind| Want::when(kind.spawns_threads());
    let kicks =
        |kind: ThreadKind| Want::when(matches!(kind, ThreadKind::Vcpu | ThreadKind::Control));
    let anon = i(libc::MAP_PRIVATE | libc::MAP_ANONYMOUS);
    let mut probes = vec![
        // Memory: never executable.
        probe("mmap read-write", everywhere(Want::Passes), move |_| {
            let out = sys(
                libc::SYS_mmap,
                [0, 4096, i(libc::PROT_READ | libc::PROT_WRITE), anon, -1, 0],
            );
            if let Outcome::Ok(addr) = out {
                sys(libc::SYS_munmap, [addr, 4096, 0, 0, 0, 0]);
            }
            out
        }),
        probe("mmap executable", everywhere(Want::Refused), move |_| {
            let out = sys(
                libc::SYS_mmap,
                [0, 4096, i(libc::PROT_READ | libc::PROT_EXEC), anon, -1, 0],
            );
            if let Outcome::Ok(addr) = out {
                sys(libc::SYS_munmap, [addr, 4096, 0, 0, 0, 0]);
            }
            out
        }),
        probe("mprotect read-only", everywhere(Want::Passes), move |_| {
            mprotect_own_page(libc::PROT_READ, anon)
        }),
        probe(
            "mprotect executable",
            everywhere(Want::Refused),
            move |_| mprotect_own_page(libc::PROT_READ | libc::PROT_EXEC, anon),
        ),
        // ioctl: the vCPU's KVM requests on vCPU threads, FIONBIO on the
        // console's accept thread, nothing else anywhere (fd -1: EBADF).
        probe(
            "ioctl FIONBIO",
            |kind| Want::when(kind == ThreadKind::ConsoleAccept),
            |_| {
                sys(
                    libc::SYS_ioctl,
                    [-1, libc::FIONBIO.cast_signed(), 0, 0, 0, 0],
                )
            },
        ),
        // clone: threads only, on the kinds that start threads. CLONE_THREAD
        // without CLONE_SIGHAND: the kernel refuses it (EINVAL) after the
        // filter let it through.
        creating_probe("clone with CLONE_THREAD", spawns, |_| {
            creating_call(libc::SYS_clone, [i(libc::CLONE_THREAD), 0, 0, 0, 0])
        }),
        creating_probe("clone a process", everywhere(Want::Refused), |_| {
            creating_call(libc::SYS_clone, [i(libc::SIGCHLD), 0, 0, 0, 0])
        }),
        creating_probe(
            "clone a process in new user and network namespaces",
            everywhere(Want::Refused),
            |_| {
                creating_call(
                    libc::SYS_clone,
                    [
                        i(libc::CLONE_NEWUSER | libc::CLONE_NEWNET | libc::SIGCHLD),
                        0,
                        0,
                        0,
                        0,
                    ],
                )
            },
        ),
        // clone3: ENOSYS where threads start (glibc falls back to clone),
        // refused (a trap) elsewhere; never a child.
        creating_probe(
            "clone3 without CLONE_THREAD",
            |kind: ThreadKind| {
                if kind.spawns_threads() {
                    Want::Is(Outcome::Err(libc::ENOSYS))
                } else {
                    Want::Refused
                }
            },
            |_| clone3_fork(),
        ),
        // tgkill: the kick, to this process's threads, from the kinds that
        // kick (tid NOWHERE: ESRCH once through).
        probe("tgkill the kick within this process", kicks, |ctx| {
            sys(
                libc::SYS_tgkill,
                [ctx.pid, NOWHERE, i(crate::kick::signal_number()), 0, 0, 0],
            )
        }),
        probe(
            "tgkill the kick to another process",
            everywhere(Want::Refused),
            |_| {
                sys(
                    libc::SYS_tgkill,
                    [NOWHERE, NOWHERE, i(crate::kick::signal_number()), 0, 0, 0],
                )
            },
        ),
        probe("tgkill another signal", everywhere(Want::Refused), |ctx| {
            sys(
                libc::SYS_tgkill,
                [ctx.pid, NOWHERE, i(libc::SIGKILL), 0, 0, 0],
            )
        }),
        // prctl: naming a thread and no_new_privs, where threads start.
        probe("prctl PR_SET_NAME", spawns, |_| {
            let name = c"probe";
            sys(
                libc::SYS_prctl,
                [i(libc::PR_SET_NAME), addr(name.as_ptr()), 0, 0, 0, 0],
            )
        }),
        probe("prctl PR_SET_NO_NEW_PRIVS", spawns, |_| {
            sys(
                libc::SYS_prctl,
                [i(libc::PR_SET_NO_NEW_PRIVS), 1, 0, 0, 0, 0],
            )
        }),
        probe("prctl PR_GET_DUMPABLE", everywhere(Want::Refused), |_| {
            sys(libc::SYS_prctl, [i(libc::PR_GET_DUMPABLE), 0, 0, 0, 0, 0])
        }),
        probe("prctl PR_GET_SECCOMP", everywhere(Want::Refused), |_| {
            sys(libc::SYS_prctl, [i(libc::PR_GET_SECCOMP), 0, 0, 0, 0, 0])
        }),
        // seccomp: adding a filter to oneself (a null program: EFAULT once
        // through), where threads start; no TSYNC, listener or queries.
        probe("seccomp: a filter for this thread", spawns, |_| {
            sys(
                libc::SYS_seccomp,
                [i64::from(libc::SECCOMP_SET_MODE_FILTER), 0, 0, 0, 0, 0],
            )
        }),
        probe(
            "seccomp: a filter for every thread (TSYNC)",
            everywhere(Want::Refused),
            |_| {
                sys(
                    libc::SYS_seccomp,
                    [
                        i64::from(libc::SECCOMP_SET_MODE_FILTER),
                        libc::SECCOMP_FILTER_FLAG_TSYNC.cast_signed(),
                        0,
                        0,
                        0,
                        0,
                    ],
                )
            },
        ),
        probe("seccomp: a listener", everywhere(Want::Refused), |_| {
            sys(
                libc::SYS_seccomp,
                [
                    i64::from(libc::SECCOMP_SET_MODE_FILTER),
                    libc::SECCOMP_FILTER_FLAG_NEW_LISTENER.cast_signed(),
                    0,
                    0,
                    0,
                    0,
                ],
            )
        }),
        probe(
            "seccomp: GET_ACTION_AVAIL",
            everywhere(Want::Refused),
            |_| {
                sys(
                    libc::SYS_seccomp,
                    [i64::from(libc::SECCOMP_GET_ACTION_AVAIL), 0, 0, 0, 0, 0],
                )
            },
        ),
        // fcntl: F_GETFD anywhere, the console's flags on its accept thread.
        probe("fcntl F_GETFD", everywhere(Want::Passes), |_| {
            sys(libc::SYS_fcntl, [-1, i(libc::F_GETFD), 0, 0, 0, 0])
        }),
        probe(
            "fcntl F_SETFL",
            |kind| Want::when(kind == ThreadKind::ConsoleAccept),
            |_| sys(libc::SYS_fcntl, [-1, i(libc::F_SETFL), 0, 0, 0, 0]),
        ),
        probe("fcntl F_DUPFD", everywhere(Want::Refused), |_| {
            sys(libc::SYS_fcntl, [-1, i(libc::F_DUPFD), 0, 0, 0, 0])
        }),
        // openat: read-only passes the allowlist and the layer answers
        // EACCES; anything else is refused.
        probe(
            "openat read-only",
            everywhere(Want::Is(Outcome::Err(libc::EACCES))),
            |ctx| {
                sys(
                    libc::SYS_openat,
                    [
                        i(libc::AT_FDCWD),
                        addr(ctx.file.as_ptr()),
                        i(libc::O_RDONLY | libc::O_CLOEXEC),
                        0,
                        0,
                        0,
                    ],
                )
            },
        ),
        probe("openat for writing", everywhere(Want::Refused), |ctx| {
            sys(
                libc::SYS_openat,
                [
                    i(libc::AT_FDCWD),
                    addr(ctx.file.as_ptr()),
                    i(libc::O_WRONLY | libc::O_CLOEXEC),
                    0,
                    0,
                    0,
                ],
            )
        }),
        // madvise: the block thread's MADV_COLLAPSE.
        probe(
            "madvise MADV_COLLAPSE",
            |kind| Want::when(kind == ThreadKind::VirtioBlock),
            |_| {
                sys(
                    libc::SYS_madvise,
                    [MISALIGNED, 4096, i(libc::MADV_COLLAPSE), 0, 0, 0],
                )
            },
        ),
    ];
    for request in filters::vcpu_ioctls() {
        probes.push(probe(
            format!("ioctl {request:#x} (a vCPU's)"),
            |kind| Want::when(kind == ThreadKind::Vcpu),
            move |_| sys(libc::SYS_ioctl, [-1, request.cast_signed(), 0, 0, 0, 0]),
        ));
    }
    // Other KVM requests (a vCPU thread may not create VMs or vCPUs, map
    // memory, set registers, MSRs or CPUID) and a terminal's TIOCSTI.
    for (name, request) in [
        ("KVM_CREATE_VM", KVM_CREATE_VM()),
        ("KVM_CREATE_VCPU", KVM_CREATE_VCPU()),
        ("KVM_SET_USER_MEMORY_REGION", KVM_SET_USER_MEMORY_REGION()),
        ("KVM_IRQFD", KVM_IRQFD()),
        ("KVM_SET_SREGS", KVM_SET_SREGS()),
        ("KVM_SET_MSRS", KVM_SET_MSRS()),
        ("KVM_SET_FPU", KVM_SET_FPU()),
        ("KVM_SET_CPUID2", KVM_SET_CPUID2()),
        ("TIOCSTI", libc::TIOCSTI),
    ] {
        probes.push(probe(
            format!("ioctl {name}"),
            everywhere(Want::Refused),
            move |_| sys(libc::SYS_ioctl, [-1, request.cast_signed(), 0, 0, 0, 0]),
        ));
    }
    // futex: the operations of glibc and std (a misaligned word: EINVAL
    // once through), no others.
    for op in filters::FUTEX_OPS {
        probes.push(probe(
            format!("futex op {op}"),
            everywhere(Want::Passes),
            move |_| sys(libc::SYS_futex, [MISALIGNED, op.cast_signed(), 1, 0, 0, 0]),
        ));
    }
    let private = libc::FUTEX_PRIVATE_FLAG;
    for (name, op) in [
        ("FUTEX_WAIT (shared)", libc::FUTEX_WAIT),
        ("FUTEX_WAKE (shared)", libc::FUTEX_WAKE),
        (
            "FUTEX_WAIT_BITSET (shared, monotonic)",
            libc::FUTEX_WAIT_BITSET,
        ),
        ("FUTEX_REQUEUE_PRIVATE", libc::FUTEX_REQUEUE | private),
        (
            "FUTEX_CMP_REQUEUE_PRIVATE",
            libc::FUTEX_CMP_REQUEUE | private,
        ),
        ("FUTEX_WAKE_OP_PRIVATE", libc::FUTEX_WAKE_OP | private),
        ("FUTEX_LOCK_PI_PRIVATE", libc::FUTEX_LOCK_PI | private),
        ("FUTEX_UNLOCK_PI_PRIVATE", libc::FUTEX_UNLOCK_PI | private),
        ("FUTEX_TRYLOCK_PI_PRIVATE", libc::FUTEX_TRYLOCK_PI | private),
        (
            "FUTEX_WAIT_REQUEUE_PI_PRIVATE",
            libc::FUTEX_WAIT_REQUEUE_PI | private,
        ),
        (
            "FUTEX_CMP_REQUEUE_PI_PRIVATE",
            libc::FUTEX_CMP_REQUEUE_PI | private,
        ),
        ("FUTEX_LOCK_PI2_PRIVATE", FUTEX_LOCK_PI2 | private),
        (
            "FUTEX_WAKE_BITSET_PRIVATE",
            libc::FUTEX_WAKE_BITSET | private,
        ),
    ] {
        probes.push(probe(
            format!("futex {name}"),
            everywhere(Want::Refused),
            move |_| sys(libc::SYS_futex, [MISALIGNED, i(op), 1, 0, 0, 0]),
        ));
    }
    // madvise: glibc's advice everywhere (a misaligned range: EINVAL once
    // through), none other.
    for advice in filters::MADVISE {
        probes.push(probe(
            format!("madvise advice {advice}"),
            everywhere(Want::Passes),
            move |_| {
                sys(
                    libc::SYS_madvise,
                    [MISALIGNED, 4096, advice.cast_signed(), 0, 0, 0],
                )
            },
        ));
    }
    for (name, advice) in [
        ("MADV_NORMAL", libc::MADV_NORMAL),
        ("MADV_WILLNEED", libc::MADV_WILLNEED),
        ("MADV_FREE", libc::MADV_FREE),
        ("MADV_REMOVE", libc::MADV_REMOVE),
        ("MADV_DONTFORK", libc::MADV_DONTFORK),
        ("MADV_MERGEABLE", libc::MADV_MERGEABLE),
        ("MADV_DONTDUMP", libc::MADV_DONTDUMP),
        ("MADV_WIPEONFORK", libc::MADV_WIPEONFORK),
        ("MADV_PAGEOUT", libc::MADV_PAGEOUT),
        ("MADV_POPULATE_WRITE", libc::MADV_POPULATE_WRITE),
        ("MADV_HWPOISON", libc::MADV_HWPOISON),
    ] {
        probes.push(probe(
            format!("madvise {name}"),
            everywhere(Want::Refused),
            move |_| sys(libc::SYS_madvise, [MISALIGNED, 4096, i(advice), 0, 0, 0]),
        ));
    }
    probes
}

/// Maps a page, changes its protection to `prot`, unmaps it.
fn mprotect_own_page(prot: libc::c_int, anon: i64) -> Outcome {
    let Outcome::Ok(page) = sys(
        libc::SYS_mmap,
        [0, 4096, i(libc::PROT_READ | libc::PROT_WRITE), anon, -1, 0],
    ) else {
        return Outcome::Err(0);
    };
    let out = sys(libc::SYS_mprotect, [page, 4096, i(prot), 0, 0, 0]);
    sys(libc::SYS_munmap, [page, 4096, 0, 0, 0, 0]);
    out
}

/// Calls no thread of a VMM and no thread of the launcher may make: the
/// launcher's denylist, each entry with arguments that make it fail (or do
/// nothing) should a filter let it through.
fn denied_everywhere() -> Vec<(i64, Probe)> {
    let refused = || everywhere(Want::Refused);
    let call = |name: &str, nr: i64, a: [i64; 6]| (nr, probe(name, refused(), move |_| sys(nr, a)));
    let create = |name: &str, nr: i64, a: [i64; 5]| {
        (
            nr,
            creating_probe(name, refused(), move |_| creating_call(nr, a)),
        )
    };
    vec![
        call("execve", libc::SYS_execve, [0, 0, 0, 0, 0, 0]),
        call("execveat", libc::SYS_execveat, [-1, 0, 0, 0, 0, 0]),
        create("fork", libc::SYS_fork, [0; 5]),
        create("vfork", libc::SYS_vfork, [0; 5]),
        call(
            "ptrace",
            libc::SYS_ptrace,
            [i64::from(libc::PTRACE_ATTACH), NOWHERE, 0, 0, 0, 0],
        ),
        // Flags 1: EINVAL.
        call(
            "process_vm_readv",
            libc::SYS_process_vm_readv,
            [NOWHERE, 0, 0, 0, 0, 1],
        ),
        call(
            "process_vm_writev",
            libc::SYS_process_vm_writev,
            [NOWHERE, 0, 0, 0, 0, 1],
        ),
        call("pidfd_getfd", libc::SYS_pidfd_getfd, [-1, -1, 0, 0, 0, 0]),
        call("mount", libc::SYS_mount, [0, 0, 0, 0, 0, 0]),
        call("umount2", libc::SYS_umount2, [0, 0, 0, 0, 0, 0]),
        call("pivot_root", libc::SYS_pivot_root, [0, 0, 0, 0, 0, 0]),
        call("chroot", libc::SYS_chroot, [0, 0, 0, 0, 0, 0]),
        // Bit 0 is no namespace: EINVAL.
        call("unshare", libc::SYS_unshare, [1, 0, 0, 0, 0, 0]),
        call("setns", libc::SYS_setns, [-1, 0, 0, 0, 0, 0]),
        call("open_tree", libc::SYS_open_tree, [-1, 0, 0, 0, 0, 0]),
        call("move_mount", libc::SYS_move_mount, [-1, 0, -1, 0, 0, 0]),
        call("fsopen", libc::SYS_fsopen, [0, 0, 0, 0, 0, 0]),
        call("fsconfig", libc::SYS_fsconfig, [-1, 0, 0, 0, 0, 0]),
        call("fsmount", libc::SYS_fsmount, [-1, 0, 0, 0, 0, 0]),
        call("fspick", libc::SYS_fspick, [-1, 0, 0, 0, 0, 0]),
        call(
            "mount_setattr",
            libc::SYS_mount_setattr,
            [-1, 0, 0, 0, 0, 0],
        ),
        call(
            "open_by_handle_at",
            libc::SYS_open_by_handle_at,
            [-1, 0, 0, 0, 0, 0],
        ),
        call(
            "name_to_handle_at",
            libc::SYS_name_to_handle_at,
            [-1, 0, 0, 0, 0, 0],
        ),
        // Another architecture's image (KEXEC_ARCH_ARM): EINVAL; and no
        // CAP_SYS_BOOT: EPERM first.
        call(
            "kexec_load",
            libc::SYS_kexec_load,
            [0, 0, 0, 0x0028_0000, 0, 0],
        ),
        call(
            "kexec_file_load",
            libc::SYS_kexec_file_load,
            [-1, -1, 0, 0, 0xffff, 0],
        ),
        call("init_module", libc::SYS_init_module, [0, 0, 0, 0, 0, 0]),
        call("finit_module", libc::SYS_finit_module, [-1, 0, 0, 0, 0, 0]),
        call("delete_module", libc::SYS_delete_module, [0, 0, 0, 0, 0, 0]),
        call("bpf", libc::SYS_bpf, [0xffff, 0, 0, 0, 0, 0]),
        call(
            "perf_event_open",
            libc::SYS_perf_event_open,
            [0, 0, -1, -1, 0, 0],
        ),
        call(
            "userfaultfd",
            libc::SYS_userfaultfd,
            [0xffff_ffff, 0, 0, 0, 0, 0],
        ),
        call("keyctl", libc::SYS_keyctl, [0xffff, 0, 0, 0, 0, 0]),
        call("add_key", libc::SYS_add_key, [0, 0, 0, 0, 0, 0]),
        call("request_key", libc::SYS_request_key, [0, 0, 0, 0, 0, 0]),
        // Wrong magic: EINVAL (and EPERM first without CAP_SYS_BOOT).
        call("reboot", libc::SYS_reboot, [0, 0, 0, 0, 0, 0]),
        call("swapon", libc::SYS_swapon, [0, 0, 0, 0, 0, 0]),
        call("swapoff", libc::SYS_swapoff, [0, 0, 0, 0, 0, 0]),
        // Level 4 and a port range past 64 Ki: EINVAL.
        call("iopl", libc::SYS_iopl, [4, 0, 0, 0, 0, 0]),
        call("ioperm", libc::SYS_ioperm, [0x1_0000, 1, 0, 0, 0, 0]),
        // Pointer 1: EFAULT (after EPERM without CAP_SYS_PACCT).
        call("acct", libc::SYS_acct, [1, 0, 0, 0, 0, 0]),
        // Quota type 0xff: EINVAL.
        call("quotactl", libc::SYS_quotactl, [0xff, 0, 0, 0, 0, 0]),
        call("settimeofday", libc::SYS_settimeofday, [1, 1, 0, 0, 0, 0]),
        call(
            "clock_settime",
            libc::SYS_clock_settime,
            [i(libc::CLOCK_REALTIME), 1, 0, 0, 0, 0],
        ),
        call(
            "clock_adjtime",
            libc::SYS_clock_adjtime,
            [i(libc::CLOCK_REALTIME), 1, 0, 0, 0, 0],
        ),
        call("adjtimex", libc::SYS_adjtimex, [1, 0, 0, 0, 0, 0]),
        call("syslog", libc::SYS_syslog, [9999, 0, 0, 0, 0, 0]),
        // Without CAP_SYS_TTY_CONFIG: EPERM.
        call("vhangup", libc::SYS_vhangup, [0; 6]),
        // 0xffffffff only asks.
        call(
            "personality",
            libc::SYS_personality,
            [0xffff_ffff, 0, 0, 0, 0, 0],
        ),
    ]
}

/// And what no VMM thread may do, although the launcher's own threads do
/// it: open files, make sockets, signal processes, change credentials.
fn denied_to_vmm_threads() -> Vec<Probe> {
    let refused = || everywhere(Want::Refused);
    let call = |name: &str, nr: i64, a: [i64; 6]| probe(name, refused(), move |_| sys(nr, a));
    vec![
        call("open", libc::SYS_open, [0, 0, 0, 0, 0, 0]),
        call("openat2", libc::SYS_openat2, [-1, 0, 0, 0, 0, 0]),
        call("creat", libc::SYS_creat, [0, 0, 0, 0, 0, 0]),
        call("socket", libc::SYS_socket, [-1, 0, 0, 0, 0, 0]),
        call("connect", libc::SYS_connect, [-1, 0, 0, 0, 0, 0]),
        call("bind", libc::SYS_bind, [-1, 0, 0, 0, 0, 0]),
        call("kill", libc::SYS_kill, [NOWHERE, 0, 0, 0, 0, 0]),
        call("tkill", libc::SYS_tkill, [NOWHERE, 0, 0, 0, 0, 0]),
        call("setuid", libc::SYS_setuid, [-1, 0, 0, 0, 0, 0]),
        call("setresuid", libc::SYS_setresuid, [-1, -1, -1, 0, 0, 0]),
        call("setgid", libc::SYS_setgid, [-1, 0, 0, 0, 0, 0]),
        call("setresgid", libc::SYS_setresgid, [-1, -1, -1, 0, 0, 0]),
        call("setgroups", libc::SYS_setgroups, [-1, 0, 0, 0, 0, 0]),
        call("capset", libc::SYS_capset, [0, 0, 0, 0, 0, 0]),
        call(
            "landlock_restrict_self",
            libc::SYS_landlock_restrict_self,
            [-1, 0, 0, 0, 0, 0],
        ),
    ]
}

/// Runs `probes` under `enter` (one thread for all), reaps any child, and
/// returns the calls whose outcome is not what `want` says for `kind`.
fn misses(
    probes: &Arc<Vec<Probe>>,
    ctx: &Context,
    kind: ThreadKind,
    enter: impl FnOnce(Box<dyn FnOnce() -> Vec<Outcome> + Send>) -> Vec<Outcome>,
) -> Vec<String> {
    let (list, context) = (probes.clone(), ctx.clone());
    let outcomes = enter(Box::new(move || {
        list.iter().map(|p| (p.call)(&context)).collect()
    }));
    let mut misses = Vec::new();
    for (p, got) in probes.iter().zip(outcomes) {
        if p.creates {
            reap(got);
        }
        let want = (p.want)(kind);
        if !want.check(got) {
            misses.push(format!("{kind:?}: {}: got {got:?}, want {want:?}", p.name));
        }
    }
    misses
}

#[test]
fn every_argument_rule_allows_what_it_names_and_refuses_the_rest_on_every_kind() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new(&dir);
    let sandbox = test_sandbox();
    let probes = Arc::new(argument_probes());
    let mut all = Vec::new();
    for kind in ThreadKind::ALL {
        all.extend(misses(&probes, &ctx, kind, |run| {
            under_kind(&sandbox, kind, run)
        }));
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

#[test]
fn no_vmm_thread_may_make_any_call_of_the_denylist_or_open_connect_signal_or_change_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new(&dir);
    let sandbox = test_sandbox();
    let mut probes: Vec<Probe> = denied_everywhere().into_iter().map(|(_, p)| p).collect();
    probes.extend(denied_to_vmm_threads());
    let probes = Arc::new(probes);
    let mut all = Vec::new();
    for kind in ThreadKind::ALL {
        all.extend(misses(&probes, &ctx, kind, |run| {
            under_kind(&sandbox, kind, run)
        }));
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

#[test]
fn the_launchers_denylist_refuses_each_of_its_calls_and_forks() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = Context::new(&dir);
    let denied = denied_everywhere();
    // Every entry has its probe (a new one needs one here).
    for nr in filters::HOST_DENYLIST {
        assert!(
            denied.iter().any(|(probed, _)| probed == nr),
            "no probe for system call {nr} of the denylist"
        );
    }
    let mut probes: Vec<Probe> = denied.into_iter().map(|(_, p)| p).collect();
    // Threads start (clone3 falls back to clone with CLONE_THREAD), forks
    // do not, clone3 never makes a child.
    probes.push(creating_probe(
        "clone with CLONE_THREAD",
        everywhere(Want::Passes),
        |_| creating_call(libc::SYS_clone, [i(libc::CLONE_THREAD), 0, 0, 0, 0]),
    ));
    probes.push(creating_probe(
        "clone a process",
        everywhere(Want::Refused),
        |_| creating_call(libc::SYS_clone, [i(libc::SIGCHLD), 0, 0, 0, 0]),
    ));
    probes.push(creating_probe(
        "clone3 without CLONE_THREAD",
        everywhere(Want::Is(Outcome::Err(libc::ENOSYS))),
        |_| clone3_fork(),
    ));
    // What the launcher does go on doing.
    probes.push(probe("socket", everywhere(Want::Passes), |_| {
        let out = sys(
            libc::SYS_socket,
            [
                i(libc::AF_UNIX),
                i(libc::SOCK_STREAM | libc::SOCK_CLOEXEC),
                0,
                0,
                0,
                0,
            ],
        );
        if let Outcome::Ok(fd) = out {
            sys(libc::SYS_close, [fd, 0, 0, 0, 0, 0]);
        }
        out
    }));
    let probes = Arc::new(probes);
    // The kind only labels the report here.
    let all = misses(&probes, &ctx, ThreadKind::Control, |run| {
        under_denylist(run)
    });
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// glibc 2.34+ starts threads with clone3 and falls back to clone on
/// ENOSYS: a thread starts under the filters of the kinds that start
/// threads and under the launcher's denylist, and its children cannot use
/// clone3 to fork either.
#[test]
fn threads_start_under_every_filter_that_allows_them_while_clone3_gets_enosys() {
    fn spawn_and_probe() -> (Result<Outcome, String>, Outcome) {
        let child = std::thread::Builder::new()
            .spawn(clone3_fork)
            .map_err(|e| e.to_string())
            .and_then(|t| t.join().map_err(|_| "the thread panicked".to_string()));
        (child, clone3_fork())
    }
    let sandbox = test_sandbox();
    let enosys = Outcome::Err(libc::ENOSYS);
    for kind in ThreadKind::ALL.into_iter().filter(|k| k.spawns_threads()) {
        let (child, own) = under_kind(&sandbox, kind, spawn_and_probe);
        reap(own);
        if let Ok(got) = child {
            reap(got);
        }
        assert_eq!(
            child,
            Ok(enosys),
            "{kind:?}: a thread started, clone3 in it"
        );
        assert_eq!(own, enosys, "{kind:?}");
    }
    let (child, own) = under_denylist(spawn_and_probe);
    reap(own);
    if let Ok(got) = child {
        reap(got);
    }
    assert_eq!(
        child,
        Ok(enosys),
        "launcher: a thread started, clone3 in it"
    );
    assert_eq!(own, enosys, "launcher");
}

#[test]
fn every_filter_compiles_in_every_mode() {
    for mode in [SeccompMode::Log, SeccompMode::Trap] {
        let action = filters::mismatch_action(mode).unwrap();
        for kind in ThreadKind::ALL {
            assert!(
                !filters::compile(kind, action.clone(), std::process::id())
                    .unwrap()
                    .is_empty()
            );
        }
        assert_eq!(host_denylist_programs(mode).unwrap().len(), 2);
    }
    assert!(filters::mismatch_action(SeccompMode::None).is_none());
    assert!(
        host_denylist_programs(SeccompMode::None)
            .unwrap()
            .is_empty()
    );
}

#[test]
fn only_the_kinds_that_start_threads_may_clone_or_add_filters() {
    for kind in ThreadKind::ALL {
        let allowed = filters::allowed(kind);
        for nr in [
            libc::SYS_clone,
            libc::SYS_clone3,
            libc::SYS_seccomp,
            libc::SYS_prctl,
        ] {
            assert_eq!(
                allowed.contains(&nr),
                kind.spawns_threads(),
                "{kind:?}: {nr}"
            );
        }
    }
}

#[test]
fn a_thread_started_by_another_may_only_need_what_its_parent_allows() {
    // It inherits its parent's filter: a call outside it would trap even
    // if the child's own filter allowed it.
    for child in ThreadKind::ALL {
        let Some(parent) = child.parent() else {
            continue;
        };
        let parent_allows = filters::allowed(parent);
        for nr in filters::allowed(child) {
            assert!(
                parent_allows.contains(&nr),
                "{child:?} needs {nr}, {parent:?} refuses it"
            );
        }
    }
}

#[test]
fn each_kind_has_its_allowlist_over_the_two_layers() {
    let programs = inspect::programs_for_process(SeccompMode::Trap, std::process::id()).unwrap();
    assert_eq!(programs.layers.len(), 2);
    for kind in ThreadKind::ALL {
        assert!(programs.allowlists.contains_key(&kind), "{kind:?}");
    }
    let none = inspect::programs_for_process(SeccompMode::None, 1).unwrap();
    assert!(none.layers.is_empty() && none.allowlists.is_empty());
}

/// A filter really stops a call: the block I/O filter, built to return
/// EPERM instead of trapping, on a thread of this test process.
#[test]
fn the_block_io_filter_allows_disk_io_and_refuses_opening_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk");
    std::fs::write(&path, b"0123456789").unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let program = filters::compile(
        ThreadKind::BlockIo,
        seccompiler::SeccompAction::Errno(libc::EPERM.cast_unsigned()),
        std::process::id(),
    )
    .unwrap();
    let (read, opened) = std::thread::spawn(move || {
        seccompiler::apply_filter(&program).unwrap();
        let mut buf = [0u8; 4];
        let read = file.read_at(&mut buf, 3).map(|_| buf);
        let opened = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map(|_| ());
        (
            read.map_err(|e| e.kind()),
            opened.map_err(|e| e.raw_os_error()),
        )
    })
    .join()
    .unwrap();
    assert_eq!(read, Ok(*b"3456"));
    assert_eq!(opened, Err(Some(libc::EPERM)));
}

/// glibc's lazy reads must fail cleanly, not trap; and no VMM thread may
/// open a file, read-only or not (through std, as glibc's own reads).
#[test]
fn read_only_opens_fail_with_eacces_on_every_thread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("file");
    std::fs::write(&path, b"x").unwrap();
    let sandbox = test_sandbox();
    for kind in ThreadKind::ALL {
        let path = path.clone();
        let (read_only, writable) = under_kind(&sandbox, kind, move || {
            let read_only = std::fs::File::open(&path).map(|_| ());
            let writable = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map(|_| ());
            (
                read_only.map_err(|e| e.raw_os_error()),
                writable.map_err(|e| e.raw_os_error()),
            )
        });
        assert_eq!(read_only, Err(Some(libc::EACCES)), "{kind:?}");
        assert_eq!(writable, Err(Some(FILTERED)), "{kind:?}");
    }
}

#[test]
fn seccomp_modes_parse() {
    assert_eq!("none".parse::<SeccompMode>(), Ok(SeccompMode::None));
    assert_eq!("log".parse::<SeccompMode>(), Ok(SeccompMode::Log));
    assert_eq!("trap".parse::<SeccompMode>(), Ok(SeccompMode::Trap));
    assert!("kill".parse::<SeccompMode>().is_err());
    assert_eq!(SeccompMode::default(), SeccompMode::Trap);
}

#[test]
fn thread_names_give_their_kinds() {
    use inspect::kind_of_thread;
    assert_eq!(kind_of_thread("vcpu0"), Some(ThreadKind::Vcpu));
    assert_eq!(kind_of_thread("vcpu12"), Some(ThreadKind::Vcpu));
    assert_eq!(kind_of_thread("virtio-blk"), Some(ThreadKind::VirtioBlock));
    assert_eq!(kind_of_thread("virtio-blk-io3"), Some(ThreadKind::BlockIo));
    assert_eq!(kind_of_thread("virtio-net"), Some(ThreadKind::VirtioNet));
    assert_eq!(kind_of_thread("virtio-rng"), Some(ThreadKind::VirtioRng));
    assert_eq!(
        kind_of_thread("serial-accept"),
        Some(ThreadKind::ConsoleAccept)
    );
    assert_eq!(
        kind_of_thread("serial-input"),
        Some(ThreadKind::ConsoleInput)
    );
    assert_eq!(kind_of_thread("boot-disk"), Some(ThreadKind::BootLoader));
    assert_eq!(kind_of_thread("acpi-ged"), Some(ThreadKind::IrqResample));
    for other in [
        "vcpu",
        "vcpux",
        "virtio-blk-io",
        "tokio-runtime-w",
        "virt-launcher",
    ] {
        assert_eq!(kind_of_thread(other), None, "{other}");
    }
}
