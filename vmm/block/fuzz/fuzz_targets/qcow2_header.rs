//! Hostile first clusters and whole image files: parse, open read-only, read, check.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    block::fuzz_support::header_input(data);
});
