//! Reading the Linux zero page (`struct boot_params`) the VMM left in RSI.

/// Offsets in `struct boot_params` (Linux `arch/x86/include/uapi/asm/bootparam.h`).
const EXT_CMD_LINE_PTR: usize = 0x0c8;
const E820_ENTRIES: usize = 0x1e8;
const BOOT_FLAG: usize = 0x1fe;
const HEADER: usize = 0x202;
const RAMDISK_IMAGE: usize = 0x218;
const RAMDISK_SIZE: usize = 0x21c;
const CMD_LINE_PTR: usize = 0x228;
const CMDLINE_SIZE: usize = 0x238;
const E820_TABLE: usize = 0x2d0;
const E820_MAX: usize = 128;
const E820_ENTRY_SIZE: usize = 20;
/// The command line is read up to this many bytes even if the header claims more.
const CMDLINE_MAX: usize = 4096;

pub const E820_RAM: u32 = 1;

/// A view of the zero page.
#[derive(Clone, Copy)]
pub struct BootParams {
    base: u64,
}

/// One e820 entry.
#[derive(Clone, Copy)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

impl BootParams {
    /// `base` is the address in RSI at entry; `None` if it is 0.
    pub fn new(base: u64) -> Option<Self> {
        (base != 0).then_some(Self { base })
    }

    fn read<T: Copy>(&self, offset: usize) -> T {
        // SAFETY: the zero page is 4 KiB of identity-mapped guest memory and
        // every offset used here is inside it; unaligned reads are allowed.
        unsafe { core::ptr::read_unaligned((self.base + offset as u64) as *const T) }
    }

    pub fn boot_flag(&self) -> u16 {
        self.read(BOOT_FLAG)
    }

    /// "HdrS" as a little-endian u32.
    pub fn header_magic(&self) -> u32 {
        self.read(HEADER)
    }

    /// The initrd the boot loader placed: (address, size), size 0 if none.
    pub fn initrd(&self) -> (u64, u64) {
        (
            u64::from(self.read::<u32>(RAMDISK_IMAGE)),
            u64::from(self.read::<u32>(RAMDISK_SIZE)),
        )
    }

    pub fn e820_len(&self) -> usize {
        (self.read::<u8>(E820_ENTRIES) as usize).min(E820_MAX)
    }

    pub fn e820(&self, index: usize) -> Option<E820Entry> {
        if index >= self.e820_len() {
            return None;
        }
        let at = E820_TABLE + index * E820_ENTRY_SIZE;
        Some(E820Entry {
            addr: self.read(at),
            size: self.read(at + 8),
            kind: self.read(at + 16),
        })
    }

    /// The command line, up to its NUL (empty if the pointer is 0).
    pub fn cmdline(&self) -> &'static [u8] {
        let ptr = u64::from(self.read::<u32>(CMD_LINE_PTR))
            | (u64::from(self.read::<u32>(EXT_CMD_LINE_PTR)) << 32);
        if ptr == 0 {
            return &[];
        }
        let declared = self.read::<u32>(CMDLINE_SIZE) as usize;
        let max = if declared == 0 {
            2048
        } else {
            declared.min(CMDLINE_MAX)
        };
        // SAFETY: the VMM wrote the command line into guest RAM, which is
        // identity mapped; the slice is bounded and only ever read.
        let bytes = unsafe { core::slice::from_raw_parts(ptr as *const u8, max) };
        let len = bytes.iter().position(|&b| b == 0).unwrap_or(max);
        &bytes[..len]
    }

    /// Bytes of RAM in the e820 map.
    pub fn ram_bytes(&self) -> u64 {
        (0..self.e820_len())
            .filter_map(|i| self.e820(i))
            .filter(|e| e.kind == E820_RAM)
            .fold(0u64, |sum, e| sum.saturating_add(e.size))
    }
}
