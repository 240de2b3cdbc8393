//! virtio devices on PCI: each device a function on bus 0 behind the host
//! bridge, its BAR placed in the PCI window by `vm-allocator`, its MSI-X
//! vectors routed through KVM (`pci::msi`). The transport is
//! `virtio_devices::PciTransport`; the devices are the same as on
//! virtio-mmio (`super::virtio::build_devices`).

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use virtio_devices::PciTransport;
use virtio_devices::pci::BAR_SIZE;
use vm_allocator::{AddressAllocator, AllocPolicy};
use vm_memory::GuestMemoryMmap;

use super::bus::{Bus, lock};
use super::virtio::{Attached, Error, VirtioTransport, build_devices};
use crate::config::VmConfig;
use crate::kvm::layout::{PCI_ECAM_BASE, PCI_ECAM_SIZE, PCI_MMIO_BASE, PCI_MMIO_SIZE};
use crate::pci::host_bridge::HostBridge;
use crate::pci::msi::{DeviceMsi, GsiRouter};
use crate::pci::{
    BarWindow, CONFIG_PORTS, CONFIG_PORTS_LEN, ConfigPorts, Ecam, PciBus, PciFunction,
};

/// A virtio transport as a function on the PCI bus.
struct VirtioFunction(Arc<Mutex<PciTransport>>);

impl PciFunction for VirtioFunction {
    fn config_read(&self, offset: u64, data: &mut [u8]) {
        lock(&self.0).config_read(offset, data);
    }

    fn config_write(&mut self, offset: u64, data: &[u8]) {
        lock(&self.0).config_write(offset, data);
    }

    fn bar(&self) -> Option<(u64, u64)> {
        lock(&self.0).bar_address().map(|a| (a, BAR_SIZE))
    }

    fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        lock(&self.0).bar_read(offset, data);
    }

    fn bar_write(&mut self, offset: u64, data: &[u8]) {
        lock(&self.0).bar_write(offset, data);
    }
}

/// Builds the host bridge and the configured devices, and puts the
/// configuration space (ECAM, 0xCF8/0xCFC) and the BAR window on the buses.
pub fn attach(
    config: &VmConfig,
    vm: &Arc<VmFd>,
    mem: &GuestMemoryMmap,
    pio: &mut Bus,
    mmio: &mut Bus,
) -> Result<Attached, Error> {
    let (devices, counters) = build_devices(config)?;
    let setup = |e: &dyn std::fmt::Display| Error::Setup(e.to_string());
    let router = Arc::new(GsiRouter::new(vm.clone()));
    let mut allocator =
        AddressAllocator::new(PCI_MMIO_BASE, PCI_MMIO_SIZE).map_err(|e| setup(&e))?;
    let mut bus = PciBus::new();
    bus.add(Arc::new(Mutex::new(HostBridge::new())));
    let mut transports = Vec::with_capacity(devices.len());
    for device in devices {
        let vectors = device.queue_max_sizes().len() + 1;
        let msi = DeviceMsi::new(router.clone(), vectors).map_err(|e| setup(&e))?;
        let bar = allocator
            .allocate(BAR_SIZE, BAR_SIZE, AllocPolicy::FirstMatch)
            .map_err(|e| setup(&e))?;
        let transport = Arc::new(Mutex::new(PciTransport::new(
            device,
            mem.clone(),
            Arc::new(msi),
            bar.start(),
        )));
        bus.add(Arc::new(Mutex::new(VirtioFunction(transport.clone()))))
            .ok_or(Error::TooMany(transports.len() + 1))?;
        transports.push(VirtioTransport::Pci(transport));
    }
    let bus = Arc::new(bus);
    pio.insert(
        CONFIG_PORTS,
        CONFIG_PORTS_LEN,
        Arc::new(Mutex::new(ConfigPorts::new(bus.clone()))),
    )
    .map_err(|e| setup(&e))?;
    mmio.insert(
        PCI_ECAM_BASE,
        PCI_ECAM_SIZE,
        Arc::new(Mutex::new(Ecam(bus.clone()))),
    )
    .map_err(|e| setup(&e))?;
    mmio.insert(
        PCI_MMIO_BASE,
        PCI_MMIO_SIZE,
        Arc::new(Mutex::new(BarWindow::new(bus, PCI_MMIO_BASE))),
    )
    .map_err(|e| setup(&e))?;
    Ok(Attached {
        transports,
        counters,
    })
}
