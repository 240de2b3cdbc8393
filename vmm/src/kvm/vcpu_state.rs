//! One vCPU's complete state, as KVM keeps it: general and system registers, the
//! XSAVE area (x87, SSE, AVX: the FPU), XCRs, debug registers, the local APIC's page,
//! the MP state (running, halted, waiting for SIPI), pending events (exceptions,
//! interrupts, NMIs, the interrupt shadow) and every MSR KVM can save.
//!
//! Read and written on the vCPU's own thread while the VM is paused (`lifecycle`:
//! a paused vCPU answers save requests; `vcpu_threads`: a restored one starts from it).

use kvm_bindings::{
    Msrs, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs, kvm_sregs,
    kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};
use kvm_ioctls::VcpuFd;

use crate::wire::{Decoder, Encoder, FormatError};

/// MSRs per vCPU at most: KVM's save list has a few hundred on today's hosts.
pub(crate) const MAX_MSRS: usize = 2048;
/// MSRs in one `KVM_GET_MSRS`/`KVM_SET_MSRS` (kvm-bindings' `Msrs` holds at most 256).
const MSRS_PER_CALL: usize = 256;

/// A vCPU's state, as moved between VMMs.
pub(crate) struct VcpuState {
    regs: kvm_regs,
    sregs: kvm_sregs,
    xsave: kvm_xsave,
    xcrs: kvm_xcrs,
    debugregs: kvm_debugregs,
    lapic: kvm_lapic_state,
    mp_state: kvm_mp_state,
    events: kvm_vcpu_events,
    msrs: Vec<kvm_msr_entry>,
}

/// A KVM call on a vCPU failed.
fn kvm(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> String {
    move |e| format!("{what}: {e}")
}

impl VcpuState {
    /// Reads the state of a vCPU that is outside `KVM_RUN`. `msr_indices` is KVM's
    /// list of MSRs to save (`KVM_GET_MSR_INDEX_LIST`); those this vCPU cannot read
    /// (another vendor's, a feature its CPUID hides) are left out.
    pub(crate) fn save(fd: &VcpuFd, msr_indices: &[u32]) -> Result<VcpuState, String> {
        Ok(VcpuState {
            regs: fd.get_regs().map_err(kvm("KVM_GET_REGS"))?,
            sregs: fd.get_sregs().map_err(kvm("KVM_GET_SREGS"))?,
            xsave: fd.get_xsave().map_err(kvm("KVM_GET_XSAVE"))?,
            xcrs: fd.get_xcrs().map_err(kvm("KVM_GET_XCRS"))?,
            debugregs: fd.get_debug_regs().map_err(kvm("KVM_GET_DEBUGREGS"))?,
            lapic: fd.get_lapic().map_err(kvm("KVM_GET_LAPIC"))?,
            mp_state: fd.get_mp_state().map_err(kvm("KVM_GET_MP_STATE"))?,
            events: fd.get_vcpu_events().map_err(kvm("KVM_GET_VCPU_EVENTS"))?,
            msrs: read_msrs(fd, msr_indices)?,
        })
    }

    /// Writes the state into a new vCPU of the same CPUID, in the order KVM needs:
    /// the local APIC before the MSRs (the TSC deadline needs its timer mode), the
    /// pending events last (setting registers may clear them).
    ///
    /// Only MSRs of `allowed` (this host's save list) are written, each once: KVM
    /// writes them as the host, past the checks a guest's writes get.
    pub(crate) fn restore(&self, fd: &VcpuFd, allowed: &[u32]) -> Result<(), String> {
        let mut seen = std::collections::HashSet::with_capacity(self.msrs.len());
        for msr in &self.msrs {
            if !allowed.contains(&msr.index) {
                return Err(format!("MSR {:#x} is not one this host saves", msr.index));
            }
            if !seen.insert(msr.index) {
                return Err(format!("MSR {:#x} given twice", msr.index));
            }
        }
        fd.set_mp_state(self.mp_state)
            .map_err(kvm("KVM_SET_MP_STATE"))?;
        fd.set_regs(&self.regs).map_err(kvm("KVM_SET_REGS"))?;
        fd.set_sregs(&self.sregs).map_err(kvm("KVM_SET_SREGS"))?;
        // SAFETY: `kvm_xsave` is the 4 KiB legacy area. KVM copies more only for a
        // process that asked for dynamically enabled XSAVE features
        // (`ARCH_REQ_XCOMP_GUEST_PERM`, AMX), which this one never does.
        unsafe { fd.set_xsave(&self.xsave) }.map_err(kvm("KVM_SET_XSAVE"))?;
        fd.set_xcrs(&self.xcrs).map_err(kvm("KVM_SET_XCRS"))?;
        fd.set_debug_regs(&self.debugregs)
            .map_err(kvm("KVM_SET_DEBUGREGS"))?;
        fd.set_lapic(&self.lapic).map_err(kvm("KVM_SET_LAPIC"))?;
        for chunk in self.msrs.chunks(MSRS_PER_CALL) {
            let msrs = Msrs::from_entries(chunk).map_err(|e| format!("the MSR list: {e:?}"))?;
            let set = fd.set_msrs(&msrs).map_err(kvm("KVM_SET_MSRS"))?;
            if set != chunk.len() {
                let refused = chunk.get(set).map_or(0, |m| m.index);
                return Err(format!("KVM_SET_MSRS refused MSR {refused:#x}"));
            }
        }
        fd.set_vcpu_events(&self.events)
            .map_err(kvm("KVM_SET_VCPU_EVENTS"))?;
        Ok(())
    }

    pub(crate) fn encode(&self, e: &mut Encoder) {
        e.pod(&self.regs);
        e.pod(&self.sregs);
        e.pod(&self.xsave);
        e.pod(&self.xcrs);
        e.pod(&self.debugregs);
        e.pod(&self.lapic);
        e.pod(&self.mp_state);
        e.pod(&self.events);
        e.u32(u32::try_from(self.msrs.len()).unwrap_or(u32::MAX));
        for msr in &self.msrs {
            e.pod(msr);
        }
    }

    /// The state from untrusted bytes. Register values are KVM's to check (it refuses
    /// what a CPU could not hold); here the structure and its bounds are checked.
    pub(crate) fn decode(d: &mut Decoder) -> Result<VcpuState, FormatError> {
        let regs = d.pod()?;
        let sregs = d.pod()?;
        let xsave = d.pod()?;
        let xcrs = d.pod()?;
        let debugregs = d.pod()?;
        let lapic = d.pod()?;
        let mp_state = d.pod()?;
        let events = d.pod()?;
        let count = int_cast::u32_to_usize(d.u32()?);
        if count > MAX_MSRS {
            return Err(FormatError::TooLong {
                what: "a vCPU's MSR list",
                len: count as u64,
                max: MAX_MSRS as u64,
            });
        }
        let msrs = (0..count)
            .map(|_| d.pod::<kvm_msr_entry>())
            .collect::<Result<_, _>>()?;
        Ok(VcpuState {
            regs,
            sregs,
            xsave,
            xcrs,
            debugregs,
            lapic,
            mp_state,
            events,
            msrs,
        })
    }
}

/// Every MSR of `indices` this vCPU can read. `KVM_GET_MSRS` stops at the first MSR it
/// cannot read and says how many it read: that one is dropped and the rest asked again.
fn read_msrs(fd: &VcpuFd, indices: &[u32]) -> Result<Vec<kvm_msr_entry>, String> {
    let mut wanted: Vec<kvm_msr_entry> = indices
        .iter()
        .take(MAX_MSRS)
        .map(|&index| kvm_msr_entry {
            index,
            ..Default::default()
        })
        .collect();
    let mut read = Vec::with_capacity(wanted.len());
    while !wanted.is_empty() {
        let len = wanted.len().min(MSRS_PER_CALL);
        let mut msrs =
            Msrs::from_entries(&wanted[..len]).map_err(|e| format!("the MSR list: {e:?}"))?;
        let n = fd
            .get_msrs(&mut msrs)
            .map_err(kvm("KVM_GET_MSRS"))?
            .min(len);
        read.extend_from_slice(&msrs.as_slice()[..n]);
        // Skip the one KVM could not read, if any, and go on after it.
        wanted.drain(..n.saturating_add(1).min(len));
    }
    Ok(read)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(msrs: usize) -> VcpuState {
        VcpuState {
            regs: kvm_regs {
                rip: 0x1234,
                ..Default::default()
            },
            sregs: kvm_sregs::default(),
            xsave: kvm_xsave::default(),
            xcrs: kvm_xcrs::default(),
            debugregs: kvm_debugregs::default(),
            lapic: kvm_lapic_state::default(),
            mp_state: kvm_mp_state::default(),
            events: kvm_vcpu_events::default(),
            msrs: (0..msrs)
                .map(|i| kvm_msr_entry {
                    index: u32::try_from(i).unwrap(),
                    data: 7,
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn encoded(msrs: usize) -> Vec<u8> {
        let mut e = Encoder::default();
        state(msrs).encode(&mut e);
        e.0
    }

    #[test]
    fn a_state_reads_back_and_is_used_up() {
        let bytes = encoded(3);
        let mut d = Decoder::new(&bytes, "a vCPU");
        let back = VcpuState::decode(&mut d).unwrap();
        d.finish().unwrap();
        assert_eq!(back.regs.rip, 0x1234);
        assert_eq!(back.msrs.len(), 3);
        assert_eq!((back.msrs[2].index, back.msrs[2].data), (2, 7));
    }

    #[test]
    fn an_msr_count_past_the_bound_is_refused_before_reading_on() {
        let mut bytes = encoded(0);
        let count_at = bytes.len() - 4;
        bytes[count_at..].copy_from_slice(&u32::MAX.to_le_bytes());
        let err = VcpuState::decode(&mut Decoder::new(&bytes, "a vCPU"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("larger than the limit"), "{err}");
        // A count within the bound that the bytes do not hold.
        bytes[count_at..].copy_from_slice(&2u32.to_le_bytes());
        let err = VcpuState::decode(&mut Decoder::new(&bytes, "a vCPU"))
            .err()
            .unwrap();
        assert!(err.to_string().contains("ends early"), "{err}");
        for cut in [0, 100, bytes.len() - 5] {
            assert!(VcpuState::decode(&mut Decoder::new(&bytes[..cut], "a vCPU")).is_err());
        }
    }
}
