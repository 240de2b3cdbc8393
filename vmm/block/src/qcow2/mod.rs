//! The qcow2 image format: a sparse, copy-on-write disk with a backing chain.
//!
//! Write ordering (crash safety, also on power loss). Data clusters are
//! written to the file at once; the metadata that points at them
//! (refcounts, L2, L1) changes in memory and goes to the file in an order
//! where a power loss at any point leaves at worst leaked clusters. As in
//! QEMU's qcow2 cache (an L2 table depends on the refcount blocks, and on
//! a flush of the file after new data): a write that depends on earlier
//! ones is issued only after a barrier (fdatasync) has made those durable,
//! because the page cache and the device write back in any order.
//!   1. new data clusters (newly allocated, copied-on-write, or
//!      preallocated zero clusters given data);
//!   2. refcount blocks (a cluster is counted before anything uses it;
//!      skipped with lazy refcounts), barrier, then the refcount table;
//!   3. barrier, L2 tables (they point at 1 and are counted by 2);
//!   4. barrier, the L1 entries pointing at new L2 tables;
//!   5. only then are clusters that lost their last reference freed.
//!
//! `flush` runs those steps and ends with fdatasync, so every write
//! completed before a flush survives a power loss. A dirty L2 table evicted
//! from the cache is written the same way (refcounts, barrier, table). The
//! barrier is skipped when nothing was written since the last one
//! (`unsynced`), so a flush costs no more syncs than the steps that have
//! something to write.

mod allocator;
pub mod backing;
pub mod check;
pub mod compressed;
pub mod create;
pub(crate) mod extent;
pub mod header;
pub mod refcount;
mod repair;
pub mod tables;

use int_cast::u64_to_usize;
use int_cast::usize_to_u64;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::host_file::HostFile;
use crate::{ConcurrentDisk, DiskBackend, DiskError, DiskResult};
use backing::Chain;
use header::Header;
use tables::{COPIED, Mapping, MetadataCache, ZERO};

pub use backing::BackingPolicy;
pub use create::{CreateOptions, create};
pub use repair::repair;

/// Default memory for cached L2 tables (as QEMU's default maximum).
pub(crate) const DEFAULT_L2_CACHE: u64 = 32 << 20;
/// Default memory for cached refcount blocks.
pub(crate) const DEFAULT_REFCOUNT_CACHE: u64 = 8 << 20;
/// Largest run of clusters allocated and written with one request.
const MAX_WRITE_RUN_BYTES: u64 = 4 << 20;
/// The file grows in steps of this much when guest writes need new clusters:
/// writes then land in already allocated host blocks instead of extending
/// the file each time (much cheaper with O_DIRECT). The tail stays free
/// (refcount 0) and is used first after a reopen.
const PREALLOC_STEP: u64 = 8 << 20;

#[derive(Debug, Clone)]
pub struct Qcow2Options {
    pub read_only: bool,
    /// O_DIRECT for data (cache=none).
    pub direct: bool,
    pub l2_cache_bytes: u64,
    pub refcount_cache_bytes: u64,
    /// Which backing file the image may open (default: none).
    pub backing: BackingPolicy,
}

impl Default for Qcow2Options {
    fn default() -> Self {
        Qcow2Options {
            read_only: false,
            direct: false,
            l2_cache_bytes: DEFAULT_L2_CACHE,
            refcount_cache_bytes: DEFAULT_REFCOUNT_CACHE,
            backing: BackingPolicy::Forbid,
        }
    }
}

pub struct Qcow2Image {
    file: HostFile,
    path: PathBuf,
    header: Header,
    read_only: bool,
    cluster_bits: u32,
    cluster_size: u64,
    l1: Vec<u64>,
    /// Range of L1 indexes changed in memory and not yet written.
    l1_dirty: Option<(usize, usize)>,
    l2_cache: MetadataCache,
    reftable: Vec<u64>,
    reftable_dirty: bool,
    rc_cache: MetadataCache,
    rc_order: u32,
    rc_per_block: u64,
    /// Host byte ranges whose references are gone in memory; freed once the
    /// metadata without them is on disk.
    pending_frees: Vec<(u64, u64)>,
    /// Lowest cluster index that may be free.
    free_hint: u64,
    /// End of the file or of the last allocated cluster, whichever is larger.
    alloc_end: u64,
    /// The backing chain: read-only layers, each opened once and shared
    /// with `ConcurrentDisk`'s lock-free readers.
    backing: Option<Arc<ConcurrentDisk>>,
    /// Reused buffer for copy-on-write clusters (no allocation per request).
    scratch: Vec<u8>,
    /// The last decompressed cluster, keyed by its (offset, sectors): both whole, as
    /// packing them into one u64 let distinct entries share a key.
    decompressed: Option<((u64, u64), Vec<u8>)>,
    compressed_buf: Vec<u8>,
    /// Whether the dirty bit is set on disk (lazy refcounts only).
    dirty_on_disk: bool,
    /// End of the host space already reserved with fallocate.
    prealloc_end: u64,
    /// Writes that later metadata will depend on (new data, refcount
    /// blocks, L2 tables, the refcount table) were issued since the last
    /// sync: the next dependent write needs a barrier first.
    unsynced: bool,
}

fn corrupt(msg: impl Into<String>) -> DiskError {
    DiskError::Corrupt(msg.into())
}

impl Qcow2Image {
    /// Opens the image at `path`, and its backing chain as `opts.backing`
    /// allows.
    pub fn open(path: &Path, opts: Qcow2Options) -> DiskResult<Qcow2Image> {
        let file = HostFile::open(path, !opts.read_only, opts.direct)?;
        Self::open_file(file, path, opts)
    }

    /// Opens the image in `file`, named `path` (backing names resolve
    /// against its directory).
    pub(crate) fn open_file(
        file: HostFile,
        path: &Path,
        opts: Qcow2Options,
    ) -> DiskResult<Qcow2Image> {
        Self::open_in_chain(file, path, opts, &mut Chain::new(path), true)
    }

    /// Opens one file without its backing chain, for tools that look at
    /// that file only (create, repair, the header fuzzer): reads of
    /// unallocated clusters give zeroes.
    pub(crate) fn open_alone(path: &Path, opts: Qcow2Options) -> DiskResult<Qcow2Image> {
        let file = HostFile::open(path, !opts.read_only, opts.direct)?;
        Self::open_in_chain(file, path, opts, &mut Chain::new(path), false)
    }

    pub(crate) fn open_in_chain(
        file: HostFile,
        path: &Path,
        opts: Qcow2Options,
        chain: &mut Chain,
        with_backing: bool,
    ) -> DiskResult<Qcow2Image> {
        let header = read_header(&file)?;
        let file_len = file.len()?;
        let cs = header.cluster_size();
        let l1_bytes = u64::from(header.l1_size) * 8;
        if header.l1_size > 0 && header.l1_table_offset.saturating_add(l1_bytes) > file_len {
            return Err(corrupt("L1 table lies past the end of the file"));
        }
        let rt_bytes = u64::from(header.refcount_table_clusters) * cs;
        if header.refcount_table_offset.saturating_add(rt_bytes) > file_len {
            return Err(corrupt("refcount table lies past the end of the file"));
        }
        if !opts.read_only {
            if header.is_corrupt() {
                return Err(DiskError::UnsupportedImage(
                    "image is marked corrupt; it can only be opened read-only".into(),
                ));
            }
            if header.nb_snapshots > 0 {
                return Err(DiskError::UnsupportedImage(
                    "writing to images with internal snapshots".into(),
                ));
            }
        }

        // The tables held in memory count against the chain's budget
        // before they are read. A read-only image never allocates, so its
        // refcount table stays on disk.
        let rt_held = if opts.read_only { 0 } else { rt_bytes };
        chain.charge(l1_bytes + rt_held, path)?;
        let l1 = read_table(&file, header.l1_table_offset, l1_bytes)?;
        let reftable = read_table(&file, header.refcount_table_offset, rt_held)?;

        let backing = match (&header.backing_file, with_backing) {
            (Some(name), true) => Some(backing::open(
                path,
                name,
                header.backing_format.as_deref(),
                &opts.backing,
                opts.direct,
                chain,
            )?),
            _ => None,
        };

        let mut img = Qcow2Image {
            file,
            path: path.to_path_buf(),
            cluster_bits: header.cluster_bits,
            cluster_size: cs,
            read_only: opts.read_only,
            l1,
            l1_dirty: None,
            l2_cache: MetadataCache::new(opts.l2_cache_bytes, cs),
            reftable,
            reftable_dirty: false,
            rc_cache: MetadataCache::new(opts.refcount_cache_bytes, cs),
            rc_order: header.refcount_order,
            rc_per_block: refcount::entries_per_block(header.cluster_bits, header.refcount_order),
            pending_frees: Vec::new(),
            free_hint: 1,
            alloc_end: file_len.next_multiple_of(cs),
            backing,
            scratch: Vec::new(),
            decompressed: None,
            compressed_buf: Vec::new(),
            dirty_on_disk: false,
            prealloc_end: file_len,
            unsynced: false,
            header,
        };
        if !img.read_only && img.header.is_dirty() {
            // Lazy refcounts and no clean close: the refcounts on disk may
            // be stale; the tables are the truth.
            img.rebuild_refcounts()?;
        }
        if !img.read_only && img.header.autoclear_features != 0 {
            // We keep no bitmaps up to date: clearing the autoclear bits tells
            // other readers the optional data they guard is stale (spec rule).
            img.header.autoclear_features = 0;
            img.file
                .write_meta(&0u64.to_be_bytes(), header::OFF_AUTOCLEAR)?;
            img.sync()?;
        }
        Ok(img)
    }

    /// The backing chain's top layer, if any.
    pub(crate) fn backing_disk(&self) -> Option<&Arc<ConcurrentDisk>> {
        self.backing.as_ref()
    }

    /// Waits until everything written so far is durable.
    fn sync(&mut self) -> DiskResult<()> {
        self.file.sync()?;
        self.unsynced = false;
        Ok(())
    }

    /// Makes the writes that the next metadata write depends on durable,
    /// if there are any since the last sync.
    fn barrier(&mut self) -> DiskResult<()> {
        if self.unsynced {
            self.sync()?;
        }
        Ok(())
    }

    /// Notes a write that later metadata will depend on.
    pub(crate) fn wrote_depended_on(&mut self) {
        self.unsynced = true;
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn cluster_size(&self) -> u64 {
        self.cluster_size
    }

    fn l2_entries(&self) -> u64 {
        self.cluster_size / 8
    }

    fn cluster_mask(&self) -> u64 {
        self.cluster_size - 1
    }

    /// Checks that a host cluster referenced by metadata lies in the file.
    fn check_host_cluster(&self, host: u64, what: &str) -> DiskResult<()> {
        if host == 0 || host.saturating_add(self.cluster_size) > self.alloc_end {
            return Err(corrupt(format!(
                "{what} at {host:#x} lies outside the image (end {:#x})",
                self.alloc_end
            )));
        }
        Ok(())
    }

    /// L2 table offset for an L1 index (0 = none).
    fn l2_offset(&self, l1_index: u64) -> DiskResult<u64> {
        let Some(&entry) = self.l1.get(u64_to_usize(l1_index)) else {
            return Ok(0);
        };
        tables::decode_l1(entry, self.cluster_bits).map_err(corrupt)
    }

    /// Makes sure the L2 table at `off` is cached.
    fn load_l2(&mut self, off: u64) -> DiskResult<()> {
        if self.l2_cache.contains(off) {
            return Ok(());
        }
        self.check_host_cluster(off, "L2 table")?;
        self.make_room_l2()?;
        let mut data = vec![0u8; u64_to_usize(self.cluster_size)];
        self.file.read_meta(&mut data, off)?;
        self.l2_cache.insert(off, data, false);
        Ok(())
    }

    fn make_room_l2(&mut self) -> DiskResult<()> {
        while self.l2_cache.is_full() {
            let Some((victim, dirty)) = self.l2_cache.victim() else {
                break;
            };
            if dirty {
                // The table may point at new data and at clusters whose
                // refcounts are only in memory: those go first, as in a
                // flush (steps 1 to 3).
                if !self.header.lazy_refcounts() {
                    self.write_refcounts()?;
                }
                self.barrier()?;
            }
            if let Some(c) = self.l2_cache.remove(victim)
                && dirty
            {
                self.file.write_meta(&c.data, victim)?;
                self.wrote_depended_on();
            }
        }
        Ok(())
    }

    /// Raw L2 entry for a guest cluster (0 when there is no L2 table).
    fn l2_entry(&mut self, vcluster: u64) -> DiskResult<u64> {
        let l1_index = vcluster / self.l2_entries();
        let l2_index = u64_to_usize(vcluster % self.l2_entries());
        let off = self.l2_offset(l1_index)?;
        if off == 0 {
            return Ok(0);
        }
        self.load_l2(off)?;
        let table = self
            .l2_cache
            .get(off)
            .ok_or_else(|| corrupt("L2 table vanished from the cache"))?;
        Ok(table.get_u64(l2_index))
    }

    fn mapping(&mut self, vcluster: u64) -> DiskResult<Mapping> {
        let entry = self.l2_entry(vcluster)?;
        let m =
            tables::decode_l2(entry, self.cluster_bits, self.header.version).map_err(corrupt)?;
        match m {
            Mapping::Data { host, .. } | Mapping::Zero { host: Some(host) } => {
                self.check_host_cluster(host, "data cluster")?
            }
            _ => {}
        }
        Ok(m)
    }

    /// Sets the L2 entry of a guest cluster, creating the L2 table if needed.
    fn set_l2_entry(&mut self, vcluster: u64, entry: u64) -> DiskResult<()> {
        let l1_index = vcluster / self.l2_entries();
        let l2_index = u64_to_usize(vcluster % self.l2_entries());
        let mut off = self.l2_offset(l1_index)?;
        if off == 0 {
            if entry == 0 {
                return Ok(()); // already unallocated
            }
            off = self.alloc_clusters(1)?;
            self.make_room_l2()?;
            self.l2_cache
                .insert(off, vec![0u8; u64_to_usize(self.cluster_size)], true);
            let i = u64_to_usize(l1_index);
            let slot = self
                .l1
                .get_mut(i)
                .ok_or_else(|| corrupt("guest cluster outside the L1 table"))?;
            *slot = off | COPIED;
            self.l1_dirty = Some(match self.l1_dirty {
                Some((a, b)) => (a.min(i), b.max(i)),
                None => (i, i),
            });
        } else {
            self.load_l2(off)?;
        }
        let table = self
            .l2_cache
            .get(off)
            .ok_or_else(|| corrupt("L2 table vanished from the cache"))?;
        table.set_u64(l2_index, entry);
        Ok(())
    }

    /// Reads guest bytes from the backing chain (zeroes past its end or without one).
    fn read_backing(&mut self, buf: &mut [u8], pos: u64) -> DiskResult<()> {
        let Some(b) = &self.backing else {
            buf.fill(0);
            return Ok(());
        };
        let bsize = b.size();
        let avail = u64_to_usize(bsize.saturating_sub(pos).min(usize_to_u64(buf.len())));
        if avail > 0 {
            b.read_at(&mut buf[..avail], pos)?;
        }
        buf[avail..].fill(0);
        Ok(())
    }

    /// Decompresses the cluster behind a compressed L2 entry into the cache
    /// slot and returns it.
    /// How many bytes to read for the compressed cluster at `offset` whose
    /// entry names `sectors` sectors; refuses one past the end of the image.
    pub(crate) fn compressed_len(&self, offset: u64, sectors: u64) -> DiskResult<usize> {
        if offset >= self.alloc_end {
            return Err(corrupt(format!(
                "compressed cluster at {offset:#x} lies past the end of the image"
            )));
        }
        let start_sector = offset & !511;
        let len = (sectors * 512).saturating_sub(offset - start_sector);
        // Bounded by the entry's field width: at most ~2 clusters.
        Ok(u64_to_usize(len.min(2 * self.cluster_size + 512)))
    }

    pub(crate) fn compression_type(&self) -> header::CompressionType {
        self.header.compression_type
    }

    fn decompress_cluster(&mut self, offset: u64, sectors: u64) -> DiskResult<&[u8]> {
        let key = (offset, sectors);
        let fresh = !matches!(&self.decompressed, Some((k, _)) if *k == key);
        if fresh {
            let cs = u64_to_usize(self.cluster_size);
            let len = self.compressed_len(offset, sectors)?;
            self.compressed_buf.resize(len, 0);
            self.file.read_meta(&mut self.compressed_buf, offset)?;
            let mut out = match self.decompressed.take() {
                Some((_, v)) if v.len() == cs => v,
                _ => vec![0u8; cs],
            };
            compressed::decompress(self.header.compression_type, &self.compressed_buf, &mut out)
                .map_err(|e| corrupt(format!("compressed cluster at {offset:#x}: {e}")))?;
            self.decompressed = Some((key, out));
        }
        match &self.decompressed {
            Some((_, v)) => Ok(v),
            None => Err(corrupt("decompressed cluster vanished")),
        }
    }

    /// Fills `out` (one cluster) with the current contents of guest cluster
    /// `vcluster` when it is not a plain data cluster.
    fn fill_cluster(&mut self, vcluster: u64, m: Mapping, out: &mut [u8]) -> DiskResult<()> {
        match m {
            Mapping::Unallocated => {
                let pos = vcluster << self.cluster_bits;
                self.read_backing(out, pos)
            }
            Mapping::Zero { .. } => {
                out.fill(0);
                Ok(())
            }
            Mapping::Compressed { offset, sectors } => {
                let data = self.decompress_cluster(offset, sectors)?;
                out.copy_from_slice(data);
                Ok(())
            }
            Mapping::Data { host, .. } => Ok(self.file.read_data(out, host)?),
        }
    }

    /// Clusters that need a new host cluster for a write: anything but data
    /// this image owns alone (a shared cluster, without the copied flag, is
    /// copied first so the other user keeps its data).
    fn needs_alloc(m: Mapping) -> bool {
        matches!(
            m,
            Mapping::Unallocated
                | Mapping::Zero { host: None }
                | Mapping::Compressed { .. }
                | Mapping::Data { copied: false, .. }
        )
    }

    /// Queues the release of what an L2 entry pointed at.
    fn release(&mut self, m: Mapping) {
        match m {
            Mapping::Data { host, .. } | Mapping::Zero { host: Some(host) } => {
                self.pending_frees.push((host, self.cluster_size))
            }
            Mapping::Compressed { offset, sectors } => {
                let start = offset & !511;
                self.pending_frees.push((start, sectors * 512));
            }
            _ => {}
        }
    }

    fn set_dirty_bit_if_lazy(&mut self) -> DiskResult<()> {
        if self.header.lazy_refcounts() && !self.dirty_on_disk {
            let flags = self.header.incompatible_features | header::INCOMPAT_DIRTY;
            self.file
                .write_meta(&flags.to_be_bytes(), header::OFF_INCOMPAT)?;
            self.sync()?;
            self.header.incompatible_features = flags;
            self.dirty_on_disk = true;
        }
        Ok(())
    }

    fn write_inner(&mut self, buf: &[u8], offset: u64) -> DiskResult<()> {
        let cs = self.cluster_size;
        let len = usize_to_u64(buf.len());
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let vc = pos >> self.cluster_bits;
            let in_off = pos & self.cluster_mask();
            let n = (cs - in_off).min(len - done);
            let m = self.mapping(vc)?;
            match m {
                Mapping::Data { host, copied: true } => {
                    // In place; extend over following clusters contiguous on the host.
                    let mut n = n;
                    let mut next_host = host + cs;
                    while done + n < len {
                        match self.mapping(vc + ((in_off + n) >> self.cluster_bits))? {
                            Mapping::Data {
                                host: h,
                                copied: true,
                            } if h == next_host => {
                                n += cs.min(len - done - n);
                                next_host += cs;
                            }
                            _ => break,
                        }
                    }
                    let chunk = &buf[u64_to_usize(done)..u64_to_usize(done + n)];
                    self.file.write_data(chunk, host + in_off)?;
                    done += n;
                }
                Mapping::Zero { host: Some(host) } => {
                    // Preallocated zero cluster: write the whole cluster, then
                    // drop the zero flag.
                    let mut scratch = std::mem::take(&mut self.scratch);
                    scratch.clear();
                    scratch.resize(u64_to_usize(cs), 0);
                    scratch[u64_to_usize(in_off)..u64_to_usize(in_off + n)]
                        .copy_from_slice(&buf[u64_to_usize(done)..u64_to_usize(done + n)]);
                    let r = self.file.write_data(&scratch, host);
                    self.scratch = scratch;
                    r?;
                    // The L2 entry that drops the zero flag must not reach
                    // the disk before these bytes (they may be stale).
                    self.wrote_depended_on();
                    self.set_l2_entry(vc, host | COPIED)?;
                    done += n;
                }
                _ => {
                    done += self.write_new_clusters(buf, offset, done, vc, m)?;
                }
            }
        }
        Ok(())
    }

    /// Allocates a run of clusters starting at guest cluster `vc` (mapping
    /// `first`), writes merged contents in one request, then points the L2
    /// entries at them. Returns how many bytes of `buf` were consumed.
    fn write_new_clusters(
        &mut self,
        buf: &[u8],
        offset: u64,
        done: u64,
        vc: u64,
        first: Mapping,
    ) -> DiskResult<u64> {
        let cs = self.cluster_size;
        let len = usize_to_u64(buf.len());
        let end = offset + len;
        let max_run = (MAX_WRITE_RUN_BYTES / cs).max(1);
        let last_vc = (end - 1) >> self.cluster_bits;
        let mut old = Vec::with_capacity(4);
        old.push(first);
        while (usize_to_u64(old.len())) < max_run && vc + (usize_to_u64(old.len())) <= last_vc {
            let m = self.mapping(vc + usize_to_u64(old.len()))?;
            if !Self::needs_alloc(m) {
                break;
            }
            old.push(m);
        }
        let run = usize_to_u64(old.len());
        let host = self.alloc_clusters(run)?;
        self.preallocate(host + run * cs);
        let mut scratch = std::mem::take(&mut self.scratch);
        scratch.clear();
        scratch.resize(u64_to_usize(run * cs), 0);
        let mut result = Ok(());
        for (i, m) in old.iter().enumerate() {
            let cstart = (vc + usize_to_u64(i)) << self.cluster_bits;
            let cend = cstart + cs;
            let wstart = cstart.max(offset + done);
            let wend = cend.min(end);
            let slot = &mut scratch[i * u64_to_usize(cs)..(i + 1) * u64_to_usize(cs)];
            if (wstart > cstart || wend < cend)
                && let Err(e) = self.fill_cluster(vc + usize_to_u64(i), *m, slot)
            {
                result = Err(e);
                break;
            }
            slot[u64_to_usize(wstart - cstart)..u64_to_usize(wend - cstart)]
                .copy_from_slice(&buf[u64_to_usize(wstart - offset)..u64_to_usize(wend - offset)]);
        }
        let result = result.and_then(|()| Ok(self.file.write_data(&scratch, host)?));
        self.scratch = scratch;
        if let Err(e) = result {
            // Nothing points at the run yet: give it back.
            self.pending_frees.push((host, run * cs));
            return Err(e);
        }
        self.wrote_depended_on();
        for (i, m) in old.iter().enumerate() {
            self.set_l2_entry(vc + usize_to_u64(i), (host + usize_to_u64(i) * cs) | COPIED)?;
            self.release(*m);
        }
        let consumed_end = (((vc + run) << self.cluster_bits).min(end)) - (offset + done);
        Ok(consumed_end)
    }

    /// Extends the file ahead of `end` (best effort: without it, writes
    /// simply extend the file themselves).
    fn preallocate(&mut self, end: u64) {
        if end <= self.prealloc_end {
            return;
        }
        let start = self.prealloc_end;
        let len = (end - start).max(PREALLOC_STEP);
        if self.file.allocate(start, len).is_ok() {
            self.prealloc_end = start + len;
        } else {
            self.prealloc_end = end;
        }
    }

    /// Changes whole guest clusters in `[offset, offset+len)` to `zero`
    /// (reads as zeroes) or unallocated; partial clusters are left to the caller.
    fn clear_clusters(
        &mut self,
        first_vc: u64,
        count: u64,
        unmap: bool,
        zero: bool,
    ) -> DiskResult<()> {
        for vc in first_vc..first_vc + count {
            let m = self.mapping(vc)?;
            let new = if zero {
                match m {
                    Mapping::Data { host, .. } | Mapping::Zero { host: Some(host) } if !unmap => {
                        host | COPIED | ZERO
                    }
                    _ => ZERO,
                }
            } else if self.backing.is_some() && self.header.version >= 3 {
                // Discarding must not reveal the backing file's old data.
                ZERO
            } else if self.backing.is_some() {
                continue; // v2 cannot express it; discard is advisory.
            } else {
                0
            };
            let keeps_host = new & tables::OFFSET_MASK != 0;
            if !keeps_host {
                self.release(m);
            }
            let cur = self.l2_entry(vc)?;
            if cur != new {
                self.set_l2_entry(vc, new)?;
            }
        }
        Ok(())
    }

    /// Whole clusters inside `[offset, offset+len)`; the disk's last partial
    /// cluster counts as whole when the range reaches the end of the disk.
    fn whole_clusters(&self, offset: u64, len: u64) -> (u64, u64) {
        let cs = self.cluster_size;
        let first = offset.div_ceil(cs);
        let end = offset + len;
        let last = if end == self.header.size {
            end.div_ceil(cs)
        } else {
            end / cs
        };
        (first, last.saturating_sub(first))
    }

    /// Writes dirty refcount blocks, then (after a barrier) the refcount
    /// table if it changed.
    fn write_refcounts(&mut self) -> DiskResult<()> {
        if self
            .rc_cache
            .write_dirty(|off, data| self.file.write_meta(data, off))?
        {
            self.wrote_depended_on();
        }
        if self.reftable_dirty {
            // New refcount blocks before the table entries naming them.
            self.barrier()?;
            let raw: Vec<u8> = self.reftable.iter().flat_map(|e| e.to_be_bytes()).collect();
            self.file
                .write_meta(&raw, self.header.refcount_table_offset)?;
            self.reftable_dirty = false;
            self.wrote_depended_on();
        }
        Ok(())
    }

    /// Writes dirty L2 tables, then the changed L1 entries, each after a
    /// barrier (steps 3 and 4 of the module doc).
    fn write_l2_and_l1(&mut self) -> DiskResult<()> {
        if self.l2_cache.has_dirty() {
            // The data and refcounts the tables point at first.
            self.barrier()?;
            self.l2_cache
                .write_dirty(|off, data| self.file.write_meta(data, off))?;
            self.wrote_depended_on();
        }
        if let Some((a, b)) = self.l1_dirty {
            // New L2 tables (and their refcounts) before L1 points at them.
            self.barrier()?;
            let raw: Vec<u8> = self.l1[a..=b]
                .iter()
                .flat_map(|e| e.to_be_bytes())
                .collect();
            self.file
                .write_meta(&raw, self.header.l1_table_offset + usize_to_u64(a) * 8)?;
            self.l1_dirty = None;
        }
        Ok(())
    }

    fn flush_inner(&mut self) -> DiskResult<()> {
        if !self.header.lazy_refcounts() {
            self.write_refcounts()?;
        }
        self.write_l2_and_l1()?;
        self.sync()?;
        if !self.pending_frees.is_empty() {
            let frees = std::mem::take(&mut self.pending_frees);
            for (off, len) in frees {
                self.free_range(off, len)?;
            }
            // Written now (no barrier needed: nothing points at them any more).
            if !self.header.lazy_refcounts() {
                self.write_refcounts()?;
            }
        }
        Ok(())
    }

    /// Flushes everything and, with lazy refcounts, clears the dirty bit.
    fn close_inner(&mut self) -> DiskResult<()> {
        self.flush_inner()?;
        if self.dirty_on_disk {
            self.write_refcounts()?;
            self.sync()?;
            let flags = self.header.incompatible_features & !header::INCOMPAT_DIRTY;
            self.file
                .write_meta(&flags.to_be_bytes(), header::OFF_INCOMPAT)?;
            self.sync()?;
            self.header.incompatible_features = flags;
            self.dirty_on_disk = false;
        }
        Ok(())
    }

    /// Flushes all metadata and closes the image, reporting errors that a
    /// plain drop would have to swallow.
    pub fn close(mut self) -> DiskResult<()> {
        if self.read_only {
            return Ok(());
        }
        let r = self.close_inner();
        self.read_only = true; // Drop has nothing left to do.
        r
    }
}

impl Drop for Qcow2Image {
    fn drop(&mut self) {
        if !self.read_only {
            // Errors here have no caller; `close` reports them.
            let _ = self.close_inner();
        }
    }
}

/// Reads a table of big-endian u64 entries, `bytes` long, in pieces (no
/// second copy of a large table in memory).
fn read_table(file: &HostFile, offset: u64, bytes: u64) -> DiskResult<Vec<u64>> {
    const PIECE: u64 = 1 << 20;
    let mut table = Vec::with_capacity((bytes / 8) as usize);
    let mut raw = vec![0u8; bytes.min(PIECE) as usize];
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(PIECE) as usize;
        file.read_meta(&mut raw[..n], offset + done)?;
        table.extend(
            raw[..n]
                .chunks_exact(8)
                .map(|c| u64::from_be_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])),
        );
        done += usize_to_u64(n);
    }
    Ok(table)
}

/// Reads and parses the header of an open image file.
fn read_header(file: &HostFile) -> DiskResult<Header> {
    let file_len = file.len()?;
    let mut first = [0u8; 512];
    file.read_meta(&mut first, 0)?;
    if file_len < u64::from(header::V2_HEADER_LEN) {
        return Err(corrupt("file too short for a qcow2 header"));
    }
    let bits = header::peek_cluster_bits(&first).map_err(header_error)?;
    let want = u64_to_usize((1u64 << bits).min(file_len));
    let mut cluster0 = vec![0u8; want];
    file.read_meta(&mut cluster0, 0)?;
    Header::parse(&cluster0).map_err(header_error)
}

fn header_error(e: header::HeaderError) -> DiskError {
    match e {
        header::HeaderError::Unsupported(m) => DiskError::UnsupportedImage(m),
        header::HeaderError::Version(v) => {
            DiskError::UnsupportedImage(format!("qcow2 version {v}"))
        }
        other => DiskError::Corrupt(other.to_string()),
    }
}

impl DiskBackend for Qcow2Image {
    fn size(&self) -> u64 {
        self.header.size
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read_at(&mut self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        self.check_range(offset, usize_to_u64(buf.len()))?;
        let cs = self.cluster_size;
        let len = usize_to_u64(buf.len());
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let vc = pos >> self.cluster_bits;
            let in_off = pos & self.cluster_mask();
            let mut n = (cs - in_off).min(len - done);
            let m = self.mapping(vc)?;
            let range = u64_to_usize(done)..u64_to_usize(done + n);
            match m {
                Mapping::Data { host, .. } => {
                    let mut next_host = host + cs;
                    while done + n < len {
                        match self.mapping(vc + ((in_off + n) >> self.cluster_bits))? {
                            Mapping::Data { host: h, .. } if h == next_host => {
                                n += cs.min(len - done - n);
                                next_host += cs;
                            }
                            _ => break,
                        }
                    }
                    let range = u64_to_usize(done)..u64_to_usize(done + n);
                    self.file.read_data(&mut buf[range], host + in_off)?;
                }
                Mapping::Zero { .. } | Mapping::Unallocated => {
                    // One request for the whole run of clusters of the same kind.
                    let zero = matches!(m, Mapping::Zero { .. });
                    while done + n < len {
                        let next = self.mapping(vc + ((in_off + n) >> self.cluster_bits))?;
                        let same = match next {
                            Mapping::Zero { .. } => zero,
                            Mapping::Unallocated => !zero,
                            _ => false,
                        };
                        if !same {
                            break;
                        }
                        n += cs.min(len - done - n);
                    }
                    let range = u64_to_usize(done)..u64_to_usize(done + n);
                    if zero {
                        buf[range].fill(0);
                    } else {
                        self.read_backing(&mut buf[range], pos)?;
                    }
                }
                Mapping::Compressed {
                    offset: co,
                    sectors,
                } => {
                    let data = self.decompress_cluster(co, sectors)?;
                    let src = &data[u64_to_usize(in_off)..u64_to_usize(in_off + n)];
                    buf[range].copy_from_slice(src);
                }
            }
            done += n;
        }
        Ok(())
    }

    fn write_at(&mut self, buf: &[u8], offset: u64) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, usize_to_u64(buf.len()))?;
        if buf.is_empty() {
            return Ok(());
        }
        self.set_dirty_bit_if_lazy()?;
        self.write_inner(buf, offset)
    }

    fn flush(&mut self) -> DiskResult<()> {
        if self.read_only {
            return Ok(());
        }
        self.flush_inner()
    }

    fn discard(&mut self, offset: u64, len: u64) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, len)?;
        let (first, count) = self.whole_clusters(offset, len);
        if count == 0 {
            return Ok(()); // partial clusters: discard is advisory
        }
        self.set_dirty_bit_if_lazy()?;
        self.clear_clusters(first, count, true, false)
    }

    fn write_zeroes(&mut self, offset: u64, len: u64, may_unmap: bool) -> DiskResult<()> {
        if self.read_only {
            return Err(DiskError::ReadOnly);
        }
        self.check_range(offset, len)?;
        if len == 0 {
            return Ok(());
        }
        self.set_dirty_bit_if_lazy()?;
        let cs = self.cluster_size;
        let (first, count) = if self.header.version >= 3 || self.backing.is_none() {
            self.whole_clusters(offset, len)
        } else {
            (0, 0) // v2 with a backing file: only explicit zeroes hide it
        };
        let end = offset + len;
        let (zstart, zend) = if count > 0 {
            (first * cs, ((first + count) * cs).min(self.header.size))
        } else {
            (end, end)
        };
        // Head and tail pieces: write real zeroes.
        let zeros = vec![0u8; u64_to_usize(cs).min(u64_to_usize(len))];
        let mut pos = offset;
        while pos < zstart.min(end) {
            let n = (zstart.min(end) - pos).min(usize_to_u64(zeros.len()));
            self.write_inner(&zeros[..u64_to_usize(n)], pos)?;
            pos += n;
        }
        let mut pos = zend.max(offset);
        while pos < end {
            let n = (end - pos).min(usize_to_u64(zeros.len()));
            self.write_inner(&zeros[..u64_to_usize(n)], pos)?;
            pos += n;
        }
        if count > 0 {
            let zero_flag = self.header.version >= 3;
            self.clear_clusters(first, count, may_unmap || !zero_flag, zero_flag)?;
        }
        Ok(())
    }
}
