//! The disk as every parser here sees it: read-only, addressed in bytes, and bounded by a
//! read budget.
//!
//! The budget is what bounds every loop that walks on-disk structures (a FAT cluster chain
//! that loops back, a directory that never ends, an EBR chain): each step reads the disk, so
//! a walk that does not end runs out of budget and fails with [`Error::ReadBudget`] instead
//! of spinning. Every read costs at least a sector ([`MIN_READ_COST`]), so a walk in small
//! reads ends as soon as one in large reads. The search for the entry runs on the
//! metadata budget alone; reading the chosen kernel and initrd adds their limits
//! ([`Disk::allow`]).
//!
//! Parsers get a [`Window`] (a partition, or the whole disk) and read through it; a read
//! that leaves the window is an error, so no parser can read outside its partition.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;

use int_cast::usize_to_u64;

use crate::Error;

/// A disk the loader can read: a flat array of bytes.
pub trait DiskRead {
    /// The disk's size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` with the bytes at `offset` (the whole range lies inside the disk).
    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

/// A disk of the VMM's block engine (raw, qcow2 with its backing chain, compressed
/// clusters), opened read-only by the caller.
impl DiskRead for Box<dyn block::DiskBackend> {
    fn size(&self) -> u64 {
        block::DiskBackend::size(self.as_ref())
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.read_at(buf, offset).map_err(|e| match e {
            block::DiskError::Io(e) => e,
            other => io::Error::other(other.to_string()),
        })
    }
}

/// An image file read as a raw disk (tests, tools).
impl DiskRead for std::fs::File {
    fn size(&self) -> u64 {
        self.metadata().map_or(0, |m| m.len())
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        std::os::unix::fs::FileExt::read_exact_at(self, buf, offset)
    }
}

/// A disk held in memory (tests, the fuzz target).
impl DiskRead for Vec<u8> {
    fn size(&self) -> u64 {
        usize_to_u64(self.len())
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| io::ErrorKind::UnexpectedEof)?;
        let bytes = start
            .checked_add(buf.len())
            .and_then(|end| self.get(start..end))
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(bytes);
        Ok(())
    }
}

/// What a read costs at least, whatever its length: a filesystem crate walking a loop in
/// 32-byte directory entries spends the budget as fast as one reading blocks.
pub(crate) const MIN_READ_COST: u64 = 512;

/// Marks the `io::Error` a read gets once the budget is spent, so the error can be told
/// apart from a real I/O error after it passed through a filesystem crate.
#[derive(Debug)]
struct BudgetSpent;

impl std::fmt::Display for BudgetSpent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("read budget spent")
    }
}

impl std::error::Error for BudgetSpent {}

/// Whether `error` (perhaps wrapped by a filesystem crate's own error) is the budget's.
pub(crate) fn is_budget_error(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(e) = current {
        if e.is::<BudgetSpent>() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<io::Error>()
            && io.get_ref().is_some_and(|inner| inner.is::<BudgetSpent>())
        {
            return true;
        }
        current = e.source();
    }
    false
}

struct Inner {
    disk: Box<dyn DiskRead>,
    size: u64,
    /// Bytes that may still be read.
    budget: u64,
    spent: bool,
}

/// The shared, budgeted disk. Cheap to clone (one disk, one budget).
#[derive(Clone)]
pub(crate) struct Disk(Rc<RefCell<Inner>>);

impl Disk {
    pub(crate) fn new(disk: Box<dyn DiskRead>, budget: u64) -> Disk {
        let size = disk.size();
        Disk(Rc::new(RefCell::new(Inner {
            disk,
            size,
            budget,
            spent: false,
        })))
    }

    pub(crate) fn size(&self) -> u64 {
        self.0.borrow().size
    }

    /// Whether a read was refused for the budget (the error may have been swallowed by a
    /// parser that then reported something else).
    pub(crate) fn budget_spent(&self) -> bool {
        self.0.borrow().spent
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut inner = self.0.borrow_mut();
        let len = usize_to_u64(buf.len());
        if offset.checked_add(len).is_none_or(|end| end > inner.size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {len} bytes at {offset} is past the end of the disk ({} bytes)",
                    inner.size
                ),
            ));
        }
        let cost = len.max(MIN_READ_COST);
        if cost > inner.budget {
            inner.spent = true;
            return Err(io::Error::other(BudgetSpent));
        }
        inner.budget -= cost;
        inner.disk.read_exact_at(buf, offset)
    }

    /// Adds `bytes` to the budget (for the kernel and initrd, once they are chosen).
    pub(crate) fn allow(&self, bytes: u64) {
        let mut inner = self.0.borrow_mut();
        inner.budget = inner.budget.saturating_add(bytes);
    }

    /// The whole disk as a window.
    pub(crate) fn whole(&self) -> Window {
        Window {
            disk: self.clone(),
            start: 0,
            len: self.size(),
        }
    }

    /// `len` bytes from `start`, which must lie inside the disk.
    pub(crate) fn window(&self, start: u64, len: u64) -> Result<Window, Error> {
        let size = self.size();
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Corrupt(format!(
                "a partition of {len} bytes at byte {start} does not fit the disk ({size} bytes)"
            )));
        }
        Ok(Window {
            disk: self.clone(),
            start,
            len,
        })
    }
}

/// A range of the disk (a partition); every read is checked against it.
#[derive(Clone)]
pub(crate) struct Window {
    disk: Disk,
    start: u64,
    len: u64,
}

impl Window {
    pub(crate) fn len(&self) -> u64 {
        self.len
    }

    /// Fills `buf` from `offset` inside the window.
    pub(crate) fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let len = usize_to_u64(buf.len());
        if offset.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {len} bytes at {offset} leaves the partition ({} bytes)",
                    self.len
                ),
            ));
        }
        self.disk.read_at(buf, self.start + offset)
    }

    /// `N` bytes at `offset`, or `None` past the end of the window.
    pub(crate) fn bytes<const N: usize>(&self, offset: u64) -> io::Result<Option<[u8; N]>> {
        if offset
            .checked_add(usize_to_u64(N))
            .is_none_or(|end| end > self.len)
        {
            return Ok(None);
        }
        let mut buf = [0u8; N];
        self.read_at(&mut buf, offset)?;
        Ok(Some(buf))
    }

    /// A stream over the window, for parsers that want `Read + Seek`.
    pub(crate) fn cursor(&self) -> Cursor {
        Cursor {
            window: self.clone(),
            position: 0,
        }
    }
}

impl ext4_view::Ext4Read for Window {
    fn read(
        &mut self,
        start_byte: u64,
        dst: &mut [u8],
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync + 'static>> {
        self.read_at(dst, start_byte).map_err(Into::into)
    }
}

/// `Read + Seek` over a window; writes are refused (the loader never changes a disk).
pub(crate) struct Cursor {
    window: Window,
    position: u64,
}

impl io::Read for Cursor {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.window.len.saturating_sub(self.position);
        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let Some(chunk) = buf.get_mut(..n) else {
            return Ok(0);
        };
        self.window.read_at(chunk, self.position)?;
        self.position += usize_to_u64(n);
        Ok(n)
    }
}

impl io::Seek for Cursor {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let target = match to {
            io::SeekFrom::Start(at) => Some(at),
            io::SeekFrom::End(delta) => self.window.len.checked_add_signed(delta),
            io::SeekFrom::Current(delta) => self.position.checked_add_signed(delta),
        };
        let target = target
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        self.position = target;
        Ok(target)
    }
}

impl io::Write for Cursor {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            "the boot loader reads disks only",
        ))
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn disk(bytes: usize, budget: u64) -> Disk {
        Disk::new(
            Box::new(
                (0..bytes)
                    .map(|i| u8::try_from(i % 251).expect("below 251"))
                    .collect::<Vec<u8>>(),
            ),
            budget,
        )
    }

    #[test]
    fn windows_refuse_reads_outside_their_range() {
        let d = disk(4096, 1 << 20);
        let w = d.window(1024, 512).unwrap();
        let mut buf = [0u8; 4];
        w.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf[0], (1024 % 251) as u8);
        assert!(w.read_at(&mut buf, 510).is_err());
        assert!(w.read_at(&mut buf, u64::MAX - 1).is_err());
        assert!(d.window(4000, 200).is_err());
        assert!(d.window(u64::MAX, 2).is_err());
        assert_eq!(w.bytes::<4>(509).unwrap(), None);
    }

    #[test]
    fn the_budget_ends_reads_and_is_recognised_through_wrapping() {
        let d = disk(4096, 1000);
        let w = d.whole();
        let mut buf = [0u8; 600];
        w.read_at(&mut buf, 0).unwrap();
        // 400 bytes left: a 4-byte read still costs a sector.
        let err = w.read_at(&mut buf[..4], 0).unwrap_err();
        assert!(d.budget_spent());
        assert!(is_budget_error(&err));
        let wrapped: Box<dyn std::error::Error + Send + Sync> = Box::new(err);
        assert!(is_budget_error(wrapped.as_ref()));
        let other = io::Error::other("disk gone");
        assert!(!is_budget_error(&other));
        d.allow(600);
        w.read_at(&mut buf, 0).unwrap();
    }

    #[test]
    fn the_cursor_reads_to_the_end_and_refuses_writes() {
        use std::io::{Read, Seek, Write};
        let d = disk(4096, 1 << 20);
        let mut c = d.window(4000, 96).unwrap().cursor();
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        assert_eq!(all.len(), 96);
        assert_eq!(c.seek(io::SeekFrom::End(-6)).unwrap(), 90);
        assert!(c.seek(io::SeekFrom::Current(-100)).is_err());
        assert!(c.write(b"x").is_err());
    }
}
