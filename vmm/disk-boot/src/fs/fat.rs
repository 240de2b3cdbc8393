//! FAT12/16/32 through `fatfs` (the EFI system partition, syslinux boot partitions).
//!
//! `fatfs` checks the boot sector's BPB but follows cluster chains as the FAT gives them: a
//! chain that loops is ended by the disk's read budget (every cluster is a read). Names are
//! matched without case, as FAT does.

use std::io::Read;

use int_cast::usize_to_u64;

use super::FsError;
use crate::disk::{Cursor, Window, is_budget_error};

pub(crate) struct Fat(fatfs::FileSystem<Cursor>);

fn map(error: std::io::Error) -> FsError {
    if is_budget_error(&error) {
        return FsError::Budget;
    }
    match error.kind() {
        std::io::ErrorKind::NotFound => FsError::NotFound,
        _ => FsError::Other(error.to_string()),
    }
}

/// A FAT boot sector: a jump, a power-of-two sector size and the FAT type's name where
/// FAT12/16 or FAT32 keep it (every formatter writes it).
pub(super) fn looks_like_fat(window: &Window) -> Result<bool, crate::Error> {
    let Some(sector) = window.bytes::<512>(0)? else {
        return Ok(false);
    };
    let bytes_per_sector = u16::from_le_bytes([sector[11], sector[12]]);
    let named = |at: usize| sector.get(at..at + 3) == Some(b"FAT");
    Ok((sector[0] == 0xeb || sector[0] == 0xe9)
        && matches!(bytes_per_sector, 512 | 1024 | 2048 | 4096)
        && sector[510..512] == [0x55, 0xaa]
        && (named(0x36) || named(0x52)))
}

/// The BPB arithmetic `fatfs` 0.3.6 does without overflow checks (`fats × sectors per FAT`,
/// the first data sector, the data sectors), done here with them first: a hostile BPB whose
/// sums wrap is refused instead of panicking the parser (found by the `boot_disk` fuzz
/// target: `sectors_per_all_fats` overflowed).
fn check_bpb(sector: &[u8; 512]) -> Result<(), FsError> {
    let u16_at = |at: usize| u32::from(u16::from_le_bytes([sector[at], sector[at + 1]]));
    let u32_at = |at: usize| {
        u32::from_le_bytes([sector[at], sector[at + 1], sector[at + 2], sector[at + 3]])
    };
    let bytes_per_sector = u16_at(11);
    let sectors_per_cluster = u32::from(sector[13]);
    let (reserved, fats, root_entries) = (u16_at(14), u32::from(sector[16]), u16_at(17));
    let fat16_size = u16_at(22);
    let sectors_per_fat = if fat16_size == 0 {
        u32_at(36)
    } else {
        fat16_size
    };
    let total = match u16_at(19) {
        0 => u32_at(32),
        small => small,
    };
    let bad = |what: &str| Err(FsError::Other(format!("invalid FAT boot sector: {what}")));
    if bytes_per_sector == 0 || !sectors_per_cluster.is_power_of_two() {
        return bad("sector or cluster size");
    }
    let root_dir_sectors = (root_entries * 32).div_ceil(bytes_per_sector);
    let first_data = fats
        .checked_mul(sectors_per_fat)
        .and_then(|fat_sectors| fat_sectors.checked_add(reserved))
        .and_then(|sum| sum.checked_add(root_dir_sectors));
    match first_data {
        Some(first) if first < total => Ok(()),
        Some(_) => bad("no data sectors"),
        None => bad("the FATs do not fit 32-bit sector numbers"),
    }
}

impl Fat {
    pub(crate) fn load(window: Window) -> Result<Fat, FsError> {
        if let Some(sector) = window.bytes::<512>(0).map_err(map)? {
            check_bpb(&sector)?;
        }
        // No access-date updates: nothing is ever written.
        fatfs::FileSystem::new(window.cursor(), fatfs::FsOptions::new())
            .map(Fat)
            .map_err(map)
    }

    pub(crate) fn uuid(&self) -> String {
        let id = self.0.volume_id();
        format!("{:04X}-{:04X}", id >> 16, id & 0xffff)
    }

    pub(crate) fn label(&self) -> String {
        self.0.volume_label().trim_end().to_string()
    }

    /// `path` without its leading `/`, as `fatfs` takes it.
    fn relative(path: &str) -> &str {
        path.trim_start_matches('/')
    }

    pub(crate) fn read(&self, path: &str, limit: u64) -> Result<Vec<u8>, FsError> {
        if !self.is_file(path)? {
            return Err(if self.is_dir(path)? {
                FsError::NotAFile
            } else {
                FsError::NotFound
            });
        }
        let file = self
            .0
            .root_dir()
            .open_file(Self::relative(path))
            .map_err(map)?;
        let mut data = Vec::new();
        // One byte more than allowed tells a file that is too big.
        file.take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(map)?;
        if usize_to_u64(data.len()) > limit {
            return Err(FsError::TooBig {
                size: usize_to_u64(data.len()),
                limit,
            });
        }
        Ok(data)
    }

    /// The directory entry of `path`'s last component, if it exists.
    fn entry(&self, path: &str) -> Result<Option<(bool, bool)>, FsError> {
        let relative = Self::relative(path);
        let (dir, name) = match relative.rsplit_once('/') {
            Some((dir, name)) => (dir, name),
            None => ("", relative),
        };
        if name.is_empty() {
            return Ok(Some((true, false)));
        }
        let root = self.0.root_dir();
        let dir = if dir.is_empty() {
            root
        } else {
            match root.open_dir(dir) {
                Ok(d) => d,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(map(e)),
            }
        };
        for entry in dir.iter() {
            let entry = entry.map_err(map)?;
            if entry.file_name().eq_ignore_ascii_case(name) {
                return Ok(Some((entry.is_dir(), entry.is_file())));
            }
        }
        Ok(None)
    }

    pub(crate) fn is_file(&self, path: &str) -> Result<bool, FsError> {
        Ok(self.entry(path)?.is_some_and(|(_, file)| file))
    }

    pub(crate) fn is_dir(&self, path: &str) -> Result<bool, FsError> {
        Ok(self.entry(path)?.is_some_and(|(dir, _)| dir))
    }

    pub(crate) fn list(&self, path: &str, limit: usize) -> Result<Vec<String>, FsError> {
        let relative = Self::relative(path);
        let root = self.0.root_dir();
        let dir = if relative.is_empty() {
            root
        } else {
            root.open_dir(relative).map_err(map)?
        };
        let mut names = Vec::new();
        for entry in dir.iter() {
            let name = entry.map_err(map)?.file_name();
            if name == "." || name == ".." {
                continue;
            }
            if names.len() == limit {
                break;
            }
            names.push(name);
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bpb(fats: u8, sectors_per_fat: u32, total: u32) -> [u8; 512] {
        let mut s = [0u8; 512];
        s[11..13].copy_from_slice(&512u16.to_le_bytes());
        s[13] = 1;
        s[14..16].copy_from_slice(&1u16.to_le_bytes());
        s[16] = fats;
        s[36..40].copy_from_slice(&sectors_per_fat.to_le_bytes());
        s[32..36].copy_from_slice(&total.to_le_bytes());
        s
    }

    #[test]
    fn bpb_sums_that_wrap_are_refused() {
        assert!(check_bpb(&bpb(2, 100, 10_000)).is_ok());
        assert!(check_bpb(&bpb(255, u32::MAX / 2, u32::MAX)).is_err());
        assert!(check_bpb(&bpb(2, 10_000, 10_000)).is_err());
        let mut odd = bpb(2, 100, 10_000);
        odd[13] = 3;
        assert!(check_bpb(&odd).is_err());
    }
}
