//! Ring 3, for the `interrupts` check: a GDT with user segments and a TSS
//! (the stack the CPU switches to when an interrupt leaves ring 3), the
//! first 2 MiB (this program) user-accessible for the time of the check,
//! and a way into ring 3 and back out through the fault the check expects.

use core::arch::{asm, global_asm};
use core::ptr::{addr_of, addr_of_mut};

pub const KERNEL_CS: u64 = 0x08;
pub const KERNEL_SS: u64 = 0x10;
const USER_SS: u64 = 0x18 | 3;
const USER_CS: u64 = 0x20 | 3;
const TSS_SELECTOR: u16 = 0x28;
/// Page-table entry bit: user accessible.
const PTE_USER: u64 = 1 << 2;

/// null, kernel code and data (as the VMM's), user data and code (DPL 3),
/// the 64-bit TSS (two entries).
#[repr(C, align(16))]
struct Gdt([u64; 7]);

static mut GDT: Gdt = Gdt([
    0,
    0x00af_9b00_0000_ffff,
    0x00cf_9300_0000_ffff,
    0x00cf_f300_0000_ffff,
    0x00af_fb00_0000_ffff,
    0,
    0,
]);

/// The 64-bit TSS: only RSP0 and the I/O map base matter here.
#[repr(C, packed)]
struct Tss {
    reserved0: u32,
    rsp: [u64; 3],
    reserved1: u64,
    ist: [u64; 7],
    reserved2: u64,
    reserved3: u16,
    iomap_base: u16,
}

static mut TSS: Tss = Tss {
    reserved0: 0,
    rsp: [0; 3],
    reserved1: 0,
    ist: [0; 7],
    reserved2: 0,
    reserved3: 0,
    iomap_base: 0,
};

#[repr(C, align(16))]
struct Stack([u8; 8192]);

/// Where an interrupt from ring 3 lands.
static mut KERNEL_STACK: Stack = Stack([0; 8192]);
static mut USER_STACK: Stack = Stack([0; 8192]);

/// The kernel's RSP and return address while ring 3 runs (`enter_user`).
#[unsafe(no_mangle)]
static mut RING0_RSP: u64 = 0;
#[unsafe(no_mangle)]
static mut RING0_RIP: u64 = 0;

global_asm!(
    r#"
    .section .text.user, "ax"
    // rdi = ring-3 entry, rsi = ring-3 stack. Returns when the handler of
    // the fault the caller expects sends the vCPU back to ring 0 (label 1).
    .global enter_user
enter_user:
    push rbx
    push rbp
    push r12
    push r13
    push r14
    push r15
    mov [rip + RING0_RSP], rsp
    lea rax, [rip + 1f]
    mov [rip + RING0_RIP], rax
    push {user_ss}
    push rsi
    push 2
    push {user_cs}
    push rdi
    iretq
1:
    pop r15
    pop r14
    pop r13
    pop r12
    pop rbp
    pop rbx
    ret

    // Ring-3 code: one instruction that enters the kernel, then ud2 (an
    // unexpected #UD if the kernel ever returned to ring 3).
    .global user_int_0x30
user_int_0x30:
    int 0x30
    ud2
    .global user_int3
user_int3:
    int3
    ud2
    .global user_int2
user_int2:
    int 2
    ud2
    "#,
    user_ss = const USER_SS,
    user_cs = const USER_CS,
);

unsafe extern "C" {
    fn enter_user(entry: u64, stack: u64);
    pub fn user_int_0x30();
    pub fn user_int3();
    pub fn user_int2();
    static mut guest_pml4: [u64; 512];
    static mut guest_pdpt: [u64; 512];
    static mut guest_pd: [u64; 2048];
}

/// Loads this module's GDT and TSS on the calling (boot) vCPU. The kernel
/// selectors stay those of the VMM's GDT, so CS and SS stay valid.
pub fn setup() {
    // SAFETY: only the boot vCPU runs the check, once; nothing else uses
    // these statics.
    unsafe {
        let stack_top = addr_of!(KERNEL_STACK) as u64 + 8192;
        let tss = addr_of_mut!(TSS);
        (*tss).rsp[0] = stack_top;
        (*tss).iomap_base = core::mem::size_of::<Tss>() as u16;
        let base = tss as u64;
        let limit = core::mem::size_of::<Tss>() as u64 - 1;
        // Present, DPL 0, type 9 (available 64-bit TSS).
        let low = (limit & 0xffff)
            | (base & 0xff_ffff) << 16
            | 0x89 << 40
            | ((limit >> 16) & 0xf) << 48
            | ((base >> 24) & 0xff) << 56;
        let gdt = addr_of_mut!(GDT);
        (*gdt).0[5] = low;
        (*gdt).0[6] = base >> 32;
        #[repr(C, packed)]
        struct Pointer {
            limit: u16,
            base: u64,
        }
        let pointer = Pointer {
            limit: (core::mem::size_of::<Gdt>() - 1) as u16,
            base: gdt as u64,
        };
        asm!("lgdt [{0}]", in(reg) &pointer, options(readonly, nostack, preserves_flags));
        asm!("ltr {0:x}", in(reg) TSS_SELECTOR, options(nostack, preserves_flags));
    }
}

/// Makes the first 2 MiB (this program, its code and stacks) user
/// accessible, or not, and flushes the TLB.
pub fn user_pages(on: bool) {
    // SAFETY: the boot vCPU's own page tables (static data of start.rs);
    // only the U bit of the entries covering the first 2 MiB changes, and
    // reloading CR3 flushes the old translations.
    unsafe {
        for entry in [
            addr_of_mut!(guest_pml4[0]),
            addr_of_mut!(guest_pdpt[0]),
            addr_of_mut!(guest_pd[0]),
        ] {
            let value = core::ptr::read_volatile(entry);
            let value = if on { value | PTE_USER } else { value & !PTE_USER };
            core::ptr::write_volatile(entry, value);
        }
        asm!("mov {0}, cr3", "mov cr3, {0}", out(reg) _, options(nostack, preserves_flags));
    }
}

/// Runs `entry` in ring 3 until it enters the kernel; the handler of the
/// fault or interrupt the caller expects must return to ring 0
/// ([`return_frame`]), else this never returns.
pub fn run(entry: unsafe extern "C" fn()) {
    // SAFETY: the user stack is this module's; `enter_user` returns through
    // the frame `return_frame` writes, with the callee-saved registers kept.
    unsafe {
        let stack_top = addr_of!(USER_STACK) as u64 + 8192;
        enter_user(entry as u64, stack_top);
    }
}

/// The interrupt frame that resumes the kernel where [`run`] left it:
/// (RIP, CS, RFLAGS, RSP, SS).
pub fn return_frame() -> (u64, u64, u64, u64, u64) {
    // SAFETY: written by `enter_user` before it left ring 0.
    let (rip, rsp) = unsafe {
        (
            core::ptr::read_volatile(addr_of!(RING0_RIP)),
            core::ptr::read_volatile(addr_of!(RING0_RSP)),
        )
    };
    (rip, KERNEL_CS, 2, rsp, KERNEL_SS)
}
