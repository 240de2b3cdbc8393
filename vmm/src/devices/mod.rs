//! Device models and how the vCPUs reach them.

pub(crate) mod irq;
pub(crate) mod legacy;
pub(crate) mod virtio;
pub(crate) mod virtio_pci;
pub(crate) mod virtio_state;
