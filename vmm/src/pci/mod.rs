//! PCI: a host bridge on bus 0 and the functions behind it, reached through
//! the configuration space (ECAM, described to the guest by ACPI's MCFG, and
//! the legacy 0xCF8/0xCFC ports) and through their memory BARs.
//!
//! Bus 0 only (32 devices, function 0 each): 00.0 is the host bridge, the
//! virtio devices follow. The VMM places every BAR in the 32-bit PCI window
//! (`vm-allocator`); a guest may move them and the window follows (each
//! access looks the BAR up). Interrupts are MSI-X messages routed through
//! KVM (see `msi`).

pub(crate) mod host_bridge;
pub(crate) mod msi;

use std::sync::{Arc, Mutex};

use crate::bus::{BusDevice, lock};

/// A PCI function as the bus sees it.
pub(crate) trait PciFunction: Send {
    /// Configuration space read at `offset` (0..4096).
    fn config_read(&self, offset: u64, data: &mut [u8]);
    /// Configuration space write at `offset` (0..4096).
    fn config_write(&mut self, offset: u64, data: &[u8]);
    /// The memory BAR's (address, size) while the function decodes it.
    fn bar(&self) -> Option<(u64, u64)>;
    fn bar_read(&mut self, offset: u64, data: &mut [u8]);
    fn bar_write(&mut self, offset: u64, data: &[u8]);
}

pub(crate) type SharedFunction = Arc<Mutex<dyn PciFunction>>;

/// Devices per bus.
pub(crate) const SLOTS: usize = 32;

/// Bus 0 and its functions (function 0 of each slot).
#[derive(Default)]
pub(crate) struct PciBus {
    slots: Vec<Option<SharedFunction>>,
}

impl PciBus {
    pub(crate) fn new() -> Self {
        PciBus {
            slots: vec![None; SLOTS],
        }
    }

    /// Puts `function` in the first free slot; returns the slot.
    pub(crate) fn add(&mut self, function: SharedFunction) -> Option<u8> {
        let slot = self.slots.iter().position(Option::is_none)?;
        self.slots[slot] = Some(function);
        u8::try_from(slot).ok()
    }

    fn function(&self, bus: u8, device: u8, function: u8) -> Option<&SharedFunction> {
        if bus != 0 || function != 0 {
            return None;
        }
        self.slots.get(usize::from(device))?.as_ref()
    }

    /// A configuration read; absent functions read as all-ones (how a
    /// driver learns the slot is empty).
    pub(crate) fn config_read(&self, bdf: (u8, u8, u8), offset: u64, data: &mut [u8]) {
        match self.function(bdf.0, bdf.1, bdf.2) {
            Some(f) => lock(f).config_read(offset, data),
            None => data.fill(0xff),
        }
    }

    pub(crate) fn config_write(&self, bdf: (u8, u8, u8), offset: u64, data: &[u8]) {
        if let Some(f) = self.function(bdf.0, bdf.1, bdf.2) {
            lock(f).config_write(offset, data);
        }
    }

    /// The function whose BAR holds `[addr, addr + len)`, and the offset.
    fn bar_at(&self, addr: u64, len: usize) -> Option<(&SharedFunction, u64)> {
        self.slots.iter().flatten().find_map(|f| {
            let (base, size) = lock(f).bar()?;
            let offset = addr.checked_sub(base)?;
            (offset.checked_add(len as u64)? <= size).then_some((f, offset))
        })
    }
}

/// ECAM: bus << 20 | device << 15 | function << 12 | register.
pub(crate) struct Ecam(pub Arc<PciBus>);

fn ecam_decode(offset: u64) -> ((u8, u8, u8), u64) {
    let bus = (offset >> 20).to_le_bytes()[0];
    let device = ((offset >> 15) & 0x1f) as u8;
    let function = ((offset >> 12) & 0x7) as u8;
    ((bus, device, function), offset & 0xfff)
}

impl BusDevice for Ecam {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        let (bdf, reg) = ecam_decode(offset);
        self.0.config_read(bdf, reg, data);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (bdf, reg) = ecam_decode(offset);
        self.0.config_write(bdf, reg, data);
    }
}

/// The legacy configuration mechanism: an address register at 0xCF8
/// (enable bit 31, bus, device, function, dword register) and the data
/// window at 0xCFC..0xCFF.
pub(crate) struct ConfigPorts {
    bus: Arc<PciBus>,
    address: u32,
}

impl ConfigPorts {
    pub(crate) fn new(bus: Arc<PciBus>) -> Self {
        ConfigPorts { bus, address: 0 }
    }

    fn target(&self) -> Option<((u8, u8, u8), u64)> {
        if self.address & 0x8000_0000 == 0 {
            return None;
        }
        let bdf = (
            (self.address >> 16).to_le_bytes()[0],
            ((self.address >> 11) & 0x1f) as u8,
            ((self.address >> 8) & 0x7) as u8,
        );
        // Bits 27:24 extend the register number (AMD's extended
        // configuration access, which Linux's `pci=conf1` may use).
        let reg = u64::from(self.address & 0xfc) | (u64::from((self.address >> 24) & 0xf) << 8);
        Some((bdf, reg))
    }
}

/// 0xCF8 is the start of the range; data at offsets 4..8.
pub(crate) const CONFIG_PORTS: u64 = 0xcf8;
pub(crate) const CONFIG_PORTS_LEN: u64 = 8;

impl BusDevice for ConfigPorts {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match offset {
            0 if data.len() == 4 => data.copy_from_slice(&self.address.to_le_bytes()),
            4..=7 => match self.target() {
                Some((bdf, reg)) => self.bus.config_read(bdf, reg + (offset - 4), data),
                None => data.fill(0xff),
            },
            _ => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            0 if data.len() == 4 => {
                self.address = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
            }
            4..=7 => {
                if let Some((bdf, reg)) = self.target() {
                    self.bus.config_write(bdf, reg + (offset - 4), data);
                }
            }
            _ => {}
        }
    }
}

/// The 32-bit window where BARs live: each access goes to the function
/// whose BAR holds it, wherever the guest put it.
pub(crate) struct BarWindow {
    bus: Arc<PciBus>,
    base: u64,
}

impl BarWindow {
    pub(crate) fn new(bus: Arc<PciBus>, base: u64) -> Self {
        BarWindow { bus, base }
    }
}

impl BusDevice for BarWindow {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match self.bus.bar_at(self.base + offset, data.len()) {
            Some((f, at)) => lock(f).bar_read(at, data),
            None => data.fill(0xff),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let Some((f, at)) = self.bus.bar_at(self.base + offset, data.len()) {
            lock(f).bar_write(at, data);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function with a 4 KiB BAR at a fixed place that echoes offsets.
    struct Probe {
        bar: u64,
        written: Vec<(u64, Vec<u8>)>,
    }

    impl PciFunction for Probe {
        fn config_read(&self, offset: u64, data: &mut [u8]) {
            data.fill(offset.to_le_bytes()[0]);
        }
        fn config_write(&mut self, offset: u64, data: &[u8]) {
            self.written.push((offset, data.to_vec()));
        }
        fn bar(&self) -> Option<(u64, u64)> {
            Some((self.bar, 0x1000))
        }
        fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(0x40 | offset.to_le_bytes()[0]);
        }
        fn bar_write(&mut self, offset: u64, data: &[u8]) {
            self.written.push((0x1_0000 + offset, data.to_vec()));
        }
    }

    fn bus() -> (Arc<PciBus>, Arc<Mutex<Probe>>) {
        let probe = Arc::new(Mutex::new(Probe {
            bar: 0xe100_2000,
            written: Vec::new(),
        }));
        let mut bus = PciBus::new();
        bus.add(Arc::new(Mutex::new(host_bridge::HostBridge::new())));
        assert_eq!(bus.add(probe.clone()), Some(1));
        (Arc::new(bus), probe)
    }

    #[test]
    fn ecam_and_the_legacy_ports_reach_the_same_function() {
        let (bus, probe) = bus();
        let mut ecam = Ecam(bus.clone());
        let mut data = [0u8; 4];
        ecam.read((1 << 15) | 0x10, &mut data);
        assert_eq!(data, [0x10; 4]);
        // Device 2, function 1 and bus 1 are empty: all ones.
        for offset in [2 << 15, (1 << 15) | (1 << 12), 1 << 20] {
            ecam.read(offset, &mut data);
            assert_eq!(data, [0xff; 4], "{offset:#x}");
        }
        let mut ports = ConfigPorts::new(bus);
        ports.write(0, &(0x8000_0000u32 | (1 << 11) | 0x3c).to_le_bytes());
        let mut word = [0u8; 2];
        ports.read(6, &mut word);
        assert_eq!(word, [0x3e; 2], "register 0x3c + 2");
        ports.write(5, &[0x77]);
        assert_eq!(probe.lock().unwrap().written, [(0x3d, vec![0x77])]);
        // Without the enable bit nothing is reached.
        ports.write(0, &((1u32 << 11) | 0x3c).to_le_bytes());
        ports.read(4, &mut data);
        assert_eq!(data, [0xff; 4]);
        ports.write(4, &[1, 2, 3, 4]);
        assert_eq!(probe.lock().unwrap().written.len(), 1);
    }

    #[test]
    fn the_window_finds_bars_and_ignores_the_rest() {
        let (bus, probe) = bus();
        let mut window = BarWindow::new(bus, 0xe100_0000);
        let mut data = [0u8; 4];
        window.read(0x2008, &mut data);
        assert_eq!(data, [0x48; 4]);
        window.write(0x2ffc, &[1; 4]);
        assert_eq!(probe.lock().unwrap().written, [(0x1_0ffc, vec![1; 4])]);
        // Past the BAR, straddling its end, or in no BAR.
        for offset in [0x3000, 0x2ffe, 0] {
            window.read(offset, &mut data);
            assert_eq!(data, [0xff; 4], "{offset:#x}");
        }
    }
}
