//! Entry points shared by the cargo-fuzz targets (`fuzz/`) and the random
//! input tests of the normal test suite: guest-controlled bytes in, no panic
//! out.
//!
//! Not part of the device API: built only with the `testing` feature, which
//! the fuzz crate, the tests and the benchmark turn on.

use int_cast::usize_to_u64;
use std::sync::Arc;

use crate::GuestMemoryMmap;
use ::block::{DiskBackend, DiskError, DiskResult};
use int_cast::u64_to_usize;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use vm_memory::{Bytes, GuestAddress};

use crate::MmioTransport;
use crate::block::{Block, BlockOptions};
use crate::device::feature_bit;
use crate::interrupt::InterruptTrigger;

mod devices;
mod guest;

pub use devices::{blk_concurrent, net_queues, rng_queue};

/// A disk held in memory, for tests and fuzzing.
#[derive(Debug, Clone, Default)]
pub struct MemDisk {
    pub bytes: Vec<u8>,
    pub read_only: bool,
    pub flushes: usize,
    pub discards: Vec<(u64, u64)>,
    pub zeroed: Vec<(u64, u64, bool)>,
    /// Fail every operation with this (`Unsupported` or I/O).
    pub fail: Option<fn() -> DiskError>,
}

impl MemDisk {
    pub fn new(size: usize) -> Self {
        MemDisk {
            bytes: vec![0; size],
            ..Default::default()
        }
    }

    fn range(&self, offset: u64, len: usize) -> DiskResult<std::ops::Range<usize>> {
        if let Some(f) = self.fail {
            return Err(f());
        }
        self.check_range(offset, usize_to_u64(len))?;
        // In range of a Vec (checked just above).
        let start = u64_to_usize(offset);
        Ok(start..start + len)
    }
}

impl DiskBackend for MemDisk {
    fn size(&self) -> u64 {
        usize_to_u64(self.bytes.len())
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        let r = self.range(offset, buf.len())?;
        buf.copy_from_slice(&self.bytes[r]);
        Ok(())
    }
    fn write_at(&mut self, buf: &[u8], offset: u64) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        let r = self.range(offset, buf.len())?;
        self.bytes[r].copy_from_slice(buf);
        Ok(())
    }
    fn flush(&mut self) -> DiskResult<()> {
        if let Some(f) = self.fail {
            return Err(f());
        }
        self.flushes += 1;
        Ok(())
    }
    fn discard(&mut self, offset: u64, len: u64) -> DiskResult<()> {
        self.range(offset, u64_to_usize(len))?;
        self.discards.push((offset, len));
        Ok(())
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        let r = self.range(offset, u64_to_usize(len))?;
        self.bytes[r].fill(0);
        self.zeroed.push((offset, len, may_unmap));
        Ok(())
    }
}

struct NoInterrupt;
impl InterruptTrigger for NoInterrupt {
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

const FUZZ_MEM: usize = 256 * 1024;
const FUZZ_QUEUE_SIZE: u32 = 16;
const DESC: u64 = 0;
const AVAIL: u64 = 0x1000;
const USED: u64 = 0x2000;

/// Guest memory filled from `data`, a block device brought up with one queue
/// whose descriptor table and available ring are whatever `data` says, then
/// a few notifications. Exercises the avail ring, chain validation, request
/// parsing and execution against an in-memory disk.
pub fn blk_queue(data: &[u8]) {
    let Ok(mem) = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), FUZZ_MEM)]) else {
        return;
    };
    let n = data.len().min(FUZZ_MEM);
    if mem.write_slice(&data[..n], GuestAddress(0)).is_err() {
        return;
    }
    let mut disk = MemDisk::new(64 * 1024);
    disk.read_only = data.first().is_some_and(|b| b & 1 == 1);
    let dev = Block::new(Box::new(disk), BlockOptions::default());
    let mut t = MmioTransport::new(Box::new(dev), mem, Arc::new(NoInterrupt));
    let w = |t: &mut MmioTransport, reg: u32, v: u32| t.write(u64::from(reg), &v.to_le_bytes());
    w(&mut t, VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
    w(
        &mut t,
        VIRTIO_MMIO_STATUS,
        VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER,
    );
    w(&mut t, VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
    w(
        &mut t,
        VIRTIO_MMIO_DRIVER_FEATURES,
        (feature_bit(VIRTIO_F_VERSION_1) >> 32) as u32,
    );
    let features_ok =
        VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER | VIRTIO_CONFIG_S_FEATURES_OK;
    w(&mut t, VIRTIO_MMIO_STATUS, features_ok);
    w(&mut t, VIRTIO_MMIO_QUEUE_SEL, 0);
    w(&mut t, VIRTIO_MMIO_QUEUE_NUM, FUZZ_QUEUE_SIZE);
    w(
        &mut t,
        VIRTIO_MMIO_QUEUE_DESC_LOW,
        const { int_cast::u32_of_u64(DESC) },
    );
    w(
        &mut t,
        VIRTIO_MMIO_QUEUE_AVAIL_LOW,
        const { int_cast::u32_of_u64(AVAIL) },
    );
    w(
        &mut t,
        VIRTIO_MMIO_QUEUE_USED_LOW,
        const { int_cast::u32_of_u64(USED) },
    );
    w(&mut t, VIRTIO_MMIO_QUEUE_READY, 1);
    w(
        &mut t,
        VIRTIO_MMIO_STATUS,
        features_ok | VIRTIO_CONFIG_S_DRIVER_OK,
    );
    for _ in 0..3 {
        w(&mut t, VIRTIO_MMIO_QUEUE_NOTIFY, 0);
    }
}

/// Register traffic from `data`: each 14-byte record is
/// `op (1) | offset (4) | len (0..=8, 1) | value (8)`; writes and reads of
/// any offset and width, including the config space.
pub fn mmio_registers(data: &[u8]) {
    let Ok(mem) = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), FUZZ_MEM)]) else {
        return;
    };
    let dev = Block::new(Box::new(MemDisk::new(4096)), BlockOptions::default());
    let mut t = MmioTransport::new(Box::new(dev), mem, Arc::new(NoInterrupt));
    for rec in data.chunks_exact(14) {
        let offset = u64::from(u32::from_le_bytes([rec[1], rec[2], rec[3], rec[4]])) % 0x1100;
        let len = usize::from(rec[5] % 9);
        let mut value = [0u8; 8];
        value.copy_from_slice(&rec[6..14]);
        if rec[0] & 1 == 0 {
            t.write(offset, &value[..len]);
        } else {
            let mut buf = [0u8; 8];
            t.read(offset, &mut buf[..len]);
        }
    }
}
