//! An interrupt line into the in-kernel irqchip: an eventfd registered with
//! `KVM_IRQFD` on a GSI. Writing it pulses the IOAPIC pin (edge-triggered).

use std::sync::Arc;

use kvm_ioctls::VmFd;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::kvm::{Result, kvm_err};

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

    /// A line on an eventfd the caller registers (or reads, in tests).
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
