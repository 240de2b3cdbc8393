//! Live migration: moving a running VM to another VMM over a byte stream, as QEMU's
//! pre-copy does.
//!
//! The source turns on KVM's dirty-page log, sends all of guest memory while the guest
//! runs, then in rounds the pages the guest wrote meanwhile, until what is left could
//! be sent within the downtime allowed (`MigrationOptions::max_downtime`). Then it
//! pauses the vCPUs, sends the last dirty pages, the VM-wide state (interrupt
//! controllers, PIT, clock, devices) and every vCPU's state, and waits for the target's
//! answer. If the target runs the VM, the source's VM ends as [`VmExit::Migrated`];
//! if anything fails before that (the stream, the target, a cancellation, the
//! completion timeout) the source's VM goes on running as if nothing had happened.
//!
//! The target builds the same VM (same configuration) without loading a kernel, writes
//! the pages it receives, checks the stream as untrusted input (`wire`), restores the
//! state into its vCPUs and devices while none runs, and only then lets them run.
//!
//! Writable disks are copied in the same rounds (`disks`: the block copy KubeVirt
//! does for local disks); read-only ones stay where they are.
//!
//! Limits: the clock moves as an offset from the host's, which holds between two VMMs
//! on one host (or hosts with synchronised clocks); a writable disk shared by both
//! sides cannot move (see `disks`).

pub(crate) mod disks;
pub(crate) mod pages;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvm_ioctls::VmFd;
use virtio_devices::GuestMemoryMmap;

use crate::kvm::vcpu_state::VcpuState;
use crate::kvm::vm_state::{self, VmState};
use crate::lifecycle::{Control, VmExit};
use crate::wire::{self, Decoder, Encoder, FormatError, Kind, Layout, Reply, WireError};

/// QEMU's default maximum downtime (`downtime-limit`), which KubeVirt keeps.
pub const DEFAULT_MAX_DOWNTIME: Duration = Duration::from_millis(300);
/// KubeVirt's default `completionTimeoutPerGiB` (seconds per GiB of guest memory).
pub const DEFAULT_COMPLETION_TIMEOUT_PER_GIB: u64 = 150;
/// How long the vCPUs may take to stop, and to give their state.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// How a migration may go.
#[derive(Clone, Debug)]
pub struct MigrationOptions {
    /// Bytes per second the stream may carry while the guest runs (KubeVirt's
    /// `bandwidthPerMigration`); `None`: as fast as it goes. The final stop-and-copy is
    /// not limited (as QEMU's is not): the guest is paused then.
    pub bandwidth: Option<u64>,
    /// How long the migration may take before it is abandoned (KubeVirt's
    /// `completionTimeoutPerGiB` × the guest's memory); the VM stays on the source.
    pub completion_timeout: Duration,
    /// The stop-and-copy starts once what is left to send would take at most this long
    /// at the speed of the last round.
    pub max_downtime: Duration,
    /// The disks (indexes into the configuration's) both sides open as the same image (a
    /// shared volume): not copied. A writable one makes the VM unmovable (its image lock
    /// would have to pass from source to target, which is not built). Every other
    /// writable disk is copied (`disks`).
    pub shared_disks: Vec<usize>,
}

impl MigrationOptions {
    /// KubeVirt's defaults for a guest of `memory_bytes`: no bandwidth limit, QEMU's
    /// 300 ms downtime, and 150 s per "GiB", which v1.9.0's launcher counts as started
    /// 10^9 bytes (`resource.Quantity::ScaledValue(Giga)`, rounded up; at least one).
    pub fn kubevirt_defaults(memory_bytes: u64) -> Self {
        let giga = memory_bytes.div_ceil(1_000_000_000).max(1);
        MigrationOptions {
            bandwidth: None,
            completion_timeout: Duration::from_secs(DEFAULT_COMPLETION_TIMEOUT_PER_GIB * giga),
            max_downtime: DEFAULT_MAX_DOWNTIME,
            shared_disks: Vec::new(),
        }
    }
}

/// Watching and cancelling a migration from another thread.
#[derive(Debug, Default)]
pub struct MigrationProgress {
    cancelled: AtomicBool,
    rounds: AtomicU64,
    bytes: AtomicU64,
    remaining_pages: AtomicU64,
    remaining_disk_bytes: AtomicU64,
}

impl MigrationProgress {
    /// Asks the migration to stop at its next frame; the VM stays on the source.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }
    /// Memory rounds done (the first full copy is round 1).
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
    /// Bytes sent so far.
    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
    /// Dirty pages found at the end of the last round.
    pub fn remaining_pages(&self) -> u64 {
        self.remaining_pages.load(Ordering::Relaxed)
    }
    /// Bytes of copied disks written again during the last round.
    pub fn remaining_disk_bytes(&self) -> u64 {
        self.remaining_disk_bytes.load(Ordering::Relaxed)
    }
    /// Whether the migration was asked to stop.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

/// How a migration went (the source's view).
#[derive(Clone, Debug)]
pub struct MigrationReport {
    /// From the start to the target's answer.
    pub total: Duration,
    /// From the moment every source vCPU had stopped to the moment the target let its
    /// vCPUs run (both on this host's monotonic clock; on two hosts it would mix two
    /// clocks).
    pub downtime: Duration,
    /// Memory rounds, the full copy included.
    pub rounds: u64,
    /// Pages sent with their contents, and pages sent as zeros.
    pub pages: u64,
    pub zero_pages: u64,
    /// Bytes on the stream.
    pub bytes: u64,
    /// Pages sent while the VM was paused.
    pub final_pages: u64,
    /// Bytes of disk frames on the stream (the block copy), included in `bytes`.
    pub disk_bytes: u64,
}

/// Why a migration failed. The source's VM keeps running unless it had already ended.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    #[error("this VM cannot be migrated: {0}")]
    NotMigratable(String),
    #[error(transparent)]
    Stream(#[from] WireError),
    #[error("the two VMs differ: {0}")]
    Incompatible(String),
    #[error("the migration was cancelled")]
    Cancelled,
    #[error(
        "the migration did not complete within {timeout:?}: {remaining_pages} pages were still dirty after {rounds} rounds"
    )]
    Timeout {
        timeout: Duration,
        rounds: u64,
        remaining_pages: u64,
    },
    #[error("the source gave the migration up")]
    AbortedBySource,
    #[error("the target could not take the VM: {0}")]
    TargetFailed(String),
    #[error("guest memory: {0}")]
    Memory(String),
    #[error("VM state: {0}")]
    State(String),
    #[error("block copy: {0}")]
    Disk(String),
    #[error("the VM ended during the migration: {0}")]
    Ended(VmExit),
    #[error("a migration of this VM is running already")]
    InProgress,
    /// The state went out but the target's answer did not come back: it may run the
    /// VM. The source's VM stays paused; whoever runs the migration decides (resume it
    /// only once the target is known not to run it).
    #[error("the target's answer was lost ({0}): it may run the VM, which stays paused here")]
    OutcomeUnknown(String),
}

impl From<FormatError> for MigrationError {
    fn from(e: FormatError) -> Self {
        MigrationError::Stream(WireError::Format(e))
    }
}

/// What the source's side works on: the parts of a running VM.
pub(crate) struct Source<'a> {
    pub(crate) vm: &'a VmFd,
    pub(crate) memory: &'a GuestMemoryMmap,
    pub(crate) control: &'a Control,
    pub(crate) layout: Layout,
    /// Writes the devices' state (the VM and its devices are paused).
    pub(crate) save_devices: &'a dyn Fn(&mut Encoder) -> Result<(), String>,
    /// Pauses (`true`) or resumes the devices' own threads (after the vCPUs).
    pub(crate) pause_devices: &'a dyn Fn(bool),
    /// The disks, in the configuration's order, and which of them are shared (the
    /// other writable ones are copied).
    pub(crate) disks: &'a disks::DiskHandles,
    pub(crate) shared_disks: &'a [usize],
    /// The VM was paused before the migration: a failed one leaves it paused.
    pub(crate) was_paused: bool,
}

/// Sends the VM to the other end of `stream`. See the module's doc.
pub(crate) fn send<S: Read + Write>(
    source: &Source,
    stream: &mut S,
    options: &MigrationOptions,
    progress: &MigrationProgress,
) -> Result<MigrationReport, MigrationError> {
    let start = Instant::now();
    if let Some(exit) = source.control.exit() {
        return Err(MigrationError::Ended(exit));
    }
    wire::write_header(stream, &source.layout)?;
    wire::write_frame(stream, Kind::Disks, &disks::describe(source.disks)?)?;
    vm_state::log_dirty_pages(source.vm, source.memory, true).map_err(MigrationError::State)?;
    vm_state::clear_vmm_dirty_pages(source.memory);
    let result = send_logged(source, stream, options, progress, start);
    let _ = vm_state::log_dirty_pages(source.vm, source.memory, false);
    disks::stop(source.disks);
    result
}

/// [`send`] once the dirty logs are on (the caller turns them off).
fn send_logged<S: Read + Write>(
    source: &Source,
    stream: &mut S,
    options: &MigrationOptions,
    progress: &MigrationProgress,
    start: Instant,
) -> Result<MigrationReport, MigrationError> {
    let live = disks::start(source.disks, source.shared_disks)
        .and_then(|disk_ranges| pre_copy(source, stream, options, progress, start, disk_ranges));
    let dirty = match live {
        Ok(dirty) => dirty,
        Err(e) => {
            // Best effort: the target learns why; the source never stopped.
            let _ = wire::write_frame(stream, Kind::Abort, &[]);
            return Err(e);
        }
    };
    // Stop and copy.
    let resume = || {
        if !source.was_paused {
            (source.pause_devices)(false);
            source.control.resume();
        }
    };
    source.control.request_pause();
    if !source.control.wait_paused(PAUSE_TIMEOUT) {
        resume();
        let _ = wire::write_frame(stream, Kind::Abort, &[]);
        return Err(match source.control.exit() {
            Some(exit) => MigrationError::Ended(exit),
            None => {
                MigrationError::State(format!("the vCPUs did not stop within {PAUSE_TIMEOUT:?}"))
            }
        });
    }
    let paused_at = monotonic_ns();
    // Their last writes to guest memory land before the last dirty pages are taken.
    if !source.was_paused {
        (source.pause_devices)(true);
    }
    let handed_over = stop_and_copy(source, stream, dirty.pages, &dirty.disk_ranges);
    let final_sent = match handed_over {
        Ok(sent) => sent,
        Err(e) => {
            // `Complete` did not go out: the target cannot run the VM.
            let _ = wire::write_frame(stream, Kind::Abort, &[]);
            resume();
            return Err(e);
        }
    };
    match wire::read_reply(stream) {
        Ok(Reply::Running { released_at_ns }) => {
            source.control.finish(VmExit::Migrated);
            let mut sent = dirty.sent;
            sent += final_sent;
            Ok(MigrationReport {
                total: start.elapsed(),
                downtime: Duration::from_nanos(released_at_ns.saturating_sub(paused_at)),
                rounds: dirty.rounds,
                pages: sent.pages,
                zero_pages: sent.zero_pages,
                bytes: sent.bytes,
                final_pages: final_sent.pages + final_sent.zero_pages,
                disk_bytes: sent.disk_bytes,
            })
        }
        // The target says it does not run the VM (nothing of it ran there).
        Ok(Reply::Failed(why)) => {
            resume();
            Err(MigrationError::TargetFailed(why))
        }
        // It may run it: two copies must never run, so this one stays paused.
        Err(e) => Err(MigrationError::OutcomeUnknown(e.to_string())),
    }
}

/// What the live rounds leave for the stop-and-copy.
struct PreCopied {
    /// Pages dirtied in the last round, not sent yet.
    pages: Vec<u64>,
    /// Disk chunks written in the last round, not sent yet.
    disk_ranges: Vec<disks::DiskRange>,
    rounds: u64,
    sent: pages::Sent,
}

/// The live rounds: everything, then what the guest dirtied, until the rest is small
/// enough for the downtime allowed.
fn pre_copy<S: Write>(
    source: &Source,
    stream: &mut S,
    options: &MigrationOptions,
    progress: &MigrationProgress,
    start: Instant,
    mut disk_ranges: Vec<disks::DiskRange>,
) -> Result<PreCopied, MigrationError> {
    let mut total = pages::Sent::default();
    let mut to_send = pages::all_pages(source.memory);
    let mut rounds = 0u64;
    loop {
        let round_start = Instant::now();
        let mut after_frame = |bytes: u64| {
            progress.bytes.fetch_add(bytes, Ordering::Relaxed);
            if progress.is_cancelled() {
                return Err(MigrationError::Cancelled);
            }
            if let Some(exit) = source.control.exit() {
                return Err(MigrationError::Ended(exit));
            }
            if let Some(limit) = options.bandwidth.filter(|&l| l > 0) {
                // The whole migration so far at most at `limit`.
                let due = Duration::from_secs_f64(progress.bytes() as f64 / limit as f64);
                if let Some(ahead) = due.checked_sub(start.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
            if start.elapsed() > options.completion_timeout {
                return Err(MigrationError::Timeout {
                    timeout: options.completion_timeout,
                    rounds: progress.rounds(),
                    remaining_pages: progress.remaining_pages(),
                });
            }
            Ok(())
        };
        // The disks first (as QEMU's block migration does its bulk phase before
        // memory): what the guest writes to them meanwhile is in their dirty logs.
        let disk_bytes = disks::send(stream, source.disks, &disk_ranges, &mut after_frame)?;
        let mut sent = pages::send(stream, source.memory, &to_send, &mut after_frame)?;
        sent.bytes += disk_bytes;
        sent.disk_bytes += disk_bytes;
        stream.flush().map_err(WireError::Io)?;
        total += sent;
        rounds += 1;
        progress.rounds.store(rounds, Ordering::Relaxed);
        let elapsed = round_start.elapsed().max(Duration::from_micros(1));
        to_send =
            vm_state::take_dirty_pages(source.vm, source.memory).map_err(MigrationError::State)?;
        disk_ranges = disks::take_dirty(source.disks, source.shared_disks)?;
        progress
            .remaining_pages
            .store(to_send.len() as u64, Ordering::Relaxed);
        progress
            .remaining_disk_bytes
            .store(disks::bytes(&disk_ranges), Ordering::Relaxed);
        // What the rest would take at this round's speed (a round of zero pages only
        // says little about speed: at least a page's worth per page then).
        let per_byte = elapsed.as_secs_f64() / sent.bytes.max(1) as f64;
        let left_bytes =
            to_send.len() as f64 * (wire::PAGE as f64 + 16.0) + disks::bytes(&disk_ranges) as f64;
        if Duration::from_secs_f64(left_bytes * per_byte) <= options.max_downtime {
            return Ok(PreCopied {
                pages: to_send,
                disk_ranges,
                rounds,
                sent: total,
            });
        }
        after_frame(0)?;
    }
}

/// With the vCPUs stopped: the last pages and the whole state, then `Complete`.
fn stop_and_copy<S: Write>(
    source: &Source,
    stream: &mut S,
    mut dirty: Vec<u64>,
    disk_ranges: &[disks::DiskRange],
) -> Result<pages::Sent, MigrationError> {
    dirty.extend(
        vm_state::take_dirty_pages(source.vm, source.memory).map_err(MigrationError::State)?,
    );
    dirty.sort_unstable();
    dirty.dedup();
    let mut sent = pages::send(stream, source.memory, &dirty, &mut |_| Ok(()))?;
    // The device threads are paused: every write the guest made is in the logs. A
    // chunk still waiting from the last round and written again goes twice (in order).
    let mut disk_ranges = disk_ranges.to_vec();
    disk_ranges.extend(disks::take_dirty(source.disks, source.shared_disks)?);
    let disk_bytes = disks::send(stream, source.disks, &disk_ranges, &mut |_| Ok(()))?;
    sent.bytes += disk_bytes;
    sent.disk_bytes += disk_bytes;
    // The vCPUs (their TSCs) and the kvmclock are read back to back, the clock last.
    let vcpus = source
        .control
        .save_vcpus(usize::from(source.layout.vcpus), PAUSE_TIMEOUT)
        .map_err(MigrationError::State)?;
    let mut platform = Encoder::default();
    vm_state::save(source.vm, &mut platform).map_err(MigrationError::State)?;
    (source.save_devices)(&mut platform).map_err(MigrationError::State)?;
    wire::write_frame(stream, Kind::Platform, &platform.0)?;
    for (index, state) in vcpus.iter().enumerate() {
        let mut frame = Encoder::default();
        frame.u8(u8::try_from(index).unwrap_or(u8::MAX));
        frame.bytes(state);
        wire::write_frame(stream, Kind::Vcpu, &frame.0)?;
    }
    if source.was_paused {
        wire::write_frame(stream, Kind::Paused, &[])?;
    }
    wire::write_frame(stream, Kind::Complete, &[])?;
    stream.flush().map_err(WireError::Io)?;
    Ok(sent)
}

/// What the target received: memory is written already; the state waits to be restored.
pub(crate) struct Incoming {
    pub(crate) vm_state: VmState,
    /// The devices' part of the platform frame (decoded by the devices themselves).
    pub(crate) devices: Vec<u8>,
    pub(crate) vcpus: Vec<VcpuState>,
    /// The VM was paused on the source by its owner: it starts paused here.
    pub(crate) paused: bool,
}

/// Reads the stream's header and checks that the source's VM is built like this one
/// (before this one is built: a stranger on the socket costs nothing).
pub(crate) fn receive_header<S: Read>(
    stream: &mut S,
    layout: &Layout,
) -> Result<(), MigrationError> {
    let theirs = wire::read_header(stream)?;
    if &theirs != layout {
        return Err(MigrationError::Incompatible(format!(
            "the source has {} MiB, {} vCPUs, devices [{}]; this VM {} MiB, {} vCPUs, devices [{}]",
            theirs.memory_bytes >> 20,
            theirs.vcpus,
            theirs.devices,
            layout.memory_bytes >> 20,
            layout.vcpus,
            layout.devices
        )));
    }
    Ok(())
}

/// Reads the frames after the header into `memory` until `Complete`, checking each.
pub(crate) fn receive<S: Read>(
    stream: &mut S,
    memory: &GuestMemoryMmap,
    layout: &Layout,
    disk_handles: &disks::DiskHandles,
) -> Result<Incoming, MigrationError> {
    let mut buf = Vec::new();
    let mut disks_checked = false;
    let mut disks_written = vec![false; disk_handles.len()];
    let mut background_flushes = Vec::new();
    let mut platform: Option<(VmState, Vec<u8>)> = None;
    let mut vcpus: Vec<Option<VcpuState>> = (0..layout.vcpus).map(|_| None).collect();
    let mut paused = false;
    loop {
        // A round's memory follows its disk chunks: what they wrote is flushed meanwhile,
        // so that the flush before the VM runs here has only the last chunks left.
        let mut flush_in_background = || {
            if disks_written.iter().any(|w| *w) {
                background_flushes.push(disks::flush_in_background(
                    disk_handles,
                    &std::mem::replace(&mut disks_written, vec![false; disk_handles.len()]),
                ));
            }
        };
        match pages::receive_until_state(stream, memory, &mut buf, &mut flush_in_background)? {
            Kind::Platform => {
                if platform.is_some() {
                    return Err(FormatError::Invalid("a second platform frame".into()).into());
                }
                let mut d = Decoder::new(&buf, "the platform frame");
                let vm = VmState::decode(&mut d)?;
                let devices = d.take(d.remaining())?.to_vec();
                platform = Some((vm, devices));
            }
            Kind::Vcpu => {
                let mut d = Decoder::new(&buf, "a vCPU frame");
                let index = usize::from(d.u8()?);
                let state = VcpuState::decode(&mut d)?;
                d.finish()?;
                match vcpus.get_mut(index) {
                    Some(slot @ None) => *slot = Some(state),
                    Some(Some(_)) => {
                        return Err(FormatError::Invalid(format!("vCPU {index} sent twice")).into());
                    }
                    None => {
                        return Err(FormatError::Invalid(format!(
                            "vCPU {index} of a VM with {} vCPUs",
                            layout.vcpus
                        ))
                        .into());
                    }
                }
            }
            Kind::Paused => paused = true,
            Kind::Disks if !disks_checked => {
                disks::check_description(&buf, disk_handles)?;
                disks_checked = true;
            }
            Kind::Disks => {
                return Err(FormatError::Invalid("a second disks frame".into()).into());
            }
            kind @ (Kind::DiskData | Kind::DiskZeroes) if disks_checked => {
                let index = disks::receive(kind, &buf, disk_handles)?;
                disks_written[index] = true;
            }
            Kind::DiskData | Kind::DiskZeroes => {
                return Err(FormatError::Invalid("disk data before the disks frame".into()).into());
            }
            Kind::Complete => break,
            Kind::Abort => return Err(MigrationError::AbortedBySource),
            Kind::Pages | Kind::ZeroPages => unreachable!("page frames are written above"),
        }
    }
    let Some((vm_state, devices)) = platform else {
        return Err(FormatError::Invalid("complete without the platform's state".into()).into());
    };
    if !disks_checked {
        return Err(FormatError::Invalid("complete without the disks frame".into()).into());
    }
    let vcpus = vcpus
        .into_iter()
        .enumerate()
        .map(|(index, state)| {
            state.ok_or_else(|| FormatError::Invalid(format!("complete without vCPU {index}")))
        })
        .collect::<Result<_, _>>()?;
    // What the guest had flushed on the source is durable here before it runs on.
    for flush in background_flushes {
        flush
            .join()
            .map_err(|_| MigrationError::Disk("a flush panicked".into()))??;
    }
    disks::flush(disk_handles, &disks_written)?;
    Ok(Incoming {
        vm_state,
        devices,
        vcpus,
        paused,
    })
}

/// `CLOCK_MONOTONIC` in nanoseconds (shared by the source and target on one host).
pub(crate) fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec for the kernel to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubevirts_completion_timeout_counts_started_gigabytes() {
        let timeout = |bytes| MigrationOptions::kubevirt_defaults(bytes).completion_timeout;
        assert_eq!(timeout(64 << 20), Duration::from_secs(150));
        assert_eq!(timeout(1_000_000_000), Duration::from_secs(150));
        // 1 GiB is 1.07 GB: two started units, as KubeVirt computes it.
        assert_eq!(timeout(1 << 30), Duration::from_secs(300));
        assert_eq!(timeout(0), Duration::from_secs(150));
    }
}
