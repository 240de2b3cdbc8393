//! A launcher process held by a pidfd from the first contact.
//!
//! The handler learns a launcher's PID from its socket and then works through
//! `/proc/<pid>` (the pod's root for the notify pipe, the DHCP cache and device ownership; its
//! network namespace for the pod network). A PID is only a number: once its process has exited
//! and been reaped, another process can get it, and `/proc/<pid>` is then that process's. So
//! the handler takes a pidfd at the first contact (`SO_PEERPIDFD`, the listener's own process,
//! whatever its PID became) and, for every use, opens `/proc/<pid>/<entry>` and only then
//! checks the pidfd: a process that is still alive after the open held the PID all along, so
//! the descriptor is its. A launcher that is gone gives a "has exited" error, never another
//! process's entry.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use nix::fcntl::OFlag;
use nix::sys::socket::{getsockopt, sockopt::PeerPidfd};
use nix::sys::stat::Mode;

/// A launcher process: its PID (in the handler's PID namespace) and a pidfd naming it.
#[derive(Debug)]
pub struct LauncherProcess {
    pid: u32,
    pidfd: OwnedFd,
}

/// The error of a launcher whose process has exited.
fn stale(pid: u32) -> std::io::Error {
    std::io::Error::other(format!(
        "the launcher process (PID {pid}) has exited: /proc/{pid} may now be another process's, \
         so nothing is done through it"
    ))
}

fn pidfd_open(pid: u32) -> std::io::Result<OwnedFd> {
    let pid = libc::pid_t::try_from(pid)
        .map_err(|_| std::io::Error::other(format!("invalid PID {pid}")))?;
    // SAFETY: pidfd_open takes a PID and flags and returns a new descriptor or -1; no memory
    // is passed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = RawFd::try_from(fd).map_err(|_| std::io::Error::other("pidfd out of range"))?;
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl LauncherProcess {
    /// The process listening on a pinned launcher socket, held by a pidfd (its PID is in
    /// the handler's PID namespace: the handler must share the host's, `hostPID`, to see
    /// launchers).
    pub(crate) fn listening_on(socket: &crate::podfs::PinnedSocket) -> std::io::Result<Self> {
        Self::of_peer(&socket.connect()?)
    }

    /// The process listening on the other end of `stream` (a connection to a launcher
    /// socket). The pidfd comes from the socket itself (`SO_PEERPIDFD`, Linux 6.5), so a
    /// listener that exited before this contact is refused even if its PID was reused; on
    /// older kernels it is opened from the `SO_PEERCRED` PID, which catches every exit from
    /// now on but not one before.
    pub(crate) fn of_peer(stream: &UnixStream) -> std::io::Result<Self> {
        let pid = crate::podfs::peer_pid_of(stream)?;
        let pidfd = match getsockopt(stream, PeerPidfd) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ESRCH) => return Err(stale(pid)),
            Err(nix::errno::Errno::ENOPROTOOPT) => {
                pidfd_open(pid).map_err(|e| match e.raw_os_error() {
                    Some(libc::ESRCH) => stale(pid),
                    _ => e,
                })?
            }
            Err(e) => return Err(std::io::Error::from(e)),
        };
        let process = LauncherProcess { pid, pidfd };
        process.check()?;
        Ok(process)
    }

    /// The process `pid` as it is now (tests; the handler takes launchers from their socket).
    #[cfg(test)]
    pub(crate) fn open(pid: u32) -> std::io::Result<Self> {
        Ok(LauncherProcess {
            pid,
            pidfd: pidfd_open(pid)?,
        })
    }

    /// The PID this process had at the first contact (for messages).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Ok while the process has not been reaped, so its PID is still its own (a signal 0
    /// through the pidfd: `ESRCH` once the process is gone).
    pub(crate) fn check(&self) -> std::io::Result<()> {
        // SAFETY: pidfd_send_signal with signal 0 only checks the target; the info pointer
        // may be null, and the descriptor is owned by `self`.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_raw_fd(),
                0,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if rc == 0 {
            return Ok(());
        }
        match std::io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ESRCH) => Err(stale(self.pid)),
            // Not ours to signal, but there: still the same process.
            e if e.raw_os_error() == Some(libc::EPERM) => Ok(()),
            e => Err(e),
        }
    }

    /// Opens `/proc/<pid>/<entry>` and returns it only if the process was still alive after
    /// the open (so the entry was this process's, not a later holder's of the PID).
    fn open_entry(&self, entry: &str, flags: OFlag) -> std::io::Result<OwnedFd> {
        self.check()?;
        let path = format!("/proc/{}/{entry}", self.pid);
        let fd = nix::fcntl::open(path.as_str(), flags | OFlag::O_CLOEXEC, Mode::empty()).map_err(
            |e| std::io::Error::new(std::io::Error::from(e).kind(), format!("{path}: {e}")),
        )?;
        self.check()?;
        Ok(fd)
    }

    /// The launcher's root directory (`/proc/<pid>/root`), held by a descriptor.
    pub(crate) fn root(&self) -> std::io::Result<ProcDir> {
        self.open_entry("root", OFlag::O_PATH | OFlag::O_DIRECTORY)
            .map(|fd| ProcDir { fd })
    }

    /// The launcher's network namespace (`/proc/<pid>/ns/net`), held by a descriptor.
    pub(crate) fn netns(&self) -> std::io::Result<ProcDir> {
        self.open_entry("ns/net", OFlag::O_RDONLY)
            .map(|fd| ProcDir { fd })
    }
}

/// An entry of a launcher's `/proc` directory, opened while the launcher was alive.
#[derive(Debug)]
pub(crate) struct ProcDir {
    fd: OwnedFd,
}

impl ProcDir {
    /// `/proc/self/fd/<n>`: a path the kernel resolves to exactly this entry, whatever the
    /// launcher's PID leads to by now. Valid while `self` lives.
    pub(crate) fn path(&self) -> PathBuf {
        crate::podfs::fd_path(&self.fd)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::Path;

    /// clone3's arguments (`struct clone_args`, Linux 5.5 with `set_tid`).
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
        set_tid: u64,
        set_tid_size: u64,
        cgroup: u64,
    }

    /// Forks a child, with PID `pid` when given (clone3's `set_tid`, which needs root), that
    /// runs `child` and exits; `child` may only make async-signal-safe calls.
    pub(crate) fn fork_at(pid: Option<libc::pid_t>, child: impl FnOnce()) -> libc::pid_t {
        let tid = pid.unwrap_or(0);
        let args = CloneArgs {
            exit_signal: u64::try_from(libc::SIGCHLD).expect("a small signal number"),
            set_tid: pid.map_or(0, |_| {
                u64::try_from(std::ptr::from_ref(&tid).addr()).expect("64-bit")
            }),
            set_tid_size: u64::from(pid.is_some()),
            ..Default::default()
        };
        // SAFETY: a fork (no CLONE_VM, no new stack): the child runs on its copy of this
        // stack, makes only async-signal-safe calls and exits without returning.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                std::ptr::from_ref(&args),
                std::mem::size_of::<CloneArgs>(),
            )
        };
        if rc == 0 {
            child();
            // SAFETY: ends the forked child without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        assert!(
            rc > 0,
            "clone3 (set_tid {pid:?}): {}",
            std::io::Error::last_os_error()
        );
        libc::pid_t::try_from(rc).expect("a PID")
    }

    /// A child that waits to be killed.
    pub(crate) fn sleeper(pid: Option<libc::pid_t>) -> libc::pid_t {
        fork_at(pid, || {
            loop {
                // SAFETY: pause only waits for a signal.
                unsafe { libc::pause() };
            }
        })
    }

    pub(crate) fn kill_and_reap(pid: libc::pid_t) {
        let pid = nix::unistd::Pid::from_raw(pid);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
    }

    fn pid_u32(pid: libc::pid_t) -> u32 {
        u32::try_from(pid).expect("a positive PID")
    }

    #[test]
    fn a_launcher_whose_pid_went_to_another_process_is_refused() {
        let launcher = sleeper(None);
        let process = LauncherProcess::open(pid_u32(launcher)).expect("pidfd");
        process.check().expect("alive");
        let root = process.root().expect("root while alive");
        assert!(root.path().join("proc").exists());
        process.netns().expect("netns while alive");
        kill_and_reap(launcher);
        // Another process now holds the launcher's PID.
        let impostor = sleeper(Some(launcher));
        assert!(Path::new(&format!("/proc/{launcher}/root")).exists());
        let refused = [
            process.check().map(drop),
            process.root().map(drop),
            process.netns().map(drop),
        ];
        kill_and_reap(impostor);
        for r in refused {
            let err = r.expect_err("the PID is another process's now");
            assert!(err.to_string().contains("has exited"), "{err}");
        }
        // A descriptor taken while the launcher lived keeps naming its root.
        assert!(root.path().join("proc").exists());
    }

    #[test]
    fn a_listener_that_exited_before_the_first_contact_is_refused() {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, UnixAddr, bind, socket};
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("launcher-sock");
        let sock = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        bind(sock.as_raw_fd(), &UnixAddr::new(&path).expect("addr")).expect("bind");
        // The socket's credentials are those of the process calling listen: a child that
        // then exits, leaving the listening socket to this process.
        let raw = sock.as_raw_fd();
        let listener = fork_at(None, || {
            // SAFETY: listen on a descriptor this child inherited; async-signal-safe.
            unsafe { libc::listen(raw, 8) };
        });
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(listener), None);
        let impostor = sleeper(Some(listener));
        let stream = UnixStream::connect(&path).expect("the listening socket still accepts");
        assert_eq!(
            crate::podfs::peer_pid_of(&stream).expect("peer pid"),
            pid_u32(listener),
            "SO_PEERCRED names the listener's old PID, now the impostor's"
        );
        let outcome = LauncherProcess::of_peer(&stream);
        kill_and_reap(impostor);
        match outcome {
            Err(e) => assert!(e.to_string().contains("has exited"), "{e}"),
            Ok(_)
                if getsockopt(&stream, PeerPidfd).err() == Some(nix::errno::Errno::ENOPROTOOPT) =>
            {
                eprintln!(
                    "kernel without SO_PEERPIDFD: an exit before the first contact is not seen"
                );
            }
            Ok(p) => panic!("the impostor (PID {}) was taken for the launcher", p.pid()),
        }
        drop(sock);
    }

    #[test]
    fn a_live_listener_is_its_own_process() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let stream = UnixStream::connect(&path).expect("connect");
        let process = LauncherProcess::of_peer(&stream).expect("this process");
        assert_eq!(process.pid(), std::process::id());
        let root = process.root().expect("root");
        assert_eq!(
            std::fs::canonicalize(root.path()).expect("canonical"),
            Path::new("/")
        );
    }
}
