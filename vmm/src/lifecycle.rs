//! The states a VM goes through and how it ended, plus the shared control
//! block that vCPU threads, devices and the [`crate::VmHandle`] use to agree
//! on them.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// What a VM is doing now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VmState {
    Running,
    /// Every vCPU is stopped outside `KVM_RUN`; devices keep their state.
    Paused,
    /// The VM has ended (see [`VmExit`]); its threads are stopping or gone.
    Exited,
}

/// How a VM ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VmExit {
    /// The guest asked for a reset (i8042 command 0xfe, as Linux does with
    /// `reboot=k`, or a KVM reset system event).
    Reset,
    /// The guest powered off: a write to the debug-exit port 0xf4 (`code` is
    /// the byte written) or a KVM shutdown system event (code 0).
    PowerOff { code: u8 },
    /// A vCPU hit a triple fault (`KVM_EXIT_SHUTDOWN`).
    TripleFault { vcpu: u8, detail: String },
    /// A vCPU stopped in a way the guest cannot recover from: KVM could not
    /// emulate an instruction, entry failed, or an unexpected exit.
    Crash { vcpu: u8, detail: String },
    /// Stopped from outside ([`crate::VmHandle::kill`]).
    Killed,
    /// The VM moved to another VMM ([`crate::VmHandle::migrate`]) and runs there now.
    Migrated,
    /// The VMM itself failed (a KVM call returned an error).
    InternalError(String),
}

/// Process exit status for a guest crash (triple fault, emulation failure).
pub(crate) const CRASH_EXIT_STATUS: i32 = 125;
/// Process exit status for an internal VMM error.
pub const INTERNAL_ERROR_EXIT_STATUS: i32 = 126;
/// Process exit status when the VM was killed (as a shell reports SIGKILL).
pub(crate) const KILLED_EXIT_STATUS: i32 = 137;

impl VmExit {
    /// The `vmm run` process exit status for this ending: 0 for a reset, the
    /// guest's code for a power-off, non-zero otherwise.
    pub fn exit_status(&self) -> i32 {
        match self {
            VmExit::Reset | VmExit::Migrated => 0,
            VmExit::PowerOff { code } => i32::from(*code),
            VmExit::TripleFault { .. } | VmExit::Crash { .. } => CRASH_EXIT_STATUS,
            VmExit::Killed => KILLED_EXIT_STATUS,
            VmExit::InternalError(_) => INTERNAL_ERROR_EXIT_STATUS,
        }
    }
}

impl fmt::Display for VmExit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            VmExit::Reset => write!(f, "guest reset"),
            VmExit::PowerOff { code } => write!(f, "guest power-off with exit code {code}"),
            VmExit::TripleFault { vcpu, detail } => {
                write!(f, "triple fault on vCPU {vcpu}: {detail}")
            }
            VmExit::Crash { vcpu, detail } => write!(f, "guest crash on vCPU {vcpu}: {detail}"),
            VmExit::Killed => write!(f, "killed"),
            VmExit::Migrated => write!(f, "migrated to another VMM"),
            VmExit::InternalError(e) => write!(f, "internal VMM error: {e}"),
        }
    }
}

#[derive(Debug)]
struct Inner {
    exit: Option<VmExit>,
    pause_requested: bool,
    paused_vcpus: usize,
    running_vcpus: usize,
    /// vCPU threads to kick; emptied once they are joined.
    threads: Vec<libc::pthread_t>,
    /// While the VM is paused for migration: each vCPU's saved state (encoded), filled
    /// in by the vCPU's own thread.
    saves: Option<Vec<Option<SavedVcpu>>>,
}

/// One vCPU's encoded state, or why it could not be read.
type SavedVcpu = Result<Vec<u8>, String>;

/// What a paused vCPU's thread does when asked for its state: reads it (encoded).
pub(crate) type SaveState<'a> = &'a mut dyn FnMut() -> Result<Vec<u8>, String>;

/// The shared control block. vCPU threads call [`Control::checkpoint`]
/// before every `KVM_RUN`; anything that wants them to react first changes
/// the state here, then kicks them out of `KVM_RUN` (see `kvm::vcpu::kick`).
#[derive(Debug)]
pub(crate) struct Control {
    inner: Mutex<Inner>,
    changed: Condvar,
    /// This VM's boot milestones (the benchmark's).
    timeline: Arc<crate::timing::BootTimeline>,
}

/// What a vCPU thread must do at a checkpoint.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Checkpoint {
    Run,
    Stop,
}

impl Control {
    pub(crate) fn new(vcpus: usize) -> Self {
        Control {
            inner: Mutex::new(Inner {
                exit: None,
                pause_requested: false,
                paused_vcpus: 0,
                running_vcpus: vcpus,
                threads: Vec::new(),
                saves: None,
            }),
            changed: Condvar::new(),
            timeline: Arc::default(),
        }
    }

    /// This VM's boot milestones.
    pub(crate) fn timeline(&self) -> &Arc<crate::timing::BootTimeline> {
        &self.timeline
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves plain data; keep going.
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records how the VM ended; the first ending wins. Returns whether this
    /// call set it.
    pub(crate) fn finish(&self, exit: VmExit) -> bool {
        let mut inner = self.lock();
        if inner.exit.is_some() {
            return false;
        }
        tracing::info!("VM ending: {exit}");
        inner.exit = Some(exit);
        self.changed.notify_all();
        Self::kick_threads(&inner);
        true
    }

    /// Records the vCPU threads (before they first enter the guest).
    pub(crate) fn set_vcpu_threads(&self, threads: Vec<libc::pthread_t>) {
        self.lock().threads = threads;
    }

    /// Forgets the vCPU threads: they are about to be joined and must not be
    /// signalled any more.
    pub(crate) fn forget_vcpu_threads(&self) {
        self.lock().threads.clear();
    }

    fn kick_threads(inner: &Inner) {
        for &thread in &inner.threads {
            crate::kick::kick(thread);
        }
    }

    pub(crate) fn exit(&self) -> Option<VmExit> {
        self.lock().exit.clone()
    }

    pub(crate) fn state(&self) -> VmState {
        let inner = self.lock();
        if inner.exit.is_some() {
            VmState::Exited
        } else if inner.pause_requested && inner.paused_vcpus == inner.running_vcpus {
            VmState::Paused
        } else {
            VmState::Running
        }
    }

    /// Called by vCPU `index`'s thread before entering the guest: blocks while the VM
    /// is paused (saving the vCPU's state with `save` when asked); says whether to run
    /// or stop.
    pub(crate) fn checkpoint(&self, index: usize, save: SaveState) -> Checkpoint {
        let mut inner = self.lock();
        if inner.pause_requested && inner.exit.is_none() {
            inner.paused_vcpus += 1;
            self.changed.notify_all();
            while inner.pause_requested && inner.exit.is_none() {
                let asked = inner
                    .saves
                    .as_ref()
                    .is_some_and(|saves| matches!(saves.get(index), Some(None)));
                if asked {
                    drop(inner);
                    let state = save();
                    inner = self.lock();
                    if let Some(slot) = inner.saves.as_mut().and_then(|s| s.get_mut(index)) {
                        *slot = Some(state);
                    }
                    self.changed.notify_all();
                    continue;
                }
                inner = self
                    .changed
                    .wait(inner)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            inner.paused_vcpus -= 1;
        }
        if inner.exit.is_some() {
            Checkpoint::Stop
        } else {
            Checkpoint::Run
        }
    }

    /// Called by a vCPU thread when it leaves its loop for good.
    pub(crate) fn vcpu_stopped(&self) {
        let mut inner = self.lock();
        inner.running_vcpus = inner.running_vcpus.saturating_sub(1);
        self.changed.notify_all();
    }

    /// Whether a pause was asked for (a vCPU finishes its last access before parking).
    pub(crate) fn pause_requested(&self) -> bool {
        self.lock().pause_requested
    }

    /// Asks vCPUs to pause and kicks them out of the guest.
    pub(crate) fn request_pause(&self) {
        let mut inner = self.lock();
        inner.pause_requested = true;
        Self::kick_threads(&inner);
    }

    /// Waits until every running vCPU is parked or the VM ended. Returns
    /// whether the VM is paused.
    pub(crate) fn wait_paused(&self, timeout: Duration) -> bool {
        let inner = self.lock();
        let (inner, _) = self
            .changed
            .wait_timeout_while(inner, timeout, |i| {
                i.exit.is_none() && i.paused_vcpus < i.running_vcpus
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        inner.exit.is_none() && inner.paused_vcpus >= inner.running_vcpus
    }

    /// Lets paused vCPUs run again.
    pub(crate) fn resume(&self) {
        let mut inner = self.lock();
        inner.pause_requested = false;
        inner.saves = None;
        self.changed.notify_all();
    }

    /// Asks every vCPU of a paused VM for its state (`vcpus` of them, indexes
    /// 0..vcpus) and waits for them: the states, encoded, in vCPU order.
    pub(crate) fn save_vcpus(
        &self,
        vcpus: usize,
        timeout: Duration,
    ) -> Result<Vec<Vec<u8>>, String> {
        let mut inner = self.lock();
        if !inner.pause_requested || inner.paused_vcpus < vcpus {
            return Err("the vCPUs are not paused".into());
        }
        inner.saves = Some(vec![None; vcpus]);
        self.changed.notify_all();
        let (mut inner, _) = self
            .changed
            .wait_timeout_while(inner, timeout, |i| {
                i.exit.is_none()
                    && i.saves
                        .as_ref()
                        .is_some_and(|saves| saves.iter().any(Option::is_none))
            })
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(exit) = &inner.exit {
            return Err(format!("the VM ended: {exit}"));
        }
        let saves = inner.saves.take().unwrap_or_default();
        saves
            .into_iter()
            .enumerate()
            .map(|(index, state)| match state {
                Some(Ok(state)) => Ok(state),
                Some(Err(e)) => Err(format!("vCPU {index}: {e}")),
                None => Err(format!(
                    "vCPU {index} did not give its state within {timeout:?}"
                )),
            })
            .collect()
    }

    /// Blocks until the VM ended (or the timeout passed) and returns the ending.
    pub(crate) fn wait_exit(&self, timeout: Option<Duration>) -> Option<VmExit> {
        let inner = self.lock();
        let inner = match timeout {
            Some(t) => {
                self.changed
                    .wait_timeout_while(inner, t, |i| i.exit.is_none())
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0
            }
            None => self
                .changed
                .wait_while(inner, |i| i.exit.is_none())
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        };
        inner.exit.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn first_ending_wins() {
        let c = Control::new(1);
        assert!(c.finish(VmExit::Reset));
        assert!(!c.finish(VmExit::Killed));
        assert_eq!(c.exit(), Some(VmExit::Reset));
        assert_eq!(c.state(), VmState::Exited);
        assert_eq!(c.checkpoint(0, &mut || Ok(Vec::new())), Checkpoint::Stop);
    }

    #[test]
    fn exit_statuses_distinguish_endings() {
        assert_eq!(VmExit::Reset.exit_status(), 0);
        assert_eq!(VmExit::PowerOff { code: 7 }.exit_status(), 7);
        assert_eq!(
            VmExit::TripleFault {
                vcpu: 0,
                detail: String::new()
            }
            .exit_status(),
            CRASH_EXIT_STATUS
        );
        assert_eq!(VmExit::Killed.exit_status(), KILLED_EXIT_STATUS);
        assert_eq!(
            VmExit::InternalError("x".into()).exit_status(),
            INTERNAL_ERROR_EXIT_STATUS
        );
    }

    #[test]
    fn pause_parks_vcpus_until_resumed() {
        let c = Arc::new(Control::new(2));
        c.request_pause();
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let c = c.clone();
                std::thread::spawn(move || c.checkpoint(0, &mut || Ok(Vec::new())))
            })
            .collect();
        assert!(c.wait_paused(Duration::from_secs(10)));
        assert_eq!(c.state(), VmState::Paused);
        c.resume();
        for t in threads {
            assert_eq!(t.join().unwrap(), Checkpoint::Run);
        }
        assert_eq!(c.state(), VmState::Running);
    }

    #[test]
    fn paused_vcpus_give_their_state_on_their_own_threads() {
        let c = Arc::new(Control::new(2));
        assert!(
            c.save_vcpus(2, Duration::from_secs(1)).is_err(),
            "not paused"
        );
        c.request_pause();
        let threads: Vec<_> = (0..2u8)
            .map(|index| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut save = || Ok(vec![index; 3]);
                    c.checkpoint(usize::from(index), &mut save)
                })
            })
            .collect();
        assert!(c.wait_paused(Duration::from_secs(10)));
        let states = c.save_vcpus(2, Duration::from_secs(10)).unwrap();
        assert_eq!(states, vec![vec![0; 3], vec![1; 3]]);
        assert_eq!(c.state(), VmState::Paused, "saving does not resume");
        c.resume();
        for t in threads {
            assert_eq!(t.join().unwrap(), Checkpoint::Run);
        }
    }

    #[test]
    fn an_ending_releases_paused_vcpus() {
        let c = Arc::new(Control::new(1));
        c.request_pause();
        let t = {
            let c = c.clone();
            std::thread::spawn(move || c.checkpoint(0, &mut || Ok(Vec::new())))
        };
        assert!(c.wait_paused(Duration::from_secs(10)));
        c.finish(VmExit::Killed);
        assert_eq!(t.join().unwrap(), Checkpoint::Stop);
        assert_eq!(
            c.wait_exit(Some(Duration::from_secs(1))),
            Some(VmExit::Killed)
        );
    }
}
