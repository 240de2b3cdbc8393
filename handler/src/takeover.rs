//! The trace of a VMI's takeover, from the first reconcile that sees it scheduled to
//! `Running` written: every step of a reconcile in a debug span with its wall time, under
//! the target `virt_handler::takeover`, so `RUST_LOG=virt_handler=debug` shows where the
//! time goes (the rest of the handler logs under `handler::...`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tracing::Instrument;

/// The log target of the takeover trace.
pub const TARGET: &str = "virt_handler::takeover";

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

/// Whether the trace is on (the spans and clocks cost nothing otherwise).
pub(crate) fn enabled() -> bool {
    tracing::enabled!(target: TARGET, tracing::Level::DEBUG)
}

/// The span of one reconcile of `key`: the steps below nest in it.
pub(crate) fn reconcile_span(key: &str) -> tracing::Span {
    tracing::debug_span!(target: TARGET, "reconcile", key)
}

/// Runs `step` in a span named after it and logs its wall time in milliseconds.
pub(crate) async fn step<T>(name: &'static str, work: impl Future<Output = T>) -> T {
    if !enabled() {
        return work.await;
    }
    let span = tracing::debug_span!(target: TARGET, "step", name);
    let started = Instant::now();
    let out = work.instrument(span.clone()).await;
    span.in_scope(|| tracing::debug!(target: TARGET, ms = ms(started.elapsed()), "done"));
    out
}

/// When each VMI's takeover began (its first reconcile while not yet running), to log the
/// whole takeover's time when `Running` is written.
#[derive(Default)]
pub(crate) struct Takeovers(Mutex<HashMap<String, Instant>>);

impl Takeovers {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes that `key` is being taken over (the first call counts).
    pub(crate) fn begin(&self, key: &str) {
        if enabled() {
            self.lock()
                .entry(key.to_string())
                .or_insert_with(Instant::now);
        }
    }

    /// `key` is running: logs the time since [`Self::begin`].
    pub(crate) fn running(&self, key: &str) {
        if let Some(began) = self.lock().remove(key) {
            tracing::debug!(target: TARGET, %key, ms = ms(began.elapsed()), "Running written: takeover done");
        }
    }

    pub(crate) fn forget(&self, key: &str) {
        self.lock().remove(key);
    }
}
