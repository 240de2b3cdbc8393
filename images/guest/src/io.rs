//! Port I/O and memory-mapped register access.

use core::arch::asm;

/// Writes one byte to an I/O port.
pub fn outb(port: u16, value: u8) {
    // SAFETY: port I/O has no memory effects visible to Rust.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads one byte from an I/O port.
pub fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: port I/O has no memory effects visible to Rust.
    unsafe {
        asm!("in al, dx", out("al") value, in("dx") port, options(nomem, nostack, preserves_flags))
    }
    value
}

/// Reads a 32-bit register at a physical address (identity mapped).
pub fn mmio_read32(addr: u64) -> u32 {
    // SAFETY: the caller names a device register; the VMM maps all of the low
    // 4 GiB, so the address is always mapped.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

/// Writes a 32-bit register at a physical address (identity mapped).
pub fn mmio_write32(addr: u64, value: u32) {
    // SAFETY: see `mmio_read32`.
    unsafe { core::ptr::write_volatile(addr as *mut u32, value) }
}

/// Reads one byte at a physical address (identity mapped).
pub fn mmio_read8(addr: u64) -> u8 {
    // SAFETY: see `mmio_read32`.
    unsafe { core::ptr::read_volatile(addr as *const u8) }
}

/// Writes one byte at a physical address (identity mapped).
pub fn mmio_write8(addr: u64, value: u8) {
    // SAFETY: see `mmio_read32`.
    unsafe { core::ptr::write_volatile(addr as *mut u8, value) }
}

/// Runs CPUID and returns (eax, ebx, ecx, edx).
pub fn cpuid(leaf: u32, subleaf: u32) -> (u32, u32, u32, u32) {
    // `core::arch` handles rbx, which LLVM reserves.
    let r = core::arch::x86_64::__cpuid_count(leaf, subleaf);
    (r.eax, r.ebx, r.ecx, r.edx)
}

/// This vCPU's initial APIC id (CPUID leaf 1, EBX bits 31..24).
pub fn apic_id() -> u32 {
    cpuid(1, 0).1 >> 24
}

/// Stops this vCPU for good (interrupts off).
pub fn halt_forever() -> ! {
    loop {
        // SAFETY: cli/hlt only stop this vCPU.
        unsafe { asm!("cli", "hlt", options(nomem, nostack)) }
    }
}
