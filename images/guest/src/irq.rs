//! Device interrupts through the IOAPIC and local APIC (emulated in KVM), and
//! bounded waits using the local APIC timer.
//!
//! The guest runs with interrupts off and enables them only inside `sti; hlt`,
//! so handlers never interrupt check code.

use crate::idt::{self, IRQ_BASE, IRQ_PINS, SPURIOUS_VECTOR, TIMER_VECTOR};
use crate::io::{mmio_read32, mmio_write32};
use core::arch::asm;
use core::sync::atomic::{AtomicU32, Ordering};

const LAPIC: u64 = 0xfee0_0000;
const LAPIC_TPR: u64 = LAPIC + 0x80;
const LAPIC_EOI: u64 = LAPIC + 0xb0;
const LAPIC_SVR: u64 = LAPIC + 0xf0;
const LAPIC_LVT_TIMER: u64 = LAPIC + 0x320;
const LAPIC_TIMER_INITIAL: u64 = LAPIC + 0x380;
const LAPIC_TIMER_DIVIDE: u64 = LAPIC + 0x3e0;
const IOAPIC: u64 = 0xfec0_0000;
const IOAPIC_VERSION: u32 = 0x01;
/// Redirection entry: trigger mode level, and the mask.
const LEVEL_TRIGGERED: u32 = 1 << 15;
const MASKED: u32 = 1 << 16;

/// The pins routed level-triggered (one bit each).
static LEVEL_PINS: AtomicU32 = AtomicU32::new(0);

/// KVM's local APIC timer counts at 1 GHz with divide-by-1.
const TIMER_TICKS_PER_MS: u32 = 1_000_000;
/// Interrupts a single millisecond wait may see before giving up on it.
const MAX_WAKEUPS_PER_MS: u32 = 64;
/// The bit of the timer in the pending set.
const TIMER_BIT: u32 = (TIMER_VECTOR - IRQ_BASE) as u32;

/// Enables the local APIC (spurious vector 0xff, accept all priorities).
pub fn init() {
    mmio_write32(LAPIC_TPR, 0);
    mmio_write32(LAPIC_SVR, 0x100 | u32::from(SPURIOUS_VECTOR));
    mmio_write32(LAPIC_TIMER_DIVIDE, 0xb);
}

/// Signals the end of an interrupt to the local APIC.
pub fn end_of_interrupt() {
    mmio_write32(LAPIC_EOI, 0);
}

/// Number of IOAPIC pins, from its version register.
pub fn ioapic_pins() -> u32 {
    mmio_write32(IOAPIC, IOAPIC_VERSION);
    ((mmio_read32(IOAPIC + 0x10) >> 16) & 0xff) + 1
}

/// Routes IOAPIC pin `pin` to this guest's vector for it (edge-triggered,
/// active high, to APIC id 0). Returns false for a pin out of range.
pub fn route(pin: u32) -> bool {
    if pin >= u32::from(IRQ_PINS) || pin >= ioapic_pins() {
        return false;
    }
    let register = 0x10 + 2 * pin;
    mmio_write32(IOAPIC, register + 1);
    mmio_write32(IOAPIC + 0x10, 0);
    mmio_write32(IOAPIC, register);
    mmio_write32(IOAPIC + 0x10, u32::from(IRQ_BASE) + pin);
    true
}

/// Routes IOAPIC pin `pin` level-triggered, active high, to this guest's
/// vector for it. Its interrupt handler masks the pin before the EOI (as
/// Linux's one-shot interrupts do) and [`unmask`] opens it again once the
/// device's status has been read: a level still up would interrupt again
/// at once otherwise. Returns false for a pin out of range.
pub fn route_level(pin: u32) -> bool {
    if pin >= u32::from(IRQ_PINS) || pin >= ioapic_pins() {
        return false;
    }
    LEVEL_PINS.fetch_or(1 << pin, Ordering::SeqCst);
    let register = 0x10 + 2 * pin;
    mmio_write32(IOAPIC, register + 1);
    mmio_write32(IOAPIC + 0x10, 0);
    mmio_write32(IOAPIC, register);
    mmio_write32(IOAPIC + 0x10, (u32::from(IRQ_BASE) + pin) | LEVEL_TRIGGERED);
    true
}

/// Whether pin `pin` was routed level-triggered.
pub fn is_level(pin: u32) -> bool {
    pin < 32 && LEVEL_PINS.load(Ordering::SeqCst) & (1 << pin) != 0
}

fn set_masked(pin: u32, masked: bool) {
    let register = 0x10 + 2 * pin;
    mmio_write32(IOAPIC, register);
    let entry = mmio_read32(IOAPIC + 0x10);
    let entry = if masked { entry | MASKED } else { entry & !MASKED };
    mmio_write32(IOAPIC, register);
    mmio_write32(IOAPIC + 0x10, entry);
}

/// Masks pin `pin` (from its interrupt handler, before the EOI).
pub fn mask(pin: u32) {
    set_masked(pin, true);
}

/// Unmasks pin `pin`: a level still up interrupts again.
pub fn unmask(pin: u32) {
    set_masked(pin, false);
}

/// Takes the pending flag of IOAPIC pin `pin`.
pub fn take(pin: u32) -> bool {
    idt::take_pending(pin)
}

fn halt_with_interrupts() {
    // SAFETY: `sti; hlt` waits for the next interrupt; the one-instruction
    // interrupt shadow of sti makes the pair race-free. Handlers run with
    // interrupts off and iretq returns here.
    unsafe { asm!("sti", "hlt", "cli", options(nomem, nostack)) };
}

/// Waits until IOAPIC pin `pin` has fired (taking its flag) or `timeout_ms`
/// milliseconds of timer ticks have passed. Returns whether it fired.
pub fn wait(pin: u32, timeout_ms: u32) -> bool {
    for _ in 0..timeout_ms {
        if take(pin) {
            return true;
        }
        sleep_once_or_until(Some(pin));
    }
    take(pin)
}

/// Longest one-shot timer: the initial count is 32 bits at 1 GHz.
pub const MAX_SLEEP_MS: u32 = u32::MAX / TIMER_TICKS_PER_MS;

/// Halts until one of `pins` is pending (left pending for the caller) or about `timeout_ms`
/// (at most [`MAX_SLEEP_MS`]) pass, on one timer: an idle guest exits to the VMM once per
/// wait, not once per millisecond. Returns whether a pin is pending.
pub fn wait_any(pins: &[u32], timeout_ms: u32) -> bool {
    let pending = || pins.iter().any(|&pin| idt::peek_pending(pin));
    if pending() {
        return true;
    }
    let ms = timeout_ms.clamp(1, MAX_SLEEP_MS);
    idt::take_pending(TIMER_BIT);
    mmio_write32(LAPIC_LVT_TIMER, u32::from(TIMER_VECTOR));
    mmio_write32(LAPIC_TIMER_INITIAL, ms * TIMER_TICKS_PER_MS);
    for _ in 0..MAX_WAKEUPS_PER_MS.saturating_mul(ms) {
        halt_with_interrupts();
        if pending() {
            mmio_write32(LAPIC_TIMER_INITIAL, 0);
            return true;
        }
        if idt::take_pending(TIMER_BIT) {
            break;
        }
    }
    pending()
}

/// Sleeps about `ms` milliseconds (timer ticks).
pub fn sleep_ms(ms: u32) {
    for _ in 0..ms {
        sleep_once_or_until(None);
    }
}

/// Arms a one-shot 1 ms timer and halts until it (or `pin`) fires.
fn sleep_once_or_until(pin: Option<u32>) {
    idt::take_pending(TIMER_BIT);
    mmio_write32(LAPIC_LVT_TIMER, u32::from(TIMER_VECTOR));
    mmio_write32(LAPIC_TIMER_INITIAL, TIMER_TICKS_PER_MS);
    for _ in 0..MAX_WAKEUPS_PER_MS {
        halt_with_interrupts();
        if idt::take_pending(TIMER_BIT) {
            return;
        }
        if let Some(pin) = pin
            && idt::peek_pending(pin)
        {
            mmio_write32(LAPIC_TIMER_INITIAL, 0);
            return;
        }
    }
}
