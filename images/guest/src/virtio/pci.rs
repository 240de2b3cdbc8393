//! Driver side of modern virtio-pci (virtio 1.2 §4.1.4): the function's
//! vendor capabilities locate the common configuration, ISR, device
//! configuration and notification area in its BAR; interrupts come as
//! MSI-X messages to the local APIC.

use core::ptr::{read_volatile, write_volatile};

use crate::io::{mmio_read8, mmio_read32, mmio_write8, mmio_write32};
use crate::pci;

use super::queue::{QUEUE_SIZE, Queue};
use super::transport::{
    S_ACKNOWLEDGE, S_DRIVER, S_DRIVER_OK, S_FEATURES_OK, S_NEEDS_RESET, VERSION_1_HIGH,
};

const VENDOR_VIRTIO: u32 = 0x1af4;
const MODERN_BASE: u32 = 0x1040;
const CAP_VENDOR: u8 = 0x09;
const CAP_MSIX: u8 = 0x11;
const COMMON: u8 = 1;
const NOTIFY: u8 = 2;
const ISR: u8 = 3;
const DEVICE: u8 = 4;
const LAPIC_MSI_ADDRESS: u32 = 0xfee0_0000;

// Common configuration fields.
const DEVICE_FEATURE_SELECT: u64 = 0x00;
const DEVICE_FEATURE: u64 = 0x04;
const DRIVER_FEATURE_SELECT: u64 = 0x08;
const DRIVER_FEATURE: u64 = 0x0c;
const DEVICE_STATUS: u64 = 0x14;
const QUEUE_SELECT: u64 = 0x16;
const QUEUE_SIZE_REG: u64 = 0x18;
const QUEUE_MSIX_VECTOR: u64 = 0x1a;
const QUEUE_ENABLE: u64 = 0x1c;
const QUEUE_NOTIFY_OFF: u64 = 0x1e;
const QUEUE_DESC: u64 = 0x20;
const QUEUE_DRIVER: u64 = 0x28;
const QUEUE_DEVICE: u64 = 0x30;

fn read16(addr: u64) -> u16 {
    // SAFETY: an aligned register of the device's BAR (identity mapped).
    unsafe { read_volatile(addr as *const u16) }
}

fn write16(addr: u64, value: u16) {
    // SAFETY: see read16.
    unsafe { write_volatile(addr as *mut u16, value) }
}

/// One virtio-pci function on bus 0.
#[derive(Clone)]
pub struct PciDevice {
    slot: u8,
    common: u64,
    isr: u64,
    pub device_cfg: u64,
    notify: u64,
    multiplier: u32,
    msix_cap: u64,
    msix_table: u64,
}

impl PciDevice {
    /// The virtio device in `slot`, with its device type, if there is one.
    pub fn probe(slot: u8) -> Option<Result<(PciDevice, u32), &'static str>> {
        let id = pci::read32(slot, 0);
        let (vendor, device) = (id & 0xffff, id >> 16);
        if vendor != VENDOR_VIRTIO || device < MODERN_BASE {
            return None;
        }
        // Memory decoding and bus mastering on.
        let command = pci::read32(slot, 4);
        pci::write32(slot, 4, (command & 0xffff_0000) | 0x6);
        let bar = u64::from(pci::read32(slot, 0x10) & !0xf)
            | u64::from(pci::read32(slot, 0x14)) << 32;
        let mut dev = PciDevice {
            slot,
            common: 0,
            isr: 0,
            device_cfg: 0,
            notify: 0,
            multiplier: 0,
            msix_cap: 0,
            msix_table: 0,
        };
        let mut at = u64::from(pci::read32(slot, 0x34) & 0xff);
        for _ in 0..16 {
            if at == 0 {
                break;
            }
            let head = pci::read32(slot, at);
            let (cap, next) = (head as u8, (head >> 8) as u8);
            if cap == CAP_VENDOR {
                let offset = u64::from(pci::read32(slot, at + 8));
                match (head >> 24) as u8 {
                    COMMON => dev.common = bar + offset,
                    ISR => dev.isr = bar + offset,
                    DEVICE => dev.device_cfg = bar + offset,
                    NOTIFY => {
                        dev.notify = bar + offset;
                        dev.multiplier = pci::read32(slot, at + 16);
                    }
                    _ => {}
                }
            } else if cap == CAP_MSIX {
                dev.msix_cap = at;
                dev.msix_table = bar + u64::from(pci::read32(slot, at + 4) & !0x7);
            }
            at = u64::from(next);
        }
        if dev.common == 0 || dev.isr == 0 || dev.notify == 0 || dev.msix_cap == 0 {
            return Some(Err("virtio-pci capabilities missing"));
        }
        Some(Ok((dev, device - MODERN_BASE)))
    }

    pub fn slot(&self) -> u8 {
        self.slot
    }

    pub fn status(&self) -> u8 {
        mmio_read8(self.common + DEVICE_STATUS)
    }

    fn set_status(&self, status: u32) {
        mmio_write8(self.common + DEVICE_STATUS, status as u8);
    }

    pub fn reset(&self) {
        self.set_status(0);
        for _ in 0..1000 {
            if self.status() == 0 {
                break;
            }
        }
    }

    /// The handshake up to DRIVER_OK (as the virtio-mmio one); checks that
    /// each queue's notification offset is its index.
    pub fn initialize(&self, wanted_low: u32, queues: &[&Queue]) -> Result<u32, &'static str> {
        self.reset();
        self.set_status(S_ACKNOWLEDGE);
        self.set_status(S_ACKNOWLEDGE | S_DRIVER);
        mmio_write32(self.common + DEVICE_FEATURE_SELECT, 0);
        let low = mmio_read32(self.common + DEVICE_FEATURE);
        mmio_write32(self.common + DEVICE_FEATURE_SELECT, 1);
        if mmio_read32(self.common + DEVICE_FEATURE) & VERSION_1_HIGH == 0 {
            return Err("device does not offer VERSION_1");
        }
        mmio_write32(self.common + DRIVER_FEATURE_SELECT, 0);
        mmio_write32(self.common + DRIVER_FEATURE, low & wanted_low);
        mmio_write32(self.common + DRIVER_FEATURE_SELECT, 1);
        mmio_write32(self.common + DRIVER_FEATURE, VERSION_1_HIGH);
        let features_ok = S_ACKNOWLEDGE | S_DRIVER | S_FEATURES_OK;
        self.set_status(features_ok);
        if u32::from(self.status()) & S_FEATURES_OK == 0 {
            return Err("device refused our features");
        }
        for (index, queue) in queues.iter().enumerate() {
            write16(self.common + QUEUE_SELECT, index as u16);
            if read16(self.common + QUEUE_ENABLE) != 0 {
                return Err("queue already enabled after reset");
            }
            if read16(self.common + QUEUE_SIZE_REG) < QUEUE_SIZE {
                return Err("queue too small");
            }
            if usize::from(read16(self.common + QUEUE_NOTIFY_OFF)) != index {
                return Err("unexpected queue_notify_off");
            }
            write16(self.common + QUEUE_SIZE_REG, QUEUE_SIZE);
            let (desc, avail, used) = queue.addresses();
            for (reg, addr) in [(QUEUE_DESC, desc), (QUEUE_DRIVER, avail), (QUEUE_DEVICE, used)] {
                mmio_write32(self.common + reg, addr as u32);
                mmio_write32(self.common + reg + 4, (addr >> 32) as u32);
            }
            write16(self.common + QUEUE_ENABLE, 1);
        }
        self.set_status(features_ok | S_DRIVER_OK);
        if u32::from(self.status()) & S_NEEDS_RESET != 0 {
            return Err("device needs reset after DRIVER_OK");
        }
        Ok(low)
    }

    /// Notifies queue `index` at its place in the notification area
    /// (queue_notify_off = index, checked at initialisation); a queue the
    /// device lacks gets a notification all the same.
    pub fn notify(&self, index: u32) {
        write16(
            self.notify + u64::from(index) * u64::from(self.multiplier),
            index as u16,
        );
    }

    /// Reading the ISR returns and clears the interrupt causes.
    pub fn read_isr(&self) -> u32 {
        u32::from(mmio_read8(self.isr))
    }

    /// Sets queue 0's size register (after DRIVER_OK: must be ignored).
    pub fn write_queue_size(&self, size: u16) {
        write16(self.common + QUEUE_SELECT, 0);
        write16(self.common + QUEUE_SIZE_REG, size);
    }

    /// MSI-X vector 1 to this CPU on the vector of `pin`, queue 0 on it,
    /// MSI-X enabled.
    pub fn route_queue0(&self, pin: u32) -> bool {
        let entry = self.msix_table + 16;
        mmio_write32(entry, LAPIC_MSI_ADDRESS);
        mmio_write32(entry + 4, 0);
        mmio_write32(entry + 8, u32::from(crate::idt::IRQ_BASE) + pin);
        mmio_write32(entry + 12, 0);
        write16(self.common + QUEUE_SELECT, 0);
        write16(self.common + QUEUE_MSIX_VECTOR, 1);
        if read16(self.common + QUEUE_MSIX_VECTOR) != 1 {
            return false;
        }
        let control = pci::read32(self.slot, self.msix_cap);
        pci::write32(self.slot, self.msix_cap, control | (1 << 31));
        true
    }
}
