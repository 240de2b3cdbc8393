//! Guest pages on the stream: the source reads them (with zero pages sent as a count),
//! the target checks and writes them.

use std::io::{Read, Write};

use virtio_devices::GuestMemoryMmap;
use vm_memory::{
    Address, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress,
};

use crate::wire::{
    self, Decoder, Encoder, FormatError, Kind, MAX_PAGES_PER_FRAME, PAGE, WireError,
};

const PAGE_BYTES: usize = int_cast::u64_to_usize(PAGE);

/// What a batch of pages cost on the stream.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sent {
    pub(crate) pages: u64,
    pub(crate) zero_pages: u64,
    /// Everything on the stream, disk frames included.
    pub(crate) bytes: u64,
    /// Of which disk frames.
    pub(crate) disk_bytes: u64,
}

impl std::ops::AddAssign for Sent {
    fn add_assign(&mut self, other: Sent) {
        self.pages += other.pages;
        self.zero_pages += other.zero_pages;
        self.bytes += other.bytes;
        self.disk_bytes += other.disk_bytes;
    }
}

/// Every page of guest memory, in order.
pub(crate) fn all_pages(memory: &GuestMemoryMmap) -> Vec<u64> {
    memory
        .iter()
        .flat_map(|region| {
            let base = region.start_addr().raw_value();
            (0..region.len() / PAGE).map(move |page| base + page * PAGE)
        })
        .collect()
}

/// Sends `pages` (guest physical addresses of 4 KiB pages, ascending): runs of
/// consecutive pages with data as `Pages` frames, runs of all-zero pages as `ZeroPages`.
/// `after_frame` is called with the bytes of each frame (the bandwidth limit, the
/// cancellation check); its error stops the sending.
pub(crate) fn send(
    out: &mut impl Write,
    memory: &GuestMemoryMmap,
    pages: &[u64],
    after_frame: &mut dyn FnMut(u64) -> Result<(), super::MigrationError>,
) -> Result<Sent, super::MigrationError> {
    let mut sent = Sent::default();
    let mut data = Encoder::default();
    // The run being built: its first page, its page count, and whether it is zeros.
    let mut run: Option<(u64, u64, bool)> = None;
    let mut page = [0u8; PAGE_BYTES];
    for &gpa in pages {
        memory
            .read_slice(&mut page, GuestAddress(gpa))
            .map_err(|e| super::MigrationError::Memory(format!("page {gpa:#x}: {e}")))?;
        let zero = page.iter().all(|&b| b == 0);
        let continues = run.is_some_and(|(start, count, was_zero)| {
            was_zero == zero
                && start + count * PAGE == gpa
                && (zero || count < u64::from(MAX_PAGES_PER_FRAME))
                && same_region(memory, start, gpa)
        });
        if !continues && let Some(finished) = run.take() {
            sent += flush(out, finished, &mut data, after_frame)?;
        }
        match &mut run {
            Some((_, count, _)) => *count += 1,
            None => {
                run = Some((gpa, 1, zero));
                data.0.clear();
                data.u64(gpa);
                if !zero {
                    data.u32(0);
                }
            }
        }
        if !zero {
            data.bytes(&page);
        }
    }
    if let Some(finished) = run {
        sent += flush(out, finished, &mut data, after_frame)?;
    }
    Ok(sent)
}

fn same_region(memory: &GuestMemoryMmap, a: u64, b: u64) -> bool {
    match (
        memory.to_region_addr(GuestAddress(a)),
        memory.find_region(GuestAddress(b)),
    ) {
        (Some((region, _)), Some(other)) => std::ptr::eq(region, other),
        _ => false,
    }
}

fn flush(
    out: &mut impl Write,
    (_, count, zero): (u64, u64, bool),
    data: &mut Encoder,
    after_frame: &mut dyn FnMut(u64) -> Result<(), super::MigrationError>,
) -> Result<Sent, super::MigrationError> {
    let kind = if zero {
        data.u64(count);
        Kind::ZeroPages
    } else {
        // The count goes after the address, where `u32(0)` held its place.
        let count = u32::try_from(count).unwrap_or(MAX_PAGES_PER_FRAME);
        data.0[8..12].copy_from_slice(&count.to_le_bytes());
        Kind::Pages
    };
    wire::write_frame(out, kind, &data.0)?;
    let bytes = data.0.len() as u64 + 5;
    after_frame(bytes)?;
    Ok(Sent {
        pages: if zero { 0 } else { count },
        zero_pages: if zero { count } else { 0 },
        bytes,
        disk_bytes: 0,
    })
}

/// The host range of guest pages `[gpa, gpa + count × 4 KiB)`, which must lie in one
/// memory region (checked: the addresses come from the stream).
fn host_range(
    memory: &GuestMemoryMmap,
    gpa: u64,
    count: u64,
) -> Result<(*mut u8, usize), FormatError> {
    let bad = || FormatError::Invalid(format!("{count} pages at {gpa:#x} are not guest memory"));
    if !gpa.is_multiple_of(PAGE) || count == 0 {
        return Err(bad());
    }
    let len = count.checked_mul(PAGE).ok_or_else(bad)?;
    let (region, offset) = memory.to_region_addr(GuestAddress(gpa)).ok_or_else(bad)?;
    let end = offset.raw_value().checked_add(len).ok_or_else(bad)?;
    if end > region.len() {
        return Err(bad());
    }
    let host = region
        .get_host_address(MemoryRegionAddress(offset.raw_value()))
        .map_err(|_| bad())?;
    Ok((host, usize::try_from(len).map_err(|_| bad())?))
}

/// Writes a `Pages` frame's pages into guest memory.
pub(crate) fn receive_pages(memory: &GuestMemoryMmap, payload: &[u8]) -> Result<(), FormatError> {
    let mut d = Decoder::new(payload, "a pages frame");
    let gpa = d.u64()?;
    let count = d.u32()?;
    if count > MAX_PAGES_PER_FRAME {
        return Err(FormatError::TooLong {
            what: "a pages frame's page count",
            len: u64::from(count),
            max: u64::from(MAX_PAGES_PER_FRAME),
        });
    }
    host_range(memory, gpa, u64::from(count))?;
    let data = d.take(int_cast::u32_to_usize(count) * PAGE_BYTES)?;
    d.finish()?;
    memory
        .write_slice(data, GuestAddress(gpa))
        .map_err(|e| FormatError::Invalid(format!("pages at {gpa:#x}: {e}")))
}

/// Zeroes a `ZeroPages` frame's pages: their memory goes back to the host
/// (`MADV_DONTNEED` on the private anonymous mapping reads as zeros after), so an idle
/// guest's untouched memory costs the target nothing.
pub(crate) fn receive_zero_pages(
    memory: &GuestMemoryMmap,
    payload: &[u8],
) -> Result<(), FormatError> {
    let mut d = Decoder::new(payload, "a zero-pages frame");
    let gpa = d.u64()?;
    let count = d.u64()?;
    d.finish()?;
    let (host, len) = host_range(memory, gpa, count)?;
    // SAFETY: the range lies inside one region of guest memory (checked above), a
    // private anonymous mapping this VM owns; dropping its pages makes them read as
    // zeros, which is what the source had there. KVM follows through its MMU notifier.
    let rc = unsafe { libc::madvise(host.cast(), len, libc::MADV_DONTNEED) };
    if rc != 0 {
        return Err(FormatError::Invalid(format!(
            "zeroing {count} pages at {gpa:#x}: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// Reads frames until one that is not a page frame; page frames are written into
/// `memory`, and `first_page` is called before the first of them. Returns the other
/// frame's kind (its payload in `buf`).
pub(crate) fn receive_until_state(
    input: &mut impl Read,
    memory: &GuestMemoryMmap,
    buf: &mut Vec<u8>,
    first_page: &mut dyn FnMut(),
) -> Result<Kind, WireError> {
    let mut first = true;
    loop {
        let kind = wire::read_frame(input, buf)?;
        if first && matches!(kind, Kind::Pages | Kind::ZeroPages) {
            first = false;
            first_page();
        }
        match kind {
            Kind::Pages => receive_pages(memory, buf)?,
            Kind::ZeroPages => receive_zero_pages(memory, buf)?,
            other => return Ok(other),
        }
    }
}
