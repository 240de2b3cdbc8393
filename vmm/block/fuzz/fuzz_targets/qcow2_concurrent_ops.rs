//! The request sequences of `qcow2_ops` through `ConcurrentDisk`, the engine
//! virtio-blk runs: checked against an in-memory model and by the
//! consistency check.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    block::fuzz_support::concurrent_ops_input(data);
});
