//! When each process first entered `KVM_RUN`, measured from outside and
//! the same way for every VMM: one system-wide `perf record` of the
//! `syscalls:sys_enter_ioctl` tracepoint, filtered in the kernel to
//! `cmd == KVM_RUN`, stamped with CLOCK_MONOTONIC, for the whole benchmark
//! (one perf process, not one per run; it traces no other system call).
//! Needs `perf` and root (or a low `perf_event_paranoid`); without them the
//! benchmark reports the VMM's own stamp only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// `_IO(KVMIO, 0x80)`.
const KVM_RUN: u32 = 0xae80;

pub struct KvmRunTrace {
    perf: Child,
    data: PathBuf,
    _dir: tempfile::TempDir,
}

impl KvmRunTrace {
    /// Starts tracing; `None` (with the reason printed) when perf cannot.
    pub fn start() -> Option<Self> {
        let dir = tempfile::tempdir().ok()?;
        let data = dir.path().join("kvm_run.data");
        let mut perf = Command::new("perf")
            .args(["record", "-q", "-a", "-k", "CLOCK_MONOTONIC"])
            .args(["-e", "syscalls:sys_enter_ioctl", "--filter"])
            .arg(format!("cmd == {KVM_RUN:#x}"))
            .arg("-o")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| println!("no KVM_RUN trace: cannot run perf: {e}"))
            .ok()?;
        // perf needs a moment to open its events; it writes the file header
        // once they are open.
        for _ in 0..200 {
            if std::fs::metadata(&data).is_ok_and(|m| m.len() > 0) {
                std::thread::sleep(std::time::Duration::from_millis(200));
                return Some(Self {
                    perf,
                    data,
                    _dir: dir,
                });
            }
            if let Ok(Some(status)) = perf.try_wait() {
                println!("no KVM_RUN trace: perf record exited with {status}");
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        println!("no KVM_RUN trace: perf record did not start");
        let _ = perf.kill();
        let _ = perf.wait();
        None
    }

    /// Stops tracing: the first `KVM_RUN` (CLOCK_MONOTONIC ns) of each process.
    pub fn finish(mut self) -> HashMap<u32, u64> {
        let raw_pid = libc::pid_t::try_from(self.perf.id()).expect("a pid fits a pid_t");
        // SAFETY: signalling our own child; perf flushes and exits on SIGINT.
        unsafe { libc::kill(raw_pid, libc::SIGINT) };
        let _ = self.perf.wait();
        let mut first = HashMap::new();
        let Ok(out) = Command::new("perf")
            .args(["script", "-F", "pid,time", "--ns", "-i"])
            .arg(&self.data)
            .stderr(Stdio::null())
            .output()
        else {
            return first;
        };
        // Lines: "  PID  SECONDS.NANOSECONDS:".
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let mut words = line.split_whitespace();
            let (Some(pid), Some(time)) = (words.next(), words.next()) else {
                continue;
            };
            let (Ok(pid), Some((s, ns))) = (
                pid.parse::<u32>(),
                time.trim_end_matches(':').split_once('.'),
            ) else {
                continue;
            };
            let (Ok(s), Ok(ns)) = (s.parse::<u64>(), ns.parse::<u64>()) else {
                continue;
            };
            let t = s * 1_000_000_000 + ns;
            first
                .entry(pid)
                .and_modify(|v: &mut u64| *v = (*v).min(t))
                .or_insert(t);
        }
        first
    }
}
