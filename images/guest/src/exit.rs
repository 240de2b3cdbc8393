//! How the guest ends: the exit code goes to the debug-exit port 0xf4, then a
//! reset through the i8042 controller (for VMMs without port 0xf4).

use crate::io::{halt_forever, inb, outb};
use core::sync::atomic::{AtomicU8, Ordering};

/// Exit codes the guest uses.
pub const FAILED_CODE: u8 = 1;
pub const EXCEPTION_CODE: u8 = 2;
pub const WAIT_TIMEOUT_CODE: u8 = 3;
pub const PANIC_CODE: u8 = 101;

const EXIT_PORT: u16 = 0xf4;
const I8042_DATA: u16 = 0x60;
const I8042_STATUS: u16 = 0x64;
const I8042_OUTPUT_FULL: u8 = 0x01;
const I8042_INPUT_FULL: u8 = 0x02;
const I8042_RESET_CPU: u8 = 0xfe;
const KEYBOARD_PIN: u32 = 1;
/// Set-2 scancodes of the Delete key (extended prefix, then 0x71).
const SCANCODE_EXTENDED: u8 = 0xe0;
const SCANCODE_DELETE: u8 = 0x71;

/// `exit=` on the command line.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitMode {
    /// Write the code to port 0xf4, then reset (the default).
    Poweroff = 0,
    /// Reset through the i8042 only (the code is not reported).
    Reset = 1,
    /// Wait for a shutdown request from the VMM: the ACPI power button
    /// (then power off through S5) or Ctrl-Alt-Del (keyboard IRQ 1, then
    /// reset).
    Halt = 2,
    /// Like `Halt`, printing a '.' every 10 ms (to see the guest run or stop).
    Tick = 3,
}

static MODE: AtomicU8 = AtomicU8::new(ExitMode::Poweroff as u8);

impl ExitMode {
    pub fn parse(text: &[u8]) -> Option<Self> {
        match text {
            b"poweroff" => Some(Self::Poweroff),
            b"reset" => Some(Self::Reset),
            b"halt" => Some(Self::Halt),
            b"tick" => Some(Self::Tick),
            _ => None,
        }
    }
}

pub fn set_mode(mode: ExitMode) {
    MODE.store(mode as u8, Ordering::SeqCst);
}

fn mode() -> ExitMode {
    match MODE.load(Ordering::SeqCst) {
        1 => ExitMode::Reset,
        2 => ExitMode::Halt,
        3 => ExitMode::Tick,
        _ => ExitMode::Poweroff,
    }
}

/// Ends the run with `code` in the current mode.
pub fn exit(code: u8) -> ! {
    // The waiting modes only reach here on a failure, which must end the run.
    if mode() != ExitMode::Reset {
        outb(EXIT_PORT, code);
    }
    reset()
}

/// Asks the i8042 to reset the machine; parks the vCPU if nothing happens.
pub fn reset() -> ! {
    for _ in 0..10_000 {
        if inb(I8042_STATUS) & I8042_INPUT_FULL == 0 {
            break;
        }
    }
    outb(I8042_STATUS, I8042_RESET_CPU);
    halt_forever()
}

/// The waiting modes: sleep until the power button or Ctrl-Alt-Del
/// arrives or `wait_s` seconds pass, then end the run (S5 power-off for the
/// button, reset on Ctrl-Alt-Del, `WAIT_TIMEOUT_CODE` on timeout). Other
/// modes return at once.
///
/// The GED's interrupt is routed (the power button enabled, as Linux's GED
/// driver does when it probes) only after `acpi_delay_ms`: a press that
/// came before must still arrive then, as the pending status it is.
pub fn wait_for_shutdown_request(wait_s: u32, acpi_delay_ms: u32) {
    let tick = match mode() {
        ExitMode::Halt => false,
        ExitMode::Tick => true,
        _ => return,
    };
    crate::irq::route(KEYBOARD_PIN);
    // What arrives on the serial console is echoed while the guest waits.
    crate::irq::route(crate::serial::COM1_PIN);
    crate::serial::enable_receive_interrupt();
    if acpi_delay_ms > 0 {
        crate::serial::write_str("ACPI power button enabled later\n");
        crate::irq::sleep_ms(acpi_delay_ms);
    }
    crate::acpi::enable_power_button();
    crate::serial::write_str("WAITING for Ctrl-Alt-Del or the power button\n");
    // Ticking prints a dot every 10 ms; halting sleeps a second at a time (woken at once by
    // the keyboard or the GED), so a hundred idle guests cost their host next to nothing.
    let step_ms = if tick { 10 } else { 1000 };
    let mut previous = 0u8;
    for step in 0..wait_s.saturating_mul(1000 / step_ms) {
        if crate::irq::take(crate::acpi::GED_PIN) && crate::acpi::power_button_pressed() {
            crate::serial::write_str("SHUTDOWN requested\nPOWEROFF acpi-s5\n");
            crate::acpi::power_off();
            crate::serial::write_str("TEST poweroff FAIL the VMM ignored S5\n");
            outb(EXIT_PORT, WAIT_TIMEOUT_CODE);
            reset();
        }
        let keyboard = if tick {
            crate::irq::wait(KEYBOARD_PIN, step_ms)
        } else {
            crate::irq::wait_any(
                &[KEYBOARD_PIN, crate::acpi::GED_PIN, crate::serial::COM1_PIN],
                step_ms,
            );
            crate::irq::take(KEYBOARD_PIN)
        };
        crate::irq::take(crate::serial::COM1_PIN);
        crate::serial::echo_input();
        if keyboard || inb(I8042_STATUS) & I8042_OUTPUT_FULL != 0 {
            // Drain the controller's buffer, bounded.
            for _ in 0..32 {
                if inb(I8042_STATUS) & I8042_OUTPUT_FULL == 0 {
                    break;
                }
                let code = inb(I8042_DATA);
                if previous == SCANCODE_EXTENDED && code == SCANCODE_DELETE {
                    crate::serial::write_str("SHUTDOWN requested\n");
                    reset();
                }
                previous = code;
            }
        } else if tick {
            crate::dirty::pass();
            if (step + 1) % 25 == 0 {
                crate::virtio::rng_tick();
                crate::virtio::blk_tick();
                crate::virtio::net_tick();
            }
            crate::serial::write_byte(b'.');
        }
    }
    crate::serial::write_str("TEST wait FAIL no shutdown request\n");
    outb(EXIT_PORT, WAIT_TIMEOUT_CODE);
    reset()
}
