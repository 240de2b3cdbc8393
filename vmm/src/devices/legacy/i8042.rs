//! The i8042 keyboard controller: enough of it for a guest to reset the
//! machine (command 0xfe, handled by vm-superio's `I8042Device`) and for the
//! VMM to ask the guest to shut down by typing Ctrl-Alt-Del.
//!
//! vm-superio's device only knows the reset command and reads back zeroes,
//! so the keyboard side (status register, output buffer, the controller
//! commands Linux's i8042 driver probes with, keyboard ACKs and the IRQ 1
//! line) is written here.

use std::collections::VecDeque;
use std::sync::Arc;

use vm_superio::{I8042Device, Trigger};

use crate::bus::BusDevice;
use crate::devices::irq::IrqLine;
use crate::lifecycle::{Control, VmExit};
use crate::wire::{Decoder, Encoder, FormatError};

const DATA_OFFSET: u64 = 0;
const COMMAND_OFFSET: u64 = 4;

// Status register bits.
const STATUS_OUTPUT_FULL: u8 = 0x01;
const STATUS_SYSTEM_FLAG: u8 = 0x04;
const STATUS_COMMAND: u8 = 0x08;

// Controller configuration byte bits.
const CONFIG_KBD_INTERRUPT: u8 = 0x01;
const CONFIG_SYSTEM_FLAG: u8 = 0x04;

// Controller commands.
const CMD_READ_CONFIG: u8 = 0x20;
const CMD_WRITE_CONFIG: u8 = 0x60;
const CMD_DISABLE_AUX: u8 = 0xa7;
const CMD_ENABLE_AUX: u8 = 0xa8;
const CMD_TEST_AUX: u8 = 0xa9;
const CMD_SELF_TEST: u8 = 0xaa;
const CMD_TEST_KBD: u8 = 0xab;
const CMD_DISABLE_KBD: u8 = 0xad;
const CMD_ENABLE_KBD: u8 = 0xae;
const CMD_READ_OUTPUT_PORT: u8 = 0xd0;
const CMD_WRITE_OUTPUT_PORT: u8 = 0xd1;
const CMD_WRITE_KBD_OUTPUT: u8 = 0xd2;
const CMD_RESET_CPU: u8 = 0xfe;

// Replies.
const SELF_TEST_OK: u8 = 0x55;
const PORT_TEST_OK: u8 = 0x00;
const PORT_TEST_NO_DEVICE: u8 = 0xff;
const KBD_ACK: u8 = 0xfa;
const KBD_RESET_OK: u8 = 0xaa;
const KBD_CMD_RESET: u8 = 0xff;
const KBD_CMD_IDENTIFY: u8 = 0xf2;
const KBD_ID: [u8; 2] = [0xab, 0x83];

/// Set-2 scancodes for pressing Ctrl, Alt and Delete (the controller does
/// not translate: the configuration byte has no XLATE bit).
const CTRL_ALT_DEL: [u8; 4] = [0x14, 0x11, 0xe0, 0x71];

/// Bytes the output buffer holds at most; a guest that never reads cannot
/// make it grow.
const MAX_BUFFERED: usize = 64;

/// Turns the guest's reset command into the end of the VM.
pub(crate) struct ResetTrigger(Arc<Control>);

impl Trigger for ResetTrigger {
    type E = std::convert::Infallible;

    fn trigger(&self) -> Result<(), Self::E> {
        self.0.finish(VmExit::Reset);
        Ok(())
    }
}

pub(crate) struct I8042 {
    reset: I8042Device<ResetTrigger>,
    irq: IrqLine,
    output: VecDeque<u8>,
    config: u8,
    output_port: u8,
    /// A controller command waiting for its data byte on port 0x60.
    pending: Option<u8>,
    last_was_command: bool,
}

impl I8042 {
    pub(crate) fn new(control: Arc<Control>, irq: IrqLine) -> Self {
        I8042 {
            reset: I8042Device::new(ResetTrigger(control)),
            irq,
            output: VecDeque::new(),
            config: CONFIG_KBD_INTERRUPT | CONFIG_SYSTEM_FLAG,
            output_port: 0x01,
            pending: None,
            last_was_command: false,
        }
    }

    /// The controller's state (for migration).
    pub(crate) fn save(&self, e: &mut Encoder) {
        e.short_bytes(&self.output.iter().copied().collect::<Vec<u8>>());
        e.u8(self.config);
        e.u8(self.output_port);
        e.u8(self.pending.unwrap_or(0));
        e.u8(u8::from(self.pending.is_some()) | (u8::from(self.last_was_command) << 1));
    }

    /// The controller as [`I8042::save`] wrote it.
    pub(crate) fn restore(&mut self, d: &mut Decoder) -> Result<(), FormatError> {
        let output = d.short_bytes(MAX_BUFFERED, "the i8042 output buffer")?;
        let (config, output_port, pending, flags) = (d.u8()?, d.u8()?, d.u8()?, d.u8()?);
        if flags > 3 {
            return Err(FormatError::Invalid(format!("i8042 flags {flags:#x}")));
        }
        self.output = output.iter().copied().collect();
        self.config = config;
        self.output_port = output_port;
        self.pending = (flags & 1 != 0).then_some(pending);
        self.last_was_command = flags & 2 != 0;
        Ok(())
    }

    /// Types Ctrl-Alt-Del: Linux answers with an orderly reboot (which ends
    /// the VM), the test guest with a reset.
    pub(crate) fn trigger_ctrl_alt_del(&mut self) {
        for code in CTRL_ALT_DEL {
            self.push(code);
        }
    }

    fn push(&mut self, byte: u8) {
        if self.output.len() >= MAX_BUFFERED {
            tracing::debug!("i8042: output buffer full, dropping {byte:#x}");
            return;
        }
        self.output.push_back(byte);
        self.raise_irq();
    }

    fn raise_irq(&self) {
        if self.config & CONFIG_KBD_INTERRUPT != 0
            && let Err(e) = self.irq.trigger()
        {
            tracing::warn!("i8042: cannot raise IRQ {}: {e}", self.irq.gsi());
        }
    }

    fn status(&self) -> u8 {
        let mut status = STATUS_SYSTEM_FLAG;
        if !self.output.is_empty() {
            status |= STATUS_OUTPUT_FULL;
        }
        if self.last_was_command {
            status |= STATUS_COMMAND;
        }
        status
    }

    fn read_data(&mut self) -> u8 {
        let byte = self.output.pop_front().unwrap_or(0);
        if !self.output.is_empty() {
            self.raise_irq();
        }
        byte
    }

    fn command(&mut self, command: u8) {
        self.last_was_command = true;
        match command {
            CMD_READ_CONFIG => self.push(self.config),
            CMD_WRITE_CONFIG | CMD_WRITE_OUTPUT_PORT | CMD_WRITE_KBD_OUTPUT => {
                self.pending = Some(command)
            }
            CMD_SELF_TEST => self.push(SELF_TEST_OK),
            CMD_TEST_KBD => self.push(PORT_TEST_OK),
            CMD_TEST_AUX => self.push(PORT_TEST_NO_DEVICE),
            CMD_READ_OUTPUT_PORT => self.push(self.output_port),
            CMD_DISABLE_KBD | CMD_ENABLE_KBD | CMD_DISABLE_AUX | CMD_ENABLE_AUX => {}
            CMD_RESET_CPU => {
                // Infallible trigger; vm-superio decides what a reset command is.
                let _ = self
                    .reset
                    .write(const { int_cast::u8_of_u64(COMMAND_OFFSET) }, command);
            }
            other => tracing::debug!("i8042: ignoring controller command {other:#x}"),
        }
    }

    fn write_data(&mut self, byte: u8) {
        self.last_was_command = false;
        match self.pending.take() {
            Some(CMD_WRITE_CONFIG) => self.config = byte,
            Some(CMD_WRITE_OUTPUT_PORT) => self.output_port = byte,
            Some(CMD_WRITE_KBD_OUTPUT) => self.push(byte),
            _ => self.keyboard_command(byte),
        }
    }

    /// A byte for the keyboard itself: acknowledge it like a PS/2 keyboard.
    fn keyboard_command(&mut self, byte: u8) {
        self.output.clear();
        self.push(KBD_ACK);
        match byte {
            KBD_CMD_RESET => self.push(KBD_RESET_OK),
            KBD_CMD_IDENTIFY => KBD_ID.iter().for_each(|&b| self.push(b)),
            _ => {}
        }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let value = match offset {
            DATA_OFFSET => self.read_data(),
            COMMAND_OFFSET => self.status(),
            _ => 0xff,
        };
        data.fill(0);
        if let Some(first) = data.first_mut() {
            *first = value;
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let Some(&value) = data.first() else { return };
        match offset {
            DATA_OFFSET => self.write_data(value),
            COMMAND_OFFSET => self.command(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

    fn device() -> (I8042, Arc<Control>, EventFd) {
        let control = Arc::new(Control::new(1));
        let event = EventFd::new(EFD_NONBLOCK).unwrap();
        let irq = IrqLine::from_eventfd(1, event.try_clone().unwrap());
        (I8042::new(control.clone(), irq), control, event)
    }

    fn read(dev: &mut I8042, offset: u64) -> u8 {
        let mut data = [0u8; 1];
        dev.read(offset, &mut data);
        data[0]
    }

    #[test]
    fn the_reset_command_ends_the_vm_with_a_reset() {
        let (mut dev, control, _) = device();
        dev.write(COMMAND_OFFSET, &[0xfe]);
        assert_eq!(control.exit(), Some(VmExit::Reset));
    }

    #[test]
    fn other_commands_do_not_end_the_vm() {
        let (mut dev, control, _) = device();
        for command in 0..=0xfdu8 {
            dev.write(COMMAND_OFFSET, &[command]);
            dev.write(DATA_OFFSET, &[0]);
        }
        assert_eq!(control.exit(), None);
    }

    #[test]
    fn ctrl_alt_del_is_typed_with_an_interrupt() {
        let (mut dev, _, irq) = device();
        dev.trigger_ctrl_alt_del();
        assert!(irq.read().unwrap() > 0, "no interrupt raised");
        let mut typed = Vec::new();
        while read(&mut dev, COMMAND_OFFSET) & STATUS_OUTPUT_FULL != 0 {
            typed.push(read(&mut dev, DATA_OFFSET));
        }
        assert_eq!(typed, CTRL_ALT_DEL);
    }

    #[test]
    fn the_controller_answers_the_probes_linux_sends() {
        let (mut dev, _, _) = device();
        dev.write(COMMAND_OFFSET, &[CMD_SELF_TEST]);
        assert_eq!(read(&mut dev, DATA_OFFSET), SELF_TEST_OK);
        dev.write(COMMAND_OFFSET, &[CMD_WRITE_CONFIG]);
        dev.write(DATA_OFFSET, &[0x45]);
        dev.write(COMMAND_OFFSET, &[CMD_READ_CONFIG]);
        assert_eq!(read(&mut dev, DATA_OFFSET), 0x45);
        dev.write(COMMAND_OFFSET, &[CMD_TEST_KBD]);
        assert_eq!(read(&mut dev, DATA_OFFSET), PORT_TEST_OK);
        dev.write(DATA_OFFSET, &[KBD_CMD_RESET]);
        assert_eq!(
            (read(&mut dev, DATA_OFFSET), read(&mut dev, DATA_OFFSET)),
            (KBD_ACK, KBD_RESET_OK)
        );
        assert_eq!(read(&mut dev, COMMAND_OFFSET) & STATUS_OUTPUT_FULL, 0);
    }

    #[test]
    fn interrupts_follow_the_configuration_byte() {
        let (mut dev, _, irq) = device();
        dev.write(COMMAND_OFFSET, &[CMD_WRITE_CONFIG]);
        dev.write(DATA_OFFSET, &[0]);
        dev.trigger_ctrl_alt_del();
        assert!(
            irq.read().is_err(),
            "interrupt raised with keyboard interrupts off"
        );
    }

    #[test]
    fn a_guest_that_never_reads_cannot_grow_the_buffer() {
        let (mut dev, _, _) = device();
        for _ in 0..1000 {
            dev.trigger_ctrl_alt_del();
            dev.write(COMMAND_OFFSET, &[CMD_SELF_TEST]);
        }
        assert!(dev.output.len() <= MAX_BUFFERED);
    }

    #[test]
    fn random_accesses_never_panic() {
        let (mut dev, _, _) = device();
        // A small deterministic generator: the same sequence on every run.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..100_000 {
            let r = next();
            let offset = r % 8;
            let len = 1 + (r >> 8) as usize % 4;
            let mut data = vec![(r >> 16).to_le_bytes()[0]; len];
            if r & (1 << 40) == 0 {
                dev.read(offset, &mut data);
            } else {
                dev.write(offset, &data);
            }
            assert!(dev.output.len() <= MAX_BUFFERED);
        }
    }
}
