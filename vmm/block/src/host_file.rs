//! Positional I/O on the host file behind a disk, with optional O_DIRECT.
//!
//! With `direct`, data requests that are 4 KiB aligned go through an
//! O_DIRECT descriptor (through an aligned bounce buffer, because callers'
//! buffers have no alignment guarantee); everything else, and all metadata,
//! goes through a normal descriptor. Both refer to the same file, and the
//! kernel keeps direct and buffered I/O coherent for a range.
//!
//! The power-loss tests put a simulated file (`crate::power_loss`, built
//! only with the `testing` feature, which product builds never enable) in
//! the place of the host file: the engines cannot tell, and every write and
//! barrier they issue reaches the simulation.

use int_cast::usize_to_u64;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::DiskResult;
#[cfg(feature = "testing")]
use crate::power_loss::PowerLossFile;

/// Alignment that O_DIRECT accepts on every device we expect (4 KiB sectors too).
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// A heap buffer whose usable part starts on a `DIRECT_ALIGN` boundary.
struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new() -> Self {
        AlignedBuf {
            raw: Vec::new(),
            start: 0,
            len: 0,
        }
    }

    fn slice(&mut self, len: usize) -> &mut [u8] {
        if len > self.len {
            self.raw = vec![0u8; len + DIRECT_ALIGN];
            let addr = self.raw.as_ptr() as usize;
            self.start = addr.next_multiple_of(DIRECT_ALIGN) - addr;
            self.len = len;
        }
        &mut self.raw[self.start..self.start + len]
    }
}

/// The file behind a disk: a host file, or (for the power-loss tests) a
/// simulated one that loses unsynced writes. Everything the engines write
/// goes through here, so the simulation sees every write and every barrier.
pub(crate) struct HostFile {
    io: FileIo,
    bounce: AlignedBuf,
}

enum FileIo {
    Os {
        file: File,
        direct: Option<File>,
    },
    #[cfg(feature = "testing")]
    Simulated(PowerLossFile),
}

impl HostFile {
    /// Opens the image at `path` and locks it as QEMU does (`crate::lock`):
    /// refused, with the image named, while another opener holds it in a way
    /// this one cannot share. The locks live on the first descriptor's open
    /// file description and go when the last descriptor of it closes.
    pub fn open(path: &Path, writable: bool, direct: bool) -> DiskResult<HostFile> {
        let file = OpenOptions::new().read(true).write(writable).open(path)?;
        crate::lock::lock(&file, path, crate::lock::Access::of(writable))?;
        let direct = if direct {
            Some(
                OpenOptions::new()
                    .read(true)
                    .write(writable)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)?,
            )
        } else {
            None
        };
        Ok(HostFile {
            io: FileIo::Os { file, direct },
            bounce: AlignedBuf::new(),
        })
    }

    /// A file whose writes live in `sim` (see `crate::power_loss`).
    #[cfg(feature = "testing")]
    pub fn simulated(sim: PowerLossFile) -> HostFile {
        HostFile {
            io: FileIo::Simulated(sim),
            bounce: AlignedBuf::new(),
        }
    }

    /// A second handle on the same file (same open file descriptions, so
    /// the same O_DIRECT setting) for data I/O from several threads at once.
    pub(crate) fn data_handle(&self) -> io::Result<DataHandle> {
        Ok(DataHandle {
            io: match &self.io {
                FileIo::Os { file, direct } => FileIo::Os {
                    file: file.try_clone()?,
                    direct: direct.as_ref().map(File::try_clone).transpose()?,
                },
                #[cfg(feature = "testing")]
                FileIo::Simulated(sim) => FileIo::Simulated(sim.clone()),
            },
        })
    }

    pub fn len(&self) -> io::Result<u64> {
        match &self.io {
            FileIo::Os { file, .. } => Ok(file.metadata()?.len()),
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => Ok(sim.len()),
        }
    }

    /// Reads `buf` at `offset`; bytes past the end of the file read as zeroes.
    pub(crate) fn read_meta(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.io {
            FileIo::Os { file, .. } => read_full(file, buf, offset),
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => sim.read(buf, offset),
        }
    }

    pub(crate) fn write_meta(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        match &self.io {
            FileIo::Os { file, .. } => file.write_all_at(buf, offset),
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => sim.write(buf, offset),
        }
    }

    fn aligned(buf_len: usize, offset: u64) -> bool {
        buf_len.is_multiple_of(DIRECT_ALIGN) && offset.is_multiple_of(usize_to_u64(DIRECT_ALIGN))
    }

    pub fn read_data(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        match &self.io {
            FileIo::Os {
                direct: Some(d), ..
            } if Self::aligned(buf.len(), offset) => {
                let bounce = self.bounce.slice(buf.len());
                read_full(d, bounce, offset)?;
                buf.copy_from_slice(bounce);
                Ok(())
            }
            _ => self.read_meta(buf, offset),
        }
    }

    pub fn write_data(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        match &self.io {
            FileIo::Os {
                direct: Some(d), ..
            } if Self::aligned(buf.len(), offset) => {
                let bounce = self.bounce.slice(buf.len());
                bounce.copy_from_slice(buf);
                d.write_all_at(bounce, offset)
            }
            _ => self.write_meta(buf, offset),
        }
    }

    /// Waits until every completed write is on stable storage.
    pub fn sync(&self) -> io::Result<()> {
        match &self.io {
            FileIo::Os { file, .. } => file.sync_data(),
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => sim.sync(),
        }
    }

    /// Frees the host blocks of a range; it then reads as zeroes.
    pub(crate) fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        match &self.io {
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => sim.punch(offset, len),
            FileIo::Os { .. } => self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            ),
        }
    }

    /// Reserves host blocks for a range, extending the file if needed.
    pub fn allocate(&self, offset: u64, len: u64) -> io::Result<()> {
        match &self.io {
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => sim.extend(offset.saturating_add(len)),
            FileIo::Os { .. } => self.fallocate(0, offset, len),
        }
    }

    /// Makes a range read as zeroes without writing them, where the host supports it.
    pub(crate) fn zero_range(&self, offset: u64, len: u64) -> io::Result<()> {
        match &self.io {
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => sim.punch(offset, len),
            FileIo::Os { .. } => self.fallocate(libc::FALLOC_FL_ZERO_RANGE, offset, len),
        }
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
        let file = match &self.io {
            FileIo::Os { file, .. } => file,
            #[cfg(feature = "testing")]
            FileIo::Simulated(_) => return Err(io::Error::other("fallocate on a simulated file")),
        };
        let off =
            libc::off_t::try_from(offset).map_err(|_| io::Error::other("offset too large"))?;
        let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("length too large"))?;
        // SAFETY: plain syscall on a descriptor we own; no memory is passed.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, off, len) };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }
}

fn aligned_addr(buf: &[u8]) -> bool {
    (buf.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
}

/// A zeroed heap buffer of `len` bytes whose start is `DIRECT_ALIGN`
/// aligned, so O_DIRECT I/O can use it without a bounce copy.
pub struct DirectBuf {
    inner: AlignedBuf,
    len: usize,
}

impl DirectBuf {
    pub fn new(len: usize, fill: u8) -> DirectBuf {
        let mut buf = DirectBuf::zeroed(len);
        buf.as_mut_slice().fill(fill);
        buf
    }

    /// Zeroes without writing them: the pages become resident only when
    /// used.
    pub fn zeroed(len: usize) -> DirectBuf {
        let mut inner = AlignedBuf::new();
        inner.slice(len);
        DirectBuf { inner, len }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.inner.slice(self.len)
    }
}

thread_local! {
    /// Each thread that does data I/O through a `DataHandle` keeps its own
    /// aligned bounce buffer: no lock and no allocation per request.
    static BOUNCE: std::cell::RefCell<AlignedBuf> = const {
        std::cell::RefCell::new(AlignedBuf { raw: Vec::new(), start: 0, len: 0 })
    };
}

/// Data I/O on a host file through `&self`, usable from many threads at
/// once (positional reads and writes need no shared cursor).
pub(crate) struct DataHandle {
    io: FileIo,
}

impl DataHandle {
    /// The ranges below `size` that hold data, as the file system reports them
    /// (`SEEK_DATA`/`SEEK_HOLE`; positional I/O does not use the file offset these
    /// move). All of it when the file system cannot tell.
    pub fn data_extents(&self, size: u64) -> io::Result<Vec<(u64, u64)>> {
        let file = match &self.io {
            FileIo::Os { file, .. } => file,
            #[cfg(feature = "testing")]
            FileIo::Simulated(_) => return Ok(vec![(0, size)]),
        };
        let seek = |pos: u64, whence: libc::c_int| -> io::Result<Option<u64>> {
            let pos =
                libc::off_t::try_from(pos).map_err(|_| io::Error::other("offset too large"))?;
            // SAFETY: lseek on a descriptor this handle owns; it only moves the offset.
            let at = unsafe { libc::lseek(file.as_raw_fd(), pos, whence) };
            if at < 0 {
                let e = io::Error::last_os_error();
                // ENXIO: no data (or hole) at or after `pos`.
                return if e.raw_os_error() == Some(libc::ENXIO) {
                    Ok(None)
                } else {
                    Err(e)
                };
            }
            Ok(Some(at.cast_unsigned()))
        };
        let mut extents = Vec::new();
        let mut pos = 0;
        while pos < size {
            let data = match seek(pos, libc::SEEK_DATA) {
                Ok(Some(data)) if data < size => data,
                Ok(_) => break,
                Err(_) => return Ok(vec![(0, size)]),
            };
            let hole = seek(data, libc::SEEK_HOLE)
                .ok()
                .flatten()
                .unwrap_or(size)
                .min(size);
            extents.push((data, hole - data));
            pos = hole;
        }
        Ok(extents)
    }

    pub fn read_data(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let (file, direct) = match &self.io {
            FileIo::Os { file, direct } => (file, direct),
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => return sim.read(buf, offset),
        };
        match direct {
            // An aligned caller buffer (guest pages, `img bench`) needs no copy.
            Some(d) if HostFile::aligned(buf.len(), offset) && aligned_addr(buf) => {
                read_full(d, buf, offset)
            }
            Some(d) if HostFile::aligned(buf.len(), offset) => BOUNCE.with(|b| {
                let mut b = b.borrow_mut();
                let bounce = b.slice(buf.len());
                read_full(d, bounce, offset)?;
                buf.copy_from_slice(bounce);
                Ok(())
            }),
            _ => read_full(file, buf, offset),
        }
    }

    pub fn write_data(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let (file, direct) = match &self.io {
            FileIo::Os { file, direct } => (file, direct),
            #[cfg(feature = "testing")]
            FileIo::Simulated(sim) => return sim.write(buf, offset),
        };
        match direct {
            Some(d) if HostFile::aligned(buf.len(), offset) && aligned_addr(buf) => {
                d.write_all_at(buf, offset)
            }
            Some(d) if HostFile::aligned(buf.len(), offset) => BOUNCE.with(|b| {
                let mut b = b.borrow_mut();
                let bounce = b.slice(buf.len());
                bounce.copy_from_slice(buf);
                d.write_all_at(bounce, offset)
            }),
            _ => file.write_all_at(buf, offset),
        }
    }
}

fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + usize_to_u64(done)) {
            Ok(0) => {
                buf[done..].fill(0);
                return Ok(());
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
