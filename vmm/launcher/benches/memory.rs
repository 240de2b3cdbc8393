//! Resident memory of the launcher (monitor + launcher, with its in-process
//! VMM) running a VMI, excluding guest RAM, next to KubeVirt v1.9.0's memory
//! budget for the same VMI (proto/CONTRACT.md §7: 220 MiB fixed for
//! virt-launcher-monitor, virt-launcher, virtlogd, virtqemud and QEMU, plus
//! 8 MiB per vCPU, 8 MiB for the IO thread and 32 MiB video).
//!
//! `cargo bench -p virt-launcher --bench memory` (root, /dev/kvm).
//! `LAUNCHER_BENCH_RUNS` (default 5) runs; each boots the test guest by
//! kernel boot with a container disk and an RNG, waits until it runs, then
//! reads `/proc/<pid>/smaps` of both processes. Guest RAM is the one
//! anonymous mapping of exactly the guest's size; its resident pages are
//! subtracted (they are the guest's, not the VMM's).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const GUEST_MIB: u64 = 64;
const VCPUS: u64 = 1;

fn main() {
    assert!(Path::new("/dev/kvm").exists(), "/dev/kvm is missing");
    let runs: usize = std::env::var("LAUNCHER_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let budget_mib = 220 + 8 * VCPUS + 8 + 32;
    let mut samples = Vec::new();
    for _ in 0..runs {
        samples.push(one_run());
    }
    samples.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let median = samples[samples.len() / 2];
    println!(
        "launcher memory, {runs} runs, guest {GUEST_MIB} MiB / {VCPUS} vCPU (test guest, container disk overlay, rng, serial log)"
    );
    println!("{:<44} {:>10}", "", "MiB");
    for (label, v) in [
        ("monitor + launcher RSS excl. guest RAM (median)", median.0),
        ("  launcher alone (median)", median.1),
        ("  monitor alone (median)", median.2),
        ("min over runs", samples[0].0),
        ("max over runs", samples[samples.len() - 1].0),
    ] {
        println!("{label:<44} {v:>10.1}");
    }
    println!(
        "{:<44} {:>10}",
        "KubeVirt v1.9.0 budget for this VMI", budget_mib
    );
    println!(
        "{:<44} {:>10.3}",
        "ratio ours / KubeVirt budget",
        median.0 / budget_mib as f64
    );
}

/// (total excl. guest, launcher excl. guest, monitor), in MiB.
fn one_run() -> (f64, f64, f64) {
    let root = tempfile::tempdir().unwrap();
    let paths = launcher::paths::Paths::under(root.path());
    let kernel = paths.kernel_boot_dir.join("boot/guest.elf");
    std::fs::create_dir_all(kernel.parent().unwrap()).unwrap();
    std::fs::write(&kernel, test_guest::ELF).unwrap();
    let disk = paths.image_volume(0).join("disk");
    std::fs::create_dir_all(&disk).unwrap();
    std::fs::write(disk.join("base.raw"), vec![0u8; 1 << 20]).unwrap();
    let uid = "bench-0000-0000-0000-000000000000";
    let vmi = serde_json::json!({
        "metadata": {"name": "bench", "namespace": "default", "uid": uid},
        "spec": {
            "domain": {
                "memory": {"guest": format!("{GUEST_MIB}Mi")},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 checks=serial,virtio-blk,virtio-rng exit=halt wait=600",
                    "container": {"image": "guest", "kernelPath": "/boot/guest.elf"}}},
                "devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}], "rng": {}}
            },
            "volumes": [{"name": "containerdisk", "containerDisk": {"image": "disk"}}]
        }
    });
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let mut monitor = Command::new(env!("CARGO_BIN_EXE_virt-launcher-monitor"))
        .args([
            "--qemu-timeout",
            "60s",
            "--name",
            "bench",
            "--namespace",
            "default",
            "--uid",
            uid,
            "--kubevirt-share-dir",
            &s(&paths.share_dir),
            "--ephemeral-disk-dir",
            &s(&paths.ephemeral_disk_dir),
            "--container-disk-dir",
            &s(&paths.container_disk_dir),
            "--private-dir",
            &s(&paths.private_dir),
            "--image-volume-dir",
            &s(&paths.image_volume_dir),
            "--kernel-boot-dir",
            &s(&paths.kernel_boot_dir),
            "--libvirt-runtime-dir",
            &s(&paths.libvirt_runtime_dir),
            "--resolv-conf",
            &s(&paths.resolv_conf),
        ])
        .env("VIRT_LAUNCHER_BINARY", env!("CARGO_BIN_EXE_virt-launcher"))
        .env("STANDALONE_VMI", vmi.to_string())
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let log = paths.serial_log(&launcher::paths::PathName::vmi_uid(uid).unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("WAITING")
    {
        assert!(Instant::now() < deadline, "the guest did not come up");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let monitor_pid = monitor.id();
    let launcher_pid =
        std::fs::read_to_string(format!("/proc/{monitor_pid}/task/{monitor_pid}/children"))
            .unwrap()
            .split_whitespace()
            .next()
            .expect("the monitor has a launcher child")
            .parse::<u32>()
            .unwrap();
    let launcher = rss_excluding_guest_kib(launcher_pid);
    let monitor_kib = rss_excluding_guest_kib(monitor_pid);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(
            libc::pid_t::try_from(monitor_pid).expect("a Linux pid fits a pid_t"),
        ),
        nix::sys::signal::Signal::SIGKILL,
    )
    .ok();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(
            libc::pid_t::try_from(launcher_pid).expect("a Linux pid fits a pid_t"),
        ),
        nix::sys::signal::Signal::SIGKILL,
    )
    .ok();
    let _ = monitor.wait();
    let mib = |kib: u64| kib as f64 / 1024.0;
    (mib(launcher + monitor_kib), mib(launcher), mib(monitor_kib))
}

/// Sum of `Rss:` over all mappings, less the guest RAM mapping's.
fn rss_excluding_guest_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut total, mut guest) = (0u64, 0u64);
    let mut size = 0u64;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match words.next() {
            Some("Size:") => size = words.next().and_then(|v| v.parse().ok()).unwrap_or(0),
            Some("Rss:") => {
                let rss: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
                total += rss;
                if size == GUEST_MIB * 1024 {
                    guest += rss;
                }
            }
            _ => {}
        }
    }
    total - guest
}
