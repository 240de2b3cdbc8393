//! The library API a launcher drives: start, pause, resume, graceful
//! shutdown, kill, and the serial console socket.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use vmm::Error;
use vmm::{SerialCapture, SerialTarget, Vm, VmConfig, VmExit, VmHandle, VmState};

const BOOT: Duration = Duration::from_secs(60);

/// Starts the test guest with this command line, serial captured.
fn start(cmdline: &str, vcpus: u8) -> (VmHandle, SerialCapture) {
    common::require_kvm();
    let capture = SerialCapture::new();
    let mut config = VmConfig::new(common::test_guest_kernel());
    config.cmdline = cmdline.to_string();
    config.vcpus = vcpus;
    config.serial = SerialTarget::Capture(capture.clone());
    let handle = Vm::start(config).expect("start the test guest");
    (handle, capture)
}

fn count_dots(capture: &SerialCapture) -> usize {
    capture.contents().iter().filter(|&&b| b == b'.').count()
}

/// Waits until the guest printed more dots than `than`.
fn wait_for_dots(capture: &SerialCapture, than: usize, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if count_dots(capture) > than {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn pause_stops_the_guest_and_resume_continues_it() {
    let (vm, capture) = start("checks=serial exit=tick wait=120", 2);
    assert!(
        capture.wait_for("WAITING for Ctrl-Alt-Del", BOOT),
        "{}",
        capture.text()
    );
    assert!(
        wait_for_dots(&capture, 2, BOOT),
        "the guest does not tick: {}",
        capture.text()
    );
    assert_eq!(vm.state(), VmState::Running);

    vm.pause().expect("pause");
    assert_eq!(vm.state(), VmState::Paused);
    let frozen = count_dots(&capture);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(count_dots(&capture), frozen, "the guest ran while paused");

    vm.resume().expect("resume");
    assert_eq!(vm.state(), VmState::Running);
    assert!(
        wait_for_dots(&capture, frozen, BOOT),
        "the guest did not run again after resume"
    );

    vm.request_shutdown().expect("shutdown request");
    assert_eq!(
        vm.wait_timeout(BOOT),
        Some(VmExit::PowerOff { code: 0 }),
        "{}",
        capture.text()
    );
    assert!(capture.text().contains("SHUTDOWN requested"));
    assert_eq!(vm.state(), VmState::Exited);
}

#[test]
fn a_graceful_shutdown_request_is_the_power_button_and_s5_powers_off() {
    let (vm, capture) = start("checks=smp exit=halt wait=120", 4);
    assert!(
        capture.wait_for("WAITING for Ctrl-Alt-Del", BOOT),
        "{}",
        capture.text()
    );
    vm.request_shutdown().expect("shutdown request");
    assert_eq!(
        vm.wait_timeout(BOOT),
        Some(VmExit::PowerOff { code: 0 }),
        "{}",
        capture.text()
    );
    assert!(
        capture
            .text()
            .contains("SHUTDOWN requested\nPOWEROFF acpi-s5"),
        "{}",
        capture.text()
    );
    assert!(
        capture.text().contains("TEST smp PASS cpus=4"),
        "{}",
        capture.text()
    );
}

/// KubeVirt's handler asks for the shutdown right after the domain starts,
/// before the guest's ACPI is up: the press stays pending (the GED's status
/// and its interrupt) until the guest enables the power button, which then
/// sees it and powers off through S5.
#[test]
fn a_power_button_pressed_before_the_guest_enables_it_is_seen_when_it_does() {
    let (vm, capture) = start("checks=serial exit=halt wait=60 acpi_delay=300", 1);
    vm.request_shutdown().expect("shutdown request");
    assert!(
        capture.wait_for("ACPI power button enabled later", BOOT),
        "{}",
        capture.text()
    );
    assert_eq!(
        vm.wait_timeout(BOOT),
        Some(VmExit::PowerOff { code: 0 }),
        "{}",
        capture.text()
    );
    let text = capture.text();
    // The press came before the guest enabled the button, and the guest
    // saw it only after (its status read is the only way it learns of it).
    let enabled_later = text.find("ACPI power button enabled later");
    let waiting = text.find("WAITING for Ctrl-Alt-Del");
    let seen = text.find("SHUTDOWN requested\nPOWEROFF acpi-s5");
    assert!(
        enabled_later.is_some() && enabled_later < waiting && waiting < seen,
        "{text}"
    );
}

#[test]
fn ctrl_alt_del_still_resets_the_guest() {
    let (vm, capture) = start("checks=serial exit=halt wait=120", 1);
    assert!(capture.wait_for("WAITING", BOOT), "{}", capture.text());
    vm.request_ctrl_alt_del().expect("Ctrl-Alt-Del");
    assert_eq!(
        vm.wait_timeout(BOOT),
        Some(VmExit::Reset),
        "{}",
        capture.text()
    );
    assert!(!capture.text().contains("POWEROFF"), "{}", capture.text());
}

/// A guest halted in its one-second wait when paused still sees Ctrl-Alt-Del after the
/// resume (`virtctl pause`, `unpause`, `soft-reboot`): its timer and the keyboard's
/// interrupt wake it again.
#[test]
fn a_guest_resumed_from_a_pause_in_its_halt_wait_still_sees_ctrl_alt_del() {
    let (vm, capture) = start("checks=serial exit=halt wait=120", 1);
    assert!(capture.wait_for("WAITING", BOOT), "{}", capture.text());
    std::thread::sleep(Duration::from_millis(300));
    vm.pause().expect("pause");
    std::thread::sleep(Duration::from_millis(1500));
    vm.resume().expect("resume");
    std::thread::sleep(Duration::from_millis(2000));
    vm.request_ctrl_alt_del().expect("Ctrl-Alt-Del");
    assert_eq!(
        vm.wait_timeout(BOOT),
        Some(VmExit::Reset),
        "{}",
        capture.text()
    );
    assert!(
        capture.text().contains("SHUTDOWN requested"),
        "{}",
        capture.text()
    );
}

#[test]
fn kill_stops_a_guest_that_never_ends() {
    let (vm, capture) = start("checks=serial exit=halt wait=600", 2);
    assert!(capture.wait_for("WAITING", BOOT), "{}", capture.text());
    vm.kill();
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(10)),
        Some(VmExit::Killed)
    );
    assert_eq!(vm.state(), VmState::Exited);
    assert_eq!(VmExit::Killed.exit_status(), 137);
}

#[test]
fn a_paused_guest_can_be_killed() {
    let (vm, capture) = start("checks=serial exit=halt wait=600", 1);
    assert!(capture.wait_for("WAITING", BOOT));
    vm.pause().unwrap();
    vm.kill();
    assert_eq!(
        vm.wait_timeout(Duration::from_secs(10)),
        Some(VmExit::Killed)
    );
}

#[test]
fn lifecycle_requests_after_the_end_are_refused() {
    let (vm, _capture) = start("checks=serial code=3", 1);
    assert_eq!(vm.wait_timeout(BOOT), Some(VmExit::PowerOff { code: 3 }));
    assert!(matches!(
        vm.pause(),
        Err(Error::Ended(VmExit::PowerOff { code: 3 }))
    ));
    assert!(matches!(vm.resume(), Err(Error::Ended(_))));
    assert!(matches!(vm.request_shutdown(), Err(Error::Ended(_))));
    // The first ending stays.
    vm.kill();
    assert_eq!(vm.exit(), Some(VmExit::PowerOff { code: 3 }));
}

#[test]
fn dropping_the_handle_stops_the_vm() {
    let (vm, capture) = start("checks=serial exit=tick wait=600", 2);
    assert!(capture.wait_for("WAITING", BOOT));
    drop(vm);
    let dots = count_dots(&capture);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        count_dots(&capture),
        dots,
        "the guest still runs after the handle was dropped"
    );
}

#[test]
fn a_console_client_reads_serial_output_from_a_unix_socket() {
    common::require_kvm();
    let dir = common::tempdir();
    let socket = dir.path().join("console.sock");
    let mut config = VmConfig::new(common::test_guest_kernel());
    config.cmdline = "checks=serial,idt exit=halt wait=120".into();
    config.serial = SerialTarget::UnixSocket(socket.clone());
    let vm = Vm::start(config).expect("start");

    // The client attaches after boot: the backlog replays what it missed.
    std::thread::sleep(Duration::from_millis(300));
    let stream = UnixStream::connect(&socket).expect("connect to the console socket");
    stream.set_read_timeout(Some(BOOT)).unwrap();
    let mut lines = BufReader::new(stream.try_clone().unwrap()).lines();
    let mut seen = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        let done = line.starts_with("WAITING");
        seen.push(line);
        if done {
            break;
        }
    }
    assert!(
        seen.iter().any(|l| l == "TEST serial PASS com1=0x3f8"),
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|l| l.starts_with("TEST idt PASS")),
        "{seen:?}"
    );

    // Input from the client reaches the UART: the waiting guest echoes it.
    (&stream).write_all(b"hello\n").unwrap();
    let line = lines.next().and_then(Result::ok);
    assert_eq!(line.as_deref(), Some("hello"), "the guest's echo");
    vm.request_shutdown().unwrap();
    assert_eq!(vm.wait_timeout(BOOT), Some(VmExit::PowerOff { code: 0 }));
    let line = lines.next().and_then(Result::ok);
    assert_eq!(line.as_deref(), Some("SHUTDOWN requested"));
    let line = lines.next().and_then(Result::ok);
    assert_eq!(line.as_deref(), Some("POWEROFF acpi-s5"));
    drop(vm);
    assert!(!socket.exists(), "the console socket outlived the VM");
    // The VMM closed the client's connection (a reset if our input was
    // still unread on its side).
    let after = lines.next();
    let closed = match &after {
        None => true,
        Some(Err(e)) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Some(Ok(_)) => false,
    };
    assert!(closed, "the console connection stayed open: {after:?}");
}

#[test]
fn stats_count_the_guests_disk_requests_and_vcpu_time() {
    common::require_kvm();
    let dir = common::tempdir();
    let disk = dir.path().join("disk.raw");
    std::fs::write(&disk, vec![0x11u8; 1 << 20]).unwrap();
    let capture = SerialCapture::new();
    let mut config = VmConfig::new(common::test_guest_kernel());
    config.cmdline = "checks=virtio-blk exit=tick wait=120".into();
    config.serial = SerialTarget::Capture(capture.clone());
    config.disks.push(vmm::DiskConfig {
        cache: vmm::DiskCache::WriteBack,
        ..vmm::DiskConfig::new(disk, vmm::DiskFormat::Raw)
    });
    let vm = Vm::start(config).expect("start the test guest");
    assert!(
        capture.wait_for("WAITING for Ctrl-Alt-Del", BOOT),
        "{}",
        String::from_utf8_lossy(&capture.contents())
    );
    let stats = vm.stats();
    assert_eq!(stats.disks.len(), 1);
    assert!(stats.nets.is_empty());
    let d = stats.disks[0];
    // The guest's checks read, write, flush and write zeroes.
    assert!(d.rd_reqs >= 2 && d.rd_bytes >= 1024, "{d:?}");
    assert!(d.wr_reqs >= 2 && d.wr_bytes >= 1024, "{d:?}");
    assert!(d.fl_reqs >= 1, "{d:?}");
    assert_eq!(d.capacity, 1 << 20);
    // One vCPU, running: its thread has used CPU time (an emulated guest
    // burns plenty of it to get here).
    assert_eq!(stats.vcpu_times.len(), 1);
    assert!(
        stats.vcpu_times[0].is_some_and(|t| t > Duration::ZERO),
        "{:?}",
        stats.vcpu_times
    );
    vm.kill();
    vm.wait();
    // Counters stay readable after the end; the vCPU thread is gone.
    let after = vm.stats();
    assert_eq!(after.disks[0].rd_reqs, d.rd_reqs);
    assert_eq!(after.vcpu_times, vec![None]);
}
