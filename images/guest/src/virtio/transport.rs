//! Driver side of virtio-mmio version 2 (virtio 1.2 §4.2.3) and of modern
//! virtio-pci (§4.1.4): probing, the status handshake, feature negotiation,
//! queue set-up, notifications and interrupts. Both transports offer the
//! same operations, so the device checks do not care which one they drive.

use crate::io::{mmio_read8, mmio_read32, mmio_write32};

use super::queue::{QUEUE_SIZE, Queue};

const MAGIC_VALUE: u64 = 0x000;
const VERSION: u64 = 0x004;
const DEVICE_ID: u64 = 0x008;
const DEVICE_FEATURES: u64 = 0x010;
const DEVICE_FEATURES_SEL: u64 = 0x014;
const DRIVER_FEATURES: u64 = 0x020;
const DRIVER_FEATURES_SEL: u64 = 0x024;
const QUEUE_SEL: u64 = 0x030;
const QUEUE_NUM_MAX: u64 = 0x034;
const QUEUE_NUM: u64 = 0x038;
const QUEUE_READY: u64 = 0x044;
const QUEUE_NOTIFY: u64 = 0x050;
const INTERRUPT_STATUS: u64 = 0x060;
const INTERRUPT_ACK: u64 = 0x064;
const STATUS: u64 = 0x070;
const QUEUE_DESC_LOW: u64 = 0x080;
const QUEUE_DESC_HIGH: u64 = 0x084;
const QUEUE_DRIVER_LOW: u64 = 0x090;
const QUEUE_DRIVER_HIGH: u64 = 0x094;
const QUEUE_DEVICE_LOW: u64 = 0x0a0;
const QUEUE_DEVICE_HIGH: u64 = 0x0a4;
const CONFIG: u64 = 0x100;

pub(super) const S_ACKNOWLEDGE: u32 = 1;
pub(super) const S_DRIVER: u32 = 2;
pub(super) const S_DRIVER_OK: u32 = 4;
pub(super) const S_FEATURES_OK: u32 = 8;
pub(super) const S_NEEDS_RESET: u32 = 64;

/// "virt" little endian.
const MAGIC: u32 = 0x7472_6976;
/// VIRTIO_F_VERSION_1 is bit 32: bit 0 of the second feature word.
pub(super) const VERSION_1_HIGH: u32 = 1;

pub const ID_NET: u32 = 1;
pub const ID_BLOCK: u32 = 2;
pub const ID_RNG: u32 = 4;

/// One virtio device: a virtio-mmio window or a virtio-pci function.
#[derive(Clone)]
pub enum Device {
    Mmio { base: u64 },
    Pci(super::pci::PciDevice),
}

impl Device {
    /// Checks magic and version; returns the device and its device ID
    /// (0 = an empty slot).
    pub fn probe(base: u64) -> Result<(Device, u32), &'static str> {
        let dev = Device::Mmio { base };
        if dev.read(MAGIC_VALUE) != MAGIC {
            return Err("bad magic");
        }
        if dev.read(VERSION) != 2 {
            return Err("not virtio-mmio version 2");
        }
        let id = dev.read(DEVICE_ID);
        Ok((dev, id))
    }

    fn base(&self) -> u64 {
        match self {
            Device::Mmio { base } => *base,
            Device::Pci(_) => 0,
        }
    }

    fn read(&self, reg: u64) -> u32 {
        mmio_read32(self.base() + reg)
    }

    fn write(&self, reg: u64, value: u32) {
        mmio_write32(self.base() + reg, value)
    }

    /// Device reset: the device forgets the queues and stops using our memory.
    pub fn reset(&self) {
        match self {
            Device::Mmio { .. } => self.write(STATUS, 0),
            Device::Pci(p) => p.reset(),
        }
    }

    /// Routes the device's (queue 0's) interrupt to this guest's vector for
    /// `pin`: the IOAPIC pin of a virtio-mmio device, an MSI-X message for
    /// virtio-pci. Returns false if that is impossible.
    pub fn route_interrupt(&self, pin: u32) -> bool {
        match self {
            Device::Mmio { .. } => crate::irq::route(pin),
            Device::Pci(p) => p.route_queue0(pin),
        }
    }

    /// Writes the size of the selected queue as a broken driver would
    /// after DRIVER_OK (the device must ignore it).
    pub fn write_queue_size_late(&self, size: u16) {
        match self {
            Device::Mmio { .. } => self.write(QUEUE_NUM, u32::from(size)),
            Device::Pci(p) => p.write_queue_size(size),
        }
    }

    /// The handshake up to DRIVER_OK with VERSION_1 plus the device feature
    /// bits (first word) in `wanted_low` it offers, and `queues` as queues
    /// 0, 1, ... Returns the first word of the offered features.
    pub fn initialize(&self, wanted_low: u32, queues: &[&Queue]) -> Result<u32, &'static str> {
        if let Device::Pci(p) = self {
            return p.initialize(wanted_low, queues);
        }
        self.reset();
        self.write(STATUS, S_ACKNOWLEDGE);
        self.write(STATUS, S_ACKNOWLEDGE | S_DRIVER);
        self.write(DEVICE_FEATURES_SEL, 0);
        let low = self.read(DEVICE_FEATURES);
        self.write(DEVICE_FEATURES_SEL, 1);
        let high = self.read(DEVICE_FEATURES);
        if high & VERSION_1_HIGH == 0 {
            return Err("device does not offer VERSION_1");
        }
        self.write(DRIVER_FEATURES_SEL, 0);
        self.write(DRIVER_FEATURES, low & wanted_low);
        self.write(DRIVER_FEATURES_SEL, 1);
        self.write(DRIVER_FEATURES, VERSION_1_HIGH);
        let features_ok = S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK;
        self.write(STATUS, features_ok);
        if self.read(STATUS) & S_FEATURES_OK == 0 {
            return Err("device refused our features");
        }
        for (index, queue) in queues.iter().enumerate() {
            self.write(QUEUE_SEL, index as u32);
            if self.read(QUEUE_READY) != 0 {
                return Err("queue already ready after reset");
            }
            if self.read(QUEUE_NUM_MAX) < u32::from(QUEUE_SIZE) {
                return Err("queue too small");
            }
            self.write(QUEUE_NUM, u32::from(QUEUE_SIZE));
            let (desc, avail, used) = queue.addresses();
            self.write(QUEUE_DESC_LOW, desc as u32);
            self.write(QUEUE_DESC_HIGH, (desc >> 32) as u32);
            self.write(QUEUE_DRIVER_LOW, avail as u32);
            self.write(QUEUE_DRIVER_HIGH, (avail >> 32) as u32);
            self.write(QUEUE_DEVICE_LOW, used as u32);
            self.write(QUEUE_DEVICE_HIGH, (used >> 32) as u32);
            self.write(QUEUE_READY, 1);
        }
        self.write(STATUS, features_ok | S_DRIVER_OK);
        if self.read(STATUS) & S_NEEDS_RESET != 0 {
            return Err("device needs reset after DRIVER_OK");
        }
        Ok(low)
    }

    /// Tells the device queue `index` has new buffers.
    pub fn notify(&self, index: u32) {
        // Ring writes before the notification: x86 keeps stores in order and
        // the MMIO write is a VM exit; only the compiler must not reorder.
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        match self {
            Device::Mmio { .. } => self.write(QUEUE_NOTIFY, index),
            Device::Pci(p) => p.notify(index),
        }
    }

    /// Reads and acknowledges the interrupt status (the ISR on PCI).
    pub fn ack_interrupt(&self) -> u32 {
        match self {
            Device::Mmio { .. } => {
                let status = self.read(INTERRUPT_STATUS);
                self.write(INTERRUPT_ACK, status);
                status
            }
            Device::Pci(p) => p.read_isr(),
        }
    }

    pub fn needs_reset(&self) -> bool {
        match self {
            Device::Mmio { .. } => self.read(STATUS) & S_NEEDS_RESET != 0,
            Device::Pci(p) => u32::from(p.status()) & S_NEEDS_RESET != 0,
        }
    }

    pub fn config8(&self, offset: u64) -> u8 {
        match self {
            Device::Mmio { base } => mmio_read8(base + CONFIG + offset),
            Device::Pci(p) => mmio_read8(p.device_cfg + offset),
        }
    }

    pub fn config32(&self, offset: u64) -> u32 {
        match self {
            Device::Mmio { .. } => self.read(CONFIG + offset),
            Device::Pci(p) => mmio_read32(p.device_cfg + offset),
        }
    }
}
