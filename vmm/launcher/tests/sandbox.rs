//! The launcher's VMM threads in their sandbox, seen from outside while the
//! test guest runs: every VMM thread (vCPU, device threads, block I/O
//! threads, console threads) runs under the launcher's denylist and exactly
//! its kind's seccomp programs (read back with `PTRACE_SECCOMP_GET_FILTER`
//! and compared with what the VMM builds for this process), has
//! `NoNewPrivs: 1` and runs as KubeVirt's unprivileged `qemu` user (107)
//! although the launcher runs as root; the rest of the launcher (its tokio
//! runtime, the gRPC server) stays root under the denylist alone.

mod common;

use common::*;
use proto::domain::{LifeCycle, StateChangeReason};
use std::time::Duration;
use vmm::sandbox::{SeccompMode, ThreadKind, inspect};

/// The block bench sends two requests per notification for a while: the
/// device thread starts its I/O threads (the disk is cache=none).
const ARGS: &str = "console=ttyS0 checks=serial,virtio-blk,virtio-blk-bench,virtio-rng \
                    blkbench.n=3000 blkbench.depth=2 exit=halt wait=600";

#[derive(Debug)]
struct ThreadStatus {
    name: String,
    tid: u32,
    seccomp: String,
    no_new_privs: String,
    /// Effective and permitted capabilities.
    caps: (String, String),
    uids: String,
}

fn threads(pid: u32) -> Vec<ThreadStatus> {
    let field = |status: &str, key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| v.trim().to_string())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let path = task.unwrap().path();
        let (Ok(comm), Ok(status)) = (
            std::fs::read_to_string(path.join("comm")),
            std::fs::read_to_string(path.join("status")),
        ) else {
            continue;
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

/// Kernel threads KVM runs inside the process (NX huge page recovery):
/// not launcher code, and not filterable.
fn is_kernel_thread(name: &str) -> bool {
    name.starts_with("kvm-")
}

/// The lengths of a thread's programs, oldest first (for reports: the
/// programs themselves are thousands of instructions).
fn lengths<T>(programs: &[Vec<T>]) -> Vec<usize> {
    programs.iter().map(Vec::len).collect()
}

/// Checks that thread `tid` runs under exactly the programs it should: the
/// launcher's denylist, and for a VMM thread of `kind` the programs the VMM
/// builds for this launcher process (pid: `tgkill` only within it).
fn check_filters(pid: u32, name: &str, tid: u32, kind: Option<ThreadKind>) -> Result<(), String> {
    let got = match inspect::thread_filters(tid) {
        Ok(got) => got,
        // A launcher thread that ended meanwhile (tokio's blocking pool).
        Err(_)
            if kind.is_none()
                && !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() =>
        {
            return Ok(());
        }
        Err(e) => return Err(format!("{name}: {e}")),
    };
    // What each thread should hold, oldest first: the denylist; on a VMM
    // thread, the refusal layers and its allowlist, or for a thread started
    // by another, its parent's layers and allowlist, then its own.
    let mut want = vmm::sandbox::host_denylist_programs(SeccompMode::Trap).unwrap();
    if let Some(kind) = kind {
        want.extend(
            inspect::programs_for_process(SeccompMode::Trap, pid)
                .unwrap()
                .for_thread(kind),
        );
    }
    if got == want {
        return Ok(());
    }
    Err(format!(
        "thread {name} ({kind:?}) runs under programs of lengths {:?}, want {:?}{}",
        lengths(&got),
        lengths(&want),
        if lengths(&got) == lengths(&want) {
            " (same lengths, other instructions)"
        } else {
            ""
        }
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vmm_threads_are_filtered_and_run_as_qemu_while_the_launcher_stays_root() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    ok(
        cmd.sync_virtual_machine(vmi_request(vmi_json(ARGS, serde_json::json!({})))),
        "sync",
    )
    .await;
    notify
        .expect(
            Duration::from_secs(60),
            "Running",
            |_: &str, d: &proto::domain::Domain| {
                d.status.status == LifeCycle::Running
                    && d.status.reason == StateChangeReason::Unknown
            },
        )
        .await;
    // The block bench runs shortly after the start; its I/O threads live
    // while it runs (the guest's reset of the device stops them).
    let log = pod
        .paths
        .serial_log(&launcher::paths::PathName::vmi_uid(UID).unwrap());
    let console = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    while !console().contains("BENCH virtio-blk start") {
        assert!(
            std::time::Instant::now() < deadline,
            "the bench did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pid = launcher.child.id();
    let mut io_threads = Vec::new();
    // Read back while it lives: an I/O thread under its own allowlist on
    // top of the device thread's.
    let mut io_filters = Err("no block I/O thread appeared".to_string());
    while io_filters.is_err() {
        assert!(std::time::Instant::now() < deadline, "{io_filters:?}");
        io_threads = threads(pid)
            .into_iter()
            .filter(|t| t.name.starts_with("virtio-blk-io"))
            .collect();
        if let Some(t) = io_threads.first() {
            io_filters = check_filters(pid, &t.name, t.tid, Some(ThreadKind::BlockIo));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    while !console().contains("DONE passed=") {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest did not finish its checks"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut threads = threads(pid);
    threads.extend(io_threads);
    threads.retain(|t| !is_kernel_thread(&t.name));
    let names: Vec<&str> = threads.iter().map(|t| t.name.as_str()).collect();
    for expected in [
        "vcpu0",
        "virtio-blk",
        "virtio-blk-io0",
        "virtio-rng",
        "serial-accept",
        "serial-input",
        "acpi-ged",
    ] {
        assert!(
            names.contains(&expected),
            "no thread {expected:?} in {names:?}"
        );
    }
    let mut wrong = Vec::new();
    for t in &threads {
        // The denylist covers the whole launcher; VMM threads add their own.
        assert_eq!(t.seccomp, "2", "{t:?}");
        assert_eq!(t.no_new_privs, "1", "{t:?}");
        let kind = inspect::kind_of_thread(&t.name);
        // The I/O thread was read back above (it may be gone by now).
        if kind != Some(ThreadKind::BlockIo)
            && let Err(e) = check_filters(pid, &t.name, t.tid, kind)
        {
            wrong.push(e);
        }
        if kind.is_some() {
            assert_eq!(
                t.uids, "107\t107\t107\t107",
                "{t:?}: a VMM thread runs as root"
            );
            let none = "0000000000000000".to_string();
            assert_eq!(t.caps, (none.clone(), none), "{t:?}: capabilities left");
        } else {
            assert_eq!(
                t.uids, "0\t0\t0\t0",
                "{t:?}: the launcher's own threads stay root"
            );
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The VM still works (reading the filters stopped each thread for a
    // moment): a kill ends it the usual way.
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.kill_virtual_machine(vmi_request(vmi)), "kill").await;
}
