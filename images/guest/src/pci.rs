//! PCI bus 0 through ECAM (the address the VMM's MCFG gives; the guest
//! uses the VMM's constant) and the legacy 0xCF8/0xCFC ports, and the
//! `pci` check: the host bridge at 00.0 and the same IDs both ways.

use crate::io::{mmio_read32, mmio_write32};
use crate::report::{Detail, Reporter};

/// ECAM base of bus 0 (the VMM's layout; also in its ACPI MCFG).
pub const ECAM: u64 = 0xe000_0000;
const CONFIG_ADDRESS: u16 = 0xcf8;
const CONFIG_DATA: u16 = 0xcfc;

/// Configuration space address of device `dev`, function 0, on bus 0.
pub fn function(dev: u8) -> u64 {
    ECAM + (u64::from(dev) << 15)
}

pub fn read32(dev: u8, reg: u64) -> u32 {
    mmio_read32(function(dev) + reg)
}

pub fn write32(dev: u8, reg: u64, value: u32) {
    mmio_write32(function(dev) + reg, value)
}

fn outl(port: u16, value: u32) {
    // SAFETY: port I/O to the VMM's PCI configuration ports.
    unsafe { core::arch::asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags)) };
}

fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: see outl.
    unsafe { core::arch::asm!("in eax, dx", in("dx") port, out("eax") value, options(nomem, nostack, preserves_flags)) };
    value
}

/// A dword of configuration space through 0xCF8/0xCFC.
pub fn legacy_read32(dev: u8, reg: u8) -> u32 {
    outl(CONFIG_ADDRESS, 0x8000_0000 | (u32::from(dev) << 11) | u32::from(reg & 0xfc));
    inl(CONFIG_DATA)
}

/// `pci`: the host bridge (class 06/00) at 00.0; every device's vendor and
/// device IDs read the same through ECAM and the legacy ports.
pub fn check(r: &mut dyn Reporter) {
    let bridge = read32(0, 0);
    let class = read32(0, 8) >> 16;
    let mut devices = 0u64;
    let mut same = true;
    for dev in 0..32u8 {
        let id = read32(dev, 0);
        same &= id == legacy_read32(dev, 0);
        if id != 0xffff_ffff {
            devices += 1;
        }
    }
    let mut d = Detail::new();
    d.str("bridge=")
        .hex(u64::from(bridge))
        .str(" class=")
        .hex(u64::from(class))
        .str(" functions=")
        .dec(devices)
        .str(" legacy=")
        .str(if same { "same" } else { "differs" });
    r.result(
        "pci",
        bridge != 0xffff_ffff && class == 0x0600 && same,
        d.as_str(),
    );
}
