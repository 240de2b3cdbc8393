//! Instructions KVM reports it could not emulate (`KVM_EXIT_INTERNAL_ERROR`,
//! suberror 1).
//!
//! Where KVM emulates guest instructions (always on an emulating KVM such as
//! `kvm_pvm`; on hardware only for MMIO and a few traps), its emulator lacks
//! some instructions. Those the VMM can finish, it finishes:
//!
//! - `int3`, `int1` (`icebp`), `int n` and `into`: delivered as the CPU
//!   delivers them (KVM's emulator implements software interrupts only in
//!   real mode): the VMM reads the IDT gate and checks it as the CPU does
//!   ([`deliver`]: the IDT limit, the gate's type, for software interrupts
//!   the gate's DPL against CPL, presence), then injects the vector with RIP
//!   past the instruction, or the #GP/#NP the check raises, with the
//!   selector error code and RIP at the instruction. `int 2` goes through
//!   KVM's NMI injection;
//! - `clac` / `stac` at CPL 0: RFLAGS.AC is cleared or set;
//! - `fwait`: nothing to do unless an unmasked x87 exception is pending
//!   (FSW.ES), which becomes #MF (Linux runs it when a task drops its FPU
//!   state, `fpu__drop`).
//!
//! At CPL 3 anything else becomes #UD (what KVM does there on its own). At
//! CPL 0 anything else ends the VM as a guest crash whose message carries
//! RIP and the instruction bytes.
//!
//! The VM enables `KVM_CAP_EXIT_ON_EMULATION_FAILURE` where KVM has it, so
//! user-mode failures come here too and the exit carries the instruction
//! bytes; without it the bytes are read through the guest's page tables.

use kvm_bindings::{
    KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES, KVM_VCPUEVENT_VALID_NMI_PENDING, kvm_regs,
    kvm_sregs,
};
use kvm_ioctls::VcpuFd;
use virtio_devices::GuestMemoryMmap;
use vm_memory::{Bytes, GuestAddress};

use super::{Result, kvm_err};

/// The longest x86 instruction.
const MAX_INSN_LEN: usize = 15;
const RFLAGS_AC: u64 = 1 << 18;
const RFLAGS_OF: u64 = 1 << 11;
const CR0_PE: u64 = 1;
const EFER_LMA: u64 = 1 << 10;
const VECTOR_DB: u8 = 1;
const VECTOR_NMI: u8 = 2;
const VECTOR_BP: u8 = 3;
const VECTOR_OF: u8 = 4;
const VECTOR_UD: u8 = 6;
const VECTOR_NP: u8 = 11;
const VECTOR_GP: u8 = 13;
const VECTOR_MF: u8 = 16;
/// x87 status word: an unmasked exception is pending.
const FSW_ES: u16 = 1 << 7;

/// The instruction at the failing RIP, as far as it could be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Instruction {
    pub(crate) rip: u64,
    pub(crate) bytes: Vec<u8>,
}

impl std::fmt::Display for Instruction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rip={:#x} bytes=[", self.rip)?;
        for (i, b) in self.bytes.iter().enumerate() {
            write!(f, "{}{b:02x}", if i == 0 { "" } else { " " })?;
        }
        write!(f, "]")
    }
}

/// Which instruction raises an interrupt: it decides the privilege check
/// and the error code's EXT bit (Intel SDM vol. 2, `INT n/INTO/INT3/INT1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Source {
    /// `int n` (CD ib): a software interrupt.
    IntN,
    /// `int3` (CC): a software interrupt to the #BP vector.
    Int3,
    /// `into` (CE) with RFLAGS.OF set: a software interrupt to the #OF vector.
    Into,
    /// `int1`/`icebp` (F1): a #DB, delivered as a hardware exception is (no
    /// DPL check, EXT set in a fault's error code).
    Int1,
}

/// What the VMM does about an instruction KVM could not emulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// `int3`, `int1`, `int n`: deliver `vector` through its IDT gate as
    /// [`deliver`] decides; RIP goes past the instruction (`len` bytes)
    /// unless the gate check faults.
    SoftwareInterrupt {
        source: Source,
        vector: u8,
        len: u64,
    },
    /// `into` outside 64-bit mode: a software interrupt to #OF if RFLAGS.OF
    /// is set, else a step over `len` bytes.
    Into { len: u64 },
    /// Set (`true`) or clear RFLAGS.AC and step over `len` bytes.
    SetAc { set: bool, len: u64 },
    /// `fwait`: #MF if an x87 exception is pending, else step over `len` bytes.
    Fwait { len: u64 },
    /// Deliver #UD at the instruction (a fault: RIP stays).
    InvalidOpcode,
    /// Nothing the VMM can do: the guest crashes.
    Crash,
}

/// Decides what to do about `bytes` at CPL `cpl`, decoded in 64-bit mode
/// (`long`) or legacy protected mode.
pub(crate) fn decide(bytes: &[u8], cpl: u8, long: bool) -> Action {
    let mut at = 0;
    // Legacy prefixes, then (64-bit mode only) one REX prefix.
    while let Some(&b) = bytes.get(at) {
        if matches!(
            b,
            0x26 | 0x2e | 0x36 | 0x3e | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3
        ) && at < MAX_INSN_LEN
        {
            at += 1;
        } else {
            break;
        }
    }
    if long && bytes.get(at).is_some_and(|b| b & 0xf0 == 0x40) {
        at += 1;
    }
    let len = |n: usize| (at + n) as u64;
    let unknown = if cpl == 0 {
        Action::Crash
    } else {
        Action::InvalidOpcode
    };
    match bytes.get(at..) {
        Some([0xcc, ..]) => Action::SoftwareInterrupt {
            source: Source::Int3,
            vector: VECTOR_BP,
            len: len(1),
        },
        Some([0xf1, ..]) => Action::SoftwareInterrupt {
            source: Source::Int1,
            vector: VECTOR_DB,
            len: len(1),
        },
        Some([0xcd, n, ..]) => Action::SoftwareInterrupt {
            source: Source::IntN,
            vector: *n,
            len: len(2),
        },
        // Invalid in 64-bit mode, at any CPL.
        Some([0xce, ..]) if long => Action::InvalidOpcode,
        Some([0xce, ..]) => Action::Into { len: len(1) },
        Some([0x0f, 0x01, op @ (0xca | 0xcb), ..]) if cpl == 0 => Action::SetAc {
            set: *op == 0xcb,
            len: len(3),
        },
        Some([0x0f, 0x01, 0xca | 0xcb, ..]) => Action::InvalidOpcode,
        Some([0x9b, ..]) => Action::Fwait { len: len(1) },
        _ => unknown,
    }
}

/// Handles an emulation failure on `vcpu`. `Ok(None)`: the guest goes on;
/// `Ok(Some(insn))`: the guest must crash at that instruction.
pub(crate) fn handle(vcpu: &mut VcpuFd, mem: &GuestMemoryMmap) -> Result<Option<Instruction>> {
    let regs = vcpu.get_regs().map_err(kvm_err("KVM_GET_REGS"))?;
    let sregs = vcpu.get_sregs().map_err(kvm_err("KVM_GET_SREGS"))?;
    let bytes = reported_bytes(vcpu).unwrap_or_else(|| read_bytes(vcpu, mem, &regs, &sregs));
    let insn = Instruction {
        rip: regs.rip,
        bytes,
    };
    let action = decide(&insn.bytes, sregs.cs.dpl, sregs.cs.l == 1);
    tracing::debug!("emulation failure at {insn}: {action:?}");
    match action {
        Action::Crash => return Ok(Some(insn)),
        Action::SetAc { set, len } => {
            let rflags = if set {
                regs.rflags | RFLAGS_AC
            } else {
                regs.rflags & !RFLAGS_AC
            };
            set_rip_flags(vcpu, regs, regs.rip.wrapping_add(len), rflags)?;
        }
        Action::Fwait { len } => {
            let fpu = vcpu.get_fpu().map_err(kvm_err("KVM_GET_FPU"))?;
            if fpu.fsw & FSW_ES != 0 {
                inject(vcpu, |events| {
                    events.exception.injected = 1;
                    events.exception.nr = VECTOR_MF;
                    events.exception.has_error_code = 0;
                })?;
            } else {
                set_rip_flags(vcpu, regs, regs.rip.wrapping_add(len), regs.rflags)?;
            }
        }
        Action::SoftwareInterrupt {
            source,
            vector,
            len,
        } => software_interrupt(vcpu, mem, regs, &sregs, source, vector, len)?,
        Action::Into { len } if regs.rflags & RFLAGS_OF != 0 => {
            software_interrupt(vcpu, mem, regs, &sregs, Source::Into, VECTOR_OF, len)?;
        }
        Action::Into { len } => {
            set_rip_flags(vcpu, regs, regs.rip.wrapping_add(len), regs.rflags)?;
        }
        Action::InvalidOpcode => inject(vcpu, |events| {
            events.exception.injected = 1;
            events.exception.nr = VECTOR_UD;
            events.exception.has_error_code = 0;
        })?,
    }
    Ok(None)
}

/// An IDT gate as the checks of [`deliver`] see it: byte 5 of the
/// descriptor (P, DPL, S and type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Gate {
    pub(crate) present: bool,
    pub(crate) dpl: u8,
    /// The S bit (0 for a system descriptor) and the 4-bit type.
    pub(crate) kind: u8,
}

impl Gate {
    /// The gate in a descriptor's bytes (8 in legacy mode, 16 in IA-32e
    /// mode; only byte 5 matters here).
    pub(crate) fn parse(descriptor: &[u8]) -> Option<Gate> {
        let access = *descriptor.get(5)?;
        Some(Gate {
            present: access & 0x80 != 0,
            dpl: (access >> 5) & 3,
            kind: access & 0x1f,
        })
    }
}

/// The IDT register and the mode that sets its gates' size and types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdtState {
    pub(crate) limit: u16,
    /// IA-32e mode (EFER.LMA): 16-byte gates, 64-bit interrupt and trap
    /// gates only; else legacy protected mode: 8 bytes, task gates too.
    pub(crate) ia32e: bool,
    /// CR0.PE. In real mode KVM's emulator delivers software interrupts
    /// itself (through the IVT), so none should come here.
    pub(crate) protected: bool,
}

impl IdtState {
    fn gate_size(self) -> u64 {
        if self.ia32e { 16 } else { 8 }
    }

    /// Whether the whole gate of `vector` lies within the IDT limit.
    fn holds(self, vector: u8) -> bool {
        let size = self.gate_size();
        u64::from(vector) * size + size - 1 <= u64::from(self.limit)
    }

    fn gate_type_valid(self, kind: u8) -> bool {
        if self.ia32e {
            // 64-bit interrupt or trap gate (type 14, 15).
            matches!(kind, 0x0e | 0x0f)
        } else {
            // Task gate; 16-bit and 32-bit interrupt and trap gates.
            matches!(kind, 0x05 | 0x06 | 0x07 | 0x0e | 0x0f)
        }
    }
}

/// How an interrupt an instruction raises reaches the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// `int3`, `int1`: the #BP/#DB exception (neither has an error code),
    /// RIP past the instruction.
    Exception(u8),
    /// `int n`, `into`: the vector through its gate, RIP past the
    /// instruction, and no error code, even for a vector whose hardware
    /// exception pushes one (Intel SDM vol. 3, §6.4.2: "If INT n provides a
    /// vector for one of the architecturally-defined exceptions, the
    /// processor generates an interrupt to the correct vector ... but does
    /// not push an error code on the stack"). Injected as an interrupt
    /// event, which never carries one.
    Interrupt(u8),
    /// `int 2`: the NMI handler, through KVM's NMI injection.
    Nmi,
    /// The gate check failed: #GP or #NP with the error code naming the IDT
    /// entry, RIP at the instruction (a fault).
    Fault { vector: u8, error_code: u32 },
}

/// The CPU's checks of an interrupt an instruction raises (Intel SDM vol.
/// 2, `INT n/INTO/INT3/INT1`, protected and IA-32e mode; vol. 3, §6.12.1.1
/// and §6.13), in its order: the gate must lie within the IDT limit and be
/// an interrupt, trap (or, outside IA-32e mode, task) gate, else #GP; a
/// software interrupt (`int n`, `int3`, `into`, not `int1`) needs the
/// gate's DPL >= CPL, else #GP with EXT clear; the gate must be present,
/// else #NP. The error code is the IDT selector `(vector << 3) | 2`, with
/// EXT (bit 0) set only for `int1`, which the SDM treats as a hardware
/// event. `gate` is `None` when it could not be read (its page not mapped):
/// the event goes to KVM as is, whose delivery then faults as the CPU would.
pub(crate) fn deliver(
    source: Source,
    vector: u8,
    cpl: u8,
    idt: IdtState,
    gate: Option<Gate>,
) -> Delivery {
    let ext = u32::from(source == Source::Int1);
    let idt_error = (u32::from(vector) << 3) | 2;
    let fault = |vector: u8, error_code: u32| Delivery::Fault { vector, error_code };
    if idt.protected {
        if !idt.holds(vector) {
            return fault(VECTOR_GP, idt_error | ext);
        }
        if let Some(gate) = gate {
            if !idt.gate_type_valid(gate.kind) {
                return fault(VECTOR_GP, idt_error | ext);
            }
            if source != Source::Int1 && gate.dpl < cpl {
                return fault(VECTOR_GP, idt_error);
            }
            if !gate.present {
                return fault(VECTOR_NP, idt_error | ext);
            }
        }
    }
    match source {
        Source::Int3 | Source::Int1 => Delivery::Exception(vector),
        Source::IntN | Source::Into if vector == VECTOR_NMI => Delivery::Nmi,
        Source::IntN | Source::Into => Delivery::Interrupt(vector),
    }
}

/// Delivers an interrupt raised by the instruction at RIP (`len` bytes).
fn software_interrupt(
    vcpu: &VcpuFd,
    mem: &GuestMemoryMmap,
    regs: kvm_regs,
    sregs: &kvm_sregs,
    source: Source,
    vector: u8,
    len: u64,
) -> Result<()> {
    let idt = IdtState {
        limit: sregs.idt.limit,
        ia32e: sregs.efer & EFER_LMA != 0,
        protected: sregs.cr0 & CR0_PE != 0,
    };
    let gate = if idt.holds(vector) {
        let size = idt.gate_size();
        let at = sregs.idt.base.wrapping_add(u64::from(vector) * size);
        Gate::parse(&read_linear(vcpu, mem, at, int_cast::u64_to_usize(size)))
    } else {
        None
    };
    let delivery = deliver(source, vector, sregs.cs.dpl, idt, gate);
    tracing::debug!(
        "{source:?} vector {vector} at CPL {}: {delivery:?}",
        sregs.cs.dpl
    );
    let past = regs.rip.wrapping_add(len);
    match delivery {
        Delivery::Exception(nr) => {
            set_rip_flags(vcpu, regs, past, regs.rflags)?;
            inject(vcpu, |events| {
                events.exception.injected = 1;
                events.exception.nr = nr;
                events.exception.has_error_code = 0;
                events.exception.error_code = 0;
            })
        }
        Delivery::Interrupt(nr) => {
            set_rip_flags(vcpu, regs, past, regs.rflags)?;
            inject(vcpu, |events| {
                events.interrupt.injected = 1;
                events.interrupt.nr = nr;
                events.interrupt.soft = 0;
            })
        }
        Delivery::Nmi => {
            set_rip_flags(vcpu, regs, past, regs.rflags)?;
            inject(vcpu, |events| {
                events.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING;
                events.nmi.pending = 1;
            })
        }
        Delivery::Fault { vector, error_code } => inject(vcpu, |events| {
            events.exception.injected = 1;
            events.exception.nr = vector;
            events.exception.has_error_code = 1;
            events.exception.error_code = error_code;
        }),
    }
}

fn set_rip_flags(vcpu: &VcpuFd, mut regs: kvm_regs, rip: u64, rflags: u64) -> Result<()> {
    regs.rip = rip;
    regs.rflags = rflags;
    vcpu.set_regs(&regs).map_err(kvm_err("KVM_SET_REGS"))
}

fn inject(vcpu: &VcpuFd, set: impl FnOnce(&mut kvm_bindings::kvm_vcpu_events)) -> Result<()> {
    let mut events = vcpu
        .get_vcpu_events()
        .map_err(kvm_err("KVM_GET_VCPU_EVENTS"))?;
    set(&mut events);
    vcpu.set_vcpu_events(&events)
        .map_err(kvm_err("KVM_SET_VCPU_EVENTS"))
}

/// The instruction bytes KVM put in the exit (with
/// `KVM_CAP_EXIT_ON_EMULATION_FAILURE`), if it did.
fn reported_bytes(vcpu: &mut VcpuFd) -> Option<Vec<u8>> {
    let run = vcpu.get_kvm_run();
    // SAFETY: KVM filled `emulation_failure` for this KVM_EXIT_INTERNAL_ERROR
    // (suberror 1); every field is plain data.
    let failure = unsafe { run.__bindgen_anon_1.emulation_failure };
    let has_bytes = failure.ndata >= 3
        && failure.flags & u64::from(KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES) != 0;
    if !has_bytes {
        return None;
    }
    // SAFETY: as above; the union's only member is the byte array.
    let (size, bytes) = unsafe {
        (
            failure.__bindgen_anon_1.__bindgen_anon_1.insn_size,
            failure.__bindgen_anon_1.__bindgen_anon_1.insn_bytes,
        )
    };
    let size = usize::from(size).min(MAX_INSN_LEN);
    (size > 0).then(|| bytes[..size].to_vec())
}

/// Reads up to 15 bytes at RIP through the guest's page tables.
fn read_bytes(vcpu: &VcpuFd, mem: &GuestMemoryMmap, regs: &kvm_regs, sregs: &kvm_sregs) -> Vec<u8> {
    read_linear(
        vcpu,
        mem,
        regs.rip.wrapping_add(sregs.cs.base),
        MAX_INSN_LEN,
    )
}

/// Reads up to `len` bytes at linear address `start` through the guest's
/// page tables (`KVM_TRANSLATE`), page by page; stops at the first unmapped
/// byte.
fn read_linear(vcpu: &VcpuFd, mem: &GuestMemoryMmap, start: u64, len: usize) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len);
    while bytes.len() < len {
        let gva = start.wrapping_add(int_cast::usize_to_u64(bytes.len()));
        let Ok(t) = vcpu.translate_gva(gva) else {
            break;
        };
        if t.valid == 0 {
            break;
        }
        let in_page = int_cast::u64_to_usize(0x1000 - (gva & 0xfff));
        let n = in_page.min(len - bytes.len());
        let mut chunk = vec![0u8; n];
        if mem
            .read_slice(&mut chunk, GuestAddress(t.physical_address))
            .is_err()
        {
            break;
        }
        bytes.extend_from_slice(&chunk);
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn soft(source: Source, vector: u8, len: u64) -> Action {
        Action::SoftwareInterrupt {
            source,
            vector,
            len,
        }
    }

    #[test]
    fn breakpoints_and_software_interrupts_are_decoded_with_their_length() {
        assert_eq!(decide(&[0xcc, 0x90], 0, true), soft(Source::Int3, 3, 1));
        assert_eq!(decide(&[0xf1], 3, true), soft(Source::Int1, 1, 1));
        assert_eq!(decide(&[0xcd, 0x04], 0, true), soft(Source::IntN, 4, 2));
        assert_eq!(decide(&[0xcd, 0x02], 3, true), soft(Source::IntN, 2, 2));
        assert_eq!(decide(&[0xcd, 0x80], 3, true), soft(Source::IntN, 0x80, 2));
        // Prefixes count in the length.
        assert_eq!(
            decide(&[0x66, 0x48, 0xcc], 0, true),
            soft(Source::Int3, 3, 3)
        );
        // `into`: #UD in 64-bit mode (at any CPL), else decided by OF.
        assert_eq!(decide(&[0xce], 0, true), Action::InvalidOpcode);
        assert_eq!(decide(&[0xce], 3, false), Action::Into { len: 1 });
    }

    const LONG: IdtState = IdtState {
        limit: 0xfff,
        ia32e: true,
        protected: true,
    };
    const LEGACY: IdtState = IdtState {
        limit: 0x7ff,
        ia32e: false,
        protected: true,
    };
    const REAL: IdtState = IdtState {
        limit: 0x3ff,
        ia32e: false,
        protected: false,
    };

    /// The IDT in IA-32e mode with this limit.
    const fn long(limit: u16) -> IdtState {
        IdtState { limit, ..LONG }
    }

    /// The IDT in legacy protected mode with this limit.
    const fn legacy(limit: u16) -> IdtState {
        IdtState { limit, ..LEGACY }
    }

    fn gate(present: bool, dpl: u8, kind: u8) -> Option<Gate> {
        Some(Gate { present, dpl, kind })
    }

    /// A present 64-bit interrupt gate of this DPL.
    fn int_gate(dpl: u8) -> Option<Gate> {
        gate(true, dpl, 0x0e)
    }

    /// A 64-bit interrupt gate of this DPL, not present.
    fn absent(dpl: u8) -> Option<Gate> {
        gate(false, dpl, 0x0e)
    }

    /// A present DPL-0 descriptor of this type (S bit and type).
    fn typed(kind: u8) -> Option<Gate> {
        gate(true, 0, kind)
    }

    fn to(vector: u8) -> Delivery {
        Delivery::Interrupt(vector)
    }

    fn exception(vector: u8) -> Delivery {
        Delivery::Exception(vector)
    }

    fn gp(error_code: u32) -> Delivery {
        Delivery::Fault {
            vector: VECTOR_GP,
            error_code,
        }
    }

    fn np(error_code: u32) -> Delivery {
        Delivery::Fault {
            vector: VECTOR_NP,
            error_code,
        }
    }

    /// A row of the decision table: (source, vector, CPL, IDT, gate) and
    /// what the CPU delivers.
    type Row = (Source, u8, u8, IdtState, Option<Gate>, Delivery);

    /// The decision table (Intel SDM vol. 2, INT n/INTO/INT3/INT1).
    #[test]
    fn the_gate_checks_decide_the_delivery_as_the_cpu_does() {
        use Source::{Int1, Int3, IntN, Into};
        const NMI: Delivery = Delivery::Nmi;
        let cases: &[Row] = &[
            // Kernel mode reaches any present gate, a trap gate too.
            (Int3, 3, 0, LONG, int_gate(0), exception(3)),
            (IntN, 0x80, 0, LONG, int_gate(0), to(0x80)),
            (IntN, 3, 0, LONG, int_gate(0), to(3)),
            (IntN, 0x81, 0, LONG, typed(0x0f), to(0x81)),
            // User mode reaches DPL-3 gates only: #GP(vector << 3 | IDT), EXT clear.
            (IntN, 0x80, 3, LONG, int_gate(3), to(0x80)),
            (Int3, 3, 3, LONG, int_gate(3), exception(3)),
            (IntN, 0x80, 3, LONG, int_gate(0), gp(0x402)),
            (Int3, 3, 3, LONG, int_gate(0), gp(0x1a)),
            (Into, 4, 3, LEGACY, int_gate(0), gp(0x22)),
            (IntN, 0x40, 1, LONG, int_gate(0), gp(0x202)),
            (IntN, 0x40, 2, LONG, int_gate(1), gp(0x202)),
            (IntN, 0x40, 1, LONG, int_gate(1), to(0x40)),
            // A user `int 2` to the kernel's NMI gate is #GP, not an NMI.
            (IntN, 2, 3, LONG, int_gate(0), gp(0x12)),
            // `int 2` allowed: the NMI handler through KVM's NMI path.
            (IntN, 2, 0, LONG, int_gate(0), NMI),
            (IntN, 2, 3, LONG, int_gate(3), NMI),
            // Vectors with a hardware error code get none from `int n`.
            (IntN, 13, 0, LONG, int_gate(0), to(13)),
            (IntN, 14, 0, LONG, int_gate(0), to(14)),
            (IntN, 8, 0, LONG, int_gate(0), to(8)),
            // `int1` is a hardware-like #DB: no DPL check.
            (Int1, 1, 3, LONG, int_gate(0), exception(1)),
            // A gate not present: #NP with the same error code; the DPL
            // check comes first.
            (IntN, 0x50, 0, LONG, absent(0), np(0x282)),
            (IntN, 0x50, 3, LONG, absent(3), np(0x282)),
            (IntN, 0x50, 3, LONG, absent(0), gp(0x282)),
            // ... and for `int1`, EXT set.
            (Int1, 1, 0, LONG, absent(0), np(0x0b)),
            // Beyond the IDT limit: #GP; a 16-byte gate must fit whole.
            (IntN, 0x60, 0, long(0x5ff), None, gp(0x302)),
            (IntN, 0x5f, 0, long(0x5ff), int_gate(0), to(0x5f)),
            (IntN, 0x5f, 0, long(0x5fe), None, gp(0x2fa)),
            (Int1, 1, 0, long(0x0f), None, gp(0x0b)),
            (IntN, 0xff, 0, long(0xffe), None, gp(0x7fa)),
            // Legacy protected mode: 8-byte gates.
            (IntN, 0x60, 0, legacy(0x307), int_gate(0), to(0x60)),
            (IntN, 0x61, 0, legacy(0x307), None, gp(0x30a)),
            // Not an interrupt or trap gate: #GP. In IA-32e mode that is any
            // other type (a 32-bit call gate, a task gate, a code segment)...
            (IntN, 0x30, 0, LONG, typed(0x0c), gp(0x182)),
            (IntN, 0x30, 0, LONG, typed(0x05), gp(0x182)),
            (IntN, 0x30, 0, LONG, typed(0x1a), gp(0x182)),
            (Int1, 1, 0, LONG, typed(0x00), gp(0x0b)),
            // ... legacy mode also takes task and 16-bit gates.
            (IntN, 0x30, 0, LEGACY, typed(0x05), to(0x30)),
            (IntN, 0x30, 0, LEGACY, typed(0x06), to(0x30)),
            (IntN, 0x30, 0, LEGACY, typed(0x0c), gp(0x182)),
            // The type check comes before the DPL check.
            (IntN, 0x30, 3, LONG, typed(0x0c), gp(0x182)),
            // A gate that could not be read: as is, KVM's delivery faults.
            (IntN, 0x30, 3, LONG, None, to(0x30)),
            // Real mode (KVM's emulator handles it): no checks.
            (IntN, 0x30, 0, REAL, None, to(0x30)),
        ];
        for (i, &(source, vector, cpl, idt, gate, expected)) in cases.iter().enumerate() {
            assert_eq!(
                deliver(source, vector, cpl, idt, gate),
                expected,
                "row {i}: {source:?} vector {vector:#x} CPL {cpl} {idt:?} {gate:?}"
            );
        }
    }

    #[test]
    fn a_gate_is_read_from_its_access_byte() {
        // Linux's #BP gate: present, DPL 3, 64-bit interrupt gate (0xee).
        let descriptor = [0, 0, 0x10, 0, 0, 0xee, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(Gate::parse(&descriptor), int_gate(3));
        assert_eq!(Gate::parse(&[0, 0, 0, 0, 0, 0x0f]), gate(false, 0, 0x0f));
        // A short read (the IDT's page not mapped) is no gate.
        assert_eq!(Gate::parse(&[0, 0, 0, 0, 0]), None);
    }

    #[test]
    fn clac_and_stac_complete_only_in_the_kernel() {
        assert_eq!(
            decide(&[0x0f, 0x01, 0xca], 0, true),
            Action::SetAc { set: false, len: 3 }
        );
        assert_eq!(
            decide(&[0x0f, 0x01, 0xcb], 0, true),
            Action::SetAc { set: true, len: 3 }
        );
        assert_eq!(decide(&[0x0f, 0x01, 0xcb], 3, true), Action::InvalidOpcode);
    }

    #[test]
    fn fwait_is_finished_by_the_vmm() {
        assert_eq!(decide(&[0x9b, 0x65], 0, true), Action::Fwait { len: 1 });
        assert_eq!(decide(&[0x9b], 3, true), Action::Fwait { len: 1 });
    }

    #[test]
    fn anything_else_crashes_the_kernel_and_faults_user_mode() {
        let cmpxchg16b = [0xf0, 0x48, 0x0f, 0xc7, 0x0e];
        assert_eq!(decide(&cmpxchg16b, 0, true), Action::Crash);
        assert_eq!(decide(&cmpxchg16b, 3, true), Action::InvalidOpcode);
        assert_eq!(decide(&[], 0, true), Action::Crash);
        // Only prefixes (a truncated read) is no instruction we know.
        assert_eq!(decide(&[0x66; 15], 0, true), Action::Crash);
        // Outside 64-bit mode 0x48 is `dec eax`, not a REX prefix.
        assert_eq!(decide(&[0x48, 0xcc], 0, false), Action::Crash);
        let insn = Instruction {
            rip: 0xffff_ffff_8100_0000,
            bytes: vec![0x0f, 0xc7, 0x0e],
        };
        assert_eq!(insn.to_string(), "rip=0xffffffff81000000 bytes=[0f c7 0e]");
    }
}
