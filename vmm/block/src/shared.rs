//! [`SharedDisk`]: a disk that several threads use at once through `&self`,
//! which is what a device with more than one request in flight needs.
//! [`ConcurrentDisk`] overlaps the requests' data I/O; [`SerializedDisk`]
//! puts any [`DiskBackend`] behind a lock (one request at a time).

use std::sync::{Mutex, MutexGuard};

use crate::dirty::DefinedRange;
use crate::{ConcurrentDisk, DiskBackend, DiskResult};

/// A virtual disk of a fixed size, addressed in bytes, safe to call from
/// many threads. The methods mean what they mean on [`DiskBackend`].
pub trait SharedDisk: Send + Sync {
    fn size(&self) -> u64;
    fn read_only(&self) -> bool;
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DiskResult<()>;
    fn write_at(&self, buf: &[u8], offset: u64) -> DiskResult<()>;
    /// Makes every completed write durable on the host.
    fn flush(&self) -> DiskResult<()>;
    fn discard(&self, offset: u64, len: u64) -> DiskResult<()>;
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()>;

    /// Checks that `[offset, offset + len)` lies inside the disk.
    fn check_range(&self, offset: u64, len: u64) -> DiskResult<()> {
        crate::check_range(offset, len, self.size())
    }

    /// The ranges this image defines itself, in ascending order, for copying the disk
    /// to another image over the same backing chain (`crate::dirty`). By default the
    /// whole disk: right for any image, if more than needed for one with a backing file.
    fn defined_ranges(&self) -> DiskResult<Vec<DefinedRange>> {
        Ok(vec![DefinedRange {
            offset: 0,
            len: self.size(),
            zero: false,
        }])
    }
}

impl SharedDisk for ConcurrentDisk {
    fn size(&self) -> u64 {
        ConcurrentDisk::size(self)
    }
    fn read_only(&self) -> bool {
        ConcurrentDisk::read_only(self)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        ConcurrentDisk::read_at(self, buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DiskResult<()> {
        ConcurrentDisk::write_at(self, buf, offset)
    }
    fn flush(&self) -> DiskResult<()> {
        ConcurrentDisk::flush(self)
    }
    fn discard(&self, offset: u64, len: u64) -> DiskResult<()> {
        ConcurrentDisk::discard(self, offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        ConcurrentDisk::write_zeroes(self, offset, len, may_unmap)
    }
    fn defined_ranges(&self) -> DiskResult<Vec<DefinedRange>> {
        ConcurrentDisk::defined_ranges(self)
    }
}

/// Any [`DiskBackend`] behind a mutex: requests take turns.
pub struct SerializedDisk {
    inner: Mutex<Box<dyn DiskBackend>>,
    size: u64,
    read_only: bool,
}

impl SerializedDisk {
    pub fn new(backend: Box<dyn DiskBackend>) -> SerializedDisk {
        SerializedDisk {
            size: backend.size(),
            read_only: backend.read_only(),
            inner: Mutex::new(backend),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Box<dyn DiskBackend>> {
        // A backend keeps its invariants per call; a panic in another
        // thread does not make it unusable.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SharedDisk for SerializedDisk {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        self.lock().read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DiskResult<()> {
        self.lock().write_at(buf, offset)
    }
    fn flush(&self) -> DiskResult<()> {
        self.lock().flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DiskResult<()> {
        self.lock().discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        self.lock().write_zeroes(offset, len, may_unmap)
    }
}
