//! Prometheus metrics of the controller: reconciles by controller and result, their
//! durations, failures by reason, and API writes by kind, served in the OpenMetrics text
//! format on `/metrics` (`--metrics-listen`), as controller-rs exposes its reconciler.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tracing::Instrument;

use crate::writes::{Write, Writes};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    controller: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabels {
    controller: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    controller: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    kind: String,
}

/// The controller's metrics. API writes are read from [`Writes`] at scrape time, so the
/// counters the benchmarks use and the ones Prometheus sees are the same numbers.
pub struct Metrics {
    registry: Registry,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<ControllerLabels, Histogram>,
    failures: Family<FailureLabels, Counter>,
    writes: Arc<Writes>,
    api_writes: Family<WriteLabels, Counter>,
}

impl Metrics {
    pub fn new(writes: Arc<Writes>) -> Self {
        let mut registry = Registry::with_prefix("kubevirt_controller");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        registry.register(
            "reconciles",
            "Reconciles by controller (vm, vmi) and result (ok, error)",
            reconciles.clone(),
        );
        // 1 ms .. ~32 s
        let durations = Family::<ControllerLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 16))
        });
        registry.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile, by controller",
            durations.clone(),
        );
        let failures = Family::<FailureLabels, Counter>::default();
        registry.register(
            "reconcile_failures",
            "Failed reconciles by controller and reason",
            failures.clone(),
        );
        let api_writes = Family::<WriteLabels, Counter>::default();
        registry.register(
            "api_writes",
            "Writes to the Kubernetes API by kind",
            api_writes.clone(),
        );
        Metrics {
            registry,
            reconciles,
            durations,
            failures,
            writes,
            api_writes,
        }
    }

    /// Runs one reconcile of `controller` for `key` inside a `reconcile` span, and counts
    /// and times it. `reason` names the failure of an `Err` for the failures metric.
    pub async fn reconcile<T, E>(
        &self,
        controller: &str,
        key: &str,
        reconcile: impl Future<Output = Result<T, E>>,
        reason: impl Fn(&E) -> String,
    ) -> Result<T, E> {
        let span = tracing::info_span!("reconcile", controller, object = key);
        let started = Instant::now();
        let result = reconcile.instrument(span).await;
        let took = started.elapsed();
        self.durations
            .get_or_create(&ControllerLabels {
                controller: controller.into(),
            })
            .observe(took.as_secs_f64());
        let outcome = if result.is_ok() { "ok" } else { "error" };
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.into(),
                result: outcome.into(),
            })
            .inc();
        if let Err(e) = &result {
            self.failures
                .get_or_create(&FailureLabels {
                    controller: controller.into(),
                    reason: reason(e),
                })
                .inc();
        }
        tracing::debug!(controller, object = key, ?took, outcome, "reconciled");
        result
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        for (kind, write) in Write::ALL.iter().map(|w| (format!("{w:?}"), *w)) {
            let counter = self.api_writes.get_or_create(&WriteLabels { kind });
            let seen = counter.get();
            let now = self.writes.get(write);
            if now > seen {
                counter.inc_by(now - seen);
            }
        }
        metrics_http::encode(&self.registry)
    }
}

/// Serves `/metrics` on `addr` until the task is aborted.
pub async fn serve(
    metrics: Arc<Metrics>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    metrics_http::serve(metrics_http::router(move || metrics.encode()), addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reconciles_are_counted_timed_and_failures_named() {
        let writes = Arc::new(Writes::default());
        let metrics = Metrics::new(Arc::clone(&writes));
        let ok: Result<(), String> = metrics
            .reconcile("vmi", "ns/a", async { Ok(()) }, |e: &String| e.clone())
            .await;
        assert!(ok.is_ok());
        let err: Result<(), String> = metrics
            .reconcile(
                "vm",
                "ns/b",
                async { Err("Conflict".into()) },
                |e: &String| e.clone(),
            )
            .await;
        assert!(err.is_err());
        writes.record(Write::PodCreate);
        writes.record(Write::PodCreate);
        let text = metrics.encode();
        for line in [
            r#"kubevirt_controller_reconciles_total{controller="vmi",result="ok"} 1"#,
            r#"kubevirt_controller_reconciles_total{controller="vm",result="error"} 1"#,
            r#"kubevirt_controller_reconcile_failures_total{controller="vm",reason="Conflict"} 1"#,
            r#"kubevirt_controller_reconcile_duration_seconds_count{controller="vmi"} 1"#,
            r#"kubevirt_controller_api_writes_total{kind="PodCreate"} 2"#,
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
        // A second scrape does not count the same writes twice.
        assert!(
            metrics
                .encode()
                .contains(r#"kubevirt_controller_api_writes_total{kind="PodCreate"} 2"#)
        );
    }
}
