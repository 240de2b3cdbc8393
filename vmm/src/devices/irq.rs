//! Interrupt lines into the in-kernel irqchip: an eventfd registered with
//! `KVM_IRQFD` on a GSI. Writing an [`IrqLine`] pulses the IOAPIC pin
//! (edge-triggered); a [`LevelIrqLine`] stays up while its device wants it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::kvm::{Result, kvm_err};
use crate::sandbox::{Sandbox, ThreadKind};

/// One GSI's irqfd. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct IrqLine {
    gsi: u32,
    event: Arc<EventFd>,
}

impl IrqLine {
    pub(crate) fn new(vm: &VmFd, gsi: u32) -> Result<Self> {
        let event = EventFd::new(EFD_NONBLOCK).map_err(|e| crate::kvm::Error::Io("eventfd", e))?;
        vm.register_irqfd(&event, gsi)
            .map_err(kvm_err("KVM_IRQFD"))?;
        Ok(IrqLine {
            gsi,
            event: Arc::new(event),
        })
    }

    /// A line on an eventfd the caller reads (tests and fuzzing).
    #[cfg(feature = "testing")]
    pub(crate) fn from_eventfd(gsi: u32, event: EventFd) -> Self {
        IrqLine {
            gsi,
            event: Arc::new(event),
        }
    }

    pub(crate) fn gsi(&self) -> u32 {
        self.gsi
    }

    /// Raises the interrupt.
    pub(crate) fn trigger(&self) -> std::io::Result<()> {
        self.event.write(1)
    }
}

impl vm_superio::Trigger for IrqLine {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        IrqLine::trigger(self)
    }
}

/// The sandbox of a [`LevelIrqLine`]'s thread: it waits on eventfds, reads them
/// and writes the irqfd (`read`, `poll`, `ppoll` and the base set).
const RESAMPLE_THREAD_KIND: ThreadKind = ThreadKind::IrqResample;

/// A level-triggered line: up while its device has something pending (an
/// ACPI status bit), as a device's interrupt output is on real hardware, so
/// that a guest which enables the interrupt late still gets it.
///
/// KVM's IOAPIC holds a level only through a resample irqfd
/// (`KVM_IRQFD_FLAG_RESAMPLE`): writing the irqfd raises the line, and KVM
/// lowers it again by itself, at the guest's EOI and (Linux 6.4 on) when the
/// guest unmasks the pin with the level pending, then signals the
/// resamplefd so that the VMM raises it again if its device still wants it.
/// Nothing else survives a masked pin: an edge is dropped, and so is a level
/// that nobody raises again after the unmask. A thread of the line's own
/// waits on the resamplefd and raises the line again while it is set.
pub(crate) struct LevelIrqLine {
    shared: Arc<LevelShared>,
}

struct LevelShared {
    irqfd: EventFd,
    /// Blocking: the thread sleeps in `read` until KVM (or `Drop`) signals it.
    resample: EventFd,
    level: AtomicBool,
    stopped: AtomicBool,
}

impl LevelIrqLine {
    /// Registers a resample irqfd on `gsi` and starts the line's thread,
    /// named `name`, in its sandbox.
    pub(crate) fn new(vm: &VmFd, gsi: u32, name: &str, sandbox: Arc<Sandbox>) -> Result<Self> {
        let irqfd = EventFd::new(EFD_NONBLOCK).map_err(|e| crate::kvm::Error::Io("eventfd", e))?;
        let resample = EventFd::new(0).map_err(|e| crate::kvm::Error::Io("eventfd", e))?;
        vm.register_irqfd_with_resample(&irqfd, &resample, gsi)
            .map_err(kvm_err("KVM_IRQFD (resample)"))?;
        Self::start(irqfd, resample, name, Some(sandbox))
            .map_err(|e| crate::kvm::Error::Io("the interrupt line's thread", e))
    }

    /// A line on eventfds the test reads and signals as KVM would, its
    /// thread unsandboxed (also the fuzz targets': `fuzzing`).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn unregistered(irqfd: EventFd, resample: EventFd) -> std::io::Result<Self> {
        Self::start(irqfd, resample, "test-level-irq", None)
    }

    /// A line on eventfds the caller registered; its thread enters
    /// `sandbox` if there is one.
    fn start(
        irqfd: EventFd,
        resample: EventFd,
        name: &str,
        sandbox: Option<Arc<Sandbox>>,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(LevelShared {
            irqfd,
            resample,
            level: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
        });
        let thread = shared.clone();
        let thread_name = name.to_string();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Some(sandbox) = sandbox
                    && let Err(e) = sandbox.enter(RESAMPLE_THREAD_KIND)
                {
                    tracing::error!("{thread_name}: cannot enter its sandbox: {e}");
                    return;
                }
                thread.resample_loop(&thread_name);
            })?;
        Ok(LevelIrqLine { shared })
    }

    /// Sets the level: up raises the line now; down lets KVM lower it at
    /// the guest's next EOI (or unmask) without raising it again.
    pub(crate) fn set(&self, up: bool) {
        self.shared.level.store(up, Ordering::SeqCst);
        if up && let Err(e) = self.shared.irqfd.write(1) {
            tracing::error!("cannot raise a level interrupt: {e}");
        }
    }
}

impl LevelShared {
    fn resample_loop(&self, name: &str) {
        loop {
            match self.resample.read() {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::error!("{name}: cannot wait for KVM's resample: {e}");
                    return;
                }
            }
            if self.stopped.load(Ordering::SeqCst) {
                return;
            }
            // Read after the resample was consumed: a `set(true)` after this
            // load writes the irqfd itself.
            if self.level.load(Ordering::SeqCst)
                && let Err(e) = self.irqfd.write(1)
            {
                tracing::error!("{name}: cannot raise the line again: {e}");
            }
        }
    }
}

impl Drop for LevelIrqLine {
    fn drop(&mut self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        // Wakes the thread, which sees `stopped` and ends.
        let _ = self.shared.resample.write(1);
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The line's eventfds as KVM sees them: the irqfd it reads, the
    /// resamplefd it signals.
    pub(crate) fn line() -> (LevelIrqLine, EventFd, EventFd) {
        let irqfd = EventFd::new(EFD_NONBLOCK).unwrap();
        let resample = EventFd::new(0).unwrap();
        let (kvm_irq, kvm_resample) = (irqfd.try_clone().unwrap(), resample.try_clone().unwrap());
        let line = LevelIrqLine::unregistered(irqfd, resample).unwrap();
        (line, kvm_irq, kvm_resample)
    }

    /// Waits up to a second for the irqfd to be written.
    pub(crate) fn raised(irq: &EventFd) -> bool {
        let deadline = Instant::now() + Duration::from_secs(1);
        while Instant::now() < deadline {
            if irq.read().is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        false
    }

    #[test]
    fn a_level_line_is_raised_again_after_each_resample_while_it_is_up() {
        let (line, irq, resample) = line();
        line.set(true);
        assert!(raised(&irq), "set(true) raises the line");
        // KVM lowered it (an EOI, or the guest unmasked the pin): up again.
        resample.write(1).unwrap();
        assert!(raised(&irq), "a resample while up raises the line again");
        resample.write(1).unwrap();
        assert!(raised(&irq));
        // The device has nothing pending any more: a resample leaves it down.
        line.set(false);
        resample.write(1).unwrap();
        assert!(
            !raised(&irq),
            "a resample while down must not raise the line"
        );
        drop(line);
    }

    #[test]
    fn dropping_the_line_ends_its_thread() {
        let (line, _irq, resample) = line();
        let shared = Arc::downgrade(&line.shared);
        drop(line);
        let deadline = Instant::now() + Duration::from_secs(5);
        while shared.upgrade().is_some() {
            assert!(Instant::now() < deadline, "the line's thread still runs");
            std::thread::sleep(Duration::from_millis(5));
        }
        drop(resample);
    }
}
