//! Raw disk images: the file's bytes are the disk's bytes.

use int_cast::u64_to_usize;
use int_cast::usize_to_u64;
use std::path::Path;

use crate::host_file::HostFile;
use crate::{DiskBackend, DiskError, DiskResult};

pub(crate) struct RawFile {
    file: HostFile,
    size: u64,
    read_only: bool,
}

impl RawFile {
    /// Opens a raw image (or block device). `direct` bypasses the host page cache.
    pub fn open(path: &Path, read_only: bool, direct: bool) -> DiskResult<RawFile> {
        let file = HostFile::open(path, !read_only, direct)?;
        let size = file_size(path)?;
        Ok(RawFile {
            file,
            size,
            read_only,
        })
    }
}

/// Size of a regular file or block device.
fn file_size(path: &Path) -> DiskResult<u64> {
    use std::io::{Seek, SeekFrom};
    // Seeking to the end works for both files and block devices, where
    // metadata().len() is 0.
    let mut f = std::fs::File::open(path)?;
    Ok(f.seek(SeekFrom::End(0))?)
}

impl RawFile {
    /// A handle for data I/O from several threads (see `crate::concurrent`).
    pub(crate) fn data_handle(&self) -> DiskResult<crate::host_file::DataHandle> {
        Ok(self.file.data_handle()?)
    }
}

impl DiskBackend for RawFile {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        self.check_range(offset, usize_to_u64(buf.len()))?;
        Ok(self.file.read_data(buf, offset)?)
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, usize_to_u64(buf.len()))?;
        Ok(self.file.write_data(buf, offset)?)
    }

    fn flush(&mut self) -> DiskResult<()> {
        if self.read_only {
            return Ok(());
        }
        Ok(self.file.sync()?)
    }

    fn discard(&mut self, offset: u64, len: u64) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        Ok(self.file.punch_hole(offset, len)?)
    }

    fn write_zeroes(&mut self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fast = if may_unmap {
            self.file.punch_hole(offset, len)
        } else {
            self.file.zero_range(offset, len)
        };
        if fast.is_ok() {
            return Ok(());
        }
        // The host cannot do it in place (e.g. a block device): write zeroes.
        let chunk = vec![0u8; len.min(1 << 20) as usize];
        let mut pos = offset;
        let end = offset + len;
        while pos < end {
            let n = u64_to_usize((end - pos).min(usize_to_u64(chunk.len())));
            self.file.write_data(&chunk[..n], pos)?;
            pos += usize_to_u64(n);
        }
        Ok(())
    }
}
