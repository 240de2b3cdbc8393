//! The block copy: disks that are not shared between the two sides move inside the
//! migration stream, as KubeVirt's `BlockMigration` moves a VMI's local disks (its
//! container-disk overlays, cloud-init images, empty disks) with QEMU's incremental
//! block copy.
//!
//! Every writable disk is copied unless the caller says both sides share it
//! (`MigrationOptions::shared_disks`: then the migration is refused, see below); a
//! read-only disk stays where it is (both sides open the same image, or identical ones:
//! readers share its lock). The target's copy is its own image over the
//! same backing chain (a container-disk overlay over the same image), empty where the
//! source's top image defines nothing: the source sends what its top image defines
//! (`block::SharedDisk::defined_ranges`) in the first round, then in every round the
//! chunks the guest wrote meanwhile (`block::DirtyTracked`), the last ones while the VM
//! is paused. The target writes them through its own disk and flushes before its VM
//! runs, so that what the guest had flushed on the source is durable on the target.
//!
//! A writable disk shared by both sides (a ReadWriteMany volume) would need the image's
//! lock handed over at the switch instead; that is not built, and such a VM is refused
//! before anything is sent ([`check_shared`]): copying it onto itself would revert what
//! the guest writes meanwhile.

use std::io::Write;
use std::sync::{Arc, Weak};

use block::{DefinedRange, DirtyTracked, SharedDisk};

use super::MigrationError;
use crate::wire::{self, Decoder, Encoder, FormatError, Kind, MAX_DISK_DATA, SECTOR};

/// The VM's disks, in the configuration's order (the stream names them by index).
pub(crate) type DiskHandles = [Weak<DirtyTracked>];

/// The disk `index`, while its device lives.
fn disk(disks: &DiskHandles, index: usize) -> Result<Arc<DirtyTracked>, MigrationError> {
    disks
        .get(index)
        .and_then(Weak::upgrade)
        .ok_or_else(|| MigrationError::Disk(format!("disk {index} is closed")))
}

/// Refuses a VM with a writable disk both sides share.
pub(crate) fn check_shared(disks: &DiskHandles, shared: &[usize]) -> Result<(), MigrationError> {
    for &index in shared {
        if !disk(disks, index)?.read_only() {
            return Err(MigrationError::NotMigratable(format!(
                "disk {index} is writable and shared by both sides: its image lock cannot be \
                 handed over yet"
            )));
        }
    }
    Ok(())
}

/// The disks a migration copies: every writable one not shared.
fn copied(
    disks: &DiskHandles,
    shared: &[usize],
) -> Result<Vec<(u8, Arc<DirtyTracked>)>, MigrationError> {
    let mut out = Vec::new();
    for index in 0..disks.len() {
        let d = disk(disks, index)?;
        if !d.read_only() && !shared.contains(&index) {
            let index = u8::try_from(index)
                .map_err(|_| MigrationError::NotMigratable("more than 255 disks".into()))?;
            out.push((index, d));
        }
    }
    Ok(out)
}

/// One range of one disk to send.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DiskRange {
    disk: u8,
    range: DefinedRange,
}

/// The `Disks` frame: each disk's size and whether it is read-only.
pub(crate) fn describe(disks: &DiskHandles) -> Result<Vec<u8>, MigrationError> {
    let mut e = Encoder::default();
    e.u8(u8::try_from(disks.len())
        .map_err(|_| MigrationError::NotMigratable("more than 255 disks".into()))?);
    for index in 0..disks.len() {
        let d = disk(disks, index)?;
        e.u64(d.size());
        e.u8(u8::from(d.read_only()));
    }
    Ok(e.0)
}

/// Checks the source's `Disks` frame against this VM's disks.
pub(crate) fn check_description(payload: &[u8], disks: &DiskHandles) -> Result<(), MigrationError> {
    let mut d = Decoder::new(payload, "the disks frame");
    let count = usize::from(d.u8()?);
    if count != disks.len() {
        return Err(MigrationError::Incompatible(format!(
            "the source has {count} disks, this VM {}",
            disks.len()
        )));
    }
    for index in 0..count {
        let (size, read_only) = (d.u64()?, d.u8()?);
        let ours = disk(disks, index)?;
        if size != ours.size() || read_only != u8::from(ours.read_only()) {
            return Err(MigrationError::Incompatible(format!(
                "disk {index}: the source's has {size} bytes{}, this VM's {} bytes{}",
                if read_only != 0 { ", read-only" } else { "" },
                ours.size(),
                if ours.read_only() { ", read-only" } else { "" },
            )));
        }
    }
    d.finish()?;
    Ok(())
}

/// Turns on the dirty log of the copied disks and returns what their top images define
/// (taken after: a write in between is in both, never in neither).
pub(crate) fn start(
    disks: &DiskHandles,
    shared: &[usize],
) -> Result<Vec<DiskRange>, MigrationError> {
    let mut ranges = Vec::new();
    for (index, d) in copied(disks, shared)? {
        d.start_tracking();
        let defined = d
            .defined_ranges()
            .map_err(|e| MigrationError::Disk(format!("disk {index}: {e}")))?;
        ranges.extend(
            defined
                .into_iter()
                .map(|range| DiskRange { disk: index, range }),
        );
    }
    Ok(ranges)
}

/// Turns the dirty logs off (the migration ended, either way).
pub(crate) fn stop(disks: &DiskHandles) {
    for d in disks.iter().filter_map(Weak::upgrade) {
        d.stop_tracking();
    }
}

/// What the guest wrote to the copied disks since the last call.
pub(crate) fn take_dirty(
    disks: &DiskHandles,
    shared: &[usize],
) -> Result<Vec<DiskRange>, MigrationError> {
    let mut ranges = Vec::new();
    for (index, d) in copied(disks, shared)? {
        ranges.extend(
            d.take_dirty(MAX_DISK_DATA)
                .into_iter()
                .map(|(offset, len)| DiskRange {
                    disk: index,
                    range: DefinedRange {
                        offset,
                        len,
                        zero: false,
                    },
                }),
        );
    }
    Ok(ranges)
}

/// The bytes `ranges` hold (what sending them would cost, at most).
pub(crate) fn bytes(ranges: &[DiskRange]) -> u64 {
    ranges
        .iter()
        .filter(|r| !r.range.zero)
        .map(|r| r.range.len)
        .sum()
}

/// Sends `ranges`: data read from the disk now (all-zero pieces as `DiskZeroes`), in
/// frames of at most [`MAX_DISK_DATA`] bytes. `after_frame` as for pages. Returns the
/// bytes put on the stream.
pub(crate) fn send(
    out: &mut impl Write,
    disks: &DiskHandles,
    ranges: &[DiskRange],
    after_frame: &mut dyn FnMut(u64) -> Result<(), MigrationError>,
) -> Result<u64, MigrationError> {
    let mut sent = 0;
    let mut buf = Vec::new();
    for r in ranges {
        let mut offset = r.range.offset;
        let end = r.range.offset + r.range.len;
        while offset < end {
            let len = (end - offset).min(MAX_DISK_DATA);
            let mut e = Encoder::default();
            e.u8(r.disk);
            e.u64(offset);
            let zero = r.range.zero || {
                // Held for one read only, never across a write to the stream or the
                // bandwidth limit's sleep: a guest reboot meanwhile closes and reopens
                // the image, which must not find it still held.
                let d = disk(disks, usize::from(r.disk))?;
                buf.resize(int_cast::u64_to_usize(len), 0);
                d.read_at(&mut buf, offset)
                    .map_err(|e| MigrationError::Disk(format!("disk {}: {e}", r.disk)))?;
                buf.iter().all(|&b| b == 0)
            };
            let kind = if zero {
                e.u64(len);
                Kind::DiskZeroes
            } else {
                e.bytes(&buf);
                Kind::DiskData
            };
            wire::write_frame(out, kind, &e.0)?;
            let bytes = e.0.len() as u64 + 5;
            sent += bytes;
            after_frame(bytes)?;
            offset += len;
        }
    }
    Ok(sent)
}

/// Writes a `DiskData` or `DiskZeroes` frame into this VM's disk (checked: the disk is
/// a writable one, the range sector aligned and inside it). Returns the disk's index.
pub(crate) fn receive(
    kind: Kind,
    payload: &[u8],
    disks: &DiskHandles,
) -> Result<usize, MigrationError> {
    let mut d = Decoder::new(payload, "a disk frame");
    let index = usize::from(d.u8()?);
    let offset = d.u64()?;
    let (len, data) = match kind {
        Kind::DiskZeroes => (d.u64()?, None),
        _ => {
            let data = d.take(d.remaining())?;
            (data.len() as u64, Some(data))
        }
    };
    d.finish()?;
    let target = disks.get(index).ok_or_else(|| {
        FormatError::Invalid(format!("disk {index} of a VM with {} disks", disks.len()))
    })?;
    let target = target
        .upgrade()
        .ok_or_else(|| MigrationError::Disk(format!("disk {index} is closed")))?;
    if target.read_only() {
        return Err(FormatError::Invalid(format!(
            "disk {index} is read-only: it is shared, not copied"
        ))
        .into());
    }
    let end = offset.checked_add(len);
    let inside = end.is_some_and(|end| end <= target.size());
    // Whole sectors, but for the tail of an image whose size is not a multiple of one.
    let whole = len.is_multiple_of(SECTOR) || end == Some(target.size());
    if len == 0 || !offset.is_multiple_of(SECTOR) || !whole || !inside {
        return Err(FormatError::Invalid(format!(
            "{len} bytes at {offset} of disk {index} ({} bytes) are not whole sectors inside it",
            target.size()
        ))
        .into());
    }
    let written = match data {
        Some(data) => target.write_at(data, offset),
        // Unmapped where the format can (a raw image's hole, a qcow2 zero cluster): the
        // range reads as zeros either way, and a sparse source stays sparse here.
        None => target.write_zeroes(offset, len, true),
    };
    written.map_err(|e| MigrationError::Disk(format!("disk {index}: {e}")))?;
    Ok(index)
}

/// [`flush`] on a thread of its own, while the stream goes on.
pub(crate) fn flush_in_background(
    disks: &DiskHandles,
    written: &[bool],
) -> std::thread::JoinHandle<Result<(), MigrationError>> {
    let disks: Vec<Weak<DirtyTracked>> = disks.to_vec();
    let written = written.to_vec();
    std::thread::spawn(move || flush(&disks, &written))
}

/// Makes what was written into the copied disks durable (before the VM runs here).
pub(crate) fn flush(disks: &DiskHandles, written: &[bool]) -> Result<(), MigrationError> {
    for (index, _) in written.iter().enumerate().filter(|(_, w)| **w) {
        disk(disks, index)?
            .flush()
            .map_err(|e| MigrationError::Disk(format!("disk {index}: {e}")))?;
    }
    Ok(())
}
