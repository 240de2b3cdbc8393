//! Cluster allocation: refcount lookups, new refcount blocks, table growth.
//!
//! A cluster is free when its refcount is 0. New clusters get refcount 1 in
//! memory before anything points at them; `write_refcounts` puts those
//! counts on disk before the L2/L1 entries that use them (see `mod.rs`).

use super::tables::{CachedCluster, OFFSET_MASK};
use super::{Qcow2Image, corrupt, header, refcount};
use crate::DiskResult;
use int_cast::u64_to_usize;
use int_cast::usize_to_u64;

/// Reserved low bits of a refcount table entry.
const REFTABLE_RESERVED: u64 = 0x1ff;

impl Qcow2Image {
    /// Host offset of refcount block `index` (0 = not allocated).
    fn refcount_block_offset(&self, index: u64) -> DiskResult<u64> {
        let Some(&entry) = self.reftable.get(u64_to_usize(index)) else {
            return Ok(0);
        };
        if entry & REFTABLE_RESERVED != 0 || entry & (self.cluster_size - 1) != 0 {
            return Err(corrupt(format!(
                "refcount table entry {index} ({entry:#x}) is malformed"
            )));
        }
        Ok(entry & !REFTABLE_RESERVED)
    }

    fn refcount_block(&mut self, off: u64) -> DiskResult<&mut CachedCluster> {
        if !self.rc_cache.contains(off) {
            self.check_host_cluster(off, "refcount block")?;
            while self.rc_cache.is_full() {
                let Some((victim, _)) = self.rc_cache.victim() else {
                    break;
                };
                if let Some(c) = self.rc_cache.remove(victim)
                    && c.dirty
                {
                    // Refcounts may go to disk early: a count without a
                    // reference is at worst a leak. (The table entry for a new
                    // block is written only with `write_refcounts`.)
                    self.file.write_meta(&c.data, victim)?;
                    self.wrote_depended_on();
                }
            }
            let mut data = vec![0u8; u64_to_usize(self.cluster_size)];
            self.file.read_meta(&mut data, off)?;
            self.rc_cache.insert(off, data, false);
        }
        self.rc_cache
            .get(off)
            .ok_or_else(|| corrupt("refcount block vanished from the cache"))
    }

    /// Refcount of a host cluster.
    pub(super) fn refcount(&mut self, cluster: u64) -> DiskResult<u64> {
        let off = self.refcount_block_offset(cluster / self.rc_per_block)?;
        if off == 0 {
            return Ok(0);
        }
        let index = u64_to_usize(cluster % self.rc_per_block);
        let order = self.rc_order;
        let block = self.refcount_block(off)?;
        Ok(refcount::get(&block.data, order, index))
    }

    /// Sets the refcount of a host cluster whose refcount block exists.
    fn set_refcount(&mut self, cluster: u64, value: u64) -> DiskResult<()> {
        let off = self.refcount_block_offset(cluster / self.rc_per_block)?;
        if off == 0 {
            return Err(corrupt(format!("no refcount block for cluster {cluster}")));
        }
        if value > refcount::max_value(self.rc_order) {
            return Err(corrupt(format!("refcount of cluster {cluster} overflows")));
        }
        let index = u64_to_usize(cluster % self.rc_per_block);
        let order = self.rc_order;
        let block = self.refcount_block(off)?;
        refcount::set(&mut block.data, order, index, value);
        block.dirty = true;
        Ok(())
    }

    /// Clusters that metadata fixed by the header occupies. They have
    /// refcounts in a sound image; this guards against images where they do not.
    fn is_fixed_metadata(&self, cluster: u64) -> bool {
        let cs = self.cluster_size;
        let inside = |start: u64, bytes: u64| {
            bytes > 0 && cluster >= start / cs && cluster < (start + bytes).div_ceil(cs)
        };
        cluster == 0
            || inside(
                self.header.l1_table_offset,
                u64::from(self.header.l1_size) * 8,
            )
            || inside(
                self.header.refcount_table_offset,
                u64::from(self.header.refcount_table_clusters) * cs,
            )
    }

    /// First run of `n` free clusters at or after the free hint.
    fn find_free_run(&mut self, n: u64) -> DiskResult<u64> {
        let mut c = self.free_hint.max(1);
        let mut run_start = c;
        let mut run = 0;
        while run < n {
            let free = !self.is_fixed_metadata(c) && self.refcount(c)? == 0;
            if free {
                if run == 0 {
                    run_start = c;
                }
                run += 1;
            } else {
                run = 0;
                if c == self.free_hint {
                    self.free_hint = c + 1;
                }
            }
            c += 1;
            if c.saturating_mul(self.cluster_size) > OFFSET_MASK {
                return Err(corrupt("image file would exceed the largest host offset"));
            }
        }
        Ok(run_start)
    }

    /// Allocates `n` contiguous clusters with refcount 1; returns the host offset.
    ///
    /// When refcount blocks are missing for the area, they are placed in
    /// front of it, inside the same free run: `[blocks][n data clusters]`,
    /// so the data clusters stay contiguous for any `n`.
    pub(super) fn alloc_clusters(&mut self, n: u64) -> DiskResult<u64> {
        let mut extra = 0u64;
        loop {
            let start = self.find_free_run(n + extra)?;
            let end = start + n + extra;
            let first_block = start / self.rc_per_block;
            let last_block = (end - 1) / self.rc_per_block;
            if u64_to_usize(last_block) >= self.reftable.len() {
                self.grow_reftable(last_block + 1)?;
                continue; // the new table took clusters: search again
            }
            let mut missing = Vec::new();
            for b in first_block..=last_block {
                if self.refcount_block_offset(b)? == 0 {
                    missing.push(b);
                }
            }
            if usize_to_u64(missing.len()) > extra {
                extra = usize_to_u64(missing.len());
                continue;
            }
            for (j, &b) in missing.iter().enumerate() {
                self.install_refcount_block(b, start + usize_to_u64(j))?;
            }
            let data = start + usize_to_u64(missing.len());
            for c in start..data + n {
                self.set_refcount(c, 1)?;
            }
            if start == self.free_hint {
                self.free_hint = data + n;
            }
            self.alloc_end = self.alloc_end.max((data + n) * self.cluster_size);
            return Ok(data * self.cluster_size);
        }
    }

    /// Decrements the refcount of every cluster touched by a host byte range.
    pub(super) fn free_range(&mut self, off: u64, len: u64) -> DiskResult<()> {
        if len == 0 {
            return Ok(());
        }
        let first = off / self.cluster_size;
        let last = (off + len - 1) / self.cluster_size;
        for c in first..=last {
            let rc = self.refcount(c)?;
            if rc == 0 {
                return Err(corrupt(format!(
                    "freeing cluster {c}, which is already free"
                )));
            }
            self.set_refcount(c, rc - 1)?;
            if rc == 1 {
                self.free_hint = self.free_hint.min(c);
                // Give the space back to the host (best effort: a failure
                // only costs space).
                let _ = self
                    .file
                    .punch_hole(c * self.cluster_size, self.cluster_size);
            }
        }
        Ok(())
    }

    /// Makes free cluster `cluster` the (empty) refcount block `index`.
    /// The caller then counts the cluster itself.
    fn install_refcount_block(&mut self, index: u64, cluster: u64) -> DiskResult<()> {
        let off = cluster * self.cluster_size;
        if cluster == 0 || self.is_fixed_metadata(cluster) || off > OFFSET_MASK {
            return Err(corrupt(format!(
                "cannot place refcount block {index} at cluster {cluster}"
            )));
        }
        self.alloc_end = self.alloc_end.max(off + self.cluster_size);
        // Make room the usual way, then replace the contents by an empty block.
        self.refcount_block(off)?;
        if let Some(c) = self.rc_cache.get(off) {
            c.data.fill(0);
            c.dirty = true;
        }
        let slot = self
            .reftable
            .get_mut(u64_to_usize(index))
            .ok_or_else(|| corrupt("refcount table too small"))?;
        *slot = off;
        self.reftable_dirty = true;
        Ok(())
    }

    /// Replaces the refcount table by one with at least `min_entries`
    /// entries, placed past everything in use together with the new refcount
    /// blocks that count it. The header switches to it only once it is on disk.
    fn grow_reftable(&mut self, min_entries: u64) -> DiskResult<()> {
        let cs = self.cluster_size;
        let rpb = self.rc_per_block;
        let old_entries = usize_to_u64(self.reftable.len());
        let used_clusters = self.alloc_end.div_ceil(cs).max(old_entries * rpb);
        let b0 = used_clusters.div_ceil(rpb);
        let mut entries = min_entries.max(old_entries * 2).max(1);
        let (mut t, mut k);
        loop {
            t = (entries * 8).div_ceil(cs);
            k = 1;
            while k * rpb < k + t {
                k += 1;
            }
            let need = b0 + k;
            if entries >= need {
                break;
            }
            entries = need;
        }
        if t * cs > header::MAX_REFTABLE_BYTES {
            return Err(corrupt(
                "image too large: refcount table would exceed 8 MiB",
            ));
        }
        // The header's field is 32 bits; the bound above keeps t far below that.
        let t_field = u32::try_from(t).map_err(|_| corrupt("refcount table too large"))?;
        let area = b0 * rpb; // first cluster of the new blocks + table
        if (area + k + t) * cs > OFFSET_MASK {
            return Err(corrupt("image file would exceed the largest host offset"));
        }
        // New blocks count the new blocks and the new table.
        let mut blocks = vec![vec![0u8; u64_to_usize(cs)]; u64_to_usize(k)];
        for c in area..area + k + t {
            let b = u64_to_usize((c / rpb) - b0);
            let block = blocks
                .get_mut(b)
                .ok_or_else(|| corrupt("refcount growth arithmetic"))?;
            refcount::set(block, self.rc_order, u64_to_usize(c % rpb), 1);
        }
        let mut table = self.reftable.clone();
        table.resize(u64_to_usize(t * cs / 8), 0);
        for j in 0..k {
            table[u64_to_usize(b0 + j)] = (area + j) * cs;
        }
        // Everything the new table points at (the blocks in the cache, the
        // new blocks) and the table itself must be on disk before the
        // header names it.
        self.rc_cache
            .write_dirty(|off, data| self.file.write_meta(data, off))?;
        for (j, block) in blocks.iter().enumerate() {
            self.file.write_meta(block, (area + usize_to_u64(j)) * cs)?;
        }
        let raw: Vec<u8> = table.iter().flat_map(|e| e.to_be_bytes()).collect();
        let table_off = (area + k) * cs;
        self.file.write_meta(&raw, table_off)?;
        self.sync()?;
        let mut hdr = [0u8; 12];
        hdr[..8].copy_from_slice(&table_off.to_be_bytes());
        hdr[8..].copy_from_slice(&t_field.to_be_bytes());
        self.file.write_meta(&hdr, header::OFF_REFTABLE_OFFSET)?;
        self.sync()?;

        let old_off = self.header.refcount_table_offset;
        let old_clusters = u64::from(self.header.refcount_table_clusters);
        self.header.refcount_table_offset = table_off;
        self.header.refcount_table_clusters = t_field;
        self.reftable = table;
        self.reftable_dirty = false;
        self.alloc_end = self.alloc_end.max((area + k + t) * cs);
        for (j, block) in blocks.into_iter().enumerate() {
            let off = (area + usize_to_u64(j)) * cs;
            self.refcount_block(off)?;
            if let Some(c) = self.rc_cache.get(off) {
                c.data = block;
                c.dirty = false;
            }
        }
        // The header no longer points at the old table.
        self.free_range(old_off, old_clusters * cs)?;
        Ok(())
    }
}
