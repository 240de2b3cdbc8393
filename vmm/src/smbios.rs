//! The SMBIOS (DMI) tables: what `/sys/class/dmi/id`, `dmidecode`, cloud-init and
//! `systemd-detect-virt` read about the machine.
//!
//! Written by hand from DSP0134 (the SMBIOS 3.0 reference specification): no well-kept
//! crate writes SMBIOS tables (Cloud Hypervisor and Firecracker each write their own). The
//! structures are the ones QEMU writes for a q35 VM under libvirt, with the same handles and
//! the same fixed values, so a guest sees what it would see under KubeVirt's usual stack:
//!
//! - type 0, BIOS: this VMM's name, its crate version, a release date, BIOS starting
//!   segment 0xE800; characteristics "not supported" (bit 3) and nothing else (so bit 11,
//!   "BIOS is upgradeable", is clear); extension byte 2 = 0x14: targeted content
//!   distribution (bit 2) and "this is a virtual machine" (bit 4, which
//!   `systemd-detect-virt` reads).
//! - type 1, System: [`SmbiosSystem`] (empty strings are left out: string number 0), the
//!   UUID with its first three fields little-endian (SMBIOS 2.6+), wake-up type "power
//!   switch".
//! - type 3, Chassis: [`SmbiosChassis`], type "Other", states "safe", security "unknown".
//! - type 4, Processor: one per socket, "CPU N", processor type "central", family "Other",
//!   this VMM as manufacturer (QEMU names itself there too: libvirt's sysinfo does not reach
//!   type 4), CPUID leaf 1 EAX and EDX as the processor id, 2000 MHz (QEMU's value: SVVP
//!   wants a known speed), "populated, enabled", the core and thread counts (the 3.0 fields
//!   too).
//! - type 16, the physical memory array (maximum capacity = guest RAM, extended above 2 TiB);
//!   type 17, one memory device "DIMM 0" holding all of guest RAM, its size in MiB (the
//!   extended size field from 32 GiB - 1 MiB on). QEMU splits RAM into 16 GiB devices;
//!   one device keeps the table's size independent of the RAM's.
//! - type 19, one memory array mapped address per RAM range of the e820 map (below the MMIO
//!   hole, and above 4 GiB for big guests), as QEMU does (from address 0).
//! - type 32, boot information "no errors"; type 127, the end.
//!
//! Placement: the 64-bit (`_SM3_`) entry point at [`SMBIOS_ADDR`] in the BIOS area
//! (0xF0000-0xFFFFF, which Linux's `dmi_scan` searches on 16-byte boundaries when there is no
//! EFI system table), the structure table right after it, both in the part of the BIOS area
//! the MP table leaves free; the e820 map leaves the area out of RAM. No 32-bit (`_SM_`)
//! entry point: Linux has read `_SM3_` since 3.19.

use virtio_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use crate::config::Smbios;
use crate::kvm::layout::{SMBIOS_ADDR, SMBIOS_MAX_SIZE};

/// Type 0's vendor and the manufacturer of the processor and memory records.
const VENDOR: &str = "kubevirt-rs";
/// Type 0's release date (mm/dd/yyyy): when this table layout was written.
const RELEASE_DATE: &str = "12/04/2026";
/// The longest string written (in bytes; longer ones are cut at a character boundary), so
/// that the table stays within [`SMBIOS_MAX_SIZE`]: 11 strings come from the configuration.
const MAX_STRING: usize = 1024;
/// The entry point's size and where the structure table starts after it.
const ENTRY_POINT_LEN: u8 = 0x18;
const TABLE_OFFSET: u64 = 0x20;

// Handles, as QEMU numbers them.
const HANDLE_BIOS: u16 = 0x0000;
const HANDLE_SYSTEM: u16 = 0x0100;
const HANDLE_CHASSIS: u16 = 0x0300;
const HANDLE_PROCESSOR: u16 = 0x0400;
const HANDLE_MEMORY_ARRAY: u16 = 0x1000;
const HANDLE_MEMORY_DEVICE: u16 = 0x1100;
const HANDLE_MAPPED_ADDRESS: u16 = 0x1300;
const HANDLE_BOOT: u16 = 0x2000;
const HANDLE_END: u16 = 0x7f00;
const HANDLE_NONE: u16 = 0xffff;
const HANDLE_NOT_PROVIDED: u16 = 0xfffe;

/// A CPU speed the guest can show (QEMU's default).
const CPU_SPEED_MHZ: u16 = 2000;
/// Type 16's maximum capacity field in KiB; from this value on the extended field (bytes).
const MAX_CAPACITY_EXTENDED: u32 = 0x8000_0000;
/// Type 17's size field in MiB; this value says "see the extended size".
const SIZE_EXTENDED: u16 = 0x7fff;
/// Type 19's address fields in KiB; this value says "see the extended addresses".
const ADDRESS_EXTENDED: u32 = 0xffff_ffff;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the SMBIOS tables need {0} bytes, more than the space reserved for them")]
    TooBig(usize),
    #[error("guest memory of {0} bytes is more than SMBIOS can describe")]
    MemoryTooBig(u64),
    #[error("cannot write the SMBIOS tables: {0}")]
    Write(String),
}

/// What the tables describe besides the configured strings.
pub(crate) struct Machine<'a> {
    pub(crate) smbios: &'a Smbios,
    /// Processor sockets, and cores in each (one thread per core).
    pub(crate) sockets: u8,
    pub(crate) cores_per_socket: u8,
    /// CPUID leaf 1: EAX (the signature) and EDX (the feature flags).
    pub(crate) cpuid_signature: u32,
    pub(crate) cpuid_features: u32,
    /// The RAM ranges (start, length) of the e820 map, guest RAM in all.
    pub(crate) ram_ranges: Vec<(u64, u64)>,
}

/// One structure: the formatted area, then its strings.
struct Structure {
    formatted: Vec<u8>,
    strings: Vec<u8>,
    count: u8,
}

impl Structure {
    fn new(kind: u8, length: u8, handle: u16) -> Self {
        let mut formatted = vec![0u8; usize::from(length)];
        formatted[0] = kind;
        formatted[1] = length;
        formatted[2..4].copy_from_slice(&handle.to_le_bytes());
        Structure {
            formatted,
            strings: Vec::new(),
            count: 0,
        }
    }

    fn set(&mut self, offset: usize, bytes: &[u8]) {
        self.formatted[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn u8(&mut self, offset: usize, value: u8) {
        self.set(offset, &[value]);
    }

    fn u16(&mut self, offset: usize, value: u16) {
        self.set(offset, &value.to_le_bytes());
    }

    fn u32(&mut self, offset: usize, value: u32) {
        self.set(offset, &value.to_le_bytes());
    }

    fn u64(&mut self, offset: usize, value: u64) {
        self.set(offset, &value.to_le_bytes());
    }

    /// Adds a string and stores its number at `offset`; an empty one is left out (number 0).
    fn string(&mut self, offset: usize, text: &str) {
        let text = clean(text);
        if text.is_empty() {
            return;
        }
        // At most 6 strings per structure here.
        self.count += 1;
        self.strings.extend_from_slice(text.as_bytes());
        self.strings.push(0);
        self.u8(offset, self.count);
    }

    /// The structure's bytes: formatted area, strings, and the double NUL that ends it.
    fn finish(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.formatted);
        if self.strings.is_empty() {
            out.push(0);
        }
        out.extend_from_slice(&self.strings);
        out.push(0);
    }
}

/// `text` without NULs (they would end the string early), cut to [`MAX_STRING`] bytes.
fn clean(text: &str) -> String {
    let mut out: String = text.chars().filter(|&c| c != '\0').collect();
    if out.len() > MAX_STRING {
        let mut end = MAX_STRING;
        while !out.is_char_boundary(end) {
            end -= 1;
        }
        tracing::warn!(
            "an SMBIOS string of {} bytes was cut to {end} bytes",
            out.len()
        );
        out.truncate(end);
    }
    out
}

/// The checksum byte that makes `bytes` sum to zero.
fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |sum, &b| sum.wrapping_add(b))
        .wrapping_neg()
}

/// The UUID as SMBIOS 2.6+ stores it: time_low, time_mid and time_hi_and_version
/// little-endian, the rest in order.
fn uuid_bytes(uuid: &[u8; 16]) -> [u8; 16] {
    let mut out = *uuid;
    out[0..4].reverse();
    out[4..6].reverse();
    out[6..8].reverse();
    out
}

/// Type 17's size and extended size fields for `bytes` of memory (rounded up to MiB).
fn memory_device_size(bytes: u64) -> Result<(u16, u32), Error> {
    let mib = bytes.div_ceil(1 << 20);
    match u16::try_from(mib) {
        Ok(size) if size < SIZE_EXTENDED => Ok((size, 0)),
        // Bit 31 of the extended size is reserved.
        _ => match u32::try_from(mib) {
            Ok(extended) if extended < 0x8000_0000 => Ok((SIZE_EXTENDED, extended)),
            _ => Err(Error::MemoryTooBig(bytes)),
        },
    }
}

/// Type 16's maximum capacity and extended maximum capacity fields for `bytes` of memory.
fn array_capacity(bytes: u64) -> (u32, u64) {
    match u32::try_from(bytes.div_ceil(1 << 10)) {
        Ok(kib) if kib < MAX_CAPACITY_EXTENDED => (kib, 0),
        _ => (MAX_CAPACITY_EXTENDED, bytes),
    }
}

/// Type 19's start/end fields (KiB) and extended start/end fields (bytes) for a range.
fn mapped_address(start: u64, length: u64) -> (u32, u32, u64, u64) {
    let end = start + length - 1;
    match (u32::try_from(start >> 10), u32::try_from(end >> 10)) {
        (Ok(s), Ok(e)) if s < ADDRESS_EXTENDED && e < ADDRESS_EXTENDED => (s, e, 0, 0),
        _ => (ADDRESS_EXTENDED, ADDRESS_EXTENDED, start, end),
    }
}

/// The structure table.
fn structures(machine: &Machine) -> Result<Vec<u8>, Error> {
    let system = &machine.smbios.system;
    let chassis = &machine.smbios.chassis;
    let mut out = Vec::new();

    // Type 0, BIOS Information (SMBIOS 3.0 length: up to the embedded controller release).
    let mut s = Structure::new(0, 0x18, HANDLE_BIOS);
    s.string(0x04, VENDOR);
    s.string(0x05, env!("CARGO_PKG_VERSION"));
    s.u16(0x06, 0xe800);
    s.string(0x08, RELEASE_DATE);
    s.u8(0x09, 0); // ROM size: none
    s.u64(0x0a, 1 << 3); // BIOS characteristics not supported
    s.u8(0x12, 0);
    s.u8(0x13, (1 << 2) | (1 << 4)); // targeted content distribution, virtual machine
    s.u8(0x14, env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap_or(0));
    s.u8(0x15, env!("CARGO_PKG_VERSION_MINOR").parse().unwrap_or(0));
    s.u8(0x16, 0xff); // no embedded controller
    s.u8(0x17, 0xff);
    s.finish(&mut out);

    // Type 1, System Information.
    let mut s = Structure::new(1, 0x1b, HANDLE_SYSTEM);
    s.string(0x04, &system.manufacturer);
    s.string(0x05, &system.product);
    s.string(0x06, &system.version);
    s.string(0x07, &system.serial);
    if let Some(uuid) = &system.uuid {
        s.set(0x08, &uuid_bytes(uuid));
    }
    s.u8(0x18, 0x06); // wake-up type: power switch
    s.string(0x19, &system.sku);
    s.string(0x1a, &system.family);
    s.finish(&mut out);

    // Type 3, System Enclosure or Chassis, no contained elements.
    let mut s = Structure::new(3, 0x16, HANDLE_CHASSIS);
    s.string(0x04, &chassis.manufacturer);
    s.u8(0x05, 0x01); // type: other
    s.string(0x06, &chassis.version);
    s.string(0x07, &chassis.serial);
    s.string(0x08, &chassis.asset);
    s.u8(0x09, 0x03); // boot-up state: safe
    s.u8(0x0a, 0x03); // power supply state: safe
    s.u8(0x0b, 0x03); // thermal state: safe
    s.u8(0x0c, 0x02); // security status: unknown
    s.string(0x15, &chassis.sku);
    s.finish(&mut out);

    // Type 4, Processor Information, one per socket (SMBIOS 3.0 length, with the 16-bit counts).
    let cores = machine.cores_per_socket;
    for socket in 0..machine.sockets {
        let mut s = Structure::new(4, 0x30, HANDLE_PROCESSOR + u16::from(socket));
        s.string(0x04, &format!("CPU {socket}"));
        s.u8(0x05, 0x03); // processor type: central processor
        s.u8(0x06, 0x01); // family: other
        s.string(0x07, VENDOR);
        s.u32(0x08, machine.cpuid_signature);
        s.u32(0x0c, machine.cpuid_features);
        s.u16(0x14, CPU_SPEED_MHZ); // max speed
        s.u16(0x16, CPU_SPEED_MHZ); // current speed
        s.u8(0x18, 0x41); // socket populated, CPU enabled
        s.u8(0x19, 0x01); // upgrade: other
        s.u16(0x1a, HANDLE_NONE); // L1, L2, L3 caches: none described
        s.u16(0x1c, HANDLE_NONE);
        s.u16(0x1e, HANDLE_NONE);
        s.u8(0x23, cores); // core count, cores enabled, threads (one per core)
        s.u8(0x24, cores);
        s.u8(0x25, cores);
        s.u16(0x26, 0x02); // characteristics: unknown
        s.u16(0x28, 0x01); // family 2: other
        s.u16(0x2a, u16::from(cores)); // the same counts, 16 bits wide
        s.u16(0x2c, u16::from(cores));
        s.u16(0x2e, u16::from(cores));
        s.finish(&mut out);
    }

    let ram: u64 = machine.ram_ranges.iter().map(|r| r.1).sum();
    // Type 16, Physical Memory Array.
    let (capacity, extended_capacity) = array_capacity(ram);
    let mut s = Structure::new(16, 0x17, HANDLE_MEMORY_ARRAY);
    s.u8(0x04, 0x01); // location: other
    s.u8(0x05, 0x03); // use: system memory
    s.u8(0x06, 0x06); // error correction: multi-bit ECC (QEMU's, for Windows)
    s.u32(0x07, capacity);
    s.u16(0x0b, HANDLE_NOT_PROVIDED); // no memory error information
    s.u16(0x0d, 1); // memory devices
    s.u64(0x0f, extended_capacity);
    s.finish(&mut out);

    // Type 17, Memory Device.
    let (size, extended_size) = memory_device_size(ram)?;
    let mut s = Structure::new(17, 0x28, HANDLE_MEMORY_DEVICE);
    s.u16(0x04, HANDLE_MEMORY_ARRAY);
    s.u16(0x06, HANDLE_NOT_PROVIDED);
    s.u16(0x08, 0xffff); // total width: unknown
    s.u16(0x0a, 0xffff); // data width: unknown
    s.u16(0x0c, size);
    s.u8(0x0e, 0x09); // form factor: DIMM
    s.string(0x10, "DIMM 0");
    s.u8(0x12, 0x07); // memory type: RAM
    s.u16(0x13, 0x02); // type detail: other
    s.string(0x17, VENDOR);
    s.u32(0x1c, extended_size);
    s.finish(&mut out);

    // Type 19, Memory Array Mapped Address, one per RAM range.
    let ranges = machine.ram_ranges.iter().filter(|r| r.1 > 0);
    for (index, &(start, length)) in (0u16..).zip(ranges) {
        let (start_kib, end_kib, start_ext, end_ext) = mapped_address(start, length);
        let mut s = Structure::new(19, 0x1f, HANDLE_MAPPED_ADDRESS + index);
        s.u32(0x04, start_kib);
        s.u32(0x08, end_kib);
        s.u16(0x0c, HANDLE_MEMORY_ARRAY);
        s.u8(0x0e, 1); // partition width: one device
        s.u64(0x0f, start_ext);
        s.u64(0x17, end_ext);
        s.finish(&mut out);
    }

    // Type 32, System Boot Information: no errors detected (status byte 0).
    Structure::new(32, 0x0b, HANDLE_BOOT).finish(&mut out);
    // Type 127, End-of-Table.
    Structure::new(127, 0x04, HANDLE_END).finish(&mut out);
    Ok(out)
}

/// The 64-bit entry point for a structure table of `length` bytes at `address`.
fn entry_point(length: u32, address: u64) -> Vec<u8> {
    let mut ep = Vec::with_capacity(usize::from(ENTRY_POINT_LEN));
    ep.extend_from_slice(b"_SM3_");
    ep.push(0); // checksum, below
    ep.push(ENTRY_POINT_LEN);
    ep.extend_from_slice(&[3, 0, 0]); // SMBIOS 3.0.0
    ep.push(1); // entry point revision: 3.0
    ep.push(0);
    ep.extend_from_slice(&length.to_le_bytes()); // structure table maximum size
    ep.extend_from_slice(&address.to_le_bytes());
    ep[5] = checksum(&ep);
    ep
}

/// The entry point and the structure table, for the table at `SMBIOS_ADDR + TABLE_OFFSET`.
fn build(machine: &Machine) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let table = structures(machine)?;
    let room = SMBIOS_MAX_SIZE - int_cast::u64_to_usize(TABLE_OFFSET);
    let length = u32::try_from(table.len())
        .ok()
        .filter(|_| table.len() <= room)
        .ok_or(Error::TooBig(table.len()))?;
    Ok((entry_point(length, SMBIOS_ADDR + TABLE_OFFSET), table))
}

/// Writes the entry point and the tables into guest memory.
pub(crate) fn write(mem: &GuestMemoryMmap, machine: &Machine) -> Result<(), Error> {
    let (entry, table) = build(machine)?;
    mem.write_slice(&entry, GuestAddress(SMBIOS_ADDR))
        .and_then(|()| mem.write_slice(&table, GuestAddress(SMBIOS_ADDR + TABLE_OFFSET)))
        .map_err(|e| Error::Write(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{SmbiosChassis, SmbiosSystem};
    use crate::kvm::layout::ram_ranges;

    const UUID: [u8; 16] = [
        0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd,
        0xef,
    ];

    fn kubevirt() -> Smbios {
        Smbios {
            system: SmbiosSystem {
                manufacturer: "KubeVirt".into(),
                product: "None".into(),
                version: String::new(),
                serial: "serial-42".into(),
                uuid: Some(UUID),
                sku: "sku-1".into(),
                family: "KubeVirt".into(),
            },
            chassis: SmbiosChassis {
                manufacturer: "Chassis Inc.".into(),
                version: "v2".into(),
                serial: String::new(),
                asset: "asset-7".into(),
                sku: "csku".into(),
            },
        }
    }

    fn machine(smbios: &Smbios, sockets: u8, cores: u8, mem_bytes: u64) -> Machine<'_> {
        Machine {
            smbios,
            sockets,
            cores_per_socket: cores,
            cpuid_signature: 0x0009_06ea,
            cpuid_features: 0x178b_fbff,
            ram_ranges: ram_ranges(mem_bytes),
        }
    }

    fn sum(bytes: &[u8]) -> u8 {
        bytes.iter().fold(0u8, |s, &b| s.wrapping_add(b))
    }

    /// One parsed structure: its formatted area and its strings.
    #[derive(Debug)]
    struct Parsed {
        formatted: Vec<u8>,
        strings: Vec<String>,
    }

    impl Parsed {
        fn kind(&self) -> u8 {
            self.formatted[0]
        }
        fn handle(&self) -> u16 {
            self.u16(2)
        }
        fn u8(&self, at: usize) -> u8 {
            self.formatted[at]
        }
        fn u16(&self, at: usize) -> u16 {
            u16::from_le_bytes(self.formatted[at..at + 2].try_into().unwrap())
        }
        fn u32(&self, at: usize) -> u32 {
            u32::from_le_bytes(self.formatted[at..at + 4].try_into().unwrap())
        }
        fn u64(&self, at: usize) -> u64 {
            u64::from_le_bytes(self.formatted[at..at + 8].try_into().unwrap())
        }
        /// The string whose number is at `at` ("" for number 0).
        fn string(&self, at: usize) -> &str {
            match self.formatted[at] {
                0 => "",
                n => &self.strings[usize::from(n) - 1],
            }
        }
    }

    /// Reads the table back as a guest does: entry point checksum, then the structures by
    /// their length bytes and double NULs, up to type 127, which must end the table exactly.
    fn parse(entry: &[u8], table: &[u8]) -> Vec<Parsed> {
        assert_eq!(entry.len(), 0x18);
        assert_eq!(&entry[..5], b"_SM3_");
        assert_eq!(usize::from(entry[6]), entry.len());
        assert_eq!(sum(entry), 0, "entry point checksum");
        assert_eq!(&entry[7..11], &[3, 0, 0, 1]);
        let max = u32::from_le_bytes(entry[12..16].try_into().unwrap());
        assert_eq!(usize::try_from(max).unwrap(), table.len());
        let address = u64::from_le_bytes(entry[16..24].try_into().unwrap());
        assert_eq!(address, SMBIOS_ADDR + TABLE_OFFSET);
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            let length = usize::from(table[at + 1]);
            assert!(length >= 4, "structure at {at} too short");
            let formatted = table[at..at + length].to_vec();
            let mut end = at + length;
            let mut strings = Vec::new();
            if table[end] == 0 {
                end += 1;
            } else {
                while table[end] != 0 {
                    let len = table[end..].iter().position(|&b| b == 0).unwrap();
                    strings.push(String::from_utf8(table[end..end + len].to_vec()).unwrap());
                    end += len + 1;
                }
            }
            assert_eq!(table[end], 0, "double NUL after structure at {at}");
            at = end + 1;
            let parsed = Parsed { formatted, strings };
            let last = parsed.kind() == 127;
            out.push(parsed);
            if last {
                break;
            }
        }
        assert_eq!(at, table.len(), "type 127 ends the table");
        out
    }

    fn one(structures: &[Parsed], kind: u8) -> &Parsed {
        let found: Vec<&Parsed> = structures.iter().filter(|s| s.kind() == kind).collect();
        assert_eq!(found.len(), 1, "type {kind}");
        found[0]
    }

    #[test]
    fn every_structure_reads_back_with_kubevirts_values() {
        let smbios = kubevirt();
        let (entry, table) = build(&machine(&smbios, 1, 2, 256 << 20)).unwrap();
        let all = parse(&entry, &table);
        let kinds: Vec<u8> = all.iter().map(Parsed::kind).collect();
        assert_eq!(kinds, [0, 1, 3, 4, 16, 17, 19, 32, 127]);

        let bios = one(&all, 0);
        assert_eq!((bios.handle(), bios.formatted.len()), (0, 0x18));
        assert_eq!(bios.string(4), VENDOR);
        assert_eq!(bios.string(5), env!("CARGO_PKG_VERSION"));
        assert_eq!(bios.string(8), RELEASE_DATE);
        assert_eq!((bios.u16(6), bios.u8(9)), (0xe800, 0));
        assert_eq!(bios.u64(0x0a), 0x08);
        assert_eq!(bios.u64(0x0a) & (1 << 11), 0, "not upgradeable");
        assert_eq!((bios.u8(0x12), bios.u8(0x13)), (0, 0x14));
        assert_eq!(bios.u8(0x13) & (1 << 4), 1 << 4, "virtual machine bit");
        assert_eq!((bios.u8(0x16), bios.u8(0x17)), (0xff, 0xff));

        let system = one(&all, 1);
        assert_eq!((system.handle(), system.formatted.len()), (0x100, 0x1b));
        assert_eq!(system.string(4), "KubeVirt");
        assert_eq!(system.string(5), "None");
        assert_eq!(system.u8(6), 0, "an empty version is left out");
        assert_eq!(system.string(7), "serial-42");
        assert_eq!(
            &system.formatted[8..24],
            &[
                0x78, 0x56, 0x34, 0x12, 0xbc, 0x9a, 0xf0, 0xde, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab,
                0xcd, 0xef
            ]
        );
        assert_eq!(system.u8(0x18), 0x06);
        assert_eq!(system.string(0x19), "sku-1");
        assert_eq!(system.string(0x1a), "KubeVirt");
        assert_eq!(system.strings.len(), 5);

        let chassis = one(&all, 3);
        assert_eq!((chassis.handle(), chassis.formatted.len()), (0x300, 0x16));
        assert_eq!(chassis.string(4), "Chassis Inc.");
        assert_eq!(chassis.u8(5), 0x01);
        assert_eq!(chassis.string(6), "v2");
        assert_eq!(chassis.u8(7), 0, "an empty serial is left out");
        assert_eq!(chassis.string(8), "asset-7");
        assert_eq!(&chassis.formatted[9..13], &[3, 3, 3, 2]);
        assert_eq!(chassis.u32(0x0d), 0);
        assert_eq!(&chassis.formatted[0x11..0x15], &[0, 0, 0, 0]);
        assert_eq!(chassis.string(0x15), "csku");

        let cpu = one(&all, 4);
        assert_eq!((cpu.handle(), cpu.formatted.len()), (0x400, 0x30));
        assert_eq!(cpu.string(4), "CPU 0");
        assert_eq!((cpu.u8(5), cpu.u8(6)), (0x03, 0x01));
        assert_eq!(cpu.string(7), VENDOR);
        assert_eq!((cpu.u32(8), cpu.u32(12)), (0x0009_06ea, 0x178b_fbff));
        assert_eq!((cpu.u8(0x10), cpu.u8(0x11), cpu.u16(0x12)), (0, 0, 0));
        assert_eq!((cpu.u16(0x14), cpu.u16(0x16)), (2000, 2000));
        assert_eq!((cpu.u8(0x18), cpu.u8(0x19)), (0x41, 0x01));
        assert_eq!(
            (cpu.u16(0x1a), cpu.u16(0x1c), cpu.u16(0x1e)),
            (0xffff, 0xffff, 0xffff)
        );
        assert_eq!(&cpu.formatted[0x20..0x26], &[0, 0, 0, 2, 2, 2]);
        assert_eq!((cpu.u16(0x26), cpu.u16(0x28)), (0x02, 0x01));
        assert_eq!((cpu.u16(0x2a), cpu.u16(0x2c), cpu.u16(0x2e)), (2, 2, 2));

        let array = one(&all, 16);
        assert_eq!((array.handle(), array.formatted.len()), (0x1000, 0x17));
        assert_eq!(&array.formatted[4..7], &[1, 3, 6]);
        assert_eq!(array.u32(7), 256 << 10);
        assert_eq!((array.u16(0x0b), array.u16(0x0d)), (0xfffe, 1));
        assert_eq!(array.u64(0x0f), 0);

        let dimm = one(&all, 17);
        assert_eq!((dimm.handle(), dimm.formatted.len()), (0x1100, 0x28));
        assert_eq!((dimm.u16(4), dimm.u16(6)), (0x1000, 0xfffe));
        assert_eq!((dimm.u16(8), dimm.u16(0x0a)), (0xffff, 0xffff));
        assert_eq!(dimm.u16(0x0c), 256);
        assert_eq!((dimm.u8(0x0e), dimm.u8(0x0f)), (0x09, 0));
        assert_eq!(dimm.string(0x10), "DIMM 0");
        assert_eq!(dimm.u8(0x11), 0, "no bank locator");
        assert_eq!((dimm.u8(0x12), dimm.u16(0x13), dimm.u16(0x15)), (7, 2, 0));
        assert_eq!(dimm.string(0x17), VENDOR);
        assert_eq!(&dimm.formatted[0x18..0x1c], &[0, 0, 0, 0]);
        assert_eq!(dimm.u32(0x1c), 0);
        assert!(dimm.formatted[0x20..].iter().all(|&b| b == 0));

        let mapped = one(&all, 19);
        assert_eq!((mapped.handle(), mapped.formatted.len()), (0x1300, 0x1f));
        assert_eq!((mapped.u32(4), mapped.u32(8)), (0, (256 << 10) - 1));
        assert_eq!((mapped.u16(0x0c), mapped.u8(0x0e)), (0x1000, 1));
        assert_eq!((mapped.u64(0x0f), mapped.u64(0x17)), (0, 0));

        let boot = one(&all, 32);
        assert_eq!((boot.handle(), boot.formatted.len()), (0x2000, 0x0b));
        assert!(boot.formatted[4..].iter().all(|&b| b == 0), "no errors");
        let end = one(&all, 127);
        assert_eq!((end.handle(), end.formatted.len()), (0x7f00, 4));
    }

    #[test]
    fn empty_strings_and_no_uuid_leave_numbers_and_bytes_zero() {
        let smbios = Smbios::default();
        let (entry, table) = build(&machine(&smbios, 1, 1, 128 << 20)).unwrap();
        let all = parse(&entry, &table);
        let system = one(&all, 1);
        assert!(system.strings.is_empty());
        for at in [4, 5, 6, 7, 0x19, 0x1a] {
            assert_eq!(system.u8(at), 0);
        }
        assert!(system.formatted[8..24].iter().all(|&b| b == 0));
        let chassis = one(&all, 3);
        assert!(chassis.strings.is_empty());
        // A structure without strings ends with two NULs right after its formatted area.
        let at = table
            .windows(4)
            .position(|w| w == [3, 0x16, 0x00, 0x03])
            .unwrap();
        assert_eq!(&table[at + 0x16..at + 0x18], &[0, 0]);
    }

    #[test]
    fn ram_above_the_hole_gets_its_own_mapped_range_and_large_sizes_their_extended_fields() {
        let smbios = kubevirt();
        let mem = 40u64 << 30;
        let (entry, table) = build(&machine(&smbios, 1, 4, mem)).unwrap();
        let all = parse(&entry, &table);
        let ranges: Vec<&Parsed> = all.iter().filter(|s| s.kind() == 19).collect();
        assert_eq!(ranges.len(), 2);
        assert_eq!((ranges[0].handle(), ranges[1].handle()), (0x1300, 0x1301));
        assert_eq!(
            (ranges[0].u32(4), ranges[0].u32(8)),
            (0, (0xd000_0000 >> 10) - 1)
        );
        let high_end = (1u64 << 32) + mem - 0xd000_0000 - 1;
        assert_eq!(
            (ranges[1].u32(4), u64::from(ranges[1].u32(8))),
            (4 << 20, high_end >> 10)
        );
        // 40 GiB: type 17 needs its extended size; type 16 still fits its KiB field.
        let dimm = one(&all, 17);
        assert_eq!((dimm.u16(0x0c), dimm.u32(0x1c)), (0x7fff, 40 << 10));
        assert_eq!(one(&all, 16).u32(7), 40 << 20);

        assert_eq!(
            memory_device_size((32 << 30) - (2 << 20)).unwrap(),
            (0x7ffe, 0)
        );
        assert_eq!(
            memory_device_size((32 << 30) - (1 << 20)).unwrap(),
            (0x7fff, 0x7fff)
        );
        assert_eq!(memory_device_size(1).unwrap(), (1, 0));
        assert!(memory_device_size(1 << 51).is_err());
        assert_eq!(array_capacity(2 << 40), (0x8000_0000, 2 << 40));
        assert_eq!(array_capacity((2 << 40) - 1024), (0x7fff_ffff, 0));
        assert_eq!(
            mapped_address(4 << 40, 1 << 30),
            (0xffff_ffff, 0xffff_ffff, 4 << 40, (4 << 40) + (1 << 30) - 1)
        );
    }

    #[test]
    fn the_largest_machine_with_the_longest_strings_fits_its_area() {
        let long = "é".repeat(MAX_STRING); // 2 bytes each: cut at a character boundary
        let system = SmbiosSystem {
            manufacturer: long.clone(),
            product: long.clone(),
            version: long.clone(),
            serial: long.clone(),
            uuid: Some(UUID),
            sku: long.clone(),
            family: format!("a\0b{long}"),
        };
        let chassis = SmbiosChassis {
            manufacturer: long.clone(),
            version: long.clone(),
            serial: long.clone(),
            asset: long.clone(),
            sku: long,
        };
        let smbios = Smbios { system, chassis };
        let max = crate::config::MAX_VCPUS;
        for (sockets, cores) in [(max, 1), (1, max)] {
            let (entry, table) = build(&machine(&smbios, sockets, cores, 1 << 40)).unwrap();
            assert!(table.len() + usize::try_from(TABLE_OFFSET).unwrap() <= SMBIOS_MAX_SIZE);
            let all = parse(&entry, &table);
            let cpus: Vec<&Parsed> = all.iter().filter(|s| s.kind() == 4).collect();
            assert_eq!(cpus.len(), usize::from(sockets));
            let last = cpus.last().unwrap();
            assert_eq!(last.string(4), format!("CPU {}", sockets - 1));
            assert_eq!((last.u8(0x23), last.u16(0x2a)), (cores, u16::from(cores)));
            let system = one(&all, 1);
            assert_eq!(system.string(4).len(), MAX_STRING);
            assert!(system.string(0x1a).starts_with("ab"), "NULs are dropped");
        }
    }

    #[test]
    fn the_entry_point_is_aligned_where_linux_scans_and_the_table_follows_it() {
        const { assert!(SMBIOS_ADDR.is_multiple_of(16)) };
        const { assert!(SMBIOS_ADDR >= 0xf_0000 && SMBIOS_ADDR < 0x10_0000 - 32) };
        assert!(TABLE_OFFSET >= u64::from(ENTRY_POINT_LEN));
        const { assert!((SMBIOS_ADDR + TABLE_OFFSET).is_multiple_of(16)) };
    }
}
