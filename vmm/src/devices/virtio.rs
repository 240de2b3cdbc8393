//! virtio-mmio devices: each gets a 4 KiB register window from 0xd0000000
//! and its own GSI from 5 up (an irqfd), and is announced on the kernel
//! command line as `virtio_mmio.device=4K@<base>:<gsi>`. The transport and
//! the devices live in the `virtio-devices` crate; disk formats in `block`.

use std::sync::{Arc, Mutex};

use kvm_ioctls::VmFd;
use linux_loader::cmdline::Cmdline;
use virtio_devices::block::{Block, BlockOptions};
use virtio_devices::net::{Net, NetOptions};
use virtio_devices::rng::Rng;
use virtio_devices::{InterruptTrigger, MmioTransport, PciTransport, VirtioDevice};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::config::{DiskCache, VmConfig};
use crate::devices::bus::{Bus, BusDevice, lock};
use crate::devices::irq::IrqLine;
use crate::kvm::layout::{
    VIRTIO_FIRST_IRQ, VIRTIO_MAX_DEVICES, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE,
};
use crate::stats::DeviceCounters;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("disk {path}: {source}")]
    Disk {
        path: std::path::PathBuf,
        #[source]
        source: block::DiskError,
    },
    #[error("net device on tap {tap}: {source}")]
    Net {
        tap: String,
        #[source]
        source: virtio_devices::net::NetError,
    },
    #[error("too many virtio devices ({0}; at most {VIRTIO_MAX_DEVICES})")]
    TooMany(usize),
    #[error("{0}")]
    Setup(String),
}

impl InterruptTrigger for IrqLine {
    fn trigger(&self) -> std::io::Result<()> {
        IrqLine::trigger(self)
    }
}

/// A transport on the MMIO bus.
struct MmioSlot(Arc<Mutex<MmioTransport>>);

impl BusDevice for MmioSlot {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        lock(&self.0).read(offset, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        lock(&self.0).write(offset, data);
    }
}

/// Default MAC of net device `index` (locally administered range QEMU uses).
pub fn default_mac(index: usize) -> [u8; 6] {
    [
        0x52,
        0x54,
        0x00,
        0x12,
        0x34,
        0x56u8.wrapping_add(index as u8),
    ]
}

/// The devices the configuration asks for, in a fixed order: disks, nets,
/// rng; and their counters.
pub(crate) fn build_devices(
    config: &VmConfig,
) -> Result<(Vec<Box<dyn VirtioDevice>>, DeviceCounters), Error> {
    let mut devices: Vec<Box<dyn VirtioDevice>> = Vec::new();
    let mut counters = DeviceCounters::default();
    for disk in &config.disks {
        // Several requests of a batch in flight at once (see
        // `virtio_devices::block`).
        let opts = block::OpenOptions {
            read_only: disk.read_only,
            direct: disk.cache == DiskCache::None,
            backing: disk.backing.clone(),
        };
        let backend =
            block::ConcurrentDisk::open(&disk.path, disk.format, opts).map_err(|source| {
                Error::Disk {
                    path: disk.path.clone(),
                    source,
                }
            })?;
        let options = BlockOptions {
            serial: disk.serial.clone(),
            discard: disk.discard,
            write_through: disk.cache == DiskCache::WriteThrough,
            // I/O threads pay off where host I/O has latency (O_DIRECT, a
            // flush per write: 2.3-3.3x in `cargo bench -p virtio-devices`);
            // page-cache copies are faster on the vCPU thread (0.3-0.85x
            // with threads on 2 cores).
            io_threads: match disk.cache {
                DiskCache::WriteBack => 0,
                DiskCache::None | DiskCache::WriteThrough => {
                    virtio_devices::block::DEFAULT_IO_THREADS
                }
            },
            ..BlockOptions::default()
        };
        let device = Block::shared(Arc::new(backend), options);
        counters.disks.push(device.counters());
        devices.push(Box::new(device));
    }
    for (i, net) in config.nets.iter().enumerate() {
        let options = NetOptions {
            mac: net.mac.unwrap_or_else(|| default_mac(i)),
            mtu: net.mtu,
            link_up: net.link_up,
        };
        let device = Net::with_options(&net.tap, options).map_err(|source| Error::Net {
            tap: net.tap.clone(),
            source,
        })?;
        counters.nets.push(device.counters());
        devices.push(Box::new(device));
    }
    if config.rng {
        devices.push(Box::new(Rng::new()));
    }
    Ok((devices, counters))
}

/// A device behind its transport (virtio-mmio here, virtio-pci in
/// `virtio_pci`).
pub enum VirtioTransport {
    Mmio(Arc<Mutex<MmioTransport>>),
    Pci(Arc<Mutex<PciTransport>>),
}

impl VirtioTransport {
    pub fn pause(&self) {
        match self {
            VirtioTransport::Mmio(t) => lock(t).pause(),
            VirtioTransport::Pci(t) => lock(t).pause(),
        }
    }

    pub fn resume(&self) {
        match self {
            VirtioTransport::Mmio(t) => lock(t).resume(),
            VirtioTransport::Pci(t) => lock(t).resume(),
        }
    }
}

/// The devices on the bus, and their counters.
pub struct Attached {
    pub transports: Vec<VirtioTransport>,
    pub counters: DeviceCounters,
}

/// Creates the configured devices, puts them on the MMIO bus with their
/// interrupt lines and announces them on the command line.
pub fn attach(
    config: &VmConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
    cmdline: &mut Cmdline,
) -> Result<Attached, Error> {
    let (devices, counters) = build_devices(config)?;
    if devices.len() > VIRTIO_MAX_DEVICES as usize {
        return Err(Error::TooMany(devices.len()));
    }
    let mut transports = Vec::with_capacity(devices.len());
    for (slot, device) in (0u32..).zip(devices) {
        let base = VIRTIO_MMIO_BASE + u64::from(slot) * VIRTIO_MMIO_SIZE;
        let gsi = VIRTIO_FIRST_IRQ + slot;
        let irq = IrqLine::new(vm, gsi).map_err(|e| Error::Setup(e.to_string()))?;
        let transport = Arc::new(Mutex::new(MmioTransport::new(
            device,
            mem.clone(),
            Arc::new(irq),
        )));
        mmio.insert(
            base,
            VIRTIO_MMIO_SIZE,
            Arc::new(Mutex::new(MmioSlot(transport.clone()))),
        )
        .map_err(|e| Error::Setup(e.to_string()))?;
        cmdline
            .add_virtio_mmio_device(VIRTIO_MMIO_SIZE, GuestAddress(base), gsi, None)
            .map_err(|e| Error::Setup(format!("kernel command line: {e}")))?;
        transports.push(VirtioTransport::Mmio(transport));
    }
    Ok(Attached {
        transports,
        counters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_macs_differ_per_device() {
        assert_eq!(default_mac(0), [0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        assert_ne!(default_mac(0), default_mac(1));
    }

    #[test]
    fn the_device_windows_fit_below_the_ioapic_pins() {
        // Pins 0..=23; the last device's GSI must be one of them.
        const { assert!(VIRTIO_FIRST_IRQ + VIRTIO_MAX_DEVICES - 1 <= 23) };
    }
}
