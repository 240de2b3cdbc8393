//! Initial vCPU state for the Linux 64-bit boot protocol: long mode with the
//! VMM's page tables, flat segments, boot MSRs and the local APIC's LINT
//! pins (CPUID is `cpuid`'s).

use kvm_bindings::{Msrs, kvm_fpu, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_segment};
use kvm_ioctls::VcpuFd;

use super::layout::*;
use super::{Error, Result, kvm_err};

/// GDT: null, 64-bit code (0x08), data (0x10), TSS (0x18).
pub(crate) const GDT: [u64; 4] = [
    0,
    gdt_entry(0xa09b, 0, 0xfffff),
    gdt_entry(0xc093, 0, 0xfffff),
    gdt_entry(0x808b, 0, 0xfffff),
];
const CODE_SELECTOR: u16 = 0x08;
const DATA_SELECTOR: u16 = 0x10;
const TSS_SELECTOR: u16 = 0x18;

/// Builds a descriptor from its flags (the access byte plus the high flag
/// nibble shifted into bits 12..15), base and 20-bit limit.
const fn gdt_entry(flags: u16, base: u32, limit: u32) -> u64 {
    ((base as u64 & 0xff00_0000) << 32)
        | ((flags as u64 & 0xf0ff) << 40)
        | ((limit as u64 & 0x000f_0000) << 32)
        | ((base as u64 & 0x00ff_ffff) << 16)
        | (limit as u64 & 0x0000_ffff)
}

/// The `kvm_segment` KVM wants for a GDT descriptor.
fn segment(entry: u64, selector: u16) -> kvm_segment {
    let granularity = ((entry >> 55) & 1) as u8;
    // The 20-bit limit: its three low bytes.
    let [l0, l1, l2, ..] = (((entry >> 32) & 0x000f_0000) | (entry & 0xffff)).to_le_bytes();
    let raw_limit = u32::from_le_bytes([l0, l1, l2, 0]);
    kvm_segment {
        base: ((entry >> 16) & 0x00ff_ffff) | ((entry >> 32) & 0xff00_0000),
        limit: if granularity == 1 {
            (raw_limit << 12) | 0xfff
        } else {
            raw_limit
        },
        selector,
        type_: ((entry >> 40) & 0xf) as u8,
        present: ((entry >> 47) & 1) as u8,
        dpl: ((entry >> 45) & 3) as u8,
        db: ((entry >> 54) & 1) as u8,
        s: ((entry >> 44) & 1) as u8,
        l: ((entry >> 53) & 1) as u8,
        g: granularity,
        avl: ((entry >> 52) & 1) as u8,
        unusable: 0,
        padding: 0,
    }
}

const X86_CR0_PE_PG_AND_CACHING: u64 = 0x8005_0033;
const X86_CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;

/// Long mode, paging with the VMM's identity map, flat segments.
pub(crate) fn set_sregs(vcpu: &VcpuFd) -> Result<()> {
    let mut sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    let code = segment(GDT[1], CODE_SELECTOR);
    let data = segment(GDT[2], DATA_SELECTOR);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = segment(GDT[3], TSS_SELECTOR);
    sregs.gdt.base = GDT_ADDR;
    sregs.gdt.limit = const { int_cast::u16_of_u64(std::mem::size_of_val(&GDT) as u64 - 1) };
    sregs.idt.base = IDT_ADDR;
    sregs.idt.limit = 7;
    // Set outright: OR-ing PE|PG into the reset value leaves caching disabled.
    sregs.cr0 = X86_CR0_PE_PG_AND_CACHING;
    sregs.cr3 = PML4_ADDR;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.efer |= EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(kvm_err("KVM_SET_SREGS"))
}

/// General registers: the entry point, a stack, and RSI = zero page on the
/// boot vCPU (0 on the others).
pub(crate) fn set_regs(vcpu: &VcpuFd, entry: u64, stack: u64, boot_params: u64) -> Result<()> {
    let regs = kvm_regs {
        rflags: 0x2,
        rip: entry,
        rsp: stack,
        rbp: stack,
        rsi: boot_params,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))
}

/// x87 control word and MXCSR at their power-on values.
pub(crate) fn set_fpu(vcpu: &VcpuFd) -> Result<()> {
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(kvm_err("KVM_SET_FPU"))
}

const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_TYPE_WRBACK: u64 = 6;

/// The MSRs a Linux kernel expects a boot loader to leave in a known state.
pub(crate) fn set_msrs(vcpu: &VcpuFd) -> Result<()> {
    let entry = |index, data| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    };
    let entries = [
        entry(MSR_IA32_SYSENTER_CS, 0),
        entry(MSR_IA32_SYSENTER_ESP, 0),
        entry(MSR_IA32_SYSENTER_EIP, 0),
        entry(MSR_STAR, 0),
        entry(MSR_CSTAR, 0),
        entry(MSR_KERNEL_GS_BASE, 0),
        entry(MSR_SYSCALL_MASK, 0),
        entry(MSR_LSTAR, 0),
        entry(MSR_IA32_TSC, 0),
        entry(MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        entry(MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_TYPE_WRBACK),
    ];
    let msrs = Msrs::from_entries(&entries).map_err(Error::MsrList)?;
    let set = vcpu.set_msrs(&msrs).map_err(kvm_err("KVM_SET_MSRS"))?;
    if set != entries.len() {
        return Err(Error::Msrs {
            set,
            wanted: entries.len(),
        });
    }
    Ok(())
}

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_EXTINT: u32 = 0x7;
const APIC_MODE_NMI: u32 = 0x4;

/// LINT0 delivers ExtINT (the PIC), LINT1 delivers NMI, as a BIOS leaves them.
pub(crate) fn set_lint(vcpu: &VcpuFd) -> Result<()> {
    let mut lapic = vcpu.get_lapic().map_err(kvm_err("KVM_GET_LAPIC"))?;
    for (reg, mode) in [(APIC_LVT0, APIC_MODE_EXTINT), (APIC_LVT1, APIC_MODE_NMI)] {
        let bytes: [u8; 4] = std::array::from_fn(|i| lapic.regs[reg + i].cast_unsigned());
        let value = u32::from_le_bytes(bytes);
        let value = (value & !0x700) | (mode << 8);
        for (i, b) in value.to_le_bytes().iter().enumerate() {
            lapic.regs[reg + i] = b.cast_signed();
        }
    }
    vcpu.set_lapic(&lapic).map_err(kvm_err("KVM_SET_LAPIC"))
}

/// Marks a secondary vCPU runnable: it starts at its registers' RIP instead
/// of waiting for INIT/SIPI (the in-kernel local APIC's default).
pub(crate) fn set_runnable(vcpu: &VcpuFd) -> Result<()> {
    let state = kvm_mp_state {
        mp_state: kvm_bindings::KVM_MP_STATE_RUNNABLE,
    };
    vcpu.set_mp_state(state)
        .map_err(kvm_err("KVM_SET_MP_STATE"))
}

/// Initial stack pointer of vCPU `index` (the boot vCPU uses the boot stack).
pub(crate) fn stack_for(index: u8) -> u64 {
    if index == 0 {
        BOOT_STACK_ADDR
    } else {
        AP_STACKS_ADDR + u64::from(index) * AP_STACK_SIZE - 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gdt_entries_decode_to_flat_long_mode_segments() {
        assert_eq!(GDT[1], 0x00af_9b00_0000_ffff);
        assert_eq!(GDT[2], 0x00cf_9300_0000_ffff);
        assert_eq!(GDT[3], 0x008f_8b00_0000_ffff);
        let code = segment(GDT[1], CODE_SELECTOR);
        assert_eq!(
            (code.l, code.db, code.type_, code.present, code.s),
            (1, 0, 0xb, 1, 1)
        );
        assert_eq!((code.base, code.limit), (0, 0xffff_ffff));
        let data = segment(GDT[2], DATA_SELECTOR);
        assert_eq!((data.l, data.db, data.type_), (0, 1, 3));
        let tss = segment(GDT[3], TSS_SELECTOR);
        assert_eq!((tss.s, tss.type_), (0, 0xb));
    }

    #[test]
    fn stacks_stay_in_low_ram_and_apart() {
        assert_eq!(stack_for(0), BOOT_STACK_ADDR);
        for i in 1..=crate::config::MAX_VCPUS {
            let top = stack_for(i);
            assert!(
                top > AP_STACKS_ADDR && top < EBDA_START,
                "vcpu {i}: {top:#x}"
            );
            assert!(top - stack_for(i - 1).max(AP_STACKS_ADDR) <= AP_STACK_SIZE || i == 1);
        }
    }
}
