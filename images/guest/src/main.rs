//! The test guest: boots like a Linux kernel (64-bit boot protocol), runs the
//! checks named on its command line, prints one `TEST <name> PASS|FAIL
//! <detail>` line each on COM1, then ends (see `exit.rs`). Command-line
//! syntax: see `cmdline.rs`.
//!
//! Guest code runs at about 1 µs per instruction under the emulating KVM this
//! project tests on: no `core::fmt`, and every loop is bounded.

#![no_std]
#![no_main]

mod acpi;
mod bootparams;
mod checks;
mod dirty;
pub mod cmdline;
mod exit;
mod idt;
pub mod io;
pub mod irq;
pub mod pci;
pub mod report;
mod rtc;
mod serial;
mod smbios;
mod smp;
mod start;
mod trampoline;
mod user;
pub mod virtio;

use bootparams::BootParams;
use report::{Reporter, SerialReporter};

/// Default wait for a shutdown request in the `halt`/`tick` exit modes.
const DEFAULT_WAIT_S: u32 = 600;

/// Entered by the boot vCPU with RSI = boot_params (see start.rs).
#[unsafe(no_mangle)]
extern "C" fn bsp_main(_apic_id: u32, boot_params: u64) -> ! {
    serial::init();
    // First sign of life before anything else: filling the IDT alone is about
    // 4,000 instructions, 4 ms where KVM emulates each one.
    serial::write_str("BOOT test-guest\n");
    idt::install();
    mask_pics();
    irq::init();

    let bp = BootParams::new(boot_params);
    let cmdline = bp.map(|b| b.cmdline()).unwrap_or(&[]);
    if let Some(mode) = cmdline::value(cmdline, "exit").and_then(exit::ExitMode::parse) {
        exit::set_mode(mode);
    }

    let mut r = SerialReporter::default();
    if cmdline::check_selected(cmdline, "serial") {
        checks::serial(&mut r);
    }
    if cmdline::check_selected(cmdline, "bootparams") {
        checks::bootparams(&mut r, bp);
    }
    if cmdline::check_selected(cmdline, "idt") {
        checks::idt(&mut r);
    }
    if cmdline::check_selected(cmdline, "mem") {
        checks::mem(&mut r, bp);
    }
    if cmdline::check_selected(cmdline, "mptable") {
        checks::mptable(&mut r, cmdline);
    }
    if cmdline::check_named(cmdline, "cpuid") {
        checks::cpuid(&mut r);
    }
    if cmdline::check_selected(cmdline, "smp") {
        checks::smp(&mut r, cmdline);
    }
    if cmdline::check_named(cmdline, "emulation") {
        checks::emulation(&mut r);
    }
    if cmdline::check_named(cmdline, "interrupts") {
        checks::interrupts(&mut r);
    }
    if cmdline::check_named(cmdline, "acpi") {
        acpi::check(&mut r, checks::expected_cpus(cmdline));
    }
    if cmdline::check_named(cmdline, "pci") {
        pci::check(&mut r);
    }
    if cmdline::check_named(cmdline, "smbios") {
        smbios::check(&mut r);
    }
    if cmdline::check_named(cmdline, "rtc") {
        rtc::check(&mut r);
    }
    if cmdline::check_named(cmdline, "initrd") {
        checks::initrd(&mut r, bp);
    }
    if cmdline::check_named(cmdline, "badio") {
        checks::badio(&mut r);
    }

    let mut devices = [(0u64, 0u32); cmdline::MAX_VIRTIO_DEVICES];
    let (count, bad) = cmdline::virtio_devices(cmdline, &mut devices);
    if bad > 0 {
        let mut d = report::Detail::new();
        d.str("malformed virtio_mmio.device entries: ")
            .dec(bad as u64);
        r.result("virtio-cmdline", false, d.as_str());
    }
    virtio::run_checks(&devices[..count], cmdline, &mut r);

    if cmdline::check_named(cmdline, "panic") {
        checks::panic(&mut r);
    }
    if cmdline::check_named(cmdline, "unemulated") {
        checks::unemulated(&mut r);
    }
    if cmdline::check_named(cmdline, "triplefault") {
        checks::triplefault(&mut r);
    }

    let mut d = report::Detail::new();
    d.str("DONE passed=")
        .dec(u64::from(r.passed))
        .str(" failed=")
        .dec(u64::from(r.failed))
        .str("\n");
    serial::write(d.as_bytes());

    let wait_s = cmdline::value(cmdline, "wait")
        .and_then(cmdline::parse_u64)
        .map(|s| s.min(u64::from(u32::MAX)) as u32)
        .unwrap_or(DEFAULT_WAIT_S);
    let acpi_delay_ms = cmdline::value(cmdline, "acpi_delay")
        .and_then(cmdline::parse_u64)
        .map(|ms| ms.min(600_000) as u32)
        .unwrap_or(0);
    dirty::init(cmdline, bp.map_or(0, |b| b.ram_bytes()));
    exit::wait_for_shutdown_request(wait_s, acpi_delay_ms);

    let code = if r.failed > 0 {
        exit::FAILED_CODE
    } else {
        cmdline::value(cmdline, "code")
            .and_then(cmdline::parse_u64)
            .map(|c| c as u8)
            .unwrap_or(0)
    };
    exit::exit(code)
}

/// Masks both 8259 PICs: interrupts come through the IOAPIC only.
fn mask_pics() {
    io::outb(0x21, 0xff);
    io::outb(0xa1, 0xff);
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo) -> ! {
    serial::write_str("PANIC");
    if let Some(location) = info.location() {
        serial::write_byte(b' ');
        serial::write_str(location.file());
        serial::write_byte(b':');
        serial::write_dec(u64::from(location.line()));
    }
    serial::write_byte(b'\n');
    exit::exit(exit::PANIC_CODE)
}
