//! Starting the vCPU threads.
//!
//! Each vCPU is created, set up and sandboxed on its own thread while the
//! thread that builds the VM attaches the devices and loads the kernel; the
//! first vCPU's thread also adds the PIT (whose kernel thread takes a
//! millisecond to start). That takes the vCPU work off the path to the first
//! `KVM_RUN` (`vmm/cli/benches/README.md`). The threads then wait at a gate
//! until [`StartingVcpus::release`] hands them the kernel entry and the
//! buses, or [`StartingVcpus::abort`] sends them home.

use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use kvm_ioctls::VmFd;
use vm_memory::GuestMemoryMmap;

use crate::bus::lock;
use crate::config::ApStart;
use crate::error::{Error, Result};
use crate::kvm::cpuid::CpuidPolicy;
use crate::kvm::vcpu::{Buses, Vcpu};
use crate::lifecycle::{Control, VmExit};
use crate::sandbox::{Sandbox, ThreadKind};
use crate::stats::VcpuTids;

/// What the vCPUs need once the VM is built.
#[derive(Clone)]
pub(crate) struct Launch {
    /// The kernel entry point.
    pub(crate) entry: u64,
    pub(crate) buses: Arc<Buses>,
}

/// vCPU threads that are being set up, or wait at the gate.
pub(crate) struct StartingVcpus {
    threads: Vec<JoinHandle<()>>,
    gate: Arc<Gate<Launch>>,
    /// One report per thread: its vCPU is ready and the thread sandboxed.
    ready: Receiver<Result<()>>,
}

/// What every vCPU thread gets.
pub(crate) struct Shared<'a> {
    pub(crate) vm: &'a Arc<VmFd>,
    pub(crate) memory: &'a GuestMemoryMmap,
    pub(crate) cpuid: &'a CpuidPolicy,
    pub(crate) ap_start: ApStart,
    pub(crate) control: &'a Arc<Control>,
    pub(crate) tids: &'a VcpuTids,
    pub(crate) sandbox: &'a Arc<Sandbox>,
}

impl StartingVcpus {
    /// Starts one thread per vCPU. Errors of the threads' set-up are
    /// reported by [`StartingVcpus::release`].
    pub(crate) fn spawn(count: u8, shared: &Shared) -> Result<StartingVcpus> {
        let gate = Arc::new(Gate::default());
        let (ready_tx, ready) = channel();
        let mut starting = StartingVcpus {
            threads: Vec::with_capacity(usize::from(count)),
            gate,
            ready,
        };
        for index in 0..count {
            let vm = shared.vm.clone();
            let memory = shared.memory.clone();
            let cpuid = shared.cpuid.for_vcpu(index);
            let ap_start = shared.ap_start;
            let (control, tids, sandbox) = (
                shared.control.clone(),
                shared.tids.clone(),
                shared.sandbox.clone(),
            );
            let (gate, ready_tx) = (starting.gate.clone(), ready_tx.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("vcpu{index}"))
                .spawn(move || {
                    let slot = tids.get(usize::from(index));
                    if let Some(slot) = slot {
                        slot.store(crate::stats::current_tid(), Ordering::Relaxed);
                    }
                    let pit = if index == 0 {
                        crate::kvm::create_pit(&vm)
                    } else {
                        Ok(())
                    };
                    let vcpu = pit
                        .and_then(|()| Vcpu::new(&vm, &memory, &cpuid, index, ap_start))
                        .map_err(Error::from)
                        .and_then(|vcpu| {
                            sandbox
                                .enter(ThreadKind::Vcpu)
                                .map(|()| vcpu)
                                .map_err(|source| Error::EnterSandbox {
                                    kind: ThreadKind::Vcpu,
                                    source,
                                })
                        });
                    // The VM fd is the VM's to close, after the vCPUs.
                    drop((vm, memory));
                    let (vcpu, report) = match vcpu {
                        Ok(vcpu) => (Some(vcpu), Ok(())),
                        Err(e) => (None, Err(e)),
                    };
                    let _ = ready_tx.send(report);
                    match (vcpu, gate.wait()) {
                        (Some(vcpu), Some(launch)) => match vcpu.set_entry(launch.entry) {
                            Ok(()) => vcpu.run(&control, &launch.buses),
                            Err(e) => {
                                control.finish(VmExit::InternalError(format!("vCPU {index}: {e}")));
                                control.vcpu_stopped();
                            }
                        },
                        _ => control.vcpu_stopped(),
                    }
                    // The id may be reused by another thread once this one ends.
                    if let Some(slot) = slot {
                        slot.store(0, Ordering::Relaxed);
                    }
                });
            match spawned {
                Ok(handle) => starting.threads.push(handle),
                Err(e) => {
                    starting.abort();
                    return Err(Error::Thread(e));
                }
            }
        }
        Ok(starting)
    }

    /// Waits until every vCPU is ready, registers the threads for kicks,
    /// then lets them enter the guest. If a vCPU could not be set up, none
    /// runs and its error is returned.
    pub(crate) fn release(self, control: &Control, launch: Launch) -> Result<Vec<JoinHandle<()>>> {
        use std::os::unix::thread::JoinHandleExt;
        for _ in 0..self.threads.len() {
            let failure = match self.ready.recv() {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(_) => Error::VcpuThreadEnded,
            };
            control.finish(VmExit::InternalError(format!(
                "cannot start the vCPUs: {failure}"
            )));
            self.abort();
            return Err(failure);
        }
        // Registered before any thread enters the guest, so no kick can miss one.
        control.set_vcpu_threads(self.threads.iter().map(|t| t.as_pthread_t()).collect());
        self.gate.open(Some(launch));
        Ok(self.threads)
    }

    /// Sends the threads home without entering the guest and waits for them
    /// (the VM could not be built).
    pub(crate) fn abort(self) {
        self.gate.open(None);
        for thread in self.threads {
            let _ = thread.join();
        }
    }
}

/// A one-shot gate: threads wait at it until it opens with a value for them
/// (go) or without one (stop).
struct Gate<T> {
    /// `None` while closed.
    state: Mutex<Option<Option<T>>>,
    opened: Condvar,
}

impl<T> Default for Gate<T> {
    fn default() -> Self {
        Gate {
            state: Mutex::new(None),
            opened: Condvar::new(),
        }
    }
}

impl<T: Clone> Gate<T> {
    fn wait(&self) -> Option<T> {
        let state = lock(&self.state);
        let state = self
            .opened
            .wait_while(state, |state| state.is_none())
            .unwrap_or_else(|p| p.into_inner());
        state.clone().flatten()
    }

    fn open(&self, value: Option<T>) {
        *lock(&self.state) = Some(value);
        self.opened.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gate_hands_every_waiter_its_value_or_none() {
        for value in [Some(7u32), None] {
            let gate = Arc::new(Gate::default());
            let waiters: Vec<_> = (0..3)
                .map(|_| {
                    let gate = gate.clone();
                    std::thread::spawn(move || gate.wait())
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(20));
            gate.open(value);
            for waiter in waiters {
                assert_eq!(waiter.join().unwrap(), value);
            }
            // Opened once, it stays open.
            assert_eq!(gate.wait(), value);
        }
    }
}
