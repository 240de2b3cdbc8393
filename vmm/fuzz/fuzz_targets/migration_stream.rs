//! The receiving side of a live migration: the stream's header and frames into
//! guest memory, the devices' state into the legacy devices, port I/O on them
//! after; the same bytes as the target's reply.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    vmm::fuzzing::migration_stream(data);
});
