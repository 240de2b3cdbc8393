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
const NMI_VECTOR: u64 = 2;

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

// The error-code probe: installed for a moment on the vector a check
// raises with `int n`. If the word on top of the stack is the return address
// the check expected, no error code was pushed; else one was, and it is
// dropped so that iretq returns all the same.
    .global isr_probe
isr_probe:
    push rax
    mov rax, [rsp + 8]
    cmp rax, [rip + {expected}]
    je 2f
    mov qword ptr [rip + {result}], 2
    pop rax
    add rsp, 8
    iretq
2:
    mov qword ptr [rip + {result}], 1
    pop rax
    iretq

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
    .global isr_probe_addr
isr_probe_addr:
    .quad isr_probe
    "#,
    expected = sym PROBE_EXPECTED_RIP,
    result = sym PROBE_RESULT,
);

const STUBS: usize = 57;

unsafe extern "C" {
    static isr_table: [u64; STUBS];
    static isr_other_addr: u64;
    static isr_probe_addr: u64;
}

/// The return address the error-code probe expects on top of the stack.
static mut PROBE_EXPECTED_RIP: u64 = 0;
/// What the probe found: 0 nothing yet, 1 no error code, 2 an error code.
static mut PROBE_RESULT: u64 = 0;

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
/// Set while a check expects the NMI handler (`int 2`).
static EXPECT_NMI: AtomicBool = AtomicBool::new(false);
/// RIP the NMI handler saw, 0 before any.
static NMI_RIP: AtomicU64 = AtomicU64::new(0);
/// A fault a check provokes: its vector + 1 (0: none expected), the length
/// of the instruction the handler skips, and the error code it saw.
static EXPECT_FAULT: AtomicU64 = AtomicU64::new(0);
static FAULT_SKIP: AtomicU64 = AtomicU64::new(0);
static FAULT_ERROR: AtomicU64 = AtomicU64::new(NO_FAULT);
/// Set while ring 3 runs for a check: the first event from ring 3 is
/// recorded (vector, error code) and returns to the kernel.
static FROM_USER: AtomicBool = AtomicBool::new(false);
static USER_VECTOR: AtomicU64 = AtomicU64::new(0);
static USER_ERROR: AtomicU64 = AtomicU64::new(0);
/// No expected fault arrived.
pub const NO_FAULT: u64 = u64::MAX;

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

fn idt() -> *mut Idt {
    core::ptr::addr_of_mut!(IDT)
}

/// The access byte (P, DPL, type) of `vector`'s gate.
fn gate_access(vector: u8) -> u8 {
    // SAFETY: only the boot vCPU touches the IDT, between installing it and
    // the end of the run; the entry exists (256 of them).
    let low = unsafe { (*idt()).0[usize::from(vector)][0] };
    (low >> 40) as u8
}

fn set_gate_access(vector: u8, access: u8) {
    // SAFETY: as in `gate_access`; interrupts are off while checks run.
    unsafe {
        let entry = &mut (*idt()).0[usize::from(vector)][0];
        *entry = (*entry & !(0xff << 40)) | (u64::from(access) << 40);
    }
}

fn full_limit() -> u16 {
    (core::mem::size_of::<Idt>() - 1) as u16
}

/// Runs `int 2`: returns (RIP the NMI handler saw, the address after `int 2`).
pub fn int2_nmi() -> (u64, u64) {
    NMI_RIP.store(0, Ordering::SeqCst);
    EXPECT_NMI.store(true, Ordering::SeqCst);
    let after: u64;
    // SAFETY: the NMI handler records RIP and returns past `int 2`.
    unsafe { asm!("lea {0}, [rip + 2f]", "int 2", "2:", out(reg) after, options(nostack)) };
    EXPECT_NMI.store(false, Ordering::SeqCst);
    (NMI_RIP.load(Ordering::SeqCst), after)
}

/// Runs `int 21` (#CP's vector, whose hardware exception pushes an error
/// code) with the error-code probe on that gate: whether the CPU pushed
/// none (`Some(true)`), one (`Some(false)`), or the probe never ran.
pub fn int21_pushes_no_error_code() -> Option<bool> {
    const VECTOR: usize = 21;
    let cs: u16;
    // SAFETY: reading CS has no side effects.
    unsafe { asm!("mov {0:x}, cs", out(reg) cs, options(nomem, nostack, preserves_flags)) };
    // SAFETY: as in `gate_access`; the probe's address is defined in the assembly above.
    let saved = unsafe {
        let saved = (*idt()).0[VECTOR];
        (*idt()).0[VECTOR] = gate(isr_probe_addr, cs);
        core::ptr::write_volatile(core::ptr::addr_of_mut!(PROBE_RESULT), 0);
        saved
    };
    // SAFETY: the probe returns past `int 21` whether or not an error code
    // was pushed; rax is the scratch register named.
    unsafe {
        asm!(
            "lea rax, [rip + 2f]",
            "mov [rip + {expected}], rax",
            "int 21",
            "2:",
            expected = sym PROBE_EXPECTED_RIP,
            out("rax") _,
            options(nostack),
        )
    };
    // SAFETY: as above.
    let result = unsafe {
        (*idt()).0[VECTOR] = saved;
        core::ptr::read_volatile(core::ptr::addr_of!(PROBE_RESULT))
    };
    match result {
        1 => Some(true),
        2 => Some(false),
        _ => None,
    }
}

/// Expects fault `vector` from the next instruction, of `skip` bytes.
fn expect_fault(vector: u64, skip: u64) {
    FAULT_ERROR.store(NO_FAULT, Ordering::SeqCst);
    FAULT_SKIP.store(skip, Ordering::SeqCst);
    EXPECT_FAULT.store(vector + 1, Ordering::SeqCst);
}

/// The error code of the expected fault ([`NO_FAULT`] if none came).
fn fault_error() -> u64 {
    EXPECT_FAULT.store(0, Ordering::SeqCst);
    FAULT_ERROR.load(Ordering::SeqCst)
}

/// Runs `entry` in ring 3 until it enters the kernel, by whatever vector:
/// (vector, error code) of that first event, which sends the vCPU back to
/// ring 0.
pub fn from_user(entry: unsafe extern "C" fn()) -> (u64, u64) {
    FROM_USER.store(true, Ordering::SeqCst);
    crate::user::run(entry);
    (USER_VECTOR.load(Ordering::SeqCst), USER_ERROR.load(Ordering::SeqCst))
}

/// Sets the DPL of `vector`'s gate; returns the one it had.
pub fn set_gate_dpl(vector: u8, dpl: u8) -> u8 {
    let access = gate_access(vector);
    set_gate_access(vector, (access & !0x60) | ((dpl & 3) << 5));
    (access >> 5) & 3
}

/// `int 0x50` through a gate marked not present: the #NP error code.
pub fn int_not_present() -> u64 {
    let access = gate_access(0x50);
    set_gate_access(0x50, access & 0x7f);
    expect_fault(11, 2);
    // SAFETY: the #NP handler skips the 2-byte instruction.
    unsafe { asm!("int 0x50", options(nostack)) };
    set_gate_access(0x50, access);
    fault_error()
}

/// `int 0x60` with the IDT's limit cut to vectors 0..=0x5f: the #GP
/// error code.
pub fn int_beyond_limit() -> u64 {
    let base = idt() as u64;
    load(base, 0x60 * 16 - 1);
    expect_fault(13, 2);
    // SAFETY: the #GP handler (vector 13, within the limit) skips the 2-byte
    // instruction; the full table is loaded again right after.
    unsafe { asm!("int 0x60", options(nostack)) };
    load(base, full_limit());
    fault_error()
}

#[unsafe(no_mangle)]
extern "C" fn guest_trap(frame: &mut TrapFrame) {
    let vector = frame.vector;
    if vector == NMI_VECTOR && EXPECT_NMI.swap(false, Ordering::SeqCst) {
        NMI_RIP.store(frame.rip, Ordering::SeqCst);
        return;
    }
    if frame.cs & 3 == 3 && FROM_USER.swap(false, Ordering::SeqCst) {
        USER_VECTOR.store(vector, Ordering::SeqCst);
        USER_ERROR.store(frame.error, Ordering::SeqCst);
        (frame.rip, frame.cs, frame.rflags, frame.rsp, frame.ss) = crate::user::return_frame();
        return;
    }
    if EXPECT_FAULT.load(Ordering::SeqCst) == vector + 1 {
        EXPECT_FAULT.store(0, Ordering::SeqCst);
        FAULT_ERROR.store(frame.error, Ordering::SeqCst);
        frame.rip += FAULT_SKIP.load(Ordering::SeqCst);
        return;
    }
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
