//! What a live migration needs from a disk it copies (a block migration, as KubeVirt
//! asks for local disks: container-disk overlays, cloud-init images, empty disks): the
//! bytes this image itself defines ([`SharedDisk::defined_ranges`]), sent once, and the
//! ranges the guest wrote while that copy ran, sent again in rounds
//! ([`DirtyTracked`]), the last ones while the VM is paused.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{DiskResult, SharedDisk};

/// What the top image defines over a range of the disk (the rest reads through to the
/// backing chain, which the other side has too).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DefinedRange {
    pub offset: u64,
    pub len: u64,
    /// The range reads as zeros (a qcow2 zero cluster, which hides the backing chain).
    pub zero: bool,
}

/// Granularity of the dirty log: a write anywhere in a chunk sends the whole chunk
/// again (QEMU's block dirty bitmaps default to 64 KiB as well).
pub const DIRTY_CHUNK: u64 = 64 * 1024;

/// A disk that remembers, while asked to, which chunks were written (written, zeroed,
/// discarded) through it. A chunk is marked after the write returns, so a copy that
/// takes the marks and then reads the chunk never misses a write: a write that ends
/// after the take is marked for the next round.
pub struct DirtyTracked {
    inner: Arc<dyn SharedDisk>,
    /// One bit per [`DIRTY_CHUNK`] while tracking; `None` otherwise.
    dirty: Mutex<Option<Vec<u64>>>,
    /// Whether `dirty` is `Some`, read without the lock: a write that is not tracked (all
    /// of them but during a migration) costs one atomic load.
    tracking: AtomicBool,
}

impl DirtyTracked {
    pub fn new(inner: Arc<dyn SharedDisk>) -> DirtyTracked {
        DirtyTracked {
            inner,
            dirty: Mutex::new(None),
            tracking: AtomicBool::new(false),
        }
    }

    fn log(&self) -> MutexGuard<'_, Option<Vec<u64>>> {
        // A bitmap is valid after any partial update (bits only get set).
        self.dirty.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunks(&self) -> u64 {
        self.inner.size().div_ceil(DIRTY_CHUNK)
    }

    /// Starts remembering writes (with nothing marked).
    pub fn start_tracking(&self) {
        let words = int_cast::u64_to_usize(self.chunks().div_ceil(64));
        let mut log = self.log();
        *log = Some(vec![0; words]);
        // Set under the lock, after the bitmap: a write that sees it marks the bitmap. A
        // write that completed before this is in what the caller reads next.
        self.tracking.store(true, Ordering::SeqCst);
    }

    /// Stops remembering writes.
    pub fn stop_tracking(&self) {
        let mut log = self.log();
        self.tracking.store(false, Ordering::SeqCst);
        *log = None;
    }

    /// The chunks written since the last call (or the start), as byte ranges in
    /// ascending order, adjacent chunks merged up to `max_len` bytes per range; the
    /// marks are cleared. Empty when not tracking.
    pub fn take_dirty(&self, max_len: u64) -> Vec<(u64, u64)> {
        let bits = match self.log().as_mut() {
            Some(bits) => std::mem::replace(bits, vec![0; bits.len()]),
            None => return Vec::new(),
        };
        let size = self.inner.size();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for (word_index, &word) in (0u64..).zip(&bits) {
            let mut word = word;
            while word != 0 {
                let bit = u64::from(word.trailing_zeros());
                word &= word - 1;
                let offset = (word_index * 64 + bit) * DIRTY_CHUNK;
                let len = DIRTY_CHUNK.min(size.saturating_sub(offset));
                match ranges.last_mut() {
                    Some((start, run)) if *start + *run == offset && *run + len <= max_len => {
                        *run += len;
                    }
                    _ => ranges.push((offset, len)),
                }
            }
        }
        ranges
    }

    /// Marks the chunks `[offset, offset + len)` touches (if tracking).
    fn mark(&self, offset: u64, len: u64) {
        if !self.tracking.load(Ordering::SeqCst) {
            return;
        }
        let mut log = self.log();
        let Some(bits) = log.as_mut() else {
            return;
        };
        if len == 0 {
            return;
        }
        let first = offset / DIRTY_CHUNK;
        let last =
            (offset.saturating_add(len - 1) / DIRTY_CHUNK).min(self.chunks().saturating_sub(1));
        for chunk in first..=last {
            if let Some(word) = bits.get_mut(int_cast::u64_to_usize(chunk / 64)) {
                *word |= 1 << (chunk % 64);
            }
        }
    }
}

impl SharedDisk for DirtyTracked {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_only(&self) -> bool {
        self.inner.read_only()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        self.inner.read_at(buf, offset)
    }
    // A failed write may have written part of its range: marked all the same.
    fn write_at(&self, buf: &[u8], offset: u64) -> DiskResult<()> {
        let result = self.inner.write_at(buf, offset);
        self.mark(offset, int_cast::usize_to_u64(buf.len()));
        result
    }
    fn flush(&self) -> DiskResult<()> {
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> DiskResult<()> {
        let result = self.inner.discard(offset, len);
        self.mark(offset, len);
        result
    }
    fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        let result = self.inner.write_zeroes(offset, len, may_unmap);
        self.mark(offset, len);
        result
    }
    fn defined_ranges(&self) -> DiskResult<Vec<DefinedRange>> {
        self.inner.defined_ranges()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ConcurrentDisk, Format, OpenOptions};

    fn raw_disk(size: u64) -> (tempfile::NamedTempFile, Arc<DirtyTracked>) {
        let file = tempfile::NamedTempFile::new().unwrap();
        file.as_file().set_len(size).unwrap();
        let disk = ConcurrentDisk::open(file.path(), Format::Raw, OpenOptions::default()).unwrap();
        (file, Arc::new(DirtyTracked::new(Arc::new(disk))))
    }

    #[test]
    fn marks_written_chunks_only_while_tracking() {
        let (_file, disk) = raw_disk(10 * DIRTY_CHUNK + 512);
        disk.write_at(&[1; 512], 0).unwrap();
        assert_eq!(disk.take_dirty(u64::MAX), vec![], "not tracking yet");
        disk.start_tracking();
        // Across a chunk boundary: two chunks.
        disk.write_at(&[1; 1024], DIRTY_CHUNK - 512).unwrap();
        disk.write_zeroes(4 * DIRTY_CHUNK, 512, false).unwrap();
        disk.discard(5 * DIRTY_CHUNK, 512).unwrap();
        // The last, short chunk.
        disk.write_at(&[2; 512], 10 * DIRTY_CHUNK).unwrap();
        assert_eq!(
            disk.take_dirty(u64::MAX),
            vec![
                (0, 2 * DIRTY_CHUNK),
                (4 * DIRTY_CHUNK, 2 * DIRTY_CHUNK),
                (10 * DIRTY_CHUNK, 512)
            ]
        );
        assert_eq!(disk.take_dirty(u64::MAX), vec![], "taken marks are cleared");
        disk.write_at(&[3; 512], 0).unwrap();
        disk.write_at(&[3; 512], DIRTY_CHUNK).unwrap();
        disk.write_at(&[3; 512], 2 * DIRTY_CHUNK).unwrap();
        // Merged runs stay within the length asked for.
        assert_eq!(
            disk.take_dirty(2 * DIRTY_CHUNK),
            vec![(0, 2 * DIRTY_CHUNK), (2 * DIRTY_CHUNK, DIRTY_CHUNK)]
        );
        disk.stop_tracking();
        disk.write_at(&[4; 512], 0).unwrap();
        assert_eq!(disk.take_dirty(u64::MAX), vec![]);
    }

    #[test]
    fn a_failed_write_is_marked_too() {
        let (_file, disk) = raw_disk(2 * DIRTY_CHUNK);
        disk.start_tracking();
        // Past the end: refused, nothing outside the disk is marked.
        assert!(disk.write_at(&[1; 1024], 2 * DIRTY_CHUNK - 512).is_err());
        assert_eq!(disk.take_dirty(u64::MAX), vec![(DIRTY_CHUNK, DIRTY_CHUNK)]);
    }
}
