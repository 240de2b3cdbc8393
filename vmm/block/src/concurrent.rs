//! A disk that serves several requests at once, for callers with a queue
//! depth above one (`img bench -d`, later virtio-blk with several queues).
//!
//! Every request is split into extents. Looking an extent up runs under the
//! engine's lock; moving its data (pread/pwrite at the host offset, or a read
//! of the backing chain) runs without it, so requests overlap on the host.
//!
//! Writes into clusters with no host cluster yet (unallocated, or zero
//! without one) are split in three: under the lock the engine reserves host
//! clusters and the guest clusters are marked `allocating`; outside it the
//! old contents (backing chain or zeroes) are merged with the new bytes and
//! written; under the lock again the L2 entries are pointed at them. Other
//! writers wait while a cluster they touch is being allocated; readers see
//! the old mapping (old data) until the L2 entry changes, which is only
//! after the new data is written. Everything else that changes metadata
//! stays in the engine, serialized, in its own ordering: copy-on-write of
//! compressed, shared or preallocated-zero clusters, and discard and
//! write-zeroes (which first wait until no allocation is in flight).
//! Compressed clusters are read and decompressed outside the lock, each
//! thread keeping its last decompressed cluster (reads of the rest of it
//! need no second decompression). Hence:
//! - a host cluster is never handed out twice (only the engine allocates)
//!   and two writers to the same new cluster never both allocate it;
//! - a read racing with an allocating write sees the old or the new data;
//! - data reaches its host cluster before any metadata points at it, and
//!   refcounts/L2/L1 go out in the engine's crash-safe order on `flush`.
//!
//! A host cluster found by a lookup must not be freed and reused while its
//! data I/O is in flight. The engine frees clusters only in `flush` (they
//! wait in `pending_frees` until then), so lock-free I/O holds the `gate`
//! shared and `flush` takes it exclusively: it waits for in-flight I/O, which
//! also makes every completed write part of the flush.

use int_cast::u64_to_usize;
use int_cast::usize_to_u64;
use std::cell::RefCell;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};

use crate::dirty::DefinedRange;
use crate::host_file::{DataHandle, DirectBuf};
use crate::qcow2::compressed;
use crate::qcow2::extent::{Allocation, Extent};
use crate::qcow2::header::CompressionType;
use crate::qcow2::{Qcow2Image, Qcow2Options};
use crate::raw::RawFile;
use crate::{DiskBackend, DiskError, DiskResult, Format, OpenOptions};

enum Engine {
    Raw(RawFile),
    Qcow2(Box<Qcow2Image>),
}

/// What the lock protects: the engine, and the guest clusters whose new
/// host clusters are being written outside the lock.
struct State {
    engine: Engine,
    /// Guest cluster ranges `[start, end)` allocated and not yet mapped.
    allocating: Vec<(u64, u64)>,
}

impl State {
    fn allocating_at(&self, vc: u64) -> bool {
        self.allocating.iter().any(|&(a, b)| a <= vc && vc < b)
    }

    /// `n` bytes from `pos`, cut before the first cluster being allocated.
    fn clamp_before_allocating(&self, pos: u64, n: u64, cluster_bits: u32) -> u64 {
        let first_vc = pos >> cluster_bits;
        let mut end = pos + n;
        for &(a, _) in &self.allocating {
            if a > first_vc {
                end = end.min(a << cluster_bits);
            }
        }
        end - pos
    }
}

impl Engine {
    fn backend(&mut self) -> &mut dyn DiskBackend {
        match self {
            Engine::Raw(r) => r,
            Engine::Qcow2(q) => &mut **q,
        }
    }
}

/// Distinguishes disks in the per-thread cache of decompressed clusters.
static NEXT_DISK_ID: AtomicU64 = AtomicU64::new(1);

/// A thread's last decompressed cluster, and room for compressed input.
struct DecompressedCluster {
    /// (disk id, compressed offset, sectors); 0 for none.
    key: (u64, u64, u64),
    data: Vec<u8>,
    input: Vec<u8>,
}

thread_local! {
    static DECOMPRESSED: RefCell<DecompressedCluster> = const {
        RefCell::new(DecompressedCluster { key: (0, 0, 0), data: Vec::new(), input: Vec::new() })
    };
}

pub struct ConcurrentDisk {
    /// Unique per open disk (key of the decompressed-cluster cache).
    id: u64,
    state: Mutex<State>,
    /// Signalled when an allocation outside the lock finishes.
    allocated: Condvar,
    /// Shared by lock-free data I/O, exclusive for flush (see the module doc).
    gate: RwLock<()>,
    data: DataHandle,
    /// The backing chain, for lock-free reads of unallocated clusters: the
    /// same layers the engine reads for copy-on-write.
    backing: Option<Arc<ConcurrentDisk>>,
    size: u64,
    read_only: bool,
    is_raw: bool,
    /// log2 of the qcow2 cluster size (0 for raw).
    cluster_bits: u32,
}

impl ConcurrentDisk {
    /// Opens a disk image of the given format for concurrent use; a qcow2
    /// image opens its backing chain as `opts.backing` allows.
    pub fn open(path: &Path, format: Format, opts: OpenOptions) -> DiskResult<ConcurrentDisk> {
        match format {
            Format::Raw => Self::from_raw(RawFile::open(path, opts.read_only, opts.direct)?),
            Format::Qcow2 => Self::from_qcow2(Qcow2Image::open(
                path,
                Qcow2Options {
                    read_only: opts.read_only,
                    direct: opts.direct,
                    backing: opts.backing,
                    ..Qcow2Options::default()
                },
            )?),
        }
    }

    pub(crate) fn from_raw(raw: RawFile) -> DiskResult<ConcurrentDisk> {
        let data = raw.data_handle()?;
        Ok(Self::with_engine(Engine::Raw(raw), data, None, 0))
    }

    /// Serves `image`; its backing chain (opened once, with the image) is
    /// shared with the engine.
    pub(crate) fn from_qcow2(image: Qcow2Image) -> DiskResult<ConcurrentDisk> {
        let data = image.data_handle()?;
        let backing = image.backing_disk().cloned();
        let cluster_bits = image.cluster_size().trailing_zeros();
        Ok(Self::with_engine(
            Engine::Qcow2(Box::new(image)),
            data,
            backing,
            cluster_bits,
        ))
    }

    fn with_engine(
        mut engine: Engine,
        data: DataHandle,
        backing: Option<Arc<ConcurrentDisk>>,
        cluster_bits: u32,
    ) -> ConcurrentDisk {
        let backend = engine.backend();
        let (size, read_only) = (backend.size(), backend.read_only());
        ConcurrentDisk {
            id: NEXT_DISK_ID.fetch_add(1, Ordering::Relaxed),
            is_raw: matches!(engine, Engine::Raw(_)),
            state: Mutex::new(State {
                engine,
                allocating: Vec::new(),
            }),
            allocated: Condvar::new(),
            gate: RwLock::new(()),
            data,
            backing,
            size,
            read_only,
            cluster_bits,
        }
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Checks that `[offset, offset + len)` lies inside the disk.
    fn check_range(&self, offset: u64, len: u64) -> DiskResult<()> {
        crate::check_range(offset, len, self.size)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the engine's memory state
        // unknown; refusing all further I/O would be the alternative, but the
        // engine keeps its invariants per call, so carry on like a device.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The lock, once no allocation outside it is in flight: for operations
    /// that change mappings wholesale (discard, write-zeroes).
    fn lock_quiet(&self) -> MutexGuard<'_, State> {
        let mut st = self.lock();
        while !st.allocating.is_empty() {
            st = self.allocated.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        st
    }

    /// Fills `buf` with the bytes at `offset`; safe to call from many threads.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        self.check_range(offset, usize_to_u64(buf.len()))?;
        if self.is_raw {
            // A raw file has no metadata: nothing to look up or to lock.
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            return Ok(self.data.read_data(buf, offset)?);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + usize_to_u64(done);
            let rest = &mut buf[done..];
            let gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let mut st = self.lock();
            // Clusters being allocated still read as before (old data).
            let (extent, n) = match &mut st.engine {
                Engine::Raw(_) => (Extent::Host(pos), usize_to_u64(rest.len())),
                Engine::Qcow2(q) => q.map_extent(pos, usize_to_u64(rest.len()), false)?,
            };
            let piece = &mut rest[..u64_to_usize(n)];
            match extent {
                Extent::Engine => st.engine.backend().read_at(piece, pos)?,
                Extent::Host(host) => {
                    drop(st);
                    self.data.read_data(piece, host)?;
                }
                Extent::Compressed { offset, sectors } => {
                    let (len, kind) = match &st.engine {
                        Engine::Qcow2(q) => {
                            (q.compressed_len(offset, sectors)?, q.compression_type())
                        }
                        Engine::Raw(_) => unreachable!("raw disks have no compressed clusters"),
                    };
                    drop(st);
                    // The gate stays held: the compressed bytes cannot be
                    // freed (only `flush` frees) while they are read.
                    self.read_compressed(piece, pos, (offset, sectors), len, kind)?;
                }
                Extent::Zero => piece.fill(0),
                Extent::Backing => {
                    drop(st);
                    drop(gate);
                    self.read_backing(piece, pos)?;
                }
            }
            done += u64_to_usize(n);
        }
        Ok(())
    }

    /// Fills `piece` (inside one guest cluster, at guest `pos`) from the
    /// compressed cluster `(offset, sectors)`, `len` bytes of input.
    fn read_compressed(
        &self,
        piece: &mut [u8],
        pos: u64,
        (offset, sectors): (u64, u64),
        len: usize,
        kind: CompressionType,
    ) -> DiskResult<()> {
        let cs = 1usize << self.cluster_bits;
        let in_cluster = u64_to_usize(pos) & (cs - 1);
        DECOMPRESSED.with(|cell| {
            let mut cache = cell.borrow_mut();
            let key = (self.id, offset, sectors);
            if cache.key != key {
                let c = &mut *cache;
                c.key = (0, 0, 0);
                c.input.resize(len, 0);
                c.data.resize(cs, 0);
                self.data.read_data(&mut c.input, offset)?;
                compressed::decompress(kind, &c.input, &mut c.data).map_err(|e| {
                    DiskError::Corrupt(format!("compressed cluster at {offset:#x}: {e}"))
                })?;
                c.key = key;
            }
            piece.copy_from_slice(&cache.data[in_cluster..in_cluster + piece.len()]);
            Ok(())
        })
    }

    fn read_backing(&self, buf: &mut [u8], pos: u64) -> DiskResult<()> {
        let Some(b) = &self.backing else {
            buf.fill(0);
            return Ok(());
        };
        let avail = u64_to_usize(b.size().saturating_sub(pos).min(usize_to_u64(buf.len())));
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
        self.check_range(offset, usize_to_u64(buf.len()))?;
        if self.is_raw {
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            return Ok(self.data.write_data(buf, offset)?);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + usize_to_u64(done);
            let rest = &buf[done..];
            let _gate = self.gate.read().unwrap_or_else(|e| e.into_inner());
            let mut st = self.lock();
            // A writer never touches a cluster another one is allocating.
            while st.allocating_at(pos >> self.cluster_bits) {
                st = self.allocated.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let (extent, n) = match &mut st.engine {
                Engine::Raw(_) => (Extent::Host(pos), usize_to_u64(rest.len())),
                Engine::Qcow2(q) => q.map_extent(pos, usize_to_u64(rest.len()), true)?,
            };
            let n = st.clamp_before_allocating(pos, n, self.cluster_bits);
            let piece = &rest[..u64_to_usize(n)];
            let n = match extent {
                Extent::Host(host) => {
                    drop(st);
                    self.data.write_data(piece, host)?;
                    n
                }
                _ => {
                    let alloc = match &mut st.engine {
                        Engine::Qcow2(q) => q.begin_allocating_write(pos, n)?,
                        Engine::Raw(_) => None,
                    };
                    match alloc {
                        Some(a) => self.allocating_write(st, a, piece, pos)?,
                        // Copy-on-write of compressed, shared or preallocated
                        // zero clusters: the engine's ordered path.
                        None => {
                            st.engine.backend().write_at(piece, pos)?;
                            n
                        }
                    }
                }
            };
            done += u64_to_usize(n);
        }
        Ok(())
    }

    /// Writes the new clusters of `a` outside the lock, then maps them.
    /// Returns how many bytes of `piece` (at guest `pos`) that covered.
    fn allocating_write(
        &self,
        mut st: MutexGuard<'_, State>,
        a: Allocation,
        piece: &[u8],
        pos: u64,
    ) -> DiskResult<u64> {
        let range = (a.vc, a.vc + a.count);
        st.allocating.push(range);
        drop(st);
        let written = self.fill_new_clusters(&a, piece, pos);
        let mut st = self.lock();
        st.allocating.retain(|r| *r != range);
        let finished = match &mut st.engine {
            Engine::Qcow2(q) => q.finish_allocating_write(&a, written.is_ok()),
            Engine::Raw(_) => Ok(()),
        };
        drop(st);
        self.allocated.notify_all();
        written?;
        finished?;
        let run_end = (a.vc + a.count) << self.cluster_bits;
        Ok(run_end.min(pos + usize_to_u64(piece.len())) - pos)
    }

    /// Merges `piece` with the old contents of the clusters of `a` (backing
    /// chain or zeroes) and writes the run to its new host clusters.
    fn fill_new_clusters(&self, a: &Allocation, piece: &[u8], pos: u64) -> DiskResult<()> {
        let cs = 1u64 << self.cluster_bits;
        let mut buf = DirectBuf::new(u64_to_usize(a.count * cs), 0);
        let buf = buf.as_mut_slice();
        let run_start = a.vc << self.cluster_bits;
        let wstart = pos;
        let wend = (pos + usize_to_u64(piece.len())).min(run_start + a.count * cs);
        for (i, from_backing) in a.from_backing.iter().enumerate() {
            let cstart = run_start + usize_to_u64(i) * cs;
            let cend = cstart + cs;
            let slot = &mut buf[i * u64_to_usize(cs)..(i + 1) * u64_to_usize(cs)];
            // Old contents only where the write does not cover the cluster.
            if *from_backing && (wstart > cstart || wend < cend) {
                // The last cluster may reach past the end of the disk.
                let avail = u64_to_usize(self.size.saturating_sub(cstart).min(cs));
                self.read_backing(&mut slot[..avail], cstart)?;
            }
        }
        let at = u64_to_usize(wstart - run_start);
        buf[at..at + u64_to_usize(wend - wstart)]
            .copy_from_slice(&piece[..u64_to_usize(wend - wstart)]);
        Ok(self.data.write_data(buf, a.host)?)
    }

    /// Makes every completed write durable (waits for writes in flight).
    pub fn flush(&self) -> DiskResult<()> {
        let _gate = self.gate.write().unwrap_or_else(|e| e.into_inner());
        self.lock().engine.backend().flush()
    }

    pub fn discard(&self, offset: u64, len: u64) -> DiskResult<()> {
        self.lock_quiet().engine.backend().discard(offset, len)
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        self.lock_quiet()
            .engine
            .backend()
            .write_zeroes(offset, len, may_unmap)
    }

    /// The ranges the top image defines (`SharedDisk::defined_ranges`): for a qcow2
    /// image its allocated and zero clusters, not what reads through to the backing
    /// chain; for a raw file the ranges that hold data (its holes read as zeros: the
    /// copy's target must start out empty, as a new image does). Looked up a run of like clusters at a time,
    /// with the lock taken per run (the guest's requests go on meanwhile).
    pub fn defined_ranges(&self) -> DiskResult<Vec<DefinedRange>> {
        if self.is_raw {
            // A raw file's holes read as zeros, as a new empty image's do.
            return Ok(self
                .data
                .data_extents(self.size)?
                .into_iter()
                .map(|(offset, len)| DefinedRange {
                    offset,
                    len,
                    zero: false,
                })
                .collect());
        }
        let mut ranges: Vec<DefinedRange> = Vec::new();
        let mut pos = 0;
        while pos < self.size {
            let (extent, n) = match &mut self.lock().engine {
                Engine::Qcow2(q) => q.map_extent(pos, self.size - pos, false)?,
                Engine::Raw(_) => (Extent::Host(pos), self.size - pos),
            };
            let zero = match extent {
                Extent::Backing => None,
                Extent::Zero => Some(true),
                Extent::Host(_) | Extent::Compressed { .. } | Extent::Engine => Some(false),
            };
            if let Some(zero) = zero {
                match ranges.last_mut() {
                    Some(last) if last.zero == zero && last.offset + last.len == pos => {
                        last.len += n;
                    }
                    _ => ranges.push(DefinedRange {
                        offset: pos,
                        len: n,
                        zero,
                    }),
                }
            }
            pos += n;
        }
        Ok(ranges)
    }

    /// Flushes all metadata and closes the image, reporting errors.
    pub fn close(self) -> DiskResult<()> {
        match self
            .state
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .engine
        {
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
