//! The legacy PC devices a Linux guest (and the test guest) expects on
//! fixed I/O ports.

pub(crate) mod exit_port;
pub(crate) mod i8042;
pub(crate) mod rtc;
pub(crate) mod serial;

/// COM1.
pub(crate) const SERIAL_PORT: u64 = 0x3f8;
pub(crate) const SERIAL_PORT_LEN: u64 = 8;
pub(crate) const SERIAL_GSI: u32 = 4;
/// The i8042 keyboard controller: data at 0x60, status/command at 0x64.
pub(crate) const I8042_PORT: u64 = 0x60;
pub(crate) const I8042_PORT_LEN: u64 = 5;
pub(crate) const I8042_GSI: u32 = 1;
/// The debug-exit port (QEMU's isa-debug-exit location).
pub(crate) const EXIT_PORT: u64 = 0xf4;
pub(crate) const EXIT_PORT_LEN: u64 = 1;
/// The CMOS real-time clock: index at 0x70, data at 0x71 (no interrupt: see `rtc`).
pub(crate) const RTC_PORT: u64 = 0x70;
pub(crate) const RTC_PORT_LEN: u64 = 2;
