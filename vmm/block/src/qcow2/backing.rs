//! Backing chains: where reads of unallocated clusters go.
//!
//! The backing file's name comes from the image (untrusted), so: the format
//! must be recorded explicitly, the chain depth is bounded, a file may not
//! appear twice in a chain, and backing files are only ever opened read-only.

use std::path::{Path, PathBuf};

use super::{Qcow2Image, Qcow2Options};
use crate::raw::RawFile;
use crate::{DiskBackend, DiskError, DiskResult, Format};

/// Longest chain we follow (the image itself not counted).
pub const MAX_CHAIN_DEPTH: usize = 32;

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

/// Opens the backing file of `image_path`, read-only, and its own chain.
pub fn open(
    image_path: &Path,
    name: &str,
    format: Option<&str>,
    opts: &Qcow2Options,
    chain: &mut Vec<PathBuf>,
) -> DiskResult<Box<dyn DiskBackend>> {
    let format: Format = match format {
        Some(f) => f.parse()?,
        None => {
            return Err(DiskError::UnsupportedImage(format!(
                "backing file {name:?} has no recorded format; refusing to guess \
                 (recreate the overlay with -F raw or -F qcow2)"
            )));
        }
    };
    if chain.len() > MAX_CHAIN_DEPTH {
        return Err(DiskError::UnsupportedImage(format!(
            "backing chain deeper than {MAX_CHAIN_DEPTH}"
        )));
    }
    let path = resolve(image_path, name);
    let canonical = path.canonicalize().map_err(|e| {
        DiskError::Io(std::io::Error::new(
            e.kind(),
            format!("backing file {}: {e}", path.display()),
        ))
    })?;
    if chain.contains(&canonical) {
        return Err(DiskError::Corrupt(format!(
            "backing chain loops back to {}",
            canonical.display()
        )));
    }
    chain.push(canonical.clone());
    Ok(match format {
        Format::Raw => Box::new(RawFile::open(&canonical, true, opts.direct)?),
        Format::Qcow2 => {
            let sub = Qcow2Options {
                read_only: true,
                ..*opts
            };
            Box::new(Qcow2Image::open_in_chain(&canonical, sub, chain)?)
        }
    })
}
