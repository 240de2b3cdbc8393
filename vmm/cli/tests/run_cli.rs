//! `vmm run` with the embedded test guest, through the real binary.

mod common;

use common::*;

/// Boots with `vcpus` vCPUs started the `ap_start` way; `started` is how
/// the guest reports they got going (`direct` or `sipi`).
fn boots_with_vcpus(vcpus: &str, ap_start: &str, started: &str) {
    let out = run_guest(&[
        "--vcpus",
        vcpus,
        "--ap-start",
        ap_start,
        "--cmdline",
        "exit=poweroff",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    for check in ["serial", "bootparams", "idt", "mem", "mptable", "smp"] {
        assert_pass(&out, check);
    }
    let text = stdout(&out);
    assert!(text.starts_with("BOOT test-guest\n"), "{text}");
    let smp = text.lines().find(|l| l.starts_with("TEST smp")).unwrap();
    assert!(
        smp.contains(&format!("cpus={vcpus} expected={vcpus}")),
        "{smp}"
    );
    assert!(smp.ends_with(&format!("start={started}")), "{smp}");
    let mptable = text
        .lines()
        .find(|l| l.starts_with("TEST mptable"))
        .unwrap();
    assert!(mptable.contains(&format!("cpus={vcpus} ")), "{mptable}");
    assert!(text.contains("DONE passed=6 failed=0"), "{text}");
    assert!(
        stderr(&out).contains("guest power-off with exit code 0"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn boots_with_one_vcpu() {
    boots_with_vcpus("1", "init-sipi", "direct");
}

#[test]
fn every_vcpu_checks_in_with_two() {
    // The default: vCPUs wait for INIT/SIPI, as Linux expects.
    boots_with_vcpus("2", "init-sipi", "sipi");
}

#[test]
fn every_vcpu_checks_in_with_four_started_either_way() {
    boots_with_vcpus("4", "init-sipi", "sipi");
    boots_with_vcpus("4", "direct", "direct");
    // APIC ids 0..3 all seen.
    let out = run_guest(&["--vcpus", "4", "--cmdline", "checks=smp"]);
    assert!(stdout(&out).contains("ids=0xf"), "{}", stdout(&out));
}

#[test]
fn with_init_sipi_secondary_vcpus_wait_to_be_started() {
    // Linux starts its secondary vCPUs itself; until then they must not run.
    // The MP table still lists all of them.
    let out = run_guest(&[
        "--vcpus",
        "3",
        "--ap-start",
        "init-sipi",
        "--cmdline",
        "checks=smp smp=direct cpus=1",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("TEST smp PASS cpus=1 expected=1 ids=0x1"),
        "{}",
        stdout(&out)
    );
    let out = run_guest(&["--vcpus", "3", "--cmdline", "checks=mptable"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("TEST mptable PASS at=0xf0000 cpus=3"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn with_init_sipi_the_guest_starts_its_secondary_vcpus_through_real_mode() {
    // What Linux does: INIT, SIPI, SIPI; each AP runs a real-mode trampoline
    // into long mode.
    let out = run_guest(&[
        "--vcpus",
        "4",
        "--ap-start",
        "init-sipi",
        "--cmdline",
        "smp=sipi checks=smp",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert!(
        stdout(&out).contains("TEST smp PASS cpus=4 expected=4 ids=0xf"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn the_guest_exit_code_becomes_the_process_status() {
    let out = run_guest(&["--cmdline", "checks=serial code=42"]);
    assert_eq!(out.status.code(), Some(42), "{}", stderr(&out));
    assert!(stderr(&out).contains("exit code 42"));
}

#[test]
fn a_failed_check_gives_a_non_zero_status() {
    // The guest expects 3 vCPUs but has 1.
    let out = run_guest(&["--cmdline", "checks=smp cpus=3"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("TEST smp FAIL cpus=1 expected=3"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_reset_through_the_i8042_exits_zero() {
    let out = run_guest(&["--vcpus", "2", "--cmdline", "exit=reset code=9"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("VM ended: guest reset"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_triple_fault_is_reported_as_a_crash() {
    let out = run_guest(&["--cmdline", "checks=triplefault"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("triple fault on vCPU 0: rip="),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_guest_panic_is_reported_with_its_code() {
    let out = run_guest(&["--cmdline", "checks=panic"]);
    assert_eq!(out.status.code(), Some(101));
    assert!(
        stdout(&out).contains("PANIC src/checks.rs:"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn unknown_ports_and_mmio_read_all_ones_and_are_logged() {
    let out = run_guest(&["--cmdline", "checks=badio"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_pass(&out, "badio");
    let err = stderr(&out);
    assert!(
        err.contains("port I/O write of 1 bytes at 0xc50: no device there"),
        "{err}"
    );
    assert!(
        err.contains("MMIO write of 4 bytes at 0xf0001000: no device there"),
        "{err}"
    );
}

#[test]
fn memory_above_the_mmio_hole_is_reported_to_the_guest() {
    let out = run_guest(&["--memory", "4608", "--cmdline", "checks=mem,bootparams"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("TEST mem PASS ram_mib=4607"),
        "{}",
        stdout(&out)
    );
    // Low RAM, RAM below the hole, RAM above 4 GiB, the reserved hole.
    assert!(
        stdout(&out).contains("TEST bootparams PASS e820=4"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn a_vm_has_smbios_tables_and_a_ticking_cmos_clock() {
    // Above the MMIO hole too: the tables map both RAM ranges.
    let out = run_guest(&[
        "--memory",
        "4608",
        "--vcpus",
        "2",
        "--cmdline",
        "checks=smbios,rtc",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    // `vmm run` sets no system strings and no UUID.
    assert!(
        text.contains(
            "TEST smbios PASS manufacturer= product= family= serial= \
             uuid=00000000-0000-0000-0000-000000000000 cpus=2 memory_mib=4608\n"
        ),
        "{text}"
    );
    assert!(text.contains("TEST rtc PASS time="), "{text}");
}

#[test]
fn serial_output_can_go_to_a_file() {
    let dir = tempdir();
    let log = dir.path().join("console.log");
    let out = run_guest(&[
        "--cmdline",
        "checks=serial",
        "--serial",
        &format!("file:{}", log.display()),
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stdout(&out).contains("TEST"), "output went to stdout too");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("TEST serial PASS"), "{text}");
}

#[test]
fn the_embedded_guest_can_be_written_out() {
    let dir = tempdir();
    let path = guest_elf(&dir);
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..4], b"\x7fELF");
    assert!(
        bytes.len() < 256 * 1024,
        "the guest grew to {} bytes",
        bytes.len()
    );
}

#[test]
fn the_guest_has_no_sse_instructions() {
    let dir = tempdir();
    let path = guest_elf(&dir);
    let out = std::process::Command::new("objdump")
        .arg("-d")
        .arg(&path)
        .output()
        .expect("objdump is needed for this test (Debian package binutils)");
    assert!(out.status.success());
    let listing = String::from_utf8_lossy(&out.stdout);
    assert!(
        listing.lines().count() > 100,
        "objdump listed almost nothing:\n{listing}"
    );
    // One deliberate exception: the `unemulated` check's pxor on MMIO.
    let deliberate = |l: &&str| l.contains("pxor") && l.contains("),%xmm0");
    let sse: Vec<&str> = listing
        .lines()
        .filter(|l| l.contains("xmm") && !deliberate(l))
        .collect();
    assert_eq!(listing.lines().filter(deliberate).count(), 1, "{listing}");
    assert!(
        sse.is_empty(),
        "SSE instructions in the guest (the emulator cannot run them):\n{}",
        sse.join("\n")
    );
}

#[test]
fn an_initrd_is_loaded_where_the_zero_page_says() {
    let dir = tempdir();
    let initrd = dir.path().join("initrd.img");
    let bytes: Vec<u8> = (0..50_000u32)
        .map(|i| (i * 7 + 3).to_le_bytes()[0])
        .collect();
    std::fs::write(&initrd, &bytes).unwrap();
    let sum = bytes
        .iter()
        .fold(0u32, |s, &b| s.wrapping_add(u32::from(b)));
    let out = run_guest(&[
        "--initrd",
        initrd.to_str().unwrap(),
        "--cmdline",
        "checks=initrd",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("TEST initrd PASS"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!(" size=50000 sum={sum:#x}")),
        "{line}"
    );
    // Page aligned, at the top of the 128 MiB of RAM.
    let addr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr=0x"))
        .unwrap();
    let addr = u64::from_str_radix(addr, 16).unwrap();
    assert_eq!(addr % 4096, 0);
    assert!(
        addr + 50_000 <= 128 << 20 && addr > (128 << 20) - (1 << 20),
        "{addr:#x}"
    );
}

#[test]
fn an_initrd_larger_than_memory_is_refused() {
    let dir = tempdir();
    let initrd = dir.path().join("big.img");
    std::fs::File::create(&initrd)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let out = run_guest(&["--memory", "32", "--initrd", initrd.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("does not fit in guest memory"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn sigterm_asks_the_guest_to_shut_down_and_a_second_one_kills() {
    use std::io::{BufRead, BufReader};
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let start = |cmdline: &str, ready: &str| {
        let mut child = spawn_run(&kernel, &["--cmdline", cmdline]);
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        assert!(
            lines.any(|l| l.is_ok_and(|l| l.starts_with(ready))),
            "no {ready:?} from the guest"
        );
        (child, lines)
    };
    let sigterm = |child: &std::process::Child| {
        let pid = libc::pid_t::try_from(child.id()).expect("a Linux pid fits a pid_t");
        // SAFETY: plain kill(2) on our own child, not yet reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    };

    // A guest waiting for Ctrl-Alt-Del honours the request: a reset, status 0.
    let (mut child, mut lines) = start("checks=serial exit=halt wait=120", "WAITING");
    sigterm(&child);
    assert!(lines.any(|l| l.is_ok_and(|l| l == "SHUTDOWN requested")));
    assert_eq!(child.wait().unwrap().code(), Some(0));

    // A guest busy elsewhere (the smp check waits 5 s for vCPUs that do not
    // exist and does not read its keyboard) is killed by the second signal.
    let (mut child, _lines) = start("checks=smp cpus=3 exit=halt wait=120", "BOOT");
    sigterm(&child);
    std::thread::sleep(std::time::Duration::from_millis(100));
    sigterm(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(137), "{status}");
}

/// Serial bytes reach stdout as the guest sends them, not when a line ends:
/// in `tick` mode the guest prints a dot every 10 ms and no newline. Rust's
/// stdout is line-buffered; the UART model flushes after every byte, and
/// without that flush the first dot came after 12 s.
#[test]
fn serial_output_is_not_held_back_until_a_newline() {
    use std::io::{BufRead, BufReader, Read};
    use std::time::{Duration, Instant};
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let mut child = spawn_run(&kernel, &["--cmdline", "checks=serial exit=tick wait=60"]);
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    while !line.starts_with("WAITING") {
        line.clear();
        assert_ne!(out.read_line(&mut line).unwrap(), 0, "no WAITING line");
    }
    let waiting = Instant::now();
    let mut dot = [0u8; 1];
    out.read_exact(&mut dot).unwrap();
    let waited = waiting.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(&dot, b".");
    assert!(
        waited < Duration::from_secs(5),
        "the first dot came after {waited:?}"
    );
}

#[test]
fn a_guest_ignoring_sigterm_is_stopped_after_the_shutdown_timeout() {
    use std::io::{BufRead, BufReader};
    use std::time::{Duration, Instant};
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    // The smp check waits 5 s for vCPUs that do not exist and does not read its
    // keyboard meanwhile: the request goes unanswered for longer than the timeout.
    let mut child = spawn_run(
        &kernel,
        &[
            "--shutdown-timeout",
            "1",
            "--cmdline",
            "checks=smp cpus=3 exit=halt wait=120",
        ],
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert!(lines.any(|l| l.is_ok_and(|l| l.starts_with("BOOT"))));
    let asked = Instant::now();
    let pid = libc::pid_t::try_from(child.id()).expect("a Linux pid fits a pid_t");
    // SAFETY: plain kill(2) on our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    let deadline = asked + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "vmm outlived its shutdown timeout"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        asked.elapsed() >= Duration::from_secs(1),
        "stopped before the timeout"
    );
    assert_eq!(status.code(), Some(137), "{status}");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("did not shut down within 1s (--shutdown-timeout): stopping the VM"),
        "{err}"
    );
}

#[test]
fn breakpoints_software_interrupts_and_clac_stac_are_finished_by_the_vmm() {
    // KVM's emulator has none of them; the guest sees the architectural
    // outcome (the #BP handler past int3, vector 0x33, RFLAGS.AC).
    let out = run_guest(&["--cmdline", "checks=emulation"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_pass(&out, "emulation");
}

#[test]
fn an_instruction_nobody_can_finish_is_a_guest_crash_with_its_bytes() {
    let out = run_guest(&["--cmdline", "checks=unemulated"]);
    assert_eq!(out.status.code(), Some(125), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("guest crash on vCPU 0: KVM internal error (suberror 1: instruction emulation failed) at rip=")
            && err.contains("bytes=[66 0f ef"),
        "{err}"
    );
}

/// `VMM_TIMINGS=1`: the VM's boot milestones, in the order they happen (the boot
/// benchmark reads this line).
#[test]
fn the_boot_timeline_is_reported_in_order() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let mut cmd = vmm();
    cmd.env("VMM_TIMINGS", "1")
        .arg("run")
        .arg("--kernel")
        .arg(&kernel)
        .args(["--cmdline", "exit=poweroff"]);
    let out = run_with_timeout(cmd, std::time::Duration::from_secs(120));
    assert_eq!(out.status.code(), Some(0), "stderr:\n{}", stderr(&out));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.starts_with("VMM_TIMING "))
        .unwrap_or_else(|| panic!("no VMM_TIMING line:\n{err}"));
    let stamp = |key: &str| -> u64 {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {line}"))
    };
    let (run, byte, exit) = (
        stamp("first_kvm_run_ns"),
        stamp("first_serial_byte_ns"),
        stamp("vm_exit_ns"),
    );
    assert!(0 < run && run < byte && byte < exit, "{line}");
}
