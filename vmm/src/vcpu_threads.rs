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
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

use kvm_ioctls::VmFd;
use virtio_devices::GuestMemoryMmap;

use crate::bus::lock;
use crate::config::ApStart;
use crate::error::{Error, Result};
use crate::kvm::cpuid::CpuidPolicy;
use crate::kvm::vcpu::{Buses, Vcpu};
use crate::kvm::vcpu_state::VcpuState;
use crate::lifecycle::{Control, VmExit};
use crate::sandbox::{Sandbox, ThreadKind};
use crate::stats::VcpuTids;

/// How long the vCPU threads may take to restore their states.
const RESTORE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// What the vCPUs need once the VM is built.
#[derive(Clone)]
pub(crate) struct Launch {
    pub(crate) start: Start,
    pub(crate) buses: Arc<Buses>,
}

/// Where the vCPUs start.
#[derive(Clone)]
pub(crate) enum Start {
    /// At the kernel's entry point.
    Entry(u64),
    /// From the states another VMM saved (a migration's target).
    Restore(Arc<Restore>),
}

/// The saved states and the two-step start of restored vCPUs: each thread restores its
/// vCPU and reports, then all wait for the word to run, so that no vCPU runs unless
/// every one (and the rest of the VM) was restored.
pub(crate) struct Restore {
    states: Vec<VcpuState>,
    restored: Mutex<Sender<std::result::Result<(), String>>>,
    go: Gate<bool>,
}

impl Restore {
    /// Restores vCPU `index`, then enters the vCPU's sandbox (whose filter does not
    /// let a vCPU thread set registers or MSRs); returns whether it may run.
    fn apply(&self, vcpu: &Vcpu, index: u8, sandbox: &Sandbox) -> bool {
        let result = self
            .states
            .get(usize::from(index))
            .ok_or_else(|| "no saved state".to_string())
            .and_then(|state| vcpu.restore(state))
            .and_then(|()| {
                sandbox
                    .enter(ThreadKind::Vcpu)
                    .map_err(|e| format!("cannot enter the sandbox: {e}"))
            })
            .map_err(|e| format!("vCPU {index}: {e}"));
        let restored = result.is_ok();
        let _ = lock(&self.restored).send(result);
        restored && self.go.wait() == Some(true)
    }
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
    pub(crate) msr_indices: &'a Arc<[u32]>,
    /// The vCPUs will be restored from a migration's state: their threads enter the
    /// sandbox after that, not before the gate.
    pub(crate) restore_first: bool,
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
            let msr_indices = shared.msr_indices.clone();
            let restore_first = shared.restore_first;
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
                        .and_then(|()| {
                            Vcpu::new(&vm, &memory, &cpuid, index, ap_start, msr_indices)
                        })
                        .map_err(Error::from)
                        .and_then(|vcpu| {
                            if restore_first {
                                return Ok(vcpu);
                            }
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
                        (Some(vcpu), Some(launch)) => match &launch.start {
                            // Never unsandboxed in the guest: a kernel start enters here
                            // if it did not before the gate.
                            Start::Entry(entry) => match (if restore_first {
                                sandbox.enter(ThreadKind::Vcpu).map_err(|source| {
                                    Error::EnterSandbox {
                                        kind: ThreadKind::Vcpu,
                                        source,
                                    }
                                })
                            } else {
                                Ok(())
                            })
                            .and_then(|()| vcpu.set_entry(*entry).map_err(Error::from))
                            {
                                Ok(()) => vcpu.run(&control, &launch.buses),
                                Err(e) => {
                                    control.finish(VmExit::InternalError(format!(
                                        "vCPU {index}: {e}"
                                    )));
                                    control.vcpu_stopped();
                                }
                            },
                            Start::Restore(restore) => {
                                if restore.apply(&vcpu, index, &sandbox) {
                                    vcpu.run(&control, &launch.buses);
                                } else {
                                    control.vcpu_stopped();
                                }
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
        if let Err(e) = self.wait_ready(control) {
            self.abort();
            return Err(e);
        }
        self.register(control);
        self.gate.open(Some(launch));
        Ok(self.threads)
    }

    /// Restores every vCPU from `states`, then `platform` (the VM-wide state, with the
    /// vCPUs restored and not yet running), then lets the vCPUs run. If anything fails
    /// no vCPU runs, the VM ends, and the error is returned.
    pub(crate) fn release_restored(
        self,
        control: &Control,
        buses: Arc<Buses>,
        states: Vec<VcpuState>,
        platform: impl FnOnce() -> std::result::Result<(), String>,
    ) -> std::result::Result<Vec<JoinHandle<()>>, String> {
        if let Err(e) = self.wait_ready(control) {
            self.abort();
            return Err(e.to_string());
        }
        self.register(control);
        let (restored_tx, restored) = channel();
        let restore = Arc::new(Restore {
            states,
            restored: Mutex::new(restored_tx),
            go: Gate::default(),
        });
        self.gate.open(Some(Launch {
            start: Start::Restore(restore.clone()),
            buses,
        }));
        // Bounded: a vCPU thread that died in its restore never reports.
        let outcome = (0..self.threads.len())
            .try_for_each(|_| {
                restored
                    .recv_timeout(RESTORE_TIMEOUT)
                    .unwrap_or(Err(format!(
                        "a vCPU did not report its restore within {RESTORE_TIMEOUT:?}"
                    )))
            })
            .and_then(|()| platform());
        match outcome {
            Ok(()) => {
                restore.go.open(Some(true));
                Ok(self.threads)
            }
            Err(e) => {
                control.finish(VmExit::InternalError(format!("cannot restore the VM: {e}")));
                restore.go.open(None);
                control.forget_vcpu_threads();
                for thread in self.threads {
                    let _ = thread.join();
                }
                Err(e)
            }
        }
    }

    /// Registers the threads for kicks, before any of them enters the guest, so that
    /// no kick can miss one.
    fn register(&self, control: &Control) {
        use std::os::unix::thread::JoinHandleExt;
        control.set_vcpu_threads(self.threads.iter().map(|t| t.as_pthread_t()).collect());
    }

    /// Waits until every vCPU is ready. If a vCPU could not be set up, the VM ends and
    /// the vCPU's error is returned (the caller sends the threads home).
    fn wait_ready(&self, control: &Control) -> Result<()> {
        for _ in 0..self.threads.len() {
            let failure = match self.ready.recv() {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(_) => Error::VcpuThreadEnded,
            };
            control.finish(VmExit::InternalError(format!(
                "cannot start the vCPUs: {failure}"
            )));
            return Err(failure);
        }
        Ok(())
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
