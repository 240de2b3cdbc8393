//! virtio-blk: a disk backed by a [`::block::SharedDisk`].
//!
//! Requests are parsed and checked in [`request`] on the thread that
//! handles the notification (the device's thread), then executed: a lone
//! request right there, the requests of a larger batch concurrently on the
//! device's I/O threads ([`workers`]), so that a guest with a deep queue
//! gets several requests on the host at once (with a
//! [`::block::ConcurrentDisk`] their data I/O overlaps). A flush waits for
//! the requests before it in the batch, and the ones after it wait for the
//! flush. Every request of the batch is done before the device thread lets
//! go of the device: nothing touches guest memory after a pause or reset.
//! Data moves through bounded bounce buffers: guest memory is never handed
//! to the backend as a Rust slice (the guest may change it concurrently).

mod counters;
pub(crate) mod request;
mod workers;

use std::sync::{Arc, Weak};
use std::time::Instant;

use crate::GuestMemoryMmap;
use ::block::{DirtyTracked, DiskBackend, DiskError, IoBuffer, Pages, SerializedDisk, SharedDisk};
use int_cast::u64_to_usize;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_F_BLK_SIZE, VIRTIO_BLK_F_DISCARD, VIRTIO_BLK_F_FLUSH, VIRTIO_BLK_F_RO,
    VIRTIO_BLK_F_SEG_MAX, VIRTIO_BLK_F_WRITE_ZEROES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK,
    VIRTIO_BLK_S_UNSUPP,
};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_BLOCK;
use virtio_bindings::virtio_ring::VIRTIO_RING_F_INDIRECT_DESC;
use vm_memory::{Address, Bytes};

use crate::chain::{Buffer, ChainError, ValidatedChain};
use crate::device::feature_bit;
use crate::device::{ActivateContext, ActivateError, DeviceError, VirtioDevice, read_config_bytes};
use crate::log_limit::{GuestErrorLog, LogLimit, guest_error};
use crate::queue::PoppedChain;
use crate::request_queue::RequestQueue;
use request::{DiskLimits, Request, RequestKind, SECTOR_SIZE, Segment};
use workers::IoWorkers;

/// Entries in the one request queue.
pub(crate) const QUEUE_SIZE: u16 = 256;
/// Bounce buffer size: the most bytes copied per backend call.
const CHUNK: usize = 64 * 1024;
const CHUNK_U32: u32 = int_cast::u32_of_usize(CHUNK);
/// Batches (notifications with more than one request) after which the
/// bounce buffers are moved onto a huge page. A guest that keeps its disk
/// busy gets there within milliseconds; one that reads a little at boot
/// and then idles (the test guest's checks: a handful) never does.
const HUGE_PAGE_AFTER_BATCHES: u32 = 64;
/// Advertised `seg_max`: data buffers per request, the queue's entries less
/// the header and the status (Linux sizes its requests by it; a longer
/// chain would exceed the queue size, which the chain check refuses anyway).
const SEG_MAX: u32 = QUEUE_SIZE as u32 - 2;
/// Advertised discard / write-zeroes limits.
const MAX_SEGMENTS: u32 = 32;
const MAX_SEGMENT_SECTORS: u32 = u32::MAX >> 9;

/// How the device presents the disk.
#[derive(Debug, Clone)]
pub struct BlockOptions {
    /// Returned by `VIRTIO_BLK_T_GET_ID` (the guest's disk serial), at most
    /// 20 bytes used.
    pub serial: String,
    /// Let the guest free space (writable disks only): offer
    /// `VIRTIO_BLK_F_DISCARD` and honour the unmap flag of write-zeroes.
    pub discard: bool,
    /// Offer `VIRTIO_BLK_F_WRITE_ZEROES` (writable disks only).
    pub write_zeroes: bool,
    /// Flush after every write and write-zeroes before completing it
    /// (cache=writethrough): the guest never has unflushed data.
    pub write_through: bool,
    /// Threads that run the requests of a batch concurrently (started on
    /// the first batch of more than one request); 0 runs every request on
    /// the notifying thread, one after the other.
    pub io_threads: usize,
}

impl Default for BlockOptions {
    fn default() -> Self {
        BlockOptions {
            serial: String::new(),
            discard: true,
            write_zeroes: true,
            write_through: false,
            io_threads: DEFAULT_IO_THREADS,
        }
    }
}

/// Requests of one batch on the host at once, at most.
pub const DEFAULT_IO_THREADS: usize = 8;

/// The virtio-blk device.
pub struct Block {
    executor: Arc<Executor>,
    limits: DiskLimits,
    features: u64,
    config: Vec<u8>,
    requests: RequestQueue,
    workers: IoWorkers,
    /// For requests run on the notifying thread.
    bounce: IoBuffer,
    /// Batches run on the I/O threads so far (counted up to
    /// `HUGE_PAGE_AFTER_BATCHES`, then the buffers are on a huge page).
    batches: u32,
    log: GuestErrorLog,
    /// The disk was closed at the VM's end (`VirtioDevice::close`).
    closed: bool,
    /// The disk as the executor reaches it, for live migration (`Self::migration_disk`).
    tracked: Weak<DirtyTracked>,
}

use counters::Accounted;
pub use counters::{BlockCounters, BlockCounts};

/// What runs a parsed request, on any thread.
struct Executor {
    disk: Arc<dyn SharedDisk>,
    counters: Arc<BlockCounters>,
    serial: [u8; 20],
    write_through: bool,
    /// Failed requests: the image's fault or the host's, but the guest can
    /// repeat them (every write on a full host disk fails).
    failures: LogLimit,
}

impl Block {
    /// A device on a backend that serves one request at a time: requests
    /// run on the notifying thread (`io_threads` is not used: threads
    /// would only queue on the backend's lock).
    pub fn new(disk: Box<dyn DiskBackend>, options: BlockOptions) -> Block {
        let options = BlockOptions {
            io_threads: 0,
            ..options
        };
        Block::shared(Arc::new(SerializedDisk::new(disk)), options)
    }

    /// A device on a disk that serves several requests at once (such as a
    /// [`::block::ConcurrentDisk`]).
    pub fn shared(disk: Arc<dyn SharedDisk>, options: BlockOptions) -> Block {
        // Every request goes through the dirty log a live migration may turn on.
        let tracked = Arc::new(DirtyTracked::new(disk));
        let disk: Arc<dyn SharedDisk> = tracked.clone();
        let read_only = disk.read_only();
        let limits = DiskLimits {
            capacity: disk.size() / SECTOR_SIZE,
            read_only,
            discard: options.discard && !read_only,
            write_zeroes: options.write_zeroes && !read_only,
            max_segments: MAX_SEGMENTS,
            max_segment_sectors: MAX_SEGMENT_SECTORS,
            max_data_buffers: SEG_MAX,
        };
        let mut features = feature_bit(VIRTIO_F_VERSION_1)
            | feature_bit(VIRTIO_RING_F_INDIRECT_DESC)
            | feature_bit(VIRTIO_BLK_F_FLUSH)
            | feature_bit(VIRTIO_BLK_F_SEG_MAX)
            | feature_bit(VIRTIO_BLK_F_BLK_SIZE);
        if read_only {
            features |= feature_bit(VIRTIO_BLK_F_RO);
        }
        if limits.discard {
            features |= feature_bit(VIRTIO_BLK_F_DISCARD);
        }
        if limits.write_zeroes {
            features |= feature_bit(VIRTIO_BLK_F_WRITE_ZEROES);
        }
        // One bounce buffer per I/O thread and one for the notifying
        // thread, from one mapping. With I/O threads (cache=none and
        // writethrough disks, where host I/O has latency) it becomes one
        // huge page, so that each request buffer is physically contiguous,
        // once the guest has kept requests in flight for a while
        // (`HUGE_PAGE_AFTER_BATCHES`): a disk that sees little I/O keeps
        // the few small pages it touched instead of 2 MiB.
        let pages = if options.io_threads > 0 {
            Pages::HugeOnDemand
        } else {
            Pages::Small
        };
        let mut buffers = bounce_buffers(options.io_threads + 1, pages);
        let bounce = buffers.swap_remove(0);
        Block {
            executor: Arc::new(Executor {
                counters: Arc::new(BlockCounters::new(limits.capacity * SECTOR_SIZE)),
                disk,
                serial: request::device_id_bytes(&options.serial),
                write_through: options.write_through,
                failures: LogLimit::new(),
            }),
            config: config_space(&limits),
            limits,
            features,
            requests: RequestQueue::default(),
            workers: IoWorkers::new(options.io_threads, buffers),
            bounce,
            batches: 0,
            log: GuestErrorLog::default(),
            closed: false,
            tracked: Arc::downgrade(&tracked),
        }
    }

    /// Disk size in sectors, as the guest sees it.
    pub fn capacity(&self) -> u64 {
        self.limits.capacity
    }

    /// The disk with its dirty log, for a live migration's block copy: the source reads
    /// it and takes what the guest wrote meanwhile, the target writes into it before
    /// its VM runs. Weak: the disk closes with the device (at the VM's end) all the same.
    pub fn migration_disk(&self) -> Weak<DirtyTracked> {
        self.tracked.clone()
    }

    /// The device's request counters, live (for `GetDomainStats`).
    pub fn counters(&self) -> Arc<BlockCounters> {
        self.executor.counters.clone()
    }

    /// Checks one chain. A refused request is answered here (its used
    /// length returned as `Err`); an accepted one is returned to be run.
    fn parse_chain(
        &mut self,
        chain: Result<&ValidatedChain, &ChainError>,
        mem: &GuestMemoryMmap,
    ) -> Result<Request, u32> {
        let chain = chain.map_err(|e| {
            guest_error!(self.log, "virtio-blk: bad descriptor chain: {e}");
            0u32
        })?;
        request::parse(chain, mem, &self.limits).map_err(|refused| {
            guest_error!(self.log, "virtio-blk: request refused: {}", refused.error);
            match refused.status {
                Some(at) => write_status(mem, at, refused.error.status(), 0),
                None => 0,
            }
        })
    }

    /// Runs the chains of one notification; returns their used lengths.
    fn handle_batch(&mut self, chains: &[PoppedChain], mem: &GuestMemoryMmap) -> Vec<u32> {
        let mut used = vec![0u32; chains.len()];
        // Accepted requests, with their place in the batch.
        let mut run: Vec<(usize, Request)> = Vec::new();
        for (i, popped) in chains.iter().enumerate() {
            match self.parse_chain(popped.chain.as_ref(), mem) {
                Ok(req) => {
                    // A flush covers the writes completed before it: run
                    // what precedes it first, then the flush alone.
                    if matches!(req.kind, RequestKind::Flush) {
                        self.run_concurrently(std::mem::take(&mut run), mem, &mut used);
                        self.run_concurrently(vec![(i, req)], mem, &mut used);
                    } else {
                        run.push((i, req));
                    }
                }
                Err(len) => used[i] = len,
            }
        }
        self.run_concurrently(run, mem, &mut used);
        used
    }

    /// Runs `requests` and waits for all of them: a lone one here, more on
    /// the I/O threads.
    fn run_concurrently(
        &mut self,
        requests: Vec<(usize, Request)>,
        mem: &GuestMemoryMmap,
        used: &mut [u32],
    ) {
        if requests.len() > 1 {
            self.batches = self.batches.saturating_add(1);
            if self.batches == HUGE_PAGE_AFTER_BATCHES
                && let Err(e) = self.bounce.make_huge()
            {
                tracing::debug!("virtio-blk: bounce buffers stay on small pages: {e}");
            }
            let bounce = self.bounce.as_mut_slice();
            self.workers
                .run(requests, &self.executor, mem, used, bounce);
            return;
        }
        for (i, req) in requests {
            used[i] = self.executor.run(&req, mem, self.bounce.as_mut_slice());
        }
    }
}

/// What a device holds once its disk is closed: every request fails (none
/// comes: the VM has ended).
struct ClosedDisk {
    size: u64,
    read_only: bool,
}

impl ClosedDisk {
    fn closed<T>() -> Result<T, DiskError> {
        Err(DiskError::Io(std::io::Error::other(
            "the disk is closed: the VM has ended",
        )))
    }
}

impl SharedDisk for ClosedDisk {
    fn size(&self) -> u64 {
        self.size
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn read_at(&self, _: &mut [u8], _: u64) -> Result<(), DiskError> {
        Self::closed()
    }
    fn write_at(&self, _: &[u8], _: u64) -> Result<(), DiskError> {
        Self::closed()
    }
    fn flush(&self) -> Result<(), DiskError> {
        Self::closed()
    }
    fn discard(&self, _: u64, _: u64) -> Result<(), DiskError> {
        Self::closed()
    }
    fn write_zeroes(&self, _: u64, _: u64, _: bool) -> Result<(), DiskError> {
        Self::closed()
    }
}

/// `count` bounce buffers of [`CHUNK`] bytes, page aligned so that O_DIRECT
/// requests from them need no second copy in the disk layer. Zeroed
/// mappings: small pages become resident only when used; a huge page
/// (2 MiB, all the buffers) with the first request. Running out of memory
/// here ends the process, as any allocation does.
fn bounce_buffers(count: usize, pages: Pages) -> Vec<IoBuffer> {
    ::block::io_buffers(count, CHUNK, pages).unwrap_or_else(|e| {
        tracing::error!("virtio-blk: cannot map {count} bounce buffers: {e}");
        let size = count.saturating_mul(CHUNK).max(CHUNK);
        std::alloc::handle_alloc_error(
            std::alloc::Layout::from_size_align(size, 4096)
                .unwrap_or(std::alloc::Layout::new::<[u8; CHUNK]>()),
        )
    })
}

/// What a request counts as in the device's statistics.
fn accounted(kind: &RequestKind) -> Accounted {
    let bytes = |data: &[Buffer]| data.iter().map(|b| u64::from(b.len)).sum();
    match kind {
        RequestKind::Read { data, .. } => Accounted::Read(bytes(data)),
        RequestKind::Write { data, .. } => Accounted::Write(bytes(data)),
        RequestKind::WriteZeroes { segments } => Accounted::Write(
            segments
                .iter()
                .map(|s| u64::from(s.sectors) * SECTOR_SIZE)
                .sum(),
        ),
        RequestKind::Flush => Accounted::Flush,
        RequestKind::GetId { .. } | RequestKind::Discard { .. } => Accounted::Uncounted,
    }
}

impl Executor {
    /// Runs one request; returns the used length (data and status bytes
    /// written into the chain).
    fn run(&self, req: &Request, mem: &GuestMemoryMmap, bounce: &mut [u8]) -> u32 {
        let started = Instant::now();
        let (status, written) = self.execute(req, mem, bounce);
        self.counters.record(
            accounted(&req.kind),
            status == const { int_cast::u8_of_u32(VIRTIO_BLK_S_OK) },
            started.elapsed(),
        );
        write_status(mem, req.status, status, written)
    }

    /// Returns the status and the data bytes written into guest memory.
    fn execute(&self, req: &Request, mem: &GuestMemoryMmap, bounce: &mut [u8]) -> (u8, u32) {
        let result = match &req.kind {
            RequestKind::Read { sector, data } => self.read(*sector, data, mem, bounce),
            RequestKind::Write { sector, data } => {
                self.write(*sector, data, mem, bounce).map(|()| 0)
            }
            RequestKind::Flush => self.disk.flush().map(|()| 0).map_err(|e| (e, 0)),
            RequestKind::GetId { data } => Ok(write_buffers(mem, data, &self.serial)),
            RequestKind::Discard { segments } => {
                self.for_each_segment(segments, |disk, off, len, _| disk.discard(off, len))
            }
            RequestKind::WriteZeroes { segments } => self
                .for_each_segment(segments, |disk, off, len, unmap| {
                    disk.write_zeroes(off, len, unmap)
                }),
        };
        let writes = matches!(
            req.kind,
            RequestKind::Write { .. } | RequestKind::WriteZeroes { .. }
        );
        let result = match result {
            Ok(written) if writes && self.write_through => {
                self.disk.flush().map(|()| written).map_err(|e| (e, 0))
            }
            other => other,
        };
        match result {
            Ok(written) => (const { int_cast::u8_of_u32(VIRTIO_BLK_S_OK) }, written),
            Err((e, written)) => {
                if let Some(suppressed) = self.failures.admit() {
                    tracing::warn!(suppressed, "virtio-blk: disk request failed: {e}");
                }
                let status = match e {
                    DiskError::Unsupported(_) => const { int_cast::u8_of_u32(VIRTIO_BLK_S_UNSUPP) },
                    _ => const { int_cast::u8_of_u32(VIRTIO_BLK_S_IOERR) },
                };
                (status, written)
            }
        }
    }

    /// Disk to guest, chunk by chunk. On error, the bytes already copied.
    fn read(
        &self,
        sector: u64,
        data: &[Buffer],
        mem: &GuestMemoryMmap,
        bounce: &mut [u8],
    ) -> Result<u32, (DiskError, u32)> {
        let mut offset = sector * SECTOR_SIZE;
        let mut written: u32 = 0;
        for b in data {
            let mut done: u32 = 0;
            while done < b.len {
                let step = (b.len - done).min(CHUNK_U32);
                let n = u64_to_usize(u64::from(step));
                self.disk
                    .read_at(&mut bounce[..n], offset)
                    .map_err(|e| (e, written))?;
                // Inside a buffer the chain check proved does not wrap.
                let to = b.addr.unchecked_add(u64::from(done));
                mem.write_slice(&bounce[..n], to)
                    .map_err(|e| (DiskError::Io(std::io::Error::other(e)), written))?;
                // Sums are bounded by the chain's total length, which
                // virtio-queue keeps within a u32.
                done += step;
                written = written.saturating_add(step);
                offset += u64::from(step);
            }
        }
        Ok(written)
    }

    /// Guest to disk, chunk by chunk.
    fn write(
        &self,
        sector: u64,
        data: &[Buffer],
        mem: &GuestMemoryMmap,
        bounce: &mut [u8],
    ) -> Result<(), (DiskError, u32)> {
        let mut offset = sector * SECTOR_SIZE;
        for b in data {
            let mut done: u32 = 0;
            while done < b.len {
                let step = (b.len - done).min(CHUNK_U32);
                let n = u64_to_usize(u64::from(step));
                // Inside a buffer the chain check proved does not wrap.
                let from = b.addr.unchecked_add(u64::from(done));
                mem.read_slice(&mut bounce[..n], from)
                    .map_err(|e| (DiskError::Io(std::io::Error::other(e)), 0))?;
                self.disk
                    .write_at(&bounce[..n], offset)
                    .map_err(|e| (e, 0))?;
                done += step;
                offset += u64::from(step);
            }
        }
        Ok(())
    }

    fn for_each_segment(
        &self,
        segments: &[Segment],
        mut op: impl FnMut(&dyn SharedDisk, u64, u64, bool) -> Result<(), DiskError>,
    ) -> Result<u32, (DiskError, u32)> {
        for s in segments {
            // Bounds-checked against the capacity in `request`, so the
            // products cannot overflow.
            op(
                self.disk.as_ref(),
                s.sector * SECTOR_SIZE,
                u64::from(s.sectors) * SECTOR_SIZE,
                s.unmap,
            )
            .map_err(|e| (e, 0))?;
        }
        Ok(0)
    }
}

/// Writes the status byte; returns the used length (data plus status).
fn write_status(
    mem: &GuestMemoryMmap,
    at: vm_memory::GuestAddress,
    status: u8,
    data_written: u32,
) -> u32 {
    match mem.write_obj(status, at) {
        Ok(()) => data_written.saturating_add(1),
        // Checked inside guest memory during parsing, so not expected.
        Err(e) => {
            tracing::warn!("virtio-blk: cannot write the status byte: {e}");
            data_written
        }
    }
}

/// Copies `bytes` into consecutive buffers; returns how many were written.
fn write_buffers(mem: &GuestMemoryMmap, buffers: &[Buffer], bytes: &[u8]) -> u32 {
    let mut rest = bytes;
    let mut written = 0u32;
    for b in buffers {
        if rest.is_empty() {
            break;
        }
        let step = u32::try_from(rest.len()).unwrap_or(u32::MAX).min(b.len);
        let n = u64_to_usize(u64::from(step));
        if mem.write_slice(&rest[..n], b.addr).is_err() {
            break;
        }
        rest = &rest[n..];
        written += step;
    }
    written
}

/// `struct virtio_blk_config` (virtio 1.2 §5.2.4), little endian. Fields we
/// do not offer stay zero.
fn config_space(limits: &DiskLimits) -> Vec<u8> {
    let mut c = vec![0u8; 60];
    let mut put = |at: usize, bytes: &[u8]| c[at..at + bytes.len()].copy_from_slice(bytes);
    put(0, &limits.capacity.to_le_bytes());
    put(12, &limits.max_data_buffers.to_le_bytes()); // seg_max
    put(
        20,
        &const { int_cast::u32_of_u64(SECTOR_SIZE) }.to_le_bytes(),
    ); // blk_size
    if limits.discard {
        put(36, &limits.max_segment_sectors.to_le_bytes()); // max_discard_sectors
        put(40, &limits.max_segments.to_le_bytes()); // max_discard_seg
        put(44, &1u32.to_le_bytes()); // discard_sector_alignment
    }
    if limits.write_zeroes {
        put(48, &limits.max_segment_sectors.to_le_bytes()); // max_write_zeroes_sectors
        put(52, &limits.max_segments.to_le_bytes()); // max_write_zeroes_seg
        put(56, &[u8::from(limits.discard)]); // write_zeroes_may_unmap
    }
    c
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_BLOCK
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        self.features
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        read_config_bytes(&self.config, offset, data);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Only `writeback` is writable, and only with VIRTIO_BLK_F_CONFIG_WCE,
        // which is not offered.
        guest_error!(
            self.log,
            offset,
            len = data.len(),
            "virtio-blk: config space is read-only"
        );
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.workers.set_sandbox(ctx.sandbox.clone());
        self.requests.activate(ctx)
    }

    fn reset(&mut self) {
        // No request is in flight between notifications (the device thread
        // holds the device while it runs a batch); the idle I/O threads go
        // too.
        self.requests.reset();
        self.workers.stop();
    }

    /// Nothing is in flight while the VM is paused (a batch completes before the
    /// device's thread lets go of the device), and the disk's contents move apart
    /// (`Self::migration_disk`): the queue's position is all there is.
    fn queue_positions(&self) -> Option<Vec<(u16, u16)>> {
        Some(self.requests.positions())
    }

    fn close(&mut self) {
        if std::mem::replace(&mut self.closed, true) {
            return;
        }
        // Batches complete before the device thread lets go of the device,
        // so no request is in flight; the I/O threads end here.
        self.workers.stop();
        let closed = Arc::new(Executor {
            disk: Arc::new(ClosedDisk {
                size: self.executor.disk.size(),
                read_only: self.executor.disk.read_only(),
            }),
            counters: self.executor.counters.clone(),
            serial: self.executor.serial,
            write_through: self.executor.write_through,
            failures: LogLimit::new(),
        });
        let executor = std::mem::replace(&mut self.executor, closed);
        // The I/O threads' jobs are gone with them: this is the last
        // reference, and the disk's too (the VMM gives it to this device only).
        let Ok(Executor { disk, .. }) = Arc::try_unwrap(executor) else {
            tracing::error!("virtio-blk: a request still holds the disk at the end");
            return;
        };
        if let Err(e) = disk.flush() {
            tracing::error!("virtio-blk: the disk's last flush failed: {e}");
        }
        if Arc::strong_count(&disk) > 1 {
            tracing::error!("virtio-blk: the disk is still shared at the end: not closed");
        }
        // The image closes here (a qcow2 image writes what is left of its
        // metadata), and its locks go with its descriptors.
        drop(disk);
    }

    fn process_queue(&mut self, index: u16) -> Result<(), DeviceError> {
        // The queue is taken out while its chains are handled with `self`.
        let mut requests = std::mem::take(&mut self.requests);
        let result = requests.process_batch(index, |chains, mem| self.handle_batch(chains, mem));
        self.requests = requests;
        result
    }
}

#[cfg(test)]
mod tests;
