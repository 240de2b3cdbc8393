//! What a running VM has done: its devices' counters and its vCPUs' CPU
//! time, read on demand (the launcher's `GetDomainStats`).

use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use virtio_devices::block::BlockCounters;
pub use virtio_devices::block::BlockCounts;
use virtio_devices::net::NetCounters;
pub use virtio_devices::net::NetCounts;

/// Live counters of the VM's devices, in configuration order.
#[derive(Clone, Default)]
pub(crate) struct DeviceCounters {
    pub(crate) disks: Vec<Arc<BlockCounters>>,
    pub(crate) nets: Vec<Arc<NetCounters>>,
}

/// A snapshot of a VM's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmStats {
    /// One per configured disk, in order.
    pub disks: Vec<BlockCounts>,
    /// One per configured network interface, in order.
    pub nets: Vec<NetCounts>,
    /// CPU time of each vCPU thread (user + system); `None` once a thread
    /// has ended or before it started.
    pub vcpu_times: Vec<Option<Duration>>,
}

/// Kernel thread ids of the vCPU threads, recorded by each thread as it
/// starts (0 until then).
pub(crate) type VcpuTids = Arc<[AtomicI32]>;

pub(crate) fn snapshot(devices: &DeviceCounters, tids: &VcpuTids) -> VmStats {
    VmStats {
        disks: devices.disks.iter().map(|c| c.snapshot()).collect(),
        nets: devices.nets.iter().map(|c| c.snapshot()).collect(),
        vcpu_times: tids
            .iter()
            .map(|tid| match tid.load(Ordering::Relaxed) {
                0 => None,
                tid => thread_cpu_time(tid).map(|t| t.user + t.system),
            })
            .collect(),
    }
}

/// User and system CPU time of a process or thread.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTime {
    pub user: Duration,
    pub system: Duration,
}

/// This process's CPU time, all threads together.
pub fn process_cpu_time() -> Option<CpuTime> {
    parse_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)
}

/// CPU time of thread `tid` of this process (`None` if it is gone).
pub(crate) fn thread_cpu_time(tid: i32) -> Option<CpuTime> {
    parse_stat(&std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?)
}

/// `utime` and `stime` (fields 14 and 15, in clock ticks) of a `stat` line.
/// The command name (field 2) may hold spaces and parentheses: fields are
/// counted from the last `)`.
fn parse_stat(stat: &str) -> Option<CpuTime> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|hz| *hz > 0)?;
    let ticks = |t: u64| Duration::from_nanos(t.saturating_mul(1_000_000_000 / hz));
    Some(CpuTime {
        user: ticks(utime),
        system: ticks(stime),
    })
}

/// The calling thread's id, by the system call: glibc's `gettid` wrapper is
/// left an unresolved weak symbol (a null call) in a statically linked build
/// with LTO, so it is not used.
pub(crate) fn current_tid() -> i32 {
    // SAFETY: gettid takes no arguments and cannot fail.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    i32::try_from(tid).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_parse_from_the_last_parenthesis() {
        // SAFETY: sysconf has no preconditions.
        let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
            .expect("CLK_TCK is positive");
        let line = "42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 1 0";
        let t = parse_stat(line).unwrap();
        assert_eq!(t.user, Duration::from_nanos(250 * (1_000_000_000 / hz)));
        assert_eq!(t.system, Duration::from_nanos(75 * (1_000_000_000 / hz)));
        assert_eq!(parse_stat("42 (x) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis"), None);
        assert_eq!(parse_stat("1 (x) S 1 1 1 0 -1 0 0 0 0 0 nan 1 0"), None);
    }

    #[test]
    fn this_thread_and_process_have_cpu_time() {
        // Burn a little CPU so the tick counters move.
        let start = std::time::Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(50) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let tid = current_tid();
        let thread = thread_cpu_time(tid).unwrap();
        let process = process_cpu_time().unwrap();
        assert!(thread.user + thread.system > Duration::ZERO);
        assert!(process.user + process.system >= thread.user + thread.system);
        assert_eq!(thread_cpu_time(i32::MAX), None);
    }
}
