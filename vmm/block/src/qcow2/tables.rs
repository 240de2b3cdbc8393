//! L1/L2 tables: entry decoding and a bounded cache of metadata clusters.
//!
//! The cache holds whole clusters (L2 tables, refcount blocks) by their host
//! offset. Changed clusters stay dirty in memory until the image decides to
//! write them, so the image controls the write order (refcounts before the
//! L2 entries that use them, L2 tables before the L1 entries that point at
//! them).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Hasher for cluster-aligned host offsets. The keys are not attacker
/// chosen in a way that matters (they are bounded by the file size and the
/// cache is small), so a multiplicative hash is enough and much cheaper
/// than SipHash on the per-request lookup path.
#[derive(Default)]
pub struct OffsetHasher(u64);

impl Hasher for OffsetHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    fn write_u64(&mut self, v: u64) {
        // Fold the high half down so the table index bits see all of it.
        let x = v.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        self.0 = x ^ (x >> 32);
    }
}

type OffsetMap<V> = HashMap<u64, V, BuildHasherDefault<OffsetHasher>>;

/// Bits 9..=55 of an L1/L2 entry hold a host offset.
pub const OFFSET_MASK: u64 = 0x00ff_ffff_ffff_fe00;
/// The cluster's refcount is exactly one (it may be written in place).
pub const COPIED: u64 = 1 << 63;
pub const COMPRESSED: u64 = 1 << 62;
/// v3: the cluster reads as zeroes.
pub const ZERO: u64 = 1;
/// Bits that must be zero in a standard L2 entry (1..=8 and 56..=61).
const L2_RESERVED: u64 = 0x3f00_0000_0000_01fe;
/// Bits that must be zero in an L1 entry (0..=8 and 56..=62).
const L1_RESERVED: u64 = 0x7f00_0000_0000_01ff;

/// What one L2 entry says about a guest cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mapping {
    /// Not allocated here: read through to the backing image (or zeroes).
    Unallocated,
    /// Reads as zeroes; `host` is kept allocated for later writes when set.
    Zero { host: Option<u64> },
    /// Plain data at a host offset.
    Data { host: u64, copied: bool },
    /// Compressed data: `offset` (byte precise) and the sectors that may hold it.
    Compressed { offset: u64, sectors: u64 },
}

/// Decodes a standard L2 entry. `None` when it is malformed.
pub fn decode_l2(entry: u64, cluster_bits: u32, version: u32) -> Result<Mapping, String> {
    if entry & COMPRESSED != 0 {
        // Bits 0..x-1 offset, x..61 additional 512-byte sectors, x = 62 - (cluster_bits - 8).
        let x = 62 - (cluster_bits - 8);
        let offset = entry & ((1u64 << x) - 1);
        let sectors = ((entry & !COPIED & !COMPRESSED) >> x) + 1;
        if entry & COPIED != 0 {
            return Err(format!(
                "compressed L2 entry {entry:#x} has the copied flag"
            ));
        }
        return Ok(Mapping::Compressed { offset, sectors });
    }
    if entry & L2_RESERVED != 0 {
        return Err(format!("L2 entry {entry:#x} has reserved bits set"));
    }
    let host = entry & OFFSET_MASK;
    let cluster_mask = (1u64 << cluster_bits) - 1;
    if host & cluster_mask != 0 {
        return Err(format!("L2 entry {entry:#x} is not cluster aligned"));
    }
    if entry & ZERO != 0 {
        if version < 3 {
            return Err(format!(
                "L2 entry {entry:#x} has the zero flag in a v2 image"
            ));
        }
        return Ok(Mapping::Zero {
            host: (host != 0).then_some(host),
        });
    }
    if host == 0 {
        return Ok(Mapping::Unallocated);
    }
    Ok(Mapping::Data {
        host,
        copied: entry & COPIED != 0,
    })
}

/// Decodes an L1 entry into the L2 table offset (0 = no table).
pub fn decode_l1(entry: u64, cluster_bits: u32) -> Result<u64, String> {
    if entry & L1_RESERVED != 0 {
        return Err(format!("L1 entry {entry:#x} has reserved bits set"));
    }
    let off = entry & OFFSET_MASK;
    if off & ((1u64 << cluster_bits) - 1) != 0 {
        return Err(format!("L1 entry {entry:#x} is not cluster aligned"));
    }
    Ok(off)
}

pub struct CachedCluster {
    pub data: Vec<u8>,
    pub dirty: bool,
    last_use: u64,
}

impl CachedCluster {
    pub fn get_u64(&self, index: usize) -> u64 {
        let b = &self.data[index * 8..index * 8 + 8];
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }

    pub fn set_u64(&mut self, index: usize, value: u64) {
        self.data[index * 8..index * 8 + 8].copy_from_slice(&value.to_be_bytes());
        self.dirty = true;
    }
}

/// A bounded map from host offset to a cached metadata cluster.
pub struct MetadataCache {
    map: OffsetMap<CachedCluster>,
    capacity: usize,
    clock: u64,
}

impl MetadataCache {
    /// `budget_bytes` / `cluster_size` entries, at least 4.
    pub fn new(budget_bytes: u64, cluster_size: u64) -> MetadataCache {
        let capacity = (budget_bytes / cluster_size).clamp(4, 8192) as usize;
        MetadataCache {
            map: OffsetMap::with_capacity_and_hasher(capacity.min(1024), Default::default()),
            capacity,
            clock: 0,
        }
    }

    pub fn get(&mut self, offset: u64) -> Option<&mut CachedCluster> {
        self.clock += 1;
        let clock = self.clock;
        let c = self.map.get_mut(&offset)?;
        c.last_use = clock;
        Some(c)
    }

    pub fn contains(&self, offset: u64) -> bool {
        self.map.contains_key(&offset)
    }

    pub fn is_full(&self) -> bool {
        self.map.len() >= self.capacity
    }

    /// The entry to evict: the least recently used, clean ones first.
    pub fn victim(&self) -> Option<(u64, bool)> {
        self.map
            .iter()
            .min_by_key(|(_, c)| (c.dirty, c.last_use))
            .map(|(&off, c)| (off, c.dirty))
    }

    pub fn insert(&mut self, offset: u64, data: Vec<u8>, dirty: bool) {
        self.clock += 1;
        self.map.insert(
            offset,
            CachedCluster {
                data,
                dirty,
                last_use: self.clock,
            },
        );
    }

    pub fn remove(&mut self, offset: u64) -> Option<CachedCluster> {
        self.map.remove(&offset)
    }

    /// Offsets of dirty entries, sorted so writes go out in file order.
    fn dirty_offsets(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .map
            .iter()
            .filter(|(_, c)| c.dirty)
            .map(|(&o, _)| o)
            .collect();
        v.sort_unstable();
        v
    }

    /// Writes every dirty entry with `write` (offset, contents), in file
    /// order, marking each clean once written; an entry whose write fails
    /// stays dirty. Returns whether anything was written. The one write-back
    /// loop of both caches (L2 tables, refcount blocks): the caller orders
    /// it against other writes.
    pub fn write_dirty(
        &mut self,
        mut write: impl FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        let dirty = self.dirty_offsets();
        for off in &dirty {
            if let Some(c) = self.map.get_mut(off) {
                write(*off, &c.data)?;
                c.dirty = false;
            }
        }
        Ok(!dirty.is_empty())
    }

    pub fn has_dirty(&self) -> bool {
        self.map.values().any(|c| c.dirty)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_entries() {
        assert_eq!(decode_l2(0, 16, 3), Ok(Mapping::Unallocated));
        assert_eq!(decode_l2(ZERO, 16, 3), Ok(Mapping::Zero { host: None }));
        assert!(decode_l2(ZERO, 16, 2).is_err());
        assert_eq!(
            decode_l2(COPIED | 0x30000, 16, 3),
            Ok(Mapping::Data {
                host: 0x30000,
                copied: true
            })
        );
        assert!(decode_l2(0x30200, 16, 3).is_err());
        assert!(decode_l2(0x30002, 16, 3).is_err());
        // Compressed, cluster_bits 16: x = 54; 3 additional sectors.
        let e = COMPRESSED | (3u64 << 54) | 0x12345;
        assert_eq!(
            decode_l2(e, 16, 3),
            Ok(Mapping::Compressed {
                offset: 0x12345,
                sectors: 4
            })
        );
        assert_eq!(decode_l1(COPIED | 0x50000, 16), Ok(0x50000));
        assert!(decode_l1(1, 16).is_err());
    }

    #[test]
    fn write_back_goes_in_file_order_and_keeps_what_failed_dirty() {
        let mut c = MetadataCache::new(0, 512);
        for off in [1536u64, 512, 1024] {
            c.insert(off, vec![off as u8; 512], true);
        }
        c.insert(0, vec![0; 512], false);
        // The write of 1024 fails: it and 1536 stay dirty.
        let mut seen = Vec::new();
        let r = c.write_dirty(|off, _| {
            seen.push(off);
            if off == 1024 {
                Err(std::io::Error::other("disk full"))
            } else {
                Ok(())
            }
        });
        assert!(r.is_err());
        assert_eq!(seen, [512, 1024]);
        let mut again = Vec::new();
        assert!(
            c.write_dirty(|off, _| {
                again.push(off);
                Ok(())
            })
            .unwrap()
        );
        assert_eq!(again, [1024, 1536]);
        assert!(!c.has_dirty());
        assert!(!c.write_dirty(|_, _| Ok(())).unwrap());
    }

    #[test]
    fn cache_evicts_clean_lru_first() {
        let mut c = MetadataCache::new(0, 512);
        for i in 0..4u64 {
            c.insert(i * 512, vec![0; 512], i == 0);
        }
        assert!(c.is_full());
        c.get(512);
        assert_eq!(c.victim(), Some((1024, false)));
    }
}
