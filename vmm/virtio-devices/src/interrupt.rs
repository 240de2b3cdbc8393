//! How a device tells the guest that something happened.
//!
//! virtio-mmio has one interrupt line per device and an `InterruptStatus`
//! register that says why it fired (used buffers, configuration change). The
//! VMM supplies the line ([`InterruptTrigger`], usually an irqfd); the status
//! bits live here so that device threads (the net receive thread) and the
//! transport (which clears them on `InterruptACK`) see the same value.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use virtio_bindings::virtio_mmio::{VIRTIO_MMIO_INT_CONFIG, VIRTIO_MMIO_INT_VRING};

/// Raises the device's interrupt line in the guest (an irqfd write, for example).
pub trait InterruptTrigger: Send + Sync {
    fn trigger(&self) -> std::io::Result<()>;

    /// Raises the interrupt for one cause (`VIRTIO_MMIO_INT_VRING` or
    /// `VIRTIO_MMIO_INT_CONFIG`): transports with a vector per cause
    /// (virtio-pci's MSI-X) tell them apart; a single line does not.
    fn trigger_cause(&self, _cause: u32) -> std::io::Result<()> {
        self.trigger()
    }
}

/// The interrupt status bits of one device plus the line that announces them.
/// Cheap to clone; all clones share the same status.
#[derive(Clone)]
pub struct DeviceInterrupt {
    status: Arc<AtomicU32>,
    /// Set by a device thread that found its queue unusable; the transport
    /// turns it into `DEVICE_NEEDS_RESET`.
    needs_reset: Arc<AtomicBool>,
    line: Arc<dyn InterruptTrigger>,
}

impl DeviceInterrupt {
    pub(crate) fn new(line: Arc<dyn InterruptTrigger>) -> Self {
        DeviceInterrupt {
            status: Arc::new(AtomicU32::new(0)),
            needs_reset: Arc::new(AtomicBool::new(false)),
            line,
        }
    }

    /// The device put buffers in a used ring.
    pub fn signal_used_queue(&self) {
        self.raise(VIRTIO_MMIO_INT_VRING);
    }

    /// The device configuration (or the device status, for
    /// `DEVICE_NEEDS_RESET`) changed.
    pub fn signal_config_change(&self) {
        self.raise(VIRTIO_MMIO_INT_CONFIG);
    }

    /// A device running on its own thread cannot go on: the transport will
    /// report `DEVICE_NEEDS_RESET`, announced by a configuration interrupt.
    pub fn signal_needs_reset(&self) {
        self.needs_reset.store(true, Ordering::SeqCst);
        self.signal_config_change();
    }

    /// Whether [`signal_needs_reset`](Self::signal_needs_reset) was called
    /// since the last [`clear`](Self::clear).
    pub(crate) fn needs_reset(&self) -> bool {
        self.needs_reset.load(Ordering::SeqCst)
    }

    /// Current `InterruptStatus` register value.
    pub(crate) fn status(&self) -> u32 {
        self.status.load(Ordering::SeqCst)
    }

    /// The causes a migration's source had pending (no interrupt is sent: the
    /// interrupt controllers' state came with the VM).
    pub(crate) fn restore_status(&self, status: u32) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Sends each pending cause again.
    pub(crate) fn reraise(&self) {
        let status = self.status();
        for bit in [VIRTIO_MMIO_INT_VRING, VIRTIO_MMIO_INT_CONFIG] {
            if status & bit != 0 {
                self.raise(bit);
            }
        }
    }

    /// `InterruptACK`: clears the acknowledged bits.
    pub(crate) fn acknowledge(&self, bits: u32) {
        self.status.fetch_and(!bits, Ordering::SeqCst);
    }

    /// Device reset: no pending causes, no pending reset request.
    pub(crate) fn clear(&self) {
        self.status.store(0, Ordering::SeqCst);
        self.needs_reset.store(false, Ordering::SeqCst);
    }

    fn raise(&self, bit: u32) {
        self.status.fetch_or(bit, Ordering::SeqCst);
        if let Err(e) = self.line.trigger_cause(bit) {
            // Nothing the guest did; the host side of the line is broken. A
            // polling guest still sees the used ring, so keep running.
            tracing::error!("virtio: failed to raise the device interrupt: {e}");
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Counts how often the line was raised.
    #[derive(Default)]
    pub(crate) struct CountingTrigger {
        pub(crate) count: AtomicUsize,
    }

    impl InterruptTrigger for CountingTrigger {
        fn trigger(&self) -> std::io::Result<()> {
            self.count.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn status_bits_are_set_and_acknowledged_separately() {
        let line = Arc::new(CountingTrigger::default());
        let irq = DeviceInterrupt::new(line.clone());
        irq.signal_used_queue();
        irq.signal_config_change();
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG);
        assert_eq!(line.count.load(Ordering::SeqCst), 2);
        irq.acknowledge(VIRTIO_MMIO_INT_VRING);
        assert_eq!(irq.status(), VIRTIO_MMIO_INT_CONFIG);
        irq.clear();
        assert_eq!(irq.status(), 0);
    }
}
