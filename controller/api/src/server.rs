//! The HTTPS endpoints: the webhooks at KubeVirt v1.9.0's paths
//! (`pkg/virt-operator/resource/generate/components/webhooks.go`), `healthz` and `version`
//! (`pkg/virt-api/api.go`, `pkg/healthz`), over rustls, HTTP/1.1.

use crate::admit::{self, Context};
use crate::cluster::Kube;
use crate::review::{AdmissionReview, Response, answer};
use crate::{eviction, migration};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use controller::kubevirt_cr::ClusterConfig;
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use proto::kubevirt::{KubeVirt, Time};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// `VMICreateValidatePath`.
pub const VMI_CREATE_VALIDATE: &str = "/virtualmachineinstances-validate-create";
/// `VMIUpdateValidatePath`.
pub const VMI_UPDATE_VALIDATE: &str = "/virtualmachineinstances-validate-update";
/// `VMValidatePath`.
pub const VM_VALIDATE: &str = "/virtualmachines-validate";
/// `VMIMutatePath`.
pub const VMI_MUTATE: &str = "/virtualmachineinstances-mutate";
/// `VMMutatePath`.
pub const VM_MUTATE: &str = "/virtualmachines-mutate";
/// `MigrationCreateValidatePath`.
pub const MIGRATION_CREATE_VALIDATE: &str = "/migration-validate-create";
/// `MigrationUpdateValidatePath`.
pub const MIGRATION_UPDATE_VALIDATE: &str = "/migration-validate-update";
/// `MigrationMutatePath`.
pub const MIGRATION_MUTATE: &str = "/migration-mutate-create";
/// `PodEvictionValidatePath`.
pub const POD_EVICTION_VALIDATE: &str = "/pod-eviction-validate";
/// The subresource API's versions (`v1.SubresourceGroupVersions`).
pub const SUBRESOURCE_VERSIONS: &[&str] = &["v1", "v1alpha3"];
/// What `version` reports as the server's version.
pub const GIT_VERSION: &str = concat!("v1.9.0+kubevirt-rs.", env!("CARGO_PKG_VERSION"));

/// Shared by the handlers.
pub struct AppState {
    pub config: Arc<ClusterConfig>,
    pub kubevirts: Store<KubeVirt>,
    pub service_accounts: BTreeSet<String>,
    pub client: kube::Client,
    /// Every owned webhook configuration has the CA as its `caBundle`.
    pub webhooks_ready: AtomicBool,
    /// The API server's `/version`, once read (`KubeApiHealthzVersion`).
    pub apiserver_version: Mutex<Option<Value>>,
    /// Who may call the subresources: the API server's front proxy.
    pub front_proxy: Arc<crate::frontproxy::FrontProxy>,
    /// The install namespace (its virt-handler pods).
    pub namespace: String,
    /// virt-api's TLS towards handlers (`handler_api`).
    pub handler_tls: Arc<rustls::ClientConfig>,
}

/// A webhook: the request and what it is judged by, to the answer.
pub type Webhook = fn(&crate::review::Request, &Context) -> Response;

/// One webhook call (`GetAdmissionReview`, then the webhook): the review answered, or why
/// the body is not an `AdmissionReview` with a request (answered 400 with that message;
/// KubeVirt answers 400 with no body).
pub fn handle(
    content_type: Option<&str>,
    body: &[u8],
    ctx: &Context,
    webhook: Webhook,
) -> Result<AdmissionReview, String> {
    let review = read_review(content_type, body)?;
    let Some(request) = review.request.as_ref() else {
        return Err("the AdmissionReview has no request".into());
    };
    let response = webhook(request, ctx);
    Ok(finish(&review, response))
}

/// `GetAdmissionReview`: the body as an `AdmissionReview` that has a request, or why not.
pub fn read_review(content_type: Option<&str>, body: &[u8]) -> Result<AdmissionReview, String> {
    if content_type != Some("application/json") {
        return Err(format!(
            "contentType={}, expect application/json",
            content_type.unwrap_or("")
        ));
    }
    let review: AdmissionReview = serde_json::from_slice(body)
        .map_err(|e| format!("the body is not an AdmissionReview: {e}"))?;
    if review.request.is_none() {
        return Err("the AdmissionReview has no request".into());
    }
    Ok(review)
}

/// `review` answered with `response`, a refusal logged.
pub fn finish(review: &AdmissionReview, response: Response) -> AdmissionReview {
    if let Some(request) = review.request.as_ref()
        && !response.allowed
    {
        tracing::info!(
            operation = %request.operation,
            resource = %request.resource.resource,
            namespace = request.namespace.as_deref().unwrap_or(""),
            name = request.name.as_deref().unwrap_or(""),
            user = %request.user_info.username,
            message = response.result.as_ref().map_or("", |r| r.message.as_str()),
            "refused"
        );
    }
    answer(review, response)
}

/// The HTTP answer: the answered review, or 400 with why the body is not one.
fn http_answer(answered: Result<AdmissionReview, String>) -> axum::response::Response {
    match answered {
        Ok(answered) => (
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(&answered).unwrap_or_default(),
        )
            .into_response(),
        Err(message) => {
            tracing::warn!(error = %message, "not an admission review");
            (StatusCode::BAD_REQUEST, message).into_response()
        }
    }
}

fn content_type(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
}

fn new_uuid() -> String {
    uuid::Uuid::new_v4().to_string()
}

fn review(
    state: &AppState,
    headers: &HeaderMap,
    body: &[u8],
    webhook: Webhook,
) -> axum::response::Response {
    let config = state.config.current();
    let ctx = Context {
        config: &config,
        service_accounts: &state.service_accounts,
        now: Time(k8s_openapi::jiff::Timestamp::now()),
        new_uuid: &new_uuid,
    };
    http_answer(handle(content_type(headers), body, &ctx, webhook))
}

fn route(webhook: Webhook) -> axum::routing::MethodRouter<Arc<AppState>> {
    post(
        move |State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes| async move {
            review(&state, &headers, &body, webhook)
        },
    )
}

/// A webhook that reads or writes the cluster (`crate::cluster`), called with the request,
/// the configuration in force and the API server as virt-api's ServiceAccount.
macro_rules! cluster_route {
    ($webhook:path) => {
        post(
            |State(state): State<Arc<AppState>>, headers: HeaderMap, body: Bytes| async move {
                let review = match read_review(content_type(&headers), &body) {
                    Ok(review) => review,
                    Err(message) => return http_answer(Err(message)),
                };
                let Some(request) = review.request.as_ref() else {
                    return http_answer(Err("the AdmissionReview has no request".into()));
                };
                let config = state.config.current();
                let ctx = Context {
                    config: &config,
                    service_accounts: &state.service_accounts,
                    now: Time(k8s_openapi::jiff::Timestamp::now()),
                    new_uuid: &new_uuid,
                };
                let cluster = Kube(state.client.clone());
                let response = $webhook(request, &ctx, &cluster).await;
                http_answer(Ok(finish(&review, response)))
            },
        )
    };
}

/// KubeVirt's `healthz`: the API server reachable (its version, read once), the
/// configuration's resource version; here also the webhook configurations' `caBundle`
/// written (until then the API server cannot call the webhooks: not ready).
async fn healthz(State(state): State<Arc<AppState>>) -> axum::response::Response {
    let resource_version = controller::kubevirt_cr::config::select(&state.kubevirts.state())
        .and_then(|kv| kv.resource_version())
        .unwrap_or_default();
    let cached = state
        .apiserver_version
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let version = match cached {
        Some(version) => version,
        None => match state.client.apiserver_version().await {
            Ok(info) => {
                let version = serde_json::to_value(info).unwrap_or_default();
                *state
                    .apiserver_version
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(version.clone());
                version
            }
            Err(e) => {
                let body = json!({
                    "apiserver": {"connectivity": "failed", "error": e.to_string()},
                    "config-resource-version": resource_version,
                });
                return json_response(StatusCode::INTERNAL_SERVER_ERROR, &body);
            }
        },
    };
    let mut body = json!({
        "apiserver": {"connectivity": "ok", "version": version},
        "config-resource-version": resource_version,
    });
    if !state.webhooks_ready.load(Ordering::Acquire) {
        body["webhooks"] = json!("the webhook configurations' caBundle is not written yet");
        return json_response(StatusCode::INTERNAL_SERVER_ERROR, &body);
    }
    json_response(StatusCode::OK, &body)
}

/// `version` (`virtversion.Get()`'s fields).
async fn version() -> axum::response::Response {
    json_response(
        StatusCode::OK,
        &json!({
            "gitVersion": GIT_VERSION,
            "gitCommit": "",
            "gitTreeState": "",
            "buildDate": "1970-01-01T00:00:00Z",
            "goVersion": "",
            "compiler": "rustc",
            "platform": format!("linux/{}", match std::env::consts::ARCH {
                "x86_64" => "amd64",
                "aarch64" => "arm64",
                other => other,
            }),
        }),
    )
}

/// `body` as JSON with `status`.
fn json_response(status: StatusCode, body: &Value) -> axum::response::Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).unwrap_or_default(),
    )
        .into_response()
}

/// Every endpoint.
pub fn router(state: Arc<AppState>) -> Router {
    let mut router = Router::new()
        .route(VMI_CREATE_VALIDATE, route(admit::validate_vmi_create))
        .route(VMI_UPDATE_VALIDATE, route(admit::validate_vmi_update))
        .route(VM_VALIDATE, route(admit::validate_vm))
        .route(VMI_MUTATE, route(admit::mutate_vmi))
        .route(VM_MUTATE, route(admit::mutate_vm))
        .route(MIGRATION_MUTATE, route(migration::mutate_create))
        .route(
            MIGRATION_CREATE_VALIDATE,
            cluster_route!(migration::validate_create),
        )
        .route(MIGRATION_UPDATE_VALIDATE, route(migration::validate_update))
        .route(POD_EVICTION_VALIDATE, cluster_route!(eviction::validate))
        .route("/healthz", get(healthz));
    for version_name in SUBRESOURCE_VERSIONS {
        let base = format!("/apis/subresources.kubevirt.io/{version_name}");
        router = router
            .route(&format!("{base}/healthz"), get(healthz))
            .route(&format!("{base}/version"), get(version));
    }
    router
        .merge(crate::subresources::router(state.clone()))
        // An AdmissionReview carries the object and the old one (etcd's limit is 1.5 MiB each).
        .layer(DefaultBodyLimit::max(16 << 20))
        .with_state(state)
}

/// What each connection's handshake established, for the subresources' authentication.
impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>>
    for crate::frontproxy::Peer
{
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        let (_, session) = stream.io().get_ref();
        crate::frontproxy::Peer {
            address: Some(*stream.remote_addr()),
            verified_common_name: session
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(crate::frontproxy::common_name),
        }
    }
}

/// TCP connections through a TLS handshake (shared with virt-handler's endpoint).
pub use handler_api::TlsListener;

#[cfg(test)]
mod tests {
    use super::*;
    use controller::template::TemplateConfig;

    fn call(content_type: Option<&str>, body: &[u8]) -> Result<AdmissionReview, String> {
        let config = TemplateConfig::default();
        let accounts = BTreeSet::new();
        let uuid = || "u".to_string();
        let ctx = Context {
            config: &config,
            service_accounts: &accounts,
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            new_uuid: &uuid,
        };
        handle(content_type, body, &ctx, admit::validate_vmi_create)
    }

    const REVIEW: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-7","operation":"CREATE","resource":{"group":"kubevirt.io","version":"v1","resource":"virtualmachineinstances"},"object":{"metadata":{"name":"v"},"spec":{"domain":{"devices":{}},"volumes":[{"name":"h","hostDisk":{"path":"/d/x","type":"Disk"}}]}}}}"#;

    #[test]
    fn a_review_is_answered_with_its_uid() {
        let answered = call(Some("application/json"), REVIEW.as_bytes()).unwrap();
        let response = answered.response.unwrap();
        assert_eq!(response.uid, "u-7");
        assert!(!response.allowed);
        assert_eq!(answered.kind, "AdmissionReview");
    }

    #[test]
    fn what_is_not_a_review_is_a_clear_error() {
        let err = call(Some("text/plain"), REVIEW.as_bytes()).unwrap_err();
        assert_eq!(err, "contentType=text/plain, expect application/json");
        let err = call(None, REVIEW.as_bytes()).unwrap_err();
        assert_eq!(err, "contentType=, expect application/json");
        let err = call(Some("application/json"), b"\xff\x00garbage").unwrap_err();
        assert!(
            err.starts_with("the body is not an AdmissionReview: "),
            "{err}"
        );
        let err = call(Some("application/json"), b"{}").unwrap_err();
        assert_eq!(err, "the AdmissionReview has no request");
        let err = call(Some("application/json"), br#"{"request": 5}"#).unwrap_err();
        assert!(
            err.starts_with("the body is not an AdmissionReview: "),
            "{err}"
        );
        // A request without a uid or operation is not one the API server sends.
        assert!(call(Some("application/json"), br#"{"request": {}}"#).is_err());
    }

    /// Every prefix of a review and every byte flipped: an answer or an error, no panic.
    #[test]
    fn no_body_panics() {
        let bytes = REVIEW.as_bytes();
        for end in 0..bytes.len() {
            let _ = call(Some("application/json"), &bytes[..end]);
        }
        for i in 0..bytes.len() {
            for flip in [0x01u8, 0x20, 0x80] {
                let mut changed = bytes.to_vec();
                changed[i] ^= flip;
                let _ = call(Some("application/json"), &changed);
            }
        }
    }

    /// The migration and eviction webhooks on every prefix of their reviews and every byte
    /// flipped: an answer or an error, no panic.
    #[test]
    fn no_migration_or_eviction_body_panics() {
        use crate::cluster::fake::Fake;
        let config = TemplateConfig::default();
        let accounts = BTreeSet::new();
        let uuid = || "u".to_string();
        let ctx = Context {
            config: &config,
            service_accounts: &accounts,
            now: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
            new_uuid: &uuid,
        };
        let vmi: proto::kubevirt::VirtualMachineInstance = serde_json::from_str(
            r#"{"metadata":{"name":"v","namespace":"ns"},"spec":{"domain":{"devices":{}},"evictionStrategy":"LiveMigrate"},"status":{"phase":"Running","nodeName":"n","conditions":[{"type":"LiveMigratable","status":"True"}]}}"#,
        )
        .unwrap();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_str(
            r#"{"metadata":{"name":"virt-launcher-v-x","namespace":"ns","labels":{"kubevirt.io":"virt-launcher"},"annotations":{"kubevirt.io/domain":"v"}},"spec":{"nodeName":"n","containers":[]}}"#,
        )
        .unwrap();
        let cluster = Fake {
            vmis: vec![vmi],
            pods: vec![pod],
            ..Default::default()
        };
        const MIGRATION: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-8","operation":"UPDATE","namespace":"ns","resource":{"group":"kubevirt.io","version":"v1","resource":"virtualmachineinstancemigrations"},"object":{"metadata":{"name":"m","namespace":"ns","labels":{"kubevirt.io/vmi-name":"v"}},"spec":{"vmiName":"v","priority":"x","sendTo":{"migrationID":"a"}},"status":{"phase":"Running"}},"oldObject":{"metadata":{"name":"m","labels":{"kubevirt.io/vmi-name":"v"}},"spec":{"vmiName":"v"}}}}"#;
        const EVICTION: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-9","operation":"CREATE","namespace":"ns","name":"virt-launcher-v-x","dryRun":true,"resource":{"group":"","version":"v1","resource":"pods"},"object":{"metadata":{"name":"virt-launcher-v-x","annotations":{"requested-by":"sigs.k8s.io/descheduler"}},"deleteOptions":{"dryRun":["All"]}}}}"#;
        let judge = |body: &[u8]| {
            let Ok(review) = read_review(Some("application/json"), body) else {
                return;
            };
            let request = review.request.as_ref().unwrap();
            let _ = finish(&review, migration::mutate_create(request, &ctx));
            let _ = migration::validate_update(request, &ctx);
            let _ =
                futures::executor::block_on(migration::validate_create(request, &ctx, &cluster));
            let _ = futures::executor::block_on(eviction::validate(request, &ctx, &cluster));
        };
        for review in [MIGRATION, EVICTION] {
            let bytes = review.as_bytes();
            for end in 0..bytes.len() {
                judge(&bytes[..end]);
            }
            for i in 0..bytes.len() {
                for flip in [0x01u8, 0x20, 0x80] {
                    let mut changed = bytes.to_vec();
                    changed[i] ^= flip;
                    judge(&changed);
                }
            }
        }
        // The unchanged eviction marks the VMI in a dry run, for the descheduler.
        assert!(cluster.marks().iter().any(|m| m.dry_run && m.descheduler));
    }
}
