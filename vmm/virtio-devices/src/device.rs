//! What a virtio device is to its transport.
//!
//! The transport ([`crate::PciTransport`], or [`crate::MmioTransport`],
//! which the PCI transport also keeps inside for the common protocol) owns the
//! guest-facing protocol (registers, status, feature negotiation, queue set-up)
//! and hands a device its queues only once they have been validated. A device
//! owns its queues from activation until reset; it does not know which
//! transport it is behind.

use std::os::fd::RawFd;
use std::sync::Arc;

use crate::GuestMemoryMmap;
use virtio_queue::Queue;

use crate::device_thread::ThreadSandbox;
use crate::interrupt::DeviceInterrupt;
use crate::queue::QueueError;

/// Bit mask for a feature bit number from `virtio-bindings` (which exports
/// them as `u32` bit numbers).
pub(crate) const fn feature_bit(bit: u32) -> u64 {
    1u64 << bit
}

/// Why a device could not be activated. The transport then sets
/// `DEVICE_NEEDS_RESET`.
#[derive(Debug, thiserror::Error)]
pub enum ActivateError {
    #[error("expected {expected} queues, got {got}")]
    QueueCount { expected: usize, got: usize },
    #[error("could not start the device: {0}")]
    Io(#[from] std::io::Error),
}

/// A queue failure that the device cannot report through the queue itself
/// (the used ring cannot be written, the available ring is nonsense). The
/// transport then sets `DEVICE_NEEDS_RESET`.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("notification for queue {0}, which the device does not have")]
    NoSuchQueue(u16),
    #[error("queue {index}: {source}")]
    Queue {
        index: u16,
        #[source]
        source: QueueError,
    },
    #[error("the device is not activated")]
    NotActivated,
}

/// Everything a device gets when the driver sets `DRIVER_OK`.
pub struct ActivateContext {
    /// Guest memory; every buffer address is checked against it.
    pub mem: GuestMemoryMmap,
    /// One validated queue per entry of [`VirtioDevice::queue_max_sizes`].
    pub queues: Vec<Queue>,
    /// The device's interrupt.
    pub interrupt: DeviceInterrupt,
    /// The features the driver accepted (a subset of the offered ones).
    pub acked_features: u64,
    /// What every thread the device starts (virtio-blk's I/O threads)
    /// enters first.
    pub sandbox: Arc<dyn ThreadSandbox>,
}

/// A virtio device type (block, net, rng, ...), independent of the transport.
///
/// The device API: the VMM holds devices as `Box<dyn VirtioDevice>` and
/// hands them to a transport, so this trait and what its methods take and
/// return are public. `Any` lets the crate's tests reach the concrete device
/// behind a transport: `(transport.device() as &dyn Any).downcast_ref::<Net>()`.
pub trait VirtioDevice: Send + std::any::Any {
    /// virtio device ID (`VIRTIO_ID_*`).
    fn device_type(&self) -> u32;

    /// Maximum size of each queue; the length is the number of queues.
    fn queue_max_sizes(&self) -> &[u16];

    /// Features offered to the driver, including transport features such as
    /// `VIRTIO_F_VERSION_1`.
    fn features(&self) -> u64;

    /// Reads the device-specific configuration space. `offset` is relative to
    /// the start of the config space and may be anything the guest asked for:
    /// bytes outside the config structure read as zero.
    fn read_config(&self, offset: u64, data: &mut [u8]);

    /// Writes the device-specific configuration space. Devices ignore (and
    /// log) writes to fields that are not writable.
    fn write_config(&mut self, offset: u64, data: &[u8]);

    /// Starts the device with validated queues.
    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError>;

    /// Returns the device to its pre-activation state: queues dropped,
    /// background work stopped. Called on a driver reset (status 0).
    fn reset(&mut self);

    /// The driver notified queue `index`. Runs on the device's thread
    /// ([`crate::device_thread`]), or on the caller's for a transport
    /// without one. An `Err` means the queue is unusable and the device
    /// needs a reset; [`DeviceError::NotActivated`] is ignored.
    fn process_queue(&mut self, index: u16) -> Result<(), DeviceError>;

    /// A host descriptor the device's thread should also wait on while the
    /// device is activated and not paused (a net device's tap, when it can
    /// take a frame); asked again before every wait.
    fn watched_fd(&self) -> Option<RawFd> {
        None
    }

    /// The descriptor from [`Self::watched_fd`] is readable.
    fn process_fd(&mut self) -> Result<(), DeviceError> {
        Ok(())
    }

    /// The VM is being paused (the device's thread is idle and stays so
    /// until `resume`).
    fn pause(&mut self) {}

    /// The VM runs again.
    fn resume(&mut self) {}

    /// For live migration, while the VM is paused: each activated queue's next available
    /// and next used index (empty before activation), which the transport hands back
    /// to the same device type on the target at its activation. `None`, the default: the
    /// device has state beyond its queues' positions that cannot be moved yet, and a VM
    /// with it cannot be migrated.
    fn queue_positions(&self) -> Option<Vec<(u16, u16)>> {
        None
    }

    /// The VM has ended: stop the device's background work and let go of
    /// what it holds on the host (a disk: its writes and metadata flushed,
    /// the image closed, its locks released). Called once, when the
    /// transport stops the device: on the device's thread as it ends, after
    /// its last notification (`crate::device_thread`), or on the caller's
    /// thread for a transport without one. Nothing is called after it.
    fn close(&mut self) {}
}

/// Copies `data.len()` bytes of a config structure starting at `offset`;
/// bytes past the end of `config` (or a huge `offset`) read as zero.
pub(crate) fn read_config_bytes(config: &[u8], offset: u64, data: &mut [u8]) {
    data.fill(0);
    let Ok(start) = usize::try_from(offset) else {
        return;
    };
    if let Some(available) = config.get(start..) {
        let n = available.len().min(data.len());
        data[..n].copy_from_slice(&available[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_reads_inside_and_past_the_structure() {
        let config = [1u8, 2, 3, 4];
        let mut buf = [0xffu8; 4];
        read_config_bytes(&config, 1, &mut buf);
        assert_eq!(buf, [2, 3, 4, 0]);
        read_config_bytes(&config, 4, &mut buf);
        assert_eq!(buf, [0; 4]);
    }

    #[test]
    fn config_reads_at_huge_offsets_are_zero_not_a_panic() {
        let config = [1u8; 8];
        let mut buf = [0xffu8; 8];
        read_config_bytes(&config, u64::MAX, &mut buf);
        assert_eq!(buf, [0; 8]);
        read_config_bytes(&config, u64::MAX - 3, &mut buf);
        assert_eq!(buf, [0; 8]);
    }
}
