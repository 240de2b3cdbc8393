//! `vmm run`'s threads in their sandbox, seen from outside: while the
//! guest runs, every thread (vCPU, each device thread, the block I/O
//! threads, the console threads, the signal watcher and the main thread)
//! runs under exactly its kind's seccomp programs (read back with
//! `PTRACE_SECCOMP_GET_FILTER` and compared with what the VMM builds for
//! that process), and `/proc/<pid>/task/*/status` shows `Seccomp: 2`,
//! `NoNewPrivs: 1` and, since the tests run as root, not root any more.
//!
//! Needs root (a tap in a private network namespace) and /dev/kvm.

mod common;

use common::*;
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use virtio_devices::net::test_tap::{create_tap, in_new_netns};
use vmm::sandbox::{SeccompMode, ThreadKind, inspect};

/// One thread's sandbox as its status file shows it.
#[derive(Debug)]
struct ThreadStatus {
    name: String,
    tid: u32,
    seccomp: String,
    no_new_privs: String,
    /// Effective and permitted capabilities.
    caps: (String, String),
    /// Real, effective, saved and file-system uid.
    uids: String,
}

fn field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_string())
        .unwrap_or_default()
}

fn threads(pid: u32) -> Vec<ThreadStatus> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).expect("task dir") {
        let path = task.expect("task entry").path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue; // ended meanwhile
        };
        let Some(tid) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse().ok())
        else {
            continue;
        };
        out.push(ThreadStatus {
            name: comm.trim().to_string(),
            tid,
            seccomp: field(&status, "Seccomp:"),
            no_new_privs: field(&status, "NoNewPrivs:"),
            uids: field(&status, "Uid:"),
            caps: (field(&status, "CapEff:"), field(&status, "CapPrm:")),
        });
    }
    out
}

/// Reads the console socket until `needle` appears.
fn wait_console(socket: &std::path::Path, needle: &str, timeout: Duration) -> (UnixStream, String) {
    let deadline = Instant::now() + timeout;
    let mut stream = loop {
        match UnixStream::connect(socket) {
            Ok(s) => break s,
            Err(e) => {
                assert!(Instant::now() < deadline, "console socket: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut text = String::new();
    let mut buf = [0u8; 4096];
    while !text.contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} on the console:\n{text}"
        );
        if let Ok(n) = stream.read(&mut buf) {
            text.push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    }
    (stream, text)
}

/// Kernel threads KVM runs inside the VMM's process (NX huge page
/// recovery): not VMM code, and not filterable.
fn is_kernel_thread(name: &str) -> bool {
    name.starts_with("kvm-")
}

/// The kind of a thread of `vmm run`: the VMM's own, or its main thread and
/// signal watcher, which enter the control threads' sandbox.
fn kind(name: &str) -> Option<ThreadKind> {
    match name {
        "vmm" | "signals" => Some(ThreadKind::Control),
        other => inspect::kind_of_thread(other),
    }
}

/// The lengths of a thread's programs, oldest first (for reports).
fn lengths<T>(programs: &[Vec<T>]) -> Vec<usize> {
    programs.iter().map(Vec::len).collect()
}

/// Checks that thread `tid` of `vmm run` (process `pid`) runs under exactly
/// the programs of its kind: the refusal layers and its allowlist, or for a
/// thread started by another, its parent's layers and allowlist, then its
/// own.
fn check_filters(pid: u32, name: &str, tid: u32) -> Result<(), String> {
    let kind = kind(name).ok_or_else(|| format!("thread {name}: not a VMM thread"))?;
    let got = inspect::thread_filters(tid).map_err(|e| format!("{name}: {e}"))?;
    let want = inspect::programs_for_process(SeccompMode::Trap, pid)
        .unwrap()
        .for_thread(kind);
    if got == want {
        return Ok(());
    }
    Err(format!(
        "thread {name} ({kind:?}) runs under programs of lengths {:?}, want {:?}",
        lengths(&got),
        lengths(&want),
    ))
}

#[test]
fn every_thread_of_vmm_run_is_filtered_and_unprivileged() {
    in_new_netns(|| {
        create_tap("vmm-sbx0");
        let dir = tempdir();
        let kernel = guest_elf(&dir);
        let disk = dir.path().join("disk.raw");
        std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
        let console = dir.path().join("console.sock");
        // The block bench sends two requests per notification for a while:
        // the device thread starts its I/O threads (cache=none).
        let mut child = vmm()
            .arg("run")
            .arg("--kernel")
            .arg(&kernel)
            .args([
                "--cmdline",
                "checks=virtio-blk,virtio-blk-bench,virtio-net,virtio-rng blkbench.n=3000 \
                 blkbench.depth=2 net.rx_ms=10 exit=halt wait=300",
                "--net",
                "tap=vmm-sbx0",
                "--rng",
            ])
            .arg("--disk")
            .arg(format!("path={},format=raw,cache=none", disk.display()))
            .arg("--serial")
            .arg(format!("unix:{}", console.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vmm run");
        let pid = child.id();
        let (console_stream, _) =
            wait_console(&console, "BENCH virtio-blk start", Duration::from_secs(120));
        // I/O threads exist while the bench runs (the guest's reset of the
        // device stops them afterwards).
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut io_threads = Vec::new();
        // Read back while it lives.
        let mut io_filters = Err("no block I/O thread appeared".to_string());
        while io_filters.is_err() {
            assert!(Instant::now() < deadline, "{io_filters:?}");
            io_threads = threads(pid)
                .into_iter()
                .filter(|t| t.name.starts_with("virtio-blk-io"))
                .collect();
            if let Some(t) = io_threads.first() {
                io_filters = check_filters(pid, &t.name, t.tid);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(console_stream);
        // The checks are done and the guest waits; our console connection
        // started an input thread.
        let (_console, text) = wait_console(&console, "DONE passed=", Duration::from_secs(300));
        let mut threads = threads(pid);
        let wrong: Vec<String> = threads
            .iter()
            .filter(|t| !is_kernel_thread(&t.name))
            .filter_map(|t| check_filters(pid, &t.name, t.tid).err())
            .collect();
        let _ = Command::new("kill").arg(pid.to_string()).status();
        let mut stderr = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut stderr);
        let status = child.wait().unwrap();

        threads.extend(io_threads);
        threads.retain(|t| !is_kernel_thread(&t.name));
        let names: Vec<&str> = threads.iter().map(|t| t.name.as_str()).collect();
        for expected in [
            "vmm",
            "vcpu0",
            "virtio-blk",
            "virtio-blk-io0",
            "virtio-net",
            "virtio-rng",
            "serial-accept",
            "serial-input",
            "signals",
        ] {
            assert!(
                names.contains(&expected),
                "no thread {expected:?} in {names:?}\nconsole:\n{text}\nstderr:\n{stderr}"
            );
        }
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        for t in &threads {
            assert_eq!(t.seccomp, "2", "{t:?}: no seccomp filter");
            assert_eq!(t.no_new_privs, "1", "{t:?}");
            if root {
                assert_eq!(t.uids, "65534\t65534\t65534\t65534", "{t:?}: still root");
            }
            let none = "0000000000000000".to_string();
            assert_eq!(t.caps, (none.clone(), none), "{t:?}: capabilities left");
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        assert!(text.contains("TEST virtio-blk-batch PASS"), "{text}");
        assert!(text.contains("TEST virtio-blk-bench PASS"), "{text}");
        // The guest reset on the shutdown request (SIGTERM): no trapped
        // system call on the way out either.
        assert_eq!(status.code(), Some(0), "{stderr}");
    });
}
