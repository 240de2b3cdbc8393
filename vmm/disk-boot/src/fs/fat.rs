//! FAT12/16/32 through `fatfs` (the EFI system partition, syslinux boot partitions).
//!
//! `fatfs` checks the boot sector's BPB but follows cluster chains as the FAT gives them: a
//! chain that loops is ended by the disk's read budget (every cluster is a read). Names are
//! matched without case, as FAT does.

use std::io::Read;

use block::cast::usize_to_u64;

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

impl Fat {
    pub(crate) fn load(window: Window) -> Result<Fat, FsError> {
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
