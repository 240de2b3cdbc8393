//! `/healthz` in Kubernetes mode: whether the handler reaches the API server, answered as
//! KubeVirt's `KubeConnectionHealthzFuncFactory` answers (`pkg/healthz/healthz.go`):
//! 200 with `{"apiserver": {"connectivity": "ok", "version": <GET /version>}}`, or 500
//! with `{"apiserver": {"connectivity": "failed", "error": "..."}}`. The DaemonSet's
//! liveness and readiness probes ask it.
//!
//! KubeVirt keeps the version until an informer reports a watch error. Here the version
//! is kept for [`CACHE_FOR`], so a probe every 20 to 45 s costs at most one small request
//! a minute and a lost API server shows within a minute. (KubeVirt's body also carries
//! `config-resource-version`, the KubeVirt CR's; this handler has no such CR.)

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// How long a successful check is trusted.
pub(crate) const CACHE_FOR: Duration = Duration::from_secs(60);
/// A check that takes longer fails (the probes time out after 10 s).
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

pub struct ApiHealth {
    client: kube::Client,
    version: Mutex<Option<(Instant, Value)>>,
}

impl ApiHealth {
    pub fn new(client: kube::Client) -> Self {
        ApiHealth {
            client,
            version: Mutex::new(None),
        }
    }

    fn cached(&self) -> Option<Value> {
        let guard = self.version.lock().unwrap_or_else(|p| p.into_inner());
        guard
            .as_ref()
            .filter(|(at, _)| at.elapsed() < CACHE_FOR)
            .map(|(_, v)| v.clone())
    }

    /// The HTTP status and body of `/healthz`.
    pub async fn check(&self) -> (u16, Value) {
        let version = match self.cached() {
            Some(v) => Ok(v),
            None => {
                match tokio::time::timeout(CHECK_TIMEOUT, self.client.apiserver_version()).await {
                    Ok(Ok(info)) => {
                        let v = serde_json::to_value(info).unwrap_or(Value::Null);
                        *self.version.lock().unwrap_or_else(|p| p.into_inner()) =
                            Some((Instant::now(), v.clone()));
                        Ok(v)
                    }
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err(format!("no answer within {CHECK_TIMEOUT:?}")),
                }
            }
        };
        health_body(version)
    }
}

/// The status and body for a version lookup's outcome.
pub(crate) fn health_body(version: Result<Value, String>) -> (u16, Value) {
    match version {
        Ok(v) => (
            200,
            json!({"apiserver": {"connectivity": "ok", "version": v}}),
        ),
        Err(e) => (
            500,
            json!({"apiserver": {"connectivity": "failed", "error": e}}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_kubevirts_shape() {
        let (code, body) = health_body(Ok(json!({"major": "1"})));
        assert_eq!(code, 200);
        assert_eq!(body["apiserver"]["connectivity"], "ok");
        assert_eq!(body["apiserver"]["version"]["major"], "1");
        let (code, body) = health_body(Err("connection refused".into()));
        assert_eq!(code, 500);
        assert_eq!(body["apiserver"]["connectivity"], "failed");
        assert_eq!(body["apiserver"]["error"], "connection refused");
    }
}
