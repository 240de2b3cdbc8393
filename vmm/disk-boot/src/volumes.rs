//! The boot disk's partitions and their filesystems, as the boot loaders' configurations
//! name them (`hd0,gpt2`, a filesystem UUID or label, a path).
//!
//! [`Files`] is everything a loader reads; [`DiskFiles`] serves it from a real disk
//! (filesystems probed on first use), the tests serve it from memory.

use std::cell::RefCell;

use crate::Error;
use crate::disk::Disk;
use crate::fs::{Fs, FsError, Probed};
use crate::partitions::{Partition, Table};

/// A filesystem's identity, for `search` and `root=UUID=`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FsInfo {
    pub(crate) kind: &'static str,
    pub(crate) uuid: String,
    pub(crate) label: String,
}

/// What the loaders read: the boot disk's partitions (by index into [`Files::partitions`])
/// and the files on them.
pub(crate) trait Files {
    fn partitions(&self) -> &[Partition];
    /// The filesystem on partition `part`: `Ok(None)` if it holds none the loader reads
    /// (see [`Files::unsupported`] for why).
    fn fs_info(&self, part: usize) -> Result<Option<FsInfo>, Error>;
    /// The name of a known format on `part` that the loader does not read (xfs, btrfs...).
    fn unsupported(&self, part: usize) -> Option<&'static str>;
    fn read(&self, part: usize, path: &str, limit: u64) -> Result<Vec<u8>, FsError>;
    fn is_file(&self, part: usize, path: &str) -> Result<bool, FsError>;
    fn is_dir(&self, part: usize, path: &str) -> Result<bool, FsError>;
    fn list(&self, part: usize, path: &str, limit: usize) -> Result<Vec<String>, FsError>;
}

/// Why a GRUB device name names nothing the loader can read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DeviceError {
    #[error("{0:?} is another disk: only the boot disk (hd0) is read")]
    OtherDisk(String),
    #[error("{0:?} is not a partition of the boot disk")]
    NoSuchPartition(String),
    #[error("device {0:?} is not supported (only hd0 and its partitions)")]
    Unsupported(String),
}

/// The partition a GRUB device name (`hd0,gpt2`, `(hd0,msdos1)`, `hd0,2`, `hd0`) names.
pub(crate) fn partition_by_grub_name(
    partitions: &[Partition],
    name: &str,
) -> Result<usize, DeviceError> {
    let name = name.trim().trim_start_matches('(').trim_end_matches(')');
    let (disk, part) = match name.split_once(',') {
        Some((disk, part)) => (disk, Some(part)),
        None => (name, None),
    };
    if disk != "hd0" {
        return Err(match disk.strip_prefix("hd") {
            Some(n) if n.parse::<u32>().is_ok() => DeviceError::OtherDisk(name.into()),
            _ => DeviceError::Unsupported(name.into()),
        });
    }
    let Some(part) = part else {
        // The whole disk holds a filesystem only when it has no partition table.
        return partitions
            .iter()
            .position(|p| p.number == 0)
            .ok_or_else(|| DeviceError::NoSuchPartition(name.into()));
    };
    // GRUB also allows nested names (`hd0,msdos5,bsd1`): only the first level is read.
    let first = part.split(',').next().unwrap_or(part);
    let (scheme, number) = match first.strip_prefix("gpt") {
        Some(n) => (Some(true), n),
        None => match first.strip_prefix("msdos") {
            Some(n) => (Some(false), n),
            None => (None, first),
        },
    };
    let number: u32 = number
        .parse()
        .map_err(|_| DeviceError::NoSuchPartition(name.into()))?;
    partitions
        .iter()
        .position(|p| {
            p.number == number
                && matches!(
                    (scheme, &p.kind),
                    (Some(true), crate::partitions::PartitionType::Gpt { .. })
                        | (Some(false), crate::partitions::PartitionType::Mbr { .. })
                        | (None, _)
                )
        })
        .ok_or_else(|| DeviceError::NoSuchPartition(name.into()))
}

enum Slot {
    NotProbed,
    Readable(Box<Fs>),
    Unsupported(&'static str),
    Nothing,
}

/// [`Files`] on a real disk.
pub(crate) struct DiskFiles {
    disk: Disk,
    table: Table,
    slots: RefCell<Vec<Slot>>,
}

impl DiskFiles {
    pub(crate) fn new(disk: Disk, table: Table) -> DiskFiles {
        let slots = table.partitions.iter().map(|_| Slot::NotProbed).collect();
        DiskFiles {
            disk,
            table,
            slots: RefCell::new(slots),
        }
    }

    pub(crate) fn disk(&self) -> &Disk {
        &self.disk
    }

    /// Probes `part` once and runs `f` on its filesystem.
    fn with_fs<T>(
        &self,
        part: usize,
        f: impl FnOnce(&Fs) -> Result<T, FsError>,
    ) -> Result<Option<T>, FsError> {
        self.probe(part).map_err(|e| match e {
            Error::ReadBudget => FsError::Budget,
            other => FsError::Other(other.to_string()),
        })?;
        let slots = self.slots.borrow();
        match slots.get(part) {
            Some(Slot::Readable(fs)) => f(fs).map(Some),
            _ => Ok(None),
        }
    }

    fn probe(&self, part: usize) -> Result<(), Error> {
        if !matches!(self.slots.borrow().get(part), Some(Slot::NotProbed)) {
            return Ok(());
        }
        let Some(partition) = self.table.partitions.get(part) else {
            return Ok(());
        };
        let slot = if partition.holds_no_filesystem() {
            Slot::Nothing
        } else {
            let window = self.disk.window(partition.start, partition.len)?;
            match Fs::probe(&window) {
                Ok(Probed::Readable(fs)) => Slot::Readable(Box::new(fs)),
                Ok(Probed::Unsupported(name)) => Slot::Unsupported(name),
                Ok(Probed::Unknown) => Slot::Nothing,
                Err(Error::ReadBudget) => return Err(Error::ReadBudget),
                Err(e) => {
                    tracing::info!(
                        partition = partition.number,
                        "not a readable filesystem: {e}"
                    );
                    Slot::Nothing
                }
            }
        };
        if let Some(s) = self.slots.borrow_mut().get_mut(part) {
            *s = slot;
        }
        Ok(())
    }
}

impl Files for DiskFiles {
    fn partitions(&self) -> &[Partition] {
        &self.table.partitions
    }

    fn fs_info(&self, part: usize) -> Result<Option<FsInfo>, Error> {
        self.probe(part)?;
        Ok(match self.slots.borrow().get(part) {
            Some(Slot::Readable(fs)) => Some(FsInfo {
                kind: fs.kind(),
                uuid: fs.uuid(),
                label: fs.label(),
            }),
            _ => None,
        })
    }

    fn unsupported(&self, part: usize) -> Option<&'static str> {
        match self.slots.borrow().get(part) {
            Some(Slot::Unsupported(name)) => Some(name),
            _ => None,
        }
    }

    fn read(&self, part: usize, path: &str, limit: u64) -> Result<Vec<u8>, FsError> {
        self.with_fs(part, |fs| fs.read(path, limit))?
            .ok_or(FsError::NotFound)
    }

    fn is_file(&self, part: usize, path: &str) -> Result<bool, FsError> {
        Ok(self.with_fs(part, |fs| fs.is_file(path))?.unwrap_or(false))
    }

    fn is_dir(&self, part: usize, path: &str) -> Result<bool, FsError> {
        Ok(self.with_fs(part, |fs| fs.is_dir(path))?.unwrap_or(false))
    }

    fn list(&self, part: usize, path: &str, limit: usize) -> Result<Vec<String>, FsError> {
        self.with_fs(part, |fs| fs.list(path, limit))?
            .ok_or(FsError::NotFound)
    }
}

#[cfg(test)]
pub(crate) mod memory {
    //! [`Files`] from memory, for the loaders' tests.

    use std::collections::BTreeMap;

    use super::*;
    use crate::partitions::PartitionType;

    pub(crate) struct MemFiles {
        pub(crate) partitions: Vec<Partition>,
        pub(crate) infos: Vec<Option<FsInfo>>,
        /// (partition index, cleaned path) → contents.
        pub(crate) files: BTreeMap<(usize, String), Vec<u8>>,
    }

    impl MemFiles {
        /// `count` GPT partitions, each an ext filesystem with UUID `uuid-<n>`.
        pub(crate) fn gpt(count: u32) -> MemFiles {
            let partitions: Vec<Partition> = (1..=count)
                .map(|n| Partition {
                    number: n,
                    start: u64::from(n) << 20,
                    len: 1 << 20,
                    kind: PartitionType::Gpt {
                        type_guid: "0fc63daf-8483-4772-8e79-3d69d8477de4".into(),
                        guid: format!("guid-{n}"),
                        name: String::new(),
                        legacy_bootable: false,
                    },
                })
                .collect();
            let infos = (1..=count)
                .map(|n| {
                    Some(FsInfo {
                        kind: "ext",
                        uuid: format!("uuid-{n}"),
                        label: format!("label-{n}"),
                    })
                })
                .collect();
            MemFiles {
                partitions,
                infos,
                files: BTreeMap::new(),
            }
        }

        /// Adds a file on partition number `number` (1-based).
        pub(crate) fn file(mut self, number: u32, path: &str, contents: &str) -> Self {
            let index = self
                .partitions
                .iter()
                .position(|p| p.number == number)
                .expect("a partition of the test disk");
            self.files.insert(
                (index, crate::fs::clean(path).expect("a clean test path")),
                contents.as_bytes().to_vec(),
            );
            self
        }
    }

    impl Files for MemFiles {
        fn partitions(&self) -> &[Partition] {
            &self.partitions
        }

        fn fs_info(&self, part: usize) -> Result<Option<FsInfo>, Error> {
            Ok(self.infos.get(part).cloned().flatten())
        }

        fn unsupported(&self, _: usize) -> Option<&'static str> {
            None
        }

        fn read(&self, part: usize, path: &str, limit: u64) -> Result<Vec<u8>, FsError> {
            let path = crate::fs::clean(path)?;
            let data = self.files.get(&(part, path)).ok_or(FsError::NotFound)?;
            let size = int_cast::usize_to_u64(data.len());
            if size > limit {
                return Err(FsError::TooBig { size, limit });
            }
            Ok(data.clone())
        }

        fn is_file(&self, part: usize, path: &str) -> Result<bool, FsError> {
            let path = crate::fs::clean(path)?;
            Ok(self.files.contains_key(&(part, path)))
        }

        fn is_dir(&self, part: usize, path: &str) -> Result<bool, FsError> {
            let path = crate::fs::clean(path)?;
            let prefix = if path == "/" {
                path
            } else {
                format!("{path}/")
            };
            Ok(self
                .files
                .keys()
                .any(|(p, f)| *p == part && f.starts_with(&prefix)))
        }

        fn list(&self, part: usize, path: &str, limit: usize) -> Result<Vec<String>, FsError> {
            let path = crate::fs::clean(path)?;
            let prefix = if path == "/" {
                path
            } else {
                format!("{path}/")
            };
            let mut names: Vec<String> = self
                .files
                .keys()
                .filter(|(p, f)| *p == part && f.starts_with(&prefix))
                .filter_map(|(_, f)| f[prefix.len()..].split('/').next().map(str::to_string))
                .collect();
            names.dedup();
            if names.is_empty() && !self.is_dir(part, &prefix)? {
                return Err(FsError::NotFound);
            }
            names.truncate(limit);
            Ok(names)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::memory::MemFiles;
    use super::*;

    #[test]
    fn grub_device_names_resolve_on_the_boot_disk_only() {
        let files = MemFiles::gpt(3);
        let parts = files.partitions();
        assert_eq!(partition_by_grub_name(parts, "hd0,gpt2"), Ok(1));
        assert_eq!(partition_by_grub_name(parts, "(hd0,gpt3)"), Ok(2));
        assert_eq!(partition_by_grub_name(parts, "hd0,1"), Ok(0));
        assert!(matches!(
            partition_by_grub_name(parts, "hd0,msdos1"),
            Err(DeviceError::NoSuchPartition(_))
        ));
        assert!(matches!(
            partition_by_grub_name(parts, "hd0,gpt9"),
            Err(DeviceError::NoSuchPartition(_))
        ));
        assert!(matches!(
            partition_by_grub_name(parts, "hd1,gpt1"),
            Err(DeviceError::OtherDisk(_))
        ));
        assert!(matches!(
            partition_by_grub_name(parts, "cd0"),
            Err(DeviceError::Unsupported(_))
        ));
        assert!(matches!(
            partition_by_grub_name(parts, "hd0"),
            Err(DeviceError::NoSuchPartition(_))
        ));
    }
}
