//! Rate limit for log lines a guest can trigger at will.
//!
//! Every refused request or register write is logged, but a guest that
//! repeats one in a loop must not fill the host's disk: after the first few,
//! only every power-of-two occurrence is logged (with its count).
//!
//! These are the guest's doing, not faults of the host: they are logged at
//! INFO (a host operator's WARN means the host needs attention) and say so.
//!
//! A failure that may be the host's (a disk request the image file refused, a
//! device that stopped, an ioeventfd KVM refused) but that the guest can repeat
//! at will goes through a [`LogLimit`] instead: the first lines of a burst,
//! then one per interval that says how many were left out, so an operator
//! still sees that it goes on. `tracing` has no rate limit of its own, and the
//! crates that add one (a layer for the whole process) would also thin out
//! the host's own lines; this one is per site.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Lines a [`LogLimit`] lets through at the start of a burst.
pub const LOG_BURST: u32 = 10;
/// After the burst, at most one line per this interval. A burst ends after
/// this long without an occurrence.
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// A rate limit for one log site (shared by the threads that log there).
#[derive(Debug, Default)]
pub struct LogLimit {
    state: Mutex<LimitState>,
}

#[derive(Debug, Default)]
struct LimitState {
    /// Lines logged in this burst.
    logged: u32,
    last_logged: Option<Instant>,
    last_seen: Option<Instant>,
    /// Occurrences not logged since the last line.
    suppressed: u64,
}

impl LogLimit {
    pub const fn new() -> Self {
        LogLimit {
            state: Mutex::new(LimitState {
                logged: 0,
                last_logged: None,
                last_seen: None,
                suppressed: 0,
            }),
        }
    }

    /// Counts one occurrence. `Some(n)`: log it, saying that `n` were left out
    /// since the last line; `None`: leave it out.
    pub fn admit(&self) -> Option<u64> {
        self.admit_at(Instant::now())
    }

    fn admit_at(&self, now: Instant) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let since = |t: Option<Instant>| t.map(|t| now.saturating_duration_since(t));
        if since(s.last_seen).is_none_or(|d| d >= LOG_INTERVAL) {
            s.logged = 0;
        }
        s.last_seen = Some(now);
        if s.logged < LOG_BURST || since(s.last_logged).is_none_or(|d| d >= LOG_INTERVAL) {
            s.logged = s.logged.saturating_add(1);
            s.last_logged = Some(now);
            return Some(std::mem::take(&mut s.suppressed));
        }
        s.suppressed = s.suppressed.saturating_add(1);
        None
    }
}

#[derive(Debug, Default)]
pub(crate) struct GuestErrorLog {
    count: u64,
}

/// Occurrences always logged before thinning out.
const ALWAYS_LOGGED: u64 = 32;

impl GuestErrorLog {
    /// Counts one occurrence; returns the running count if this one should be
    /// logged.
    pub(crate) fn tick(&mut self) -> Option<u64> {
        self.count = self.count.saturating_add(1);
        (self.count <= ALWAYS_LOGGED || self.count.is_power_of_two()).then_some(self.count)
    }
}

/// One line about something the guest did wrong (refused, the VM carries
/// on), through a [`GuestErrorLog`].
macro_rules! guest_error {
    ($log:expr, $($arg:tt)+) => {
        if let Some(n) = $log.tick() {
            // The target names whose doing it is: `INFO guest_error: virtio-blk: ...`.
            tracing::info!(target: "guest_error", guest_errors = n, $($arg)+);
        }
    };
}
pub(crate) use guest_error;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_line_per_interval_with_the_count_left_out() {
        let limit = LogLimit::new();
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // 1000 in the first second: the burst only.
        let logged: Vec<u64> = (0..1000).filter_map(|i| limit.admit_at(at(i))).collect();
        assert_eq!(logged, vec![0; usize::try_from(LOG_BURST).unwrap()]);
        // Still going a minute after the last line: one line, with the count.
        let interval = u64::try_from(LOG_INTERVAL.as_millis()).unwrap();
        assert_eq!(limit.admit_at(at(interval + 100)), Some(1000 - 10));
        assert_eq!(limit.admit_at(at(interval + 101)), None);
        // Quiet for an interval: a new burst, which reports what was left out.
        let later = 3 * interval;
        assert_eq!(limit.admit_at(at(later)), Some(1));
        let rest = (1..LOG_BURST).filter(|&i| limit.admit_at(at(later + u64::from(i))).is_some());
        assert_eq!(rest.count(), usize::try_from(LOG_BURST - 1).unwrap());
        assert_eq!(limit.admit_at(at(later + 100)), None);
    }

    #[test]
    fn logs_the_first_ones_then_powers_of_two() {
        let mut log = GuestErrorLog::default();
        let logged: Vec<u64> = (0..300).filter_map(|_| log.tick()).collect();
        assert_eq!(logged.len(), 32 + 3); // 1..=32, then 64, 128, 256
        assert_eq!(&logged[32..], &[64, 128, 256]);
    }
}
