//! The doubling back-off of client-go's exponential rate limiters, written once for the
//! work queue's failures, the agent's look for a starting launcher and the node labeller.

use std::time::Duration;

/// client-go's `DefaultControllerRateLimiter` per-item base delay.
pub(crate) const CONTROLLER_BASE: Duration = Duration::from_millis(5);
/// ... and its cap.
pub(crate) const CONTROLLER_MAX: Duration = Duration::from_secs(1000);

/// `first` doubled `n` times, capped at `max`; no overflow for any `n`.
pub(crate) fn doubling(first: Duration, n: u32, max: Duration) -> Duration {
    first
        .checked_mul(2u32.saturating_pow(n))
        .map_or(max, |d| d.min(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_from_first_and_stops_at_max() {
        let ms = Duration::from_millis;
        assert_eq!(doubling(ms(10), 0, ms(1000)), ms(10));
        assert_eq!(doubling(ms(10), 3, ms(1000)), ms(80));
        assert_eq!(doubling(ms(10), 7, ms(1000)), ms(1000));
        assert_eq!(doubling(ms(10), u32::MAX, ms(1000)), ms(1000));
    }
}
