//! The interrupt descriptor table: every exception reaches a handler that
//! reports it (instead of a triple fault); device interrupts set a pending bit.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// First vector used for IOAPIC pins (pin N arrives on IRQ_BASE + N).
pub const IRQ_BASE: u8 = 0x20;
/// IOAPIC pins the guest routes.
pub const IRQ_PINS: u8 = 24;
/// The local APIC timer vector.
pub const TIMER_VECTOR: u8 = IRQ_BASE + IRQ_PINS;
/// The spurious-interrupt vector (ignored).
pub const SPURIOUS_VECTOR: u8 = 0xff;

const UD_VECTOR: u64 = 6;
const BP_VECTOR: u64 = 3;

// One stub per vector 0..=48 pushes a dummy error code where the CPU does not
// push one, then the vector, and jumps to the common path. Vectors above 48
// share one stub.
global_asm!(
    r#"
    .section .text.isr, "ax"
    .irp v, 0,1,2,3,4,5,6,7,9,15,16,18,19,20,22,23,24,25,26,27,28,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56
isr_\v:
    push 0
    push \v
    jmp isr_common
    .endr
    .irp v, 8,10,11,12,13,14,17,21,29,30
isr_\v:
    push \v
    jmp isr_common
    .endr
isr_other:
    push 0
    push 255
    jmp isr_common

isr_common:
    push rax
    push rcx
    push rdx
    push rsi
    push rdi
    push r8
    push r9
    push r10
    push r11
    mov rdi, rsp
    cld
    call guest_trap
    pop r11
    pop r10
    pop r9
    pop r8
    pop rdi
    pop rsi
    pop rdx
    pop rcx
    pop rax
    add rsp, 16
    iretq

    .section .rodata.isr, "a"
    .balign 8
    .global isr_table
isr_table:
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48,49,50,51,52,53,54,55,56
    .quad isr_\v
    .endr
    .global isr_other_addr
isr_other_addr:
    .quad isr_other
    "#
);

const STUBS: usize = 57;

unsafe extern "C" {
    static isr_table: [u64; STUBS];
    static isr_other_addr: u64;
}

/// What the common stub saved, lowest address first.
#[repr(C)]
pub struct TrapFrame {
    pub r11: u64,
    pub r10: u64,
    pub r9: u64,
    pub r8: u64,
    pub rdi: u64,
    pub rsi: u64,
    pub rdx: u64,
    pub rcx: u64,
    pub rax: u64,
    pub vector: u64,
    pub error: u64,
    pub rip: u64,
    pub cs: u64,
    pub rflags: u64,
    pub rsp: u64,
    pub ss: u64,
}

#[repr(C, align(16))]
struct Idt([[u64; 2]; 256]);

static mut IDT: Idt = Idt([[0; 2]; 256]);

/// Set while a check deliberately runs `ud2`.
static EXPECT_UD: AtomicBool = AtomicBool::new(false);
/// Length of the instruction a check expects #UD for (0: none).
static EXPECT_UD_LEN: AtomicU32 = AtomicU32::new(0);
/// RIP the last #BP pushed (the address after `int3`), 0 before any.
static BP_RIP: AtomicU64 = AtomicU64::new(0);
/// Counts #UD exceptions handled as expected.
static UD_SEEN: AtomicU32 = AtomicU32::new(0);
/// One bit per IOAPIC pin (and the timer) that raised an interrupt.
static PENDING: AtomicU32 = AtomicU32::new(0);

fn gate(handler: u64, cs: u16) -> [u64; 2] {
    // 64-bit interrupt gate, present, DPL 0.
    let low = (handler & 0xffff)
        | (u64::from(cs) << 16)
        | (0x8e << 40)
        | ((handler >> 16) & 0xffff) << 48;
    [low, handler >> 32]
}

/// Fills the IDT and loads it on this vCPU.
pub fn install() {
    let cs: u16;
    // SAFETY: reading CS has no side effects.
    unsafe { asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack, preserves_flags)) };
    // SAFETY: only the boot vCPU calls this, once, before enabling interrupts;
    // nothing else holds a reference to IDT.
    let idt = unsafe { &mut *core::ptr::addr_of_mut!(IDT) };
    // SAFETY: the tables are defined in the assembly above.
    let (table, other) = unsafe { (&*core::ptr::addr_of!(isr_table), isr_other_addr) };
    for (vector, entry) in idt.0.iter_mut().enumerate() {
        let handler = table.get(vector).copied().unwrap_or(other);
        *entry = gate(handler, cs);
    }
    load(
        idt.0.as_ptr() as u64,
        (core::mem::size_of::<Idt>() - 1) as u16,
    );
}

fn load(base: u64, limit: u16) {
    #[repr(C, packed)]
    struct Pointer {
        limit: u16,
        base: u64,
    }
    let pointer = Pointer { limit, base };
    // SAFETY: the table outlives the guest (it is static) or, for the empty
    // table of the triple-fault check, is never used successfully.
    unsafe { asm!("lidt [{0}]", in(reg) &pointer, options(readonly, nostack, preserves_flags)) };
}

/// Loads an empty IDT: the next exception becomes a triple fault.
pub fn load_empty() {
    load(0, 0);
}

/// Runs `ud2` with the handler primed to skip it; returns whether it was caught.
pub fn trigger_expected_ud() -> bool {
    let before = UD_SEEN.load(Ordering::SeqCst);
    EXPECT_UD.store(true, Ordering::SeqCst);
    // SAFETY: the #UD handler advances RIP past the 2-byte ud2.
    unsafe { asm!("ud2", options(nostack)) };
    UD_SEEN.load(Ordering::SeqCst) == before + 1
}

/// Runs `int3`; returns (RIP the #BP handler saw, the address after `int3`).
pub fn trigger_breakpoint() -> (u64, u64) {
    BP_RIP.store(0, Ordering::SeqCst);
    let after: u64;
    // SAFETY: the #BP handler returns to the instruction after int3.
    unsafe { asm!("lea {0}, [rip + 2f]", "int3", "2:", out(reg) after, options(nostack)) };
    (BP_RIP.load(Ordering::SeqCst), after)
}

/// Runs `stac` then `clac` (or expects #UD for both without SMAP); returns
/// (AC after stac, AC after clac, #UDs seen).
pub fn toggle_ac() -> (bool, bool, u32) {
    let before = UD_SEEN.load(Ordering::SeqCst);
    let (after_stac, after_clac): (u64, u64);
    EXPECT_UD_LEN.store(3, Ordering::SeqCst);
    // SAFETY: stac/clac only change RFLAGS.AC (the guest never touches user
    // pages); a #UD is skipped by the handler (3 bytes).
    unsafe {
        asm!("stac", "pushfq", "pop {0}", out(reg) after_stac);
        asm!("clac", "pushfq", "pop {0}", out(reg) after_clac);
    }
    EXPECT_UD_LEN.store(0, Ordering::SeqCst);
    let ac = 1 << 18;
    (
        after_stac & ac != 0,
        after_clac & ac != 0,
        UD_SEEN.load(Ordering::SeqCst) - before,
    )
}

/// Whether an interrupt source's pending bit is set (without clearing it).
pub fn peek_pending(bit: u32) -> bool {
    PENDING.load(Ordering::SeqCst) & (1 << bit) != 0
}

/// Takes (clears and returns) the pending bit of an interrupt source.
pub fn take_pending(bit: u32) -> bool {
    PENDING.fetch_and(!(1 << bit), Ordering::SeqCst) & (1 << bit) != 0
}

#[unsafe(no_mangle)]
extern "C" fn guest_trap(frame: &mut TrapFrame) {
    let vector = frame.vector;
    if vector == UD_VECTOR && EXPECT_UD.swap(false, Ordering::SeqCst) {
        frame.rip += 2;
        UD_SEEN.fetch_add(1, Ordering::SeqCst);
        return;
    }
    let ud_len = EXPECT_UD_LEN.load(Ordering::SeqCst);
    if vector == UD_VECTOR && ud_len != 0 {
        frame.rip += u64::from(ud_len);
        UD_SEEN.fetch_add(1, Ordering::SeqCst);
        return;
    }
    if vector == BP_VECTOR {
        // A trap: the saved RIP is already past int3.
        BP_RIP.store(frame.rip, Ordering::SeqCst);
        return;
    }
    if vector >= u64::from(IRQ_BASE) && vector <= u64::from(TIMER_VECTOR) {
        let pin = (vector - u64::from(IRQ_BASE)) as u32;
        PENDING.fetch_or(1 << pin, Ordering::SeqCst);
        if crate::irq::is_level(pin) {
            // Until its device's status is read (`irq::unmask`).
            crate::irq::mask(pin);
        }
        crate::irq::end_of_interrupt();
        return;
    }
    if vector == u64::from(SPURIOUS_VECTOR) {
        return;
    }
    // An exception nobody expected: report it and end the run.
    let mut detail = crate::report::Detail::new();
    detail
        .str("vector=")
        .dec(vector)
        .str(" error=")
        .hex(frame.error)
        .str(" rip=")
        .hex(frame.rip);
    let mut reporter = crate::report::SerialReporter::default();
    crate::report::Reporter::result(&mut reporter, "exception", false, detail.as_str());
    crate::exit::exit(crate::exit::EXCEPTION_CODE);
}
