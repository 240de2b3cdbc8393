//! A VMM's resident memory, measured the same way for every VMM: samples of
//! /proc/<pid>/smaps while it runs, until it exits.
//!
//! Guest RAM is the one mapping of exactly the guest's size (anonymous for
//! both `vmm run` and Firecracker); its `Rss` is the guest pages touched so
//! far. Overhead = every other mapping's `Rss`, split into anonymous memory
//! (private: heap, stacks, KVM pages) and file-backed pages (the binary and
//! shared libraries, shared through the page cache; KVM's vCPU mappings,
//! `anon_inode:kvm-vcpu`, count here too).

use std::process::ExitStatus;
use std::time::Duration;

use super::monotonic_ns;

/// Resident memory in KiB.
#[derive(Clone, Copy, Default, Debug)]
pub struct Rss {
    /// Guest RAM pages touched.
    pub guest: u64,
    /// Anonymous memory other than guest RAM.
    pub anon: u64,
    /// File-backed pages.
    pub file: u64,
}

impl Rss {
    /// Everything but guest RAM.
    pub fn overhead(&self) -> u64 {
        self.anon + self.file
    }
}

/// One reading of /proc/<pid>/smaps; `None` once the process is gone.
pub fn sample(pid: u32, guest_mib: u64) -> Option<Rss> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let guest_kib = guest_mib * 1024;
    let mut rss = Rss::default();
    // (is guest RAM, is file-backed) of the current mapping.
    let mut current = (false, false);
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let first = fields.next().unwrap_or("");
        if first.contains('-') && !first.ends_with(':') {
            // A mapping header: address perms offset dev inode [path].
            let inode = fields.nth(3).unwrap_or("0");
            current = (false, inode != "0");
            continue;
        }
        let value = fields.next().and_then(|v| v.parse::<u64>().ok());
        match (first, value) {
            ("Size:", Some(v)) => current.0 = !current.1 && v == guest_kib,
            ("Rss:", Some(v)) => match current {
                (true, _) => rss.guest += v,
                (false, true) => rss.file += v,
                (false, false) => rss.anon += v,
            },
            _ => {}
        }
    }
    (rss.anon + rss.file > 0).then_some(rss)
}

/// How a watched process ended, with its memory over time.
pub struct Watched {
    pub status: ExitStatus,
    /// CLOCK_MONOTONIC (ns) when wait4 saw the exit.
    pub exit_ns: u64,
    /// `ru_maxrss` from wait4 (KiB, guest pages included).
    pub maxrss_kib: u64,
    /// (CLOCK_MONOTONIC ns, reading), every `interval`.
    pub samples: Vec<(u64, Rss)>,
}

impl Watched {
    /// Largest overhead (excluding guest RAM) over the samples.
    pub fn peak_overhead(&self) -> u64 {
        self.samples
            .iter()
            .map(|(_, r)| r.overhead())
            .max()
            .unwrap_or(0)
    }

    /// Largest total (guest RAM included) over the samples.
    pub fn peak_total(&self) -> u64 {
        self.samples
            .iter()
            .map(|(_, r)| r.overhead() + r.guest)
            .max()
            .unwrap_or(0)
    }

    /// The largest of one part over the samples.
    pub fn peak(&self, part: impl Fn(&Rss) -> u64) -> u64 {
        self.samples.iter().map(|(_, r)| part(r)).max().unwrap_or(0)
    }

    /// Median overhead of the samples taken at or after `since_ns` (the
    /// guest running: after its first serial byte); NaN without one.
    pub fn steady_overhead(&self, since_ns: u64) -> f64 {
        let mut v: Vec<u64> = self
            .samples
            .iter()
            .filter(|(t, _)| *t >= since_ns)
            .map(|(_, r)| r.overhead())
            .collect();
        v.sort_unstable();
        v.get(v.len() / 2).map_or(f64::NAN, |&x| x as f64)
    }
}

/// Samples `pid` (a child of this process, not yet reaped) every `interval`
/// until it exits, then reaps it with wait4.
pub fn watch(pid: u32, guest_mib: u64, interval: Duration) -> Watched {
    let raw_pid = libc::pid_t::try_from(pid).expect("a Linux pid fits a pid_t");
    let mut samples = Vec::new();
    // SAFETY: rusage is plain data; all-zero is valid.
    let mut rusage: libc::rusage = unsafe { std::mem::zeroed() };
    let mut status = 0;
    let exit_ns = loop {
        let now = monotonic_ns();
        if let Some(rss) = sample(pid, guest_mib) {
            samples.push((now, rss));
        }
        // SAFETY: waiting for our own child; rusage and status are valid out-pointers.
        let rc = unsafe { libc::wait4(raw_pid, &mut status, libc::WNOHANG, &mut rusage) };
        if rc == raw_pid {
            break monotonic_ns();
        }
        assert!(rc == 0, "wait4 failed: {}", std::io::Error::last_os_error());
        std::thread::sleep(interval);
    };
    Watched {
        status: std::os::unix::process::ExitStatusExt::from_raw(status),
        exit_ns,
        maxrss_kib: u64::try_from(rusage.ru_maxrss).expect("maxrss is not negative"),
        samples,
    }
}
