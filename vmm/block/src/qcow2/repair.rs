//! Rebuilding refcounts from the references, for images left with the
//! dirty bit (lazy refcounts, then a crash): their stored refcounts may be
//! stale, the L1/L2 tables are the truth.

use super::check::count_references;
use super::{Qcow2Image, corrupt, header, refcount};
use crate::DiskResult;
use int_cast::u64_to_usize;
use int_cast::usize_to_u64;

impl Qcow2Image {
    /// Writes a fresh refcount table and blocks past the end of the file,
    /// counting every cluster the header and the L1/L2 tables reference,
    /// switches the header to them and clears the dirty bit. The old
    /// refcount structures become free space.
    pub(super) fn rebuild_refcounts(&mut self) -> DiskResult<()> {
        let cs = self.cluster_size;
        let rpb = self.rc_per_block;
        let refs = count_references(&self.file, &self.header)?;
        let used = usize_to_u64(refs.len());
        // New area at the end: k blocks then t table clusters; the blocks
        // cover everything from cluster 0 to the end of the new area.
        let area = used.max(self.alloc_end.div_ceil(cs));
        let (mut k, mut t) = (1u64, 1u64);
        loop {
            let need_k = (area + k + t).div_ceil(rpb);
            let need_t = (need_k * 8).div_ceil(cs);
            if need_k <= k && need_t <= t {
                break;
            }
            k = k.max(need_k);
            t = t.max(need_t);
        }
        if t * cs > header::MAX_REFTABLE_BYTES {
            return Err(corrupt("image too large to rebuild its refcounts"));
        }
        // The header's field is 32 bits; the bound above keeps t far below that.
        let t_field = u32::try_from(t).map_err(|_| corrupt("refcount table too large"))?;
        let max = refcount::max_value(self.rc_order);
        let mut table = vec![0u64; u64_to_usize(t * cs / 8)];
        for j in 0..k {
            let mut block = vec![0u8; u64_to_usize(cs)];
            for i in 0..rpb {
                let c = j * rpb + i;
                let v = if c >= area && c < area + k + t {
                    1
                } else {
                    u64::from(refs.get(u64_to_usize(c)).copied().unwrap_or(0))
                };
                if v > max {
                    return Err(corrupt(format!("cluster {c} has {v} references")));
                }
                if v > 0 {
                    refcount::set(&mut block, self.rc_order, u64_to_usize(i), v);
                }
            }
            let off = (area + j) * cs;
            self.file.write_meta(&block, off)?;
            table[u64_to_usize(j)] = off;
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
        let flags = self.header.incompatible_features & !header::INCOMPAT_DIRTY;
        self.file
            .write_meta(&flags.to_be_bytes(), header::OFF_INCOMPAT)?;
        self.sync()?;
        self.header.incompatible_features = flags;
        self.header.refcount_table_offset = table_off;
        self.header.refcount_table_clusters = t_field;
        self.reftable = table;
        self.reftable_dirty = false;
        self.rc_cache = super::tables::MetadataCache::new(super::DEFAULT_REFCOUNT_CACHE, cs);
        self.alloc_end = self.alloc_end.max((area + k + t) * cs);
        self.free_hint = 1;
        Ok(())
    }
}

/// `qemu-img check -r all`: rewrites the refcounts from the tables (fixes
/// leaks and wrong refcounts; damaged L1/L2 tables are refused).
pub fn repair(path: &std::path::Path) -> DiskResult<()> {
    let mut img = Qcow2Image::open_alone(path, super::Qcow2Options::default())?;
    img.rebuild_refcounts()?;
    img.close()
}
