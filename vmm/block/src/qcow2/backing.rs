//! Backing chains: where reads of unallocated clusters go.
//!
//! The backing file's name and format come from the image, which may be a
//! tenant's: an image that names `/etc/shadow` (or `../../x`) would let the
//! guest read any file the process can. So whether a backing file is
//! opened at all, and which one, is the caller's decision, given as a
//! [`BackingPolicy`]; the default opens none. Whatever the policy: formats
//! are never guessed, the depth is bounded, a file may not appear twice in
//! a chain, backing files are only ever opened read-only, and the memory a
//! chain's tables take is bounded ([`CHAIN_TABLE_BUDGET`]).
//!
//! Each file of a chain is opened once: a layer is a read-only
//! [`ConcurrentDisk`] that the layer above shares (`Arc`) between its
//! engine (copy-on-write) and its lock-free readers.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Qcow2Image, Qcow2Options};
use crate::host_file::HostFile;
use crate::raw::RawFile;
use crate::{ConcurrentDisk, DiskError, DiskResult, Format, OpenedFile};

/// Which backing file an image may open. The default, [`Forbid`], opens
/// none: the safe choice for images a guest or a tenant controls.
///
/// [`Forbid`]: BackingPolicy::Forbid
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum BackingPolicy {
    /// An image that names a backing file is refused.
    #[default]
    Forbid,
    /// The backing file must resolve, links followed, to a file inside
    /// `dir` (itself resolved), and is opened as `format`; an image that
    /// records another format is refused. The backing file may not name
    /// one of its own. This is the launcher's case: an overlay it made over
    /// a base it verified.
    Within { dir: PathBuf, format: Format },
    /// The backing file is `file`, which the caller opened (a PVC's base, looked up once
    /// under its own rules), as `format`; the image must name it (its recorded name,
    /// resolved, is `file.name()`). Nothing is looked up by name; the backing file may not
    /// name one of its own.
    Opened { file: OpenedFile, format: Format },
    /// What qemu-img does: follow the names and formats the images record,
    /// down the chain (formats must be recorded, never guessed). Only for
    /// tools run on the user's own images (`vmm img`), never for images
    /// from a guest or a tenant.
    FollowImage,
}

/// Most backing files below an image. Cloud Hypervisor and crosvm allow
/// 10 nested images, libvirt refuses deep chains
/// (`qemuDomainStorageSourceValidateDepth`); KubeVirt's layouts use one
/// (an overlay over its base). 16 leaves room for hand-made snapshot
/// chains while keeping the per-layer memory below bounded.
pub(crate) const MAX_CHAIN_DEPTH: usize = 16;

/// Most memory the tables read at open (L1 tables; refcount tables of
/// writable images) may take over a whole chain. QEMU caps one image's L1
/// table at 32 MiB (a 2 PiB disk with 64 KiB clusters) and its refcount
/// table at 8 MiB, but not a chain: 17 sparse files with 32 MiB L1 tables
/// would pin 544 MiB. 64 MiB holds two of the largest L1 tables; a 1 TiB
/// disk with 64 KiB clusters needs 16 KiB.
pub(crate) const CHAIN_TABLE_BUDGET: u64 = 64 << 20;

/// L2 cache of each backing layer. Backing files are read only where the
/// layers above have no data, so they get less than the top image's
/// (`DEFAULT_L2_CACHE`): 4 MiB maps 32 GiB of a 64 KiB-cluster base. With
/// [`MAX_CHAIN_DEPTH`] layers the caches of a chain stay under 64 MiB.
pub(crate) const BACKING_L2_CACHE: u64 = 4 << 20;

/// What opening one chain has taken so far.
pub(crate) struct Chain {
    /// The files opened, top first (resolved where they exist).
    files: Vec<PathBuf>,
    /// Bytes of tables read at open (see `CHAIN_TABLE_BUDGET`).
    table_bytes: u64,
}

impl Chain {
    pub(crate) fn new(top: &Path) -> Chain {
        Chain {
            files: vec![top.canonicalize().unwrap_or_else(|_| top.to_path_buf())],
            table_bytes: 0,
        }
    }

    /// Accounts for `bytes` of tables of `path`, or refuses past the budget.
    pub(crate) fn charge(&mut self, bytes: u64, path: &Path) -> DiskResult<()> {
        let total = self.table_bytes.saturating_add(bytes);
        if total > CHAIN_TABLE_BUDGET {
            return Err(DiskError::UnsupportedImage(format!(
                "{}: the backing chain's L1 and refcount tables would take {} MiB of memory, \
                 more than the {} MiB one disk may use",
                path.display(),
                total.div_ceil(1 << 20),
                CHAIN_TABLE_BUDGET >> 20
            )));
        }
        self.table_bytes = total;
        Ok(())
    }
}

/// Resolves a backing name the way QEMU does: relative names are relative to
/// the directory of the image that names them.
pub fn resolve(image_path: &Path, name: &str) -> PathBuf {
    let p = Path::new(name);
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        image_path
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join(p)
    }
}

fn refused(image_path: &Path, name: &str, why: impl std::fmt::Display) -> DiskError {
    DiskError::UnsupportedImage(format!(
        "{}: backing file {name:?} refused: {why}",
        image_path.display()
    ))
}

/// Opens the backing file `name` of `image_path` as `policy` allows,
/// read-only, with its own chain.
pub(crate) fn open(
    image_path: &Path,
    name: &str,
    recorded_format: Option<&str>,
    policy: &BackingPolicy,
    direct: bool,
    chain: &mut Chain,
) -> DiskResult<Arc<ConcurrentDisk>> {
    let recorded: Option<Format> = recorded_format.map(str::parse).transpose()?;
    let path = resolve(image_path, name);
    let mut opened = None;
    let canonical = |path: &Path| {
        path.canonicalize().map_err(|e| {
            DiskError::Io(std::io::Error::new(
                e.kind(),
                format!("backing file {}: {e}", path.display()),
            ))
        })
    };
    let (format, next) = match policy {
        BackingPolicy::Forbid => {
            return Err(refused(
                image_path,
                name,
                "this disk may not have a backing file",
            ));
        }
        BackingPolicy::Within { dir, format } => {
            if recorded.is_some_and(|r| r != *format) {
                return Err(refused(
                    image_path,
                    name,
                    format!(
                        "the image records format {}, the disk's configuration says {format}",
                        recorded_format.unwrap_or_default()
                    ),
                ));
            }
            let dir_resolved = dir.canonicalize().map_err(|e| {
                DiskError::Io(std::io::Error::new(
                    e.kind(),
                    format!("backing directory {}: {e}", dir.display()),
                ))
            })?;
            let file = canonical(&path)?;
            if !file.starts_with(&dir_resolved) {
                return Err(refused(
                    image_path,
                    name,
                    format!(
                        "it is {}, outside {}",
                        file.display(),
                        dir_resolved.display()
                    ),
                ));
            }
            (*format, BackingPolicy::Forbid)
        }
        BackingPolicy::Opened { file, format } => {
            if recorded.is_some_and(|r| r != *format) {
                return Err(refused(
                    image_path,
                    name,
                    format!(
                        "the image records format {}, the disk's configuration says {format}",
                        recorded_format.unwrap_or_default()
                    ),
                ));
            }
            if path != file.name() {
                return Err(refused(
                    image_path,
                    name,
                    format!("the disk's configuration opened {}", file.name().display()),
                ));
            }
            opened = Some(file);
            (*format, BackingPolicy::Forbid)
        }
        BackingPolicy::FollowImage => match recorded {
            Some(f) => (f, BackingPolicy::FollowImage),
            None => {
                return Err(DiskError::UnsupportedImage(format!(
                    "backing file {name:?} has no recorded format; refusing to guess \
                     (recreate the overlay with -F raw or -F qcow2)"
                )));
            }
        },
    };
    if chain.files.len() > MAX_CHAIN_DEPTH {
        return Err(DiskError::UnsupportedImage(format!(
            "backing chain deeper than {MAX_CHAIN_DEPTH}"
        )));
    }
    // The name the chain records and the path opened: an opened file is never looked up
    // by its name, only through its descriptor.
    let (name_in_chain, file) = match opened {
        Some(opened) => (opened.name().to_path_buf(), opened.path()),
        None => {
            let file = canonical(&path)?;
            (file.clone(), file)
        }
    };
    if chain.files.contains(&name_in_chain) {
        return Err(DiskError::Corrupt(format!(
            "backing chain loops back to {}",
            name_in_chain.display()
        )));
    }
    chain.files.push(name_in_chain);
    let layer = match format {
        Format::Raw => ConcurrentDisk::from_raw(RawFile::open(&file, true, direct)?)?,
        Format::Qcow2 => {
            let opts = Qcow2Options {
                read_only: true,
                direct,
                l2_cache_bytes: BACKING_L2_CACHE,
                // Read-only: nothing is allocated, no refcount is read.
                refcount_cache_bytes: 0,
                backing: next,
            };
            let host = HostFile::open(&file, false, direct)?;
            let image = Qcow2Image::open_in_chain(host, &file, opts, chain, true)?;
            ConcurrentDisk::from_qcow2(image)?
        }
    };
    Ok(Arc::new(layer))
}
