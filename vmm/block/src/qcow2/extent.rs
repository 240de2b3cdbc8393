//! Mapping lookups for callers that do the data I/O themselves
//! (`crate::concurrent`): the lookup runs under the caller's lock, the data
//! transfer outside it.

use super::Qcow2Image;
use super::tables::Mapping;
use crate::DiskResult;
use crate::host_file::DataHandle;
use int_cast::usize_to_u64;

/// Where the first bytes of a request live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extent {
    /// Plain data at this host offset, contiguous for the whole extent.
    /// For a write: clusters this image owns alone, so no metadata changes.
    Host(u64),
    /// Reads as zeroes.
    Zero,
    /// Not allocated here: the backing chain's bytes (zeroes without one).
    Backing,
    /// (Reads only) one compressed cluster: its byte offset in the file and
    /// the sectors its entry names. The caller reads and decompresses it.
    Compressed { offset: u64, sectors: u64 },
    /// Needs the engine itself (allocation, copy-on-write).
    Engine,
}

impl Qcow2Image {
    fn extent_of(m: Mapping, write: bool) -> Extent {
        match (m, write) {
            (Mapping::Data { host, copied: true }, true) => Extent::Host(host),
            (_, true) => Extent::Engine,
            (Mapping::Data { host, .. }, false) => Extent::Host(host),
            (Mapping::Zero { .. }, false) => Extent::Zero,
            (Mapping::Unallocated, false) => Extent::Backing,
            (Mapping::Compressed { offset, sectors }, false) => {
                Extent::Compressed { offset, sectors }
            }
        }
    }

    /// The kind of the first bytes of `[offset, offset + len)` and how many
    /// bytes (at least one, at most `len`) share it. The range must lie in
    /// the disk and `len` must not be 0.
    pub(crate) fn map_extent(
        &mut self,
        offset: u64,
        len: u64,
        write: bool,
    ) -> DiskResult<(Extent, u64)> {
        let cs = self.cluster_size;
        let vc = offset >> self.cluster_bits;
        let in_off = offset & self.cluster_mask();
        let first = Self::extent_of(self.mapping(vc)?, write);
        let mut n = (cs - in_off).min(len);
        // Compressed clusters come one at a time.
        let extends = !matches!(first, Extent::Compressed { .. });
        while extends && n < len {
            let k = (in_off + n) >> self.cluster_bits;
            let next = Self::extent_of(self.mapping(vc + k)?, write);
            let same = match (first, next) {
                (Extent::Host(h), Extent::Host(h2)) => h2 == h + k * cs,
                (a, b) => a == b,
            };
            if !same {
                break;
            }
            n += cs.min(len - n);
        }
        let first = match first {
            Extent::Host(h) => Extent::Host(h + in_off),
            other => other,
        };
        Ok((first, n))
    }

    pub(crate) fn data_handle(&self) -> DiskResult<DataHandle> {
        Ok(self.file.data_handle()?)
    }
}

/// Host clusters reserved for a write into guest clusters that have no
/// host cluster yet and whose old contents need no engine to read
/// (unallocated: the backing chain; zero: zeroes). The caller merges and
/// writes the data outside the lock, then calls `finish_allocating_write`.
#[derive(Debug)]
pub(crate) struct Allocation {
    /// First guest cluster.
    pub vc: u64,
    /// Clusters in the run.
    pub count: u64,
    /// Host offset of the run (contiguous).
    pub host: u64,
    /// Per cluster: true when its old contents are the backing chain's,
    /// false when they read as zeroes.
    pub from_backing: Vec<bool>,
}

impl Qcow2Image {
    /// Reserves host clusters for the write `[offset, offset + len)` when its
    /// first cluster qualifies (see `Allocation`); `None` sends the write to
    /// the engine. Stays within `len`; the caller must keep other writers off
    /// these guest clusters until `finish_allocating_write`.
    pub(crate) fn begin_allocating_write(
        &mut self,
        offset: u64,
        len: u64,
    ) -> DiskResult<Option<Allocation>> {
        let cs = self.cluster_size;
        let vc = offset >> self.cluster_bits;
        let last_vc = (offset + len - 1) >> self.cluster_bits;
        let max_run = (super::MAX_WRITE_RUN_BYTES / cs).max(1);
        let mut from_backing = Vec::new();
        while (usize_to_u64(from_backing.len())) < max_run
            && vc + (usize_to_u64(from_backing.len())) <= last_vc
        {
            match self.mapping(vc + usize_to_u64(from_backing.len()))? {
                Mapping::Unallocated => from_backing.push(true),
                Mapping::Zero { host: None } => from_backing.push(false),
                _ => break,
            }
        }
        if from_backing.is_empty() {
            return Ok(None);
        }
        self.set_dirty_bit_if_lazy()?;
        let count = usize_to_u64(from_backing.len());
        let host = self.alloc_clusters(count)?;
        self.preallocate(host + count * cs);
        Ok(Some(Allocation {
            vc,
            count,
            host,
            from_backing,
        }))
    }

    /// Points the guest clusters at their new host clusters once the data is
    /// written (`written`), or gives the run back when the write failed.
    pub(crate) fn finish_allocating_write(
        &mut self,
        a: &Allocation,
        written: bool,
    ) -> DiskResult<()> {
        let cs = self.cluster_size;
        if !written {
            // Nothing points at the run: free it with the next flush.
            self.pending_frees.push((a.host, a.count * cs));
            return Ok(());
        }
        // The data went out through another handle; the L2 entries set
        // here must wait for it (a barrier before they are written).
        self.wrote_depended_on();
        for i in 0..a.count {
            // Normally unchanged (the caller keeps writers, discards and
            // write-zeroes off the run); release whatever is there anyway.
            let old = self.mapping(a.vc + i)?;
            self.set_l2_entry(a.vc + i, (a.host + i * cs) | super::tables::COPIED)?;
            self.release(old);
        }
        Ok(())
    }
}
