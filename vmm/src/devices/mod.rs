//! Device models and how the vCPUs reach them.

pub mod bus;
pub mod irq;
pub mod legacy;
pub mod virtio;
pub mod virtio_pci;
