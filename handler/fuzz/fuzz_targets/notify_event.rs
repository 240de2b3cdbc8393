//! Launcher-supplied notify input: domain events (every event type) and Kubernetes events.
//! Run with `cargo +nightly fuzz run notify_event` in `handler/fuzz`.
#![no_main]

use handler::domains::DomainCache;
use handler::domains::notify::{handle_domain_event, parse_k8s_event};
use libfuzzer_sys::fuzz_target;
use proto::grpc::notify::v1::DomainEventRequest;

fuzz_target!(|data: &[u8]| {
    let (cache, _changes) = DomainCache::new();
    let kind = match data.first().map(|b| b % 5) {
        Some(0) => "ADDED",
        Some(1) => "MODIFIED",
        Some(2) => "DELETED",
        Some(3) => "ERROR",
        _ => "UNKNOWN",
    };
    let body = data.get(1..).unwrap_or_default().to_vec();
    let _ = handle_domain_event(
        &cache,
        &DomainEventRequest {
            domain_json: body.clone(),
            status_json: body.clone(),
            event_type: kind.into(),
        },
    );
    let _ = parse_k8s_event(&body);
});
