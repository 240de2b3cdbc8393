//! Disk backends: what a virtio-blk device reads and writes.
//!
//! The device sees a flat array of bytes (`DiskBackend`); the formats behind it
//! (a raw file, a qcow2 image with its backing chain) live in their own modules.

use std::io;

pub mod concurrent;
pub mod dirty;
#[cfg(feature = "testing")]
pub mod fuzz_support;
mod host_file;
mod io_buffers;
mod lock;
mod open;
mod opened;
#[cfg(feature = "testing")]
pub mod power_loss;
pub mod qcow2;
pub mod raw;
mod shared;

pub use concurrent::ConcurrentDisk;
pub use dirty::{DefinedRange, DirtyTracked};
pub use host_file::DirectBuf;
pub use io_buffers::{HUGE_PAGE, IoBuffer, Pages, io_buffers};
pub use open::{Format, OpenOptions, open_disk, open_disk_with};
pub use opened::OpenedFile;
pub use qcow2::{BackingPolicy, Qcow2Image};
pub use shared::{SerializedDisk, SharedDisk};

/// Why a disk request failed. Each variant maps to one virtio-blk status.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    /// The request touches bytes past the end of the disk.
    #[error("request [{offset}, +{len}) is outside the disk ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A write, discard or write-zeroes request on a read-only disk.
    #[error("the disk is read-only")]
    ReadOnly,
    /// The operation is not supported by this format.
    #[error("operation not supported: {0}")]
    Unsupported(&'static str),
    /// The image is damaged (for example, a table points outside the file).
    #[error("corrupt image: {0}")]
    Corrupt(String),
    /// The image uses a feature this engine does not implement (encryption,
    /// an external data file, an unknown incompatible feature bit...).
    #[error("unsupported image: {0}")]
    UnsupportedImage(String),
    /// The host file could not be read or written.
    #[error("I/O error: {0}")]
    Io(#[from] io::Error),
    /// Another opener of the image (a VM, a process, QEMU) holds it in a way
    /// this open cannot share: a second writer, or a reader of an image
    /// being written (QEMU's image locks, `lock.rs`).
    #[error("image {} is in use: {reason}", path.display())]
    Locked {
        path: std::path::PathBuf,
        reason: String,
    },
}

pub type DiskResult<T> = Result<T, DiskError>;

/// A virtual disk of a fixed size, addressed in bytes.
///
/// Methods take `&mut self`: formats such as qcow2 keep table caches and an
/// allocator that every request may change. Devices own one backend each.
pub trait DiskBackend: Send {
    /// Size the guest sees, in bytes.
    fn size(&self) -> u64;

    /// Whether writes are refused.
    fn read_only(&self) -> bool;

    /// Fills `buf` with the bytes at `offset`. Unallocated areas read as zeroes.
    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> DiskResult<()>;

    /// Writes `buf` at `offset`. Not durable until `flush` returns.
    fn write_at(&mut self, buf: &[u8], offset: u64) -> DiskResult<()>;

    /// Makes every completed write durable on the host.
    fn flush(&mut self) -> DiskResult<()>;

    /// Tells the backend the guest no longer needs these bytes. After a
    /// discard the range reads as zeroes or as its old contents; callers must
    /// not rely on either.
    fn discard(&mut self, offset: u64, len: u64) -> DiskResult<()>;

    /// Makes the range read as zeroes. `may_unmap` allows freeing the space.
    fn write_zeroes(&mut self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()>;

    /// Checks that `[offset, offset + len)` lies inside the disk.
    fn check_range(&self, offset: u64, len: u64) -> DiskResult<()> {
        check_range(offset, len, self.size())
    }
}

/// `[offset, offset + len)` inside a disk of `size` bytes, without
/// wrapping; the one range rule of every disk type.
pub(crate) fn check_range(offset: u64, len: u64, size: u64) -> DiskResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DiskError::OutOfRange { offset, len, size }),
    }
}
