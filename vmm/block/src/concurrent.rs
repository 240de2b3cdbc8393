//! A disk that serves several requests at once, for callers with a queue
//! depth above one (`img bench -d`, later virtio-blk with several queues).
//!
//! Every request is split into extents. Looking an extent up runs under the
//! engine's lock; moving its data (pread/pwrite at the host offset, or a read
//! of the backing chain) runs without it, so requests overlap on the host.
//! Whatever changes metadata stays serialized under the lock, in the engine's
//! own code and ordering: allocating and copy-on-write writes, compressed
//! reads, discard, write-zeroes, flush. Hence:
//! - a cluster is never handed out twice and two writers to the same new
//!   cluster never both allocate it (the second one finds it allocated);
//! - a read racing with an allocating write sees the old or the new data
//!   (the mapping only changes after the new data is written);
//! - lock-free writes go only to clusters this image already owns alone, so
//!   they change no metadata and the crash-safety ordering is the engine's.
//!
//! A host cluster found by a lookup must not be freed and reused while its
//! data I/O is in flight. The engine frees clusters only in `flush` (they
//! wait in `pending_frees` until then), so lock-free I/O holds the `gate`
//! shared and `flush` takes it exclusively: it waits for in-flight I/O, which
//! also makes every completed write part of the flush.

use std::path::Path;
use std::sync::{Mutex, MutexGuard, RwLock};

use crate::host_file::DataHandle;
use crate::qcow2::extent::Extent;
use crate::qcow2::{Qcow2Image, Qcow2Options};
use crate::raw::RawFile;
use crate::{DiskBackend, DiskError, DiskResult, Format, OpenOptions};

enum Engine {
    Raw(RawFile),
    Qcow2(Box<Qcow2Image>),
}

impl Engine {
    fn backend(&mut self) -> &mut dyn DiskBackend {
        match self {
            Engine::Raw(r) => r,
            Engine::Qcow2(q) => &mut **q,
        }
    }
}

pub struct ConcurrentDisk {
    engine: Mutex<Engine>,
    /// Shared by lock-free data I/O, exclusive for flush (see the module doc).
    gate: RwLock<()>,
    data: DataHandle,
    /// Separate read-only handles on the backing chain for lock-free reads
    /// of unallocated clusters (the engine keeps its own for copy-on-write).
    backing: Option<Box<ConcurrentDisk>>,
    size: u64,
    read_only: bool,
    is_raw: bool,
}

impl ConcurrentDisk {
    /// Opens a disk image of the given format for concurrent use.
    pub fn open(path: &Path, format: Format, opts: OpenOptions) -> DiskResult<ConcurrentDisk> {
        let engine = match format {
            Format::Raw => Engine::Raw(RawFile::open(path, opts.read_only, opts.direct)?),
            Format::Qcow2 => Engine::Qcow2(Box::new(Qcow2Image::open(
                path,
                Qcow2Options {
                    read_only: opts.read_only,
                    direct: opts.direct,
                    ..Qcow2Options::default()
                },
            )?)),
        };
        let (data, backing) = match &engine {
            Engine::Raw(r) => (r.data_handle()?, None),
            Engine::Qcow2(q) => {
                // The engine opened (and checked: format recorded, depth,
                // loops) this chain already; these are the same files again.
                let backing = match q.backing_location()? {
                    Some((p, f)) => {
                        let p = p.canonicalize()?;
                        let o = OpenOptions {
                            read_only: true,
                            direct: opts.direct,
                        };
                        Some(Box::new(ConcurrentDisk::open(&p, f, o)?))
                    }
                    None => None,
                };
                (q.data_handle()?, backing)
            }
        };
        let mut engine = engine;
        let size = engine.backend().size();
        let is_raw = matches!(engine, Engine::Raw(_));
        Ok(ConcurrentDisk {
            engine: Mutex::new(engine),
            gate: RwLock::new(()),
            data,
            backing,
            size,
            read_only: opts.read_only,
            is_raw,
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    fn check_range(&self, offset: u64, len: u64) -> DiskResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(DiskError::OutOfRange {
                offset,
                len,
                size: self.size,
            }),
        }
    }

    fn lock_engine(&self) -> MutexGuard<'_, Engine> {
        // A panic while holding the lock leaves the engine's memory state
        // unknown; refusing all further I/O would be the alternative, but the
        // engine keeps its invariants per call, so carry on like a device.
        self.engine.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Fills `buf` with the bytes at `offset`; safe to call from many threads.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        self.check_range(offset, buf.len() as u64)?;
        if self.is_raw {
            // A raw file has no metadata: nothing to look up or to lock.
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            return Ok(self.data.read_data(buf, offset)?);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let rest = &mut buf[done..];
            let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let mut engine = self.lock_engine();
            let (extent, n) = match &mut *engine {
                Engine::Raw(_) => (Extent::Host(pos), rest.len() as u64),
                Engine::Qcow2(q) => q.map_extent(pos, rest.len() as u64, false)?,
            };
            let piece = &mut rest[..n as usize];
            match extent {
                Extent::Engine => engine.backend().read_at(piece, pos)?,
                Extent::Host(host) => {
                    drop(engine);
                    self.data.read_data(piece, host)?;
                }
                Extent::Zero => piece.fill(0),
                Extent::Backing => {
                    drop(engine);
                    drop(gate);
                    self.read_backing(piece, pos)?;
                }
            }
            done += n as usize;
        }
        Ok(())
    }

    fn read_backing(&self, buf: &mut [u8], pos: u64) -> DiskResult<()> {
        let Some(b) = &self.backing else {
            buf.fill(0);
            return Ok(());
        };
        let avail = b.size().saturating_sub(pos).min(buf.len() as u64) as usize;
        if avail > 0 {
            b.read_at(&mut buf[..avail], pos)?;
        }
        buf[avail..].fill(0);
        Ok(())
    }

    /// Writes `buf` at `offset`; safe to call from many threads. Not durable
    /// until `flush` returns.
    pub fn write_at(&self, buf: &[u8], offset: u64) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, buf.len() as u64)?;
        if self.is_raw {
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            return Ok(self.data.write_data(buf, offset)?);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let rest = &buf[done..];
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let mut engine = self.lock_engine();
            let (extent, n) = match &mut *engine {
                Engine::Raw(_) => (Extent::Host(pos), rest.len() as u64),
                Engine::Qcow2(q) => q.map_extent(pos, rest.len() as u64, true)?,
            };
            let piece = &rest[..n as usize];
            match extent {
                Extent::Host(host) => {
                    drop(engine);
                    self.data.write_data(piece, host)?;
                }
                // Allocating or copy-on-write: the engine's ordered path.
                _ => engine.backend().write_at(piece, pos)?,
            }
            done += n as usize;
        }
        Ok(())
    }

    /// Makes every completed write durable (waits for writes in flight).
    pub fn flush(&self) -> DiskResult<()> {
        let _gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
        self.lock_engine().backend().flush()
    }

    pub fn discard(&self, offset: u64, len: u64) -> DiskResult<()> {
        self.lock_engine().backend().discard(offset, len)
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        self.lock_engine()
            .backend()
            .write_zeroes(offset, len, may_unmap)
    }

    /// Flushes all metadata and closes the image, reporting errors.
    pub fn close(self) -> DiskResult<()> {
        match self.engine.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Engine::Raw(mut r) => {
                if r.read_only() {
                    Ok(())
                } else {
                    r.flush()
                }
            }
            Engine::Qcow2(q) => (*q).close(),
        }
    }
}
