//! Live-migration benchmark (not a test): moves the test guest from one VM to another
//! in this process over a unix socket pair, with KubeVirt's defaults (no bandwidth
//! limit, QEMU's 300 ms maximum downtime), and reports per case the median of N runs:
//!
//! - total: `VmHandle::migrate` from its call to the target's answer;
//! - downtime: from the moment every source vCPU had left the guest (the pause
//!   completed) to the moment the target let its restored vCPUs run, both on this
//!   host's `CLOCK_MONOTONIC`; and its ratio to QEMU's default limit (300 ms);
//! - rounds, pages sent in the stop-and-copy, bytes on the stream.
//!
//! Cases: 64 MiB and 512 MiB guests, idle (`exit=halt`: wakes once a second) and
//! dirtying (`exit=tick dirty=16`: rewrites a quarter of 16 MiB, one word per page, every
//! 10 ms, a different quarter each time); and a 64 MiB guest with a container-disk-like
//! disk (a qcow2 overlay over a 256 MiB raw base, 64 MiB of it written in the overlay
//! before the start) that it keeps writing (`blk=tick`), copied in the stream (the block
//! copy: the target's own overlay over the same base).
//!
//! Run: `cargo bench -p vmm --bench migration` (MIGRATION_BENCH_RUNS=N, default 5).

use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vmm::{
    KernelSource, MigrationOptions, MigrationProgress, MigrationReport, SerialCapture,
    SerialTarget, Vm, VmConfig, VmExit,
};

/// QEMU's default `downtime-limit`, which KubeVirt keeps.
const QEMU_DEFAULT_DOWNTIME: Duration = Duration::from_millis(300);
const READY: Duration = Duration::from_secs(120);

struct Case {
    name: &'static str,
    memory_mib: u64,
    cmdline: &'static str,
    /// What the serial console shows once the guest is where it should be measured.
    ready: &'static str,
    /// MiB written in the disk's overlay before the start (`None`: no disk).
    disk_written_mib: Option<u64>,
}

const CASES: [Case; 5] = [
    Case {
        name: "64 MiB idle",
        memory_mib: 64,
        cmdline: "checks=serial exit=halt wait=600",
        ready: "WAITING",
        disk_written_mib: None,
    },
    Case {
        name: "64 MiB dirtying 4 of 16 MiB/10 ms",
        memory_mib: 64,
        cmdline: "checks=serial exit=tick wait=600 dirty=16",
        ready: "dirty ok pass=100",
        disk_written_mib: None,
    },
    Case {
        name: "512 MiB idle",
        memory_mib: 512,
        cmdline: "checks=serial exit=halt wait=600",
        ready: "WAITING",
        disk_written_mib: None,
    },
    Case {
        name: "512 MiB dirtying 4 of 16 MiB/10 ms",
        memory_mib: 512,
        cmdline: "checks=serial exit=tick wait=600 dirty=16",
        ready: "dirty ok pass=100",
        disk_written_mib: None,
    },
    Case {
        name: "64 MiB, 64 MiB of its disk's overlay copied, writing",
        memory_mib: 64,
        cmdline: "checks=serial exit=tick wait=600 blk=tick",
        ready: "blk ok 2",
        disk_written_mib: Some(64),
    },
];

/// The base both overlays share.
const DISK_BASE_MIB: u64 = 256;

fn qemu(tool: &str, args: &[&str]) {
    let out = std::process::Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool} (qemu-utils): {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A qcow2 overlay over `base` in `dir`, as the VM's disk.
fn overlay(dir: &std::path::Path, name: &str, base: &std::path::Path) -> vmm::DiskConfig {
    let path = dir.join(name);
    let (path_text, base_text) = (path.to_str().unwrap(), base.to_str().unwrap());
    qemu(
        "qemu-img",
        &[
            "create", "-q", "-f", "qcow2", "-b", base_text, "-F", "raw", path_text,
        ],
    );
    vmm::DiskConfig {
        backing: vmm::DiskBacking::Within {
            dir: dir.to_path_buf(),
            format: vmm::DiskFormat::Raw,
        },
        ..vmm::DiskConfig::new(path, vmm::DiskFormat::Qcow2)
    }
}

fn config(case: &Case, capture: &SerialCapture) -> VmConfig {
    let mut config = VmConfig::new(KernelSource::Bytes(Arc::from(test_guest::ELF)));
    config.cmdline = case.cmdline.into();
    config.memory_mib = case.memory_mib;
    config.vcpus = 1;
    config.serial = SerialTarget::Capture(capture.clone());
    config
}

fn run_once(case: &Case) -> MigrationReport {
    let dir = tempfile::tempdir().expect("a directory for the disks");
    let disks = case.disk_written_mib.map(|mib| {
        let base = dir.path().join("base.raw");
        std::fs::File::create(&base)
            .and_then(|f| f.set_len(DISK_BASE_MIB << 20))
            .expect("the base image");
        let source = overlay(dir.path(), "source.qcow2", &base);
        let written = format!("write -P 0x5a 0 {mib}M");
        qemu(
            "qemu-io",
            &["-f", "qcow2", "-c", &written, source.path.to_str().unwrap()],
        );
        (source, overlay(dir.path(), "target.qcow2", &base))
    });
    let source_out = SerialCapture::new();
    let mut source_config = config(case, &source_out);
    source_config
        .disks
        .extend(disks.as_ref().map(|(s, _)| s.clone()));
    let source = Vm::start(source_config).expect("start the source");
    assert!(
        source_out.wait_for(case.ready, READY),
        "{}: {}",
        case.name,
        source_out.text()
    );
    let (mut a, mut b) = UnixStream::pair().expect("socket pair");
    let target_out = SerialCapture::new();
    let mut target_config = config(case, &target_out);
    target_config
        .disks
        .extend(disks.as_ref().map(|(_, t)| t.clone()));
    let target = std::thread::spawn(move || Vm::receive(target_config, &mut b));
    let options = MigrationOptions::kubevirt_defaults(case.memory_mib << 20);
    let report = source
        .migrate(&mut a, &options, &MigrationProgress::default())
        .expect("migrate");
    let target = target.join().expect("target thread").expect("target runs");
    assert_eq!(source.wait_timeout(READY), Some(VmExit::Migrated));
    target.kill();
    target.wait();
    let text = target_out.text() + &source_out.text();
    assert!(!text.contains("FAIL"), "{}: {text}", case.name);
    report
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let runs: usize = std::env::var("MIGRATION_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5)
        .max(1);
    println!(
        "| case | runs | total ms | downtime ms | downtime / QEMU's 300 ms limit | rounds | stop-and-copy pages | MiB on the stream | of which disk MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for case in &CASES {
        let started = Instant::now();
        let reports: Vec<MigrationReport> = (0..runs).map(|_| run_once(case)).collect();
        let ms = |f: &dyn Fn(&MigrationReport) -> Duration| {
            median(reports.iter().map(|r| f(r).as_secs_f64() * 1e3).collect())
        };
        let num = |f: &dyn Fn(&MigrationReport) -> u64| {
            median(reports.iter().map(|r| f(r) as f64).collect())
        };
        let downtime = ms(&|r| r.downtime);
        println!(
            "| {} | {runs} | {:.1} | {:.2} | {:.3} | {:.0} | {:.0} | {:.1} | {:.1} |",
            case.name,
            ms(&|r| r.total),
            downtime,
            downtime / (QEMU_DEFAULT_DOWNTIME.as_secs_f64() * 1e3),
            num(&|r| r.rounds),
            num(&|r| r.final_pages),
            num(&|r| r.bytes) / f64::from(1 << 20),
            num(&|r| r.disk_bytes) / f64::from(1 << 20),
        );
        eprintln!("{}: {:.1} s", case.name, started.elapsed().as_secs_f64());
    }
}
