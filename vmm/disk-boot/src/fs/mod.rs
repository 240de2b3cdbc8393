//! The filesystems a boot loader reads: ext2/3/4 (`ext4-view`) and FAT12/16/32 (`fatfs`,
//! for EFI system partitions). Others are recognised by their magic numbers so that the
//! error can say what was found (xfs, btrfs, LVM, LUKS, NTFS, ISO 9660).
//!
//! Paths are cleaned here before either crate sees them ([`clean`]): `.` and empty
//! components dropped, `..` taken back, and a path that climbs above the root refused.

mod ext;
mod fat;

use crate::Error;
use crate::disk::Window;

/// A filesystem this loader reads.
pub(crate) enum Fs {
    Ext(ext::Ext),
    Fat(fat::Fat),
}

/// What a partition holds, as far as the loader can tell.
pub(crate) enum Probed {
    Readable(Fs),
    /// A known format the loader does not read, by name.
    Unsupported(&'static str),
    /// Nothing recognisable (unformatted, swap, an unknown format).
    Unknown,
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FsError {
    #[error("not found")]
    NotFound,
    #[error("not a regular file")]
    NotAFile,
    #[error("{size} bytes, more than the {limit} allowed")]
    TooBig { size: u64, limit: u64 },
    #[error("{0:?} climbs above the filesystem's root")]
    LeavesRoot(String),
    #[error("{0}")]
    Other(String),
    /// The disk read budget is spent (see `disk`): ends the whole search.
    #[error("the disk read budget is spent")]
    Budget,
}

impl Fs {
    /// Recognises the filesystem in `window`.
    pub(crate) fn probe(window: &Window) -> Result<Probed, Error> {
        let magic_at = |offset: u64, magic: &[u8]| -> Result<bool, Error> {
            let mut buf = vec![0u8; magic.len()];
            if offset + int_cast::usize_to_u64(magic.len()) > window.len() {
                return Ok(false);
            }
            window.read_at(&mut buf, offset)?;
            Ok(buf == magic)
        };
        // ext2/3/4: the superblock at 1024, its magic 0xef53 at byte 56.
        if magic_at(1024 + 56, &[0x53, 0xef])? {
            return match ext::Ext::load(window.clone()) {
                Ok(fs) => Ok(Probed::Readable(Fs::Ext(fs))),
                Err(FsError::Budget) => Err(Error::ReadBudget),
                Err(e) => Err(Error::Corrupt(format!("ext filesystem: {e}"))),
            };
        }
        if fat::looks_like_fat(window)? {
            return match fat::Fat::load(window.clone()) {
                Ok(fs) => Ok(Probed::Readable(Fs::Fat(fs))),
                Err(FsError::Budget) => Err(Error::ReadBudget),
                Err(e) => Err(Error::Corrupt(format!("FAT filesystem: {e}"))),
            };
        }
        let known: [(u64, &[u8], &'static str); 7] = [
            (0, b"XFSB", "xfs"),
            (0x10040, b"_BHRfS_M", "btrfs"),
            (512, b"LABELONE", "an LVM physical volume"),
            (0, b"LUKS\xba\xbe", "LUKS encryption"),
            (3, b"NTFS    ", "NTFS"),
            (0x8001, b"CD001", "ISO 9660"),
            (0, b"hsqs", "squashfs"),
        ];
        for (offset, magic, name) in known {
            if magic_at(offset, magic)? {
                return Ok(Probed::Unsupported(name));
            }
        }
        Ok(Probed::Unknown)
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Fs::Ext(_) => "ext",
            Fs::Fat(_) => "fat",
        }
    }

    /// The UUID as GRUB and blkid print it (`search --fs-uuid`, `root=UUID=`): ext's is a
    /// UUID, FAT's the volume serial as `ABCD-1234`. Compared without case.
    pub(crate) fn uuid(&self) -> String {
        match self {
            Fs::Ext(fs) => fs.uuid(),
            Fs::Fat(fs) => fs.uuid(),
        }
    }

    pub(crate) fn label(&self) -> String {
        match self {
            Fs::Ext(fs) => fs.label(),
            Fs::Fat(fs) => fs.label(),
        }
    }

    /// The contents of the file at `path` (cleaned first), at most `limit` bytes.
    pub(crate) fn read(&self, path: &str, limit: u64) -> Result<Vec<u8>, FsError> {
        let path = clean(path)?;
        match self {
            Fs::Ext(fs) => fs.read(&path, limit),
            Fs::Fat(fs) => fs.read(&path, limit),
        }
    }

    /// Whether `path` names a regular file (following links).
    pub(crate) fn is_file(&self, path: &str) -> Result<bool, FsError> {
        let path = clean(path)?;
        match self {
            Fs::Ext(fs) => fs.is_file(&path),
            Fs::Fat(fs) => fs.is_file(&path),
        }
    }

    /// Whether `path` names a directory.
    pub(crate) fn is_dir(&self, path: &str) -> Result<bool, FsError> {
        let path = clean(path)?;
        match self {
            Fs::Ext(fs) => fs.is_dir(&path),
            Fs::Fat(fs) => fs.is_dir(&path),
        }
    }

    /// The names in directory `path` (without `.` and `..`), at most `limit` of them.
    pub(crate) fn list(&self, path: &str, limit: usize) -> Result<Vec<String>, FsError> {
        let path = clean(path)?;
        match self {
            Fs::Ext(fs) => fs.list(&path, limit),
            Fs::Fat(fs) => fs.list(&path, limit),
        }
    }
}

/// An absolute path without `.`, `..` or empty components. `..` at the root is refused:
/// a boot entry whose path climbs out of its filesystem names nothing on it.
pub(crate) fn clean(path: &str) -> Result<String, FsError> {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if parts.pop().is_none() {
                    return Err(FsError::LeavesRoot(path.to_string()));
                }
            }
            other => parts.push(other),
        }
    }
    Ok(format!("/{}", parts.join("/")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_cleaned_and_may_not_climb_out() {
        assert_eq!(
            clean("boot//grub/./grub.cfg").unwrap(),
            "/boot/grub/grub.cfg"
        );
        assert_eq!(clean("/boot/x/../vmlinuz").unwrap(), "/boot/vmlinuz");
        assert_eq!(clean("/").unwrap(), "/");
        assert!(matches!(
            clean("/boot/../../etc"),
            Err(FsError::LeavesRoot(_))
        ));
        assert!(matches!(clean(".."), Err(FsError::LeavesRoot(_))));
    }
}
