//! A vCPU thread: set up the registers, then run the guest and handle its
//! exits until the VM ends.

use std::sync::Arc;

use kvm_bindings::CpuId;
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};

use virtio_devices::GuestMemoryMmap;

use super::layout::ZERO_PAGE_ADDR;
use super::vcpu_state::VcpuState;
use super::{Result, cpu, kvm_err};
use crate::bus::Bus;
use crate::config::ApStart;
use crate::lifecycle::{Checkpoint, Control, VmExit};
use crate::wire::Encoder;

// KVM_SYSTEM_EVENT_* types.
const SYSTEM_EVENT_SHUTDOWN: u32 = 1;
const SYSTEM_EVENT_RESET: u32 = 2;
const SYSTEM_EVENT_CRASH: u32 = 3;
/// Exits a pending access may take to finish before a pause (see
/// `Vcpu::finish_pending_access`).
const MAX_ACCESS_STEPS: usize = 4096;
/// KVM_INTERNAL_ERROR_EMULATION.
const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;

/// What the vCPUs reach through exits.
pub(crate) struct Buses {
    pub(crate) pio: Bus,
    pub(crate) mmio: Bus,
}

pub(crate) struct Vcpu {
    index: u8,
    ap_start: ApStart,
    fd: VcpuFd,
    /// For the instructions KVM could not emulate (see `emulation`).
    mem: GuestMemoryMmap,
    /// The MSRs a saved state holds (`KVM_GET_MSR_INDEX_LIST`).
    msr_indices: Arc<[u32]>,
    /// The last exit was a port or MMIO access: KVM finishes it (a port read's value
    /// into RAX, a string instruction's next step) only on the next `KVM_RUN`.
    access_pending: bool,
}

impl Vcpu {
    /// Creates vCPU `index` with its CPUID, MSRs and local APIC set up, and,
    /// where it starts at the kernel entry, its segments and FPU: everything
    /// but the registers that depend on the kernel ([`Vcpu::set_entry`]), so
    /// that it can be created while the kernel is still being loaded.
    pub(crate) fn new(
        vm: &VmFd,
        mem: &GuestMemoryMmap,
        cpuid: &CpuId,
        index: u8,
        ap_start: ApStart,
        msr_indices: Arc<[u32]>,
    ) -> Result<Self> {
        let fd = vm
            .create_vcpu(u64::from(index))
            .map_err(kvm_err("KVM_CREATE_VCPU"))?;
        fd.set_cpuid2(cpuid).map_err(kvm_err("KVM_SET_CPUID2"))?;
        cpu::set_msrs(&fd)?;
        cpu::set_lint(&fd)?;
        let vcpu = Vcpu {
            index,
            ap_start,
            fd,
            mem: mem.clone(),
            msr_indices,
            access_pending: false,
        };
        if vcpu.starts_at_entry() {
            cpu::set_sregs(&vcpu.fd)?;
            cpu::set_fpu(&vcpu.fd)?;
        }
        if index != 0 && ap_start == ApStart::Direct {
            cpu::set_runnable(&vcpu.fd)?;
        }
        Ok(vcpu)
    }

    /// Puts the vCPU at the kernel entry: the boot vCPU with RSI = zero
    /// page; secondary vCPUs either start the same way, runnable at once
    /// with their own stack ([`ApStart::Direct`], see
    /// vmm/docs/stock-kernel.md), or keep KVM's reset state and wait for
    /// INIT/SIPI from the guest ([`ApStart::InitSipi`], for Linux: nothing
    /// to do here).
    pub(crate) fn set_entry(&self, entry: u64) -> Result<()> {
        if !self.starts_at_entry() {
            return Ok(());
        }
        let boot_params = if self.index == 0 { ZERO_PAGE_ADDR } else { 0 };
        cpu::set_regs(&self.fd, entry, cpu::stack_for(self.index), boot_params)
    }

    /// Puts the vCPU in the state another VMM saved (live migration's target).
    pub(crate) fn restore(&self, state: &VcpuState) -> std::result::Result<(), String> {
        state.restore(&self.fd, &self.msr_indices)
    }

    /// Finishes a port or MMIO access KVM left for the next `KVM_RUN`, without entering
    /// the guest (`immediate_exit`), so that a saved state never holds half an
    /// instruction (KVM's API asks this before a migration): it would repeat the
    /// access on the target (a byte printed twice) or lose its result (a byte read from
    /// the UART). Finishing a string instruction's step may exit for its next step,
    /// which is handled like any exit. Returns the VM's ending if an exit ends it.
    fn finish_pending_access(&mut self, buses: &Buses) -> Option<VmExit> {
        // A `rep` string instruction moves up to a page per exit.
        for _ in 0..MAX_ACCESS_STEPS {
            if !self.access_pending {
                return None;
            }
            self.fd.set_kvm_immediate_exit(1);
            if let Some(exit) = self.run_once(buses) {
                self.fd.set_kvm_immediate_exit(0);
                return Some(exit);
            }
        }
        self.fd.set_kvm_immediate_exit(0);
        tracing::warn!("vCPU {}: an access still pending at a pause", self.index);
        None
    }

    /// This vCPU's state, encoded (asked while the VM is paused).
    fn save(&self) -> std::result::Result<Vec<u8>, String> {
        let state = VcpuState::save(&self.fd, &self.msr_indices)?;
        let mut e = Encoder::default();
        state.encode(&mut e);
        Ok(e.0)
    }

    fn starts_at_entry(&self) -> bool {
        self.index == 0 || self.ap_start == ApStart::Direct
    }

    /// Runs the guest until the VM ends (or pauses while asked to).
    ///
    /// A panic in a device model (a bug, whatever the guest did) ends the VM
    /// with an internal error instead of leaving `wait` hanging.
    pub(crate) fn run(mut self, control: &Control, buses: &Arc<Buses>) {
        let index = self.index;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::kick::register_current(&mut self.fd);
            // Unregisters before `self` (and its kvm_run mapping) goes away,
            // also when unwinding.
            let _registered = KickRegistration;
            loop {
                if control.pause_requested()
                    && let Some(exit) = self.finish_pending_access(buses)
                {
                    control.finish(exit);
                }
                if control.checkpoint(usize::from(index), &mut || self.save()) != Checkpoint::Run {
                    break;
                }
                control.timeline().mark_first_kvm_run();
                if let Some(exit) = self.run_once(buses) {
                    control.finish(exit);
                }
            }
        }));
        if outcome.is_err() {
            control.finish(VmExit::InternalError(format!(
                "vCPU {index} thread panicked"
            )));
        }
        control.vcpu_stopped();
    }

    /// One `KVM_RUN`; returns an ending if this exit ends the VM.
    fn run_once(&mut self, buses: &Buses) -> Option<VmExit> {
        let index = self.index;
        let exit = self.fd.run();
        self.access_pending = matches!(
            exit,
            Ok(VcpuExit::IoIn(..)
                | VcpuExit::IoOut(..)
                | VcpuExit::MmioRead(..)
                | VcpuExit::MmioWrite(..))
        );
        match exit {
            Ok(VcpuExit::IoIn(port, data)) => buses.pio.read(u64::from(port), data),
            Ok(VcpuExit::IoOut(port, data)) => buses.pio.write(u64::from(port), data),
            Ok(VcpuExit::MmioRead(addr, data)) => buses.mmio.read(addr, data),
            Ok(VcpuExit::MmioWrite(addr, data)) => buses.mmio.write(addr, data),
            // Only without an in-kernel local APIC; keep going.
            Ok(VcpuExit::Hlt) => {}
            Ok(VcpuExit::Shutdown) => {
                return Some(VmExit::TripleFault {
                    vcpu: index,
                    detail: self.describe_state(),
                });
            }
            Ok(VcpuExit::SystemEvent(kind, _)) => {
                return Some(match kind {
                    SYSTEM_EVENT_SHUTDOWN => VmExit::PowerOff { code: 0 },
                    SYSTEM_EVENT_RESET => VmExit::Reset,
                    SYSTEM_EVENT_CRASH => VmExit::Crash {
                        vcpu: index,
                        detail: "KVM reported a guest crash".into(),
                    },
                    other => VmExit::Crash {
                        vcpu: index,
                        detail: format!("unknown KVM system event {other}"),
                    },
                });
            }
            Ok(VcpuExit::InternalError) => {
                let suberror = self.internal_suberror();
                if suberror == KVM_INTERNAL_ERROR_EMULATION {
                    return match super::emulation::handle(&mut self.fd, &self.mem) {
                        Ok(None) => None,
                        Ok(Some(insn)) => Some(VmExit::Crash {
                            vcpu: index,
                            detail: format!(
                                "KVM internal error (suberror 1: instruction emulation failed) at {insn}; {}",
                                self.describe_state()
                            ),
                        }),
                        Err(e) => Some(VmExit::InternalError(format!(
                            "vCPU {index}: completing an instruction KVM could not emulate: {e}"
                        ))),
                    };
                }
                let detail = format!(
                    "KVM internal error (suberror {suberror}{}); {}",
                    suberror_name(suberror),
                    self.describe_state()
                );
                return Some(VmExit::Crash {
                    vcpu: index,
                    detail,
                });
            }
            Ok(VcpuExit::FailEntry(reason, cpu)) => {
                return Some(VmExit::Crash {
                    vcpu: index,
                    detail: format!("VM entry failed (reason {reason:#x}, host cpu {cpu})"),
                });
            }
            Ok(other) => {
                let what = format!("{other:?}");
                let detail = format!("unexpected exit {what}; {}", self.describe_state());
                return Some(VmExit::Crash {
                    vcpu: index,
                    detail,
                });
            }
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {
                // Kicked (pause, stop): the checkpoint decides what next.
                self.fd.set_kvm_immediate_exit(0);
            }
            Err(e) => {
                return Some(VmExit::InternalError(format!(
                    "KVM_RUN on vCPU {index}: {e}"
                )));
            }
        }
        None
    }

    fn internal_suberror(&mut self) -> u32 {
        let run = self.fd.get_kvm_run();
        // SAFETY: KVM filled the `internal` member for KVM_EXIT_INTERNAL_ERROR.
        unsafe { run.__bindgen_anon_1.internal.suberror }
    }

    /// RIP and the instruction bytes' address, for crash reports.
    fn describe_state(&self) -> String {
        match self.fd.get_regs() {
            Ok(regs) => format!(
                "rip={:#x} rsp={:#x} rflags={:#x}",
                regs.rip, regs.rsp, regs.rflags
            ),
            Err(e) => format!("registers unavailable: {e}"),
        }
    }
}

/// Clears this thread's kick target when dropped.
struct KickRegistration;

impl Drop for KickRegistration {
    fn drop(&mut self) {
        crate::kick::unregister_current();
    }
}

fn suberror_name(suberror: u32) -> &'static str {
    match suberror {
        1 => ": instruction emulation failed",
        2 => ": simultaneous exceptions",
        3 => ": delivery event",
        _ => "",
    }
}
