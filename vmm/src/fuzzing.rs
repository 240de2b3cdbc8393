//! Entry points shared by the fuzz targets (vmm/fuzz) and the deterministic
//! random tests in the normal test suite: guest port I/O on the legacy
//! devices, which a guest controls completely.

use std::sync::{Arc, Mutex};

use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::bus::Bus;
use crate::config::SerialTarget;
use crate::devices::irq::IrqLine;
use crate::devices::legacy::exit_port::ExitPort;
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::rtc::Rtc;
use crate::devices::legacy::serial::Console;
use crate::devices::legacy::*;
use crate::lifecycle::Control;

/// Ports worth hitting: every legacy register and the bytes around them.
const PORTS: [u16; 15] = [
    0x3f8, 0x3f9, 0x3fa, 0x3fb, 0x3fc, 0x3fd, 0x3ff, 0x400, 0x60, 0x64, 0x65, 0xf4, 0x70, 0x71,
    0x72,
];

/// Replays `data` as port accesses (op byte, port index, size, value) on
/// the legacy devices behind a bus. Must never panic.
pub fn legacy_port_io(data: &[u8]) {
    let control = Arc::new(Control::new(1));
    let line = |gsi| IrqLine::from_eventfd(gsi, EventFd::new(EFD_NONBLOCK).expect("eventfd"));
    let sandbox =
        crate::sandbox::Sandbox::new(crate::sandbox::SandboxConfig::disabled(), Vec::new())
            .expect("no filters to build");
    let console = Console::new(
        &SerialTarget::Null,
        line(SERIAL_GSI),
        sandbox,
        Default::default(),
    )
    .expect("null console");
    let i8042 = Arc::new(Mutex::new(I8042::new(control.clone(), line(I8042_GSI))));
    let mut bus = Bus::new("fuzz");
    bus.insert(SERIAL_PORT, SERIAL_PORT_LEN, console.device.clone())
        .expect("free range");
    bus.insert(I8042_PORT, I8042_PORT_LEN, i8042.clone())
        .expect("free range");
    bus.insert(
        EXIT_PORT,
        EXIT_PORT_LEN,
        Arc::new(Mutex::new(ExitPort::new(control))),
    )
    .expect("free range");
    bus.insert(RTC_PORT, RTC_PORT_LEN, Arc::new(Mutex::new(Rtc::new(0))))
        .expect("free range");
    for chunk in data.chunks(4) {
        let [op, port, size, value] = <[u8; 4]>::try_from(chunk).unwrap_or([chunk[0], 0, 1, 0]);
        let port = u64::from(PORTS[usize::from(port) % PORTS.len()]);
        let size = [1usize, 2, 4][usize::from(size) % 3];
        match op % 3 {
            0 => bus.read(port, &mut vec![0; size]),
            1 => bus.write(port, &vec![value; size]),
            _ => crate::bus::lock(&i8042).trigger_ctrl_alt_del(),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn random_port_io_never_panics() {
        // xorshift: the same sequence on every run.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200 {
            let data: Vec<u8> = (0..512)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state.to_le_bytes()[0]
                })
                .collect();
            super::legacy_port_io(&data);
        }
    }
}
