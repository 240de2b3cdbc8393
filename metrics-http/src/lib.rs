//! The Prometheus `/metrics` endpoint of virt-controller and virt-handler: a registry's
//! OpenMetrics text, a router that answers `GET /metrics` with it, and the plain-HTTP server
//! behind `--metrics-listen`. Each component keeps its metric families (`controller::metrics`,
//! `handler::metrics`) and adds its own routes (the handler's `/healthz`).
//!
//! A crate of its own rather than a module of `proto`: `proto` holds the wire contracts that
//! every process links, the launcher and `netsetup` too, and serves nothing; an HTTP server and
//! Prometheus' encoder are needed by these two components only. It depends on nothing of ours,
//! so `controller` and `handler` both depend on it without an arrow between them.

use std::net::SocketAddr;

use prometheus_client::registry::Registry;

/// The content type of the OpenMetrics text format.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The OpenMetrics text of every metric in `registry`.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    prometheus_client::encoding::text::encode(&mut out, registry).expect("encoding into a String");
    out
}

/// A router answering `GET /metrics` with the text `scrape` returns, called at each scrape.
pub fn router(scrape: impl Fn() -> String + Clone + Send + Sync + 'static) -> axum::Router {
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let scrape = scrape.clone();
            async move { ([("content-type", CONTENT_TYPE)], scrape()) }
        }),
    )
}

/// Binds `addr` and serves `app` over plain HTTP on a task of its own, until that task is
/// aborted; returns the bound address (`addr` may name port 0) and the task.
pub async fn serve(
    app: axum::Router,
    addr: SocketAddr,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics server stopped");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use prometheus_client::metrics::counter::Counter;
    use tower::ServiceExt;

    async fn get(app: &axum::Router, path: &str) -> (StatusCode, Option<String>, String) {
        let request = Request::get(path).body(Body::empty()).expect("a request");
        let response = app.clone().oneshot(request).await.expect("an answer");
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().expect("ASCII").to_string());
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("the body");
        (
            status,
            content_type,
            String::from_utf8(body.to_vec()).expect("UTF-8"),
        )
    }

    #[tokio::test]
    async fn metrics_is_the_registry_text_as_of_the_scrape_and_nothing_else_is_served() {
        let mut registry = Registry::with_prefix("test");
        let scrapes = Counter::<u64>::default();
        registry.register("scrapes", "Scrapes seen", scrapes.clone());
        let registry = std::sync::Arc::new(registry);
        let app = router(move || {
            scrapes.inc();
            encode(&registry)
        });
        for n in 1..=2 {
            let (status, content_type, body) = get(&app, "/metrics").await;
            assert_eq!(status, StatusCode::OK);
            assert_eq!(content_type.as_deref(), Some(CONTENT_TYPE));
            assert!(
                body.contains(&format!("test_scrapes_total {n}\n")),
                "{body}"
            );
            assert!(body.ends_with("# EOF\n"), "{body}");
        }
        assert_eq!(get(&app, "/healthz").await.0, StatusCode::NOT_FOUND);
    }
}
