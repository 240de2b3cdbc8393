//! Prometheus metrics of the handler: VMIs by phase, reconcile latency, launcher errors,
//! notify events refused, served in the OpenMetrics text format on `/metrics` (and `/healthz`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use proto::kubevirt::Phase;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct PhaseLabels {
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CommandLabels {
    pub command: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ReasonLabels {
    pub reason: String,
}

pub struct Metrics {
    registry: Registry,
    vmis_by_phase: Family<PhaseLabels, Gauge>,
    sync_duration: Histogram,
    launcher_errors: Family<CommandLabels, Counter>,
    notify_rejected: Family<ReasonLabels, Counter>,
    phases: Mutex<HashMap<String, Phase>>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kubevirt_handler");
        let vmis_by_phase = Family::<PhaseLabels, Gauge>::default();
        registry.register("vmis", "VMIs of this node by phase", vmis_by_phase.clone());
        // 1 ms .. ~32 s
        let sync_duration = Histogram::new(exponential_buckets(0.001, 2.0, 16));
        registry.register(
            "sync_duration_seconds",
            "Duration of one VMI reconcile",
            sync_duration.clone(),
        );
        let launcher_errors = Family::<CommandLabels, Counter>::default();
        registry.register(
            "launcher_errors",
            "Failed calls to launchers by command",
            launcher_errors.clone(),
        );
        let notify_rejected = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "notify_events_rejected",
            "Events from launcher pods the handler dropped: about another VMI than the pod's \
             (identity), relists asked for too often (rate), past the domain cache's bound \
             (capacity), or malformed",
            notify_rejected.clone(),
        );
        Metrics {
            registry,
            vmis_by_phase,
            sync_duration,
            launcher_errors,
            notify_rejected,
            phases: Mutex::new(HashMap::new()),
        }
    }

    /// Records the phase of a VMI (`None`: the VMI is gone).
    pub fn set_phase(&self, key: &str, phase: Option<Phase>) {
        let mut phases = self.phases.lock().unwrap_or_else(|p| p.into_inner());
        match phase {
            Some(p) => {
                phases.insert(key.to_string(), p);
            }
            None => {
                phases.remove(key);
            }
        }
        let mut counts: HashMap<Phase, i64> = HashMap::new();
        for p in phases.values() {
            *counts.entry(*p).or_default() += 1;
        }
        for phase in [
            Phase::Unset,
            Phase::Pending,
            Phase::Scheduling,
            Phase::Scheduled,
            Phase::Running,
            Phase::Succeeded,
            Phase::Failed,
            Phase::WaitingForSync,
            Phase::Unknown,
        ] {
            self.vmis_by_phase
                .get_or_create(&PhaseLabels {
                    phase: phase.as_str().to_string(),
                })
                .set(counts.get(&phase).copied().unwrap_or(0));
        }
    }

    pub(crate) fn observe_sync(&self, took: Duration) {
        self.sync_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn launcher_error(&self, command: &str) {
        self.launcher_errors
            .get_or_create(&CommandLabels {
                command: command.to_string(),
            })
            .inc();
    }

    /// Counts one notify event dropped for `reason`.
    pub(crate) fn notify_event_rejected(&self, reason: &str) {
        self.notify_rejected
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    /// The OpenMetrics text of every metric.
    pub fn encode(&self) -> String {
        metrics_http::encode(&self.registry)
    }
}

/// Serves `/metrics` and `/healthz` on `addr` until the task is aborted.
pub async fn serve(
    metrics: Arc<Metrics>,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with_health(metrics, addr, None).await
}

/// [`serve`], with `/healthz` answering from `health` (the API server check of the
/// Kubernetes mode) instead of a plain "ok".
pub async fn serve_with_health(
    metrics: Arc<Metrics>,
    addr: SocketAddr,
    health: Option<Arc<crate::healthz::ApiHealth>>,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    use axum::response::IntoResponse;
    let healthz = axum::routing::get(move || {
        let health = health.clone();
        async move {
            match health {
                None => "ok".into_response(),
                Some(h) => {
                    let (code, body) = h.check().await;
                    let code = axum::http::StatusCode::from_u16(code)
                        .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
                    (
                        code,
                        [("content-type", "application/json")],
                        body.to_string(),
                    )
                        .into_response()
                }
            }
        }
    });
    let app = metrics_http::router(move || metrics.encode()).route("/healthz", healthz);
    metrics_http::serve(app, addr).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_counted_and_gone_vmis_leave_the_count() {
        let m = Metrics::new();
        m.set_phase("a/x", Some(Phase::Running));
        m.set_phase("a/y", Some(Phase::Running));
        m.set_phase("a/z", Some(Phase::Scheduled));
        m.launcher_error("SyncVirtualMachine");
        m.observe_sync(Duration::from_millis(3));
        let text = m.encode();
        assert!(
            text.contains(r#"kubevirt_handler_vmis{phase="Running"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kubevirt_handler_vmis{phase="Scheduled"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kubevirt_handler_launcher_errors_total{command="SyncVirtualMachine"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains("kubevirt_handler_sync_duration_seconds_count 1"),
            "{text}"
        );
        m.set_phase("a/x", None);
        assert!(
            m.encode()
                .contains(r#"kubevirt_handler_vmis{phase="Running"} 1"#)
        );
    }

    #[tokio::test]
    async fn endpoint_serves_the_text() {
        let m = Arc::new(Metrics::new());
        m.set_phase("a/x", Some(Phase::Running));
        let (addr, task) = serve(Arc::clone(&m), "127.0.0.1:0".parse().expect("addr"))
            .await
            .expect("bind");
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut body = String::new();
        stream.read_to_string(&mut body).await.expect("read");
        assert!(body.starts_with("HTTP/1.1 200"), "{body}");
        assert!(
            body.contains(r#"kubevirt_handler_vmis{phase="Running"} 1"#),
            "{body}"
        );
        task.abort();
    }
}
