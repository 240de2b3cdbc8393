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
//! 10 ms, a different quarter each time).
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
}

const CASES: [Case; 4] = [
    Case {
        name: "64 MiB idle",
        memory_mib: 64,
        cmdline: "checks=serial exit=halt wait=600",
        ready: "WAITING",
    },
    Case {
        name: "64 MiB dirtying 4 of 16 MiB/10 ms",
        memory_mib: 64,
        cmdline: "checks=serial exit=tick wait=600 dirty=16",
        ready: "dirty ok pass=100",
    },
    Case {
        name: "512 MiB idle",
        memory_mib: 512,
        cmdline: "checks=serial exit=halt wait=600",
        ready: "WAITING",
    },
    Case {
        name: "512 MiB dirtying 4 of 16 MiB/10 ms",
        memory_mib: 512,
        cmdline: "checks=serial exit=tick wait=600 dirty=16",
        ready: "dirty ok pass=100",
    },
];

fn config(case: &Case, capture: &SerialCapture) -> VmConfig {
    let mut config = VmConfig::new(KernelSource::Bytes(Arc::from(test_guest::ELF)));
    config.cmdline = case.cmdline.into();
    config.memory_mib = case.memory_mib;
    config.vcpus = 1;
    config.serial = SerialTarget::Capture(capture.clone());
    config
}

fn run_once(case: &Case) -> MigrationReport {
    let source_out = SerialCapture::new();
    let source = Vm::start(config(case, &source_out)).expect("start the source");
    assert!(
        source_out.wait_for(case.ready, READY),
        "{}: {}",
        case.name,
        source_out.text()
    );
    let (mut a, mut b) = UnixStream::pair().expect("socket pair");
    let target_out = SerialCapture::new();
    let target_config = config(case, &target_out);
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
        "| case | runs | total ms | downtime ms | downtime / QEMU's 300 ms limit | rounds | stop-and-copy pages | MiB on the stream |"
    );
    println!("|---|---|---|---|---|---|---|---|");
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
            "| {} | {runs} | {:.1} | {:.2} | {:.3} | {:.0} | {:.0} | {:.1} |",
            case.name,
            ms(&|r| r.total),
            downtime,
            downtime / (QEMU_DEFAULT_DOWNTIME.as_secs_f64() * 1e3),
            num(&|r| r.rounds),
            num(&|r| r.final_pages),
            num(&|r| r.bytes) / f64::from(1 << 20),
        );
        eprintln!("{}: {:.1} s", case.name, started.elapsed().as_secs_f64());
    }
}
