//! Live migration between two VMs of this VMM on one machine (`vmm::migration`): the
//! test guest keeps ticking and rewriting memory (`dirty=`) while it moves, and checks
//! every page it wrote before is still right after.

mod common;

use std::io::{Cursor, Read, Write};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vmm::{
    MigrationError, MigrationOptions, MigrationProgress, SerialCapture, SerialTarget, Vm, VmConfig,
    VmExit, VmHandle,
};

const BOOT: Duration = Duration::from_secs(60);
const MEMORY_MIB: u64 = 128;

fn config(cmdline: &str, capture: &SerialCapture) -> VmConfig {
    let mut config = VmConfig::new(common::test_guest_kernel());
    config.cmdline = cmdline.to_string();
    config.vcpus = 2;
    config.memory_mib = MEMORY_MIB;
    config.serial = SerialTarget::Capture(capture.clone());
    config
}

/// The test guest ticking and rewriting `dirty_mib` MiB, up and past its first check.
fn start_source(dirty_mib: u64) -> (VmHandle, SerialCapture, String) {
    common::require_kvm();
    let capture = SerialCapture::new();
    let cmdline = format!("checks=serial exit=tick wait=300 dirty={dirty_mib}");
    let vm = Vm::start(config(&cmdline, &capture)).expect("start the source");
    assert!(
        capture.wait_for("dirty ok pass=100", BOOT),
        "the guest does not tick: {}",
        capture.text()
    );
    (vm, capture, cmdline)
}

/// KubeVirt's migration options for the tests' guest.
fn defaults() -> MigrationOptions {
    MigrationOptions::kubevirt_defaults(MEMORY_MIB << 20)
}

/// A target VM receiving on its own thread.
fn spawn_target(
    cmdline: &str,
    mut stream: UnixStream,
) -> (JoinHandle<vmm::Result<VmHandle>>, SerialCapture) {
    let capture = SerialCapture::new();
    let config = config(cmdline, &capture);
    let target = std::thread::spawn(move || Vm::receive(config, &mut stream));
    (target, capture)
}

fn dots(capture: &SerialCapture) -> usize {
    capture.contents().iter().filter(|&&b| b == b'.').count()
}

/// Waits until the guest printed more than `than` dots.
fn ticks_past(capture: &SerialCapture, than: usize) -> bool {
    let deadline = Instant::now() + BOOT;
    while Instant::now() < deadline {
        if dots(capture) > than + 20 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

/// The number after the last `prefix` the guest printed (`dirty ok pass=`, `rng ok `,
/// `blk ok `, `net tx `), 0 before the first.
fn last_count(capture: &SerialCapture, prefix: &str) -> u64 {
    let text = capture.text();
    text.rsplit_once(prefix)
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn last_pass(capture: &SerialCapture) -> u64 {
    last_count(capture, "dirty ok pass=")
}

fn assert_no_failure(capture: &SerialCapture) {
    let text = capture.text();
    assert!(!text.contains("FAIL"), "the guest saw a failure: {text}");
}

#[test]
fn a_running_guest_moves_to_another_vm_and_goes_on_where_it_was() {
    let (source, source_out, cmdline) = start_source(8);
    let (a, b) = UnixStream::pair().unwrap();
    let (target, target_out) = spawn_target(&cmdline, b);
    let progress = MigrationProgress::default();
    let mut a = a;
    let report = source
        .migrate(
            &mut a,
            &MigrationOptions::kubevirt_defaults(MEMORY_MIB << 20),
            &progress,
        )
        .expect("migrate");
    let target = target.join().unwrap().expect("the target runs the VM");
    assert_eq!(source.wait_timeout(BOOT), Some(VmExit::Migrated));
    let passes_on_source = last_pass(&source_out);
    eprintln!("{report:?}; the source's guest reached pass {passes_on_source}");
    assert!(
        report.final_pages > 0,
        "the stop-and-copy sends what the guest dirtied last"
    );
    assert!(report.pages > 0 && report.zero_pages > 0);
    // The stop-and-copy began once what was left fitted QEMU's 300 ms; what it took
    // stays in that range (a loaded machine gets room).
    assert!(
        report.downtime > Duration::ZERO && report.downtime < Duration::from_secs(1),
        "{report:?}"
    );

    // The guest goes on on the target: it ticks, its passes continue from the source's
    // count (no new boot), and every page it wrote before the move checks out after.
    assert!(ticks_past(&target_out, 0), "{}", target_out.text());
    let deadline = Instant::now() + BOOT;
    while last_pass(&target_out) <= passes_on_source + 100 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = target_out.text();
    assert!(last_pass(&target_out) > passes_on_source, "{text}");
    assert!(
        !text.contains("DONE"),
        "the guest booted again on the target: {text}"
    );
    assert_no_failure(&source_out);
    assert_no_failure(&target_out);

    // The target's vCPU threads restored their state before entering their sandbox,
    // and did enter it.
    let vcpu_threads = seccomp_of(&target.vcpu_thread_ids());
    assert_eq!(vcpu_threads.len(), 2, "{vcpu_threads:?}");
    assert!(
        vcpu_threads.iter().all(|(_, mode)| mode == "2"),
        "a vCPU thread runs without its seccomp filter: {vcpu_threads:?}"
    );

    // Its devices came along: the power button (ACPI GED, IOAPIC routing) still works.
    target.request_shutdown().unwrap();
    assert_eq!(
        target.wait_timeout(BOOT),
        Some(VmExit::PowerOff { code: 0 }),
        "{}",
        target_out.text()
    );
}

#[test]
fn a_paused_vm_moves_paused_and_runs_when_resumed() {
    let (source, source_out, cmdline) = start_source(8);
    source.pause().unwrap();
    let (a, b) = UnixStream::pair().unwrap();
    let (target, target_out) = spawn_target(&cmdline, b);
    let mut a = a;
    source
        .migrate(&mut a, &defaults(), &MigrationProgress::default())
        .expect("migrate");
    let target = target.join().unwrap().expect("the target takes the VM");
    assert_eq!(source.wait_timeout(BOOT), Some(VmExit::Migrated));
    let deadline = Instant::now() + BOOT;
    while target.state() != vmm::VmState::Paused && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(target.state(), vmm::VmState::Paused);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(dots(&target_out), 0, "the guest ran while paused");
    target.resume().unwrap();
    assert!(ticks_past(&target_out, 0), "{}", target_out.text());
    assert_no_failure(&source_out);
    assert_no_failure(&target_out);
}

#[test]
fn a_guest_dirtying_faster_than_the_copy_times_out_and_keeps_running_on_the_source() {
    // 16 MiB, a quarter of it (4 MiB) rewritten every tick, at 8 MiB/s: whatever a round
    // finds dirty, at least a quarter, takes more than the 300 ms allowed to send, so it
    // never converges, however fast or slow the guest runs here.
    let (source, source_out, cmdline) = start_source(16);
    let (a, b) = UnixStream::pair().unwrap();
    let (target, _) = spawn_target(&cmdline, b);
    let options = MigrationOptions {
        bandwidth: Some(8 << 20),
        completion_timeout: Duration::from_secs(8),
        ..defaults()
    };
    let mut a = a;
    let started = Instant::now();
    let err = source
        .migrate(&mut a, &options, &MigrationProgress::default())
        .expect_err("cannot converge");
    assert!(
        matches!(err, MigrationError::Timeout { rounds, .. } if rounds >= 2),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
    let Err(refused) = target.join().unwrap() else {
        panic!("the target ran the VM")
    };
    assert!(
        refused.to_string().contains("gave the migration up"),
        "{refused}"
    );
    still_runs(&source, &source_out);
}

#[test]
fn a_cancelled_migration_leaves_the_guest_running_on_the_source() {
    let (source, source_out, cmdline) = start_source(8);
    let (a, b) = UnixStream::pair().unwrap();
    let (target, _) = spawn_target(&cmdline, b);
    let progress = MigrationProgress::default();
    let options = MigrationOptions {
        bandwidth: Some(32 << 20),
        ..defaults()
    };
    let mut a = a;
    let err = std::thread::scope(|scope| {
        let migration = scope.spawn(|| source.migrate(&mut a, &options, &progress));
        while progress.bytes() < 4 << 20 {
            std::thread::sleep(Duration::from_millis(5));
        }
        // While it moves, the VM takes no other migration, pause, resume or input.
        let (mut c, _d) = UnixStream::pair().unwrap();
        let second = source.migrate(&mut c, &options, &MigrationProgress::default());
        assert!(
            matches!(second, Err(MigrationError::InProgress)),
            "{second:?}"
        );
        for refused in [
            source.pause(),
            source.resume(),
            source.request_shutdown(),
            source.request_ctrl_alt_del(),
        ] {
            assert!(matches!(refused, Err(vmm::Error::Migrating)), "{refused:?}");
        }
        progress.cancel();
        migration.join().unwrap().expect_err("cancelled")
    });
    assert!(matches!(err, MigrationError::Cancelled), "{err}");
    assert!(target.join().unwrap().is_err());
    still_runs(&source, &source_out);
}

#[test]
fn a_target_that_dies_mid_way_fails_the_migration_and_the_source_runs_on() {
    let (source, source_out, _) = start_source(8);
    let (a, mut b) = UnixStream::pair().unwrap();
    // A target that takes 2 MiB and is gone.
    let dying = std::thread::spawn(move || {
        let mut buf = vec![0u8; 2 << 20];
        let _ = b.read_exact(&mut buf);
    });
    let mut a = a;
    let err = source
        .migrate(&mut a, &defaults(), &MigrationProgress::default())
        .expect_err("the target is gone");
    dying.join().unwrap();
    assert!(matches!(err, MigrationError::Stream(_)), "{err}");
    still_runs(&source, &source_out);
}

#[test]
fn a_target_gone_after_the_state_leaves_the_source_paused_for_good() {
    let (source, source_out, _) = start_source(8);
    let (a, mut b) = UnixStream::pair().unwrap();
    // A target that reads the whole stream, then vanishes without an answer: it may
    // have run the VM, so the source must not.
    let vanishing = std::thread::spawn(move || {
        let mut header = vec![0u8; header(MEMORY_MIB, 2).len()];
        b.read_exact(&mut header).unwrap();
        loop {
            let mut head = [0u8; 5];
            b.read_exact(&mut head).unwrap();
            let len = u32::from_le_bytes(head[1..].try_into().unwrap());
            std::io::copy(&mut (&mut b).take(u64::from(len)), &mut std::io::sink()).unwrap();
            if head[0] == 5 {
                return;
            }
        }
    });
    let mut a = a;
    let err = source
        .migrate(&mut a, &defaults(), &MigrationProgress::default())
        .expect_err("no answer");
    vanishing.join().unwrap();
    assert!(matches!(err, MigrationError::OutcomeUnknown(_)), "{err}");
    assert_eq!(source.state(), vmm::VmState::Paused);
    let frozen = dots(&source_out);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(dots(&source_out), frozen, "the source ran on");
    // It never runs here again: no resume, no second migration, no guest input; a
    // kill ends it.
    let refused = source.resume().expect_err("resumed");
    assert!(matches!(refused, vmm::Error::MaybeMigrated), "{refused}");
    assert!(source.request_shutdown().is_err());
    let (mut again, _other) = UnixStream::pair().unwrap();
    let err = source
        .migrate(&mut again, &defaults(), &MigrationProgress::default())
        .expect_err("migrated twice");
    assert!(matches!(err, MigrationError::OutcomeUnknown(_)), "{err}");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(dots(&source_out), frozen, "the source ran on");
    source.kill();
    assert_eq!(source.wait_timeout(BOOT), Some(VmExit::Killed));
}

#[test]
fn a_target_let_go_before_its_vm_runs_gives_it_back_to_the_source() {
    let (source, source_out, cmdline) = start_source(8);
    let (a, mut b) = UnixStream::pair().unwrap();
    let target_out = SerialCapture::new();
    let target_config = config(&cmdline, &target_out);
    // The whole state arrives, then the target's owner has let go (a delete).
    let target = std::thread::spawn(move || {
        Vm::receive_gated(target_config, &mut b, &|| Err("deleted".to_string()))
    });
    let mut a = a;
    let err = source
        .migrate(&mut a, &defaults(), &MigrationProgress::default())
        .expect_err("the target let go");
    assert!(
        matches!(&err, MigrationError::TargetFailed(why) if why.contains("deleted")),
        "{err}"
    );
    assert!(target.join().unwrap().is_err());
    assert!(
        !target_out.text().contains('.'),
        "the target's guest ran: {}",
        target_out.text()
    );
    still_runs(&source, &source_out);
}

#[test]
fn a_vm_with_a_writable_shared_disk_is_refused_before_anything_is_sent() {
    common::require_kvm();
    let capture = SerialCapture::new();
    let mut config = config("checks=serial exit=halt wait=60", &capture);
    let dir = common::tempdir();
    let disk = dir.path().join("disk.raw");
    std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
    config
        .disks
        .push(vmm::DiskConfig::new(disk, vmm::DiskFormat::Raw));
    let vm = Vm::start(config).expect("start");
    let (mut a, mut b) = UnixStream::pair().unwrap();
    // A volume both sides open (a ReadWriteMany PVC): copying it onto itself would
    // revert the guest's writes; handing its lock over is not built.
    let options = MigrationOptions {
        shared_disks: vec![0],
        ..defaults()
    };
    let err = vm
        .migrate(&mut a, &options, &MigrationProgress::default())
        .expect_err("a shared writable disk");
    assert!(
        matches!(&err, MigrationError::NotMigratable(why) if why.contains("disk 0 is writable and shared")),
        "{err}"
    );
    drop(a);
    let mut sent = Vec::new();
    b.read_to_end(&mut sent).unwrap();
    assert!(sent.is_empty(), "{} bytes sent", sent.len());
    assert_eq!(vm.exit(), None);
    vm.resume().expect("the VM is untouched");
}

#[test]
fn a_target_that_fails_at_the_end_gives_the_vm_back_to_the_source() {
    // The target has a different vCPU count: it refuses the header, before any page.
    let (source, source_out, cmdline) = start_source(8);
    let (a, mut b) = UnixStream::pair().unwrap();
    let target_out = SerialCapture::new();
    let mut other = config(&cmdline, &target_out);
    other.vcpus = 1;
    let target = std::thread::spawn(move || {
        let result = Vm::receive(other, &mut b);
        // Keep reading what the source still sends until it hangs up.
        let _ = std::io::copy(&mut b, &mut std::io::sink());
        result
    });
    let mut a = a;
    let err = source
        .migrate(&mut a, &defaults(), &MigrationProgress::default())
        .expect_err("the target refuses");
    assert!(
        matches!(&err, MigrationError::TargetFailed(why) if why.contains("2 vCPUs")),
        "{err}"
    );
    drop(a);
    let Err(refused) = target.join().unwrap() else {
        panic!("the target took an incompatible VM")
    };
    assert!(
        refused.to_string().contains("the two VMs differ"),
        "{refused}"
    );
    still_runs(&source, &source_out);
}

/// Each thread's `Seccomp:` mode (2: filtered), by thread id.
fn seccomp_of(tids: &[i32]) -> Vec<(i32, String)> {
    tids.iter()
        .map(|tid| {
            let status = std::fs::read_to_string(format!("/proc/self/task/{tid}/status"))
                .unwrap_or_default();
            let mode = status
                .lines()
                .find_map(|l| l.strip_prefix("Seccomp:"))
                .unwrap_or("gone")
                .trim()
                .to_string();
            (*tid, mode)
        })
        .collect()
}

/// The source's guest is running, unharmed: it ticks, passes its memory checks, and
/// powers off when asked.
fn still_runs(source: &VmHandle, out: &SerialCapture) {
    assert_eq!(source.exit(), None);
    let pass = last_pass(out);
    assert!(ticks_past(out, dots(out)), "{}", out.text());
    let deadline = Instant::now() + BOOT;
    while last_pass(out) <= pass && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(last_pass(out) > pass, "{}", out.text());
    assert_no_failure(out);
    source.request_shutdown().unwrap();
    assert_eq!(
        source.wait_timeout(BOOT),
        Some(VmExit::PowerOff { code: 0 })
    );
}

#[test]
fn a_running_virtio_pci_device_moves_with_its_queue() {
    a_running_virtio_device_moves_with_its_queue(vmm::VirtioTransportKind::Pci);
}

#[test]
fn a_running_virtio_mmio_device_moves_with_its_queue() {
    a_running_virtio_device_moves_with_its_queue(vmm::VirtioTransportKind::Mmio);
}

fn a_running_virtio_device_moves_with_its_queue(transport: vmm::VirtioTransportKind) {
    common::require_kvm();
    let source_out = SerialCapture::new();
    let cmdline = "checks=serial exit=tick wait=300 dirty=8 rng=tick";
    let with_rng = |capture: &SerialCapture| {
        let mut config = config(cmdline, capture);
        config.rng = true;
        config.transport = transport;
        config
    };
    let source = Vm::start(with_rng(&source_out)).expect("start the source");
    // More requests than the queue has entries: a device that started the queue over
    // on the target would be caught (an index jump, or a used index out of step).
    assert!(
        source_out.wait_for("rng ok 9", BOOT),
        "{}",
        source_out.text()
    );
    let (a, mut b) = UnixStream::pair().unwrap();
    let target_out = SerialCapture::new();
    let target_config = with_rng(&target_out);
    let target = std::thread::spawn(move || Vm::receive(target_config, &mut b));
    let mut a = a;
    source
        .migrate(&mut a, &defaults(), &MigrationProgress::default())
        .expect("migrate");
    let target = target.join().unwrap().expect("the target runs the VM");
    let before = last_count(&source_out, "rng ok ");
    // The guest's RNG requests go on on the target: its transport and queue (rings,
    // indexes) came along, and the answers are counted on.
    let deadline = Instant::now() + BOOT;
    while last_count(&target_out, "rng ok ") < before + 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        last_count(&target_out, "rng ok ") >= before + 3,
        "source stopped at {before}: {}",
        target_out.text()
    );
    assert_no_failure(&source_out);
    assert_no_failure(&target_out);
    target.kill();
}

/// A qcow2 overlay over the raw `base`, as a container disk's, that may open its base.
fn overlay(dir: &std::path::Path, name: &str, base: &std::path::Path) -> vmm::DiskConfig {
    vmm::DiskConfig {
        backing: vmm::DiskBacking::Within {
            dir: dir.to_path_buf(),
            format: vmm::DiskFormat::Raw,
        },
        ..vmm::DiskConfig::new(
            common::qcow2_overlay(dir, name, base),
            vmm::DiskFormat::Qcow2,
        )
    }
}

const DISK: usize = 4 << 20;

/// Byte `i` of the base image.
fn base_byte(i: usize) -> u8 {
    (i / 512).to_le_bytes()[0] ^ i.to_le_bytes()[0].wrapping_mul(3)
}

#[test]
fn a_guest_writing_its_disk_moves_with_the_disk_copied_into_the_targets_overlay() {
    common::require_kvm();
    let dir = common::tempdir();
    let base = dir.path().join("base.raw");
    std::fs::write(&base, (0..DISK).map(base_byte).collect::<Vec<u8>>()).unwrap();
    // The source's overlay has clusters of its own before the guest starts: data, and
    // zeros hiding the base (both must reach the target's overlay).
    let source_disk = overlay(dir.path(), "source.qcow2", &base);
    for cmd in ["write -P 0x5a 2M 64k", "write -z 1M 64k"] {
        let out = std::process::Command::new("qemu-io")
            .args(["-f", "qcow2", "-c", cmd])
            .arg(&source_disk.path)
            .output()
            .expect("qemu-io (qemu-utils)");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let target_disk = overlay(dir.path(), "target.qcow2", &base);
    let target_path = target_disk.path.clone();
    // A read-only disk stays where it is: both VMs open the base.
    let shared = vmm::DiskConfig {
        read_only: true,
        ..vmm::DiskConfig::new(&base, vmm::DiskFormat::Raw)
    };
    let cmdline = "checks=serial exit=tick wait=300 blk=tick";
    let with_disks = |capture: &SerialCapture, disk: &vmm::DiskConfig| {
        let mut config = config(cmdline, capture);
        config.disks = vec![disk.clone(), shared.clone()];
        config
    };
    let source_out = SerialCapture::new();
    let source = Vm::start(with_disks(&source_out, &source_disk)).expect("start the source");
    assert!(
        source_out.wait_for("blk ok 6", BOOT),
        "{}",
        source_out.text()
    );
    let (a, mut b) = UnixStream::pair().unwrap();
    let target_out = SerialCapture::new();
    let target_config = with_disks(&target_out, &target_disk);
    let target = std::thread::spawn(move || Vm::receive(target_config, &mut b));
    let mut a = a;
    // Slow enough (256 KiB/s for the guest's memory and disk, about 2 s) that the guest
    // writes its disk while the copy runs, even on a busy machine (at 1 MiB/s the copy took
    // 0.5 s and a CI run under load saw one write): those writes come through the disk's
    // dirty log.
    let options = MigrationOptions {
        bandwidth: Some(256 << 10),
        ..defaults()
    };
    let written_before = last_count(&source_out, "blk ok ");
    let report = source
        .migrate(&mut a, &options, &MigrationProgress::default())
        .expect("migrate");
    let target = target.join().unwrap().expect("the target runs the VM");
    assert_eq!(source.wait_timeout(BOOT), Some(VmExit::Migrated));
    assert!(report.disk_bytes > 64 << 10, "{report:?}");
    assert!(
        last_count(&source_out, "blk ok ") >= written_before + 2,
        "the guest wrote during the copy: {report:?}"
    );
    let before = last_count(&source_out, "blk ok ");
    // On the target the guest goes on writing, and reads back what it wrote on the
    // source (write n checks write n / 2).
    let deadline = Instant::now() + BOOT;
    while last_count(&target_out, "blk ok ") < 2 * before + 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    let after = last_count(&target_out, "blk ok ");
    assert!(
        after >= 2 * before + 2,
        "source stopped at {before}: {}",
        target_out.text()
    );
    assert_no_failure(&source_out);
    assert_no_failure(&target_out);
    target.request_shutdown().unwrap();
    assert_eq!(
        target.wait_timeout(BOOT),
        Some(VmExit::PowerOff { code: 0 })
    );
    drop(target);

    // The target's overlay is sound and holds the whole disk: the source's own
    // clusters, every write on either side, and the base everywhere else.
    common::qemu_img(&["check", "-q", "-f", "qcow2", target_path.to_str().unwrap()]);
    let flat = dir.path().join("target.raw");
    common::qemu_img(&[
        "convert",
        "-f",
        "qcow2",
        "-O",
        "raw",
        target_path.to_str().unwrap(),
        flat.to_str().unwrap(),
    ]);
    let disk = std::fs::read(&flat).unwrap();
    assert_eq!(disk.len(), DISK);
    use test_guest::blktick::{FIRST_SECTOR, SECTOR, tick_pattern};
    let sector_bytes = usize::try_from(SECTOR).unwrap();
    let written = usize::try_from(FIRST_SECTOR).unwrap() * sector_bytes
        ..usize::try_from(FIRST_SECTOR + after).unwrap() * sector_bytes;
    for (i, &byte) in disk.iter().enumerate() {
        let expected = if written.contains(&i) {
            let n = (i - written.start) / sector_bytes;
            tick_pattern(
                u64::try_from(n).unwrap(),
                u64::try_from(i % sector_bytes).unwrap(),
            )
        } else if (1 << 20..(1 << 20) + (64 << 10)).contains(&i) {
            0
        } else if (2 << 20..(2 << 20) + (64 << 10)).contains(&i) {
            0x5a
        } else {
            base_byte(i)
        };
        assert_eq!(byte, expected, "byte {i} of the target's disk");
    }
}

/// The `tick N` a frame from the guest carries.
fn tick_of(frame: &[u8]) -> u64 {
    std::str::from_utf8(&frame[14..])
        .ok()
        .and_then(|payload| payload.strip_prefix("tick ")?.parse().ok())
        .unwrap_or_else(|| panic!("not a tick frame: {frame:02x?}"))
}

#[test]
fn a_guest_on_the_network_moves_to_a_vm_on_its_own_tap() {
    use virtio_devices::net::test_tap::{Wire, create_tap, frame, in_new_netns};
    common::require_kvm();
    in_new_netns(|| {
        // The source's and the target's taps, as the two pods' `tap0`.
        create_tap("mig-src");
        create_tap("mig-dst");
        let (source_wire, target_wire) = (Wire::bind("mig-src"), Wire::bind("mig-dst"));
        let guest_mac = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
        let host_mac = [0x52, 0x54, 0x00, 0xaa, 0xbb, 0xfe];
        let cmdline = "checks=serial exit=tick wait=300 net=tick rng=tick";
        let with_net = |capture: &SerialCapture, tap: &str| {
            let mut config = config(cmdline, capture);
            config.nets = vec![vmm::NetConfig::new(tap)];
            config.rng = true;
            config
        };
        let source_out = SerialCapture::new();
        let source = Vm::start(with_net(&source_out, "mig-src")).expect("start the source");
        let first = source_wire
            .recv(BOOT)
            .expect("a frame from the guest on the source's tap");
        assert_eq!(first[6..12], guest_mac);
        source_wire.send(&frame(host_mac, guest_mac, b"host 1"));
        assert!(
            source_out.wait_for("net rx host 1", BOOT),
            "{}",
            source_out.text()
        );

        let (a, mut b) = UnixStream::pair().unwrap();
        let target_out = SerialCapture::new();
        let target_config = with_net(&target_out, "mig-dst");
        let target = std::thread::spawn(move || Vm::receive(target_config, &mut b));
        let mut a = a;
        source
            .migrate(&mut a, &defaults(), &MigrationProgress::default())
            .expect("migrate");
        let target = target.join().unwrap().expect("the target runs the VM");
        let sent_on_source = last_count(&source_out, "net tx ");

        // The guest's frames now leave through the target's tap, counted on from the
        // source's; frames for it arrive there, in buffers it had posted on the source.
        let next = target_wire
            .recv(BOOT)
            .expect("a frame from the guest on the target's tap");
        assert_eq!(next[6..12], guest_mac);
        assert!(
            tick_of(&next) > sent_on_source && tick_of(&next) <= sent_on_source + 2,
            "frame {} after {sent_on_source} on the source",
            tick_of(&next)
        );
        for n in 2..=4 {
            target_wire.send(&frame(host_mac, guest_mac, format!("host {n}").as_bytes()));
            assert!(
                target_out.wait_for(&format!("net rx host {n}"), BOOT),
                "{}",
                target_out.text()
            );
        }
        assert!(target_out.wait_for("rng ok", BOOT), "{}", target_out.text());
        assert_no_failure(&source_out);
        assert_no_failure(&target_out);
        target.kill();
    });
}

/// A stream read from `input`; what the target answers goes to `output`.
struct Scripted {
    input: Cursor<Vec<u8>>,
    output: Vec<u8>,
}

impl Read for Scripted {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Scripted {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.output.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The header of a stream for `config(…)` (the format in `vmm::wire`).
fn header(memory_mib: u64, vcpus: u8) -> Vec<u8> {
    let devices = b"transport=pci com1,i8042,rtc,acpi-ged cpu=none";
    let mut h = b"KVRS-MIG".to_vec();
    h.extend_from_slice(&1u32.to_le_bytes());
    h.extend_from_slice(&(memory_mib << 20).to_le_bytes());
    h.push(vcpus);
    h.extend_from_slice(&u16::try_from(devices.len()).unwrap().to_le_bytes());
    h.extend_from_slice(devices);
    h
}

fn frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![kind];
    f.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_le_bytes());
    f.extend_from_slice(payload);
    f
}

fn pages_frame(gpa: u64, count: u32, data_pages: usize) -> Vec<u8> {
    let mut p = gpa.to_le_bytes().to_vec();
    p.extend_from_slice(&count.to_le_bytes());
    p.extend(std::iter::repeat_n(0xab, data_pages * 4096));
    frame(1, &p)
}

fn zero_frame(gpa: u64, count: u64) -> Vec<u8> {
    let mut p = gpa.to_le_bytes().to_vec();
    p.extend_from_slice(&count.to_le_bytes());
    frame(2, &p)
}

/// A platform frame: the three interrupt controllers (the first with `first_chip` as its
/// id), PIT, clock, then `devices`.
fn platform(first_chip: u32, devices: &[u8]) -> Vec<u8> {
    use std::mem::size_of;
    let chip = size_of::<kvm_bindings::kvm_irqchip>();
    let mut p = Vec::new();
    for id in [first_chip, 1, 2] {
        let mut c = vec![0u8; chip];
        c[..4].copy_from_slice(&id.to_le_bytes());
        p.extend(c);
    }
    p.extend(vec![0u8; size_of::<kvm_bindings::kvm_pit_state2>()]);
    p.extend(vec![0u8; size_of::<kvm_bindings::kvm_clock_data>()]);
    p.extend_from_slice(devices);
    p
}

/// The legacy devices' state as `vmm` writes it, valid but for the ACPI GED's events.
fn devices(ged_events: u8) -> Vec<u8> {
    let mut d = vec![0u8; 9]; // the UART's registers
    d.extend([0, 0]); // its input FIFO: empty
    d.extend([0, 0, 0, 0, 0, 0]); // i8042: no output, config, port, pending, flags
    d.push(0); // RTC index
    d.extend([0u8; 128]); // CMOS
    d.extend([0u8; 32]); // offset, flags time
    d.push(0); // running
    d.push(ged_events);
    d.extend([0u8; 4]); // the 0xCF8 latch
    d
}

/// A vCPU frame of zeros with `msrs` as its MSR count (and no MSRs).
fn vcpu(index: u8, msrs: u32) -> Vec<u8> {
    use std::mem::size_of;
    let mut v = vec![index];
    let state = size_of::<kvm_bindings::kvm_regs>()
        + size_of::<kvm_bindings::kvm_sregs>()
        + size_of::<kvm_bindings::kvm_xsave>()
        + size_of::<kvm_bindings::kvm_xcrs>()
        + size_of::<kvm_bindings::kvm_debugregs>()
        + size_of::<kvm_bindings::kvm_lapic_state>()
        + size_of::<kvm_bindings::kvm_mp_state>()
        + size_of::<kvm_bindings::kvm_vcpu_events>();
    v.extend(vec![0u8; state]);
    v.extend(msrs.to_le_bytes());
    v
}

/// Everything after the pages: the platform with `devices`, vCPU 0's frame `vcpu0`,
/// vCPU 1 all zeros, `Complete`.
fn whole_state(devices: Vec<u8>, vcpu0: Vec<u8>) -> Vec<u8> {
    [
        frame(8, &[0]),
        frame(3, &platform(0, &devices)),
        frame(4, &vcpu0),
        frame(4, &vcpu(1, 0)),
        frame(5, &[]),
    ]
    .concat()
}

/// A vCPU frame of zeros with one MSR.
fn vcpu_with_msr(index: u8, msr: u32) -> Vec<u8> {
    let mut v = vcpu(index, 1);
    v.extend(msr.to_le_bytes());
    v.extend([0u8; 4 + 8]);
    v
}

#[test]
fn a_target_refuses_malformed_and_oversized_streams_with_a_clear_error() {
    common::require_kvm();
    let good = header(MEMORY_MIB, 2);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", Vec::new(), "ends early"),
        (
            "bad magic",
            b"NOT-A-MIGRATION-STREAM-AT-ALL".to_vec(),
            "not a migration stream",
        ),
        (
            "other version",
            {
                let mut h = good.clone();
                h[8] = 9;
                h
            },
            "version 9",
        ),
        (
            "other memory size",
            header(MEMORY_MIB * 2, 2),
            "the two VMs differ",
        ),
        (
            "unknown frame",
            [good.clone(), frame(77, &[])].concat(),
            "unknown frame kind 77",
        ),
        (
            "oversized frame",
            [good.clone(), vec![1, 0xff, 0xff, 0xff, 0x7f]].concat(),
            "larger than the limit",
        ),
        (
            "pages past memory",
            [good.clone(), pages_frame(MEMORY_MIB << 20, 1, 1)].concat(),
            "not guest memory",
        ),
        (
            "unaligned pages",
            [good.clone(), pages_frame(0x1001, 1, 1)].concat(),
            "not guest memory",
        ),
        (
            "a page count its data lacks",
            [good.clone(), pages_frame(0x10_0000, 4, 1)].concat(),
            "ends early",
        ),
        (
            "too many pages in a frame",
            [good.clone(), pages_frame(0x10_0000, 257, 0)].concat(),
            "larger than the limit",
        ),
        (
            "zero pages wrapping around",
            [good.clone(), zero_frame(0x10_0000, u64::MAX / 4096)].concat(),
            "not guest memory",
        ),
        (
            "zero pages in the MMIO hole",
            [good.clone(), zero_frame(0xd000_0000, 1)].concat(),
            "not guest memory",
        ),
        (
            "a cut vCPU frame",
            [good.clone(), frame(4, &[5])].concat(),
            "ends early",
        ),
        (
            "complete without state",
            [good.clone(), zero_frame(0x10_0000, 1), frame(5, &[])].concat(),
            "without the platform",
        ),
        (
            "the source gives up",
            [good.clone(), frame(6, &[])].concat(),
            "gave the migration up",
        ),
        (
            "cut in a frame",
            [good.clone(), pages_frame(0x10_0000, 1, 1)[..100].to_vec()].concat(),
            "ends early",
        ),
        (
            "an interrupt controller in the wrong place",
            [good.clone(), frame(3, &platform(7, &devices(0)))].concat(),
            "interrupt controller 7 where 0 belongs",
        ),
        (
            "a vCPU the VM does not have",
            [good.clone(), frame(4, &vcpu(5, 0))].concat(),
            "vCPU 5 of a VM with 2 vCPUs",
        ),
        (
            "a vCPU sent twice",
            [good.clone(), frame(4, &vcpu(0, 0)), frame(4, &vcpu(0, 0))].concat(),
            "vCPU 0 sent twice",
        ),
        (
            "an MSR list past its bound",
            [good.clone(), frame(4, &vcpu(0, 100_000))].concat(),
            "larger than the limit",
        ),
        (
            "complete without a vCPU",
            [
                good.clone(),
                frame(8, &[0]),
                frame(3, &platform(0, &devices(0))),
                frame(4, &vcpu(0, 0)),
                frame(5, &[]),
            ]
            .concat(),
            "without vCPU 1",
        ),
        (
            "complete without the disks",
            [
                good.clone(),
                frame(3, &platform(0, &devices(0))),
                frame(4, &vcpu(0, 0)),
                frame(4, &vcpu(1, 0)),
                frame(5, &[]),
            ]
            .concat(),
            "without the disks frame",
        ),
        (
            "disks this VM does not have",
            [good.clone(), frame(8, &[1, 0, 0, 1, 0, 0, 0, 0, 0, 0])].concat(),
            "the source has 1 disks, this VM 0",
        ),
        (
            "disk data for a disk this VM does not have",
            [good.clone(), frame(8, &[0]), frame(10, &[0; 17])].concat(),
            "disk 0 of a VM with 0 disks",
        ),
        (
            "devices' state out of range",
            [good.clone(), whole_state(devices(0xff), vcpu(0, 0))].concat(),
            "ACPI GED events 0xff",
        ),
        (
            "an MSR this host does not save",
            [
                good.clone(),
                whole_state(devices(0), vcpu_with_msr(0, 0x4b56_4d99)),
            ]
            .concat(),
            "MSR 0x4b564d99 is not one this host saves",
        ),
    ];
    for (name, input, expected) in cases {
        let capture = SerialCapture::new();
        let mut stream = Scripted {
            input: Cursor::new(input),
            output: Vec::new(),
        };
        let err = Vm::receive(config("exit=tick", &capture), &mut stream)
            .map(|_| ())
            .expect_err(name)
            .to_string();
        assert!(err.contains(expected), "{name}: {err}");
        // The source is told, with the same words.
        assert_eq!(stream.output.first(), Some(&1), "{name}: a failure reply");
        let reply = String::from_utf8_lossy(&stream.output[5..]);
        assert!(reply.contains(expected), "{name}: {reply}");
    }
}
