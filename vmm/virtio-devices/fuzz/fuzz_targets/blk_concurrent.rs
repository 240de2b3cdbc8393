//! virtio-blk as the VMM runs it: a 256-entry queue, the concurrent qcow2
//! engine on a real file and its I/O threads; guest memory, descriptors,
//! ring indexes and register writes from the fuzzer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_devices::fuzz::blk_concurrent(data);
});
