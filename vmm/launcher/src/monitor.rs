//! virt-launcher-monitor: the compute container's PID 1 (proto/CONTRACT.md §4.3).
//!
//! Starts `virt-launcher` with the same flags (less `--keep-after-failure`),
//! reaps every child (as PID 1 it inherits orphans), forwards SIGTERM,
//! SIGINT and SIGQUIT to the launcher as SIGTERM, and exits with the
//! launcher's status after removing the container-disk sockets.
//!
//! The compute container runs as a non-root user with only
//! `NET_BIND_SERVICE`; an exec by a non-root user would drop it. As in
//! KubeVirt (the monitor binary carries the file capability, and
//! `virt-launcher-monitor.go` starts the launcher with `AmbientCaps`), the
//! monitor raises it as an ambient capability so that the launcher keeps
//! it across the exec: its DHCP server binds port 67.

use nix::sys::signal::{SigSet, Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the monitor itself reads from the launcher's flags.
#[derive(Debug, Default, PartialEq)]
pub struct MonitorArgs {
    pub container_disk_dir: PathBuf,
    pub keep_after_failure: bool,
    /// The flags passed on to the launcher.
    pub launcher_args: Vec<OsString>,
}

/// Splits the monitor's command line (everything after the program name).
pub fn parse_args(args: impl IntoIterator<Item = OsString>) -> MonitorArgs {
    let mut out = MonitorArgs {
        container_disk_dir: "/var/run/kubevirt/container-disks".into(),
        ..Default::default()
    };
    let mut args = args.into_iter().peekable();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        match text.as_str() {
            "--keep-after-failure" | "--keep-after-failure=true" => {
                out.keep_after_failure = true;
                continue;
            }
            "--keep-after-failure=false" => continue,
            "--container-disk-dir" => {
                out.launcher_args.push(arg);
                if let Some(value) = args.next() {
                    out.container_disk_dir = PathBuf::from(&value);
                    out.launcher_args.push(value);
                }
                continue;
            }
            _ => {}
        }
        if let Some(value) = text.strip_prefix("--container-disk-dir=") {
            out.container_disk_dir = PathBuf::from(value);
        }
        out.launcher_args.push(arg);
    }
    out
}

/// The launcher binary: `$VIRT_LAUNCHER_BINARY`, else `virt-launcher` next
/// to this program, else `/usr/bin/virt-launcher`.
pub(crate) fn launcher_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("VIRT_LAUNCHER_BINARY") {
        return path.into();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("virt-launcher")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "/usr/bin/virt-launcher".into())
}

/// Runs the monitor; returns its exit status.
pub fn run(args: MonitorArgs) -> i32 {
    let mut handled = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGQUIT,
    ] {
        handled.add(s);
    }
    // Block the signals so they queue for sigwait; the child starts with an
    // unblocked mask (restored in pre_exec).
    if let Err(e) = handled.thread_block() {
        eprintln!("virt-launcher-monitor: cannot block signals: {e}");
        return 1;
    }
    pass_on_net_bind_service();
    let binary = launcher_binary();
    let mut command = Command::new(&binary);
    command.args(&args.launcher_args);
    let unblock = handled;
    // SAFETY: pre_exec runs in the forked child before exec; it only calls
    // the async-signal-safe sigprocmask.
    unsafe {
        command.pre_exec(move || {
            unblock
                .thread_unblock()
                .map_err(|e| std::io::Error::from_raw_os_error(e as i32))
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "virt-launcher-monitor: cannot start {}: {e}",
                binary.display()
            );
            return 1;
        }
    };
    // Linux PIDs fit a pid_t (pid_max is at most 2^22); a wrapped one would make kill(2)
    // signal a process group, so a PID that does not fit stops here instead.
    let Ok(raw_pid) = libc::pid_t::try_from(child.id()) else {
        eprintln!(
            "virt-launcher-monitor: pid {} does not fit a pid_t",
            child.id()
        );
        let _ = child.kill();
        return 1;
    };
    let launcher = Pid::from_raw(raw_pid);
    let mut status = None;
    while status.is_none() {
        let signal = match handled.wait() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("virt-launcher-monitor: sigwait: {e}");
                continue;
            }
        };
        match signal {
            Signal::SIGCHLD => status = reap(launcher),
            other => {
                eprintln!("virt-launcher-monitor: {other}: stopping the launcher");
                let _ = kill(launcher, Signal::SIGTERM);
            }
        }
    }
    let code = status.unwrap_or(1);
    remove_container_disk_sockets(&args.container_disk_dir);
    if code != 0 && args.keep_after_failure {
        eprintln!("virt-launcher-monitor: launcher failed ({code}); kept alive until signalled");
        let _ = handled.wait();
    }
    code
}

/// Raises `CAP_NET_BIND_SERVICE` as an ambient capability (inherited by the
/// launcher across its exec) when this process is permitted to: the file
/// capability of the monitor binary, or root. Without it the launcher runs
/// without the capability, and its DHCP server reports the bind error.
pub(crate) fn pass_on_net_bind_service() {
    use caps::{CapSet, Capability};
    let cap = Capability::CAP_NET_BIND_SERVICE;
    match caps::has_cap(None, CapSet::Permitted, cap) {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            eprintln!("virt-launcher-monitor: cannot read capabilities: {e}");
            return;
        }
    }
    // An ambient capability must be permitted and inheritable.
    let raised = caps::raise(None, CapSet::Inheritable, cap)
        .and_then(|()| caps::raise(None, CapSet::Ambient, cap));
    if let Err(e) = raised {
        eprintln!("virt-launcher-monitor: cannot pass NET_BIND_SERVICE to the launcher: {e}");
    }
}

/// Reaps every exited child; returns the launcher's exit status once it is gone.
fn reap(launcher: Pid) -> Option<i32> {
    let mut launcher_status = None;
    loop {
        match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == launcher => launcher_status = Some(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == launcher => {
                launcher_status = Some(128 + sig as i32)
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return launcher_status,
            Ok(_) => {} // an orphan we inherited as PID 1
        }
    }
}

/// Container-disk sidecars exit once their socket disappears.
fn remove_container_disk_sockets(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "sock") {
            let _ = std::fs::remove_file(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(args: &[&str]) -> Vec<OsString> {
        args.iter().map(OsString::from).collect()
    }

    #[test]
    fn monitor_flags_are_split_off() {
        let parsed = parse_args(os(&[
            "--qemu-timeout",
            "240s",
            "--container-disk-dir",
            "/cd",
            "--keep-after-failure",
            "--uid",
            "u",
        ]));
        assert!(parsed.keep_after_failure);
        assert_eq!(parsed.container_disk_dir, PathBuf::from("/cd"));
        assert_eq!(
            parsed.launcher_args,
            os(&[
                "--qemu-timeout",
                "240s",
                "--container-disk-dir",
                "/cd",
                "--uid",
                "u"
            ])
        );
        let parsed = parse_args(os(&["--container-disk-dir=/x"]));
        assert_eq!(parsed.container_disk_dir, PathBuf::from("/x"));
        assert!(!parsed.keep_after_failure);
    }
}
