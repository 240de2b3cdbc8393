//! Boot benchmark (not a test): starts `vmm run` with the test guest N times
//! (and, with `FIRECRACKER=/path/to/firecracker`, Firecracker on the same
//! guest, interleaved) and reports, per run and summarised:
//!
//! - spawn → first `KVM_RUN` (from a system-wide `perf` trace of that one
//!   ioctl, the same for every VMM; `vmm run`'s own `VMM_TIMINGS=1` stamp is
//!   shown beside it), → first serial byte (read by this harness from the
//!   VMM's stdout, a pipe, for every VMM), → process exit (wait4);
//! - resident memory from /proc/<pid>/smaps every 2 ms (see `common::rss`):
//!   peak and steady (median after the first serial byte) excluding guest
//!   RAM, its anonymous and file-backed parts, peak total, `ru_maxrss`.
//!
//! Times start at the harness's CLOCK_MONOTONIC reading just before the
//! spawn, so they include fork/exec, the dynamic loader and `main`.
//! With Firecracker present, a last table gives the ratio of medians
//! (ours / Firecracker) of each variant.
//!
//! Run: `cargo bench -p vmm-cli --bench boot` (BOOT_BENCH_RUNS=N, default 20;
//! BOOT_BENCH_VCPUS, default 1; BOOT_BENCH_TRACE=0 skips perf;
//! FIRECRACKER_SECCOMP=0 runs Firecracker with `--no-seccomp`;
//! BENCH_VARIANTS to compare binaries or options, interleaved: see
//! `common`). See benches/README.md.

mod common;

use std::collections::HashMap;
use std::io::Read;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::firecracker;
use common::monotonic_ns;

const MEMORY_MIB: u64 = 128;
const CMDLINE: &str = "checks=serial,smp exit=poweroff";
const SAMPLE_EVERY: Duration = Duration::from_millis(2);

/// What runs: one of our `vmm` variants, or Firecracker.
enum Subject {
    Ours(common::Variant),
    Firecracker { binary: String, seccomp: bool },
}

impl Subject {
    fn label(&self) -> &str {
        match self {
            Subject::Ours(v) => &v.label,
            Subject::Firecracker { .. } => "firecracker",
        }
    }
}

#[derive(Default)]
struct Run {
    pid: u32,
    start_ns: u64,
    /// From the perf trace (filled in at the end).
    kvm_run_ms: f64,
    /// `vmm run`'s own stamps (NaN for Firecracker).
    own_kvm_run_ms: f64,
    own_serial_ms: f64,
    serial_ms: f64,
    process_exit_ms: f64,
    peak_kib: u64,
    steady_kib: f64,
    anon_kib: u64,
    file_kib: u64,
    total_kib: u64,
    maxrss_kib: u64,
}

fn parse_timing(stderr: &str, key: &str) -> Option<u64> {
    let line = stderr.lines().find(|l| l.starts_with("VMM_TIMING"))?;
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn ms_since(start: u64, t: u64) -> f64 {
    t.saturating_sub(start) as f64 / 1e6
}

fn finish_run(
    pid: u32,
    start_ns: u64,
    serial: firecracker::SerialCapture,
    what: &str,
) -> (Run, String) {
    let watched = common::rss::watch(pid, MEMORY_MIB, SAMPLE_EVERY);
    let (text, first_byte) = serial.finish();
    assert!(
        watched.status.success() && text.contains("DONE passed=2 failed=0"),
        "{what} failed ({}): serial output:\n{text}",
        watched.status
    );
    let first_byte = first_byte.unwrap_or(u64::MAX);
    let run = Run {
        pid,
        start_ns,
        kvm_run_ms: f64::NAN,
        own_kvm_run_ms: f64::NAN,
        own_serial_ms: f64::NAN,
        serial_ms: ms_since(start_ns, first_byte),
        process_exit_ms: ms_since(start_ns, watched.exit_ns),
        peak_kib: watched.peak_overhead(),
        steady_kib: watched.steady_overhead(first_byte),
        anon_kib: watched.peak(|r| r.anon),
        file_kib: watched.peak(|r| r.file),
        total_kib: watched.peak_total(),
        maxrss_kib: watched.maxrss_kib,
    };
    (run, text)
}

fn run_ours(variant: &common::Variant, kernel: &str, vcpus: &str) -> Run {
    let mut cmd = Command::new(&variant.binary);
    cmd.args(["run", "--kernel", kernel, "--memory"])
        .arg(MEMORY_MIB.to_string())
        .args(["--vcpus", vcpus, "--cmdline", CMDLINE, "--serial", "stdout"])
        .args(&variant.extra_args)
        .env("VMM_TIMINGS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start_ns = monotonic_ns();
    // Reaped by common::rss::watch (wait4).
    #[allow(clippy::zombie_processes)]
    let mut child = cmd.spawn().expect("spawn vmm");
    let pid = child.id();
    let serial =
        firecracker::SerialCapture::start(child.stdout.take().expect("piped stdout"), |_, _| {});
    let mut stderr_pipe = child.stderr.take().expect("piped stderr");
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr_pipe.read_to_string(&mut s);
        s
    });
    let (mut run, _) = finish_run(pid, start_ns, serial, "vmm run");
    let stderr = reader.join().unwrap_or_default();
    let own = |key| parse_timing(&stderr, key).map_or(f64::NAN, |t| ms_since(start_ns, t));
    run.own_kvm_run_ms = own("first_kvm_run_ns");
    run.own_serial_ms = own("first_serial_byte_ns");
    run
}

fn run_firecracker(binary: &str, seccomp: bool, kernel: &str, vcpus: &str) -> Run {
    let mut config = firecracker::Config::new(kernel, CMDLINE, MEMORY_MIB);
    config.vcpus = vcpus.parse().expect("BOOT_BENCH_VCPUS is a number");
    config.seccomp = seccomp;
    let mut fc = firecracker::spawn(binary, &config).expect("spawn firecracker");
    let serial = fc.capture_serial();
    let (run, _) = finish_run(fc.pid, fc.spawned_ns, serial, "firecracker");
    run
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

    let mut subjects: Vec<Subject> = common::variants(vmm)
        .into_iter()
        .map(Subject::Ours)
        .collect();
    if let Some(binary) = firecracker::binary_from_env() {
        let version = firecracker::check_binary(binary.as_ref()).expect("run $FIRECRACKER");
        let seccomp = std::env::var("FIRECRACKER_SECCOMP").as_deref() != Ok("0");
        println!(
            "firecracker: {binary} ({version}), --no-api --config-file, {}",
            if seccomp {
                "its default seccomp filters"
            } else {
                "--no-seccomp"
            }
        );
        subjects.push(Subject::Firecracker { binary, seccomp });
    }
    let trace = if std::env::var("BOOT_BENCH_TRACE").as_deref() == Ok("0") {
        None
    } else {
        common::kvm_run_trace::KvmRunTrace::start()
    };

    println!(
        "boot benchmark: {runs} runs per variant, interleaved (test guest, {MEMORY_MIB} MiB, {vcpus} vCPU, {CMDLINE}); load average {}",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let mut results: Vec<Vec<Run>> = subjects.iter().map(|_| Vec::new()).collect();
    for _ in 0..runs {
        for (s, subject) in subjects.iter().enumerate() {
            let run = match subject {
                Subject::Ours(v) => run_ours(v, &kernel, &vcpus),
                Subject::Firecracker { binary, seccomp } => {
                    run_firecracker(binary, *seccomp, &kernel, &vcpus)
                }
            };
            results[s].push(run);
        }
    }
    let first_kvm_run: HashMap<u32, u64> = trace.map(|t| t.finish()).unwrap_or_default();
    for run in results.iter_mut().flatten() {
        if let Some(&t) = first_kvm_run.get(&run.pid) {
            run.kvm_run_ms = ms_since(run.start_ns, t);
        }
    }

    println!(
        "variant       run  kvm_run_ms (own)  serial_ms (own)  proc_exit_ms  peak_KiB  steady_KiB  anon_KiB  file_KiB  total_KiB  maxrss_KiB"
    );
    for (subject, results) in subjects.iter().zip(&results) {
        for (i, r) in results.iter().enumerate() {
            println!(
                "{:<12} {i:>4}  {:>6.2} ({:>6.2})  {:>6.2} ({:>6.2})  {:>12.2}  {:>8}  {:>10.0}  {:>8}  {:>8}  {:>9}  {:>10}",
                subject.label(),
                r.kvm_run_ms,
                r.own_kvm_run_ms,
                r.serial_ms,
                r.own_serial_ms,
                r.process_exit_ms,
                r.peak_kib,
                r.steady_kib,
                r.anon_kib,
                r.file_kib,
                r.total_kib,
                r.maxrss_kib
            );
        }
    }

    type Metric = (&'static str, &'static str, fn(&Run) -> f64);
    let metrics: [Metric; 11] = [
        ("spawn -> first KVM_RUN (perf)", "ms", |r| r.kvm_run_ms),
        ("spawn -> first KVM_RUN (own)", "ms", |r| r.own_kvm_run_ms),
        ("spawn -> first serial byte", "ms", |r| r.serial_ms),
        ("spawn -> serial byte (own)", "ms", |r| r.own_serial_ms),
        ("spawn -> process exit", "ms", |r| r.process_exit_ms),
        ("peak RSS excluding guest RAM", "KiB", |r| r.peak_kib as f64),
        ("steady RSS excluding guest RAM", "KiB", |r| r.steady_kib),
        ("  peak anonymous", "KiB", |r| r.anon_kib as f64),
        ("  peak file-backed", "KiB", |r| r.file_kib as f64),
        ("peak RSS total (guest incl.)", "KiB", |r| {
            r.total_kib as f64
        }),
        ("ru_maxrss (guest incl.)", "KiB", |r| r.maxrss_kib as f64),
    ];
    for (subject, results) in subjects.iter().zip(&results) {
        match subject {
            Subject::Ours(v) => println!("== {}: {} {}", v.label, v.binary, v.extra_args.join(" ")),
            Subject::Firecracker { binary, .. } => println!("== firecracker: {binary}"),
        }
        for (name, unit, f) in &metrics {
            let values: Vec<f64> = results.iter().map(f).filter(|v| !v.is_nan()).collect();
            common::summary(name, unit, values);
        }
    }

    let Some(fc) = subjects
        .iter()
        .position(|s| matches!(s, Subject::Firecracker { .. }))
    else {
        return;
    };
    println!("== ratio of medians, ours / firecracker");
    print!("{:<34}", "");
    for subject in subjects.iter().filter(|s| matches!(s, Subject::Ours(_))) {
        print!(" {:>12}", subject.label());
    }
    println!(" {:>12}", "firecracker");
    for (name, unit, f) in &metrics {
        let fc_median = common::median(results[fc].iter().map(f).collect());
        if fc_median.is_nan() {
            continue;
        }
        print!("{name:<34}");
        for (s, subject) in subjects.iter().enumerate() {
            if matches!(subject, Subject::Ours(_)) {
                let ours = common::median(results[s].iter().map(f).collect());
                print!(" {:>11.2}x", ours / fc_median);
            }
        }
        println!(" {fc_median:>9.2} {unit}");
    }
}
