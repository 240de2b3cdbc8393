//! Partition tables: GPT (with its protective or hybrid MBR) and MBR (with logical
//! partitions in an extended partition), or none (a filesystem on the whole disk).
//!
//! Written here rather than taken from the `gpt` and `mbrman` crates: both trust the tables
//! they read. `gpt` 4.1 asserts that the entry size is 128 (a panic on a valid GPT with
//! larger entries, or a hostile one) and allocates `entries × entry size` bytes straight
//! from the header; `mbrman` 0.6 adds on-disk LBAs without overflow checks. The formats
//! are small and fully specified (UEFI 2.10 §5.2–5.3), and every field here is checked
//! before it is used.

mod gpt;
mod mbr;

use crate::Error;
use crate::disk::{Disk, Window};

/// The sector size the tables are read with: what the VMM's virtio-blk device reports.
/// A GPT written for 4096-byte sectors is found too.
pub(crate) const SECTOR: u64 = 512;

/// How the disk is divided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scheme {
    Gpt,
    Mbr,
    /// No partition table: the whole disk holds one filesystem.
    None,
}

/// What a partition's table says about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PartitionType {
    Gpt {
        /// The type GUID, lower case.
        type_guid: String,
        /// The partition's own GUID (`PARTUUID`).
        guid: String,
        name: String,
        /// Attribute bit 2, "legacy BIOS bootable".
        legacy_bootable: bool,
    },
    Mbr {
        type_byte: u8,
        /// The boot indicator (0x80).
        active: bool,
    },
    WholeDisk,
}

/// One partition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partition {
    /// Its number as Linux and GRUB count: GPT entries from 1 in table order, MBR primary
    /// partitions 1–4 and logical ones from 5; 0 for the whole disk.
    pub number: u32,
    /// Where it lies on the disk, in bytes.
    pub start: u64,
    pub len: u64,
    pub kind: PartitionType,
}

/// The EFI system partition's GPT type.
pub(crate) const ESP_GUID: &str = "c12a7328-f81f-11d2-ba4b-00a0c93ec93b";
/// The Boot Loader Specification's extended boot loader partition (`XBOOTLDR`).
pub(crate) const XBOOTLDR_GUID: &str = "bc13c2ff-59e6-4262-a352-b275fd6f7172";
/// MBR type of an EFI system partition.
const MBR_ESP: u8 = 0xef;

impl Partition {
    /// GRUB's name for the partition on disk `hd0`: `hd0,gpt2`, `hd0,msdos1`, `hd0`.
    pub fn grub_name(&self) -> String {
        match self.kind {
            PartitionType::Gpt { .. } => format!("hd0,gpt{}", self.number),
            PartitionType::Mbr { .. } => format!("hd0,msdos{}", self.number),
            PartitionType::WholeDisk => "hd0".to_string(),
        }
    }

    /// Whether the firmware would look here for an EFI boot loader.
    pub fn is_esp(&self) -> bool {
        match &self.kind {
            PartitionType::Gpt { type_guid, .. } => type_guid == ESP_GUID,
            PartitionType::Mbr { type_byte, .. } => *type_byte == MBR_ESP,
            PartitionType::WholeDisk => false,
        }
    }

    /// Whether the Boot Loader Specification's `XBOOTLDR` type marks it.
    pub fn is_xbootldr(&self) -> bool {
        matches!(&self.kind, PartitionType::Gpt { type_guid, .. } if type_guid == XBOOTLDR_GUID)
    }

    /// Marked for BIOS boot: MBR's active flag, GPT's legacy-bootable attribute.
    pub fn is_marked_bootable(&self) -> bool {
        match &self.kind {
            PartitionType::Gpt {
                legacy_bootable, ..
            } => *legacy_bootable,
            PartitionType::Mbr { active, .. } => *active,
            PartitionType::WholeDisk => false,
        }
    }

    /// A partition that holds no filesystem by its type: GRUB's BIOS boot partition,
    /// swap, an extended partition's container.
    pub(crate) fn holds_no_filesystem(&self) -> bool {
        match &self.kind {
            PartitionType::Gpt { type_guid, .. } => {
                type_guid == "21686148-6449-6e6f-744e-656564454649" // BIOS boot (GRUB core.img)
                    || type_guid == "0657fd6d-a4ab-43c4-84e5-0933c84b4f4f" // Linux swap
            }
            PartitionType::Mbr { type_byte, .. } => matches!(type_byte, 0x05 | 0x0f | 0x85 | 0x82),
            PartitionType::WholeDisk => false,
        }
    }
}

/// The partitions of a disk.
#[derive(Clone, Debug)]
pub struct Table {
    pub scheme: Scheme,
    pub partitions: Vec<Partition>,
    /// What was odd but not fatal (a damaged primary GPT header, a bad EBR).
    pub notes: Vec<String>,
}

/// Reads the disk's partition table. A disk with neither GPT nor MBR is one partition.
pub(crate) fn read(disk: &Disk) -> Result<Table, Error> {
    let whole = disk.whole();
    let mut notes = Vec::new();
    let mbr = mbr::read_primary(&whole)?;
    // GPT first: a protective MBR (type 0xee) says one is there; a hybrid MBR lists real
    // partitions beside it, and GPT is what counts then too (as for Linux and GRUB).
    let protective = mbr
        .as_ref()
        .is_some_and(|m| m.entries.iter().any(|e| e.type_byte == 0xee));
    match gpt::read(&whole, &mut notes)? {
        Some(partitions) => {
            return Ok(Table {
                scheme: Scheme::Gpt,
                partitions,
                notes,
            });
        }
        None if protective => {
            notes.push("the MBR protects a GPT, but no valid GPT header was found".into());
        }
        None => {}
    }
    if let Some(mbr) = mbr
        && !protective
        && !looks_like_a_filesystem(&whole)?
    {
        let partitions = mbr::partitions(&whole, &mbr, &mut notes)?;
        if !partitions.is_empty() {
            return Ok(Table {
                scheme: Scheme::Mbr,
                partitions,
                notes,
            });
        }
    }
    Ok(Table {
        scheme: Scheme::None,
        partitions: vec![Partition {
            number: 0,
            start: 0,
            len: disk.size(),
            kind: PartitionType::WholeDisk,
        }],
        notes,
    })
}

/// A FAT boot sector carries the same 0x55aa signature as an MBR; one with a FAT BPB is a
/// filesystem on the whole disk (what Linux's msdos parser checks too).
fn looks_like_a_filesystem(whole: &Window) -> Result<bool, Error> {
    let Some(sector) = whole.bytes::<512>(0)? else {
        return Ok(false);
    };
    let fat_name = |at: usize| sector.get(at..at + 3) == Some(b"FAT");
    Ok((sector[0] == 0xeb || sector[0] == 0xe9) && (fat_name(0x36) || fat_name(0x52)))
}

/// Little-endian integers from a byte slice of known length.
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |s| {
        u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]])
    })
}
