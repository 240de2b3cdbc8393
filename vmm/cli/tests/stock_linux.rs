//! Debian's stock kernel, as KubeVirt users boot it: the packaged bzImage
//! (decompressed on the host, entered directly) — with one vCPU from a disk laid out as
//! Debian's (GPT, EFI system partition, ext4 root with `/boot/grub/grub.cfg` as
//! `update-grub` writes it, the kernel and initramfs in `/boot`), through that
//! configuration, with two named directly —, virtio over PCI, ACPI, and
//! the initramfs `scripts/stock-linux.sh` builds (busybox and the virtio
//! modules of the same package; its `/init` prints one `STOCK <check>` line
//! per check: the modules load, the disk's marker, an address by DHCP from
//! our server over virtio-net and the gateway answering, the virtio RNG;
//! then it powers off through ACPI S5).
//!
//! On this project's machines KVM emulates every guest instruction
//! (`kvm_pvm`), which a stock kernel cannot get through to userspace (see
//! `vmm/docs/stock-kernel.md`): these tests then
//! assert how far the kernel gets and that it stops for the known reason,
//! so that any regression before that point fails them. Where the kernel
//! reaches its `/init`, every `STOCK` check must pass and the VM must end
//! powered off.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{tempdir, vmm};
use test_guest::stock_linux::artifacts;
use virtio_devices::net::test_tap::{create_tap, in_new_netns};

/// The kernel's command line. `noxsave` and `clearcpuid=` because this
/// host's KVM answers the guest's CPUID itself (the VMM's KVM_SET_CPUID2 is
/// not what the guest sees) and offers features its instruction emulator
/// cannot run: the kernel must be told directly. `nowatchdog`: emulated,
/// long loops look like soft lockups.
const CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 reboot=k panic=-1 nowatchdog noxsave \
    clearcpuid=popcnt,smap,fsgsbase,rdpid,rdrand,rdseed,clflushopt,clwb,pku,umip,la57,avx2,bmi1,bmi2,invpcid,pcid";
const MEMORY_MIB: &str = "512";
/// Bound on the VMM's CPU time (all threads) for one boot: the emulated
/// kernel's progress follows the CPU it gets, not the wall clock, so a
/// loaded machine makes the test slower but does not fail it. The kernel
/// needs about 120 s of it to get to [`FURTHEST_HERE`] (vmm/docs/stock-kernel.md); in
/// CI (2 idle cores, one per test) CPU time is about wall time.
const CPU_LIMIT: Duration = Duration::from_secs(600);
/// A boot whose VMM used less than [`STALL_MIN_CPU`] over [`STALL_WINDOW`]
/// of wall time is stuck (an emulated kernel boot is CPU-bound), not slow.
const STALL_WINDOW: Duration = Duration::from_secs(300);
const STALL_MIN_CPU: Duration = Duration::from_secs(2);
/// Last-resort bound on wall time (120 s of CPU took 10 minutes at a load
/// average of 10-13 on 2 cores).
const WALL_LIMIT: Duration = Duration::from_secs(3600);
/// Once the furthest known milestone shows, how long the boot may go on
/// (further, to userspace, on a faster KVM) before it is stopped.
const AFTER_FURTHEST: Duration = Duration::from_secs(30);
const MARKER: &str = "kubevirt-rs-stock-marker";
const TAP: &str = "stock0";
const GATEWAY: &str = "10.0.2.1";

/// How far a boot got, in order; each is a line (or part of one) on the
/// serial console (`{cpus}`: the vCPU count).
const MILESTONES: &[(&str, &str)] = &[
    ("kernel entered", "Linux version 6."),
    ("ACPI tables read", "ACPI: XSDT 0x"),
    (
        "FPU set up without XSAVE",
        "x86/fpu: x87 FPU will use FXSAVE",
    ),
    ("every vCPU up", "smp: Brought up 1 node, {cpus} CPU"),
    ("PCI bus 0 enumerated", "pci 0000:00:01.0: [1af4:"),
    ("userspace started", "Run /init as init process"),
    ("/init ran", "STOCK init PASS"),
    ("all checks done", "STOCK done"),
];

/// Index of "userspace started" in [`MILESTONES`].
const USERSPACE: usize = 5;

/// The milestone the tests require on this host's emulating KVM (index
/// into MILESTONES): every vCPU up, which needs the host decompression,
/// our ACPI tables (MADT), `int3` finished by the VMM and, with 2, INIT/SIPI.
/// The kernel gets further ("PCI bus 0 enumerated"), but needs more than
/// 1.6 times the CPU time for it, too much for CI (see vmm/docs/stock-kernel.md).
const FURTHEST_HERE: usize = 3;

/// How the kernel is found.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    /// `--kernel` and `--initrd`, and a raw disk holding the marker.
    Files,
    /// A Debian-layout disk whose GRUB configuration names the kernel and initramfs; the
    /// marker in its MBR's boot code area (a protective MBR leaves it unused).
    DebianDisk,
}

/// Boots the stock kernel with a disk holding the marker, a NIC on a tap
/// whose host side serves DHCP and is the gateway, and an RNG.
fn boot(vcpus: u8, source: Source) -> Boot {
    let (kernel, initrd) = artifacts();
    in_new_netns(move || {
        create_tap(TAP);
        let ip = |args: &[&str]| {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .expect("ip");
            assert!(
                out.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        ip(&["addr", "add", &format!("{GATEWAY}/24"), "dev", TAP]);
        let config = netsetup::dhcp::DhcpConfig::masquerade(
            "10.0.2.0/24".parse().unwrap(),
            &netsetup::resolv::ResolvConf::default(),
            Some("stock".into()),
            None,
            1500,
        )
        .expect("DHCP configuration");
        let server = netsetup::dhcp::DhcpServer::bind(TAP, config).expect("DHCP server on the tap");
        let stop = Arc::new(AtomicBool::new(false));
        let stop_server = stop.clone();
        let dhcp = std::thread::spawn(move || {
            let _ = server.serve_until(&stop_server, Duration::from_millis(200));
        });

        let dir = tempdir();
        let disk = dir.path().join("disk.raw");
        let mut cmd = vmm();
        cmd.arg("run");
        match source {
            Source::Files => {
                let mut image = MARKER.as_bytes().to_vec();
                image.resize(1 << 20, 0);
                std::fs::write(&disk, image).unwrap();
                cmd.arg("--kernel")
                    .arg(&kernel)
                    .arg("--initrd")
                    .arg(&initrd)
                    .args(["--cmdline", CMDLINE]);
            }
            Source::DebianDisk => {
                let (kernel, initrd) = (
                    std::fs::read(&kernel).unwrap(),
                    std::fs::read(&initrd).unwrap(),
                );
                test_guest::disks::write_boot_disk(
                    &disk,
                    test_guest::disks::Layout::Debian,
                    &test_guest::disks::Kernel {
                        image: &kernel,
                        initrd: Some(&initrd),
                        cmdline: CMDLINE,
                    },
                )
                .unwrap();
                use std::os::unix::fs::FileExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&disk)
                    .unwrap()
                    .write_all_at(MARKER.as_bytes(), 0)
                    .unwrap();
            }
        }
        cmd.args(["--memory", MEMORY_MIB, "--vcpus", &vcpus.to_string()])
            .args(["--rng", "--net", &format!("tap={TAP}")])
            .arg("--disk")
            .arg(format!("path={},format=raw", disk.display()));
        let started = Instant::now();
        let result = run_until_done(cmd, vcpus);
        eprintln!("stock kernel, {vcpus} vCPU(s): {:?}", started.elapsed());
        stop.store(true, Ordering::Relaxed);
        let _ = dhcp.join();
        result
    })
}

/// What a boot left: the console, the VMM's stderr, its exit status
/// (`None` if stopped) and, for each milestone, when it first showed (as
/// polled: wall time and the VMM's CPU time since its start).
struct Boot {
    console: String,
    stderr: String,
    status: Option<i32>,
    reached_at: Vec<Option<(Duration, Duration)>>,
    /// Why the test stopped the VMM, if it did.
    stopped: Option<&'static str>,
}

/// CPU time (user + system, every thread) process `pid` has used: the
/// emulated guest's progress is proportional to it, whatever else the
/// machine runs.
fn cpu_time(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the command's closing parenthesis: state is field 3,
    // utime and stime fields 14 and 15 (proc(5)).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }
        .max(1)
        .cast_unsigned();
    Duration::from_millis(ticks * 1000 / hz)
}

/// Runs the VMM until it ends, [`AFTER_FURTHEST`] past the furthest known
/// milestone, after [`CPU_LIMIT`] of CPU, stalled for [`STALL_WINDOW`], or
/// at [`WALL_LIMIT`]; then stops it.
fn run_until_done(mut cmd: std::process::Command, vcpus: u8) -> Boot {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn vmm");
    let console = Arc::new(std::sync::Mutex::new(String::new()));
    let mut out = child.stdout.take().expect("stdout");
    let sink = console.clone();
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    });
    let mut err = child.stderr.take().expect("stderr");
    let err_reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = err.read_to_string(&mut text);
        text
    });
    let started = Instant::now();
    let mut furthest_at = None;
    let mut reached_at = vec![None; MILESTONES.len()];
    // (wall, CPU) at the start of the current stall window.
    let mut window = (Instant::now(), Duration::ZERO);
    let mut stopped = None;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status.code();
        }
        let cpu = cpu_time(child.id());
        let text = console.lock().unwrap().clone();
        for (i, at) in reached_at.iter_mut().enumerate() {
            if at.is_none() && text.contains(&milestone_text(i, vcpus)) {
                *at = Some((started.elapsed(), cpu));
            }
        }
        if furthest_at.is_none() && furthest(&text, vcpus).is_some_and(|r| r >= FURTHEST_HERE) {
            furthest_at = Some(Instant::now());
        }
        let mut stalled = false;
        if window.0.elapsed() >= STALL_WINDOW {
            stalled = cpu.saturating_sub(window.1) < STALL_MIN_CPU;
            window = (Instant::now(), cpu);
        }
        stopped = if furthest_at.is_some_and(|t| t.elapsed() > AFTER_FURTHEST)
            && !text.contains(MILESTONES[USERSPACE].1)
        {
            Some("past the furthest known milestone")
        } else if cpu > CPU_LIMIT {
            Some("CPU limit")
        } else if stalled {
            Some("stalled: the VMM used almost no CPU")
        } else if started.elapsed() > WALL_LIMIT {
            Some("wall-clock limit")
        } else {
            None
        };
        if stopped.is_some() {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = reader.join();
    let err = err_reader.join().unwrap_or_default();
    let text = console.lock().unwrap().clone();
    Boot {
        console: text,
        stderr: err,
        status,
        reached_at,
        stopped,
    }
}

/// The kernel's timestamp (`[  12.345678]`) on the console line holding
/// `text`.
fn guest_time<'a>(console: &'a str, text: &str) -> Option<&'a str> {
    let line = console.lines().find(|l| l.contains(text))?;
    let stamp = line.strip_prefix('[')?.split_once(']')?.0;
    Some(stamp.trim())
}

/// Milestone `i`'s console text for `vcpus` vCPUs.
fn milestone_text(i: usize, vcpus: u8) -> String {
    MILESTONES[i].1.replace("{cpus}", &vcpus.to_string())
}

/// The index of the furthest milestone in `console`, if any.
fn furthest(console: &str, vcpus: u8) -> Option<usize> {
    (0..MILESTONES.len()).rposition(|i| console.contains(&milestone_text(i, vcpus)))
}

fn check(vcpus: u8, source: Source) {
    let Boot {
        console,
        stderr: err,
        status,
        reached_at,
        stopped,
    } = boot(vcpus, source);
    if source == Source::DebianDisk {
        assert!(
            err.contains("vmm: booting disk 0 (BIOS): GRUB entry \"Debian GNU/Linux\"")
                && err.contains("initrd /boot/initrd.img-"),
            "{err}"
        );
    }
    if let Some(path) = std::env::var_os("STOCK_LINUX_CONSOLE") {
        let _ = std::fs::write(format!("{}.{vcpus}", path.to_string_lossy()), &console);
    }
    let tail: String = console
        .lines()
        .rev()
        .take(25)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    let reached = furthest(&console, vcpus);
    let timeline: String = (0..MILESTONES.len())
        .filter_map(|i| {
            let (wall, cpu) = reached_at[i]?;
            Some(format!(
                "  {:>7.1} {:>7.1} {:>9}  {}\n",
                wall.as_secs_f64(),
                cpu.as_secs_f64(),
                guest_time(&console, &milestone_text(i, vcpus)).unwrap_or("?"),
                MILESTONES[i].0
            ))
        })
        .collect();
    let context = format!(
        "{vcpus} vCPU(s): furthest = {:?}, status {status:?}, stopped: {}\n\
         milestones (wall s, VMM CPU s, guest s):\n{timeline}console tail:\n{tail}\nstderr:\n{err}",
        reached.map(|i| MILESTONES[i].0),
        stopped.unwrap_or("no (the VMM exited)"),
    );
    if console.contains("STOCK done") {
        for check in ["init", "modules", "disk", "dhcp", "gateway", "rng"] {
            assert!(
                console.contains(&format!("STOCK {check} PASS")),
                "{check}: {context}"
            );
        }
        assert!(console.contains(MARKER), "{context}");
        assert_eq!(status, Some(0), "{context}");
        assert!(
            err.contains("guest power-off with exit code 0"),
            "{context}"
        );
        return;
    }
    // Not through /init: the kernel must get at least as far as this
    // host's KVM lets it (measured; see vmm/docs/stock-kernel.md), whether it then
    // stops there or the time runs out.
    assert!(
        reached.is_some_and(|r| r >= FURTHEST_HERE),
        "the stock kernel no longer gets as far as {:?}: {context}",
        MILESTONES[FURTHEST_HERE].0
    );
    eprintln!("{context}");
}

#[test]
fn debian_kernel_from_a_debian_disk_with_one_vcpu() {
    check(1, Source::DebianDisk);
}

#[test]
fn debian_kernel_with_two_vcpus() {
    check(2, Source::Files);
}
