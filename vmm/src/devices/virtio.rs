//! virtio-mmio devices: each gets a 4 KiB register window from 0xd0000000
//! and its own GSI from 5 up (an irqfd), and is announced on the kernel
//! command line as `virtio_mmio.device=4K@<base>:<gsi>`. The transport and
//! the devices live in the `virtio-devices` crate; disk formats in `block`.
//!
//! Each device runs on its own thread: one eventfd per queue is registered
//! with `KVM_IOEVENTFD` on the window's QueueNotify register, matching the
//! queue index, so a notification reaches the device thread without a vCPU
//! exit (a write of another value still exits and the transport refuses or
//! forwards it).

use std::sync::{Arc, Mutex, Weak};

use block::DirtyTracked;

use kvm_ioctls::{IoEventAddress, VmFd};
use linux_loader::cmdline::Cmdline;
use virtio_bindings::virtio_ids::{VIRTIO_ID_BLOCK, VIRTIO_ID_NET, VIRTIO_ID_RNG};
use virtio_bindings::virtio_mmio::VIRTIO_MMIO_QUEUE_NOTIFY;
use virtio_devices::GuestMemoryMmap;
use virtio_devices::block::{Block, BlockOptions};
use virtio_devices::net::{Net, NetOptions};
use virtio_devices::rng::Rng;
use virtio_devices::{InterruptTrigger, MmioTransport, PciTransport, VirtioDevice};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use crate::bus::{Bus, BusDevice, lock};
use crate::config::{DiskCache, VmConfig};
use crate::devices::irq::IrqLine;
use crate::kvm::layout::{
    VIRTIO_FIRST_IRQ, VIRTIO_MAX_DEVICES, VIRTIO_MMIO_BASE, VIRTIO_MMIO_SIZE,
};
use crate::sandbox::Sandbox;
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
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
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
pub(crate) fn default_mac(index: usize) -> [u8; 6] {
    [
        0x52,
        0x54,
        0x00,
        0x12,
        0x34,
        // The low byte of the index: MACs repeat every 256 devices.
        0x56u8.wrapping_add(index.to_le_bytes()[0]),
    ]
}

/// The devices the configuration asks for, in a fixed order: disks, nets,
/// rng; their counters; the disks for a migration's block copy.
pub(crate) fn build_devices(config: &VmConfig) -> Result<Devices, Error> {
    let mut devices: Vec<Box<dyn VirtioDevice>> = Vec::new();
    let mut counters = DeviceCounters::default();
    let mut disks = Vec::new();
    for disk in &config.disks {
        // Several requests of a batch in flight at once (see
        // `virtio_devices::block`).
        let opts = block::OpenOptions {
            read_only: disk.read_only,
            direct: disk.cache == DiskCache::None,
            backing: disk.backing.clone(),
        };
        let open_path = disk.open_path();
        let backend =
            block::ConcurrentDisk::open(&open_path, disk.format, opts).map_err(|source| {
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
        disks.push(device.migration_disk());
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
    Ok(Devices {
        devices,
        counters,
        disks,
    })
}

/// What [`build_devices`] builds.
pub(crate) struct Devices {
    pub(crate) devices: Vec<Box<dyn VirtioDevice>>,
    pub(crate) counters: DeviceCounters,
    pub(crate) disks: Vec<Weak<DirtyTracked>>,
}

/// A device behind its transport (virtio-mmio here, virtio-pci in
/// `virtio_pci`).
#[derive(Clone)]
pub(crate) enum VirtioTransport {
    Mmio(Arc<Mutex<MmioTransport>>),
    Pci(Arc<Mutex<PciTransport>>),
}

impl VirtioTransport {
    pub(crate) fn pause(&self) {
        match self {
            VirtioTransport::Mmio(t) => lock(t).pause(),
            VirtioTransport::Pci(t) => lock(t).pause(),
        }
    }

    pub(crate) fn resume(&self) {
        match self {
            VirtioTransport::Mmio(t) => lock(t).resume(),
            VirtioTransport::Pci(t) => lock(t).resume(),
        }
    }

    /// The VM's end: the device's thread finishes its work and ends, the
    /// device is closed (a disk flushed and closed, its locks released).
    pub(crate) fn stop(&self) {
        match self {
            VirtioTransport::Mmio(t) => lock(t).stop(),
            VirtioTransport::Pci(t) => lock(t).stop(),
        }
    }
}

/// The devices on the bus, and their counters.
pub(crate) struct Attached {
    pub(crate) transports: Vec<VirtioTransport>,
    pub(crate) counters: DeviceCounters,
    /// The disks, in the configuration's order (see `Block::migration_disk`).
    pub(crate) disks: Vec<Weak<DirtyTracked>>,
}

/// The name of a device's thread (at most 15 bytes, the kernel's limit).
pub(crate) fn thread_name(device_type: u32) -> String {
    match device_type {
        VIRTIO_ID_BLOCK => "virtio-blk".into(),
        VIRTIO_ID_NET => "virtio-net".into(),
        VIRTIO_ID_RNG => "virtio-rng".into(),
        other => format!("virtio-{other}"),
    }
}

/// One eventfd per queue of the device at `base`, each registered as an
/// ioeventfd on QueueNotify with its queue index as datamatch.
fn queue_notifiers(vm: &VmFd, base: u64, queues: usize) -> Result<Vec<EventFd>, Error> {
    let notify = IoEventAddress::Mmio(base + u64::from(VIRTIO_MMIO_QUEUE_NOTIFY));
    (0..queues)
        .map(|index| {
            let io = |what: &str| {
                let what = format!("queue {index} of the device at {base:#x}: {what}");
                move |source| Error::Io { what, source }
            };
            let event = EventFd::new(EFD_NONBLOCK).map_err(io("eventfd"))?;
            // A 4-byte write of exactly this queue index: the transport
            // still sees (and refuses) any other value.
            let datamatch =
                u32::try_from(index).map_err(|_| Error::Setup("too many queues".into()))?;
            vm.register_ioevent(&event, &notify, datamatch)
                .map_err(|e| std::io::Error::from_raw_os_error(e.errno()))
                .map_err(io("KVM_IOEVENTFD"))?;
            Ok(event)
        })
        .collect()
}

/// Creates the configured devices, puts them on the MMIO bus with their
/// interrupt lines and announces them on the command line. Each device's
/// thread is started here and enters `sandbox`.
pub(crate) fn attach(
    config: &VmConfig,
    vm: &VmFd,
    mem: &GuestMemoryMmap,
    mmio: &mut Bus,
    cmdline: &mut Cmdline,
    sandbox: &Arc<Sandbox>,
) -> Result<Attached, Error> {
    let Devices {
        devices,
        counters,
        disks,
    } = build_devices(config)?;
    if devices.len() > int_cast::u32_to_usize(VIRTIO_MAX_DEVICES) {
        return Err(Error::TooMany(devices.len()));
    }
    let mut transports = Vec::with_capacity(devices.len());
    for (slot, device) in (0u32..).zip(devices) {
        let base = VIRTIO_MMIO_BASE + u64::from(slot) * VIRTIO_MMIO_SIZE;
        let gsi = VIRTIO_FIRST_IRQ + slot;
        let irq = IrqLine::new(vm, gsi).map_err(|e| Error::Setup(e.to_string()))?;
        let notifiers = queue_notifiers(vm, base, device.queue_max_sizes().len())?;
        let name = thread_name(device.device_type());
        let transport = MmioTransport::with_thread(
            &name,
            device,
            mem.clone(),
            Arc::new(irq),
            notifiers,
            sandbox.clone(),
        )
        .map_err(|source| Error::Io {
            what: format!("{name} device thread"),
            source,
        })?;
        let transport = Arc::new(Mutex::new(transport));
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
        disks,
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
