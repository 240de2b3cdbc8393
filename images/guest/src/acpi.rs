//! ACPI as the VMM builds it: the RSDP in the BIOS area, the XSDT and its
//! tables (checksums, the hardware-reduced FADT and its sleep control
//! register, a MADT entry per vCPU), the power button (the GED's interrupt
//! and status port) and power-off through S5.

use crate::io::{inb, mmio_read8, mmio_read32, outb};
use crate::report::{Detail, Reporter};

/// The GED's interrupt (IOAPIC pin, level-triggered, active high) and
/// status port, as the VMM's DSDT declares them (AML is not interpreted
/// here).
pub const GED_PIN: u32 = 23;
const GED_STATUS_PORT: u16 = 0x608;
const GED_POWER_BUTTON: u8 = 1;
/// `_S5` sleep type and SLP_EN.
const SLP_TYP_S5: u8 = 5;
const SLP_EN: u8 = 1 << 5;
const FADT_HW_REDUCED: u32 = 1 << 20;

fn read64(addr: u64) -> u64 {
    u64::from(mmio_read32(addr)) | u64::from(mmio_read32(addr + 4)) << 32
}

fn sum(addr: u64, len: u64) -> u8 {
    (0..len).fold(0u8, |s, i| s.wrapping_add(mmio_read8(addr + i)))
}

/// The RSDP's address, found where Linux looks (0xE0000-0xFFFFF).
fn rsdp() -> Option<u64> {
    (0xe_0000u64..0x10_0000)
        .step_by(16)
        .find(|&a| mmio_read32(a) == u32::from_le_bytes(*b"RSD ") && mmio_read32(a + 4) == u32::from_le_bytes(*b"PTR "))
}

/// The tables the XSDT lists: (signature, address), at most 8.
fn tables() -> Option<([(u32, u64); 8], usize)> {
    let rsdp = rsdp()?;
    if sum(rsdp, 20) != 0 || sum(rsdp, 36) != 0 {
        return None;
    }
    let xsdt = read64(rsdp + 24);
    let len = u64::from(mmio_read32(xsdt + 4));
    if mmio_read32(xsdt) != u32::from_le_bytes(*b"XSDT") || len > 0x1000 || sum(xsdt, len) != 0 {
        return None;
    }
    let mut out = [(0u32, 0u64); 8];
    let mut n = 0;
    for i in 0..((len - 36) / 8).min(8) {
        let addr = read64(xsdt + 36 + 8 * i);
        out[n] = (mmio_read32(addr), addr);
        n += 1;
    }
    Some((out, n))
}

fn find(signature: &[u8; 4]) -> Option<u64> {
    let (list, n) = tables()?;
    list[..n]
        .iter()
        .find(|t| t.0 == u32::from_le_bytes(*signature))
        .map(|t| t.1)
}

/// The I/O port of the FADT's sleep control register.
fn sleep_control_port() -> Option<u16> {
    let fadt = find(b"FACP")?;
    // sleep_control_reg: a GAS at offset 244; space 1 (system I/O), address at +4.
    (mmio_read8(fadt + 244) == 1).then(|| read64(fadt + 248) as u16)
}

/// `acpi`: RSDP and XSDT valid, every table's checksum right, FADT
/// hardware-reduced with a sleep control register, DSDT and MADT present
/// (one local APIC per vCPU); prints the signatures.
pub fn check(r: &mut dyn Reporter, cpus: u32) {
    let Some((list, n)) = tables() else {
        r.result("acpi", false, "no valid RSDP/XSDT in 0xe0000-0xfffff");
        return;
    };
    let mut d = Detail::new();
    d.str("tables=");
    let mut ok = true;
    for &(signature, addr) in &list[..n] {
        let bytes = signature.to_le_bytes();
        d.str(core::str::from_utf8(&bytes).unwrap_or("????")).str(",");
        let len = u64::from(mmio_read32(addr + 4));
        ok &= len <= 0x1_0000 && sum(addr, len) == 0;
    }
    let fadt = find(b"FACP");
    let hw_reduced = fadt.is_some_and(|f| mmio_read32(f + 112) & FADT_HW_REDUCED != 0);
    let dsdt = fadt.map(|f| read64(f + 140)).filter(|&a| mmio_read32(a) == u32::from_le_bytes(*b"DSDT"));
    ok &= hw_reduced && dsdt.is_some_and(|a| sum(a, u64::from(mmio_read32(a + 4))) == 0);
    let mut lapics = 0u64;
    if let Some(madt) = find(b"APIC") {
        let len = u64::from(mmio_read32(madt + 4)).min(0x1000);
        let mut at = madt + 44;
        while at + 2 <= madt + len {
            let (kind, entry_len) = (mmio_read8(at), u64::from(mmio_read8(at + 1)));
            if kind == 0 && mmio_read8(at + 4) & 1 != 0 {
                lapics += 1;
            }
            if entry_len == 0 {
                break;
            }
            at += entry_len;
        }
    }
    ok &= lapics == u64::from(cpus) && sleep_control_port().is_some();
    d.str(" hw_reduced=")
        .dec(u64::from(hw_reduced))
        .str(" lapics=")
        .dec(lapics)
        .str(" sleep_port=")
        .hex(u64::from(sleep_control_port().unwrap_or(0)));
    r.result("acpi", ok, d.as_str());
}

/// Enables the power button: routes the GED's interrupt (unmasks its
/// IOAPIC pin) level-triggered, as the DSDT's `_CRS` says and as Linux's
/// GED driver does when it probes.
pub fn enable_power_button() {
    crate::irq::route_level(GED_PIN);
}

/// Whether the GED reports a power-button press (reading clears it).
/// Called once the GED interrupted: opens its pin again, which the
/// interrupt handler masked (the line is a level, up while the status has
/// a bit set).
pub fn power_button_pressed() -> bool {
    let pressed = inb(GED_STATUS_PORT) & GED_POWER_BUTTON != 0;
    crate::irq::unmask(GED_PIN);
    pressed
}

/// Enters S5 through the FADT's sleep control register. Returns only if
/// the VMM did not power off.
pub fn power_off() {
    if let Some(port) = sleep_control_port() {
        outb(port, (SLP_TYP_S5 << 2) | SLP_EN);
    }
}
