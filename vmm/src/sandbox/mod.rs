//! The sandbox every VMM thread enters before it touches guest memory or
//! guest-controlled data.
//!
//! Each thread, at its own start (never with seccomp's TSYNC):
//!
//! 1. **Credentials.** The thread drops every capability. In a process
//!    running as root (a root VMI's launcher, `vmm run` by root) it first
//!    switches to an unprivileged user
//!    ([`SandboxConfig::unprivileged`]: KubeVirt's `qemu`, 107, in the
//!    launcher; `nobody` for `vmm run`), losing every capability. Linux keeps
//!    credentials per thread; the raw system calls change only the calling
//!    thread (glibc's `setuid` would change every thread of the process, the
//!    launcher's gRPC server included). Everything the VM needs is opened
//!    before (`/dev/kvm`, vCPUs, disks, the tap, the console socket), and an
//!    open descriptor keeps working for its new owner. Why threads and not a
//!    child process: the launcher keeps one address space with its VMM
//!    (`VmHandle` calls, stats, one process to account for), and threads that
//!    are non-root, capability-less, `no_new_privs`, Landlocked and
//!    seccomp-filtered cannot open, exec, signal other processes or change
//!    credentials. What remains: a thread that gets arbitrary code execution
//!    shares memory with the launcher's root threads and could corrupt them,
//!    which a separate VMM process (Firecracker's jailer, crosvm's minijail)
//!    would prevent; see the threat model in `vmm/docs/sandbox.md`.
//! 2. **`PR_SET_NO_NEW_PRIVS`.**
//! 3. **Landlock** (where the kernel has it): no file system access and no
//!    TCP; the VMM threads open nothing after start-up. A kernel without
//!    Landlock is logged once and the thread goes on.
//! 4. **seccomp**: the system calls of its [`ThreadKind`] and no more
//!    ([`filters`]), with ioctl numbers, `mmap`/`mprotect` protections,
//!    `clone` flags, `futex` operations, `madvise` advice and the target and
//!    signal of `tgkill` filtered by argument, over two refusal layers
//!    (read-only opens fail with `EACCES`, `clone3` with `ENOSYS`). A call
//!    outside the filter is, by
//!    [`SeccompMode`]: `trap` (default, as Firecracker's and Cloud
//!    Hypervisor's): SIGSYS, the process reports the call and exits with
//!    status 159 (as a shell reports a SIGSYS death); `log`: allowed and
//!    logged by the kernel (the audit log, `dmesg`); `none`: no filter.
//!
//! Threads started by a sandboxed thread (virtio-blk's I/O threads, the
//! serial console's input threads) inherit the credentials, `no_new_privs`,
//! Landlock domain and filter of their parent and add their own, narrower,
//! filter.

pub(crate) mod filters;
#[doc(hidden)]
pub mod inspect;
mod landlock;
mod sigsys;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use seccompiler::BpfProgram;
use virtio_bindings::virtio_ids::{VIRTIO_ID_BLOCK, VIRTIO_ID_NET, VIRTIO_ID_RNG};
use virtio_devices::{ThreadRole, ThreadSandbox};

/// What happens to a system call outside a thread's filter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SeccompMode {
    /// No filter.
    None,
    /// Allowed, and logged by the kernel.
    Log,
    /// SIGSYS: the VMM reports the call and exits with status 159.
    #[default]
    Trap,
}

impl std::str::FromStr for SeccompMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(SeccompMode::None),
            "log" => Ok(SeccompMode::Log),
            "trap" => Ok(SeccompMode::Trap),
            other => Err(format!(
                "unknown seccomp mode {other:?} (none, log or trap)"
            )),
        }
    }
}

/// A user and group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
}

/// `nobody:nogroup`, who `vmm run` started by root runs its threads as.
pub(crate) const NOBODY: Credentials = Credentials {
    uid: 65534,
    gid: 65534,
};

/// How the VMM's threads are confined.
#[derive(Clone, Debug)]
pub struct SandboxConfig {
    pub seccomp: SeccompMode,
    /// Restrict file access with Landlock where the kernel has it.
    pub landlock: bool,
    /// Who the VMM's threads run as when the process runs as root (never
    /// root itself); ignored in a process that is not root. `None` keeps
    /// the process's credentials: only for tests and fuzzing of device
    /// code, never for a VMM that runs a guest.
    pub unprivileged: Option<Credentials>,
    /// Test hook (the `testing` feature only): a thread of this kind makes
    /// a system call outside its filter (opens a file) right after entering
    /// its sandbox.
    #[cfg(feature = "testing")]
    pub forbidden_syscall_on: Option<ThreadKind>,
}

impl Default for SandboxConfig {
    fn default() -> Self {
        SandboxConfig {
            seccomp: SeccompMode::Trap,
            landlock: true,
            unprivileged: Some(NOBODY),
            #[cfg(feature = "testing")]
            forbidden_syscall_on: None,
        }
    }
}

impl SandboxConfig {
    /// A sandbox with these settings (and no test hook: a struct literal would have to name
    /// it in test builds only).
    pub fn new(seccomp: SeccompMode, landlock: bool, unprivileged: Option<Credentials>) -> Self {
        SandboxConfig {
            seccomp,
            landlock,
            unprivileged,
            #[cfg(feature = "testing")]
            forbidden_syscall_on: None,
        }
    }

    /// No confinement at all (tests and fuzzing of device code).
    pub fn disabled() -> Self {
        SandboxConfig {
            seccomp: SeccompMode::None,
            landlock: false,
            unprivileged: None,
            #[cfg(feature = "testing")]
            forbidden_syscall_on: None,
        }
    }
}

/// The kinds of VMM threads, each with its own filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadKind {
    /// Runs a vCPU (`KVM_RUN`) and the devices on its exits.
    Vcpu,
    /// A virtio-blk device's thread.
    VirtioBlock,
    /// A virtio-blk I/O thread (started by the device thread).
    BlockIo,
    /// A virtio-net device's thread (tap and both queues).
    VirtioNet,
    /// A virtio-rng device's thread.
    VirtioRng,
    /// Holds a level-triggered interrupt line up (the ACPI GED's `acpi-ged`): waits on
    /// KVM's resample eventfd and raises the line again (`devices::irq::LevelIrqLine`).
    IrqResample,
    /// Accepts clients of the serial console socket.
    ConsoleAccept,
    /// Types one console client's input into the guest (started by the
    /// accept thread).
    ConsoleInput,
    /// The control threads of `vmm run` (main, signal watcher) once the VM
    /// has started.
    Control,
    /// Reads the boot disk (partition tables, filesystems, boot loader configuration)
    /// and decompresses its kernel, before the VM runs (`crate::boot_disk`).
    BootLoader,
}

impl ThreadKind {
    pub(crate) const ALL: [ThreadKind; 10] = [
        ThreadKind::Vcpu,
        ThreadKind::VirtioBlock,
        ThreadKind::BlockIo,
        ThreadKind::VirtioNet,
        ThreadKind::VirtioRng,
        ThreadKind::IrqResample,
        ThreadKind::ConsoleAccept,
        ThreadKind::ConsoleInput,
        ThreadKind::Control,
        ThreadKind::BootLoader,
    ];

    /// The kind's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vCPU",
            ThreadKind::VirtioBlock => "virtio-blk",
            ThreadKind::BlockIo => "block I/O",
            ThreadKind::VirtioNet => "virtio-net",
            ThreadKind::VirtioRng => "virtio-rng",
            ThreadKind::IrqResample => "irq resample",
            ThreadKind::ConsoleAccept => "console accept",
            ThreadKind::ConsoleInput => "console input",
            ThreadKind::Control => "control",
            ThreadKind::BootLoader => "boot loader",
        }
    }

    /// The kind of thread that starts this one, whose credentials, Landlock
    /// domain and filters it inherits.
    pub fn parent(self) -> Option<ThreadKind> {
        match self {
            ThreadKind::BlockIo => Some(ThreadKind::VirtioBlock),
            ThreadKind::ConsoleInput => Some(ThreadKind::ConsoleAccept),
            _ => None,
        }
    }

    /// Started by another sandboxed thread (see [`ThreadKind::parent`]).
    fn inherits(self) -> bool {
        self.parent().is_some()
    }

    /// Whether threads of this kind start threads (each with its own
    /// narrower filter): only they may `clone` (with `CLONE_THREAD`) and
    /// add a seccomp filter.
    pub fn spawns_threads(self) -> bool {
        matches!(self, ThreadKind::VirtioBlock | ThreadKind::ConsoleAccept)
    }

    fn from_role(role: ThreadRole) -> io::Result<ThreadKind> {
        match role {
            ThreadRole::BlockIo => Ok(ThreadKind::BlockIo),
            ThreadRole::Device(VIRTIO_ID_BLOCK) => Ok(ThreadKind::VirtioBlock),
            ThreadRole::Device(VIRTIO_ID_NET) => Ok(ThreadKind::VirtioNet),
            ThreadRole::Device(VIRTIO_ID_RNG) => Ok(ThreadKind::VirtioRng),
            ThreadRole::Device(other) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!("no sandbox for virtio device type {other}"),
            )),
        }
    }
}

/// Why a sandbox could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    #[error("cannot build the {kind:?} seccomp filter: {message}")]
    Filter { kind: ThreadKind, message: String },
    #[error("cannot install the SIGSYS handler: {0}")]
    Signal(#[source] io::Error),
}

/// The compiled filters and settings, shared by every thread of a VM.
pub struct Sandbox {
    config: SandboxConfig,
    /// Each kind's allowlist.
    filters: HashMap<ThreadKind, BpfProgram>,
    /// Installed under the allowlist of every thread that inherits none:
    /// read-only opens fail with `EACCES`, `clone3` with `ENOSYS`
    /// (`filters::compile_layers`). Empty without seccomp.
    layers: Vec<BpfProgram>,
    /// Directories the control threads may remove files from (the console
    /// socket's, which `vmm run` removes at the end).
    removable_in: Vec<PathBuf>,
}

impl Sandbox {
    /// Compiles every filter (on the start-up thread: compiling allocates
    /// and must not fail later on a sandboxed thread).
    ///
    /// The filters are this process's: `tgkill` reaches only thread group
    /// `getpid()` as it is now (seccomp compares arguments with constants).
    /// A `Sandbox` is per process: one built before a `fork` is not for the
    /// child, whose vCPU kicks its filters would refuse (and VMM threads
    /// cannot fork).
    pub fn new(
        config: SandboxConfig,
        removable_in: Vec<PathBuf>,
    ) -> Result<Arc<Sandbox>, SandboxError> {
        let action = filters::mismatch_action(config.seccomp);
        if action == Some(seccompiler::SeccompAction::Trap) {
            sigsys::install().map_err(SandboxError::Signal)?;
        }
        Sandbox::build(config, removable_in, std::process::id(), action).map(Arc::new)
    }

    /// The filters of process `pid`, calls outside an allowlist getting
    /// `mismatch` (`None`: no filters).
    fn build(
        config: SandboxConfig,
        removable_in: Vec<PathBuf>,
        pid: u32,
        mismatch: Option<seccompiler::SeccompAction>,
    ) -> Result<Sandbox, SandboxError> {
        let mut compiled = HashMap::new();
        let mut layers = Vec::new();
        if let Some(action) = mismatch {
            layers = filters::compile_layers().map_err(|e| SandboxError::Filter {
                kind: ThreadKind::Control,
                message: format!("refusal layers: {e}"),
            })?;
            for kind in ThreadKind::ALL {
                let program = filters::compile(kind, action.clone(), pid).map_err(|e| {
                    SandboxError::Filter {
                        kind,
                        message: e.to_string(),
                    }
                })?;
                compiled.insert(kind, program);
            }
        }
        Ok(Sandbox {
            config,
            filters: compiled,
            layers,
            removable_in,
        })
    }

    /// The compiled filter of `kind` (`None` without seccomp), for
    /// measuring what it costs (`cargo bench -p vmm --bench seccomp`).
    pub fn filter(&self, kind: ThreadKind) -> Option<&BpfProgram> {
        self.filters.get(&kind)
    }

    /// The programs [`Sandbox::enter`] installs on a thread of `kind`, in
    /// order: the refusal layers and the allowlist, or only the allowlist
    /// for a thread that inherits its parent's.
    fn own_programs(&self, kind: ThreadKind) -> Vec<&BpfProgram> {
        let Some(allowlist) = self.filters.get(&kind) else {
            return Vec::new();
        };
        let mut programs: Vec<&BpfProgram> = if kind.inherits() {
            Vec::new()
        } else {
            self.layers.iter().collect()
        };
        programs.push(allowlist);
        programs
    }

    /// Confines the calling thread as a thread of `kind`. On error the
    /// thread must end without touching guest memory.
    pub fn enter(&self, kind: ThreadKind) -> io::Result<()> {
        if !kind.inherits() {
            if let Some(to) = self.config.unprivileged {
                drop_credentials(to)?;
                drop_capabilities()?;
            }
            set_no_new_privs()?;
            if self.config.landlock {
                let removable: &[PathBuf] = if kind == ThreadKind::Control {
                    &self.removable_in
                } else {
                    &[]
                };
                landlock::restrict_thread(removable)?;
            }
        }
        sigsys::set_thread_kind(kind.name());
        // An inheriting thread has its parent's layers already.
        for program in self.own_programs(kind) {
            seccompiler::apply_filter(program)
                .map_err(|e| io::Error::other(format!("seccomp filter for {kind:?}: {e}")))?;
        }
        #[cfg(feature = "testing")]
        if self.config.forbidden_syscall_on == Some(kind) {
            forbidden_syscall(kind);
        }
        Ok(())
    }
}

impl ThreadSandbox for Sandbox {
    fn enter(&self, role: ThreadRole) -> io::Result<()> {
        Sandbox::enter(self, ThreadKind::from_role(role)?)
    }
}

/// Installs, on the calling thread and every thread it starts from now on,
/// the denylist of a process that embeds the VMM (the launcher): no exec,
/// fork (`clone` without `CLONE_THREAD`; `clone3` fails with `ENOSYS`),
/// ptrace, mounts, namespaces, module loading, bpf, keyrings... (see
/// `filters::HOST_DENYLIST`). Call it first thing in `main`, before any other
/// thread exists. Its VMM threads add their own allowlists on top.
pub fn apply_host_denylist(mode: SeccompMode) -> io::Result<()> {
    let programs = host_denylist_programs(mode)?;
    if programs.is_empty() {
        return Ok(());
    }
    if mode == SeccompMode::Trap {
        sigsys::install()?;
    }
    set_no_new_privs()?;
    for program in &programs {
        seccompiler::apply_filter(program)
            .map_err(|e| io::Error::other(format!("host denylist: {e}")))?;
    }
    Ok(())
}

/// The programs [`apply_host_denylist`] installs, in order (none under
/// [`SeccompMode::None`]). Public for tests that read a launcher thread's
/// filters back.
#[doc(hidden)]
pub fn host_denylist_programs(mode: SeccompMode) -> io::Result<Vec<BpfProgram>> {
    let Some(action) = filters::mismatch_action(mode) else {
        return Ok(Vec::new());
    };
    filters::host_denylist_programs(action)
        .map_err(|e| io::Error::other(format!("host denylist: {e}")))
}

/// Switches this thread (only) to `to` if it runs as root: supplementary
/// groups cleared, then group, then user (real, effective, saved); all
/// capabilities go with uid 0. Raw system calls: glibc's wrappers would
/// switch every thread of the process.
fn drop_credentials(to: Credentials) -> io::Result<()> {
    let (mut r, mut e, mut s) = (0, 0, 0);
    // SAFETY: getresuid writes three ids into the locals.
    if unsafe { libc::getresuid(&mut r, &mut e, &mut s) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if r != 0 && e != 0 && s != 0 {
        return Ok(());
    }
    if to.uid == 0 || to.gid == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the unprivileged user for VMM threads must not be root",
        ));
    }
    let raw = |what: &str, rc: libc::c_long| {
        if rc == 0 {
            Ok(())
        } else {
            let e = io::Error::last_os_error();
            Err(io::Error::new(e.kind(), format!("{what}: {e}")))
        }
    };
    // SAFETY: plain system calls on this thread's credentials; setgroups
    // with size 0 does not read the (null) list.
    unsafe {
        raw(
            "setgroups",
            libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()),
        )?;
        raw(
            "setresgid",
            libc::syscall(libc::SYS_setresgid, to.gid, to.gid, to.gid),
        )?;
        raw(
            "setresuid",
            libc::syscall(libc::SYS_setresuid, to.uid, to.uid, to.uid),
        )?;
    }
    // SAFETY: plain reads of this thread's ids.
    if unsafe { libc::geteuid() } == 0 || unsafe { libc::getuid() } == 0 {
        return Err(io::Error::other("the thread is still root"));
    }
    Ok(())
}

/// Clears this thread's capabilities: a non-root launcher may hold some
/// (KubeVirt's gives it `NET_BIND_SERVICE` for DHCP), which its VMM threads
/// have no use for. (Leaving uid 0 already cleared them for a root one.)
fn drop_capabilities() -> io::Result<()> {
    use caps::CapSet;
    for set in [
        CapSet::Ambient,
        CapSet::Effective,
        CapSet::Permitted,
        CapSet::Inheritable,
    ] {
        caps::clear(None, set).map_err(|e| io::Error::other(format!("capabilities: {e}")))?;
    }
    Ok(())
}

fn set_no_new_privs() -> io::Result<()> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The test hook's forbidden call: creating a file (`openat` for writing),
/// which no VMM thread does. Under `trap` the process ends here; under
/// `log` the kernel logs it and Landlock refuses it.
#[cfg(feature = "testing")]
fn forbidden_syscall(kind: ThreadKind) {
    // No pid in the name: getpid is outside some filters. Only a failing
    // test creates it, and removes it at once.
    let path = std::env::temp_dir().join("vmm-sandbox-hook");
    let result = std::fs::File::create(&path);
    if result.is_ok() {
        let _ = std::fs::remove_file(&path);
    }
    // Straight to stderr: the test reads it from a process without a
    // tracing subscriber.
    eprintln!(
        "sandbox test hook: {kind:?} thread created a file: {:?}",
        result.as_ref().map(|_| ()).map_err(|e| e.to_string())
    );
}
