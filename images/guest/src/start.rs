//! The entry point and the memory functions the compiler expects.
//!
//! Every vCPU enters at `_start` (0x100000) in 64-bit mode. The boot vCPU
//! (initial APIC id 0) has RSI = boot_params; the VMM starts the others
//! directly at the same address. Each vCPU picks its own stack from its APIC
//! id, so the guest does not depend on where the VMM put RSP, and loads its
//! own page tables (an identity map of the low 4 GiB in 2 MiB pages, built at
//! link time), so it does not depend on how much the VMM mapped: Firecracker
//! maps only the first 1 GiB, below the IOAPIC, the local APIC and the
//! virtio-mmio window. Packaged as a
//! bzImage (flat binary at 0x100000), the guest enters at 0x100200 instead,
//! which jumps here.

use core::arch::global_asm;

/// Most vCPUs the guest gives a stack to; others park at once.
pub const MAX_CPUS: u32 = 16;
/// Bytes of stack per vCPU.
pub const STACK_SIZE: usize = 16 * 1024;

global_asm!(
    r#"
    .section .text.start, "ax"
    .global _start
    .code64
_start:
    cli
    cld
    lea rax, [rip + guest_pml4]
    mov cr3, rax
    mov r12, rsi
    mov eax, 1
    xor ecx, ecx
    cpuid
    shr ebx, 24
    cmp ebx, {max_cpus}
    jae 3f
    mov eax, ebx
    inc eax
    imul rax, rax, {stack_size}
    lea rsp, [rip + guest_stacks]
    add rsp, rax
    xor ebp, ebp
    mov edi, ebx
    mov rsi, r12
    test ebx, ebx
    jnz 2f
    call bsp_main
    jmp 3f
2:
    call ap_main
3:
    cli
    hlt
    jmp 3b

    // The 64-bit entry of a bzImage is 0x200 bytes into the protected-mode
    // kernel: the guest can be packaged as a bzImage too (see the vmm tests).
    .org 0x200
bzimage_entry_64:
    jmp _start

    // PML4 -> one PDPT -> four page directories of 512 2 MiB pages each
    // (present, writable, large page): physical = virtual for 0..4 GiB.
    .section .data.page_tables, "aw"
    .balign 4096
    .global guest_pml4
    .global guest_pdpt
    .global guest_pd
guest_pml4:
    .quad guest_pdpt + 0x3
    .fill 511, 8, 0
guest_pdpt:
    .quad guest_pd + 0x3
    .quad guest_pd + 0x1003
    .quad guest_pd + 0x2003
    .quad guest_pd + 0x3003
    .fill 508, 8, 0
guest_pd:
    .set page, 0
    .rept 2048
    .quad page + 0x83
    .set page, page + 0x200000
    .endr

    .section .bss.stacks, "aw", @nobits
    .balign 16
guest_stacks:
    .skip {stacks_total}
    "#,
    max_cpus = const MAX_CPUS,
    stack_size = const STACK_SIZE,
    stacks_total = const STACK_SIZE * MAX_CPUS as usize,
);

// Written in assembly so the compiler cannot turn their loops back into calls
// to themselves. `rep movsb`/`rep stosb` are among the instructions the KVM
// emulator runs fast.
global_asm!(
    r#"
    .section .text.memfuncs, "ax"
    .global memcpy
memcpy:
    mov rax, rdi
    mov rcx, rdx
    rep movsb
    ret

    .global memmove
memmove:
    mov rax, rdi
    cmp rdi, rsi
    jbe 1f
    lea r8, [rsi + rdx]
    cmp rdi, r8
    jae 1f
    lea rsi, [rsi + rdx - 1]
    lea rdi, [rdi + rdx - 1]
    mov rcx, rdx
    std
    rep movsb
    cld
    ret
1:
    mov rcx, rdx
    rep movsb
    ret

    .global memset
memset:
    mov r9, rdi
    mov eax, esi
    mov rcx, rdx
    rep stosb
    mov rax, r9
    ret

    .global memcmp
    .global bcmp
memcmp:
bcmp:
    xor eax, eax
    test rdx, rdx
    jz 2f
1:
    movzx eax, byte ptr [rdi]
    movzx ecx, byte ptr [rsi]
    sub eax, ecx
    jnz 2f
    inc rdi
    inc rsi
    dec rdx
    jnz 1b
2:
    ret
    "#
);
