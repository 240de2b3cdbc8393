//! Guest port I/O on the serial port, the i8042 and the exit port.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmm::fuzzing::legacy_port_io(data);
});
