//! Loading a kernel and writing what the Linux 64-bit boot protocol expects
//! to find in guest memory: the command line, an optional initrd and the zero
//! page with the e820 map.

use std::fs::File;
use std::io::Cursor;

use linux_loader::cmdline::Cmdline;
use linux_loader::configurator::linux::LinuxBootConfigurator;
use linux_loader::configurator::{BootConfigurator, BootParams};
use linux_loader::loader::bootparam::{boot_e820_entry, boot_params, setup_header};
use linux_loader::loader::{BzImage, Elf, KernelLoader, load_cmdline};
use virtio_devices::GuestMemoryMmap;
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::layout::*;
use super::{Error, Result};
use crate::config::{KernelDecompress, KernelSource};

const BOOT_FLAG_MAGIC: u16 = 0xaa55;
const HEADER_MAGIC: u32 = 0x5372_6448; // "HdrS"
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
const E820_RAM: u32 = 1;
const E820_RESERVED: u32 = 2;
/// bzImage: the 64-bit entry point is 0x200 bytes into the protected-mode kernel.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// Where the setup header starts in a bzImage.
const SETUP_HEADER_OFFSET: usize = 0x1f1;
/// `loadflags` bit: the boot loader may use the heap (set by every modern loader).
const CAN_USE_HEAP: u8 = 0x80;
const PAGE_SIZE: u64 = 0x1000;

/// Where the kernel starts running.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KernelEntry {
    pub(crate) entry: GuestAddress,
    /// First byte after the kernel image (its `.bss` included).
    pub(crate) end: u64,
}

/// The kernel to load: as the configuration names it, or already read and prepared
/// (a boot disk's, see `crate::boot_disk`).
pub(crate) enum KernelInput<'a> {
    Source(&'a KernelSource, KernelDecompress),
    Prepared(&'a Prepared),
}

/// The initrd to load, if any.
pub(crate) enum InitrdInput<'a> {
    None,
    File(&'a std::path::Path),
    Bytes(&'a [u8]),
}

/// Loads the kernel (an ELF `vmlinux` or a `bzImage`, recognised by the ELF
/// magic) and fills the zero page, command line and initrd. A bzImage's
/// payload is decompressed here unless `decompress` leaves that to the
/// guest (see [`super::kernel_image`]). Returns the entry point.
pub(crate) fn load(
    mem: &GuestMemoryMmap,
    kernel: KernelInput<'_>,
    cmdline: &Cmdline,
    initrd: InitrdInput<'_>,
    acpi_rsdp: u64,
) -> Result<KernelEntry> {
    let (entry, header) = match kernel {
        KernelInput::Source(KernelSource::Path(path), decompress) => {
            load_kernel_file(mem, path, decompress)?
        }
        KernelInput::Source(KernelSource::Bytes(bytes), decompress) => {
            load_kernel(mem, bytes, decompress)?
        }
        KernelInput::Source(KernelSource::Disk(_), _) => {
            return Err(Error::KernelNotRead);
        }
        KernelInput::Prepared(prepared) => load_prepared(mem, prepared)?,
    };

    let mut params = boot_params::default();
    if let Some(header) = header {
        // bzImage: start from the kernel's own setup header.
        params.hdr = header;
    }
    params.hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    params.hdr.boot_flag = BOOT_FLAG_MAGIC;
    params.hdr.header = HEADER_MAGIC;
    params.hdr.loadflags |= CAN_USE_HEAP;
    params.hdr.heap_end_ptr = 0xfe00;
    params.hdr.cmd_line_ptr = const { int_cast::u32_of_u64(CMDLINE_ADDR) };
    let cmdline_len = cmdline
        .as_cstring()
        .map_err(Error::Cmdline)?
        .as_bytes_with_nul()
        .len();
    params.hdr.cmdline_size =
        u32::try_from(cmdline_len).map_err(|_| Error::CmdlineTooLong(cmdline_len))?;
    load_cmdline(mem, GuestAddress(CMDLINE_ADDR), cmdline).map_err(Error::CmdlineLoad)?;

    let placed = match initrd {
        InitrdInput::None => None,
        InitrdInput::File(path) => Some(load_initrd_file(mem, path, &params.hdr, entry.end)?),
        InitrdInput::Bytes(bytes) => Some(load_initrd_bytes(mem, bytes, &params.hdr, entry.end)?),
    };
    if let Some((addr, size)) = placed {
        // The initrd is placed below the kernel's initrd_addr_max (a u32).
        params.hdr.ramdisk_image = u32::try_from(addr).map_err(|_| Error::InitrdTooBig(size))?;
        params.hdr.ramdisk_size = u32::try_from(size).map_err(|_| Error::InitrdTooBig(size))?;
    }

    // Boot protocol 2.14: where the ACPI tables start (Linux also scans
    // the BIOS area, where they are).
    params.acpi_rsdp_addr = acpi_rsdp;
    add_e820_map(mem, &mut params)?;
    LinuxBootConfigurator::write_bootparams::<GuestMemoryMmap>(
        &BootParams::new::<boot_params>(&params, GuestAddress(ZERO_PAGE_ADDR)),
        mem,
    )
    .map_err(Error::BootParams)?;
    Ok(entry)
}

/// A kernel image read into memory and made ready to load: an ELF, the ELF inside a
/// bzImage (decompressed here, on the caller's thread) with the image's setup header, or
/// a bzImage left for the guest to decompress.
pub(crate) enum Prepared {
    Elf(Vec<u8>),
    Decompressed {
        elf: Vec<u8>,
        header: Option<setup_header>,
    },
    BzImage(Vec<u8>),
}

/// Prepares `image` for [`load`]: decompresses a bzImage's payload unless `decompress`
/// leaves that to the guest, into at most `guest_memory` bytes. Touches no guest memory,
/// so it can run on a sandboxed thread of its own (the boot disk's).
pub(crate) fn prepare(
    image: Vec<u8>,
    decompress: KernelDecompress,
    guest_memory: u64,
) -> Result<Prepared> {
    if image.starts_with(b"\x7fELF") {
        return Ok(Prepared::Elf(image));
    }
    if decompress == KernelDecompress::Guest {
        return Ok(Prepared::BzImage(image));
    }
    let header = setup_header_of(&image);
    let elf = decompress_payload(&image, guest_memory)?;
    Ok(Prepared::Decompressed { elf, header })
}

fn load_prepared(
    mem: &GuestMemoryMmap,
    prepared: &Prepared,
) -> Result<(KernelEntry, Option<setup_header>)> {
    match prepared {
        Prepared::Elf(elf) => Ok((load_elf(mem, &mut Cursor::new(&elf[..]))?, None)),
        Prepared::Decompressed { elf, header } => {
            Ok((load_elf(mem, &mut Cursor::new(&elf[..]))?, *header))
        }
        Prepared::BzImage(image) => load_kernel(mem, image, KernelDecompress::Guest),
    }
}

fn setup_header_of(image: &[u8]) -> Option<setup_header> {
    image
        .get(SETUP_HEADER_OFFSET..SETUP_HEADER_OFFSET + std::mem::size_of::<setup_header>())
        .and_then(|bytes| setup_header::from_slice(bytes).copied())
}

/// The ELF kernel inside a bzImage, decompressed on the host (at most the guest's memory).
fn decompress_payload(image: &[u8], guest_memory: u64) -> Result<Vec<u8>> {
    let payload = super::kernel_image::payload(image)?;
    let started = std::time::Instant::now();
    let limit = super::kernel_image::kernel_limit(guest_memory);
    let vmlinux = super::kernel_image::decompress(&payload, limit)?;
    tracing::debug!(
        "bzImage: {} payload of {} bytes decompressed to {} in {:?}",
        payload.compression.name(),
        payload.data.len(),
        vmlinux.len(),
        started.elapsed()
    );
    if !vmlinux.starts_with(b"\x7fELF") {
        return Err(Error::PayloadNotElf);
    }
    Ok(vmlinux)
}

/// A kernel file: an ELF kernel's segments are read from the file straight into
/// guest memory (no copy of the whole image on the heap: a stock vmlinux is tens of
/// MiB); a bzImage is read whole, its payload is parsed and perhaps decompressed.
fn load_kernel_file(
    mem: &GuestMemoryMmap,
    path: &std::path::Path,
    decompress: KernelDecompress,
) -> Result<(KernelEntry, Option<setup_header>)> {
    use std::io::{Read, Seek, SeekFrom};
    let file_err = |e| Error::KernelFile(path.to_path_buf(), e);
    let mut file = File::open(path).map_err(file_err)?;
    let mut magic = [0u8; 4];
    let magic_len = file.read(&mut magic).map_err(file_err)?;
    file.seek(SeekFrom::Start(0)).map_err(file_err)?;
    if magic_len == magic.len() && &magic == b"\x7fELF" {
        return Ok((load_elf(mem, &mut file)?, None));
    }
    let mut image = Vec::new();
    file.read_to_end(&mut image).map_err(file_err)?;
    load_kernel(mem, &image, decompress)
}

fn load_kernel(
    mem: &GuestMemoryMmap,
    image: &[u8],
    decompress: KernelDecompress,
) -> Result<(KernelEntry, Option<setup_header>)> {
    if image.starts_with(b"\x7fELF") {
        return Ok((load_elf(mem, &mut Cursor::new(image))?, None));
    }
    let header = setup_header_of(image);
    if decompress == KernelDecompress::Host {
        let ram = mem.iter().map(|r| r.len()).sum();
        let vmlinux = decompress_payload(image, ram)?;
        return Ok((load_elf(mem, &mut Cursor::new(&vmlinux[..]))?, header));
    }
    let loaded = BzImage::load(
        mem,
        None,
        &mut Cursor::new(image),
        Some(GuestAddress(HIMEM_START)),
    )
    .map_err(Error::KernelLoad)?;
    // The kernel decompresses itself in place and needs `init_size`
    // bytes from its load address, more than the file holds.
    let init_size = loaded.setup_header.map_or(0, |h| u64::from(h.init_size));
    let end = loaded
        .kernel_end
        .max(loaded.kernel_load.raw_value().saturating_add(init_size));
    check_kernel_fits(mem, loaded.kernel_load.raw_value(), end)?;
    let entry = loaded
        .kernel_load
        .checked_add(BZIMAGE_64BIT_ENTRY_OFFSET)
        .ok_or(Error::KernelEntryOverflow)?;
    Ok((KernelEntry { entry, end }, loaded.setup_header))
}

/// An ELF kernel, its segments at their physical addresses.
fn load_elf<F>(mem: &GuestMemoryMmap, image: &mut F) -> Result<KernelEntry>
where
    F: std::io::Read + std::io::Seek + vm_memory::ReadVolatile,
{
    let loaded =
        Elf::load(mem, None, image, Some(GuestAddress(HIMEM_START))).map_err(Error::KernelLoad)?;
    check_kernel_fits(mem, loaded.kernel_load.raw_value(), loaded.kernel_end)?;
    Ok(KernelEntry {
        entry: loaded.kernel_load,
        end: loaded.kernel_end,
    })
}

/// The entry point and the end of the image (bss included) must be in RAM.
fn check_kernel_fits(mem: &GuestMemoryMmap, entry: u64, end: u64) -> Result<()> {
    if !mem.address_in_range(GuestAddress(entry)) {
        return Err(Error::KernelEntryOutside(entry));
    }
    let last = end.saturating_sub(1);
    if !mem.address_in_range(GuestAddress(last)) {
        return Err(Error::KernelPastMemory(end));
    }
    Ok(())
}

/// Where an initrd of `size` bytes goes: as high as the kernel allows
/// (`initrd_addr_max`, below the MMIO hole), page aligned, above the kernel.
fn place_initrd(
    mem: &GuestMemoryMmap,
    size: u64,
    hdr: &setup_header,
    kernel_end: u64,
) -> Result<u64> {
    let lowmem_end = mem
        .iter()
        .next()
        .map(|r| r.start_addr().raw_value() + r.len())
        .unwrap_or(0);
    // An ELF kernel has no setup header: assume the protocol's 2.03+ default.
    let addr_max = if hdr.initrd_addr_max != 0 {
        u64::from(hdr.initrd_addr_max)
    } else {
        0x37ff_ffff
    };
    let top = lowmem_end.min(addr_max.saturating_add(1));
    let start = top.checked_sub(size).map(|s| s & !(PAGE_SIZE - 1));
    start
        .filter(|&s| s >= kernel_end.max(HIMEM_START))
        .ok_or(Error::InitrdTooBig(size))
}

/// Loads the initrd file at `path`. Returns (address, size).
fn load_initrd_file(
    mem: &GuestMemoryMmap,
    path: &std::path::Path,
    hdr: &setup_header,
    kernel_end: u64,
) -> Result<(u64, u64)> {
    let mut file = File::open(path).map_err(|e| Error::InitrdFile(path.to_path_buf(), e))?;
    let size = file
        .metadata()
        .map_err(|e| Error::InitrdFile(path.to_path_buf(), e))?
        .len();
    let start = place_initrd(mem, size, hdr, kernel_end)?;
    mem.read_exact_volatile_from(GuestAddress(start), &mut file, int_cast::u64_to_usize(size))
        .map_err(Error::InitrdLoad)?;
    Ok((start, size))
}

/// Loads an initrd already in memory. Returns (address, size).
fn load_initrd_bytes(
    mem: &GuestMemoryMmap,
    bytes: &[u8],
    hdr: &setup_header,
    kernel_end: u64,
) -> Result<(u64, u64)> {
    let size = int_cast::usize_to_u64(bytes.len());
    let start = place_initrd(mem, size, hdr, kernel_end)?;
    mem.write_slice(bytes, GuestAddress(start))
        .map_err(Error::InitrdLoad)?;
    Ok((start, size))
}

/// e820: RAM below the EBDA, RAM from 1 MiB to the end of each region, and
/// PCI's configuration space reserved.
fn add_e820_map(mem: &GuestMemoryMmap, params: &mut boot_params) -> Result<()> {
    let mut entries = vec![boot_e820_entry {
        addr: 0,
        size: EBDA_START,
        r#type: E820_RAM,
    }];
    for region in mem.iter() {
        let start = region.start_addr().raw_value().max(HIMEM_START);
        let end = region.start_addr().raw_value() + region.len();
        if end > start {
            entries.push(boot_e820_entry {
                addr: start,
                size: end - start,
                r#type: E820_RAM,
            });
        }
    }
    // Only PCI's ECAM is reserved (Linux wants MMCONFIG reserved before
    // using it); the rest of the hole is not RAM and stays free for the PCI
    // window the DSDT announces, as on QEMU's q35.
    entries.push(boot_e820_entry {
        addr: PCI_ECAM_BASE,
        size: PCI_ECAM_SIZE,
        r#type: E820_RESERVED,
    });
    if entries.len() > params.e820_table.len() {
        return Err(Error::TooManyE820Entries);
    }
    for (slot, entry) in params.e820_table.iter_mut().zip(&entries) {
        *slot = *entry;
    }
    params.e820_entries = u8::try_from(entries.len()).map_err(|_| Error::TooManyE820Entries)?;
    Ok(())
}

/// Writes the GDT, an empty IDT and identity page tables for the low 4 GiB.
pub(crate) fn write_long_mode_tables(mem: &GuestMemoryMmap) -> Result<()> {
    let write = |addr: u64, value: u64| {
        mem.write_obj(value, GuestAddress(addr))
            .map_err(|source| Error::GuestWrite {
                what: "the long-mode tables",
                source,
            })
    };
    for (i, entry) in super::cpu::GDT.iter().enumerate() {
        write(GDT_ADDR + 8 * i as u64, *entry)?;
    }
    write(IDT_ADDR, 0)?;
    // PML4[0] -> PDPT; PDPT[i] -> PD i; each PD maps 1 GiB with 2 MiB pages.
    const PRESENT_WRITABLE: u64 = 0x3;
    const HUGE_PAGE: u64 = 0x80;
    write(PML4_ADDR, PDPT_ADDR | PRESENT_WRITABLE)?;
    for pd in 0..PD_COUNT {
        let pd_addr = PD_ADDR + pd * 0x1000;
        write(PDPT_ADDR + pd * 8, pd_addr | PRESENT_WRITABLE)?;
        for i in 0..512u64 {
            let phys = (pd << 30) | (i << 21);
            write(pd_addr + i * 8, phys | HUGE_PAGE | PRESENT_WRITABLE)?;
        }
    }
    Ok(())
}
