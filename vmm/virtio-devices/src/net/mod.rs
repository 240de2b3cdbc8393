//! virtio-net on a tap interface, no offloads.
//!
//! The device offers `VIRTIO_NET_F_STATUS` (the link state, as QEMU always
//! does) and, when configured, `VIRTIO_NET_F_MTU`. A link that is down
//! (KubeVirt's interface `state: down`) passes no frame: transmitted frames
//! are dropped and nothing is received.
//!
//! Both directions run on the device's thread ([`crate::device_thread`]):
//!
//! - Transmit (queue 1): each chain is checked (device-readable only, a sane
//!   length, no offload the driver could not have negotiated) and written
//!   to the tap as one packet.
//! - Receive (queue 0): the thread waits on the tap only when the device
//!   has no frame waiting for a guest buffer ([`VirtioDevice::watched_fd`]).
//!   When the guest has no receive buffer the frame waits and the tap is not
//!   watched until the driver notifies the receive queue; frames left in the
//!   tap meanwhile are queued (and, past the tap's queue length, dropped) by
//!   the host kernel. So a full guest queue costs no CPU and nothing is
//!   corrupted, and delivery resumes as soon as buffers come back
//!   (Firecracker's CVE-2020-16843 was a receive path that stalled here).
//!   A pause stops both: the device thread does not run the device while
//!   the VM is paused.
//!
//! Live migration moves the queues' positions only (`queue_positions`).

mod counters;
pub mod host_link;
pub mod tap;
// Test support, behind the `testing` feature that only tests, benchmarks and fuzz targets
// turn on (cargo keeps both builds of the crate, so switching costs one compile, once).
#[cfg(feature = "testing")]
pub mod test_tap;

use int_cast::usize_to_u64;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_NET;
use virtio_bindings::virtio_net::{
    VIRTIO_NET_F_MAC, VIRTIO_NET_F_MTU, VIRTIO_NET_F_STATUS, VIRTIO_NET_S_LINK_UP,
};
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use vm_memory::Bytes;

use crate::chain::{Buffer, ValidatedChain};
use crate::device::feature_bit;
use crate::device::{ActivateContext, ActivateError, DeviceError, VirtioDevice, read_config_bytes};
use crate::interrupt::DeviceInterrupt;
use crate::log_limit::{GuestErrorLog, guest_error};
use crate::queue::{DeviceQueue, QueueError};
use counters::NetEvent;
pub use counters::{NetCounters, NetCounts};
pub use tap::TapError;
pub(crate) use tap::{Tap, VNET_HDR_LEN};

pub(crate) const RX_QUEUE: u16 = 0;
pub(crate) const TX_QUEUE: u16 = 1;
pub(crate) const QUEUE_SIZE: u16 = 256;
/// Largest frame moved in either direction: header, 64 KiB of payload,
/// Ethernet header and a VLAN tag.
pub(crate) const MAX_FRAME: usize = VNET_HDR_LEN + 65535 + 14 + 4;
/// Smallest: header plus an Ethernet header.
pub(crate) const MIN_FRAME: usize = VNET_HDR_LEN + 14;

#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error(transparent)]
    Tap(#[from] TapError),
}

/// Why a transmit chain was dropped; one variant per rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TxError {
    #[error("transmit chain has device-writable buffers")]
    WritableBuffer,
    #[error("frame of {0} bytes (header included) is shorter than {MIN_FRAME}")]
    TooShort(u64),
    #[error("frame of {0} bytes (header included) is longer than {MAX_FRAME}")]
    TooLong(u64),
    #[error(
        "header asks for checksum or segmentation offload (flags {flags:#x}, gso {gso:#x}), which was not negotiated"
    )]
    OffloadNotNegotiated { flags: u8, gso: u8 },
    #[error("frame could not be read from guest memory")]
    Unreadable,
    #[error("the link is down")]
    LinkDown,
}

struct TxState {
    mem: GuestMemoryMmap,
    queue: DeviceQueue,
    interrupt: DeviceInterrupt,
}

/// How the device presents itself to the guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetOptions {
    pub mac: [u8; 6],
    /// Offered with `VIRTIO_NET_F_MTU`: the MTU the guest should use.
    pub mtu: Option<u16>,
    /// `VIRTIO_NET_S_LINK_UP`; a down link passes no frame.
    pub link_up: bool,
}

/// `struct virtio_net_config` up to `mtu`: mac, status,
/// max_virtqueue_pairs, mtu (virtio 1.2 §5.1.4; fixed offsets).
const CONFIG_LEN: usize = 12;

fn config_space(options: &NetOptions) -> [u8; CONFIG_LEN] {
    let mut c = [0u8; CONFIG_LEN];
    c[..6].copy_from_slice(&options.mac);
    let status = if options.link_up {
        const { int_cast::u16_of_u32(VIRTIO_NET_S_LINK_UP) }
    } else {
        0
    };
    c[6..8].copy_from_slice(&status.to_le_bytes());
    c[8..10].copy_from_slice(&1u16.to_le_bytes()); // one queue pair
    c[10..12].copy_from_slice(&options.mtu.unwrap_or(0).to_le_bytes());
    c
}

/// The virtio-net device.
pub struct Net {
    /// `None` once the device is closed: the tap's descriptor is let go with the VM (a VM
    /// restarted on the same tap after a guest reboot opens it again; a single-queue tap
    /// refuses a second opener with EBUSY).
    tap: Option<Tap>,
    config: [u8; CONFIG_LEN],
    link_up: bool,
    features: u64,
    tx: Option<TxState>,
    tx_buf: Vec<u8>,
    /// Set at activation when the link is up.
    rx: Option<RxState>,
    log: GuestErrorLog,
    counters: Arc<NetCounters>,
}

impl Net {
    /// Attaches to tap `tap_name` (which must exist, or be creatable by this
    /// process) and presents `mac` to the guest, link up, no MTU offered.
    pub fn new(tap_name: &str, mac: [u8; 6]) -> Result<Net, NetError> {
        Net::with_options(
            tap_name,
            NetOptions {
                mac,
                mtu: None,
                link_up: true,
            },
        )
    }

    /// Attaches to tap `tap_name` and presents the device as `options` say.
    pub fn with_options(tap_name: &str, options: NetOptions) -> Result<Net, NetError> {
        Ok(Net::with_tap(Tap::open(tap_name)?, options))
    }

    /// The device on an open tap (or a stand-in for one, see [`Tap::stand_in`]).
    pub(crate) fn with_tap(tap: Tap, options: NetOptions) -> Net {
        let mut features = feature_bit(VIRTIO_F_VERSION_1)
            | feature_bit(VIRTIO_NET_F_MAC)
            | feature_bit(VIRTIO_NET_F_STATUS)
            | feature_bit(VIRTIO_RING_F_INDIRECT_DESC);
        if options.mtu.is_some() {
            features |= feature_bit(VIRTIO_NET_F_MTU);
        }
        Net {
            tap: Some(tap),
            config: config_space(&options),
            link_up: options.link_up,
            features,
            tx: None,
            tx_buf: Vec::new(),
            rx: None,
            log: GuestErrorLog::default(),
            counters: Arc::default(),
        }
    }

    /// The device's traffic counters, live (for `GetDomainStats`).
    pub fn counters(&self) -> Arc<NetCounters> {
        self.counters.clone()
    }

    fn transmit_queue(&mut self) -> Result<(), DeviceError> {
        let Some(mut tx) = self.tx.take() else {
            return Err(DeviceError::NotActivated);
        };
        let result = self.drain_tx(&mut tx);
        self.tx = Some(tx);
        result
    }

    fn drain_tx(&mut self, tx: &mut TxState) -> Result<(), DeviceError> {
        let queue_err = |source| DeviceError::Queue {
            index: TX_QUEUE,
            source,
        };
        let mut completed = false;
        for _ in 0..tx.queue.size() {
            let Some(popped) = tx.queue.pop(&tx.mem).map_err(queue_err)? else {
                break;
            };
            match &popped.chain {
                Ok(chain) => {
                    match self.transmit(chain, &tx.mem) {
                        Ok(()) => {}
                        // Not the guest's fault: the frame is lost on the wire.
                        Err(TxError::LinkDown) => self.counters.record(NetEvent::SendDropped),
                        Err(e) => {
                            self.counters.record(NetEvent::SendDropped);
                            guest_error!(self.log, "virtio-net: transmit dropped: {e}");
                        }
                    }
                }
                Err(e) => {
                    self.counters.record(NetEvent::SendDropped);
                    guest_error!(self.log, "virtio-net: bad transmit chain: {e}");
                }
            }
            tx.queue
                .add_used(&tx.mem, popped.head, 0)
                .map_err(queue_err)?;
            completed = true;
        }
        if completed && tx.queue.wants_interrupt(&tx.mem) {
            tx.interrupt.signal_used_queue();
        }
        Ok(())
    }

    fn transmit(&mut self, chain: &ValidatedChain, mem: &GuestMemoryMmap) -> Result<(), TxError> {
        if !self.link_up {
            return Err(TxError::LinkDown);
        }
        if !chain.writable().is_empty() {
            return Err(TxError::WritableBuffer);
        }
        let total = ValidatedChain::total_len(chain.buffers());
        if total < usize_to_u64(MIN_FRAME) {
            return Err(TxError::TooShort(total));
        }
        if total > usize_to_u64(MAX_FRAME) {
            return Err(TxError::TooLong(total));
        }
        // Bounded by MAX_FRAME just above.
        self.tx_buf.resize(int_cast::u64_to_usize(total), 0);
        let mut at = 0usize;
        for b in chain.buffers() {
            let end = at + int_cast::u32_to_usize(b.len);
            mem.read_slice(&mut self.tx_buf[at..end], b.addr)
                .map_err(|_| TxError::Unreadable)?;
            at = end;
        }
        // virtio_net_hdr_v1: flags, gso_type. Neither checksum nor
        // segmentation offload is offered, so both must be 0.
        let (flags, gso) = (self.tx_buf[0], self.tx_buf[1]);
        if flags != 0 || gso != 0 {
            return Err(TxError::OffloadNotNegotiated { flags, gso });
        }
        let Some(tap) = &self.tap else {
            // Closed: the VM has ended, the frame goes nowhere.
            self.counters.record(NetEvent::SendError);
            return Ok(());
        };
        match tap.write_frame(&self.tx_buf) {
            Ok(()) => self.counters.record(NetEvent::Sent(
                self.tx_buf.len().saturating_sub(VNET_HDR_LEN),
            )),
            Err(e) => {
                // The host side (link down, tap gone) is not the guest's
                // fault; the frame is lost as on a real wire.
                self.counters.record(NetEvent::SendError);
                guest_error!(self.log, "virtio-net: tap {} write failed: {e}", tap.name());
            }
        }
        Ok(())
    }
}

impl VirtioDevice for Net {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_NET
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE, QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // The MAC is writable only in legacy devices.
        guest_error!(
            self.log,
            offset,
            len = data.len(),
            "virtio-net: config space is read-only"
        );
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let got = ctx.queues.len();
        let Ok::<[_; 2], _>([rx_queue, tx_queue]) = ctx.queues.try_into() else {
            return Err(ActivateError::QueueCount { expected: 2, got });
        };
        self.tx = Some(TxState {
            mem: ctx.mem.clone(),
            queue: DeviceQueue::new(tx_queue),
            interrupt: ctx.interrupt.clone(),
        });
        // No carrier: nothing is received; the guest's buffers wait.
        self.rx = self.link_up.then(|| RxState {
            mem: ctx.mem,
            queue: DeviceQueue::new(rx_queue),
            interrupt: ctx.interrupt,
            used_pending: false,
            log: GuestErrorLog::default(),
            counters: self.counters.clone(),
            // One byte more than the largest frame, so that a longer one
            // (which the tap would truncate into the buffer) is recognised
            // and dropped.
            frame: vec![0u8; MAX_FRAME + 1],
            pending: None,
            tap_failed: false,
        });
        Ok(())
    }

    fn reset(&mut self) {
        self.rx = None;
        self.tx = None;
    }

    fn process_queue(&mut self, index: u16) -> Result<(), DeviceError> {
        match index {
            // New receive buffers: a waiting frame may go now.
            RX_QUEUE => match (&mut self.rx, &self.tx) {
                (Some(rx), _) => match &self.tap {
                    Some(tap) => rx.receive(tap),
                    None => Ok(()),
                },
                // Activated with the link down: nothing to receive.
                (None, Some(_)) => Ok(()),
                (None, None) => Err(DeviceError::NotActivated),
            },
            TX_QUEUE => self.transmit_queue(),
            other => Err(DeviceError::NoSuchQueue(other)),
        }
    }

    fn watched_fd(&self) -> Option<RawFd> {
        // A waiting frame means the guest must free a buffer first.
        let rx = self.rx.as_ref()?;
        let tap = self.tap.as_ref()?;
        (rx.pending.is_none() && !rx.tap_failed).then(|| tap.as_fd().as_raw_fd())
    }

    fn process_fd(&mut self) -> Result<(), DeviceError> {
        match (&mut self.rx, &self.tap) {
            (Some(rx), Some(tap)) => rx.receive(tap),
            (Some(_), None) => Ok(()),
            (None, _) => Err(DeviceError::NotActivated),
        }
    }

    fn close(&mut self) {
        self.rx = None;
        self.tx = None;
        self.tap = None;
    }

    /// The queues' positions are the device's whole state: a frame read from the tap
    /// and still waiting for a guest buffer is lost with the source, as a wire loses
    /// frames in flight, and the target's device has a tap of its own (the target
    /// pod's). With the link down the receive queue was never used: it is where the
    /// driver's activation put it.
    fn queue_positions(&self) -> Option<Vec<(u16, u16)>> {
        Some(match &self.tx {
            None => Vec::new(),
            Some(tx) => vec![
                self.rx.as_ref().map_or((0, 0), |rx| rx.queue.position()),
                tx.queue.position(),
            ],
        })
    }
}

/// The receive side.
struct RxState {
    mem: GuestMemoryMmap,
    queue: DeviceQueue,
    interrupt: DeviceInterrupt,
    /// Chains were returned since the last interrupt.
    used_pending: bool,
    log: GuestErrorLog,
    counters: Arc<NetCounters>,
    /// Frame buffer; `pending` bytes of it wait for a guest buffer.
    frame: Vec<u8>,
    pending: Option<usize>,
    /// The tap failed: nothing more is read from it.
    tap_failed: bool,
}

enum Delivery {
    Delivered,
    /// The frame cannot fit the guest's buffer; it is dropped and the buffer
    /// stays available for the next frame.
    Dropped,
    NoBuffer,
}

impl RxState {
    fn deliver(&mut self, frame: &mut [u8]) -> Result<Delivery, QueueError> {
        if frame.len() < VNET_HDR_LEN {
            return Ok(Delivery::Dropped);
        }
        // No offloads negotiated: flags and GSO fields 0, one buffer used.
        frame[..VNET_HDR_LEN].fill(0);
        frame[10..12].copy_from_slice(&1u16.to_le_bytes());
        // Skip over (return) unusable chains, at most a queue's worth.
        for _ in 0..self.queue.size() {
            let Some(popped) = self.queue.pop(&self.mem)? else {
                return Ok(Delivery::NoBuffer);
            };
            let chain = match popped.chain {
                Ok(chain) if chain.readable().is_empty() => chain,
                Ok(_) => {
                    guest_error!(
                        self.log,
                        "virtio-net: receive chain has device-readable buffers"
                    );
                    self.return_chain(popped.head, 0)?;
                    continue;
                }
                Err(e) => {
                    guest_error!(self.log, "virtio-net: bad receive chain: {e}");
                    self.return_chain(popped.head, 0)?;
                    continue;
                }
            };
            let capacity = ValidatedChain::total_len(chain.buffers());
            if capacity < usize_to_u64(frame.len()) {
                guest_error!(
                    self.log,
                    "virtio-net: receive buffer of {capacity} bytes cannot hold a {}-byte frame; frame dropped",
                    frame.len()
                );
                self.queue.undo_pop();
                return Ok(Delivery::Dropped);
            }
            let written = write_frame(&self.mem, chain.buffers(), frame);
            self.return_chain(popped.head, written)?;
            return Ok(Delivery::Delivered);
        }
        Ok(Delivery::NoBuffer)
    }

    fn return_chain(&mut self, head: u16, len: u32) -> Result<(), QueueError> {
        self.queue.add_used(&self.mem, head, len)?;
        self.used_pending = true;
        Ok(())
    }

    fn interrupt_if_needed(&mut self) {
        if self.used_pending && self.queue.wants_interrupt(&self.mem) {
            self.interrupt.signal_used_queue();
        }
        self.used_pending = false;
    }
}

/// Copies `frame` across `buffers` (which can hold it); returns the bytes
/// written.
fn write_frame(mem: &GuestMemoryMmap, buffers: &[Buffer], frame: &[u8]) -> u32 {
    let mut rest = frame;
    let mut written = 0u32;
    for b in buffers {
        if rest.is_empty() {
            break;
        }
        let step = u32::try_from(rest.len()).unwrap_or(u32::MAX).min(b.len);
        let n = int_cast::u64_to_usize(u64::from(step));
        if mem.write_slice(&rest[..n], b.addr).is_err() {
            break;
        }
        rest = &rest[n..];
        written += step;
    }
    written
}

impl RxState {
    /// Moves frames from the tap into the receive queue until the tap is
    /// empty or the guest has no buffer left (the frame then waits).
    fn receive(&mut self, tap: &Tap) -> Result<(), DeviceError> {
        let result = self.receive_frames(tap);
        self.interrupt_if_needed();
        result.map_err(|source| DeviceError::Queue {
            index: RX_QUEUE,
            source,
        })
    }

    fn receive_frames(&mut self, tap: &Tap) -> Result<(), QueueError> {
        loop {
            if self.pending.is_none() && !self.tap_failed {
                match tap.read_frame(&mut self.frame) {
                    Ok(n) if n > MAX_FRAME => {
                        self.counters.record(NetEvent::ReceiveDropped);
                        tracing::warn!(
                            "virtio-net: dropped an oversized frame from tap {}",
                            tap.name()
                        );
                        continue;
                    }
                    Ok(n) => self.pending = Some(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        self.counters.record(NetEvent::ReceiveError);
                        tracing::error!(
                            "virtio-net: tap {} read failed, receive stopped: {e}",
                            tap.name()
                        );
                        self.tap_failed = true;
                    }
                }
            }
            let Some(n) = self.pending else {
                return Ok(());
            };
            let mut frame = std::mem::take(&mut self.frame);
            let delivery = self.deliver(&mut frame[..n]);
            self.frame = frame;
            match delivery? {
                Delivery::Delivered => {
                    self.counters
                        .record(NetEvent::Received(n.saturating_sub(VNET_HDR_LEN)));
                    self.pending = None;
                }
                Delivery::Dropped => {
                    self.counters.record(NetEvent::ReceiveDropped);
                    self.pending = None;
                }
                Delivery::NoBuffer => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests;
