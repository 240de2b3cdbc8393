//! virtio-rng's 256-entry queue; guest memory, descriptors, ring indexes
//! and register writes from the fuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_devices::fuzz::rng_queue(data);
});
