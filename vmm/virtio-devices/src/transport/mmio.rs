//! The virtio-mmio transport, version 2 ("modern") register layout.
//!
//! The guest talks to a device through a 4 KiB window of registers. This
//! module owns the protocol: the device status state machine, feature
//! negotiation, queue configuration and validation, notifications and the
//! interrupt status. Rules (virtio 1.2 §2.1, §3.1, §4.2.2):
//!
//! - Status bits are set one step at a time: ACKNOWLEDGE, DRIVER,
//!   FEATURES_OK, DRIVER_OK. Anything else is ignored and logged; FAILED may be
//!   set at any time; writing 0 resets the device.
//! - Driver features may only be written between DRIVER and FEATURES_OK, and
//!   FEATURES_OK is refused (not latched) unless the accepted features are a
//!   subset of the offered ones and include `VIRTIO_F_VERSION_1`.
//! - Queue registers may only be written between FEATURES_OK and DRIVER_OK,
//!   for an existing queue that is not yet ready (CVE-2026-5747 was a queue
//!   size changed after activation).
//! - At DRIVER_OK every queue is validated: ready, size a power of two no
//!   larger than the maximum, rings aligned and inside guest memory. If not,
//!   or if a queue later turns out to be broken, the device enters
//!   DEVICE_NEEDS_RESET and raises a configuration interrupt.
//! - Notifications are honoured only after DRIVER_OK, for existing queues.
//! - Registers are 32 bits wide and aligned; other accesses are ignored.
//!   The config space (from 0x100) accepts any width and offset.

use std::sync::Arc;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FAILED, VIRTIO_CONFIG_S_FEATURES_OK, VIRTIO_CONFIG_S_NEEDS_RESET,
    VIRTIO_F_VERSION_1,
};
use virtio_bindings::virtio_mmio::*;
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;
use vmm_sys_util::eventfd::EventFd;

use crate::device::{ActivateContext, VirtioDevice, feature_bit};
use crate::device_thread::{DeviceThread, SharedDevice, ThreadSandbox, Unsandboxed, lock_device};
use crate::interrupt::{DeviceInterrupt, InterruptTrigger};
use crate::log_limit::{GuestErrorLog, LogLimit, guest_error};
use int_cast::{high_half, low_half};

/// Size of one device's MMIO window (registers plus config space).
const MMIO_WINDOW_SIZE: u64 = 0x1000;

/// "virt" in little endian.
const MAGIC_VALUE: u32 = 0x7472_6976;
/// virtio-mmio version 2 (virtio 1.0 and later).
const MMIO_VERSION: u32 = 2;
/// We are not a registered vendor; 0 is what other VMMs report too.
const VENDOR_ID: u32 = 0;

const ACK: u32 = VIRTIO_CONFIG_S_ACKNOWLEDGE;
const DRIVER: u32 = VIRTIO_CONFIG_S_DRIVER;
const FEATURES_OK: u32 = VIRTIO_CONFIG_S_FEATURES_OK;
const DRIVER_OK: u32 = VIRTIO_CONFIG_S_DRIVER_OK;
const FAILED: u32 = VIRTIO_CONFIG_S_FAILED;
const NEEDS_RESET: u32 = VIRTIO_CONFIG_S_NEEDS_RESET;

/// Why the queues could not be handed to the device at DRIVER_OK.
#[derive(Debug, thiserror::Error)]
enum QueueSetupError {
    #[error("queue {0} is not ready")]
    NotReady(usize),
    #[error("queue {index}: size {size} is not a power of two between 1 and {max}")]
    BadSize { index: usize, size: u32, max: u16 },
    #[error("queue {index}: {what} address {addr:#x} is misaligned")]
    Misaligned {
        index: usize,
        what: &'static str,
        addr: u64,
    },
    #[error("queue {0}: descriptor table or rings are not inside guest memory")]
    OutsideMemory(usize),
    #[error("queue {0}: an available ring at address 0 is not supported")]
    AvailAtZero(usize),
}

/// What the driver wrote for one queue, validated only at DRIVER_OK.
#[derive(Debug, Clone)]
struct QueueConfig {
    max_size: u16,
    size: u32,
    ready: bool,
    desc: u64,
    avail: u64,
    used: u64,
}

impl QueueConfig {
    fn new(max_size: u16) -> Self {
        QueueConfig {
            max_size,
            size: u32::from(max_size),
            ready: false,
            desc: 0,
            avail: 0,
            used: 0,
        }
    }

    /// Builds the `virtio-queue` queue, checking everything it depends on.
    fn build(&self, index: usize, mem: &GuestMemoryMmap) -> Result<Queue, QueueSetupError> {
        if !self.ready {
            return Err(QueueSetupError::NotReady(index));
        }
        let bad_size = QueueSetupError::BadSize {
            index,
            size: self.size,
            max: self.max_size,
        };
        // `max_size` came from the device; a bad one is a bug in this crate,
        // reported like a bad guest size rather than a panic.
        let mut queue = Queue::new(self.max_size).map_err(|_| bad_size)?;
        let size = u16::try_from(self.size).map_err(|_| QueueSetupError::BadSize {
            index,
            size: self.size,
            max: self.max_size,
        })?;
        queue
            .try_set_size(size)
            .map_err(|_| QueueSetupError::BadSize {
                index,
                size: self.size,
                max: self.max_size,
            })?;
        let misaligned = |what, addr| QueueSetupError::Misaligned { index, what, addr };
        queue
            .try_set_desc_table_address(GuestAddress(self.desc))
            .map_err(|_| misaligned("descriptor table", self.desc))?;
        queue
            .try_set_avail_ring_address(GuestAddress(self.avail))
            .map_err(|_| misaligned("available ring", self.avail))?;
        queue
            .try_set_used_ring_address(GuestAddress(self.used))
            .map_err(|_| misaligned("used ring", self.used))?;
        // virtio-queue takes an available ring at 0 for "never configured"
        // and refuses to use it; say so now rather than at the first
        // notification.
        if self.avail == 0 {
            return Err(QueueSetupError::AvailAtZero(index));
        }
        queue.set_ready(true);
        // Checks the descriptor table and both rings lie wholly in memory.
        if !queue.is_valid(mem) {
            return Err(QueueSetupError::OutsideMemory(index));
        }
        Ok(queue)
    }
}

/// A queue's registers as the driver set them (for live migration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueueRegisters {
    pub size: u32,
    pub ready: bool,
    pub desc: u64,
    pub avail: u64,
    pub used: u64,
}

/// What a live migration moves of a transport and its device: the virtio registers the
/// driver wrote, the pending interrupt causes, and, once activated, each queue's next
/// available and next used index. Read while the VM is paused
/// ([`MmioTransport::save`]); the target's transport for the same device type takes it
/// before its vCPUs run ([`MmioTransport::restore`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TransportState {
    pub status: u32,
    pub device_features_sel: u32,
    pub driver_features_sel: u32,
    pub acked_features: u64,
    pub unknown_features_acked: bool,
    pub queue_sel: u32,
    pub queues: Vec<QueueRegisters>,
    pub activated: bool,
    pub interrupt_status: u32,
    /// `(next available, next used)` per queue, when activated.
    pub positions: Vec<(u16, u16)>,
}

/// One virtio device behind a virtio-mmio register window.
///
/// With [`MmioTransport::with_thread`] (what the VMM uses) the device runs
/// on its own thread ([`crate::device_thread`]); registers stay on the
/// caller's (vCPU) thread. With [`MmioTransport::new`] notifications are
/// handled on the caller's thread and nothing waits on the device's host
/// descriptors (fuzzing and benchmarks of the device code alone).
pub struct MmioTransport {
    device: SharedDevice,
    /// `None`: notifications run on the caller's thread.
    thread: Option<DeviceThread>,
    sandbox: Arc<dyn ThreadSandbox>,
    /// Fixed for the device's life; kept here so register reads need no lock.
    device_type: u32,
    device_features: u64,
    mem: GuestMemoryMmap,
    interrupt: DeviceInterrupt,
    status: u32,
    device_features_sel: u32,
    driver_features_sel: u32,
    acked_features: u64,
    /// The driver set a bit in a feature bank beyond the first 64 bits.
    unknown_features_acked: bool,
    queue_sel: u32,
    queues: Vec<QueueConfig>,
    activated: bool,
    log: GuestErrorLog,
    /// The device failing or not activating (the guest can repeat both).
    failures: LogLimit,
    /// [`MmioTransport::stop`] closed the device.
    stopped: bool,
}

impl MmioTransport {
    /// A transport that handles notifications on the caller's thread.
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<dyn InterruptTrigger>,
    ) -> Self {
        let queues = device
            .queue_max_sizes()
            .iter()
            .map(|&max| QueueConfig::new(max))
            .collect();
        MmioTransport {
            device_type: device.device_type(),
            device_features: device.features(),
            device: Arc::new(std::sync::Mutex::new(device)),
            thread: None,
            sandbox: Arc::new(Unsandboxed),
            mem,
            interrupt: DeviceInterrupt::new(interrupt),
            status: 0,
            device_features_sel: 0,
            driver_features_sel: 0,
            acked_features: 0,
            unknown_features_acked: false,
            queue_sel: 0,
            queues,
            activated: false,
            log: GuestErrorLog::default(),
            failures: LogLimit::new(),
            stopped: false,
        }
    }

    /// A transport whose device runs on its own thread (named `name`),
    /// woken by `notifiers`: one eventfd per queue, which the VMM registers
    /// as ioeventfds on the QueueNotify register with the queue index as
    /// datamatch. The thread and every thread the device starts enter
    /// `sandbox` first.
    pub fn with_thread(
        name: &str,
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        interrupt: Arc<dyn InterruptTrigger>,
        notifiers: Vec<EventFd>,
        sandbox: Arc<dyn ThreadSandbox>,
    ) -> std::io::Result<Self> {
        if notifiers.len() != device.queue_max_sizes().len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} queue eventfds for {} queues",
                    notifiers.len(),
                    device.queue_max_sizes().len()
                ),
            ));
        }
        let mut t = Self::new(device, mem, interrupt);
        t.thread = Some(DeviceThread::spawn(
            name,
            t.device.clone(),
            notifiers,
            t.interrupt.clone(),
            sandbox.clone(),
        )?);
        t.sandbox = sandbox;
        Ok(t)
    }

    /// The device behind this transport (locked while the guard lives).
    pub(crate) fn device(&self) -> DeviceRef<'_> {
        DeviceRef(lock_device(&self.device))
    }

    /// Kernel thread id of the device's thread, if it has one.
    #[cfg(test)]
    pub(crate) fn thread_id(&self) -> Option<i32> {
        self.thread.as_ref().map(DeviceThread::thread_id)
    }

    /// Returns once the device's thread has handled every notification
    /// made so far (at once without a thread). For tests.
    pub fn sync(&self) {
        if let Some(t) = &self.thread {
            t.sync();
        }
    }

    fn dev(&self) -> std::sync::MutexGuard<'_, Box<dyn VirtioDevice>> {
        lock_device(&self.device)
    }

    /// Whether the device's state can be moved by a live migration (checked before one
    /// starts); `Err` says why not.
    pub fn migratable(&self) -> Result<(), String> {
        match self.dev().queue_positions() {
            Some(_) => Ok(()),
            None => Err(format!(
                "virtio device type {} has state that cannot be migrated yet",
                self.device_type
            )),
        }
    }

    /// The transport's and its device's state, for live migration (the VM is paused:
    /// the device's thread touches nothing). `Err` names what cannot be moved.
    pub fn save(&mut self) -> Result<TransportState, String> {
        self.collect_device_reset_request();
        let positions = self.dev().queue_positions().ok_or_else(|| {
            format!(
                "virtio device type {} has state that cannot be migrated yet",
                self.device_type
            )
        })?;
        Ok(TransportState {
            status: self.status,
            device_features_sel: self.device_features_sel,
            driver_features_sel: self.driver_features_sel,
            acked_features: self.acked_features,
            unknown_features_acked: self.unknown_features_acked,
            queue_sel: self.queue_sel,
            queues: self
                .queues
                .iter()
                .map(|q| QueueRegisters {
                    size: q.size,
                    ready: q.ready,
                    desc: q.desc,
                    avail: q.avail,
                    used: q.used,
                })
                .collect(),
            activated: self.activated,
            interrupt_status: self.interrupt.status(),
            positions: if self.activated {
                positions
            } else {
                Vec::new()
            },
        })
    }

    /// Takes the state another VMM saved for the same device type, before the VM runs:
    /// registers, interrupt causes, and, if the device was activated, activates it here
    /// with its queues where the source left them. Everything is checked as it would be
    /// from a driver (sizes, ring addresses inside guest memory, features offered).
    pub fn restore(&mut self, state: &TransportState) -> Result<(), String> {
        if self.activated || self.status != 0 {
            return Err("the transport is in use".into());
        }
        if state.queues.len() != self.queues.len() {
            return Err(format!(
                "{} queues where device type {} has {}",
                state.queues.len(),
                self.device_type,
                self.queues.len()
            ));
        }
        // The status a driver could have reached, and activation exactly when it runs.
        let running = state.status & DRIVER_OK != 0 && state.status & (NEEDS_RESET | FAILED) == 0;
        if state.activated != running {
            return Err(format!(
                "status {:#x} with the device {}activated",
                state.status,
                if state.activated { "" } else { "not " }
            ));
        }
        if state.status & FEATURES_OK != 0 && state.acked_features & !self.device_features != 0 {
            return Err(format!(
                "features {:#x} that this device does not offer",
                state.acked_features & !self.device_features
            ));
        }
        if state.interrupt_status & !(VIRTIO_MMIO_INT_VRING | VIRTIO_MMIO_INT_CONFIG) != 0 {
            return Err(format!("interrupt status {:#x}", state.interrupt_status));
        }
        // Everything is checked and built before anything changes here.
        let registers: Vec<QueueConfig> = self
            .queues
            .iter()
            .zip(&state.queues)
            .map(|(q, saved)| QueueConfig {
                max_size: q.max_size,
                size: saved.size,
                ready: saved.ready,
                desc: saved.desc,
                avail: saved.avail,
                used: saved.used,
            })
            .collect();
        let queues = if state.activated {
            if state.positions.len() != self.queues.len() {
                return Err(format!(
                    "{} queue positions for {} queues",
                    state.positions.len(),
                    self.queues.len()
                ));
            }
            let mut queues = Vec::with_capacity(registers.len());
            for (i, (q, &(next_avail, next_used))) in
                registers.iter().zip(&state.positions).enumerate()
            {
                let mut queue = q.build(i, &self.mem).map_err(|e| e.to_string())?;
                queue.set_next_avail(next_avail);
                queue.set_next_used(next_used);
                queues.push(queue);
            }
            Some(queues)
        } else {
            None
        };
        if let Some(queues) = queues {
            self.acked_features = state.acked_features;
            self.activate_with(queues)
                .map_err(|e| format!("activating the device: {e}"))?;
        }
        self.status = state.status;
        self.device_features_sel = state.device_features_sel;
        self.driver_features_sel = state.driver_features_sel;
        self.acked_features = state.acked_features;
        self.unknown_features_acked = state.unknown_features_acked;
        self.queue_sel = state.queue_sel;
        self.queues = registers;
        self.interrupt.restore_status(state.interrupt_status);
        Ok(())
    }

    /// After a migration's restore, once the interrupt routes are in place: each queue
    /// of a running device is looked at once (a notification the source's device thread
    /// had taken but not served when it paused is not lost), and pending interrupt
    /// causes are sent again (one sent while the source paused may not have reached the
    /// guest; an extra one costs the driver a look at its rings).
    pub fn resume_after_restore(&mut self) {
        if !self.activated {
            return;
        }
        for index in 0..self.queues.len() {
            if let Ok(value) = u32::try_from(index) {
                self.notify(value);
            }
        }
        self.interrupt.reraise();
    }

    /// Current device status register.
    pub fn status(&mut self) -> u32 {
        self.collect_device_reset_request();
        self.status
    }

    /// Features the driver accepted (valid once FEATURES_OK is set).
    pub(crate) fn acked_features(&self) -> u64 {
        self.acked_features
    }

    /// VM pause: the device stops touching guest memory; returns once the
    /// work in progress is done.
    pub fn pause(&mut self) {
        match &self.thread {
            Some(t) => t.pause(),
            None => self.dev().pause(),
        }
    }

    /// VM resume.
    pub fn resume(&mut self) {
        match &self.thread {
            Some(t) => t.resume(),
            None => self.dev().resume(),
        }
    }

    /// The VM's end: stops the device's thread after the work in progress
    /// and closes the device ([`VirtioDevice::close`]: a disk's writes and
    /// metadata flushed, the image closed). Returns once it is closed; the
    /// device serves nothing more. Repeats do nothing.
    pub fn stop(&mut self) {
        if std::mem::replace(&mut self.stopped, true) {
            return;
        }
        match self.thread.take() {
            // The thread closes the device as it ends; the drop joins it.
            Some(thread) => drop(thread),
            None => self.dev().close(),
        }
    }

    /// A guest read of `data.len()` bytes at `offset` within the window.
    pub fn read(&mut self, offset: u64, data: &mut [u8]) {
        self.collect_device_reset_request();
        data.fill(0);
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            if !config_access_ok(offset, data.len()) {
                guest_error!(
                    self.log,
                    offset,
                    len = data.len(),
                    "virtio-mmio: bad config read"
                );
                return;
            }
            self.dev()
                .read_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        let Some(reg) = register(offset, data.len()) else {
            guest_error!(
                self.log,
                offset,
                len = data.len(),
                "virtio-mmio: register read must be 4 aligned bytes"
            );
            return;
        };
        let value = match reg {
            VIRTIO_MMIO_MAGIC_VALUE => MAGIC_VALUE,
            VIRTIO_MMIO_VERSION => MMIO_VERSION,
            VIRTIO_MMIO_DEVICE_ID => self.device_type,
            VIRTIO_MMIO_VENDOR_ID => VENDOR_ID,
            VIRTIO_MMIO_DEVICE_FEATURES => {
                let features = self.device_features;
                match self.device_features_sel {
                    0 => low_half(features),
                    1 => high_half(features),
                    _ => 0,
                }
            }
            VIRTIO_MMIO_QUEUE_NUM_MAX => self.selected_queue().map_or(0, |q| u32::from(q.max_size)),
            VIRTIO_MMIO_QUEUE_READY => self.selected_queue().map_or(0, |q| u32::from(q.ready)),
            VIRTIO_MMIO_INTERRUPT_STATUS => self.interrupt.status(),
            VIRTIO_MMIO_STATUS => self.status,
            VIRTIO_MMIO_QUEUE_DESC_LOW => self.selected_queue().map_or(0, |q| low_half(q.desc)),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => self.selected_queue().map_or(0, |q| high_half(q.desc)),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => self.selected_queue().map_or(0, |q| low_half(q.avail)),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => self.selected_queue().map_or(0, |q| high_half(q.avail)),
            VIRTIO_MMIO_QUEUE_USED_LOW => self.selected_queue().map_or(0, |q| low_half(q.used)),
            VIRTIO_MMIO_QUEUE_USED_HIGH => self.selected_queue().map_or(0, |q| high_half(q.used)),
            // No shared memory regions: a length of all ones means "absent".
            VIRTIO_MMIO_SHM_LEN_LOW
            | VIRTIO_MMIO_SHM_LEN_HIGH
            | VIRTIO_MMIO_SHM_BASE_LOW
            | VIRTIO_MMIO_SHM_BASE_HIGH => u32::MAX,
            // The config space never changes under the driver.
            VIRTIO_MMIO_CONFIG_GENERATION => 0,
            _ => {
                guest_error!(
                    self.log,
                    offset,
                    "virtio-mmio: read of a write-only or unknown register"
                );
                0
            }
        };
        data.copy_from_slice(&value.to_le_bytes());
    }

    /// A guest write of `data` at `offset` within the window.
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.collect_device_reset_request();
        if offset >= u64::from(VIRTIO_MMIO_CONFIG) {
            if !config_access_ok(offset, data.len()) {
                guest_error!(
                    self.log,
                    offset,
                    len = data.len(),
                    "virtio-mmio: bad config write"
                );
                return;
            }
            if self.status & (FAILED | NEEDS_RESET) != 0 || self.status & DRIVER == 0 {
                guest_error!(
                    self.log,
                    offset,
                    status = self.status,
                    "virtio-mmio: config write in the wrong state"
                );
                return;
            }
            self.dev()
                .write_config(offset - u64::from(VIRTIO_MMIO_CONFIG), data);
            return;
        }
        let Some(reg) = register(offset, data.len()) else {
            guest_error!(
                self.log,
                offset,
                len = data.len(),
                "virtio-mmio: register write must be 4 aligned bytes"
            );
            return;
        };
        let mut bytes = [0u8; 4];
        bytes.copy_from_slice(data);
        let value = u32::from_le_bytes(bytes);
        match reg {
            VIRTIO_MMIO_DEVICE_FEATURES_SEL => self.device_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES_SEL => self.driver_features_sel = value,
            VIRTIO_MMIO_DRIVER_FEATURES => self.write_driver_features(value),
            VIRTIO_MMIO_QUEUE_SEL => self.queue_sel = value,
            VIRTIO_MMIO_QUEUE_NUM
            | VIRTIO_MMIO_QUEUE_READY
            | VIRTIO_MMIO_QUEUE_DESC_LOW
            | VIRTIO_MMIO_QUEUE_DESC_HIGH
            | VIRTIO_MMIO_QUEUE_AVAIL_LOW
            | VIRTIO_MMIO_QUEUE_AVAIL_HIGH
            | VIRTIO_MMIO_QUEUE_USED_LOW
            | VIRTIO_MMIO_QUEUE_USED_HIGH => self.write_queue_register(reg, value),
            VIRTIO_MMIO_QUEUE_NOTIFY => self.notify(value),
            VIRTIO_MMIO_INTERRUPT_ACK => self.interrupt.acknowledge(value),
            VIRTIO_MMIO_STATUS => self.write_status(value),
            VIRTIO_MMIO_SHM_SEL => {}
            _ => {
                guest_error!(
                    self.log,
                    offset,
                    value,
                    "virtio-mmio: write to a read-only, legacy or unknown register"
                );
            }
        }
    }

    /// A device thread asked for a reset (see
    /// [`DeviceInterrupt::signal_needs_reset`]): stop the device and latch
    /// `DEVICE_NEEDS_RESET` (the interrupt was already raised).
    fn collect_device_reset_request(&mut self) {
        if self.interrupt.needs_reset() && self.status & NEEDS_RESET == 0 {
            if self.activated {
                self.dev().reset();
                self.activated = false;
            }
            self.status |= NEEDS_RESET;
        }
    }

    fn selected_queue(&self) -> Option<&QueueConfig> {
        self.queues.get(usize::try_from(self.queue_sel).ok()?)
    }

    fn write_driver_features(&mut self, value: u32) {
        if self.status & !NEEDS_RESET != ACK | DRIVER {
            guest_error!(
                self.log,
                status = self.status,
                "virtio-mmio: driver features written outside the DRIVER state"
            );
            return;
        }
        match self.driver_features_sel {
            0 => self.acked_features = (self.acked_features & !0xffff_ffff) | u64::from(value),
            1 => {
                self.acked_features = (self.acked_features & 0xffff_ffff) | (u64::from(value) << 32)
            }
            sel if value != 0 => {
                guest_error!(
                    self.log,
                    sel,
                    value,
                    "virtio-mmio: driver accepted features in a bank the device does not have"
                );
                // Remembered so that FEATURES_OK is refused.
                self.unknown_features_acked = true;
            }
            _ => {}
        }
    }
}

impl MmioTransport {
    fn write_queue_register(&mut self, reg: u32, value: u32) {
        let configuring = self.status & !NEEDS_RESET == ACK | DRIVER | FEATURES_OK
            && self.status & NEEDS_RESET == 0;
        if !configuring {
            guest_error!(
                self.log,
                reg,
                value,
                status = self.status,
                "virtio-mmio: queue register written outside FEATURES_OK..DRIVER_OK"
            );
            return;
        }
        let sel = self.queue_sel;
        let Some(queue) = usize::try_from(sel)
            .ok()
            .and_then(|i| self.queues.get_mut(i))
        else {
            guest_error!(
                self.log,
                queue = sel,
                reg,
                "virtio-mmio: queue register written for a queue the device does not have"
            );
            return;
        };
        if queue.ready && !(reg == VIRTIO_MMIO_QUEUE_READY && value == 0) {
            guest_error!(
                self.log,
                queue = sel,
                reg,
                "virtio-mmio: queue register written while the queue is ready"
            );
            return;
        }
        let set_low = |v: &mut u64| *v = (*v & !0xffff_ffff) | u64::from(value);
        let set_high = |v: &mut u64| *v = (*v & 0xffff_ffff) | (u64::from(value) << 32);
        match reg {
            // Checked at DRIVER_OK, where a bad size stops activation.
            VIRTIO_MMIO_QUEUE_NUM => queue.size = value,
            VIRTIO_MMIO_QUEUE_READY => queue.ready = value == 1,
            VIRTIO_MMIO_QUEUE_DESC_LOW => set_low(&mut queue.desc),
            VIRTIO_MMIO_QUEUE_DESC_HIGH => set_high(&mut queue.desc),
            VIRTIO_MMIO_QUEUE_AVAIL_LOW => set_low(&mut queue.avail),
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH => set_high(&mut queue.avail),
            VIRTIO_MMIO_QUEUE_USED_LOW => set_low(&mut queue.used),
            VIRTIO_MMIO_QUEUE_USED_HIGH => set_high(&mut queue.used),
            _ => {}
        }
    }

    fn notify(&mut self, value: u32) {
        if self.status & DRIVER_OK == 0
            || self.status & (NEEDS_RESET | FAILED) != 0
            || !self.activated
        {
            guest_error!(
                self.log,
                queue = value,
                status = self.status,
                "virtio-mmio: queue notification before DRIVER_OK or after an error"
            );
            return;
        }
        // Without VIRTIO_F_NOTIFICATION_DATA the value is the queue index.
        let index = match u16::try_from(value) {
            Ok(i) if usize::from(i) < self.queues.len() => i,
            _ => {
                guest_error!(
                    self.log,
                    queue = value,
                    "virtio-mmio: notification for a queue the device does not have"
                );
                return;
            }
        };
        if let Some(t) = &self.thread {
            // A notification KVM did not turn into an eventfd signal.
            t.notify(index);
            return;
        }
        let result = self.dev().process_queue(index);
        if let Err(e) = result {
            if let Some(suppressed) = self.failures.admit() {
                tracing::warn!(
                    suppressed,
                    "virtio-mmio: device {} failed: {e}",
                    self.device_type
                );
            }
            self.enter_needs_reset();
        }
    }

    fn write_status(&mut self, value: u32) {
        if value == 0 {
            self.reset();
            return;
        }
        if value & FAILED != 0 {
            // The driver gave up on the device; it will reset it or leave it.
            if self.activated {
                self.dev().reset();
                self.activated = false;
            }
            self.status |= FAILED;
            return;
        }
        if self.status & (NEEDS_RESET | FAILED) != 0 {
            guest_error!(
                self.log,
                value,
                status = self.status,
                "virtio-mmio: status written before the required reset"
            );
            return;
        }
        let old = self.status;
        match (old, value) {
            (0, ACK) => self.status = value,
            (ACK, v) if v == ACK | DRIVER => self.status = value,
            (o, v) if o == ACK | DRIVER && v == o | FEATURES_OK => {
                if self.features_acceptable() {
                    self.status = value;
                } else {
                    guest_error!(
                        self.log,
                        acked = self.acked_features,
                        offered = self.device_features,
                        "virtio-mmio: features refused; FEATURES_OK not set"
                    );
                }
            }
            (o, v) if o == ACK | DRIVER | FEATURES_OK && v == o | DRIVER_OK => self.activate(),
            (o, v) if o == v => {}
            _ => {
                guest_error!(
                    self.log,
                    old,
                    new = value,
                    "virtio-mmio: invalid device status transition ignored"
                );
            }
        }
    }

    fn features_acceptable(&self) -> bool {
        let offered = self.device_features;
        !self.unknown_features_acked
            && self.acked_features & !offered == 0
            && self.acked_features & feature_bit(VIRTIO_F_VERSION_1) != 0
    }

    fn activate(&mut self) {
        let queues: Result<Vec<Queue>, QueueSetupError> = self
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| q.build(i, &self.mem))
            .collect();
        let queues = match queues {
            Ok(q) => q,
            Err(e) => {
                guest_error!(
                    self.log,
                    "virtio-mmio: cannot activate device {}: {e}",
                    self.device_type
                );
                self.status |= DRIVER_OK;
                self.enter_needs_reset();
                return;
            }
        };
        self.status |= DRIVER_OK;
        match self.activate_with(queues) {
            Ok(()) => {}
            Err(e) => {
                if let Some(suppressed) = self.failures.admit() {
                    tracing::warn!(
                        suppressed,
                        "virtio-mmio: device {} failed to activate: {e}",
                        self.device_type
                    );
                }
                self.enter_needs_reset();
            }
        }
    }

    /// The device cannot go on: stop it and tell the driver.
    fn enter_needs_reset(&mut self) {
        if self.activated {
            self.dev().reset();
            self.activated = false;
        }
        self.status |= NEEDS_RESET;
        self.interrupt.signal_config_change();
    }

    /// Hands the device its validated queues and the rest of what it runs with.
    fn activate_with(&mut self, queues: Vec<Queue>) -> Result<(), crate::ActivateError> {
        let ctx = ActivateContext {
            mem: self.mem.clone(),
            queues,
            interrupt: self.interrupt.clone(),
            acked_features: self.acked_features,
            sandbox: self.sandbox.clone(),
        };
        self.dev().activate(ctx)?;
        self.activated = true;
        if let Some(t) = &self.thread {
            t.activated();
        }
        Ok(())
    }

    fn reset(&mut self) {
        // The device is reset even when not activated: a device may hold
        // state from before (for example a broken activation).
        self.dev().reset();
        self.activated = false;
        self.status = 0;
        self.device_features_sel = 0;
        self.driver_features_sel = 0;
        self.acked_features = 0;
        self.unknown_features_acked = false;
        self.queue_sel = 0;
        for q in &mut self.queues {
            *q = QueueConfig::new(q.max_size);
        }
        self.interrupt.clear();
    }
}

/// The device behind a transport, locked (its thread waits meanwhile).
pub(crate) struct DeviceRef<'a>(std::sync::MutexGuard<'a, Box<dyn VirtioDevice>>);

impl std::ops::Deref for DeviceRef<'_> {
    type Target = dyn VirtioDevice;

    fn deref(&self) -> &Self::Target {
        self.0.as_ref()
    }
}

/// The register at `offset` if the access is a whole aligned 32-bit one.
fn register(offset: u64, len: usize) -> Option<u32> {
    if len != 4 || !offset.is_multiple_of(4) {
        return None;
    }
    u32::try_from(offset).ok()
}

/// Config space accesses: 1, 2, 4 or 8 bytes, wholly inside the window.
fn config_access_ok(offset: u64, len: usize) -> bool {
    matches!(len, 1 | 2 | 4 | 8)
        && offset
            .checked_add(int_cast::usize_to_u64(len))
            .is_some_and(|end| end <= MMIO_WINDOW_SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{ActivateError, DeviceError};
    use crate::queue::QueueError;
    use crate::testing::{GuestDriver, MEM_SIZE, MmioDriver, test_memory};
    use std::sync::Mutex;

    /// What the transport did to the device.
    #[derive(Default)]
    struct Record {
        activations: usize,
        resets: usize,
        notified: Vec<u16>,
        config_writes: Vec<(u64, Vec<u8>)>,
        fail_next_notify: bool,
        interrupt: Option<DeviceInterrupt>,
    }

    struct DummyDevice {
        record: Arc<Mutex<Record>>,
    }

    const DUMMY_FEATURES: u64 = feature_bit(VIRTIO_F_VERSION_1) | 1;

    impl VirtioDevice for DummyDevice {
        fn device_type(&self) -> u32 {
            42
        }
        fn queue_max_sizes(&self) -> &[u16] {
            &[16, 16]
        }
        fn features(&self) -> u64 {
            DUMMY_FEATURES
        }
        fn read_config(&self, offset: u64, data: &mut [u8]) {
            crate::device::read_config_bytes(&[0xa0, 0xa1, 0xa2, 0xa3], offset, data);
        }
        fn write_config(&mut self, offset: u64, data: &[u8]) {
            self.record
                .lock()
                .unwrap()
                .config_writes
                .push((offset, data.to_vec()));
        }
        fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
            assert_eq!(ctx.queues.len(), 2);
            let mut r = self.record.lock().unwrap();
            r.activations += 1;
            r.interrupt = Some(ctx.interrupt);
            Ok(())
        }
        fn reset(&mut self) {
            self.record.lock().unwrap().resets += 1;
        }
        fn process_queue(&mut self, index: u16) -> Result<(), DeviceError> {
            let mut r = self.record.lock().unwrap();
            r.notified.push(index);
            if r.fail_next_notify {
                return Err(DeviceError::Queue {
                    index,
                    source: QueueError::HeadOutOfRange { head: 99, size: 16 },
                });
            }
            Ok(())
        }
    }

    fn setup(mem: &GuestMemoryMmap) -> (MmioDriver, Arc<Mutex<Record>>) {
        let record = Arc::new(Mutex::new(Record::default()));
        let dev = DummyDevice {
            record: record.clone(),
        };
        (MmioDriver::new(Box::new(dev), mem), record)
    }

    fn two_queues(mem: &GuestMemoryMmap) -> (GuestDriver<'_>, GuestDriver<'_>) {
        (
            GuestDriver::at(mem, 16, 0x1000),
            GuestDriver::at(mem, 16, 0x8000),
        )
    }

    const V1: u64 = feature_bit(VIRTIO_F_VERSION_1);

    #[test]
    fn identity_registers() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        assert_eq!(d.read32(VIRTIO_MMIO_MAGIC_VALUE), 0x7472_6976);
        assert_eq!(d.read32(VIRTIO_MMIO_VERSION), 2);
        assert_eq!(d.read32(VIRTIO_MMIO_DEVICE_ID), 42);
        assert_eq!(d.read32(VIRTIO_MMIO_VENDOR_ID), 0);
        assert_eq!(d.device_features(), DUMMY_FEATURES);
        d.write32(VIRTIO_MMIO_DEVICE_FEATURES_SEL, 7);
        assert_eq!(d.read32(VIRTIO_MMIO_DEVICE_FEATURES), 0);
        d.write32(VIRTIO_MMIO_QUEUE_SEL, 1);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_NUM_MAX), 16);
        d.write32(VIRTIO_MMIO_QUEUE_SEL, 2);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
        assert_eq!(d.read32(VIRTIO_MMIO_SHM_LEN_LOW), u32::MAX);
    }

    #[test]
    fn bring_up_activates_and_notifications_reach_the_device() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, q1) = two_queues(&mem);
        d.bring_up(1, &[&q0, &q1]);
        assert_eq!(rec.lock().unwrap().activations, 1);
        assert_eq!(d.transport.acked_features(), V1 | 1);
        d.notify(1);
        d.notify(0);
        assert_eq!(rec.lock().unwrap().notified, vec![1, 0]);
    }

    #[test]
    fn notification_before_driver_ok_is_ignored() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        d.notify(0);
        assert!(d.negotiate(V1));
        let (q0, q1) = two_queues(&mem);
        d.setup_queue(0, &q0);
        d.setup_queue(1, &q1);
        d.notify(0);
        assert!(rec.lock().unwrap().notified.is_empty());
        assert_eq!(rec.lock().unwrap().activations, 0);
    }

    #[test]
    fn notification_for_a_missing_or_negative_queue_is_ignored() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, q1) = two_queues(&mem);
        d.bring_up(0, &[&q0, &q1]);
        for bad in [2, 0xffff, 0x1_0000, u32::MAX, i32::MIN.cast_unsigned()] {
            d.notify(bad);
        }
        assert!(rec.lock().unwrap().notified.is_empty());
        assert_eq!(d.status() & NEEDS_RESET, 0);
    }

    #[test]
    fn features_not_offered_or_without_version_1_are_refused() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        assert!(!d.negotiate(V1 | 1 << 5), "bit 5 is not offered");
        assert!(!d.negotiate(1), "legacy drivers are not supported");
        // A bit in bank 2 (features 64..95), which no device has.
        d.set_status(0);
        d.set_status(ACK);
        d.set_status(ACK | DRIVER);
        d.write_driver_features(V1);
        d.write32(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 2);
        d.write32(VIRTIO_MMIO_DRIVER_FEATURES, 1);
        d.set_status(ACK | DRIVER | FEATURES_OK);
        assert_eq!(d.status(), ACK | DRIVER);
        assert!(d.negotiate(V1), "a reset clears the refusal");
    }

    #[test]
    fn feature_writes_after_features_ok_are_ignored() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        assert!(d.negotiate(V1));
        d.write_driver_features(V1 | 1);
        assert_eq!(d.transport.acked_features(), V1);
        // Before DRIVER too.
        d.set_status(0);
        d.set_status(ACK);
        d.write_driver_features(V1 | 1);
        assert_eq!(d.transport.acked_features(), 0);
    }

    fn activation_with_queue0(size: u32, desc: u64, avail: u64, used: u64) -> (u32, usize, usize) {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (_, q1) = two_queues(&mem);
        assert!(d.negotiate(V1));
        d.setup_queue_raw(0, size, desc, avail, used);
        d.setup_queue(1, &q1);
        d.driver_ok();
        let activations = rec.lock().unwrap().activations;
        (d.status(), activations, d.interrupts())
    }

    #[test]
    fn bad_queue_sizes_stop_activation_with_needs_reset() {
        for size in [0, 3, 12, 32, 0x1_0000 + 16] {
            let (status, activations, irqs) = activation_with_queue0(size, 0x1000, 0x2000, 0x3000);
            assert_ne!(status & NEEDS_RESET, 0, "size {size}");
            assert_eq!(activations, 0, "size {size}");
            assert_eq!(
                irqs, 1,
                "a config interrupt announces NEEDS_RESET (size {size})"
            );
        }
        let (status, activations, _) = activation_with_queue0(8, 0x1000, 0x2000, 0x3000);
        assert_eq!(
            (status & NEEDS_RESET, activations),
            (0, 1),
            "size 8 is fine"
        );
    }

    #[test]
    fn rings_outside_memory_or_misaligned_stop_activation() {
        let cases = [
            (MEM_SIZE, 0x2000, 0x3000),
            (MEM_SIZE - 16, 0x2000, 0x3000), // table straddles the end
            (0x1000, MEM_SIZE + 0x1000, 0x3000),
            (0x1000, 0x2000, MEM_SIZE - 4),
            (0x1000, 0x2000, u64::MAX - 3),
            (!0xf, 0x2000, 0x3000),
            (0x1008, 0x2000, 0x3000), // table not 16-aligned
            (0x1000, 0x2001, 0x3000), // avail not 2-aligned
            (0x1000, 0x2000, 0x3002), // used not 4-aligned
            (0x1000, 0, 0x3000),      // avail at 0: virtio-queue's "unset"
        ];
        for (desc, avail, used) in cases {
            let (status, activations, _) = activation_with_queue0(16, desc, avail, used);
            assert_ne!(status & NEEDS_RESET, 0, "{desc:#x} {avail:#x} {used:#x}");
            assert_eq!(activations, 0);
        }
    }

    #[test]
    fn a_queue_not_ready_stops_activation() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, _) = two_queues(&mem);
        assert!(d.negotiate(V1));
        d.setup_queue(0, &q0);
        d.driver_ok();
        assert_ne!(d.status() & NEEDS_RESET, 0);
        assert_eq!(rec.lock().unwrap().activations, 0);
    }

    #[test]
    fn queue_registers_written_after_driver_ok_are_ignored() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, q1) = two_queues(&mem);
        d.bring_up(0, &[&q0, &q1]);
        d.write32(VIRTIO_MMIO_QUEUE_SEL, 0);
        for reg in [
            VIRTIO_MMIO_QUEUE_NUM,
            VIRTIO_MMIO_QUEUE_READY,
            VIRTIO_MMIO_QUEUE_DESC_LOW,
            VIRTIO_MMIO_QUEUE_DESC_HIGH,
            VIRTIO_MMIO_QUEUE_AVAIL_LOW,
            VIRTIO_MMIO_QUEUE_AVAIL_HIGH,
            VIRTIO_MMIO_QUEUE_USED_LOW,
            VIRTIO_MMIO_QUEUE_USED_HIGH,
        ] {
            d.write32(reg, 0xdead_0000);
            d.write32(reg, 0);
        }
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_READY), 1);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_DESC_LOW), 0x1000);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_USED_HIGH), 0);
        assert_eq!(d.status(), ACK | DRIVER | FEATURES_OK | DRIVER_OK);
        d.notify(0);
        assert_eq!(rec.lock().unwrap().notified, vec![0]);
    }

    #[test]
    fn queue_registers_before_features_ok_or_while_ready_are_ignored() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        d.set_status(ACK);
        d.set_status(ACK | DRIVER);
        d.write32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x5000);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_DESC_LOW), 0);
        let q0 = GuestDriver::at(&mem, 16, 0x1000);
        d.write_driver_features(V1);
        d.set_status(ACK | DRIVER | FEATURES_OK);
        d.setup_queue(0, &q0);
        d.write32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x5000);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_DESC_LOW), 0x1000);
        // Un-readying the queue allows changes again.
        d.write32(VIRTIO_MMIO_QUEUE_READY, 0);
        d.write32(VIRTIO_MMIO_QUEUE_DESC_LOW, 0x5000);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_DESC_LOW), 0x5000);
        // A queue the device does not have.
        d.write32(VIRTIO_MMIO_QUEUE_SEL, 9);
        d.write32(VIRTIO_MMIO_QUEUE_NUM, 4);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_NUM_MAX), 0);
    }

    #[test]
    fn status_steps_cannot_be_skipped_or_cleared() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        d.set_status(DRIVER_OK);
        assert_eq!(d.status(), 0);
        d.set_status(ACK | DRIVER | FEATURES_OK | DRIVER_OK);
        assert_eq!(d.status(), 0);
        d.set_status(ACK);
        d.set_status(ACK | FEATURES_OK);
        assert_eq!(d.status(), ACK);
        d.set_status(ACK | DRIVER);
        d.set_status(ACK);
        assert_eq!(d.status(), ACK | DRIVER, "bits cannot be cleared");
        d.set_status(ACK | DRIVER | DRIVER_OK);
        assert_eq!(d.status(), ACK | DRIVER, "FEATURES_OK cannot be skipped");
        d.set_status(ACK | DRIVER | NEEDS_RESET);
        assert_eq!(
            d.status(),
            ACK | DRIVER,
            "NEEDS_RESET belongs to the device"
        );
        assert_eq!(rec.lock().unwrap().activations, 0);
    }

    #[test]
    fn reset_returns_everything_to_the_initial_state() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, q1) = two_queues(&mem);
        d.bring_up(1, &[&q0, &q1]);
        let resets = rec.lock().unwrap().resets;
        d.set_status(0);
        assert_eq!(d.status(), 0);
        assert_eq!(rec.lock().unwrap().resets, resets + 1);
        assert_eq!(d.transport.acked_features(), 0);
        d.write32(VIRTIO_MMIO_QUEUE_SEL, 0);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_READY), 0);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_DESC_LOW), 0);
        d.notify(0);
        assert!(rec.lock().unwrap().notified.is_empty());
        d.bring_up(0, &[&q0, &q1]);
        assert_eq!(rec.lock().unwrap().activations, 2);
    }

    #[test]
    fn a_device_error_sets_needs_reset_until_the_driver_resets() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, q1) = two_queues(&mem);
        d.bring_up(0, &[&q0, &q1]);
        rec.lock().unwrap().fail_next_notify = true;
        let resets = rec.lock().unwrap().resets;
        d.notify(0);
        assert_ne!(d.status() & NEEDS_RESET, 0);
        assert_eq!(
            rec.lock().unwrap().resets,
            resets + 1,
            "the device is stopped"
        );
        assert_eq!(
            d.read32(VIRTIO_MMIO_INTERRUPT_STATUS),
            VIRTIO_MMIO_INT_CONFIG
        );
        assert_eq!(d.interrupts(), 1);
        rec.lock().unwrap().fail_next_notify = false;
        d.notify(0);
        assert_eq!(
            rec.lock().unwrap().notified.len(),
            1,
            "no processing while broken"
        );
        let s = d.status();
        d.set_status(s | FAILED);
        assert_ne!(d.status() & FAILED, 0);
        d.set_status(0);
        assert_eq!(d.status(), 0);
        d.bring_up(0, &[&q0, &q1]);
        d.notify(0);
        assert_eq!(rec.lock().unwrap().notified.len(), 2);
    }

    #[test]
    fn a_device_thread_can_request_a_reset() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let (q0, q1) = two_queues(&mem);
        d.bring_up(0, &[&q0, &q1]);
        let irq = rec.lock().unwrap().interrupt.clone().unwrap();
        let resets = rec.lock().unwrap().resets;
        irq.signal_needs_reset();
        assert_eq!(d.interrupts(), 1);
        assert_ne!(d.status() & NEEDS_RESET, 0);
        assert_eq!(
            rec.lock().unwrap().resets,
            resets + 1,
            "the device is stopped"
        );
        d.notify(0);
        assert!(rec.lock().unwrap().notified.is_empty());
        d.set_status(0);
        assert_eq!(d.status(), 0);
        d.bring_up(0, &[&q0, &q1]);
        d.notify(0);
        assert_eq!(rec.lock().unwrap().notified, vec![0]);
    }

    #[test]
    fn interrupt_ack_clears_only_the_acknowledged_bits() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        d.transport.interrupt.signal_used_queue();
        d.transport.interrupt.signal_config_change();
        assert_eq!(d.read32(VIRTIO_MMIO_INTERRUPT_STATUS), 3);
        d.write32(VIRTIO_MMIO_INTERRUPT_ACK, VIRTIO_MMIO_INT_VRING);
        assert_eq!(
            d.read32(VIRTIO_MMIO_INTERRUPT_STATUS),
            VIRTIO_MMIO_INT_CONFIG
        );
    }

    #[test]
    fn odd_register_accesses_are_ignored() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        let mut two = [0xffu8; 2];
        d.transport
            .read(u64::from(VIRTIO_MMIO_MAGIC_VALUE), &mut two);
        assert_eq!(two, [0, 0]);
        let mut four = [0xffu8; 4];
        d.transport.read(1, &mut four);
        assert_eq!(four, [0; 4]);
        d.transport.write(u64::from(VIRTIO_MMIO_STATUS), &[1]);
        d.transport
            .write(u64::from(VIRTIO_MMIO_STATUS) + 1, &[1, 0, 0, 0]);
        assert_eq!(d.status(), 0);
        d.transport.write(u64::from(VIRTIO_MMIO_STATUS), &[]);
        d.transport.read(u64::from(VIRTIO_MMIO_STATUS), &mut []);
        // Legacy registers of version 1 do nothing.
        d.write32(VIRTIO_MMIO_QUEUE_PFN, 5);
        assert_eq!(d.read32(VIRTIO_MMIO_QUEUE_PFN), 0);
    }

    #[test]
    fn config_space_accesses_are_bounded() {
        let mem = test_memory();
        let (mut d, rec) = setup(&mem);
        let mut b = [0u8; 4];
        d.read_config(0, &mut b);
        assert_eq!(b, [0xa0, 0xa1, 0xa2, 0xa3]);
        let mut b8 = [0xffu8; 8];
        d.read_config(2, &mut b8);
        assert_eq!(b8, [0xa2, 0xa3, 0, 0, 0, 0, 0, 0]);
        // Past the window, odd sizes and huge offsets: zeroes, no panic.
        d.transport.read(0xffc, &mut b8);
        assert_eq!(b8, [0; 8]);
        d.transport.read(u64::MAX - 2, &mut b);
        assert_eq!(b, [0; 4]);
        let mut b3 = [0xffu8; 3];
        d.read_config(0, &mut b3);
        assert_eq!(b3, [0; 3]);
        // Config writes before DRIVER are refused; after, they reach the device.
        d.transport.write(0x100, &[1]);
        d.transport.write(u64::MAX, &[1]);
        assert!(rec.lock().unwrap().config_writes.is_empty());
        d.set_status(ACK);
        d.set_status(ACK | DRIVER);
        d.transport.write(0x104, &[1, 2]);
        d.transport.write(0xfff, &[1, 2]);
        assert_eq!(rec.lock().unwrap().config_writes, vec![(4, vec![1, 2])]);
    }

    /// Deterministic random register traffic: whatever the guest writes, the
    /// transport must not panic. Same entry points as the fuzz target.
    #[test]
    fn random_register_traffic_never_panics() {
        let mem = test_memory();
        let (mut d, _) = setup(&mem);
        let mut rng = crate::testing::XorShift::new(0x5eed);
        for _ in 0..200_000 {
            let r = rng.next();
            // Mostly registers, sometimes config or odd offsets.
            let offset = match r % 8 {
                0 => rng.next() % 0x1010,
                1 => 0x100 + rng.next() % 0x20,
                _ => (rng.next() % 0x40) * 4,
            };
            let len = [4usize, 4, 4, 1, 2, 8, 3, 0][(rng.next() % 8) as usize];
            let value = match rng.next() % 4 {
                0 => rng.next(),
                1 => rng.next() % 16,
                2 => [0, 1, 3, 7, 11, 15, 0x1000, 0x2000][(rng.next() % 8) as usize],
                _ => u64::MAX,
            };
            let bytes = value.to_le_bytes();
            if r & 0x100 == 0 {
                d.transport.write(offset, &bytes[..len]);
            } else {
                let mut buf = [0u8; 8];
                d.transport.read(offset, &mut buf[..len]);
            }
        }
    }

    #[test]
    fn a_device_without_queue_positions_cannot_migrate() {
        let mem = test_memory();
        let (mut d, _record) = setup(&mem);
        let why = d.transport.migratable().unwrap_err();
        assert!(why.contains("device type 42"), "{why}");
        assert_eq!(d.transport.save().unwrap_err(), why);
    }
}
