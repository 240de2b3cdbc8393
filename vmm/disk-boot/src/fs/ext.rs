//! ext2/3/4 through `ext4-view`: read-only, journal replayed in memory, symlinks followed
//! inside the filesystem with a bound on their depth.

use ext4_view::{Ext4, Ext4Error};

use super::FsError;
use crate::disk::{Window, is_budget_error};

pub(crate) struct Ext(Ext4);

fn map(error: Ext4Error) -> FsError {
    match error {
        Ext4Error::NotFound => FsError::NotFound,
        Ext4Error::IsADirectory | Ext4Error::IsASpecialFile => FsError::NotAFile,
        Ext4Error::Io(e) if is_budget_error(e.as_ref()) => FsError::Budget,
        other => FsError::Other(other.to_string()),
    }
}

impl Ext {
    pub(crate) fn load(window: Window) -> Result<Ext, FsError> {
        Ext4::load(Box::new(window)).map(Ext).map_err(map)
    }

    pub(crate) fn uuid(&self) -> String {
        self.0.uuid().to_string()
    }

    pub(crate) fn label(&self) -> String {
        self.0.label().display().to_string()
    }

    pub(crate) fn read(&self, path: &str, limit: u64) -> Result<Vec<u8>, FsError> {
        let metadata = self.0.metadata(path).map_err(map)?;
        if metadata.is_dir() {
            return Err(FsError::NotAFile);
        }
        if metadata.len() > limit {
            return Err(FsError::TooBig {
                size: metadata.len(),
                limit,
            });
        }
        self.0.read(path).map_err(map)
    }

    pub(crate) fn is_file(&self, path: &str) -> Result<bool, FsError> {
        match self.0.metadata(path) {
            Ok(m) => Ok(m.file_type().is_regular_file()),
            Err(Ext4Error::NotFound | Ext4Error::NotADirectory) => Ok(false),
            Err(e) => Err(map(e)),
        }
    }

    pub(crate) fn is_dir(&self, path: &str) -> Result<bool, FsError> {
        match self.0.metadata(path) {
            Ok(m) => Ok(m.is_dir()),
            Err(Ext4Error::NotFound | Ext4Error::NotADirectory) => Ok(false),
            Err(e) => Err(map(e)),
        }
    }

    pub(crate) fn list(&self, path: &str, limit: usize) -> Result<Vec<String>, FsError> {
        let mut names = Vec::new();
        for entry in self.0.read_dir(path).map_err(map)? {
            let entry = entry.map_err(map)?;
            let name = entry.file_name().display().to_string();
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
