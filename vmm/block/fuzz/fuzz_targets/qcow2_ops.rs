//! Random read/write/discard/zero/flush sequences on a small image, checked
//! against an in-memory model and by the consistency check.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    block::fuzz_support::ops_input(data);
});
