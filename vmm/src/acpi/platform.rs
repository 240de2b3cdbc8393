//! The hardware-reduced ACPI platform device: the registers the FADT and
//! the DSDT point at, on I/O ports 0x600-0x60f.
//!
//! - 0x600, sleep control: writing `SLP_EN | SLP_TYP << 2` with the `_S5`
//!   type powers the VM off (ends it with [`VmExit::PowerOff`]).
//! - 0x601, sleep status: reads 0 (no wake events).
//! - 0x604, reset register: writing [`RESET_VALUE`] resets the VM.
//! - 0x608, GED status: the pending events (bit 0: power button), cleared
//!   by the read; their interrupt is GSI [`GED_GSI`] (level, active high),
//!   up while an event is pending.
//!
//! [`AcpiPlatform::press_power_button`] is the VMM's graceful shutdown
//! (KubeVirt's default): the GED's `_EVT` notifies the power button, and
//! Linux (acpid or its own handler) powers off through `_S5`.
//!
//! A press stays pending until the guest reads the status, as a status bit
//! does on real hardware (PM1's PWRBTN_STS, QEMU's GED selector): a guest
//! that enables the GED's interrupt only later (KubeVirt asks for the
//! shutdown right after the domain starts, while the guest still boots)
//! gets the interrupt when it unmasks the pin, because the line is a level
//! held up while the status is non-zero ([`LevelIrqLine`]). An edge, as
//! before, was dropped by the IOAPIC while the pin was masked, and the
//! guest never learned of the press.

use std::sync::Arc;

use virtio_devices::LogLimit;

use crate::bus::BusDevice;
use crate::devices::irq::LevelIrqLine;
use crate::lifecycle::{Control, VmExit};
use crate::wire::{Decoder, Encoder, FormatError};

pub(crate) const PORT_BASE: u64 = 0x600;
pub(crate) const PORT_LEN: u64 = 0x10;
pub(crate) const SLEEP_CONTROL_PORT: u16 = 0x600;
pub(crate) const SLEEP_STATUS_PORT: u16 = 0x601;
pub(crate) const RESET_PORT: u16 = 0x604;
pub(crate) const RESET_VALUE: u8 = 1;
pub(crate) const GED_STATUS_PORT: u16 = 0x608;
/// The GED's interrupt: the last IOAPIC pin (virtio-mmio devices use 5-22).
pub(crate) const GED_GSI: u32 = 23;
/// The `_S5` sleep type.
pub(crate) const SLP_TYP_S5: u8 = 5;
const SLP_EN: u8 = 1 << 5;
/// GED event bit of the power button.
pub(crate) const EVENT_POWER_BUTTON: u8 = 1;

pub(crate) struct AcpiPlatform {
    control: Arc<Control>,
    /// Up while `events` is non-zero.
    ged: LevelIrqLine,
    events: u8,
    /// Sleep states the guest asks for and does not get: it may ask in a loop.
    unsupported_sleep: LogLimit,
}

impl AcpiPlatform {
    pub(crate) fn new(control: Arc<Control>, ged: LevelIrqLine) -> Self {
        AcpiPlatform {
            control,
            ged,
            events: 0,
            unsupported_sleep: LogLimit::new(),
        }
    }

    /// The pending events (for migration).
    pub(crate) fn save(&self, e: &mut Encoder) {
        e.u8(self.events);
    }

    /// The pending events as [`AcpiPlatform::save`] wrote them; the GED's line follows.
    pub(crate) fn restore(&mut self, d: &mut Decoder) -> Result<(), FormatError> {
        let events = d.u8()?;
        if events & !EVENT_POWER_BUTTON != 0 {
            return Err(FormatError::Invalid(format!("ACPI GED events {events:#x}")));
        }
        self.events = events;
        self.ged.set(events != 0);
        Ok(())
    }

    /// Presses the power button: an event for the guest's GED, pending
    /// (and its interrupt up) until the guest reads the status.
    pub(crate) fn press_power_button(&mut self) {
        self.events |= EVENT_POWER_BUTTON;
        self.ged.set(true);
    }
}

impl BusDevice for AcpiPlatform {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        if offset == u64::from(GED_STATUS_PORT) - PORT_BASE
            && let Some(first) = data.first_mut()
        {
            *first = std::mem::take(&mut self.events);
            self.ged.set(false);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        match offset + PORT_BASE {
            o if o == u64::from(SLEEP_CONTROL_PORT) => {
                let sleep_type = (value >> 2) & 0x7;
                if value & SLP_EN != 0 && sleep_type == SLP_TYP_S5 {
                    self.control.finish(VmExit::PowerOff { code: 0 });
                } else if value & SLP_EN != 0
                    && let Some(suppressed) = self.unsupported_sleep.admit()
                {
                    tracing::warn!(
                        suppressed,
                        "ACPI: sleep type {sleep_type} is not supported; ignored"
                    );
                }
            }
            o if o == u64::from(RESET_PORT) && value == RESET_VALUE => {
                self.control.finish(VmExit::Reset);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::irq::tests::{line, raised};
    use vmm_sys_util::eventfd::EventFd;

    /// The platform, its control, and the GED line's irqfd and resamplefd
    /// as KVM sees them.
    fn platform() -> (AcpiPlatform, Arc<Control>, EventFd, EventFd) {
        let control = Arc::new(Control::new(1));
        let (line, irq, resample) = line();
        (
            AcpiPlatform::new(control.clone(), line),
            control,
            irq,
            resample,
        )
    }

    #[test]
    fn the_power_button_raises_the_ged_and_reads_once() {
        let (mut p, _, irq, _) = platform();
        p.press_power_button();
        assert!(raised(&irq));
        let mut status = [0u8];
        p.read(u64::from(GED_STATUS_PORT) - PORT_BASE, &mut status);
        assert_eq!(status, [EVENT_POWER_BUTTON]);
        p.read(u64::from(GED_STATUS_PORT) - PORT_BASE, &mut status);
        assert_eq!(status, [0]);
    }

    /// The press before the guest enabled the GED: KVM dropped the pending
    /// level when the guest unmasked the pin and signalled the resamplefd;
    /// the line goes up again for as long as the status is unread.
    #[test]
    fn a_press_stays_pending_and_its_interrupt_up_until_the_status_is_read() {
        let (mut p, _, irq, resample) = platform();
        p.press_power_button();
        assert!(raised(&irq));
        // The guest unmasks the pin (or EOIs without reading): up again.
        resample.write(1).unwrap();
        assert!(raised(&irq), "the pending press must raise the GED again");
        resample.write(1).unwrap();
        assert!(raised(&irq));
        let mut status = [0u8];
        p.read(u64::from(GED_STATUS_PORT) - PORT_BASE, &mut status);
        assert_eq!(status, [EVENT_POWER_BUTTON]);
        // Read: the EOI that follows lowers the line for good.
        resample.write(1).unwrap();
        assert!(!raised(&irq), "nothing pending, yet the GED went up again");
        // A second press after the read is a new event.
        p.press_power_button();
        assert!(raised(&irq));
    }

    #[test]
    fn s5_powers_off_other_sleep_states_do_not() {
        let (mut p, control, _, _) = platform();
        // S3 (type 3) and SLP_TYP without SLP_EN change nothing.
        p.write(0, &[(3 << 2) | SLP_EN]);
        p.write(0, &[SLP_TYP_S5 << 2]);
        assert_eq!(control.exit(), None);
        p.write(0, &[(SLP_TYP_S5 << 2) | SLP_EN]);
        assert_eq!(control.exit(), Some(VmExit::PowerOff { code: 0 }));
    }

    /// A guest asking for S3 in a loop: the first lines, not one per request.
    #[test]
    fn unsupported_sleep_states_are_logged_at_a_bounded_rate() {
        let (mut p, control, ..) = platform();
        let capture = virtio_devices::LogCapture::default();
        tracing::subscriber::with_default(capture.clone(), || {
            for _ in 0..1000 {
                p.write(0, &[(3 << 2) | SLP_EN]);
            }
        });
        let lines = capture.lines_with("sleep type 3 is not supported");
        assert_eq!(
            u32::try_from(lines.len()),
            Ok(virtio_devices::LOG_BURST),
            "{lines:#?}"
        );
        assert_eq!(control.exit(), None);
    }

    #[test]
    fn the_reset_register_resets() {
        let (mut p, control, _, _) = platform();
        p.write(u64::from(RESET_PORT) - PORT_BASE, &[0]);
        assert_eq!(control.exit(), None);
        p.write(u64::from(RESET_PORT) - PORT_BASE, &[RESET_VALUE]);
        assert_eq!(control.exit(), Some(VmExit::Reset));
    }
}
