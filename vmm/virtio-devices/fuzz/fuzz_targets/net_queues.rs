//! virtio-net transmit and receive (256-entry queues) over a socket pair
//! standing in for the tap; guest memory, descriptors, ring indexes,
//! register writes and host frames from the fuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_devices::fuzz::net_queues(data);
});
