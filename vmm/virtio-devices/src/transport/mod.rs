//! The two transports a guest reaches a virtio device through.
//!
//! - [`mmio`]: virtio-mmio, version 2 register layout. It owns the virtio
//!   protocol itself (status steps, feature negotiation, queue configuration
//!   and validation, notifications) and its guest rules.
//! - [`pci`]: modern virtio-pci (the VMM's default). It writes none of that
//!   protocol again: every virtio access is translated to a register of an
//!   inner [`MmioTransport`](mmio::MmioTransport); it owns what only PCI has
//!   (configuration space, the BAR, the MSI-X table).
//!
//! A device does not know which one it is behind (see [`crate::VirtioDevice`]).

pub(crate) mod mmio;
pub mod pci;
