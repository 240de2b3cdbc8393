//! Guest memory (descriptor table, available ring, requests, buffers) from
//! the fuzzer, a virtio-blk device on an in-memory disk, notifications.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_devices::fuzz::blk_queue(data);
});
