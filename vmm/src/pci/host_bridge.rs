//! The host bridge at 00.0: identification only (no BARs, nothing
//! writable). Guests expect a bridge there before they trust bus 0.

use super::PciFunction;

/// Red Hat's PCIe host bridge IDs (what QEMU's q35 `gpex` shows guests).
const VENDOR: u16 = 0x1b36;
const DEVICE: u16 = 0x0008;
/// Class 06 (bridge), subclass 00 (host bridge).
const CLASS: u8 = 0x06;

pub(crate) struct HostBridge {
    config: [u8; 64],
}

impl HostBridge {
    pub(crate) fn new() -> Self {
        let mut config = [0u8; 64];
        config[0..2].copy_from_slice(&VENDOR.to_le_bytes());
        config[2..4].copy_from_slice(&DEVICE.to_le_bytes());
        config[0x0b] = CLASS;
        HostBridge { config }
    }
}

impl Default for HostBridge {
    fn default() -> Self {
        Self::new()
    }
}

impl PciFunction for HostBridge {
    fn config_read(&self, offset: u64, data: &mut [u8]) {
        for (i, b) in data.iter_mut().enumerate() {
            *b = usize::try_from(offset)
                .ok()
                .and_then(|o| self.config.get(o.checked_add(i)?))
                .copied()
                .unwrap_or(0);
        }
    }

    fn config_write(&mut self, _offset: u64, _data: &[u8]) {}

    fn bar(&self) -> Option<(u64, u64)> {
        None
    }

    fn bar_read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0xff);
    }

    fn bar_write(&mut self, _offset: u64, _data: &[u8]) {}
}
