//! Consistency check, like `qemu-img check`: counts every reference to every
//! host cluster and compares with the stored refcounts.
//!
//! Leaks (refcount higher than the references) waste space only;
//! corruptions (refcount lower than the references, entries pointing outside
//! the file, wrong "copied" flags) may lose data.

use int_cast::usize_to_u64;
use int_cast::{u32_to_usize, u64_to_usize};
use std::path::Path;

use super::header::Header;
use super::tables::{self, COPIED, Mapping};
use super::{read_header, refcount};
use crate::host_file::HostFile;
use crate::{DiskError, DiskResult};

/// Result of a check, with the fields `qemu-img check --output=json` prints.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CheckReport {
    pub corruptions: u64,
    pub leaks: u64,
    pub check_errors: u64,
    pub image_end_offset: u64,
    pub total_clusters: u64,
    pub allocated_clusters: u64,
    pub fragmented_clusters: u64,
    pub compressed_clusters: u64,
    /// One line per problem found (first 100).
    pub messages: Vec<String>,
}

impl CheckReport {
    fn problem(&mut self, corruption: bool, msg: String) {
        if corruption {
            self.corruptions += 1;
        } else {
            self.leaks += 1;
        }
        if self.messages.len() < 100 {
            self.messages.push(msg);
        }
    }
}

/// Refuses to check files whose cluster count would need more than this
/// much memory for the reference counts (one u16 per cluster).
const MAX_CHECK_CLUSTERS: u64 = 1 << 28;

pub fn check(path: &Path) -> DiskResult<CheckReport> {
    let file = HostFile::open(path, false, false)?;
    let header = read_header(&file)?;
    check_file(&file, &header)
}

fn be64_at(buf: &[u8], i: usize) -> u64 {
    buf.get(i * 8..i * 8 + 8)
        .map(|b| u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
        .unwrap_or(0)
}

struct Walker<'a> {
    file: &'a HostFile,
    cs: u64,
    nclusters: u64,
    refs: Vec<u16>,
    report: CheckReport,
}

impl Walker<'_> {
    /// Counts one reference to every cluster of `[off, off+len)`. Returns
    /// false (and records a corruption) when the range is outside the file.
    fn add(&mut self, off: u64, len: u64, what: &str) -> bool {
        if len == 0 {
            return true;
        }
        let first = off / self.cs;
        let last = (off.saturating_add(len) - 1) / self.cs;
        if last >= self.nclusters {
            self.report.problem(
                true,
                format!("ERROR {what} at {off:#x} lies past the end of the image"),
            );
            return false;
        }
        for c in first..=last {
            if let Some(r) = self.refs.get_mut(u64_to_usize(c)) {
                *r = r.saturating_add(1);
            }
        }
        true
    }

    fn read_cluster(&self, off: u64) -> DiskResult<Vec<u8>> {
        let mut buf = vec![0u8; u64_to_usize(self.cs)];
        self.file.read_meta(&mut buf, off)?;
        Ok(buf)
    }
}

fn new_walker<'a>(file: &'a HostFile, header: &Header) -> DiskResult<Walker<'a>> {
    let cs = header.cluster_size();
    let nclusters = file.len()?.div_ceil(cs);
    if nclusters > MAX_CHECK_CLUSTERS {
        return Err(DiskError::UnsupportedImage(
            "image has too many clusters to check".into(),
        ));
    }
    if header.nb_snapshots > 0 {
        return Err(DiskError::UnsupportedImage(
            "checking images with internal snapshots".into(),
        ));
    }
    Ok(Walker {
        file,
        cs,
        nclusters,
        refs: vec![0u16; u64_to_usize(nclusters)],
        report: CheckReport {
            total_clusters: header.size.div_ceil(cs),
            ..CheckReport::default()
        },
    })
}

/// Counts the references from the header, the L1 table and the L2 tables
/// (not the refcount structures). Returns (host cluster, copied flag) for
/// every cluster whose copied flag must match its refcount.
fn walk_tables(w: &mut Walker<'_>, header: &Header) -> DiskResult<Vec<(u64, bool)>> {
    let cs = w.cs;
    let file = w.file;
    w.add(0, cs, "header");
    let l1_bytes = u64::from(header.l1_size) * 8;
    let l1_ok = w.add(header.l1_table_offset, l1_bytes, "L1 table");
    let mut l1 = Vec::new();
    if l1_ok {
        let mut raw = vec![0u8; u64_to_usize(l1_bytes)];
        file.read_meta(&mut raw, header.l1_table_offset)?;
        l1 = (0..u32_to_usize(header.l1_size))
            .map(|i| be64_at(&raw, i))
            .collect();
    }
    let mut copied_checks = Vec::new();
    let mut seen_l2 = std::collections::HashSet::new();
    let mut last_host = 0u64;
    for (i, &e) in l1.iter().enumerate() {
        let l2_off = match tables::decode_l1(e, header.cluster_bits) {
            Ok(o) => o,
            Err(m) => {
                w.report.problem(true, format!("ERROR L1 entry {i}: {m}"));
                continue;
            }
        };
        if l2_off == 0 {
            continue;
        }
        if !w.add(l2_off, cs, "L2 table") {
            continue;
        }
        copied_checks.push((l2_off, e & COPIED != 0));
        // A table shared by several L1 entries is counted for each (its
        // refcount will not match) but walked once: hostile images cannot
        // multiply the work.
        if !seen_l2.insert(l2_off) {
            continue;
        }
        let l2 = w.read_cluster(l2_off)?;
        for j in 0..(cs / 8) as usize {
            let entry = be64_at(&l2, j);
            match tables::decode_l2(entry, header.cluster_bits, header.version) {
                Err(m) => w
                    .report
                    .problem(true, format!("ERROR L2 at {l2_off:#x}[{j}]: {m}")),
                Ok(Mapping::Unallocated) | Ok(Mapping::Zero { host: None }) => {}
                Ok(Mapping::Data { host, copied }) => {
                    w.report.allocated_clusters += 1;
                    if last_host != 0 && host != last_host + cs {
                        w.report.fragmented_clusters += 1;
                    }
                    last_host = host;
                    if w.add(host, cs, "data cluster") {
                        copied_checks.push((host, copied));
                    }
                }
                Ok(Mapping::Zero { host: Some(host) }) => {
                    if w.add(host, cs, "preallocated zero cluster") {
                        copied_checks.push((host, entry & COPIED != 0));
                    }
                }
                Ok(Mapping::Compressed { offset, sectors }) => {
                    w.report.allocated_clusters += 1;
                    w.report.compressed_clusters += 1;
                    let start = offset & !511;
                    w.add(start, sectors * 512, "compressed cluster");
                }
            }
        }
    }
    Ok(copied_checks)
}

/// References to every cluster of the file from everything but the refcount
/// structures; refuses images whose tables are damaged.
pub(super) fn count_references(file: &HostFile, header: &Header) -> DiskResult<Vec<u16>> {
    let mut w = new_walker(file, header)?;
    walk_tables(&mut w, header)?;
    if w.report.corruptions > 0 {
        return Err(DiskError::Corrupt(format!(
            "cannot rebuild refcounts: {}",
            w.report.messages.join("; ")
        )));
    }
    Ok(w.refs)
}

fn check_file(file: &HostFile, header: &Header) -> DiskResult<CheckReport> {
    let cs = header.cluster_size();
    let mut w = new_walker(file, header)?;
    let nclusters = w.nclusters;
    let copied_checks = walk_tables(&mut w, header)?;
    let rt_bytes = u64::from(header.refcount_table_clusters) * cs;
    let rt_ok = w.add(header.refcount_table_offset, rt_bytes, "refcount table");

    // Refcount table and blocks.
    let mut reftable = Vec::new();
    if rt_ok {
        let mut raw = vec![0u8; u64_to_usize(rt_bytes)];
        file.read_meta(&mut raw, header.refcount_table_offset)?;
        reftable = (0..(rt_bytes / 8) as usize)
            .map(|i| be64_at(&raw, i))
            .collect();
    }
    let rpb = refcount::entries_per_block(header.cluster_bits, header.refcount_order);
    let mut blocks: Vec<(u64, u64)> = Vec::new(); // (block index, offset)
    for (i, &e) in reftable.iter().enumerate() {
        if e == 0 {
            continue;
        }
        if e & 0x1ff != 0 || e % cs != 0 {
            w.report.problem(
                true,
                format!("ERROR refcount table entry {i} is malformed ({e:#x})"),
            );
            continue;
        }
        if w.add(e, cs, "refcount block") {
            blocks.push((usize_to_u64(i), e));
        }
    }

    // Compare stored refcounts with the references.
    // Saturated like the reference counts (u16: 2 bytes per cluster).
    let mut stored = vec![0u16; u64_to_usize(nclusters)];
    let mut seen_blocks = std::collections::HashSet::new();
    for &(bi, off) in &blocks {
        if !seen_blocks.insert(off) {
            continue; // counted twice above; read once (bounded work)
        }
        let block = w.read_cluster(off)?;
        for k in 0..rpb {
            let c = bi * rpb + k;
            let v = refcount::get(&block, header.refcount_order, u64_to_usize(k));
            match stored.get_mut(u64_to_usize(c)) {
                Some(s) => *s = u16::try_from(v).unwrap_or(u16::MAX),
                None if v > 0 => w.report.problem(
                    false,
                    format!("Leaked cluster {c} (past the end of the file) refcount={v}"),
                ),
                None => {}
            }
        }
    }
    let mut last_used = 0u64;
    for c in 0..u64_to_usize(nclusters) {
        let r = u64::from(w.refs.get(c).copied().unwrap_or(0));
        let s = u64::from(stored.get(c).copied().unwrap_or(0));
        if r > 0 || s > 0 {
            last_used = usize_to_u64(c) + 1;
        }
        if s < r {
            w.report.problem(
                true,
                format!("ERROR cluster {c} refcount={s} reference={r}"),
            );
        } else if s > r {
            w.report.problem(
                false,
                format!("Leaked cluster {c} refcount={s} reference={r}"),
            );
        }
    }
    for (off, copied) in copied_checks {
        let s = stored.get(u64_to_usize(off / cs)).copied().unwrap_or(0);
        if (s == 1) != copied {
            w.report.problem(
                true,
                format!("ERROR OFLAG_COPIED at {off:#x}: refcount={s} copied={copied}"),
            );
        }
    }
    w.report.image_end_offset = last_used * cs;
    Ok(w.report)
}

/// Parses a header for the `info` command without opening the chain.
pub fn read_image_header(path: &Path) -> DiskResult<Header> {
    let file = HostFile::open(path, false, false)?;
    read_header(&file)
}
