//! Instructions KVM reports it could not emulate (`KVM_EXIT_INTERNAL_ERROR`,
//! suberror 1).
//!
//! Where KVM emulates guest instructions (always on an emulating KVM such as
//! `kvm_pvm`; on hardware only for MMIO and a few traps), its emulator lacks
//! some instructions. Those the VMM can finish, it finishes:
//!
//! - `int3`, `int1` (`icebp`) and `int n`: the architectural exception or
//!   interrupt is injected with RIP past the instruction, as the CPU would
//!   deliver it (KVM's emulator implements software interrupts only in real
//!   mode);
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

use kvm_bindings::{KVM_INTERNAL_ERROR_EMULATION_FLAG_INSTRUCTION_BYTES, kvm_regs, kvm_sregs};
use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use super::{Result, kvm_err};

/// The longest x86 instruction.
const MAX_INSN_LEN: usize = 15;
const RFLAGS_AC: u64 = 1 << 18;
const VECTOR_DB: u8 = 1;
const VECTOR_BP: u8 = 3;
const VECTOR_UD: u8 = 6;
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

/// What the VMM does about an instruction KVM could not emulate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// Deliver exception `vector` with RIP advanced by `len` (a trap: the
    /// handler returns past the instruction).
    Exception { vector: u8, len: u64 },
    /// Deliver interrupt `vector` (`int n`, n >= 32), RIP advanced by `len`.
    Interrupt { vector: u8, len: u64 },
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
        Some([0xcc, ..]) => Action::Exception {
            vector: VECTOR_BP,
            len: len(1),
        },
        Some([0xf1, ..]) => Action::Exception {
            vector: VECTOR_DB,
            len: len(1),
        },
        Some([0xcd, n, ..]) if *n < 32 => Action::Exception {
            vector: *n,
            len: len(2),
        },
        Some([0xcd, n, ..]) => Action::Interrupt {
            vector: *n,
            len: len(2),
        },
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
        Action::Exception { vector, len } => {
            set_rip_flags(vcpu, regs, regs.rip.wrapping_add(len), regs.rflags)?;
            inject(vcpu, |events| {
                events.exception.injected = 1;
                events.exception.nr = vector;
                events.exception.has_error_code = 0;
                events.exception.error_code = 0;
            })?;
        }
        Action::Interrupt { vector, len } => {
            set_rip_flags(vcpu, regs, regs.rip.wrapping_add(len), regs.rflags)?;
            inject(vcpu, |events| {
                events.interrupt.injected = 1;
                events.interrupt.nr = vector;
                events.interrupt.soft = 0;
            })?;
        }
        Action::InvalidOpcode => inject(vcpu, |events| {
            events.exception.injected = 1;
            events.exception.nr = VECTOR_UD;
            events.exception.has_error_code = 0;
        })?,
    }
    Ok(None)
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

/// Reads up to 15 bytes at RIP through the guest's page tables
/// (`KVM_TRANSLATE`), page by page; stops at the first unmapped byte.
fn read_bytes(vcpu: &VcpuFd, mem: &GuestMemoryMmap, regs: &kvm_regs, sregs: &kvm_sregs) -> Vec<u8> {
    let start = regs.rip.wrapping_add(sregs.cs.base);
    let mut bytes = Vec::with_capacity(MAX_INSN_LEN);
    while bytes.len() < MAX_INSN_LEN {
        let gva = start.wrapping_add(bytes.len() as u64);
        let Ok(t) = vcpu.translate_gva(gva) else {
            break;
        };
        if t.valid == 0 {
            break;
        }
        let in_page = block::cast::u64_to_usize(0x1000 - (gva & 0xfff));
        let n = in_page.min(MAX_INSN_LEN - bytes.len());
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

    #[test]
    fn breakpoints_and_software_interrupts_become_events_past_the_instruction() {
        assert_eq!(
            decide(&[0xcc, 0x90], 0, true),
            Action::Exception { vector: 3, len: 1 }
        );
        assert_eq!(
            decide(&[0xf1], 3, true),
            Action::Exception { vector: 1, len: 1 }
        );
        assert_eq!(
            decide(&[0xcd, 0x04], 0, true),
            Action::Exception { vector: 4, len: 2 }
        );
        assert_eq!(
            decide(&[0xcd, 0x80], 3, true),
            Action::Interrupt {
                vector: 0x80,
                len: 2
            }
        );
        // Prefixes count in the length.
        assert_eq!(
            decide(&[0x66, 0x48, 0xcc], 0, true),
            Action::Exception { vector: 3, len: 3 }
        );
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
