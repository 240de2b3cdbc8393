//! Opening a disk by path and explicit format.

use std::path::Path;

use crate::qcow2::{BackingPolicy, Qcow2Image, Qcow2Options};
use crate::raw::RawFile;
use crate::{DiskBackend, DiskError, DiskResult};

/// Disk image formats. Always given by the caller: probing a guest-writable
/// file for its format would let a guest turn a raw disk into a qcow2 image
/// that points at host files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Raw,
    Qcow2,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Raw => "raw",
            Format::Qcow2 => "qcow2",
        }
    }
}

impl std::str::FromStr for Format {
    type Err = DiskError;
    fn from_str(s: &str) -> Result<Format, DiskError> {
        match s {
            "raw" => Ok(Format::Raw),
            "qcow2" => Ok(Format::Qcow2),
            other => Err(DiskError::UnsupportedImage(format!(
                "format {other:?} (only raw and qcow2)"
            ))),
        }
    }
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How to open a disk.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Bypass the host page cache (O_DIRECT), like QEMU's cache=none.
    pub direct: bool,
    /// Which backing file a qcow2 image may open. The default opens none:
    /// an image naming one is refused.
    pub backing: BackingPolicy,
}

/// Opens a disk image of the given format (a qcow2 image that names a
/// backing file is refused: see `open_disk_with`).
pub fn open_disk(path: &Path, format: Format, read_only: bool) -> DiskResult<Box<dyn DiskBackend>> {
    open_disk_with(
        path,
        format,
        OpenOptions {
            read_only,
            ..OpenOptions::default()
        },
    )
}

pub fn open_disk_with(
    path: &Path,
    format: Format,
    opts: OpenOptions,
) -> DiskResult<Box<dyn DiskBackend>> {
    Ok(match format {
        Format::Raw => Box::new(RawFile::open(path, opts.read_only, opts.direct)?),
        Format::Qcow2 => Box::new(Qcow2Image::open(
            path,
            Qcow2Options {
                read_only: opts.read_only,
                direct: opts.direct,
                backing: opts.backing,
                ..Qcow2Options::default()
            },
        )?),
    })
}
