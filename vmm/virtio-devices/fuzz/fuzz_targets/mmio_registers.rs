//! virtio-mmio register reads and writes of any offset, width and value.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    virtio_devices::fuzz::mmio_registers(data);
});
