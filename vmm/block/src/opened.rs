//! A file its caller has already opened, for the engines to use instead of a name.
//!
//! A disk that lives where someone else writes (a PVC, a host directory) must be looked up
//! once, under the caller's rules, and never by its name again: the name can be switched to
//! a link between two lookups. The engines open an [`OpenedFile`] through
//! `/proc/self/fd/<n>`, which the kernel resolves to the file held, whatever its name now
//! is. Each open still gets its own open file description (its own `O_DIRECT` setting and
//! file locks), as an open by name does.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An open file (any access mode, `O_PATH` too) and the name it was opened under.
/// Clones share the descriptor; it is closed with the last one.
#[derive(Clone, Debug)]
pub struct OpenedFile {
    fd: Arc<OwnedFd>,
    name: PathBuf,
}

impl OpenedFile {
    /// `name` is for messages and for matching an image's backing name; it is not opened.
    pub fn new(fd: OwnedFd, name: impl Into<PathBuf>) -> OpenedFile {
        OpenedFile {
            fd: Arc::new(fd),
            name: name.into(),
        }
    }

    /// The name the file was opened under.
    pub fn name(&self) -> &Path {
        &self.name
    }

    /// `/proc/self/fd/<n>`: the path that opens exactly this file.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
    }
}

impl AsFd for OpenedFile {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// The same descriptor, not the same name: two opens of one file are different files here.
impl PartialEq for OpenedFile {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.fd, &other.fd)
    }
}

impl Eq for OpenedFile {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_reaches_the_file_held_after_its_name_is_reused() {
        let dir = tempfile::tempdir().unwrap();
        let name = dir.path().join("disk.img");
        std::fs::write(&name, b"first").unwrap();
        let file = OpenedFile::new(std::fs::File::open(&name).unwrap().into(), &name);
        std::fs::rename(&name, dir.path().join("moved")).unwrap();
        std::fs::write(&name, b"second").unwrap();
        assert_eq!(std::fs::read(file.path()).unwrap(), b"first");
        assert_eq!(file.name(), name);
        assert_eq!(file, file.clone());
        let other = OpenedFile::new(std::fs::File::open(&name).unwrap().into(), &name);
        assert_ne!(file, other);
    }
}
