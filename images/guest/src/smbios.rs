//! `smbios`: the SMBIOS tables as Linux's `dmi_scan` finds them without EFI: the 64-bit
//! entry point (`_SM3_`) on a 16-byte boundary in 0xF0000-0xFFFFF, its checksum, then the
//! structures walked by their length bytes and string sets up to type 127 (bounded by the
//! table size the entry point gives and a structure count). Prints the system record's
//! strings and UUID, the enabled cores of the processor records and the memory of the
//! memory devices, which must match the mapped address ranges.

use crate::io::{mmio_read8, mmio_read32};
use crate::report::{Detail, Reporter};

const SCAN_START: u64 = 0xf_0000;
const SCAN_END: u64 = 0x10_0000;
/// Largest structure table walked, and most structures.
const MAX_TABLE: u64 = 0x1_0000;
const MAX_STRUCTURES: u32 = 1024;
/// Most bytes of a string printed.
const MAX_PRINTED: u64 = 40;

fn read16(addr: u64) -> u64 {
    u64::from(mmio_read8(addr)) | u64::from(mmio_read8(addr + 1)) << 8
}

fn read64(addr: u64) -> u64 {
    u64::from(mmio_read32(addr)) | u64::from(mmio_read32(addr + 4)) << 32
}

fn sum(addr: u64, len: u64) -> u8 {
    (0..len).fold(0u8, |s, i| s.wrapping_add(mmio_read8(addr + i)))
}

/// The `_SM3_` anchor's address, where Linux looks for it (it reads 32 bytes there).
fn entry_point() -> Option<u64> {
    (SCAN_START..SCAN_END - 32)
        .step_by(16)
        .find(|&a| mmio_read32(a) == u32::from_le_bytes(*b"_SM3") && mmio_read8(a + 4) == b'_')
}

/// The first byte after the string set that starts at `at` (its double NUL), or None if it
/// runs past `end`.
fn after_strings(at: u64, end: u64) -> Option<u64> {
    let mut p = at;
    // A structure without strings ends with two NULs too.
    while p + 1 < end {
        if mmio_read8(p) == 0 && mmio_read8(p + 1) == 0 {
            return Some(p + 2);
        }
        p += 1;
    }
    None
}

/// Appends string number `n` of the structure at `at` (formatted length `len`); nothing
/// for number 0. Non-printable bytes and spaces become '_' so the line stays parseable.
fn string(d: &mut Detail, at: u64, len: u64, n: u8, end: u64) {
    if n == 0 {
        return;
    }
    let mut p = at + len;
    for _ in 1..n {
        while p < end && mmio_read8(p) != 0 {
            p += 1;
        }
        p += 1;
    }
    let mut printed = 0;
    while p < end && printed < MAX_PRINTED {
        let b = mmio_read8(p);
        if b == 0 {
            break;
        }
        d.bytes(&[if b.is_ascii_graphic() { b } else { b'_' }]);
        p += 1;
        printed += 1;
    }
}

fn hex2(d: &mut Detail, b: u8) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    d.bytes(&[DIGITS[usize::from(b >> 4)], DIGITS[usize::from(b & 0xf)]]);
}

/// The UUID in canonical text: SMBIOS 2.6+ stores its first three fields little-endian.
fn uuid(d: &mut Detail, at: u64) {
    const ORDER: [u8; 16] = [3, 2, 1, 0, 5, 4, 7, 6, 8, 9, 10, 11, 12, 13, 14, 15];
    for (i, &o) in ORDER.iter().enumerate() {
        if i == 4 || i == 6 || i == 8 || i == 10 {
            d.str("-");
        }
        hex2(d, mmio_read8(at + u64::from(o)));
    }
}

/// What the walk found.
#[derive(Default)]
struct Found {
    /// The system record (type 1): address and formatted length.
    system: Option<(u64, u64)>,
    processors: u64,
    cores: u64,
    memory_mib: u64,
    mapped_kib: u64,
    ended: bool,
}

/// Walks the structures; Err(reason) for a malformed table.
fn walk(table: u64, end: u64) -> Result<Found, &'static str> {
    let mut f = Found::default();
    let mut at = table;
    for _ in 0..MAX_STRUCTURES {
        if at + 4 > end {
            return Err("structures run past the table");
        }
        let kind = mmio_read8(at);
        let len = u64::from(mmio_read8(at + 1));
        if len < 4 || at + len > end {
            return Err("a structure has a bad length");
        }
        match kind {
            1 if len >= 0x1b => f.system = Some((at, len)),
            4 => {
                f.processors += 1;
                let mut cores = if len > 0x24 {
                    u64::from(mmio_read8(at + 0x24))
                } else {
                    1
                };
                if cores == 0xff && len >= 0x2e {
                    cores = read16(at + 0x2c);
                }
                f.cores += cores;
            }
            17 if len >= 0x0e => {
                let size = read16(at + 0x0c);
                f.memory_mib += match size {
                    0 | 0xffff => 0,
                    0x7fff if len >= 0x20 => u64::from(mmio_read32(at + 0x1c) & 0x7fff_ffff),
                    s if s & 0x8000 != 0 => (s & 0x7fff) >> 10,
                    s => s,
                };
            }
            19 if len >= 0x0f => {
                let (start, end_kib) = (mmio_read32(at + 4), mmio_read32(at + 8));
                f.mapped_kib += if start == 0xffff_ffff && len >= 0x1f {
                    (read64(at + 0x17).saturating_sub(read64(at + 0x0f)) + 1) >> 10
                } else {
                    u64::from(end_kib).saturating_sub(u64::from(start)) + 1
                };
            }
            _ => {}
        }
        if kind == 127 {
            f.ended = true;
            return Ok(f);
        }
        at = after_strings(at + len, end).ok_or("a string set runs past the table")?;
    }
    Err("too many structures")
}

pub fn check(r: &mut dyn Reporter) {
    let Some(ep) = entry_point() else {
        r.result("smbios", false, "no _SM3_ entry point in 0xf0000-0xfffff");
        return;
    };
    let ep_len = u64::from(mmio_read8(ep + 6));
    let mut d = Detail::new();
    if ep_len < 0x18 || ep_len > 0x20 || sum(ep, ep_len) != 0 || mmio_read8(ep + 7) < 3 {
        d.str("bad entry point at ")
            .hex(ep)
            .str(" length=")
            .dec(ep_len);
        r.result("smbios", false, d.as_str());
        return;
    }
    let size = u64::from(mmio_read32(ep + 0x0c));
    let table = read64(ep + 0x10);
    if size < 4 || size > MAX_TABLE || table.saturating_add(size) > 1 << 32 {
        d.str("bad structure table ")
            .hex(table)
            .str(" size=")
            .dec(size);
        r.result("smbios", false, d.as_str());
        return;
    }
    let found = match walk(table, table + size) {
        Ok(found) => found,
        Err(reason) => {
            r.result("smbios", false, reason);
            return;
        }
    };
    let Some((system, len)) = found.system else {
        r.result("smbios", false, "no system record (type 1)");
        return;
    };
    let end = table + size;
    d.str("manufacturer=");
    string(&mut d, system, len, mmio_read8(system + 4), end);
    d.str(" product=");
    string(&mut d, system, len, mmio_read8(system + 5), end);
    d.str(" family=");
    string(&mut d, system, len, mmio_read8(system + 0x1a), end);
    d.str(" serial=");
    string(&mut d, system, len, mmio_read8(system + 7), end);
    d.str(" uuid=");
    uuid(&mut d, system + 8);
    d.str(" cpus=")
        .dec(found.cores)
        .str(" memory_mib=")
        .dec(found.memory_mib);
    let ok = found.ended
        && found.processors > 0
        && found.memory_mib > 0
        && found.mapped_kib >> 10 == found.memory_mib;
    if !ok {
        d.str(" sockets=")
            .dec(found.processors)
            .str(" mapped_kib=")
            .dec(found.mapped_kib);
    }
    r.result("smbios", ok, d.as_str());
}
