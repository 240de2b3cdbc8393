//! Block benchmark through the guest (not a test): `vmm run` boots the test
//! guest with `checks=virtio-blk-bench`, which streams N requests to a
//! virtio-blk disk, and the harness reads every VMM thread's CPU time
//! (`/proc/<pid>/task/*/schedstat`, nanoseconds) when the guest prints
//! `BENCH virtio-blk start` and again at its `TEST virtio-blk-bench` line.
//!
//! Reported per request: wall time, vCPU thread CPU, device-side CPU (the
//! virtio-blk thread and its I/O threads) and the rest of the process; and
//! throughput. On machines where KVM emulates guest code (see
//! vmm/docs/stock-kernel.md) the guest's own instructions dominate the
//! wall time and the vCPU thread's CPU: the device share is the part that
//! moves between threads.
//!
//! The guest then waits for a shutdown request (so that no thread has
//! ended before the second reading), which the harness sends with SIGTERM.
//!
//! Run: `cargo bench -p vmm-cli --bench blk` (BLK_BENCH_RUNS, default 5;
//! BLK_BENCH_N requests, default 2000; BLK_BENCH_CASES, `op:KiB:cache:wait`
//! each, default `read:4:writeback:spin,read:64:writeback:spin,
//! write:4:none:spin,write:4:none:irq`; BENCH_VARIANTS to
//! compare binaries or options, interleaved, see `common`; the disk goes in
//! BLK_BENCH_DIR, default /var/tmp, which must allow O_DIRECT).

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Instant;

const MEMORY_MIB: u64 = 64;
const DISK_MIB: u64 = 64;

struct Case {
    op: String,
    kb: u64,
    cache: String,
    /// How the guest waits for an answer: spin or irq.
    wait: String,
}

struct Sample {
    wall_s: f64,
    requests: u64,
    bytes: u64,
    vcpu_ns: u64,
    device_ns: u64,
    other_ns: u64,
}

fn delta(before: &HashMap<String, u64>, after: &HashMap<String, u64>) -> (u64, u64, u64) {
    let (mut vcpu, mut device, mut other) = (0, 0, 0);
    for (name, &ns) in after {
        let d = ns.saturating_sub(before.get(name).copied().unwrap_or(0));
        if name.starts_with("vcpu") {
            vcpu += d;
        } else if name.starts_with("virtio-blk") {
            device += d;
        } else {
            other += d;
        }
    }
    (vcpu, device, other)
}

fn one_run(
    variant: &common::Variant,
    kernel: &str,
    disk: &str,
    case: &Case,
    requests: u64,
) -> Sample {
    let cmdline = format!(
        "console=ttyS0 checks=virtio-blk-bench blkbench.n={requests} blkbench.kb={} blkbench.op={} blkbench.wait={} exit=halt wait=120",
        case.kb, case.op, case.wait
    );
    let mut child = Command::new(&variant.binary)
        .args([
            "run",
            "--kernel",
            kernel,
            "--memory",
            &MEMORY_MIB.to_string(),
        ])
        .args(["--cmdline", &cmdline, "--serial", "stdout"])
        .arg("--disk")
        .arg(format!("path={disk},format=raw,cache={}", case.cache))
        .args(&variant.extra_args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vmm");
    let pid = child.id();
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut start = None;
    let mut end = None;
    let mut result = String::new();
    for line in stdout.lines() {
        let Ok(line) = line else { break };
        if line.starts_with("BENCH virtio-blk start") {
            start = Some((Instant::now(), common::threads::thread_cpu(pid)));
        } else if line.starts_with("TEST virtio-blk-bench") {
            end = Some((Instant::now(), common::threads::thread_cpu(pid)));
            result = line;
            // The guest now waits (its threads are still there to read):
            // SIGTERM asks it to shut down.
            let pid = libc::pid_t::try_from(pid).expect("a Linux pid fits a pid_t");
            // SAFETY: signalling our own child.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
    }
    let status = child.wait().expect("wait for vmm");
    let stderr = stderr.join().unwrap_or_default();
    let (Some((t0, cpu0)), Some((t1, cpu1))) = (start, end) else {
        panic!("no bench lines from the guest ({status}); stderr: {stderr}");
    };
    assert!(
        result.contains(" PASS ") && status.success(),
        "{result} ({status}); stderr: {stderr}"
    );
    let field = |key: &str| -> u64 {
        result
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.parse().ok())
            .unwrap_or(0)
    };
    let (vcpu_ns, device_ns, other_ns) = delta(&cpu0, &cpu1);
    Sample {
        wall_s: (t1 - t0).as_secs_f64(),
        requests: field("requests="),
        bytes: field("bytes="),
        vcpu_ns,
        device_ns,
        other_ns,
    }
}

fn main() {
    let runs = common::env::number("BLK_BENCH_RUNS", 5);
    let requests = common::env::number("BLK_BENCH_N", 2000);
    let cases = common::env::cases(
        "BLK_BENCH_CASES",
        "read:4:writeback:spin,read:64:writeback:spin,write:4:none:spin,write:4:none:irq",
        "op:kb:cache:wait",
        |_, parts| Case {
            op: parts[0].into(),
            kb: parts[1].parse().expect("kb"),
            cache: parts[2].into(),
            wait: parts[3].into(),
        },
    );
    let vmm = env!("CARGO_BIN_EXE_vmm");
    let variants = common::variants(vmm);
    let base = std::env::var("BLK_BENCH_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let kernel = dir.path().join("test-guest.elf");
    let ok = Command::new(vmm)
        .args(["test-guest", "--output"])
        .arg(&kernel)
        .status()
        .expect("vmm test-guest")
        .success();
    assert!(ok);
    let disk = dir.path().join("disk.raw");
    std::fs::write(&disk, vec![0x5au8; int_cast::u64_to_usize(DISK_MIB << 20)])
        .expect("disk image");
    let (kernel, disk) = (kernel.to_str().unwrap(), disk.to_str().unwrap());

    println!(
        "block benchmark: {runs} runs per case and variant, interleaved; {requests} requests each, one per notification ({MEMORY_MIB} MiB guest, {DISK_MIB} MiB raw disk)"
    );
    println!(
        "{:<15} {:<26} {:>8} {:>9} {:>9} {:>12} {:>12} {:>12}",
        "variant", "case", "req/s", "MiB/s", "wall_us", "vcpu_us/req", "dev_us/req", "other_us/req"
    );
    let mut all: HashMap<(usize, usize), Vec<Sample>> = HashMap::new();
    for _ in 0..runs {
        for (c, case) in cases.iter().enumerate() {
            for (v, variant) in variants.iter().enumerate() {
                let s = one_run(variant, kernel, disk, case, requests);
                let per = |ns: u64| ns as f64 / 1e3 / s.requests.max(1) as f64;
                println!(
                    "{:<15} {:<26} {:>8.0} {:>9.2} {:>9.1} {:>12.1} {:>12.1} {:>12.1}",
                    variant.label,
                    format!("{} {}K {} {}", case.op, case.kb, case.cache, case.wait),
                    s.requests as f64 / s.wall_s,
                    s.bytes as f64 / s.wall_s / f64::from(1 << 20),
                    s.wall_s * 1e6 / s.requests.max(1) as f64,
                    per(s.vcpu_ns),
                    per(s.device_ns),
                    per(s.other_ns),
                );
                all.entry((c, v)).or_default().push(s);
            }
        }
    }
    println!("medians:");
    for (c, case) in cases.iter().enumerate() {
        for (v, variant) in variants.iter().enumerate() {
            let samples = &all[&(c, v)];
            let median = |f: &dyn Fn(&Sample) -> f64| {
                let mut xs: Vec<f64> = samples.iter().map(f).collect();
                xs.sort_by(|a, b| a.total_cmp(b));
                xs[xs.len() / 2]
            };
            let per = |ns: u64, s: &Sample| ns as f64 / 1e3 / s.requests.max(1) as f64;
            println!(
                "{:<15} {:<26} {:>8.0} {:>9.2} {:>9.1} {:>12.1} {:>12.1} {:>12.1}",
                variant.label,
                format!("{} {}K {} {}", case.op, case.kb, case.cache, case.wait),
                median(&|s| s.requests as f64 / s.wall_s),
                median(&|s| s.bytes as f64 / s.wall_s / f64::from(1 << 20)),
                median(&|s| s.wall_s * 1e6 / s.requests.max(1) as f64),
                median(&|s| per(s.vcpu_ns, s)),
                median(&|s| per(s.device_ns, s)),
                median(&|s| per(s.other_ns, s)),
            );
        }
    }
}
