//! Guest-physical memory layout (the Linux x86-64 boot protocol as
//! Firecracker lays it out; see vmm/docs/guest-platform.md).

/// Global descriptor table.
pub(crate) const GDT_ADDR: u64 = 0x500;
/// An empty interrupt descriptor table (the guest installs its own).
pub(crate) const IDT_ADDR: u64 = 0x520;
/// The zero page (`struct boot_params`).
pub(crate) const ZERO_PAGE_ADDR: u64 = 0x7000;
/// Initial stack pointer of the boot vCPU.
pub(crate) const BOOT_STACK_ADDR: u64 = 0x8ff0;
/// Page tables: PML4, one PDPT and four page directories of 2 MiB pages,
/// identity-mapping the low 4 GiB (including the MMIO window).
pub(crate) const PML4_ADDR: u64 = 0x9000;
pub(crate) const PDPT_ADDR: u64 = 0xa000;
pub(crate) const PD_ADDR: u64 = 0xb000;
pub(crate) const PD_COUNT: u64 = 4;
/// Kernel command line and its maximum size (including the NUL).
pub(crate) const CMDLINE_ADDR: u64 = 0x20000;
pub(crate) const CMDLINE_MAX_SIZE: usize = 2048;
/// Stacks the VMM gives secondary vCPUs it starts directly (vCPU i's stack
/// ends at AP_STACKS_ADDR + i * AP_STACK_SIZE).
pub(crate) const AP_STACKS_ADDR: u64 = 0x30000;
pub(crate) const AP_STACK_SIZE: u64 = 0x400;
/// Start of the extended BIOS data area: RAM below it is usable.
pub(crate) const EBDA_START: u64 = 0x9fc00;
/// The BIOS area up to 1 MiB ([`HIMEM_START`]), which the e820 map leaves out
/// of RAM: the ACPI tables from its start (`acpi::RSDP_ADDR`), then the MP
/// table and the SMBIOS tables in its last 64 KiB, where Linux looks for their
/// entry points.
pub(crate) const BIOS_AREA_START: u64 = 0xe_0000;
/// The MP table (floating pointer, then the configuration table): 5.4 KiB for
/// the most vCPUs.
pub(crate) const MPTABLE_ADDR: u64 = 0xf_0000;
pub(crate) const MPTABLE_MAX_SIZE: usize = 0x8000;
/// The SMBIOS entry point, then its structure table (see `smbios`).
pub(crate) const SMBIOS_ADDR: u64 = 0xf_8000;
pub(crate) const SMBIOS_MAX_SIZE: usize = 0x8000;
/// Interrupt controllers (emulated in KVM).
pub(crate) const IOAPIC_ADDR: u64 = 0xfec0_0000;
pub(crate) const LAPIC_ADDR: u64 = 0xfee0_0000;
/// Where high memory (and the kernel) starts.
pub(crate) const HIMEM_START: u64 = 0x10_0000;
/// The MMIO hole below 4 GiB: RAM stops here and continues at 4 GiB. It
/// holds the virtio-mmio windows, PCI's ECAM and BAR window, the IOAPIC and
/// the local APIC.
pub(crate) const MMIO_HOLE_START: u64 = 0xd000_0000;
pub(crate) const MMIO_HOLE_END: u64 = 0x1_0000_0000;
/// virtio-mmio devices: one 4 KiB window each from the start of the hole.
pub(crate) const VIRTIO_MMIO_BASE: u64 = MMIO_HOLE_START;
pub(crate) const VIRTIO_MMIO_SIZE: u64 = 0x1000;
/// Most virtio-mmio devices (their IRQs must stay below the IOAPIC's 24 pins).
pub(crate) const VIRTIO_MAX_DEVICES: u32 = 18;
/// GSI of the first virtio-mmio device (0-4 are timer, keyboard, cascade, COM2, COM1).
pub(crate) const VIRTIO_FIRST_IRQ: u32 = 5;
/// PCI configuration space (ECAM) of bus 0, announced in ACPI's MCFG.
pub(crate) const PCI_ECAM_BASE: u64 = 0xe000_0000;
pub(crate) const PCI_ECAM_SIZE: u64 = 1 << 20;
/// The 32-bit window where the VMM places PCI BARs (the host bridge's
/// memory resource in the DSDT).
pub(crate) const PCI_MMIO_BASE: u64 = 0xe100_0000;
pub(crate) const PCI_MMIO_SIZE: u64 = 0x0f00_0000;
/// TSS area KVM needs on Intel (three pages just below the IOAPIC/BIOS area).
pub(crate) const KVM_TSS_ADDR: usize = 0xfffb_d000;

/// The RAM ranges for `mem_bytes` of guest memory: one below the MMIO hole
/// and, for big guests, the rest from 4 GiB.
pub(crate) fn ram_ranges(mem_bytes: u64) -> Vec<(u64, u64)> {
    if mem_bytes <= MMIO_HOLE_START {
        vec![(0, mem_bytes)]
    } else {
        vec![
            (0, MMIO_HOLE_START),
            (MMIO_HOLE_END, mem_bytes - MMIO_HOLE_START),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_skips_the_mmio_hole() {
        assert_eq!(ram_ranges(128 << 20), vec![(0, 128 << 20)]);
        assert_eq!(ram_ranges(MMIO_HOLE_START), vec![(0, MMIO_HOLE_START)]);
        assert_eq!(
            ram_ranges(4 << 30),
            vec![
                (0, MMIO_HOLE_START),
                (MMIO_HOLE_END, (4 << 30) - MMIO_HOLE_START)
            ]
        );
    }

    #[test]
    fn boot_structures_do_not_overlap() {
        let areas = [
            (GDT_ADDR, 4 * 8),
            (IDT_ADDR, 8),
            (ZERO_PAGE_ADDR, 0x1000),
            (PML4_ADDR, 0x1000),
            (PDPT_ADDR, 0x1000),
            (PD_ADDR, PD_COUNT * 0x1000),
            (CMDLINE_ADDR, CMDLINE_MAX_SIZE as u64),
            (
                AP_STACKS_ADDR,
                AP_STACK_SIZE * (u64::from(crate::config::MAX_VCPUS) + 1),
            ),
        ];
        for (i, a) in areas.iter().enumerate() {
            for b in &areas[i + 1..] {
                assert!(
                    a.0 + a.1 <= b.0 || b.0 + b.1 <= a.0,
                    "{a:x?} overlaps {b:x?}"
                );
            }
            assert!(a.0 + a.1 <= EBDA_START);
        }
        const { assert!(BOOT_STACK_ADDR < PML4_ADDR && BOOT_STACK_ADDR > ZERO_PAGE_ADDR + 0x1000) };
    }

    #[test]
    fn bios_area_tables_do_not_overlap() {
        // ACPI ends where the MP table starts (`acpi::write` refuses to pass it).
        let areas = [
            (
                "ACPI",
                crate::acpi::RSDP_ADDR,
                MPTABLE_ADDR - crate::acpi::RSDP_ADDR,
            ),
            ("MP", MPTABLE_ADDR, int_cast::usize_to_u64(MPTABLE_MAX_SIZE)),
            (
                "SMBIOS",
                SMBIOS_ADDR,
                int_cast::usize_to_u64(SMBIOS_MAX_SIZE),
            ),
        ];
        for (i, a) in areas.iter().enumerate() {
            assert!(a.2 > 0 && a.1 % 16 == 0, "{a:x?}");
            assert!(
                a.1 >= BIOS_AREA_START && a.1 + a.2 <= HIMEM_START,
                "{a:x?} leaves the BIOS area"
            );
            for b in &areas[i + 1..] {
                assert!(
                    a.1 + a.2 <= b.1 || b.1 + b.2 <= a.1,
                    "{a:x?} overlaps {b:x?}"
                );
            }
        }
        // Linux scans 0xf0000-0xfffff for the MP and SMBIOS entry points (the
        // latter 32 bytes at a time) and 0xe0000-0xfffff for the RSDP.
        const { assert!(MPTABLE_ADDR >= 0xf_0000 && SMBIOS_ADDR >= 0xf_0000) };
        const { assert!(SMBIOS_ADDR + 32 <= HIMEM_START - 16) };
        const { assert!(EBDA_START <= BIOS_AREA_START) };
    }
}
