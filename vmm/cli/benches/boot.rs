//! Boot benchmark (not a test): starts `vmm run` with the test guest N times
//! and reports, per run and summarised:
//!
//! - process start → first `KVM_RUN`, → first serial byte, → VM exit (as
//!   stamped by the VMM with `VMM_TIMINGS=1`), → process exit;
//! - the VMM's resident memory excluding guest RAM.
//!
//! Times: the harness reads CLOCK_MONOTONIC just before spawning; the VMM
//! prints its own CLOCK_MONOTONIC stamps; the difference includes fork/exec,
//! the dynamic loader and `main`.
//!
//! Memory: while the VMM runs, /proc/<pid>/smaps is sampled every 2 ms. Guest
//! RAM is the one anonymous mapping of exactly the guest's size; its `Rss` is
//! the guest pages touched so far (by the guest or by the loader). Overhead =
//! total `Rss` minus that mapping's `Rss` (maximum over the samples), split
//! into anonymous memory (private to this VMM: heap, stacks, KVM pages) and
//! file-backed pages (binary and shared libraries, shared through the page
//! cache). `ru_maxrss` from wait4 (guest pages included, the figure
//! `/usr/bin/time` shows) is printed too.
//!
//! Run: `cargo bench -p vmm-cli --bench boot` (BOOT_BENCH_RUNS=N, default 20;
//! BOOT_BENCH_VCPUS, default 1; BENCH_VARIANTS to compare binaries or
//! options, interleaved: see `common`).

mod common;

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

const MEMORY_MIB: u64 = 128;

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec.cast_unsigned() * 1_000_000_000 + ts.tv_nsec.cast_unsigned()
}

/// Resident memory of the VMM in KiB, from /proc/<pid>/smaps.
#[derive(Clone, Copy, Default)]
struct Rss {
    /// Guest RAM pages touched.
    guest: u64,
    /// Anonymous memory other than guest RAM (heap, stacks, KVM run pages).
    anon: u64,
    /// File-backed pages (the vmm binary and shared libraries; shared with
    /// other processes through the page cache).
    file: u64,
}

fn sample_rss(pid: u32) -> Option<Rss> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let guest_kib = MEMORY_MIB * 1024;
    let mut rss = Rss::default();
    // (is guest RAM, is file-backed) of the current mapping.
    let mut current = (false, false);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: address perms offset dev inode [path].
            let inode = fields.nth(3).unwrap_or("0");
            current = (false, inode != "0");
            continue;
        }
        let value = fields.next().and_then(|v| v.parse::<u64>().ok());
        match (first, value) {
            ("Size:", Some(v)) => current.0 = !current.1 && v == guest_kib,
            ("Rss:", Some(v)) => match current {
                (true, _) => rss.guest += v,
                (false, true) => rss.file += v,
                (false, false) => rss.anon += v,
            },
            _ => {}
        }
    }
    (rss.anon + rss.file > 0).then_some(rss)
}

struct Run {
    first_kvm_run_ms: f64,
    first_serial_ms: f64,
    vm_exit_ms: f64,
    process_exit_ms: f64,
    /// Maxima over the samples.
    overhead_kib: u64,
    anon_kib: u64,
    file_kib: u64,
    guest_kib: u64,
    maxrss_kib: u64,
}

fn parse_timing(stderr: &str, key: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.starts_with("VMM_TIMING"))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn one_run(variant: &common::Variant, kernel: &str, vcpus: &str) -> Run {
    let mut cmd = Command::new(&variant.binary);
    cmd.args([
        "run",
        "--kernel",
        kernel,
        "--memory",
        &MEMORY_MIB.to_string(),
        "--vcpus",
        vcpus,
    ])
    .args([
        "--cmdline",
        "checks=serial,smp exit=poweroff",
        "--serial",
        "null",
    ])
    .args(&variant.extra_args)
    .env("VMM_TIMINGS", "1")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    let start = monotonic_ns();
    // Reaped below with wait4, which also returns its resource usage.
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().expect("spawn vmm");
    let pid = child.id();
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let (mut overhead_kib, mut anon_kib, mut file_kib, mut guest_kib) = (0, 0, 0, 0);
    // SAFETY: rusage is plain data; all-zero is valid.
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status = 0;
    let exit_ns = loop {
        if let Some(rss) = sample_rss(pid) {
            overhead_kib = overhead_kib.max(rss.anon + rss.file);
            anon_kib = anon_kib.max(rss.anon);
            file_kib = file_kib.max(rss.file);
            guest_kib = guest_kib.max(rss.guest);
        }
        let raw_pid = libc::pid_t::try_from(pid).expect("a Linux pid fits a pid_t");
        // SAFETY: waiting for our own child; rusage and status are valid out-pointers.
        let rc = unsafe { libc::wait4(raw_pid, &mut status, libc::WNOHANG, &mut rusage) };
        if rc == raw_pid {
            break monotonic_ns();
        }
        assert!(rc == 0, "wait4 failed: {}", std::io::Error::last_os_error());
        std::thread::sleep(Duration::from_millis(2));
    };
    let stderr = reader.join().unwrap_or_default();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "vmm run failed: {stderr}"
    );
    let ms = |key| {
        parse_timing(&stderr, key)
            .map(|t| (t.saturating_sub(start)) as f64 / 1e6)
            .unwrap_or(f64::NAN)
    };
    Run {
        first_kvm_run_ms: ms("first_kvm_run_ns"),
        first_serial_ms: ms("first_serial_byte_ns"),
        vm_exit_ms: ms("vm_exit_ns"),
        process_exit_ms: (exit_ns - start) as f64 / 1e6,
        overhead_kib,
        anon_kib,
        file_kib,
        guest_kib,
        maxrss_kib: u64::try_from(rusage.ru_maxrss).expect("maxrss is not negative"),
    }
}

fn main() {
    // `cargo bench` passes --bench; nothing else is understood.
    let runs: usize = std::env::var("BOOT_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let vcpus = std::env::var("BOOT_BENCH_VCPUS").unwrap_or_else(|_| "1".into());
    let vmm = env!("CARGO_BIN_EXE_vmm");
    let dir = tempfile::tempdir().expect("tempdir");
    let kernel = dir.path().join("test-guest.elf");
    let status = Command::new(vmm)
        .args(["test-guest", "--output"])
        .arg(&kernel)
        .status()
        .expect("vmm test-guest");
    assert!(status.success());
    let kernel = kernel.to_str().expect("utf-8 temp path").to_string();

    let variants = common::variants(vmm);
    println!(
        "boot benchmark: {runs} runs of `vmm run` per variant, interleaved (test guest, {MEMORY_MIB} MiB, {vcpus} vCPU, checks=serial,smp)"
    );
    println!(
        "variant       run  kvm_run_ms  serial_ms  vm_exit_ms  proc_exit_ms  overhead_KiB  anon_KiB  file_KiB  guest_KiB  maxrss_KiB"
    );
    let mut results: Vec<Vec<Run>> = variants.iter().map(|_| Vec::new()).collect();
    for i in 0..runs {
        for (v, variant) in variants.iter().enumerate() {
            let r = one_run(variant, &kernel, &vcpus);
            println!(
                "{:<12} {i:>4}  {:>10.2}  {:>9.2}  {:>10.2}  {:>12.2}  {:>12}  {:>8}  {:>8}  {:>9}  {:>10}",
                variant.label,
                r.first_kvm_run_ms,
                r.first_serial_ms,
                r.vm_exit_ms,
                r.process_exit_ms,
                r.overhead_kib,
                r.anon_kib,
                r.file_kib,
                r.guest_kib,
                r.maxrss_kib
            );
            results[v].push(r);
        }
    }
    for (variant, results) in variants.iter().zip(&results) {
        println!(
            "== {}: {} {}",
            variant.label,
            variant.binary,
            variant.extra_args.join(" ")
        );
        let summary = |name: &str, unit: &str, f: &dyn Fn(&Run) -> f64| {
            common::summary(name, unit, results.iter().map(f).collect())
        };
        summary("start -> first KVM_RUN", "ms", &|r| r.first_kvm_run_ms);
        summary("start -> first serial byte", "ms", &|r| r.first_serial_ms);
        summary("start -> VM exit", "ms", &|r| r.vm_exit_ms);
        summary("start -> process exit", "ms", &|r| r.process_exit_ms);
        summary("RSS excluding guest RAM", "KiB", &|r| r.overhead_kib as f64);
        summary("  of it anonymous", "KiB", &|r| r.anon_kib as f64);
        summary("  of it file-backed", "KiB", &|r| r.file_kib as f64);
        summary("guest RAM touched", "KiB", &|r| r.guest_kib as f64);
        summary("ru_maxrss (guest included)", "KiB", &|r| {
            r.maxrss_kib as f64
        });
    }
}
