//! Guest-visible disk I/O, side by side (not a test): the test guest's
//! `virtio-blk-bench` check (see `blk.rs`) streams sequential or random
//! reads or writes of 4 or 64 KiB through virtio-blk, on
//!
//! - `ours-raw`: this build's `vmm run`, a raw disk (virtio-pci, its default);
//! - `ours-qcow2`: the same with a fresh qcow2 overlay (our `block` engine)
//!   over that raw disk as its backing file, made anew before every run;
//! - `fc-raw`: Firecracker (`FIRECRACKER=path`, started by
//!   `common::firecracker`) on the same raw disk (virtio-mmio, the guest
//!   finds it on the `virtio_mmio.device=` entries Firecracker appends);
//! - `ours-raw-mmio` (only when named in `GUEST_IO_TARGETS`): ours on
//!   virtio-mmio, the transport Firecracker has.
//!
//! All of them use the host page cache (ours `cache=writeback`, Firecracker's
//! default `Unsafe` with its default synchronous engine) and only what both
//! devices offer: plain reads and writes, no flush, discard or write-zeroes.
//! One request per notification; the guest spins on the used ring.
//!
//! Requests per second are the device's own count (ours: `VMM_STATS=1`,
//! the disk's counters at exit; Firecracker: `read_count` / `write_count` of
//! its block metrics, written at exit) over the wall time between the
//! guest's `BENCH virtio-blk start` and `TEST virtio-blk-bench` lines; the
//! guest's own count must agree. Per request, the CPU time of the vCPU
//! threads (on machines whose KVM emulates guest code this is mostly the
//! guest's own instructions) and of every other VMM thread (the device
//! side: our `virtio-blk` thread, Firecracker's event loop), read from
//! `/proc/<pid>/task/*/schedstat` at the two lines (the guest idles
//! `blkbench.hold_ms` after the second so that every thread is still there).
//!
//! Variants and cases are interleaved run by run, so load changes hit all
//! alike; medians and ratios (ours / Firecracker raw) at the end, with the
//! load average before and after.
//!
//! Run: `FIRECRACKER=/path/to/firecracker cargo bench -p vmm-cli --bench
//! guest_io` (GUEST_IO_RUNS, default 5; GUEST_IO_N requests per run, default
//! 1000; GUEST_IO_CASES, `op:pattern:KiB` each, default all eight of
//! read|write × seq|rand × 4|64; GUEST_IO_TARGETS, default
//! `ours-raw,ours-qcow2,fc-raw`; the disks go in GUEST_IO_DIR, default
//! /var/tmp). Method and results: `guest-io.md` beside this file.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Instant;

use common::threads::{split_delta, thread_cpu};
use common::{env, firecracker};

const MEMORY_MIB: u64 = 64;
const DISK_MIB: u64 = 64;
/// How long the guest idles after its result line (see the module doc).
const HOLD_MS: u64 = 300;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Target {
    OursRaw,
    OursQcow2,
    OursRawMmio,
    FcRaw,
}

impl Target {
    fn parse(name: &str) -> Target {
        match name {
            "ours-raw" => Target::OursRaw,
            "ours-qcow2" => Target::OursQcow2,
            "ours-raw-mmio" => Target::OursRawMmio,
            "fc-raw" => Target::FcRaw,
            _ => panic!("unknown target {name:?} (ours-raw, ours-qcow2, ours-raw-mmio, fc-raw)"),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Target::OursRaw => "ours-raw",
            Target::OursQcow2 => "ours-qcow2",
            Target::OursRawMmio => "ours-raw-mmio",
            Target::FcRaw => "fc-raw",
        }
    }
}

struct Case {
    write: bool,
    random: bool,
    kb: u64,
}

impl Case {
    fn label(&self) -> String {
        format!(
            "{} {} {}K",
            if self.random { "rand" } else { "seq" },
            if self.write { "write" } else { "read" },
            self.kb
        )
    }
}

struct Sample {
    wall_s: f64,
    /// Requests of the case's kind the device counted.
    device_requests: u64,
    vcpu_ns: u64,
    other_ns: u64,
}

impl Sample {
    fn per_second(&self) -> f64 {
        self.device_requests as f64 / self.wall_s
    }
    fn per_request_us(&self, ns: u64) -> f64 {
        ns as f64 / 1e3 / self.device_requests.max(1) as f64
    }
}

/// What the serial console told, with the CPU readings taken at its lines.
#[derive(Default)]
struct Observed {
    start: Option<(Instant, HashMap<String, u64>)>,
    end: Option<(Instant, HashMap<String, u64>)>,
    result: String,
    text: String,
}

/// Reads the console line by line, reading the VMM's threads at the two
/// benchmark lines.
fn observe(stdout: impl Read, pid: u32) -> Observed {
    let mut seen = Observed::default();
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if line.starts_with("BENCH virtio-blk start") {
            seen.start = Some((Instant::now(), thread_cpu(pid)));
        } else if line.starts_with("TEST virtio-blk-bench") {
            seen.end = Some((Instant::now(), thread_cpu(pid)));
            seen.result.clone_from(&line);
        }
        seen.text.push_str(&line);
        seen.text.push('\n');
    }
    seen
}

fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('=')?.parse().ok())
}

fn guest_cmdline(case: &Case, requests: u64) -> String {
    format!(
        "console=ttyS0 checks=virtio-blk-bench blkbench.n={requests} blkbench.kb={} blkbench.op={} blkbench.pattern={} blkbench.hold_ms={HOLD_MS} exit=reset",
        case.kb,
        if case.write { "write" } else { "read" },
        if case.random { "rand" } else { "seq" },
    )
}

fn sample(seen: &Observed, case: &Case, device_requests: u64, requests: u64, log: &str) -> Sample {
    let (Some((t0, cpu0)), Some((t1, cpu1))) = (&seen.start, &seen.end) else {
        panic!("no benchmark lines from the guest:\n{}\n{log}", seen.text);
    };
    assert!(
        seen.result.contains(" PASS ") && field(&seen.result, "requests") == Some(requests),
        "{}\n{log}",
        seen.result
    );
    assert_eq!(
        device_requests,
        requests,
        "the device counted {device_requests} {} requests, the guest {requests}:\n{log}",
        if case.write { "write" } else { "read" }
    );
    let (vcpu_ns, other_ns) = split_delta(cpu0, cpu1, |name| name.contains("vcpu"));
    Sample {
        wall_s: (*t1 - *t0).as_secs_f64(),
        device_requests,
        vcpu_ns,
        other_ns,
    }
}

fn run_ours(
    vmm: &str,
    kernel: &Path,
    disk: &str,
    mmio: bool,
    case: &Case,
    requests: u64,
) -> Sample {
    let mut child = Command::new(vmm)
        .args(["run", "--kernel"])
        .arg(kernel)
        .args(["--memory", &MEMORY_MIB.to_string()])
        .args(["--cmdline", &guest_cmdline(case, requests)])
        .args(["--serial", "stdout", "--disk", disk])
        .args(["--transport", if mmio { "mmio" } else { "pci" }])
        .env("VMM_STATS", "1")
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
    let seen = observe(child.stdout.take().expect("piped stdout"), pid);
    let status = child.wait().expect("wait for vmm");
    let stderr = stderr.join().unwrap_or_default();
    assert!(
        status.success(),
        "vmm run: {status}\n{}\n{stderr}",
        seen.text
    );
    let stats = stderr
        .lines()
        .find(|l| l.starts_with("VMM_STATS disk=0 "))
        .unwrap_or_else(|| panic!("no VMM_STATS line: {stderr}"));
    let counted = field(stats, if case.write { "wr_reqs" } else { "rd_reqs" }).unwrap_or(0);
    sample(&seen, case, counted, requests, &stderr)
}

/// Firecracker's block metrics are deltas since its previous write (one
/// JSON object per line): the sum over the lines is the total.
fn firecracker_count(metrics: &str, key: &str) -> u64 {
    metrics
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("block_disk0")?.get(key)?.as_u64())
        .sum()
}

fn run_firecracker(
    binary: &str,
    kernel: &Path,
    disk: &Path,
    metrics: &Path,
    case: &Case,
    requests: u64,
) -> Sample {
    std::fs::write(metrics, "").expect("metrics file");
    let mut config = firecracker::Config::new(kernel, &guest_cmdline(case, requests), MEMORY_MIB);
    config.drives.push(firecracker::Drive {
        path: disk.to_path_buf(),
        read_only: false,
        honour_flush: false,
    });
    config.metrics = Some(metrics.to_path_buf());
    let mut fc = firecracker::spawn(binary, &config).expect("spawn firecracker");
    let stdout = fc.child.stdout.take().expect("piped stdout");
    let pid = fc.pid;
    // Read the console in a thread so that a Firecracker that never ends
    // cannot stall the benchmark past its deadline.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(observe(stdout, pid));
    });
    let seen = rx
        .recv_timeout(std::time::Duration::from_secs(600))
        .expect("Firecracker's console ends");
    let status = fc.child.wait().expect("wait for firecracker");
    let log = format!("{}\n{}", fc.stderr(), fc.log());
    assert!(
        status.success(),
        "firecracker: {status}\n{}\n{log}",
        seen.text
    );
    let text = std::fs::read_to_string(metrics).unwrap_or_default();
    let counted = firecracker_count(
        &text,
        if case.write {
            "write_count"
        } else {
            "read_count"
        },
    );
    sample(&seen, case, counted, requests, &log)
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() {
    let runs = env::number("GUEST_IO_RUNS", 5);
    let requests = env::number("GUEST_IO_N", 1000);
    let cases = env::cases(
        "GUEST_IO_CASES",
        "read:seq:4,read:seq:64,read:rand:4,read:rand:64,write:seq:4,write:seq:64,write:rand:4,write:rand:64",
        "op:pattern:KiB",
        |c, parts| Case {
            write: match parts[0] {
                "read" => false,
                "write" => true,
                op => panic!("case {c}: op {op:?} is read or write"),
            },
            random: match parts[1] {
                "seq" => false,
                "rand" => true,
                p => panic!("case {c}: pattern {p:?} is seq or rand"),
            },
            kb: parts[2].parse().expect("KiB"),
        },
    );
    let fc_binary = firecracker::binary_from_env();
    let mut targets: Vec<Target> = std::env::var("GUEST_IO_TARGETS")
        .unwrap_or_else(|_| "ours-raw,ours-qcow2,fc-raw".into())
        .split(',')
        .map(Target::parse)
        .collect();
    if fc_binary.is_none() && targets.contains(&Target::FcRaw) {
        println!("FIRECRACKER is not set: no fc-raw runs, no ratios");
        targets.retain(|t| *t != Target::FcRaw);
    }

    let vmm = env!("CARGO_BIN_EXE_vmm");
    let base = std::env::var("GUEST_IO_DIR").unwrap_or_else(|_| "/var/tmp".into());
    let dir = tempfile::tempdir_in(base).expect("tempdir");
    let kernel = dir.path().join("test-guest.elf");
    let ok = Command::new(vmm)
        .args(["test-guest", "--output"])
        .arg(&kernel)
        .status()
        .expect("vmm test-guest")
        .success();
    assert!(ok);
    let raw = dir.path().join("disk.raw");
    std::fs::write(&raw, vec![0x5au8; int_cast::u64_to_usize(DISK_MIB << 20)]).expect("disk image");
    let overlay = dir.path().join("overlay.qcow2");
    let metrics = dir.path().join("fc-metrics.json");
    let raw_disk = format!("path={},format=raw,cache=writeback", raw.display());
    let qcow2_disk = format!(
        "path={},format=qcow2,cache=writeback,backing=follow",
        overlay.display()
    );
    let fresh_overlay = |overlay: &PathBuf| {
        let _ = std::fs::remove_file(overlay);
        let ok = Command::new(vmm)
            .args(["img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b"])
            .arg(&raw)
            .arg(overlay)
            .status()
            .expect("vmm img create")
            .success();
        assert!(ok, "vmm img create");
    };
    if let Some(fc) = &fc_binary {
        let version = firecracker::check_binary(Path::new(fc)).unwrap_or_default();
        println!("firecracker: {fc} ({version})");
    }

    println!(
        "guest I/O: {runs} runs per case and target, interleaved; {requests} requests each, one per notification ({MEMORY_MIB} MiB guest, {DISK_MIB} MiB disk); load average {}",
        loadavg()
    );
    println!(
        "{:<14} {:<16} {:>9} {:>12} {:>13}",
        "target", "case", "req/s", "vcpu_us/req", "device_us/req"
    );
    let mut all: HashMap<(usize, usize), Vec<Sample>> = HashMap::new();
    for _ in 0..runs {
        for (c, case) in cases.iter().enumerate() {
            for (t, &target) in targets.iter().enumerate() {
                let s = match target {
                    Target::OursRaw => run_ours(vmm, &kernel, &raw_disk, false, case, requests),
                    Target::OursRawMmio => run_ours(vmm, &kernel, &raw_disk, true, case, requests),
                    Target::OursQcow2 => {
                        fresh_overlay(&overlay);
                        run_ours(vmm, &kernel, &qcow2_disk, false, case, requests)
                    }
                    Target::FcRaw => run_firecracker(
                        fc_binary.as_deref().expect("checked above"),
                        &kernel,
                        &raw,
                        &metrics,
                        case,
                        requests,
                    ),
                };
                println!(
                    "{:<14} {:<16} {:>9.0} {:>12.1} {:>13.1}",
                    target.label(),
                    case.label(),
                    s.per_second(),
                    s.per_request_us(s.vcpu_ns),
                    s.per_request_us(s.other_ns),
                );
                all.entry((c, t)).or_default().push(s);
            }
        }
    }
    println!("load average after: {}", loadavg());
    let fc_index = targets.iter().position(|t| *t == Target::FcRaw);
    println!(
        "medians (ratio: this target / fc-raw, requests per second and device CPU per request):"
    );
    println!(
        "{:<14} {:<16} {:>9} {:>12} {:>13} {:>9} {:>10}",
        "target", "case", "req/s", "vcpu_us/req", "device_us/req", "req/s ×", "device ×"
    );
    // Per target: sums of the logarithms of its ratios (for geometric means).
    let mut log_ratios: HashMap<usize, (f64, f64)> = HashMap::new();
    for (c, case) in cases.iter().enumerate() {
        let medians = |t: usize| {
            let samples = &all[&(c, t)];
            (
                common::median(samples.iter().map(Sample::per_second).collect()),
                common::median(
                    samples
                        .iter()
                        .map(|s| s.per_request_us(s.vcpu_ns))
                        .collect(),
                ),
                common::median(
                    samples
                        .iter()
                        .map(|s| s.per_request_us(s.other_ns))
                        .collect(),
                ),
            )
        };
        let reference = fc_index.map(medians);
        for (t, target) in targets.iter().enumerate() {
            let (rate, vcpu, device) = medians(t);
            let (rate_ratio, device_ratio) = match reference {
                Some((fc_rate, _, fc_device)) => {
                    let logs = log_ratios.entry(t).or_default();
                    logs.0 += (rate / fc_rate).ln();
                    logs.1 += (device / fc_device).ln();
                    (
                        format!("{:.2}", rate / fc_rate),
                        format!("{:.2}", device / fc_device),
                    )
                }
                None => ("-".into(), "-".into()),
            };
            println!(
                "{:<14} {:<16} {:>9.0} {:>12.1} {:>13.1} {:>9} {:>10}",
                target.label(),
                case.label(),
                rate,
                vcpu,
                device,
                rate_ratio,
                device_ratio
            );
        }
    }
    if fc_index.is_some() {
        println!(
            "geometric mean of the ratios over the {} cases (req/s ×, device ×):",
            cases.len()
        );
        for (t, target) in targets.iter().enumerate() {
            let (rate, device) = log_ratios.get(&t).copied().unwrap_or_default();
            let n = cases.len() as f64;
            println!(
                "{:<14} {:>9.2} {:>10.2}",
                target.label(),
                (rate / n).exp(),
                (device / n).exp()
            );
        }
    }
}
