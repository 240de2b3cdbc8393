//! The Intel MultiProcessor Specification (1.4) table: how a Linux guest
//! without ACPI finds its CPUs, the IOAPIC and how ISA interrupts are wired.
//!
//! Written by hand from the specification: rust-vmm has no crate for it.
//! The floating pointer sits at the start of the BIOS area (0xf0000, which
//! Linux scans) and points at the configuration table right after it; the
//! area is not RAM in the e820 map.

use virtio_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::layout::{IOAPIC_ADDR, LAPIC_ADDR, MPTABLE_ADDR, MPTABLE_MAX_SIZE};
use super::{Error, Result};

const SPEC_REVISION: u8 = 4;
const LAPIC_VERSION: u8 = 0x14;
const IOAPIC_VERSION: u8 = 0x11;
/// IOAPIC pins described (KVM's IOAPIC has 24).
pub(crate) const IOAPIC_PINS: u8 = 24;

const ENTRY_PROCESSOR: u8 = 0;
const ENTRY_BUS: u8 = 1;
const ENTRY_IOAPIC: u8 = 2;
const ENTRY_IO_INTERRUPT: u8 = 3;
const ENTRY_LOCAL_INTERRUPT: u8 = 4;
const CPU_ENABLED: u8 = 1;
const CPU_BOOTSTRAP: u8 = 2;
const INT_TYPE_INT: u8 = 0;
const INT_TYPE_NMI: u8 = 1;
const INT_TYPE_EXTINT: u8 = 3;
/// Family 6 signature and FPU|APIC feature flags, as firmware reports them.
const CPU_SIGNATURE: u32 = 0x600;
const CPU_FEATURES: u32 = 0x201;
const ISA_BUS: u8 = 0;

/// Checksum byte that makes `bytes` sum to zero.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, &b| sum.wrapping_add(b))
        .wrapping_neg()
}

/// The table bytes for `cpus` CPUs (APIC ids 0..cpus) placed at `base`.
pub(crate) fn build(cpus: u8, base: u32) -> Vec<u8> {
    let ioapic_id = cpus;
    let mut entries = Vec::new();
    let mut count: u16 = 0;
    for id in 0..cpus {
        entries.extend([
            ENTRY_PROCESSOR,
            id,
            LAPIC_VERSION,
            CPU_ENABLED | if id == 0 { CPU_BOOTSTRAP } else { 0 },
        ]);
        entries.extend(CPU_SIGNATURE.to_le_bytes());
        entries.extend(CPU_FEATURES.to_le_bytes());
        entries.extend([0u8; 8]);
        count += 1;
    }
    entries.extend([ENTRY_BUS, ISA_BUS]);
    entries.extend(*b"ISA   ");
    count += 1;
    entries.extend([ENTRY_IOAPIC, ioapic_id, IOAPIC_VERSION, 1]);
    entries.extend(const { int_cast::u32_of_u64(IOAPIC_ADDR) }.to_le_bytes());
    count += 1;
    // ISA IRQ n arrives on IOAPIC pin n, with the bus defaults (edge, high).
    for pin in 0..IOAPIC_PINS {
        entries.extend([
            ENTRY_IO_INTERRUPT,
            INT_TYPE_INT,
            0,
            0,
            ISA_BUS,
            pin,
            ioapic_id,
            pin,
        ]);
        count += 1;
    }
    // The PIC reaches every local APIC's LINT0, NMI its LINT1.
    entries.extend([
        ENTRY_LOCAL_INTERRUPT,
        INT_TYPE_EXTINT,
        0,
        0,
        ISA_BUS,
        0,
        0xff,
        0,
    ]);
    entries.extend([
        ENTRY_LOCAL_INTERRUPT,
        INT_TYPE_NMI,
        0,
        0,
        ISA_BUS,
        0,
        0xff,
        1,
    ]);
    count += 2;

    const FLOATING_SIZE: u8 = 16;
    const HEADER_SIZE: usize = 44;
    let table_addr = base + u32::from(FLOATING_SIZE);
    let mut header = Vec::with_capacity(HEADER_SIZE);
    header.extend(*b"PCMP");
    // A cast the lints refuse, allowed as nothing else fits: at most 255 CPUs of 20 bytes and
    // a few dozen fixed entries, far below 64 KiB.
    #[allow(clippy::cast_possible_truncation)]
    let length = (HEADER_SIZE + entries.len()) as u16;
    header.extend(length.to_le_bytes());
    header.extend([SPEC_REVISION, 0]); // checksum patched below
    header.extend(*b"RUSTVMM ");
    header.extend(*b"VMM         ");
    header.extend(0u32.to_le_bytes()); // OEM table pointer
    header.extend(0u16.to_le_bytes()); // OEM table size
    header.extend(count.to_le_bytes());
    header.extend(const { int_cast::u32_of_u64(LAPIC_ADDR) }.to_le_bytes());
    header.extend(0u16.to_le_bytes()); // extended table length
    header.extend([0u8, 0]); // extended checksum, reserved
    let mut table = header;
    table.extend(entries);
    table[7] = checksum(&table);

    let mut floating = Vec::with_capacity(usize::from(FLOATING_SIZE));
    floating.extend(*b"_MP_");
    floating.extend(table_addr.to_le_bytes());
    floating.extend([1, SPEC_REVISION, 0, 0, 0, 0, 0, 0]); // length in 16-byte units, checksum patched below
    floating[10] = checksum(&floating);

    floating.extend(table);
    floating
}

/// Writes the table for `cpus` CPUs into guest memory.
pub(crate) fn write(mem: &GuestMemoryMmap, cpus: u8) -> Result<()> {
    let bytes = build(cpus, const { int_cast::u32_of_u64(MPTABLE_ADDR) });
    if bytes.len() > MPTABLE_MAX_SIZE {
        return Err(Error::MptableTooBig(bytes.len()));
    }
    mem.write_slice(&bytes, GuestAddress(MPTABLE_ADDR))
        .map_err(|source| Error::GuestWrite {
            what: "the MP table",
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b))
    }

    #[test]
    fn both_structures_check_out_and_list_every_cpu() {
        for cpus in [1u8, 2, 4, crate::config::MAX_VCPUS] {
            let bytes = build(cpus, const { int_cast::u32_of_u64(MPTABLE_ADDR) });
            assert!(
                bytes.len() <= MPTABLE_MAX_SIZE,
                "{cpus} cpus: {} bytes",
                bytes.len()
            );
            let (floating, table) = bytes.split_at(16);
            assert_eq!(&floating[..4], b"_MP_");
            assert_eq!(sum(floating), 0);
            assert_eq!(
                u64::from(u32::from_le_bytes(floating[4..8].try_into().unwrap())),
                MPTABLE_ADDR + 16
            );
            assert_eq!(&table[..4], b"PCMP");
            let length = usize::from(u16::from_le_bytes([table[4], table[5]]));
            assert_eq!(length, table.len());
            assert_eq!(sum(table), 0);
            let count = usize::from(u16::from_le_bytes([table[34], table[35]]));
            // Walk the entries by type, as a guest does.
            let (mut at, mut processors, mut seen) = (44, 0, 0);
            while at < table.len() {
                let size = if table[at] == ENTRY_PROCESSOR { 20 } else { 8 };
                if table[at] == ENTRY_PROCESSOR {
                    assert_eq!(table[at + 1], processors, "APIC ids in order");
                    assert_eq!(table[at + 3] & CPU_BOOTSTRAP != 0, processors == 0);
                    processors += 1;
                }
                at += size;
                seen += 1;
            }
            assert_eq!(at, table.len());
            assert_eq!((processors, seen), (cpus, count));
        }
    }
}
