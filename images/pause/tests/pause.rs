//! The pause binary against real signals and a real PID namespace (needs root for `unshare`).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PAUSE: &str = env!("CARGO_BIN_EXE_pause");

fn signal(pid: u32, signal: i32) {
    // SAFETY: signalling a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
}

fn wait_with_timeout(child: &mut Child, limit: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("the process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `pid` sits in `sigwait` (system call `rt_sigtimedwait`, 128 on x86_64): it has
/// set itself up. (`SigBlk` in /proc does not show it: the kernel unblocks the awaited signals
/// for the duration of the wait.)
fn wait_until_waiting(pid: u32) {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(30) {
        let syscall = std::fs::read_to_string(format!("/proc/{pid}/syscall")).unwrap_or_default();
        if syscall.split_whitespace().next() == Some("128") {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("pause never waited for its signals");
}

#[test]
fn sigterm_and_sigint_end_it_with_status_zero() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        let mut child = KillOnDrop(Command::new(PAUSE).stderr(Stdio::piped()).spawn().unwrap());
        wait_until_waiting(child.0.id());
        signal(child.0.id(), sig);
        let status = wait_with_timeout(&mut child.0, Duration::from_secs(30));
        assert_eq!(status.code(), Some(0), "signal {sig}");
    }
}

#[test]
fn dash_v_prints_the_version() {
    let out = Command::new(PAUSE).arg("-v").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("pause.rs "));
}

/// The children of `pid` (`/proc/<pid>/task/<pid>/children`).
fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|p| p.parse().ok())
        .collect()
}

/// As PID 1 of a PID namespace, pause inherits the orphans of that namespace and reaps them
/// when they exit: none stays a zombie.
#[test]
fn orphans_in_its_pid_namespace_are_reaped() {
    // --kill-child: if the test fails and the guard kills unshare, pause goes too.
    let mut unshare = KillOnDrop(
        Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child", PAUSE])
            .stderr(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux)"),
    );
    let start = Instant::now();
    let pause = loop {
        if let Some(&pid) = children(unshare.0.id()).first() {
            break pid;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "pause never started"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    wait_until_waiting(pause);
    // A shell in pause's namespace starts two background sleeps and exits: they become
    // pause's children, and exit soon after.
    let status = Command::new("nsenter")
        .args(["--target", &pause.to_string(), "--pid", "--"])
        .args(["sh", "-c", "sleep 2 & sleep 3 & exit 0"])
        .status()
        .expect("nsenter (util-linux)");
    assert!(status.success());
    let adopted = children(pause);
    assert!(!adopted.is_empty(), "the sleeps were adopted by pause");
    let start = Instant::now();
    loop {
        let left = children(pause);
        if left.is_empty() {
            break;
        }
        let states: Vec<String> = left
            .iter()
            .map(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .unwrap_or_default()
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim()
                    .chars()
                    .take(1)
                    .collect()
            })
            .collect();
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "children of pause never went away (states {states:?}: Z is an unreaped zombie)"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(pause, libc::SIGTERM);
    let status = wait_with_timeout(&mut unshare.0, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "pause exits 0 on SIGTERM as PID 1");
}

/// Kills (and reaps) the child when the test ends, even by a panic.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
