//! Debian's stock kernel, as KubeVirt users boot it: the packaged bzImage
//! (decompressed on the host, entered directly), virtio over PCI, ACPI, and
//! the initramfs `scripts/stock-linux.sh` builds (busybox and the virtio
//! modules of the same package; its `/init` prints one `STOCK <check>` line
//! per check: the modules load, the disk's marker, an address by DHCP from
//! our server over virtio-net and the gateway answering, the virtio RNG;
//! then it powers off through ACPI S5).
//!
//! On this project's machines KVM emulates every guest instruction
//! (`kvm_pvm`), which a stock kernel cannot get through to userspace (see
//! `vmm/README.md`, "A stock kernel on an emulating KVM"): these tests then
//! assert how far the kernel gets and that it stops for the known reason,
//! so that any regression before that point fails them. Where the kernel
//! reaches its `/init`, every `STOCK` check must pass and the VM must end
//! powered off.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{tempdir, vmm};
use virtio_devices::net::test_tap::{create_tap, in_new_netns};

/// The kernel's command line. `noxsave` and `clearcpuid=` because this
/// host's KVM answers the guest's CPUID itself (the VMM's KVM_SET_CPUID2 is
/// not what the guest sees) and offers features its instruction emulator
/// cannot run: the kernel must be told directly. `nowatchdog`: emulated,
/// long loops look like soft lockups.
const CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 reboot=k panic=-1 nowatchdog noxsave \
    clearcpuid=popcnt,smap,fsgsbase,rdpid,rdrand,rdseed,clflushopt,clwb,pku,umip,la57,avx2,bmi1,bmi2,invpcid,pcid";
const MEMORY_MIB: &str = "512";
/// Bound on one boot (the emulated kernel needs minutes to get where it stops).
const BOOT_LIMIT: Duration = Duration::from_secs(1200);
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

/// The furthest milestone this host's KVM lets the stock kernel reach
/// within the tests' time (index into MILESTONES): every vCPU up, with 1
/// and with 2 (measured as vmm/README.md describes; the kernel goes on
/// through its initcalls at emulation speed after that).
const FURTHEST_HERE: usize = 3;

/// The packaged kernel and the initramfs (built, cached, by the script
/// `scripts/setup.sh` runs; run here too if the cache is missing).
fn artifacts() -> (PathBuf, PathBuf) {
    let dir = std::env::var_os("STOCK_LINUX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache")
                });
            cache.join("kubevirt-rs/stock-linux")
        });
    let (kernel, initrd) = (dir.join("vmlinuz"), dir.join("initramfs.gz"));
    if !kernel.exists() || !initrd.exists() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stock-linux.sh");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .env("STOCK_LINUX_DIR", &dir)
            .status()
            .expect("run scripts/stock-linux.sh");
        assert!(status.success(), "scripts/stock-linux.sh failed");
    }
    (kernel, initrd)
}

/// Boots the stock kernel with a disk holding the marker, a NIC on a tap
/// whose host side serves DHCP and is the gateway, and an RNG.
fn boot(vcpus: u8) -> (String, String, Option<i32>) {
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
        let mut image = MARKER.as_bytes().to_vec();
        image.resize(1 << 20, 0);
        std::fs::write(&disk, image).unwrap();
        let mut cmd = vmm();
        cmd.arg("run")
            .arg("--kernel")
            .arg(&kernel)
            .arg("--initrd")
            .arg(&initrd)
            .args(["--memory", MEMORY_MIB, "--vcpus", &vcpus.to_string()])
            .args([
                "--cmdline",
                CMDLINE,
                "--rng",
                "--net",
                &format!("tap={TAP}"),
            ])
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

/// Runs the VMM until it ends, or until [`AFTER_FURTHEST`] past the
/// furthest known milestone, or [`BOOT_LIMIT`]; then stops it. Returns the
/// console, the VMM's stderr and its exit status (`None` if stopped).
fn run_until_done(mut cmd: std::process::Command, vcpus: u8) -> (String, String, Option<i32>) {
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
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status.code();
        }
        let text = console.lock().unwrap().clone();
        if furthest_at.is_none() && furthest(&text, vcpus).is_some_and(|r| r >= FURTHEST_HERE) {
            furthest_at = Some(Instant::now());
        }
        let done_waiting = furthest_at.is_some_and(|t| t.elapsed() > AFTER_FURTHEST)
            && !text.contains(MILESTONES[MILESTONES.len() - 3].1);
        if done_waiting || started.elapsed() > BOOT_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = reader.join();
    let err = err_reader.join().unwrap_or_default();
    let text = console.lock().unwrap().clone();
    (text, err, status)
}

/// The index of the furthest milestone in `console`, if any.
fn furthest(console: &str, vcpus: u8) -> Option<usize> {
    MILESTONES
        .iter()
        .rposition(|(_, text)| console.contains(&text.replace("{cpus}", &vcpus.to_string())))
}

fn check(vcpus: u8) {
    let (console, err, status) = boot(vcpus);
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
    let context = format!(
        "{vcpus} vCPU(s): furthest = {:?}, status {status:?}\nconsole tail:\n{tail}\nstderr:\n{err}",
        reached.map(|i| MILESTONES[i].0)
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
    // host's KVM lets it (measured; see vmm/README.md), whether it then
    // stops there or the time runs out.
    assert!(
        reached.is_some_and(|r| r >= FURTHEST_HERE),
        "the stock kernel no longer gets as far as {:?}: {context}",
        MILESTONES[FURTHEST_HERE].0
    );
    eprintln!("{context}");
}

#[test]
fn debian_kernel_with_one_vcpu() {
    check(1);
}

#[test]
fn debian_kernel_with_two_vcpus() {
    check(2);
}
