//! What a virtio-blk device has done, as libvirt's block statistics count it
//! (`rd_reqs`, `rd_bytes`, `rd_total_times`, ...): the launcher reports them
//! in `GetDomainStats`, where KubeVirt's `kubevirt_vmi_storage_*` metrics
//! come from.
//!
//! Updated by every thread that runs requests, read at any time by another:
//! relaxed atomics, since each number is only ever summed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The live counters of one device (shared with whoever reports them).
#[derive(Debug, Default)]
pub struct BlockCounters {
    rd_reqs: AtomicU64,
    rd_bytes: AtomicU64,
    rd_ns: AtomicU64,
    wr_reqs: AtomicU64,
    wr_bytes: AtomicU64,
    wr_ns: AtomicU64,
    fl_reqs: AtomicU64,
    fl_ns: AtomicU64,
    errors: AtomicU64,
    /// Disk size in bytes, as the guest sees it (fixed).
    capacity: u64,
}

/// A snapshot of [`BlockCounters`]. Requests count once they succeed; a
/// request the disk fails counts in `errors` only, and one refused before
/// it reaches the disk (a bad chain, past the end) not at all. Write-zeroes requests are
/// writes of their length (as QEMU accounts them); discards and ID requests
/// are not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounts {
    pub rd_reqs: u64,
    pub rd_bytes: u64,
    /// Time spent on reads, in nanoseconds.
    pub rd_total_ns: u64,
    pub wr_reqs: u64,
    pub wr_bytes: u64,
    pub wr_total_ns: u64,
    pub fl_reqs: u64,
    pub fl_total_ns: u64,
    pub errors: u64,
    pub capacity: u64,
}

/// What a finished request counts as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Accounted {
    Read(u64),
    Write(u64),
    Flush,
    Uncounted,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl BlockCounters {
    pub(super) fn new(capacity: u64) -> BlockCounters {
        BlockCounters {
            capacity,
            ..BlockCounters::default()
        }
    }

    pub(super) fn record(&self, what: Accounted, ok: bool, took: Duration) {
        if !ok {
            if what != Accounted::Uncounted {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let (reqs, bytes, ns) = match what {
            Accounted::Read(n) => (&self.rd_reqs, Some((&self.rd_bytes, n)), &self.rd_ns),
            Accounted::Write(n) => (&self.wr_reqs, Some((&self.wr_bytes, n)), &self.wr_ns),
            Accounted::Flush => (&self.fl_reqs, None, &self.fl_ns),
            Accounted::Uncounted => return,
        };
        reqs.fetch_add(1, Ordering::Relaxed);
        if let Some((counter, n)) = bytes {
            counter.fetch_add(n, Ordering::Relaxed);
        }
        ns.fetch_add(nanos(took), Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> BlockCounts {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        BlockCounts {
            rd_reqs: get(&self.rd_reqs),
            rd_bytes: get(&self.rd_bytes),
            rd_total_ns: get(&self.rd_ns),
            wr_reqs: get(&self.wr_reqs),
            wr_bytes: get(&self.wr_bytes),
            wr_total_ns: get(&self.wr_ns),
            fl_reqs: get(&self.fl_reqs),
            fl_total_ns: get(&self.fl_ns),
            errors: get(&self.errors),
            capacity: self.capacity,
        }
    }
}
