//! ACPI tables built by the VMM (rust-vmm's `acpi_tables`), and the
//! hardware-reduced ACPI platform device behind them.
//!
//! In guest memory from 0xE0000 (the BIOS area where Linux looks for the
//! RSDP; the zero page's `acpi_rsdp_addr` points there too): RSDP, XSDT,
//! FADT (hardware-reduced: no PM1/GPE blocks; sleep control and status
//! registers and a reset register on I/O ports), DSDT, MADT (a local APIC
//! per vCPU, the IOAPIC, LINT1 as NMI) and, with PCI, MCFG. The DSDT
//! describes the PCI host bridge with its resources (bus 0, the 0xCF8
//! ports, the I/O space, the 32-bit BAR window), the COM1 serial port,
//! the CMOS RTC (PNP0B00: ports 0x70-0x71, no interrupt), a power button
//! (PNP0C0C) and the Generic Event Device (ACPI0013) that signals it, and
//! `_S5` for power-off. See [`platform`] for the registers.

pub(crate) mod platform;

use acpi_tables::aml;
use acpi_tables::gas::{AccessSize, AddressSpace, GAS};
use acpi_tables::sdt::Sdt;
use acpi_tables::{Aml, fadt, mcfg, rsdp, xsdt};
use virtio_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use crate::devices::legacy::{RTC_PORT, RTC_PORT_LEN, SERIAL_GSI, SERIAL_PORT};
use crate::kvm::layout::{IOAPIC_ADDR, LAPIC_ADDR, PCI_ECAM_BASE, PCI_MMIO_BASE, PCI_MMIO_SIZE};
use platform::{
    GED_GSI, GED_STATUS_PORT, RESET_PORT, RESET_VALUE, SLEEP_CONTROL_PORT, SLEEP_STATUS_PORT,
    SLP_TYP_S5,
};

/// Where the tables start (the RSDP must be 16-byte aligned in 0xE0000-0xFFFFF).
pub(crate) const RSDP_ADDR: u64 = crate::kvm::layout::BIOS_AREA_START;
/// The tables end before the MP table.
const TABLES_END: u64 = crate::kvm::layout::MPTABLE_ADDR;
const OEM_ID: [u8; 6] = *b"KVRSVM";
const OEM_TABLE: [u8; 8] = *b"KVRSVMM ";
const OEM_REVISION: u32 = 1;
/// The CMOS RTC's century register.
const RTC_CENTURY: u8 = 0x32;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the ACPI tables need {0} bytes, more than the space reserved for them")]
    TooBig(u64),
    #[error("cannot write the ACPI tables: {0}")]
    Write(String),
}

/// What the tables describe.
pub(crate) struct Platform {
    pub(crate) vcpus: u8,
    /// A PCI host bridge (ECAM) exists.
    pub(crate) pci: bool,
}

/// Builds every table and writes them to guest memory; returns the RSDP's
/// address.
pub(crate) fn write(mem: &GuestMemoryMmap, platform: &Platform) -> Result<u64, Error> {
    let mut tables: Vec<(&str, Vec<u8>)> = vec![
        ("DSDT", to_bytes(&dsdt(platform))),
        ("APIC", madt(platform.vcpus).as_slice().to_vec()),
    ];
    if platform.pci {
        let mut mcfg = mcfg::MCFG::new(OEM_ID, OEM_TABLE, OEM_REVISION);
        mcfg.add_ecam(PCI_ECAM_BASE, 0, 0, 0);
        tables.push(("MCFG", to_bytes(&mcfg)));
    }
    // Layout: RSDP, then DSDT, FADT, the other tables, XSDT; each 16-byte aligned.
    let align = |a: u64| (a + 15) & !15;
    let mut at = align(RSDP_ADDR + rsdp::Rsdp::len() as u64);
    let mut placed = Vec::new();
    let mut dsdt_addr = 0;
    for (signature, bytes) in tables {
        if signature == "DSDT" {
            dsdt_addr = at;
        }
        placed.push((at, bytes));
        at = align(at + placed.last().map_or(0, |p| p.1.len() as u64));
    }
    let fadt_addr = at;
    let fadt = to_bytes(&fadt(dsdt_addr));
    at = align(at + fadt.len() as u64);
    let xsdt_addr = at;
    let mut xsdt = xsdt::XSDT::new(OEM_ID, OEM_TABLE, OEM_REVISION);
    xsdt.add_entry(fadt_addr);
    for (addr, bytes) in &placed {
        if &bytes[0..4] != b"DSDT" {
            xsdt.add_entry(*addr);
        }
    }
    let xsdt = to_bytes(&xsdt);
    let end = xsdt_addr + xsdt.len() as u64;
    if end > TABLES_END {
        return Err(Error::TooBig(end - RSDP_ADDR));
    }
    let rsdp = to_bytes(&rsdp::Rsdp::new(OEM_ID, xsdt_addr));
    let writes = [(RSDP_ADDR, rsdp), (fadt_addr, fadt), (xsdt_addr, xsdt)];
    for (addr, bytes) in writes.iter().chain(placed.iter()) {
        mem.write_slice(bytes, GuestAddress(*addr))
            .map_err(|e| Error::Write(e.to_string()))?;
    }
    Ok(RSDP_ADDR)
}

fn to_bytes(aml: &dyn Aml) -> Vec<u8> {
    let mut bytes = Vec::new();
    aml.to_aml_bytes(&mut bytes);
    bytes
}

/// FADT, hardware-reduced: the sleep and reset registers are I/O ports
/// of [`platform::AcpiPlatform`], the power button a control-method device.
fn fadt(dsdt: u64) -> fadt::FADT {
    let port = |address: u16| {
        GAS::new(
            AddressSpace::SystemIo,
            8,
            0,
            AccessSize::ByteAccess,
            u64::from(address),
        )
    };
    let mut f = fadt::FADTBuilder::new(OEM_ID, OEM_TABLE, OEM_REVISION)
        .dsdt_64(dsdt)
        .flag(fadt::Flags::HwReducedAcpi)
        .flag(fadt::Flags::PwrButton)
        .flag(fadt::Flags::SlpButton)
        .flag(fadt::Flags::ResetRegSup);
    f.sleep_control_reg = port(SLEEP_CONTROL_PORT);
    f.sleep_status_reg = port(SLEEP_STATUS_PORT);
    f.reset_reg = port(RESET_PORT);
    f.reset_value = RESET_VALUE;
    // The RTC's century register, which Linux reads when the FADT names it (QEMU's value).
    // IAPC_BOOT_ARCH stays 0: its bit 5 ("no CMOS RTC") would stop Linux registering it.
    f.century = RTC_CENTURY;
    // "KVMKVMKVM" is what KVM's CPUID leaf 0x40000000 says too.
    f.hypervisor_vendor_identity = u64::from_le_bytes(*b"KVMKVMKV").into();
    f.finalize()
}

/// MADT: one enabled local APIC per vCPU (APIC id = index), the IOAPIC
/// with GSI base 0, LINT1 of every CPU as NMI. ISA IRQs map to the IOAPIC
/// pin of the same number (as in the MP table), so no overrides.
fn madt(vcpus: u8) -> Sdt {
    const PCAT_COMPAT: u32 = 1;
    let mut table = Sdt::new(*b"APIC", 44, 3, OEM_ID, OEM_TABLE, OEM_REVISION);
    table.write_u32(36, const { int_cast::u32_of_u64(LAPIC_ADDR) });
    table.write_u32(40, PCAT_COMPAT);
    for id in 0..vcpus {
        // Type 0, length 8: processor uid, APIC id, flags (enabled).
        table.append_slice(&[0, 8, id, id, 1, 0, 0, 0]);
    }
    let mut ioapic = vec![1u8, 12, 0, 0];
    ioapic.extend_from_slice(&const { int_cast::u32_of_u64(IOAPIC_ADDR) }.to_le_bytes());
    ioapic.extend_from_slice(&0u32.to_le_bytes());
    table.append_slice(&ioapic);
    // Type 4, length 6: every processor (0xff), flags 0, LINT1.
    table.append_slice(&[4, 6, 0xff, 0, 0, 1]);
    write_length(&mut table);
    table.update_checksum();
    table
}

/// The DSDT: `\_SB` with the host bridge, COM1, the power button and the
/// GED; `_S5` for power-off.
fn dsdt(platform: &Platform) -> Sdt {
    let mut table = Sdt::new(*b"DSDT", 36, 6, OEM_ID, OEM_TABLE, OEM_REVISION);
    // Each object is built and serialized in one statement: the AML
    // builders borrow their parts.

    // COM1: PNP0501 on 0x3F8, ISA IRQ 4.
    aml::Device::new(
        "_SB_.COM1".into(),
        vec![
            &aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0501")),
            &aml::Name::new("_UID".into(), &aml::ONE),
            &aml::Name::new(
                "_CRS".into(),
                &aml::ResourceTemplate::new(vec![
                    &aml::IO::new(
                        const { int_cast::u16_of_u64(SERIAL_PORT) },
                        const { int_cast::u16_of_u64(SERIAL_PORT) },
                        1,
                        8,
                    ),
                    &aml::Interrupt::new(true, true, false, false, SERIAL_GSI),
                ]),
            ),
        ],
    )
    .to_aml_bytes(&mut table);

    // The CMOS RTC: PNP0B00 on 0x70-0x71, which Linux's rtc_cmos binds to. No IRQ: the
    // device never raises one, so rtc_cmos goes without alarms (with a hardware-reduced
    // FADT it assumes no legacy IRQ 8 either) and update interrupts are polled.
    aml::Device::new(
        "_SB_.RTC_".into(),
        vec![
            &aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0B00")),
            &aml::Name::new(
                "_CRS".into(),
                &aml::ResourceTemplate::new(vec![&aml::IO::new(
                    const { int_cast::u16_of_u64(RTC_PORT) },
                    const { int_cast::u16_of_u64(RTC_PORT) },
                    1,
                    const { int_cast::u8_of_u64(RTC_PORT_LEN) },
                )]),
            ),
        ],
    )
    .to_aml_bytes(&mut table);

    // Power button: a control-method button the GED notifies.
    aml::Device::new(
        "_SB_.PWRB".into(),
        vec![
            &aml::Name::new("_HID".into(), &aml::EISAName::new("PNP0C0C")),
            &aml::Name::new("_UID".into(), &aml::ZERO),
        ],
    )
    .to_aml_bytes(&mut table);

    // GED: its interrupt says "read the status port"; bit 0 is the power
    // button: `_EVT` reads GDAT and notifies PWRB (0x80: button pressed).
    // The interrupt is a level, up while the status has a bit set (see
    // `platform`): a press before the guest enables it is not lost.
    let ged_port = usize::from(GED_STATUS_PORT);
    aml::Device::new(
        "_SB_.GED_".into(),
        vec![
            &aml::Name::new("_HID".into(), &"ACPI0013"),
            &aml::Name::new("_UID".into(), &aml::ZERO),
            &aml::Name::new(
                "_CRS".into(),
                // Consumer, level-triggered, active high, exclusive.
                &aml::ResourceTemplate::new(vec![&aml::Interrupt::new(
                    true, false, false, false, GED_GSI,
                )]),
            ),
            &aml::OpRegion::new(
                "GDST".into(),
                aml::OpRegionSpace::SystemIO,
                &ged_port,
                &aml::ONE,
            ),
            &aml::Field::new(
                "GDST".into(),
                aml::FieldAccessType::Byte,
                aml::FieldLockRule::NoLock,
                aml::FieldUpdateRule::WriteAsZeroes,
                vec![aml::FieldEntry::Named(*b"GDAT", 8)],
            ),
            &aml::Method::new(
                "_EVT".into(),
                1,
                true,
                vec![
                    &aml::Store::new(&aml::Local(0), &aml::Path::new("GDAT")),
                    &aml::And::new(&aml::Local(1), &aml::Local(0), &aml::ONE),
                    &aml::If::new(
                        &aml::Local(1),
                        vec![&aml::Notify::new(&aml::Path::new("\\_SB_.PWRB"), &0x80u8)],
                    ),
                ],
            ),
        ],
    )
    .to_aml_bytes(&mut table);

    // S5: the SLP_TYP value the guest writes to the sleep control register.
    aml::Name::new(
        "_S5_".into(),
        &aml::Package::new(vec![&SLP_TYP_S5, &aml::ZERO]),
    )
    .to_aml_bytes(&mut table);

    if platform.pci {
        table.append_slice(&pci_host_bridge());
    }
    write_length(&mut table);
    table.update_checksum();
    table
}

/// Writes the table's length into its header (offset 4).
fn write_length(table: &mut Sdt) {
    // A cast the lints refuse, allowed here once: the tables built here are a few KiB (one
    // MADT entry per vCPU, a DSDT of a handful of devices), far below 4 GiB.
    #[allow(clippy::cast_possible_truncation)]
    let len = table.len() as u32;
    table.write_u32(4, len);
}

/// PCI0: PCIe host bridge, segment 0, bus 0 only, with the 0xCF8 ports,
/// the rest of the I/O space and the 32-bit BAR window as resources. Its AML.
fn pci_host_bridge() -> Vec<u8> {
    let bus = aml::AddressSpace::new_bus_number(0u16, 0u16);
    let cfg_ports = aml::IO::new(0xcf8, 0xcf8, 1, 8);
    let io_low = aml::AddressSpace::new_io(0u16, 0xcf7u16, None);
    let io_high = aml::AddressSpace::new_io(0xd00u16, 0xffffu16, None);
    let window = aml::AddressSpace::new_memory(
        aml::AddressSpaceCacheable::NotCacheable,
        true,
        const { int_cast::u32_of_u64(PCI_MMIO_BASE) },
        const { int_cast::u32_of_u64(PCI_MMIO_BASE + PCI_MMIO_SIZE - 1) },
        None,
    );
    let crs = aml::ResourceTemplate::new(vec![&bus, &cfg_ports, &io_low, &io_high, &window]);
    let hid = aml::EISAName::new("PNP0A08");
    let cid = aml::EISAName::new("PNP0A03");
    let names = [
        aml::Name::new("_HID".into(), &hid),
        aml::Name::new("_CID".into(), &cid),
        aml::Name::new("_ADR".into(), &aml::ZERO),
        aml::Name::new("_SEG".into(), &aml::ZERO),
        aml::Name::new("_UID".into(), &aml::ZERO),
        aml::Name::new("_BBN".into(), &aml::ZERO),
        aml::Name::new("_CRS".into(), &crs),
    ];
    let device = aml::Device::new(
        "_SB_.PCI0".into(),
        names.iter().map(|n| n as &dyn Aml).collect(),
    );
    to_bytes(&device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dsdt_describes_the_rtc_with_its_ports_and_no_interrupt() {
        let dsdt = to_bytes(&dsdt(&Platform {
            vcpus: 1,
            pci: true,
        }));
        let at = dsdt
            .windows(4)
            .position(|w| w == b"RTC_")
            .expect("an RTC_ device");
        // The device: _HID EISAID("PNP0B00"), then a _CRS with one I/O descriptor
        // (decode16, 0x70-0x70, alignment 1, 2 ports) and the end tag.
        let device = &dsdt[at..];
        let hid = [0x0c, 0x41, 0xd0, 0x0b, 0x00];
        let io = [0x47, 0x01, 0x70, 0x00, 0x70, 0x00, 0x01, 0x02, 0x79];
        let find = |what: &[u8]| device.windows(what.len()).position(|w| w == what);
        let hid_at = find(&hid).expect("PNP0B00");
        let io_at = find(&io).expect("the I/O ports, then the end of the template");
        assert!(hid_at < 16 && io_at < 40, "{hid_at} {io_at}");
        // No IRQ descriptor (short 0x22/0x23, extended 0x89) in the template.
        let crs = &device[hid_at..io_at];
        assert!(
            !crs.iter().any(|&b| b == 0x22 || b == 0x23 || b == 0x89),
            "{crs:x?}"
        );
    }

    #[test]
    fn the_ged_interrupt_is_a_level_active_high() {
        let dsdt = to_bytes(&dsdt(&Platform {
            vcpus: 1,
            pci: true,
        }));
        let at = dsdt
            .windows(4)
            .position(|w| w == b"GED_")
            .expect("a GED_ device");
        // Extended interrupt descriptor: 0x89, length 6, flags (bit 0
        // consumer, bit 1 edge, bit 2 active low, bit 3 shared), one GSI.
        let mut descriptor = vec![0x89, 6, 0, 0b0001, 1];
        descriptor.extend_from_slice(&GED_GSI.to_le_bytes());
        let found = dsdt[at..]
            .windows(descriptor.len())
            .position(|w| w == descriptor.as_slice());
        assert!(found.is_some_and(|p| p < 64), "{:x?}", &dsdt[at..at + 64]);
    }

    #[test]
    fn the_fadt_names_the_century_register_and_does_not_deny_the_rtc() {
        let fadt = to_bytes(&fadt(0x1000));
        assert_eq!(fadt[108], 0x32, "century");
        let iapc_boot_arch = u16::from_le_bytes([fadt[109], fadt[110]]);
        assert_eq!(iapc_boot_arch & (1 << 5), 0, "CMOS RTC not present");
    }
}
