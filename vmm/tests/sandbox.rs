//! What happens when a VMM thread makes a system call outside its filter.
//!
//! The sandbox's test hook (`SandboxConfig::forbidden_syscall_on`) makes a
//! thread of one kind create a file right after entering its sandbox. Under
//! `trap` the whole process ends with status 159 and names the call, so
//! each case runs the VM in a child process: this test binary again, with
//! `VMM_SANDBOX_CHILD=<mode>:<thread kind>` selecting the ignored `child`
//! test. Under `log` the call goes through seccomp (the kernel logs it) and
//! Landlock refuses it.

mod common;

use std::process::Command;
use std::time::Duration;

use vmm::sandbox::{SeccompMode, ThreadKind};
use vmm::{DiskConfig, DiskFormat, SerialCapture, SerialTarget, Vm, VmConfig};

const CHILD_ENV: &str = "VMM_SANDBOX_CHILD";

fn kind(name: &str) -> ThreadKind {
    match name {
        "vcpu" => ThreadKind::Vcpu,
        "blk" => ThreadKind::VirtioBlock,
        "rng" => ThreadKind::VirtioRng,
        "boot" => ThreadKind::BootLoader,
        "ged" => ThreadKind::IrqResample,
        other => panic!("unknown thread kind {other}"),
    }
}

/// The VM of a child run: the test guest with a disk and an rng, the hook
/// armed for one thread kind. Runs until the guest ends.
#[test]
#[ignore = "run by the other tests in a child process"]
fn child() {
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    // mode:kind, or mode:kind:nohook to run the same VM without the hook.
    let mut fields = spec.split(':');
    let (mode, on) = (
        fields.next().expect("mode"),
        fields.next().expect("thread kind"),
    );
    let hook = fields.next() != Some("nohook");
    let dir = common::tempdir();
    let disk = dir.path().join("disk.raw");
    let checks = "checks=virtio-blk,virtio-rng exit=poweroff";
    let mut config = if on == "boot" {
        // The guest from a Debian-style disk: the boot loader thread reads it.
        test_guest::disks::write_boot_disk(
            &disk,
            test_guest::disks::Layout::Debian,
            &test_guest::disks::Kernel {
                image: test_guest::ELF,
                initrd: None,
                cmdline: checks,
            },
        )
        .unwrap();
        VmConfig::new(vmm::KernelSource::Disk(vmm::BootDisk {
            disk: 0,
            firmware: vmm::BootFirmware::Bios,
        }))
    } else {
        std::fs::write(&disk, vec![0u8; 1 << 20]).unwrap();
        let mut config = VmConfig::new(common::test_guest_kernel());
        config.cmdline = checks.into();
        config
    };
    let capture = SerialCapture::new();
    config.disks.push(DiskConfig::new(&disk, DiskFormat::Raw));
    config.rng = true;
    config.serial = SerialTarget::Capture(capture.clone());
    config.sandbox.seccomp = mode.parse::<SeccompMode>().unwrap();
    config.sandbox.forbidden_syscall_on = hook.then(|| kind(on));
    let vm = Vm::start(config).expect("start the VM");
    let exit = vm
        .wait_timeout(Duration::from_secs(120))
        .expect("the guest ends");
    println!("child: VM ended: {exit}");
    println!("child: serial:\n{}", capture.text());
}

/// Runs the child; returns its output and process id.
fn run_child(mode: &str, on: &str) -> (std::process::Output, u32) {
    run_child_spec(&format!("{mode}:{on}"))
}

/// Runs the child's VM for `on` without the hook.
fn run_child_without_hook(mode: &str, on: &str) -> (std::process::Output, u32) {
    run_child_spec(&format!("{mode}:{on}:nohook"))
}

fn run_child_spec(spec: &str) -> (std::process::Output, u32) {
    common::require_kvm();
    let child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the child");
    let pid = child.id();
    (child.wait_with_output().expect("child output"), pid)
}

fn assert_trapped(on: &str, kind_name: &str) {
    let (out, _) = run_child("trap", on);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(159),
        "a forbidden call on a {on} thread must end the process with 159\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    // openat is system call 257 on x86-64.
    assert!(
        stderr.contains(&format!(
            "forbidden system call (seccomp) on a {kind_name} thread: number 257"
        )),
        "{stderr}"
    );
    assert!(!stdout.contains("child: VM ended"), "{stdout}");
}

#[test]
fn a_forbidden_call_on_a_vcpu_thread_ends_the_vmm() {
    assert_trapped("vcpu", "vCPU");
}

#[test]
fn a_forbidden_call_on_the_boot_disk_thread_ends_the_vmm() {
    assert_trapped("boot", "boot loader");
}

/// The boot disk thread's allowlist is enough to read a disk and boot from it.
#[test]
fn a_vm_boots_from_its_disk_under_every_filter() {
    let (out, _) = run_child_without_hook("trap", "boot");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success()
            && stdout.contains("child: VM ended: guest power-off with exit code 0"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("TEST virtio-rng-read PASS"), "{stdout}");
}

#[test]
fn a_forbidden_call_on_a_device_thread_ends_the_vmm() {
    assert_trapped("blk", "virtio-blk");
    assert_trapped("rng", "virtio-rng");
    // The ACPI GED's resample thread, started with the VM's platform devices.
    assert_trapped("ged", "irq resample");
}

#[test]
fn under_log_a_forbidden_call_is_logged_and_landlock_refuses_the_open() {
    let (out, pid) = run_child("log", "vcpu");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stdout.contains("child: VM ended: guest power-off with exit code 0"),
        "{stdout}"
    );
    // The open went past seccomp (logged, not trapped) and hit Landlock.
    assert!(
        stderr.contains("Vcpu thread created a file: Err(\"Permission denied"),
        "{stderr}"
    );
    // The kernel's audit record of the logged call (SECCOMP_RET_LOG is
    // 0x7ffc0000; openat is 257).
    let wanted = [
        format!("pid={pid} "),
        "comm=\"vcpu0\"".to_string(),
        "syscall=257 ".to_string(),
        "code=0x7ffc0000".to_string(),
    ];
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let dmesg = Command::new("dmesg").output().expect("dmesg");
        let log = String::from_utf8_lossy(&dmesg.stdout);
        if log
            .lines()
            .any(|l| l.contains("type=1326") && wanted.iter().all(|w| l.contains(w.as_str())))
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no audit record {wanted:?} for the logged call in dmesg"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
