//! Resident memory of the launcher (monitor + launcher, with its in-process
//! VMM) running a VMI, excluding guest RAM, next to KubeVirt v1.9.0's memory
//! budget for the same VMI (proto/CONTRACT.md §7: 220 MiB fixed for
//! virt-launcher-monitor, virt-launcher, virtlogd, virtqemud and QEMU, plus
//! 8 MiB per vCPU, 8 MiB for the IO thread and 32 MiB video).
//!
//! `cargo bench -p virt-launcher --bench memory` (root, /dev/kvm).
//! `LAUNCHER_BENCH_RUNS` (default 5) runs of a VMI of `LAUNCHER_BENCH_GUEST_MIB`
//! (default 64, at most 2048: guest RAM must be one mapping) and
//! `LAUNCHER_BENCH_VCPUS` (default 1, at most 16); each boots the test guest by
//! kernel boot with a container disk and an RNG, waits until it runs, then
//! reads `/proc/<pid>/smaps` of both processes. Guest RAM is the one
//! anonymous mapping of exactly the guest's size; its resident pages are
//! subtracted (they are the guest's, not the VMM's).
//!
//! The programs are cargo's build of this bench (linked dynamically against
//! the host's glibc); `LAUNCHER_BENCH_BIN_DIR=DIR` measures the
//! `virt-launcher` and `virt-launcher-monitor` in DIR instead, such as the
//! static ones `images/build.sh` puts in the image
//! (`target/x86_64-unknown-linux-gnu/lean`). `LAUNCHER_BENCH_SMAPS=DIR`
//! keeps each run's `smaps` and thread list there. `vmm/launcher/docs/memory.md`
//! says where the pages go.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The VMI measured.
#[derive(Clone, Copy)]
struct Shape {
    guest_mib: u64,
    vcpus: u64,
}

/// `name` from the environment, `default` when unset; a bad value ends the bench.
fn env_number(name: &str, default: u64, max: u64) -> u64 {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => match v.parse::<u64>() {
            Ok(n) if (1..=max).contains(&n) => n,
            _ => panic!("{name}={v}: a number from 1 to {max}"),
        },
    }
}

fn main() {
    assert!(Path::new("/dev/kvm").exists(), "/dev/kvm is missing");
    let runs: usize = std::env::var("LAUNCHER_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let shape = Shape {
        guest_mib: env_number("LAUNCHER_BENCH_GUEST_MIB", 64, 2048),
        vcpus: env_number("LAUNCHER_BENCH_VCPUS", 1, 16),
    };
    let (guest_mib, vcpus) = (shape.guest_mib, shape.vcpus);
    let budget_mib = 220 + 8 * vcpus + 8 + 32;
    let mut samples = Vec::new();
    for _ in 0..runs {
        samples.push(one_run(shape));
    }
    samples.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap());
    let median = samples[samples.len() / 2];
    let (monitor, launcher) = programs();
    println!("programs: {} and {}", monitor.display(), launcher.display());
    println!(
        "launcher memory, {runs} runs, guest {guest_mib} MiB / {vcpus} vCPU (test guest, container disk overlay, rng, serial log)"
    );
    println!("{:<44} {:>10}", "", "MiB");
    for (label, v) in [
        ("monitor + launcher RSS excl. guest RAM (median)", median.0),
        ("  launcher alone (median)", median.1),
        ("  monitor alone (median)", median.2),
        ("  of both: mapped from files", median.3),
        ("  of both: transparent huge pages", median.4),
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

/// The monitor and the launcher measured.
fn programs() -> (std::path::PathBuf, std::path::PathBuf) {
    match std::env::var_os("LAUNCHER_BENCH_BIN_DIR") {
        Some(dir) => {
            let dir = Path::new(&dir);
            (dir.join("virt-launcher-monitor"), dir.join("virt-launcher"))
        }
        None => (
            env!("CARGO_BIN_EXE_virt-launcher-monitor").into(),
            env!("CARGO_BIN_EXE_virt-launcher").into(),
        ),
    }
}

/// Resident KiB, excluding guest RAM.
#[derive(Clone, Copy, Default)]
struct Resident {
    total: u64,
    /// Pages mapped from files (the program, shared libraries).
    file: u64,
    /// Anonymous transparent huge pages.
    huge: u64,
}

/// (total excl. guest, launcher excl. guest, monitor, file-backed, huge
/// pages), in MiB.
fn one_run(shape: Shape) -> (f64, f64, f64, f64, f64) {
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
                "memory": {"guest": format!("{}Mi", shape.guest_mib)},
                "cpu": {"cores": shape.vcpus},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0 checks=serial,virtio-blk,virtio-rng exit=halt wait=600",
                    "container": {"image": "guest", "kernelPath": "/boot/guest.elf"}}},
                "devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}], "rng": {}}
            },
            "volumes": [{"name": "containerdisk", "containerDisk": {"image": "disk"}}]
        }
    });
    let s = |p: &Path| p.to_string_lossy().into_owned();
    let (monitor_program, launcher_program) = programs();
    let monitor = Command::new(monitor_program)
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
        .env("VIRT_LAUNCHER_BINARY", launcher_program)
        .env("STANDALONE_VMI", vmi.to_string())
        .env("RUST_LOG", "warn")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Killed with its launcher when this function returns or panics (a failed
    // assert must not leave a VM running).
    let monitor = KilledOnDrop(monitor);
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
    let monitor_pid = monitor.0.id();
    let launcher_pid =
        std::fs::read_to_string(format!("/proc/{monitor_pid}/task/{monitor_pid}/children"))
            .unwrap()
            .split_whitespace()
            .next()
            .expect("the monitor has a launcher child")
            .parse::<u32>()
            .unwrap();
    let launcher = resident_excluding_guest(launcher_pid, shape.guest_mib);
    let monitor_kib = resident_excluding_guest(monitor_pid, shape.guest_mib);
    if let Some(dir) = std::env::var_os("LAUNCHER_BENCH_SMAPS") {
        keep_smaps(Path::new(&dir), launcher_pid, monitor_pid);
    }
    drop(monitor);
    let mib = |kib: u64| kib as f64 / 1024.0;
    (
        mib(launcher.total + monitor_kib.total),
        mib(launcher.total),
        mib(monitor_kib.total),
        mib(launcher.file + monitor_kib.file),
        mib(launcher.huge + monitor_kib.huge),
    )
}

/// Copies what the launcher and the monitor map (`smaps`) and their threads
/// into `dir`, one file per process and run, to see where the pages go.
fn keep_smaps(dir: &Path, launcher: u32, monitor: u32) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, pid) in [("launcher", launcher), ("monitor", monitor)] {
        let mut out = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
        {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            // `syscall` ends with the thread's stack pointer and program
            // counter: the stack pointer says which mapping is its stack.
            let syscall = std::fs::read_to_string(task.path().join("syscall")).unwrap_or_default();
            let sp = syscall
                .split_whitespace()
                .rev()
                .nth(1)
                .unwrap_or("?")
                .to_string();
            out.push_str(&format!(
                "task {} {} {sp}\n",
                task.file_name().to_string_lossy(),
                comm.trim()
            ));
        }
        std::fs::write(dir.join(format!("{name}.{pid}.smaps")), out).unwrap();
    }
}

/// Sum of `Rss:` over all mappings, less the guest RAM mapping's.
fn resident_excluding_guest(pid: u32, guest_mib: u64) -> Resident {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut out = Resident::default();
    let (mut from_file, mut guest) = (false, false);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        let mut value = || {
            words
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match first {
            // A mapping's header: "start-end perms offset dev inode [path]".
            _ if first.contains('-') && !first.ends_with(':') => {
                from_file = line
                    .split_whitespace()
                    .nth(5)
                    .is_some_and(|p| p.starts_with('/'));
            }
            "Size:" => guest = !from_file && value() == guest_mib * 1024,
            "Rss:" if !guest => {
                let rss = value();
                out.total += rss;
                if from_file {
                    out.file += rss;
                }
            }
            "AnonHugePages:" if !guest => out.huge += value(),
            _ => {}
        }
    }
    out
}

/// The monitor process, SIGKILLed with its children (the launcher) on drop.
struct KilledOnDrop(std::process::Child);

impl Drop for KilledOnDrop {
    fn drop(&mut self) {
        let pid = self.0.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        let pids =
            std::iter::once(pid.to_string()).chain(children.split_whitespace().map(str::to_string));
        for pid in pids {
            if let Ok(pid) = pid.parse::<libc::pid_t>() {
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .ok();
            }
        }
        let _ = self.0.wait();
    }
}
