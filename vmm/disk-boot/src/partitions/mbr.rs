//! Master boot records: four primary entries in sector 0, and logical partitions in a chain
//! of extended boot records inside an extended partition.

use super::{Partition, PartitionType, SECTOR, le_u32};
use crate::Error;
use crate::disk::Window;

/// Bounds the EBR chain (Linux's msdos parser stops at a similar count).
const MAX_LOGICAL: u32 = 128;
const ENTRIES_AT: usize = 0x1be;

/// One of the four slots of an MBR or EBR.
#[derive(Clone, Copy, Debug)]
pub(super) struct Entry {
    pub(super) boot: u8,
    pub(super) type_byte: u8,
    /// In sectors; for a logical partition relative to its EBR, for the next EBR relative
    /// to the extended partition.
    pub(super) start: u32,
    pub(super) sectors: u32,
}

impl Entry {
    fn used(&self) -> bool {
        self.type_byte != 0 && self.sectors != 0
    }

    fn is_extended(&self) -> bool {
        matches!(self.type_byte, 0x05 | 0x0f | 0x85)
    }
}

pub(super) struct Mbr {
    pub(super) entries: [Entry; 4],
}

/// The MBR of sector 0, or `None` without the 0x55aa signature or with boot indicators
/// other than 0x00/0x80 (then it is no partition table: Linux checks the same).
pub(super) fn read_primary(whole: &Window) -> Result<Option<Mbr>, Error> {
    let Some(sector) = whole.bytes::<512>(0)? else {
        return Ok(None);
    };
    Ok(parse(&sector))
}

fn parse(sector: &[u8; 512]) -> Option<Mbr> {
    if sector[510..512] != [0x55, 0xaa] {
        return None;
    }
    let mut entries = [Entry {
        boot: 0,
        type_byte: 0,
        start: 0,
        sectors: 0,
    }; 4];
    for (i, entry) in entries.iter_mut().enumerate() {
        let at = ENTRIES_AT + i * 16;
        let raw = &sector[at..at + 16];
        *entry = Entry {
            boot: raw[0],
            type_byte: raw[4],
            start: le_u32(raw, 8),
            sectors: le_u32(raw, 12),
        };
        if entry.boot != 0 && entry.boot != 0x80 {
            return None;
        }
    }
    Some(Mbr { entries })
}

/// The MBR's partitions: primary ones as 1–4, logical ones from 5. A damaged EBR ends the
/// chain with a note; the partitions found so far stay.
pub(super) fn partitions(
    whole: &Window,
    mbr: &Mbr,
    notes: &mut Vec<String>,
) -> Result<Vec<Partition>, Error> {
    let disk_sectors = whole.len() / SECTOR;
    let mut partitions = Vec::new();
    let mut extended = None;
    for (i, entry) in (1u32..).zip(mbr.entries.iter()) {
        if !entry.used() {
            continue;
        }
        if entry.is_extended() {
            if extended.is_none() {
                extended = Some(*entry);
            }
            continue;
        }
        match place(u64::from(entry.start), entry.sectors, disk_sectors) {
            Some((start, len)) => partitions.push(Partition {
                number: i,
                start,
                len,
                kind: PartitionType::Mbr {
                    type_byte: entry.type_byte,
                    active: entry.boot == 0x80,
                },
            }),
            None => notes.push(format!(
                "MBR partition {i} ({} sectors at {}) lies outside the disk",
                entry.sectors, entry.start
            )),
        }
    }
    if let Some(extended) = extended {
        logical(whole, &extended, disk_sectors, &mut partitions, notes)?;
    }
    Ok(partitions)
}

/// Follows the EBR chain. Each EBR lies inside the extended partition and after the
/// previous one, so the chain ends; it is also bounded by [`MAX_LOGICAL`].
fn logical(
    whole: &Window,
    extended: &Entry,
    disk_sectors: u64,
    partitions: &mut Vec<Partition>,
    notes: &mut Vec<String>,
) -> Result<(), Error> {
    let base = u64::from(extended.start);
    let end = base + u64::from(extended.sectors);
    let mut relative = 0u64;
    for number in 5..5 + MAX_LOGICAL {
        let ebr_lba = base + relative;
        if ebr_lba >= end || ebr_lba >= disk_sectors {
            notes.push(format!(
                "EBR at LBA {ebr_lba} lies outside the extended partition"
            ));
            return Ok(());
        }
        let Some(sector) = whole.bytes::<512>(ebr_lba * SECTOR)? else {
            return Ok(());
        };
        let Some(ebr) = parse(&sector) else {
            if relative != 0 {
                notes.push(format!(
                    "no valid EBR at LBA {ebr_lba}: the chain ends there"
                ));
            }
            return Ok(());
        };
        let [data, next, ..] = ebr.entries;
        if data.used() {
            let start = ebr_lba + u64::from(data.start);
            match place(start, data.sectors, end.min(disk_sectors)) {
                Some((start, len)) => partitions.push(Partition {
                    number,
                    start,
                    len,
                    kind: PartitionType::Mbr {
                        type_byte: data.type_byte,
                        active: data.boot == 0x80,
                    },
                }),
                None => notes.push(format!(
                    "logical partition {number} lies outside the extended partition"
                )),
            }
        }
        if !next.used() {
            return Ok(());
        }
        let following = u64::from(next.start);
        if following <= relative {
            notes.push(format!(
                "the EBR at LBA {ebr_lba} points back to LBA {}: the chain ends there",
                base + following
            ));
            return Ok(());
        }
        relative = following;
    }
    notes.push(format!(
        "more than {MAX_LOGICAL} logical partitions: the rest are ignored"
    ));
    Ok(())
}

/// Byte start and length of `sectors` sectors at `start`, if they end inside `limit` sectors.
fn place(start: u64, sectors: u32, limit: u64) -> Option<(u64, u64)> {
    let end = start.checked_add(u64::from(sectors))?;
    (start > 0 && end <= limit).then(|| (start * SECTOR, u64::from(sectors) * SECTOR))
}
