//! Mapping lookups for callers that do the data I/O themselves
//! (`crate::concurrent`): the lookup runs under the caller's lock, the data
//! transfer outside it.

use std::path::PathBuf;

use super::Qcow2Image;
use super::tables::Mapping;
use crate::host_file::DataHandle;
use crate::{DiskResult, Format};

/// Where the first bytes of a request live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Extent {
    /// Plain data at this host offset, contiguous for the whole extent.
    /// For a write: clusters this image owns alone, so no metadata changes.
    Host(u64),
    /// Reads as zeroes.
    Zero,
    /// Not allocated here: the backing chain's bytes (zeroes without one).
    Backing,
    /// Needs the engine itself (allocation, copy-on-write, compression).
    Engine,
}

impl Qcow2Image {
    fn extent_of(m: Mapping, write: bool) -> Extent {
        match (m, write) {
            (Mapping::Data { host, copied: true }, true) => Extent::Host(host),
            (_, true) => Extent::Engine,
            (Mapping::Data { host, .. }, false) => Extent::Host(host),
            (Mapping::Zero { .. }, false) => Extent::Zero,
            (Mapping::Unallocated, false) => Extent::Backing,
            (Mapping::Compressed { .. }, false) => Extent::Engine,
        }
    }

    /// The kind of the first bytes of `[offset, offset + len)` and how many
    /// bytes (at least one, at most `len`) share it. The range must lie in
    /// the disk and `len` must not be 0.
    pub(crate) fn map_extent(
        &mut self,
        offset: u64,
        len: u64,
        write: bool,
    ) -> DiskResult<(Extent, u64)> {
        let cs = self.cluster_size;
        let vc = offset >> self.cluster_bits;
        let in_off = offset & self.cluster_mask();
        let first = Self::extent_of(self.mapping(vc)?, write);
        let mut n = (cs - in_off).min(len);
        // Compressed clusters are read one at a time by the engine.
        let extends = first != Extent::Engine || write;
        while extends && n < len {
            let k = (in_off + n) >> self.cluster_bits;
            let next = Self::extent_of(self.mapping(vc + k)?, write);
            let same = match (first, next) {
                (Extent::Host(h), Extent::Host(h2)) => h2 == h + k * cs,
                (a, b) => a == b,
            };
            if !same {
                break;
            }
            n += cs.min(len - n);
        }
        let first = match first {
            Extent::Host(h) => Extent::Host(h + in_off),
            other => other,
        };
        Ok((first, n))
    }

    pub(crate) fn data_handle(&self) -> DiskResult<DataHandle> {
        Ok(self.file.data_handle()?)
    }

    /// Path and format of the backing file, resolved like `backing::open`.
    pub(crate) fn backing_location(&self) -> DiskResult<Option<(PathBuf, Format)>> {
        match (&self.header.backing_file, &self.backing) {
            (Some(name), Some(_)) => {
                let format: Format = self
                    .header
                    .backing_format
                    .as_deref()
                    .unwrap_or_default()
                    .parse()?;
                Ok(Some((super::backing::resolve(&self.path, name), format)))
            }
            _ => Ok(None),
        }
    }
}
