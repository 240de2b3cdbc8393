//! Address-range dispatch of port I/O and MMIO exits to devices.
//!
//! Accesses nothing claims are logged (once per address, so a probing guest
//! cannot flood the log) and ignored; reads return all-ones, as on a bus with
//! nothing attached.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

/// A device on a bus. `offset` is relative to the start of its range.
pub(crate) trait BusDevice: Send {
    fn read(&mut self, offset: u64, data: &mut [u8]);
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// A device shared between vCPU threads.
pub(crate) type SharedDevice = Arc<Mutex<dyn BusDevice>>;

struct Range {
    base: u64,
    len: u64,
    device: SharedDevice,
}

/// Most distinct unclaimed addresses logged individually.
const MAX_LOGGED_UNCLAIMED: usize = 64;

/// A set of non-overlapping ranges.
pub(crate) struct Bus {
    name: &'static str,
    ranges: Vec<Range>,
    unclaimed_logged: Mutex<HashSet<u64>>,
}

#[derive(Debug, thiserror::Error)]
#[error("{bus} range [{base:#x}, +{len:#x}) is empty or overlaps another device")]
pub struct OverlapError {
    bus: &'static str,
    base: u64,
    len: u64,
}

impl Bus {
    pub(crate) fn new(name: &'static str) -> Self {
        Bus {
            name,
            ranges: Vec::new(),
            unclaimed_logged: Mutex::new(HashSet::new()),
        }
    }

    /// Attaches a device at `[base, base + len)`.
    pub(crate) fn insert(
        &mut self,
        base: u64,
        len: u64,
        device: SharedDevice,
    ) -> Result<(), OverlapError> {
        let end = base.checked_add(len).filter(|_| len > 0);
        let overlaps = |r: &Range| end.is_none_or(|end| base < r.base + r.len && r.base < end);
        if end.is_none() || self.ranges.iter().any(overlaps) {
            return Err(OverlapError {
                bus: self.name,
                base,
                len,
            });
        }
        let at = self.ranges.partition_point(|r| r.base < base);
        self.ranges.insert(at, Range { base, len, device });
        Ok(())
    }

    /// The device whose range holds the whole access, and the offset in it.
    fn find(&self, addr: u64, size: usize) -> Option<(&Range, u64)> {
        let at = self.ranges.partition_point(|r| r.base <= addr);
        let range = self.ranges.get(at.checked_sub(1)?)?;
        let offset = addr - range.base;
        let end = offset.checked_add(size as u64)?;
        (end <= range.len).then_some((range, offset))
    }

    /// Dispatches a read. Unclaimed reads return all-ones.
    pub(crate) fn read(&self, addr: u64, data: &mut [u8]) {
        match self.find(addr, data.len()) {
            Some((range, offset)) => lock(&range.device).read(offset, data),
            None => {
                self.log_unclaimed("read", addr, data.len());
                data.fill(0xff);
            }
        }
    }

    /// Dispatches a write. Unclaimed writes are dropped.
    pub(crate) fn write(&self, addr: u64, data: &[u8]) {
        match self.find(addr, data.len()) {
            Some((range, offset)) => lock(&range.device).write(offset, data),
            None => self.log_unclaimed("write", addr, data.len()),
        }
    }

    fn log_unclaimed(&self, what: &str, addr: u64, size: usize) {
        let mut logged = self
            .unclaimed_logged
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if logged.len() < MAX_LOGGED_UNCLAIMED && logged.insert(addr) {
            tracing::warn!(
                "{} {what} of {size} bytes at {addr:#x}: no device there, ignored",
                self.name
            );
        }
    }
}

/// Locks a device; a device that panicked earlier keeps serving (its state is
/// plain data and the guest must not be able to stop the VMM this way).
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Recorder {
        last_write: Option<(u64, Vec<u8>)>,
    }

    impl BusDevice for Recorder {
        fn read(&mut self, offset: u64, data: &mut [u8]) {
            data.fill(offset.to_le_bytes()[0]);
        }
        fn write(&mut self, offset: u64, data: &[u8]) {
            self.last_write = Some((offset, data.to_vec()));
        }
    }

    #[test]
    fn accesses_reach_the_device_with_offsets() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new("test");
        bus.insert(0x100, 0x10, dev.clone()).unwrap();
        let mut data = [0u8; 2];
        bus.read(0x104, &mut data);
        assert_eq!(data, [4, 4]);
        bus.write(0x10e, &[1, 2]);
        assert_eq!(dev.lock().unwrap().last_write, Some((0xe, vec![1, 2])));
    }

    #[test]
    fn unclaimed_and_straddling_accesses_read_all_ones() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new("test");
        bus.insert(0x100, 0x10, dev.clone()).unwrap();
        for (addr, size) in [(0xff, 1), (0x110, 4), (0x10f, 2), (u64::MAX, 8), (0, 4)] {
            let mut data = vec![0u8; size];
            bus.read(addr, &mut data);
            assert!(data.iter().all(|&b| b == 0xff), "{addr:#x}");
            bus.write(addr, &data);
        }
        assert_eq!(dev.lock().unwrap().last_write, None);
    }

    #[test]
    fn overlapping_or_empty_ranges_are_refused() {
        let dev = Arc::new(Mutex::new(Recorder::default()));
        let mut bus = Bus::new("test");
        bus.insert(0x100, 0x10, dev.clone()).unwrap();
        assert!(bus.insert(0x10f, 1, dev.clone()).is_err());
        assert!(bus.insert(0xf0, 0x11, dev.clone()).is_err());
        assert!(bus.insert(0x200, 0, dev.clone()).is_err());
        assert!(bus.insert(u64::MAX, 2, dev.clone()).is_err());
        bus.insert(0x110, 0x10, dev).unwrap();
    }
}
