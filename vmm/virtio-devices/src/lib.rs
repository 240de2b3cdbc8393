//! virtio devices for the VMM: the virtio-pci transport (modern, MSI-X; what
//! the VMM uses by default), the virtio-mmio transport, and the block, net and
//! rng devices behind either.
//!
//! Everything a guest writes (registers, descriptor tables, rings, request
//! headers, buffers) is untrusted. The rules, and where each one is enforced:
//!
//! - [`transport::mmio`]: register accesses, the device status state machine,
//!   feature negotiation and queue configuration (sizes, ring addresses inside
//!   guest memory). A guest that breaks the protocol gets its write ignored
//!   (logged) or the device put in the `DEVICE_NEEDS_RESET` state.
//!   [`transport::pci`] translates every virtio access to these registers of
//!   an inner `MmioTransport`, so the same rules hold on PCI; what only PCI has
//!   (configuration space, BAR, MSI-X table) is checked there.
//! - [`queue`]: the available ring (index jumps, head indexes), using
//!   `virtio-queue` for ring access.
//! - [`chain`]: each descriptor chain is checked as a whole before a device
//!   looks at it: terminated, no loops, every buffer inside guest memory, no
//!   address wrap, readable buffers before writable ones. `virtio-queue`
//!   follows chains but does not check that buffers lie in guest memory.
//! - each device's request parser (for example [`block::request`]): what the
//!   request itself must look like.
//!
//! No guest input may panic the VMM.
//!
//! This file only declares the modules and re-exports the public API. The two
//! transports live in `transport/`: [`MmioTransport`], and [`PciTransport`]
//! with its module, re-exported as [`pci`] (`pci::notify_offset`,
//! `pci::BAR_SIZE`).

pub mod block;
pub(crate) mod chain;
pub(crate) mod device;
pub(crate) mod device_thread;
#[cfg(feature = "testing")]
pub mod fuzz;
pub(crate) mod interrupt;
#[cfg(feature = "testing")]
mod log_capture;
mod log_limit;
pub mod net;
pub(crate) mod queue;
mod request_queue;
pub mod rng;
mod transport;

#[cfg(test)]
mod testing;

pub use device::{ActivateContext, ActivateError, DeviceError, VirtioDevice};

/// Guest memory as the devices and the VMM see it: vm-memory's mmap backend with a
/// dirty-page bitmap. Every write through it (a used ring, a read request's data, a
/// received frame, the VMM loading a kernel) marks its pages, which KVM's dirty log
/// (guest writes only) does not: a live migration sends both (`vmm::migration`).
pub type GuestMemoryMmap = vm_memory::GuestMemoryMmap<vm_memory::bitmap::AtomicBitmap>;
#[cfg(feature = "testing")]
pub(crate) use device_thread::Unsandboxed;
pub use device_thread::{ThreadRole, ThreadSandbox};
pub use interrupt::{DeviceInterrupt, InterruptTrigger};
#[cfg(feature = "testing")]
pub use log_capture::LogCapture;
pub use log_limit::{LOG_BURST, LOG_INTERVAL, LogLimit};
pub use queue::QueueError;
pub use transport::mmio::{MmioTransport, QueueRegisters, TransportState};
pub use transport::pci;
pub use transport::pci::{MsiInterrupts, MsiMessage, PciState, PciTransport};
