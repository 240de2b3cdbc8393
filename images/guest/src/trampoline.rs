//! Starting secondary vCPUs the way Linux does: INIT and two startup IPIs
//! from the boot vCPU, each AP entering a real-mode trampoline that switches
//! to long mode (with the VMM's GDT and page tables, read from the boot vCPU)
//! and jumps to `_start`. Used by the `smp` check when the VMM leaves the APs
//! waiting (`vmm run --ap-start init-sipi`, the default).

use core::arch::{asm, global_asm};

/// Physical page the trampoline is copied to (below 1 MiB, free in the
/// boot layout); the startup IPI vector is its page number.
const TRAMPOLINE_ADDR: u64 = 0x6000;

global_asm!(
    r#"
    .section .text.trampoline, "ax"
    .global trampoline_start
    .global trampoline_end
    .global trampoline_gdtr
    .global trampoline_cr3
    .code16
trampoline_start:
    jmp 1f
    // Patched by the boot vCPU: its GDTR at +8, its CR3 at +0x18.
    .balign 8
trampoline_gdtr:
    .word 0
    .quad 0
    .balign 8
trampoline_cr3:
    .long 0
1:
    cli
    xor ax, ax
    mov ds, ax
    lgdt [{gdtr}]
    mov eax, cr4
    or eax, 0x20
    mov cr4, eax
    mov eax, dword ptr [{cr3}]
    mov cr3, eax
    mov ecx, 0xc0000080
    rdmsr
    or eax, 0x100
    wrmsr
    mov eax, cr0
    or eax, 0x80000001
    mov cr0, eax
    // ljmpl 0x08:trampoline_64 (32-bit offset)
    .byte 0x66, 0xea
    .long {base} + trampoline_64 - trampoline_start
    .word 0x08
    .code64
trampoline_64:
    mov ax, 0x10
    mov ds, ax
    mov es, ax
    mov ss, ax
    movabs rax, offset _start
    jmp rax
trampoline_end:
    .code64
    "#,
    base = const TRAMPOLINE_ADDR,
    gdtr = const TRAMPOLINE_ADDR + 8,
    cr3 = const TRAMPOLINE_ADDR + 0x18,
);

unsafe extern "C" {
    static trampoline_start: u8;
    static trampoline_end: u8;
    static trampoline_gdtr: u8;
    static trampoline_cr3: u8;
}

const LAPIC_ICR_LOW: u64 = 0xfee0_0300;
const LAPIC_ICR_HIGH: u64 = 0xfee0_0310;
/// All but self, INIT, level assert.
const ICR_INIT_ALL_BUT_SELF: u32 = 0x000c_4500;
/// All but self, startup.
const ICR_SIPI_ALL_BUT_SELF: u32 = 0x000c_4600;

/// Copies the trampoline (patched with this vCPU's GDT and CR3) below 1 MiB
/// and sends INIT, SIPI, SIPI to every other vCPU.
pub fn start_secondaries() {
    let mut gdtr = [0u8; 10];
    let cr3: u64;
    // SAFETY: sgdt stores 10 bytes into our buffer; reading CR3 has no effects.
    unsafe {
        asm!("sgdt [{0}]", in(reg) gdtr.as_mut_ptr(), options(nostack, preserves_flags));
        asm!("mov {0}, cr3", out(reg) cr3, options(nomem, nostack, preserves_flags));
    }
    // SAFETY: the symbols delimit the trampoline in our own image; the
    // destination page is free low memory (see TRAMPOLINE_ADDR). The patch
    // offsets lie inside the copied range.
    unsafe {
        let start = &raw const trampoline_start as usize;
        let len = &raw const trampoline_end as usize - start;
        core::ptr::copy_nonoverlapping(start as *const u8, TRAMPOLINE_ADDR as *mut u8, len);
        let gdtr_at = TRAMPOLINE_ADDR as usize + (&raw const trampoline_gdtr as usize - start);
        core::ptr::copy_nonoverlapping(gdtr.as_ptr(), gdtr_at as *mut u8, gdtr.len());
        let cr3_at = TRAMPOLINE_ADDR as usize + (&raw const trampoline_cr3 as usize - start);
        core::ptr::write_volatile(cr3_at as *mut u32, cr3 as u32);
    }
    crate::io::mmio_write32(LAPIC_ICR_HIGH, 0);
    crate::io::mmio_write32(LAPIC_ICR_LOW, ICR_INIT_ALL_BUT_SELF);
    crate::irq::sleep_ms(10);
    let vector = (TRAMPOLINE_ADDR >> 12) as u32;
    for _ in 0..2 {
        crate::io::mmio_write32(LAPIC_ICR_LOW, ICR_SIPI_ALL_BUT_SELF | vector);
        crate::irq::sleep_ms(1);
    }
}
