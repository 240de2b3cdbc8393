//! Rate limit for log lines a guest can trigger at will.
//!
//! Every refused request or register write is logged, but a guest that
//! repeats one in a loop must not fill the host's disk: after the first few,
//! only every power-of-two occurrence is logged (with its count).
//!
//! These are the guest's doing, not faults of the host: they are logged at
//! INFO (a host operator's WARN means the host needs attention) and say so.

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
    fn logs_the_first_ones_then_powers_of_two() {
        let mut log = GuestErrorLog::default();
        let logged: Vec<u64> = (0..300).filter_map(|_| log.tick()).collect();
        assert_eq!(logged.len(), 32 + 3); // 1..=32, then 64, 128, 256
        assert_eq!(&logged[32..], &[64, 128, 256]);
    }
}
