//! What a virtio-net device has moved, from the guest's side as libvirt
//! reports interface statistics (`rx` = to the guest): the launcher reports
//! them in `GetDomainStats`, where KubeVirt's `kubevirt_vmi_network_*`
//! metrics come from. Bytes are Ethernet frame bytes (the virtio-net header
//! is not counted).
//!
//! Updated by the receive thread and the transmitting thread, read by
//! another: relaxed atomics, since each number is only ever summed.

use int_cast::usize_to_u64;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct NetCounters {
    rx_bytes: AtomicU64,
    rx_pkts: AtomicU64,
    rx_errs: AtomicU64,
    rx_drop: AtomicU64,
    tx_bytes: AtomicU64,
    tx_pkts: AtomicU64,
    tx_errs: AtomicU64,
    tx_drop: AtomicU64,
}

/// A snapshot of [`NetCounters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NetCounts {
    /// Frames and bytes delivered into the guest's receive buffers.
    pub rx_bytes: u64,
    pub rx_pkts: u64,
    /// Reads from the tap that failed.
    pub rx_errs: u64,
    /// Frames from the tap the guest could not take (too large for its
    /// buffers, or for any frame).
    pub rx_drop: u64,
    /// Frames and bytes written to the tap.
    pub tx_bytes: u64,
    pub tx_pkts: u64,
    /// Writes to the tap that failed (the frame is lost, as on a wire).
    pub tx_errs: u64,
    /// Frames the guest sent that were refused (malformed chains, bad
    /// lengths, offloads not negotiated).
    pub tx_drop: u64,
}

/// Which counter an event adds to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum NetEvent {
    Received(usize),
    ReceiveError,
    ReceiveDropped,
    Sent(usize),
    SendError,
    SendDropped,
}

impl NetCounters {
    pub(super) fn record(&self, event: NetEvent) {
        let add = |c: &AtomicU64, n: u64| {
            c.fetch_add(n, Ordering::Relaxed);
        };
        match event {
            NetEvent::Received(bytes) => {
                add(&self.rx_pkts, 1);
                add(&self.rx_bytes, usize_to_u64(bytes));
            }
            NetEvent::ReceiveError => add(&self.rx_errs, 1),
            NetEvent::ReceiveDropped => add(&self.rx_drop, 1),
            NetEvent::Sent(bytes) => {
                add(&self.tx_pkts, 1);
                add(&self.tx_bytes, usize_to_u64(bytes));
            }
            NetEvent::SendError => add(&self.tx_errs, 1),
            NetEvent::SendDropped => add(&self.tx_drop, 1),
        }
    }

    pub fn snapshot(&self) -> NetCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        NetCounts {
            rx_bytes: get(&self.rx_bytes),
            rx_pkts: get(&self.rx_pkts),
            rx_errs: get(&self.rx_errs),
            rx_drop: get(&self.rx_drop),
            tx_bytes: get(&self.tx_bytes),
            tx_pkts: get(&self.tx_pkts),
            tx_errs: get(&self.tx_errs),
            tx_drop: get(&self.tx_drop),
        }
    }
}
