//! The virtio-pci transport, modern (virtio 1.x) layout only (virtio 1.2
//! §4.1): one PCI function per device, its registers in one 64-bit memory
//! BAR placed by the VMM, described by vendor capabilities, interrupts by
//! MSI-X.
//!
//! The virtio protocol itself (status steps, feature negotiation, queue
//! configuration, the CVE rules of [`super::mmio`]) is not written twice:
//! every access to the common configuration, the ISR, the device
//! configuration and the notification area is translated to the matching
//! virtio-mmio register of an inner [`MmioTransport`], which enforces it.
//! What only PCI has lives here: the configuration space (IDs, command,
//! BAR sizing and relocation, capability list), the queue size read-back,
//! the MSI-X table, pending bits and vector assignment.
//!
//! BAR 0 (32 KiB): common configuration at 0x0000, ISR at 0x1000, device
//! configuration at 0x2000, notifications at 0x3000 (4 bytes per queue),
//! MSI-X table at 0x4000 (one vector per queue plus one for configuration
//! changes), pending bits at 0x6000. No legacy I/O BAR and no INTx: a
//! driver must enable MSI-X to get interrupts (Linux does; a polling
//! driver reads the ISR).
//!
//! With [`PciTransport::with_thread`] (what the VMM uses) the device runs on
//! its own thread, as behind virtio-mmio: the VMM registers one ioeventfd
//! per queue on the queue's notify address ([`notify_offset`]), and a
//! notification that still exits (no ioeventfd there) is forwarded to the
//! thread by the inner transport.
//!
//! The VMM supplies the message side ([`MsiInterrupts`]: KVM GSI routes and
//! irqfds) and places the BAR; the guest may move it (the transport follows
//! what is written to BAR 0/1, and decodes it only while memory space is
//! enabled in the command register).

use int_cast::usize_to_u64;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_mmio::*;
use vmm_sys_util::eventfd::EventFd;

use super::mmio::MmioTransport;
use crate::device::VirtioDevice;
use crate::device_thread::ThreadSandbox;
use crate::interrupt::InterruptTrigger;
use crate::log_limit::{GuestErrorLog, guest_error};

/// The PCI vendor ID virtio devices use (Red Hat, Inc., donated to OASIS).
pub(crate) const VIRTIO_PCI_VENDOR: u16 = 0x1af4;
/// Modern device IDs are 0x1040 + the virtio device type.
const MODERN_DEVICE_BASE: u16 = 0x1040;
/// Size of the configuration space the transport defines (the rest of the
/// 4 KiB ECAM window reads as zero: no extended capabilities).
const CONFIG_SIZE: usize = 256;
/// Size of BAR 0.
pub const BAR_SIZE: u64 = 0x8000;

const COMMON_OFFSET: u64 = 0x0000;
const COMMON_SIZE: u64 = 0x38;
const ISR_OFFSET: u64 = 0x1000;
const ISR_SIZE: u64 = 4;
const DEVICE_OFFSET: u64 = 0x2000;
const DEVICE_SIZE: u64 = 0x1000;
const NOTIFY_OFFSET: u64 = 0x3000;
const NOTIFY_SIZE: u64 = 0x1000;
const NOTIFY_MULTIPLIER: u32 = 4;
const MSIX_TABLE_OFFSET: u64 = 0x4000;
const MSIX_PBA_OFFSET: u64 = 0x6000;
const MSIX_ENTRY_SIZE: u64 = 16;

/// Where queue `queue`'s notifications go, as an offset in BAR 0: each
/// queue has its own 4-byte slot (`queue_notify_off` is the queue index),
/// so the address alone says which queue, whatever value is written.
pub const fn notify_offset(queue: u16) -> u64 {
    NOTIFY_OFFSET + queue as u64 * NOTIFY_MULTIPLIER as u64
}

/// The "no vector" value of `msix_config` and `queue_msix_vector`.
pub(crate) const NO_VECTOR: u16 = 0xffff;

// Configuration space layout.
const COMMAND: usize = 0x04;
const STATUS: usize = 0x06;
const BAR0: usize = 0x10;
const BAR1: usize = 0x14;
const CAP_POINTER: usize = 0x34;
const INTERRUPT_LINE: usize = 0x3c;
const MSIX_CAP: usize = 0x40;
const MSIX_CONTROL: usize = MSIX_CAP + 2;
const VIRTIO_CAPS: usize = 0x50;
const COMMAND_MEMORY: u16 = 1 << 1;
const COMMAND_MASTER: u16 = 1 << 2;
const COMMAND_INTX_DISABLE: u16 = 1 << 10;
const STATUS_CAP_LIST: u16 = 1 << 4;
const MSIX_ENABLE: u16 = 1 << 15;
const MSIX_FUNCTION_MASK: u16 = 1 << 14;
const CAP_ID_MSIX: u8 = 0x11;
const CAP_ID_VENDOR: u8 = 0x09;
const BAR_MEM64: u32 = 0b100;
/// The address bits of BAR 0 (its size is a power of two).
const BAR_ADDRESS_MASK: u32 = !(int_cast::u32_of_u64(BAR_SIZE) - 1);

// virtio_pci_cap.cfg_type
const CAP_COMMON: u8 = 1;
const CAP_NOTIFY: u8 = 2;
const CAP_ISR: u8 = 3;
const CAP_DEVICE: u8 = 4;

/// What a live migration moves of a virtio-pci function: the configuration space
/// (command register, where the guest put the BAR, MSI-X control), the MSI-X table,
/// pending bits and vector assignment, the common configuration's select and feature
/// registers, and the inner transport's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PciState {
    pub config: Vec<u8>,
    pub msix_enabled: bool,
    pub msix_function_masked: bool,
    /// `(message, masked)` per vector.
    pub msix_entries: Vec<(MsiMessage, bool)>,
    pub msix_pending: Vec<bool>,
    pub config_vector: u16,
    pub queue_vectors: Vec<u16>,
    pub queue_sizes: Vec<u16>,
    pub queue_select: u16,
    pub device_feature_select: u32,
    pub driver_feature_select: u32,
    pub driver_features: u64,
    pub transport: super::mmio::TransportState,
}

/// An MSI message: what the guest wrote to one MSI-X table entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsiMessage {
    pub address: u64,
    pub data: u32,
}

/// The VMM's side of MSI-X: deliver a vector, and follow the messages the
/// guest programs (KVM: a GSI route per vector and an irqfd on it).
pub trait MsiInterrupts: Send + Sync {
    /// The guest set vector `vector`'s message (`None`: cleared).
    fn set_route(&self, vector: u16, message: Option<MsiMessage>) -> std::io::Result<()>;
    /// Sends vector `vector`'s message.
    fn trigger(&self, vector: u16) -> std::io::Result<()>;
}

#[derive(Clone, Copy, Debug)]
struct MsixEntry {
    message: MsiMessage,
    masked: bool,
}

impl Default for MsixEntry {
    fn default() -> Self {
        // Reset state: every vector masked (PCI 3.0 §6.8.2.9).
        MsixEntry {
            message: MsiMessage::default(),
            masked: true,
        }
    }
}

/// MSI-X state shared by the transport (register accesses) and the
/// interrupt path (device threads).
struct MsixState {
    enabled: bool,
    function_masked: bool,
    entries: Vec<MsixEntry>,
    pending: Vec<bool>,
    config_vector: u16,
    queue_vectors: Vec<u16>,
    msi: Arc<dyn MsiInterrupts>,
}

impl MsixState {
    fn deliverable(&self, vector: u16) -> Option<bool> {
        let entry = self.entries.get(usize::from(vector))?;
        Some(self.enabled && !self.function_masked && !entry.masked)
    }

    /// Sends `vector`, or marks it pending while masked.
    fn fire(&mut self, vector: u16) {
        match self.deliverable(vector) {
            Some(true) => {
                if let Err(e) = self.msi.trigger(vector) {
                    tracing::error!("virtio-pci: cannot send MSI-X vector {vector}: {e}");
                }
            }
            Some(false) if self.enabled => self.pending[usize::from(vector)] = true,
            // Disabled MSI-X and no INTx: the driver polls the ISR.
            _ => {}
        }
    }

    /// Sends the vectors that became deliverable while pending.
    fn flush_pending(&mut self) {
        let count = self.entries.len();
        for (vector, _) in (0u16..).zip(0..count) {
            if self.pending[usize::from(vector)] && self.deliverable(vector) == Some(true) {
                self.pending[usize::from(vector)] = false;
                self.fire(vector);
            }
        }
    }
}

fn lock(m: &Mutex<MsixState>) -> MutexGuard<'_, MsixState> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The device's interrupt as the inner transport raises it: a configuration
/// change goes to `msix_config`, used buffers to every queue's vector (the
/// devices do not say which queue; a driver's handler finds its ring
/// unchanged and returns).
struct PciInterrupt(Arc<Mutex<MsixState>>);

impl InterruptTrigger for PciInterrupt {
    fn trigger(&self) -> std::io::Result<()> {
        self.trigger_cause(VIRTIO_MMIO_INT_VRING)
    }

    fn trigger_cause(&self, cause: u32) -> std::io::Result<()> {
        let mut state = lock(&self.0);
        if cause & VIRTIO_MMIO_INT_CONFIG != 0 {
            let vector = state.config_vector;
            if vector != NO_VECTOR {
                state.fire(vector);
            }
        }
        if cause & VIRTIO_MMIO_INT_VRING != 0 {
            let mut vectors = state.queue_vectors.clone();
            vectors.sort_unstable();
            vectors.dedup();
            for vector in vectors.into_iter().filter(|&v| v != NO_VECTOR) {
                state.fire(vector);
            }
        }
        Ok(())
    }
}

/// One virtio device as a PCI function.
pub struct PciTransport {
    inner: MmioTransport,
    config: [u8; CONFIG_SIZE],
    /// Which configuration bits the guest may write.
    writable: [u8; CONFIG_SIZE],
    msix: Arc<Mutex<MsixState>>,
    /// Queue sizes the driver wrote (virtio-mmio's QueueNum cannot be read back).
    queue_sizes: Vec<u16>,
    queue_select: u16,
    /// The select and driver-feature registers, which virtio-mmio does not
    /// let the driver read back and virtio-pci does.
    device_feature_select: u32,
    driver_feature_select: u32,
    driver_features: u64,
    log: GuestErrorLog,
}

impl PciTransport {
    /// A virtio device behind PCI, its BAR 0 at `bar_address` (the VMM's
    /// choice; the guest may move it). Notifications are handled on the
    /// caller's thread (tests, fuzzing).
    pub fn new(
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        msi: Arc<dyn MsiInterrupts>,
        bar_address: u64,
    ) -> Self {
        let (msix, vectors, device_type, queues) = Self::msix_for(device.as_ref(), msi);
        let inner = MmioTransport::new(device, mem, Arc::new(PciInterrupt(msix.clone())));
        Self::with_inner(inner, msix, vectors, device_type, queues, bar_address)
    }

    /// As [`PciTransport::new`], the device running on its own thread
    /// (`crate::device_thread`), woken by `notifiers`: one eventfd per
    /// queue, which the VMM registers as ioeventfds on the queues' notify
    /// addresses ([`notify_offset`] in BAR 0). The thread and every thread
    /// the device starts enter `sandbox` first.
    pub fn with_thread(
        name: &str,
        device: Box<dyn VirtioDevice>,
        mem: GuestMemoryMmap,
        msi: Arc<dyn MsiInterrupts>,
        bar_address: u64,
        notifiers: Vec<EventFd>,
        sandbox: Arc<dyn ThreadSandbox>,
    ) -> std::io::Result<Self> {
        let (msix, vectors, device_type, queues) = Self::msix_for(device.as_ref(), msi);
        let inner = MmioTransport::with_thread(
            name,
            device,
            mem,
            Arc::new(PciInterrupt(msix.clone())),
            notifiers,
            sandbox,
        )?;
        Ok(Self::with_inner(
            inner,
            msix,
            vectors,
            device_type,
            queues,
            bar_address,
        ))
    }

    /// The MSI-X state of `device` (one vector per queue plus one for
    /// configuration changes), its vector count, type and queue sizes.
    fn msix_for(
        device: &dyn VirtioDevice,
        msi: Arc<dyn MsiInterrupts>,
    ) -> (Arc<Mutex<MsixState>>, u16, u32, Vec<u16>) {
        let queues = device.queue_max_sizes().to_vec();
        let vectors = queues.len() + 1;
        let msix = Arc::new(Mutex::new(MsixState {
            enabled: false,
            function_masked: false,
            entries: vec![MsixEntry::default(); vectors],
            pending: vec![false; vectors],
            config_vector: NO_VECTOR,
            queue_vectors: vec![NO_VECTOR; queues.len()],
            msi,
        }));
        // A cast the lints refuse, allowed as nothing else fits: a device has at most
        // device_thread::MAX_QUEUES (64) queues, which its thread enforces.
        #[allow(clippy::cast_possible_truncation)]
        let vectors = vectors as u16;
        (msix, vectors, device.device_type(), queues)
    }

    fn with_inner(
        inner: MmioTransport,
        msix: Arc<Mutex<MsixState>>,
        vectors: u16,
        device_type: u32,
        queues: Vec<u16>,
        bar_address: u64,
    ) -> Self {
        let mut t = PciTransport {
            inner,
            config: [0; CONFIG_SIZE],
            writable: [0; CONFIG_SIZE],
            msix,
            queue_sizes: queues,
            queue_select: 0,
            device_feature_select: 0,
            driver_feature_select: 0,
            driver_features: 0,
            log: GuestErrorLog::default(),
        };
        t.build_config(device_type, vectors, bar_address);
        t
    }

    /// Whether a live migration can move the device (see [`MmioTransport::migratable`]).
    pub fn migratable(&self) -> Result<(), String> {
        self.inner.migratable()
    }

    /// See [`MmioTransport::resume_after_restore`].
    pub fn resume_after_restore(&mut self) {
        self.inner.resume_after_restore();
    }

    /// The function's state, for live migration (the VM is paused).
    pub fn save(&mut self) -> Result<PciState, String> {
        let transport = self.inner.save()?;
        let msix = lock(&self.msix);
        Ok(PciState {
            config: self.config.to_vec(),
            msix_enabled: msix.enabled,
            msix_function_masked: msix.function_masked,
            msix_entries: msix.entries.iter().map(|e| (e.message, e.masked)).collect(),
            msix_pending: msix.pending.clone(),
            config_vector: msix.config_vector,
            queue_vectors: msix.queue_vectors.clone(),
            queue_sizes: self.queue_sizes.clone(),
            queue_select: self.queue_select,
            device_feature_select: self.device_feature_select,
            driver_feature_select: self.driver_feature_select,
            driver_features: self.driver_features,
            transport,
        })
    }

    /// Takes the state another VMM saved for the same device, before the VM runs: the
    /// bytes of configuration space the guest cannot write must be this function's own
    /// (the same device), vectors and sizes within this function's, every MSI-X message
    /// routed again through this VMM's `MsiInterrupts`. The caller follows the BAR (its
    /// queue notifications) from [`PciTransport::bar`] afterwards.
    pub fn restore(&mut self, state: &PciState) -> Result<(), String> {
        if state.config.len() != CONFIG_SIZE {
            return Err(format!(
                "a configuration space of {} bytes",
                state.config.len()
            ));
        }
        let foreign =
            (0..CONFIG_SIZE).find(|&i| (state.config[i] ^ self.config[i]) & !self.writable[i] != 0);
        if let Some(at) = foreign {
            return Err(format!(
                "configuration space byte {at:#x} has bits no driver can write (another device?)"
            ));
        }
        {
            let msix = lock(&self.msix);
            let vectors = msix.entries.len();
            let in_range = |v: u16| v == NO_VECTOR || usize::from(v) < vectors;
            if state.msix_entries.len() != vectors
                || state.msix_pending.len() != vectors
                || state.queue_vectors.len() != msix.queue_vectors.len()
                || !state.queue_vectors.iter().copied().all(in_range)
                || !in_range(state.config_vector)
            {
                return Err("MSI-X vectors do not fit this function".into());
            }
        }
        let control =
            u16::from_le_bytes([state.config[MSIX_CONTROL], state.config[MSIX_CONTROL + 1]]);
        if state.msix_enabled != (control & MSIX_ENABLE != 0)
            || state.msix_function_masked != (control & MSIX_FUNCTION_MASK != 0)
        {
            return Err("MSI-X state differs from its control register".into());
        }
        // (A selection past the queues is what a driver may write; reads check it.)
        if state.queue_sizes.len() != self.queue_sizes.len() {
            return Err("queue sizes do not fit this function".into());
        }
        self.inner.restore(&state.transport)?;
        self.config.copy_from_slice(&state.config);
        self.queue_sizes.clone_from(&state.queue_sizes);
        self.queue_select = state.queue_select;
        self.device_feature_select = state.device_feature_select;
        self.driver_feature_select = state.driver_feature_select;
        self.driver_features = state.driver_features;
        let mut msix = lock(&self.msix);
        msix.enabled = state.msix_enabled;
        msix.function_masked = state.msix_function_masked;
        msix.pending.clone_from(&state.msix_pending);
        msix.config_vector = state.config_vector;
        msix.queue_vectors.clone_from(&state.queue_vectors);
        for (index, &(message, masked)) in state.msix_entries.iter().enumerate() {
            msix.entries[index] = MsixEntry { message, masked };
            let route = (message.address != 0).then_some(message);
            u16::try_from(index)
                .map_err(std::io::Error::other)
                .and_then(|vector| msix.msi.set_route(vector, route))
                .map_err(|e| format!("routing MSI-X vector {index}: {e}"))?;
        }
        Ok(())
    }

    /// Returns once the device's thread has handled every notification
    /// made so far (at once without a thread). For tests.
    pub fn sync(&self) {
        self.inner.sync();
    }

    /// The virtio device status.
    pub fn status(&mut self) -> u32 {
        self.inner.status()
    }

    /// VM pause: the device stops touching guest memory.
    pub fn pause(&mut self) {
        self.inner.pause();
    }

    /// VM resume.
    pub fn resume(&mut self) {
        self.inner.resume();
    }

    /// The VM's end: stops and closes the device (see [`MmioTransport::stop`]).
    pub fn stop(&mut self) {
        self.inner.stop();
    }

    fn build_config(&mut self, device_type: u32, vectors: u16, bar_address: u64) {
        // The low 16 bits of the device type, as the PCI device id carries it.
        let [t0, t1, ..] = device_type.to_le_bytes();
        let modern_id = MODERN_DEVICE_BASE.wrapping_add(u16::from_le_bytes([t0, t1]));
        let (class, subclass) = match device_type {
            1 => (0x02, 0x00), // network controller, ethernet
            2 => (0x01, 0x00), // mass storage, SCSI (as QEMU's virtio-blk)
            _ => (0xff, 0x00), // unclassified
        };
        self.put16(0x00, VIRTIO_PCI_VENDOR);
        self.put16(0x02, modern_id);
        self.put16(STATUS, STATUS_CAP_LIST);
        self.config[0x08] = 1; // revision 1: modern device
        self.config[0x0a] = subclass;
        self.config[0x0b] = class;
        self.put32(
            BAR0,
            (int_cast::low_half(bar_address) & BAR_ADDRESS_MASK) | BAR_MEM64,
        );
        self.put32(BAR1, (bar_address >> 32) as u32);
        self.put16(0x2c, VIRTIO_PCI_VENDOR);
        self.put16(0x2e, modern_id);
        self.config[CAP_POINTER] = const { int_cast::u8_of_usize(MSIX_CAP) };

        // MSI-X: table and pending bits in BAR 0.
        self.config[MSIX_CAP] = CAP_ID_MSIX;
        self.config[MSIX_CAP + 1] = const { int_cast::u8_of_usize(VIRTIO_CAPS) };
        self.put16(MSIX_CONTROL, vectors - 1);
        self.put32(
            MSIX_CAP + 4,
            const { int_cast::u32_of_u64(MSIX_TABLE_OFFSET) },
        );
        self.put32(
            MSIX_CAP + 8,
            const { int_cast::u32_of_u64(MSIX_PBA_OFFSET) },
        );

        // virtio capabilities (struct virtio_pci_cap), each pointing into BAR 0.
        const CAPS: [(u8, u32, u32); 4] = [
            (
                CAP_COMMON,
                int_cast::u32_of_u64(COMMON_OFFSET),
                int_cast::u32_of_u64(COMMON_SIZE),
            ),
            (
                CAP_ISR,
                int_cast::u32_of_u64(ISR_OFFSET),
                int_cast::u32_of_u64(ISR_SIZE),
            ),
            (
                CAP_DEVICE,
                int_cast::u32_of_u64(DEVICE_OFFSET),
                int_cast::u32_of_u64(DEVICE_SIZE),
            ),
            (
                CAP_NOTIFY,
                int_cast::u32_of_u64(NOTIFY_OFFSET),
                int_cast::u32_of_u64(NOTIFY_SIZE),
            ),
        ];
        let mut at: u8 = const { int_cast::u8_of_usize(VIRTIO_CAPS) };
        for (i, (cfg_type, offset, length)) in CAPS.iter().enumerate() {
            let len: u8 = if *cfg_type == CAP_NOTIFY { 20 } else { 16 };
            let next = if i + 1 < CAPS.len() { at + len } else { 0 };
            let here = usize::from(at);
            self.config[here] = CAP_ID_VENDOR;
            self.config[here + 1] = next;
            self.config[here + 2] = len;
            self.config[here + 3] = *cfg_type;
            self.config[here + 4] = 0; // BAR 0
            self.put32(here + 8, *offset);
            self.put32(here + 12, *length);
            if *cfg_type == CAP_NOTIFY {
                self.put32(here + 16, NOTIFY_MULTIPLIER);
            }
            at += len;
        }

        // What the guest may write: command, BAR 0/1 (address bits only),
        // the interrupt line, MSI-X enable and function mask.
        let command_bits = COMMAND_MEMORY | COMMAND_MASTER | COMMAND_INTX_DISABLE;
        self.writable[COMMAND..COMMAND + 2].copy_from_slice(&command_bits.to_le_bytes());
        self.writable[BAR0..BAR0 + 4].copy_from_slice(&BAR_ADDRESS_MASK.to_le_bytes());
        self.writable[BAR1..BAR1 + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        self.writable[INTERRUPT_LINE] = 0xff;
        let control_bits = MSIX_ENABLE | MSIX_FUNCTION_MASK;
        self.writable[MSIX_CONTROL..MSIX_CONTROL + 2].copy_from_slice(&control_bits.to_le_bytes());
    }

    fn put16(&mut self, at: usize, v: u16) {
        self.config[at..at + 2].copy_from_slice(&v.to_le_bytes());
    }

    fn put32(&mut self, at: usize, v: u32) {
        self.config[at..at + 4].copy_from_slice(&v.to_le_bytes());
    }

    fn get16(&self, at: usize) -> u16 {
        u16::from_le_bytes([self.config[at], self.config[at + 1]])
    }

    fn get32(&self, at: usize) -> u32 {
        u32::from_le_bytes([
            self.config[at],
            self.config[at + 1],
            self.config[at + 2],
            self.config[at + 3],
        ])
    }

    /// Where BAR 0 is now, if memory decoding is on.
    pub fn bar_address(&self) -> Option<u64> {
        if self.get16(COMMAND) & COMMAND_MEMORY == 0 {
            return None;
        }
        let low = u64::from(self.get32(BAR0) & !0xf);
        Some(low | (u64::from(self.get32(BAR1)) << 32))
    }

    /// A configuration space read (`offset` within the function's 4 KiB).
    pub fn config_read(&self, offset: u64, data: &mut [u8]) {
        for (i, byte) in data.iter_mut().enumerate() {
            *byte = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .and_then(|o| self.config.get(o))
                .copied()
                .unwrap_or(0);
        }
    }

    /// A configuration space write: only the writable bits change.
    pub fn config_write(&mut self, offset: u64, data: &[u8]) {
        let control_before = self.get16(MSIX_CONTROL);
        for (i, &byte) in data.iter().enumerate() {
            let Some(at) = usize::try_from(offset)
                .ok()
                .and_then(|o| o.checked_add(i))
                .filter(|&o| o < CONFIG_SIZE)
            else {
                continue;
            };
            let mask = self.writable[at];
            self.config[at] = (self.config[at] & !mask) | (byte & mask);
        }
        let control = self.get16(MSIX_CONTROL);
        if control != control_before {
            let mut msix = lock(&self.msix);
            msix.enabled = control & MSIX_ENABLE != 0;
            msix.function_masked = control & MSIX_FUNCTION_MASK != 0;
            msix.flush_pending();
        }
    }

    /// A read of `data.len()` bytes at `offset` in BAR 0.
    pub fn bar_read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        match offset {
            o if in_range(o, data.len(), COMMON_OFFSET, COMMON_SIZE) => {
                self.common_read(o - COMMON_OFFSET, data)
            }
            o if in_range(o, data.len(), ISR_OFFSET, ISR_SIZE) => {
                // Reading the ISR acknowledges it (virtio 1.2 §4.1.4.5).
                if o == ISR_OFFSET {
                    let mut status = [0u8; 4];
                    self.inner
                        .read(u64::from(VIRTIO_MMIO_INTERRUPT_STATUS), &mut status);
                    self.inner
                        .write(u64::from(VIRTIO_MMIO_INTERRUPT_ACK), &status);
                    data[0] = status[0];
                }
            }
            o if in_range(o, data.len(), DEVICE_OFFSET, DEVICE_SIZE) => self
                .inner
                .read(u64::from(VIRTIO_MMIO_CONFIG) + (o - DEVICE_OFFSET), data),
            o if in_range(o, data.len(), MSIX_TABLE_OFFSET, self.msix_table_size()) => {
                self.msix_table_read(o - MSIX_TABLE_OFFSET, data)
            }
            o if in_range(o, data.len(), MSIX_PBA_OFFSET, 8) => {
                let msix = lock(&self.msix);
                let bits = msix
                    .pending
                    .iter()
                    .enumerate()
                    .fold(0u64, |b, (i, &p)| b | (u64::from(p) << i));
                let bytes = bits.to_le_bytes();
                let start = int_cast::u64_to_usize(o - MSIX_PBA_OFFSET);
                data.copy_from_slice(&bytes[start..start + data.len()]);
            }
            _ => {
                guest_error!(
                    self.log,
                    offset,
                    len = data.len(),
                    "virtio-pci: bad BAR read"
                );
            }
        }
    }

    /// A write of `data` at `offset` in BAR 0.
    pub fn bar_write(&mut self, offset: u64, data: &[u8]) {
        match offset {
            o if in_range(o, data.len(), COMMON_OFFSET, COMMON_SIZE) => {
                self.common_write(o - COMMON_OFFSET, data)
            }
            o if in_range(o, data.len(), DEVICE_OFFSET, DEVICE_SIZE) => self
                .inner
                .write(u64::from(VIRTIO_MMIO_CONFIG) + (o - DEVICE_OFFSET), data),
            o if in_range(o, data.len(), NOTIFY_OFFSET, NOTIFY_SIZE) => {
                // queue_notify_off is the queue index; the value written is
                // the queue index too (no VIRTIO_F_NOTIFICATION_DATA).
                let rel = o - NOTIFY_OFFSET;
                if rel.is_multiple_of(u64::from(NOTIFY_MULTIPLIER)) {
                    // Below NOTIFY_SIZE / NOTIFY_MULTIPLIER: the low half is the whole index.
                    let queue = int_cast::low_half(rel / u64::from(NOTIFY_MULTIPLIER));
                    self.inner
                        .write(u64::from(VIRTIO_MMIO_QUEUE_NOTIFY), &queue.to_le_bytes());
                } else {
                    guest_error!(self.log, offset, "virtio-pci: misaligned notification");
                }
            }
            o if in_range(o, data.len(), MSIX_TABLE_OFFSET, self.msix_table_size()) => {
                self.msix_table_write(o - MSIX_TABLE_OFFSET, data)
            }
            _ => {
                guest_error!(
                    self.log,
                    offset,
                    len = data.len(),
                    "virtio-pci: write to a read-only or unknown part of the BAR"
                );
            }
        }
    }

    fn msix_table_size(&self) -> u64 {
        usize_to_u64(lock(&self.msix).entries.len()) * MSIX_ENTRY_SIZE
    }

    fn msix_table_read(&self, offset: u64, data: &mut [u8]) {
        let msix = lock(&self.msix);
        let Some(entry) = msix.entries.get((offset / MSIX_ENTRY_SIZE) as usize) else {
            return;
        };
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&entry.message.address.to_le_bytes());
        raw[8..12].copy_from_slice(&entry.message.data.to_le_bytes());
        raw[12..16].copy_from_slice(&u32::from(entry.masked).to_le_bytes());
        let start = (offset % MSIX_ENTRY_SIZE) as usize;
        if let Some(src) = raw.get(start..start + data.len()) {
            data.copy_from_slice(src);
        }
    }

    /// MSI-X table entries take 4- and 8-byte aligned accesses (PCI 3.0
    /// §6.8.2); a changed message is routed at once, an unmasked vector
    /// sends what was pending.
    fn msix_table_write(&mut self, offset: u64, data: &[u8]) {
        if !matches!(data.len(), 4 | 8) || !offset.is_multiple_of(usize_to_u64(data.len())) {
            guest_error!(
                self.log,
                offset,
                len = data.len(),
                "virtio-pci: bad MSI-X write"
            );
            return;
        }
        let mut msix = lock(&self.msix);
        let index = (offset / MSIX_ENTRY_SIZE) as usize;
        let Some(before) = msix.entries.get(index).copied() else {
            return;
        };
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&before.message.address.to_le_bytes());
        raw[8..12].copy_from_slice(&before.message.data.to_le_bytes());
        raw[12..16].copy_from_slice(&u32::from(before.masked).to_le_bytes());
        let start = (offset % MSIX_ENTRY_SIZE) as usize;
        raw[start..start + data.len()].copy_from_slice(data);
        let entry = MsixEntry {
            message: MsiMessage {
                address: u64::from_le_bytes(raw[0..8].try_into().unwrap_or_default()),
                data: u32::from_le_bytes(raw[8..12].try_into().unwrap_or_default()),
            },
            masked: raw[12] & 1 != 0,
        };
        msix.entries[index] = entry;
        if entry.message != before.message {
            let route = (entry.message.address != 0).then_some(entry.message);
            let routed = u16::try_from(index)
                .map_err(std::io::Error::other)
                .and_then(|vector| msix.msi.set_route(vector, route));
            if let Err(e) = routed {
                tracing::error!("virtio-pci: cannot route MSI-X vector {index}: {e}");
            }
        }
        if before.masked && !entry.masked {
            msix.flush_pending();
        }
    }

    fn common_read(&mut self, offset: u64, data: &mut [u8]) {
        let value: u64 = match (offset, data.len()) {
            (0x00, 4) => u64::from(self.device_feature_select),
            (0x04, 4) => self.mmio_read(VIRTIO_MMIO_DEVICE_FEATURES),
            (0x08, 4) => u64::from(self.driver_feature_select),
            (0x0c, 4) => match self.driver_feature_select {
                0 => self.driver_features & 0xffff_ffff,
                1 => self.driver_features >> 32,
                _ => 0,
            },
            (0x10, 2) => u64::from(lock(&self.msix).config_vector),
            (0x12, 2) => usize_to_u64(self.queue_sizes.len()),
            (0x14, 1) => self.mmio_read(VIRTIO_MMIO_STATUS),
            (0x15, 1) => 0, // config_generation: the config never changes under the driver
            (0x16, 2) => u64::from(self.queue_select),
            (0x18, 2) => self.selected(|t, q| u64::from(t.queue_sizes[q])),
            (0x1a, 2) => self.selected(|t, q| u64::from(lock(&t.msix).queue_vectors[q])),
            (0x1c, 2) => self.mmio_read(VIRTIO_MMIO_QUEUE_READY),
            (0x1e, 2) => self.selected(|_, q| usize_to_u64(q)), // queue_notify_off
            (0x20, 4) => self.mmio_read(VIRTIO_MMIO_QUEUE_DESC_LOW),
            (0x24, 4) => self.mmio_read(VIRTIO_MMIO_QUEUE_DESC_HIGH),
            (0x28, 4) => self.mmio_read(VIRTIO_MMIO_QUEUE_AVAIL_LOW),
            (0x2c, 4) => self.mmio_read(VIRTIO_MMIO_QUEUE_AVAIL_HIGH),
            (0x30, 4) => self.mmio_read(VIRTIO_MMIO_QUEUE_USED_LOW),
            (0x34, 4) => self.mmio_read(VIRTIO_MMIO_QUEUE_USED_HIGH),
            _ => {
                guest_error!(
                    self.log,
                    offset,
                    len = data.len(),
                    "virtio-pci: common configuration read of the wrong width"
                );
                0
            }
        };
        data.copy_from_slice(&value.to_le_bytes()[..data.len()]);
    }

    fn common_write(&mut self, offset: u64, data: &[u8]) {
        let mut bytes = [0u8; 8];
        bytes[..data.len()].copy_from_slice(data);
        let value = u64::from_le_bytes(bytes);
        // The 2- and 4-byte registers: the bytes the driver wrote.
        let low16 = u16::from_le_bytes([bytes[0], bytes[1]]);
        let low32 = int_cast::low_half(value);
        match (offset, data.len()) {
            (0x00, 4) => {
                self.device_feature_select = low32;
                self.mmio_write(VIRTIO_MMIO_DEVICE_FEATURES_SEL, value);
            }
            (0x08, 4) => {
                self.driver_feature_select = low32;
                self.mmio_write(VIRTIO_MMIO_DRIVER_FEATURES_SEL, value);
            }
            (0x0c, 4) => {
                // Shadowed only if the inner transport takes it (DRIVER state).
                let before = self.inner.acked_features();
                self.mmio_write(VIRTIO_MMIO_DRIVER_FEATURES, value);
                if self.inner.acked_features() != before || self.inner.status() & 0x0f == 0x03 {
                    match self.driver_feature_select {
                        0 => self.driver_features = (self.driver_features & !0xffff_ffff) | value,
                        1 => {
                            self.driver_features =
                                (self.driver_features & 0xffff_ffff) | (value << 32)
                        }
                        _ => {}
                    }
                }
            }
            (0x10, 2) => {
                let mut msix = lock(&self.msix);
                msix.config_vector = valid_vector(low16, msix.entries.len());
            }
            (0x14, 1) => {
                self.mmio_write(VIRTIO_MMIO_STATUS, value);
                if value == 0 {
                    self.reset();
                }
            }
            (0x16, 2) => {
                self.queue_select = low16;
                self.mmio_write(VIRTIO_MMIO_QUEUE_SEL, value);
            }
            (0x18, 2) => {
                // The inner transport decides whether the write is allowed now.
                self.mmio_write(VIRTIO_MMIO_QUEUE_NUM, value);
                if self.inner_accepts_queue_config()
                    && let Some(size) = self.queue_sizes.get_mut(usize::from(self.queue_select))
                {
                    *size = low16;
                }
            }
            (0x1a, 2) => {
                let queue = usize::from(self.queue_select);
                let mut msix = lock(&self.msix);
                let entries = msix.entries.len();
                if let Some(v) = msix.queue_vectors.get_mut(queue) {
                    *v = valid_vector(low16, entries);
                }
            }
            (0x1c, 2) => self.mmio_write(VIRTIO_MMIO_QUEUE_READY, value),
            (0x20, 4) => self.mmio_write(VIRTIO_MMIO_QUEUE_DESC_LOW, value),
            (0x24, 4) => self.mmio_write(VIRTIO_MMIO_QUEUE_DESC_HIGH, value),
            (0x28, 4) => self.mmio_write(VIRTIO_MMIO_QUEUE_AVAIL_LOW, value),
            (0x2c, 4) => self.mmio_write(VIRTIO_MMIO_QUEUE_AVAIL_HIGH, value),
            (0x30, 4) => self.mmio_write(VIRTIO_MMIO_QUEUE_USED_LOW, value),
            (0x34, 4) => self.mmio_write(VIRTIO_MMIO_QUEUE_USED_HIGH, value),
            _ => {
                guest_error!(
                    self.log,
                    offset,
                    len = data.len(),
                    "virtio-pci: write to a read-only field or of the wrong width"
                );
            }
        }
    }

    /// Queue registers are accepted between FEATURES_OK and DRIVER_OK, for
    /// a queue that is not yet enabled (the inner transport's rule).
    fn inner_accepts_queue_config(&mut self) -> bool {
        let status = self.inner.status();
        // ACK | DRIVER | FEATURES_OK, and none of DRIVER_OK, NEEDS_RESET, FAILED.
        let configuring = status & 0xcf == 0x0b;
        configuring && self.mmio_read(VIRTIO_MMIO_QUEUE_READY) == 0
    }

    /// A device reset also forgets the queue sizes and vectors.
    fn reset(&mut self) {
        self.queue_sizes = self.inner.device().queue_max_sizes().to_vec();
        self.queue_select = 0;
        self.device_feature_select = 0;
        self.driver_feature_select = 0;
        self.driver_features = 0;
        let mut msix = lock(&self.msix);
        msix.config_vector = NO_VECTOR;
        for v in &mut msix.queue_vectors {
            *v = NO_VECTOR;
        }
    }

    fn selected(&self, f: impl Fn(&Self, usize) -> u64) -> u64 {
        let q = usize::from(self.queue_select);
        if q < self.queue_sizes.len() {
            f(self, q)
        } else {
            0
        }
    }

    fn mmio_read(&mut self, reg: u32) -> u64 {
        let mut bytes = [0u8; 4];
        self.inner.read(u64::from(reg), &mut bytes);
        u64::from(u32::from_le_bytes(bytes))
    }

    fn mmio_write(&mut self, reg: u32, value: u64) {
        self.inner
            .write(u64::from(reg), &int_cast::low_half(value).to_le_bytes());
    }
}

/// A vector the table has, or NO_VECTOR (what the driver then reads back
/// and takes as "refused").
fn valid_vector(vector: u16, entries: usize) -> u16 {
    if usize::from(vector) < entries {
        vector
    } else {
        NO_VECTOR
    }
}

/// Whether `[offset, offset + len)` lies in `[start, start + size)`.
fn in_range(offset: u64, len: usize, start: u64, size: u64) -> bool {
    offset >= start
        && offset.saturating_add(usize_to_u64(len)) <= start.saturating_add(size)
        && len > 0
}

#[cfg(test)]
mod tests;
