//! GUID partition tables (UEFI 2.10 §5.3): the primary header at LBA 1, or the backup at
//! the disk's last LBA when the primary is damaged; both checked by their CRC32, the
//! partition array by its own.

use int_cast::{u32_to_usize, u64_to_usize};

use super::{Partition, PartitionType, SECTOR, le_u32, le_u64};
use crate::Error;
use crate::disk::Window;

const SIGNATURE: &[u8; 8] = b"EFI PART";
/// The header's fields end at byte 92; a header may be longer, up to one sector.
const MIN_HEADER_SIZE: u32 = 92;
/// Entries are at least 128 bytes (the fields end at 128) and `128 × 2^n`.
const MIN_ENTRY_SIZE: u32 = 128;
/// Bounds a hostile header: the array is read whole and checksummed. The specification's
/// minimum array is 16 KiB (128 entries of 128 bytes); 1 MiB allows 8192 such entries.
const MAX_ARRAY_BYTES: u64 = 1 << 20;
/// Attribute bit 2: legacy BIOS bootable.
const LEGACY_BOOTABLE: u64 = 1 << 2;

/// The partitions of the disk's GPT, or `None` if it has no valid GPT header.
pub(super) fn read(
    whole: &Window,
    notes: &mut Vec<String>,
) -> Result<Option<Vec<Partition>>, Error> {
    // The sector size is not stored in a GPT: try the usual ones.
    for sector in [SECTOR, 4096] {
        let last_lba = (whole.len() / sector).saturating_sub(1);
        if last_lba < 2 {
            continue;
        }
        let mut reasons = Vec::new();
        for (lba, which) in [(1, "primary"), (last_lba, "backup")] {
            match header(whole, sector, lba)? {
                Ok(header) => match entries(whole, sector, &header)? {
                    Ok(partitions) => {
                        if which == "backup" || !reasons.is_empty() {
                            notes.extend(reasons);
                            notes.push(format!("using the backup GPT header at LBA {lba}"));
                        }
                        return Ok(Some(partitions));
                    }
                    Err(reason) => reasons.push(format!("{which} GPT: {reason}")),
                },
                Err(Some(reason)) => reasons.push(format!("{which} GPT header: {reason}")),
                Err(None) => {}
            }
        }
        if !reasons.is_empty() {
            notes.extend(reasons);
        }
    }
    Ok(None)
}

struct Header {
    first_usable: u64,
    last_usable: u64,
    array_lba: u64,
    entries: u32,
    entry_size: u32,
    array_crc: u32,
}

/// The header at `lba`: `Err(None)` when there is none, `Err(Some(why))` when one is there
/// but invalid.
fn header(whole: &Window, sector: u64, lba: u64) -> Result<Result<Header, Option<String>>, Error> {
    let mut buf = vec![0u8; u64_to_usize(sector)];
    let Some(offset) = lba.checked_mul(sector) else {
        return Ok(Err(None));
    };
    if whole.read_at(&mut buf, offset).is_err() {
        return Ok(Err(None));
    }
    if buf.get(..8) != Some(&SIGNATURE[..]) {
        return Ok(Err(None));
    }
    let size = le_u32(&buf, 12);
    if !(MIN_HEADER_SIZE..=u32::try_from(sector).unwrap_or(u32::MAX)).contains(&size) {
        return Ok(Err(Some(format!("header size {size} is out of range"))));
    }
    let stored_crc = le_u32(&buf, 16);
    let mut crc_input = buf[..u32_to_usize(size)].to_vec();
    crc_input[16..20].fill(0);
    if crc32fast::hash(&crc_input) != stored_crc {
        return Ok(Err(Some("header CRC32 mismatch".into())));
    }
    if le_u64(&buf, 24) != lba {
        return Ok(Err(Some(format!(
            "the header at LBA {lba} says it is at LBA {}",
            le_u64(&buf, 24)
        ))));
    }
    let header = Header {
        first_usable: le_u64(&buf, 40),
        last_usable: le_u64(&buf, 48),
        array_lba: le_u64(&buf, 72),
        entries: le_u32(&buf, 80),
        entry_size: le_u32(&buf, 84),
        array_crc: le_u32(&buf, 88),
    };
    let disk_sectors = whole.len() / sector;
    if header.first_usable > header.last_usable || header.last_usable >= disk_sectors {
        return Ok(Err(Some(format!(
            "usable LBAs {}..={} do not fit the disk ({disk_sectors} sectors)",
            header.first_usable, header.last_usable
        ))));
    }
    if header.entry_size < MIN_ENTRY_SIZE || !header.entry_size.is_power_of_two() {
        return Ok(Err(Some(format!(
            "partition entry size {} is not 128 × 2^n",
            header.entry_size
        ))));
    }
    let array_bytes = u64::from(header.entries) * u64::from(header.entry_size);
    if array_bytes > MAX_ARRAY_BYTES {
        return Ok(Err(Some(format!(
            "{} entries of {} bytes exceed the {MAX_ARRAY_BYTES}-byte bound",
            header.entries, header.entry_size
        ))));
    }
    Ok(Ok(header))
}

/// The used entries of the header's partition array.
fn entries(
    whole: &Window,
    sector: u64,
    header: &Header,
) -> Result<Result<Vec<Partition>, String>, Error> {
    let array_bytes = u64::from(header.entries) * u64::from(header.entry_size);
    let mut array = vec![0u8; u64_to_usize(array_bytes)];
    let Some(offset) = header.array_lba.checked_mul(sector) else {
        return Ok(Err("the partition array's LBA overflows".into()));
    };
    if let Err(e) = whole.read_at(&mut array, offset) {
        if crate::disk::is_budget_error(&e) {
            return Err(e.into());
        }
        return Ok(Err(format!("cannot read the partition array: {e}")));
    }
    if crc32fast::hash(&array) != header.array_crc {
        return Ok(Err("partition array CRC32 mismatch".into()));
    }
    let mut partitions = Vec::new();
    for (index, entry) in array
        .chunks_exact(u32_to_usize(header.entry_size))
        .enumerate()
    {
        let type_guid = guid(&entry[0..16]);
        if type_guid.is_nil() {
            continue;
        }
        let number =
            u32::try_from(index + 1).map_err(|_| Error::Corrupt("GPT entry index".into()))?;
        let (first, last) = (le_u64(entry, 32), le_u64(entry, 40));
        if first > last || first < header.first_usable || last > header.last_usable {
            return Ok(Err(format!(
                "partition {number} spans LBAs {first}..={last}, outside the usable {}..={}",
                header.first_usable, header.last_usable
            )));
        }
        let name: Vec<u16> = entry[56..128]
            .chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .take_while(|&c| c != 0)
            .collect();
        partitions.push(Partition {
            number,
            start: first * sector,
            len: (last - first + 1) * sector,
            kind: PartitionType::Gpt {
                type_guid: type_guid.to_string(),
                guid: guid(&entry[16..32]).to_string(),
                name: String::from_utf16_lossy(&name),
                legacy_bootable: le_u64(entry, 48) & LEGACY_BOOTABLE != 0,
            },
        });
    }
    // Overlapping partitions are not refused: each is read through its own window, inside
    // the disk.
    Ok(Ok(partitions))
}

/// A GUID as stored on disk: the first three fields little-endian.
fn guid(bytes: &[u8]) -> uuid::Uuid {
    let mut b = [0u8; 16];
    b.copy_from_slice(&bytes[..16]);
    uuid::Uuid::from_bytes_le(b)
}
