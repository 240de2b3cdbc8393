//! `subresources.kubevirt.io`: what `virtctl` calls through the API server's aggregation
//! layer (v1.9.0 `pkg/virt-api/api.go` `composeSubresources`, `pkg/virt-api/rest`).
//!
//! - [`status`]: KubeVirt's error answers.
//! - [`vm`]: `start`, `stop`, `restart` of VMs (object writes; the controllers act on them).
//! - [`portforward`]: a VMI's port, relayed over a websocket by virt-api itself.
//! - [`vmi`]: `pause`, `unpause`, `softreboot`, `reset`, `freeze`, `unfreeze` of VMIs (judged
//!   here, done by the handler of the VMI's node), and the guest-agent queries.
//!
//! Every route but discovery, `healthz` and `version` passes [`authorize`]: the caller must be
//! the front proxy ([`crate::frontproxy`]) and its user allowed by a SubjectAccessReview
//! ([`crate::authorize`]); a refusal is v1.9.0's 401 with the reason as plain text.

mod portforward;
pub mod status;
pub mod vm;
pub mod vmi;

use crate::discovery;
use crate::frontproxy::Peer;
use crate::server::{AppState, SUBRESOURCE_VERSIONS};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get, put};
use kube::Api;
use kube::api::{Patch, PatchParams};
use proto::kubevirt::{VirtualMachine, VirtualMachineInstance};
use serde::de::DeserializeOwned;
use serde_json::Value;
use status::{ApiError, Kind};
use std::sync::Arc;

/// The routes of the group: discovery and the subresources, behind [`authorize`].
pub fn router(state: Arc<AppState>) -> Router<Arc<AppState>> {
    let namespaced = "/apis/subresources.kubevirt.io/{version}/namespaces/{namespace}";
    Router::new()
        .route(
            "/",
            get(|| async { json(StatusCode::OK, &discovery::root_paths()) }),
        )
        .route(
            "/apis",
            get(|| async { json(StatusCode::OK, &discovery::api_group_list()) }),
        )
        .route(
            "/apis/subresources.kubevirt.io",
            get(|| async { json(StatusCode::OK, &discovery::api_group()) }),
        )
        .route(
            "/apis/subresources.kubevirt.io/{version}",
            get(resource_list),
        )
        .route(
            "/apis/subresources.kubevirt.io/{version}/",
            get(resource_list),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/start"),
            put(start_vm),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/stop"),
            put(stop_vm),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/restart"),
            put(restart_vm),
        )
        .route(
            &format!("{namespaced}/virtualmachineinstances/{{name}}/console"),
            get(console),
        )
        .route(
            &format!("{namespaced}/virtualmachineinstances/{{name}}/{{action}}"),
            put(vmi_action).get(agent_query),
        )
        .route(
            &format!("{namespaced}/virtualmachineinstances/{{name}}/portforward/{{port}}"),
            get(portforward::vmi_portforward),
        )
        .route(
            &format!(
                "{namespaced}/virtualmachineinstances/{{name}}/portforward/{{port}}/{{protocol}}"
            ),
            get(portforward::vmi_portforward),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/portforward/{{port}}"),
            get(portforward::vm_portforward),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/portforward/{{port}}/{{protocol}}"),
            get(portforward::vm_portforward),
        )
        // What v1.9.0 serves and this project does not (yet): a clear answer, not a 404.
        .route(
            &format!("{namespaced}/virtualmachineinstances/{{name}}/{{action}}/{{*rest}}"),
            any(|path: Path<OtherTarget>| not_served_path("virtualmachineinstances", path)),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/{{action}}"),
            any(|path: Path<OtherTarget>| not_served_path("virtualmachines", path)),
        )
        .route(
            &format!("{namespaced}/virtualmachines/{{name}}/{{action}}/{{*rest}}"),
            any(|path: Path<OtherTarget>| not_served_path("virtualmachines", path)),
        )
        .route_layer(axum::middleware::from_fn_with_state(state, authorize))
}

fn json(code: StatusCode, body: &Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(body).unwrap_or_default(),
    )
        .into_response()
}

fn unauthorized(reason: &str) -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        reason.to_string(),
    )
        .into_response()
}

/// v1.9.0's auth filter: public paths pass; everything else needs the front proxy's
/// certificate and a user the API server allows.
async fn authorize(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    if discovery::is_public(&path) {
        return next.run(request).await;
    }
    let peer = request
        .extensions()
        .get::<ConnectInfo<Peer>>()
        .map(|c| c.0.clone())
        .unwrap_or_default();
    let user = match state.front_proxy.authenticate(&peer, request.headers()) {
        Ok(user) => user,
        Err(refused) => {
            tracing::info!(%path, peer = ?peer.address, reason = %refused.0, "not authenticated");
            return unauthorized("request is not authenticated");
        }
    };
    let review = match crate::authorize::access_review(request.method(), &path, &user) {
        Ok(review) => review,
        Err(reason) => return unauthorized(&reason),
    };
    match crate::authorize::review(&state.client, &review).await {
        Ok(Ok(())) => next.run(request).await,
        Ok(Err(reason)) => {
            tracing::info!(%path, user = %user.name, %reason, "not allowed");
            unauthorized(&reason)
        }
        Err(e) => {
            tracing::error!(
                error = format!("{e:#}"),
                "internal error during auth request"
            );
            StatusCode::INTERNAL_SERVER_ERROR.into_response()
        }
    }
}

async fn resource_list(Path(version): Path<String>) -> Response {
    if !SUBRESOURCE_VERSIONS.contains(&version.as_str()) {
        return (StatusCode::NOT_FOUND, "404: Page Not Found").into_response();
    }
    json(StatusCode::OK, &discovery::resource_list(&version))
}

/// The names in a namespaced subresource path.
#[derive(serde::Deserialize)]
struct Target {
    version: String,
    namespace: String,
    name: String,
}

impl Target {
    fn check_version(&self) -> Result<(), ApiError> {
        if SUBRESOURCE_VERSIONS.contains(&self.version.as_str()) {
            Ok(())
        } else {
            Err(ApiError {
                code: 404,
                reason: "NotFound",
                message: "404: Page Not Found".into(),
                details: None,
                plain: true,
            })
        }
    }
}

/// `decodeBody`: JSON options; an empty body is the default options.
fn decode<T: DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "Can not unmarshal Request body to struct, error: {e}"
        ))
    })
}

fn dry_run(options: &[String]) -> PatchParams {
    PatchParams {
        dry_run: options.first().is_some_and(|o| o == "All"),
        ..Default::default()
    }
}

async fn get_vm(state: &AppState, target: &Target) -> Result<VirtualMachine, ApiError> {
    let api: Api<VirtualMachine> = Api::namespaced(state.client.clone(), &target.namespace);
    match api.get_opt(&target.name).await {
        Ok(Some(vm)) => Ok(vm),
        Ok(None) => Err(ApiError::not_found(Kind::VirtualMachine, &target.name)),
        Err(e) => Err(ApiError::internal(e)),
    }
}

async fn get_vmi(
    state: &AppState,
    target: &Target,
) -> Result<Option<VirtualMachineInstance>, ApiError> {
    let api: Api<VirtualMachineInstance> = Api::namespaced(state.client.clone(), &target.namespace);
    api.get_opt(&target.name).await.map_err(ApiError::internal)
}

/// Makes the writes of `plan`; a failed VMI state-change write after a forced grace period
/// undoes the grace period.
async fn apply(
    state: &AppState,
    target: &Target,
    plan: vm::Plan,
    params: &PatchParams,
) -> Result<(), ApiError> {
    let vms: Api<VirtualMachine> = Api::namespaced(state.client.clone(), &target.namespace);
    let vmis: Api<VirtualMachineInstance> =
        Api::namespaced(state.client.clone(), &target.namespace);
    let patch = |value: Value| -> Result<Patch<()>, ApiError> {
        serde_json::from_value::<json_patch::Patch>(value)
            .map(Patch::Json)
            .map_err(ApiError::internal)
    };
    for write in plan.writes {
        let result = match write {
            vm::Write::Vm(ops) => vms
                .patch(&target.name, params, &patch(ops)?)
                .await
                .map(drop)
                .map_err(|e| status::from_patch_error(Kind::VirtualMachine, &target.name, &e)),
            vm::Write::VmStatus(ops) => vms
                .patch_status(&target.name, params, &patch(ops)?)
                .await
                .map(drop)
                .map_err(|e| status::from_patch_error(Kind::VirtualMachine, &target.name, &e)),
            vm::Write::Vmi(ops) => vmis
                .patch(&target.name, params, &patch(ops)?)
                .await
                .map(drop)
                .map_err(ApiError::internal),
        };
        if let Err(error) = result {
            if let Some(rollback) = &plan.rollback
                && let Err(e) = vmis
                    .patch(&target.name, params, &patch(rollback.clone())?)
                    .await
            {
                tracing::error!(vmi = %target.name, error = %e, "undoing the forced grace period");
            }
            return Err(error);
        }
    }
    match plan.then_refuse {
        Some(refusal) => Err(refusal),
        None => Ok(()),
    }
}

fn accepted() -> Response {
    StatusCode::ACCEPTED.into_response()
}

async fn start_vm(
    State(state): State<Arc<AppState>>,
    Path(target): Path<Target>,
    body: Bytes,
) -> Result<Response, ApiError> {
    target.check_version()?;
    let vm = get_vm(&state, &target).await?;
    let vmi = get_vmi(&state, &target).await?;
    let options: vm::StartOptions = decode(&body)?;
    let plan = vm::start(&vm, vmi.as_ref(), &options)?;
    apply(&state, &target, plan, &dry_run(&options.dry_run)).await?;
    Ok(accepted())
}

async fn stop_vm(
    State(state): State<Arc<AppState>>,
    Path(target): Path<Target>,
    body: Bytes,
) -> Result<Response, ApiError> {
    target.check_version()?;
    let options: vm::StopOptions = decode(&body)?;
    let vm = get_vm(&state, &target).await?;
    let vmi = get_vmi(&state, &target).await?;
    let plan = vm::stop(&vm, vmi.as_ref(), &options)?;
    apply(&state, &target, plan, &dry_run(&options.dry_run)).await?;
    Ok(accepted())
}

async fn restart_vm(
    State(state): State<Arc<AppState>>,
    Path(target): Path<Target>,
    body: Bytes,
) -> Result<Response, ApiError> {
    target.check_version()?;
    let options: vm::RestartOptions = decode(&body)?;
    vm::check_restart_options(&options)?;
    let vm = get_vm(&state, &target).await?;
    let vmi = get_vmi(&state, &target).await?;
    let plan = vm::restart(&vm, vmi.as_ref(), &options)?;
    apply(&state, &target, plan, &dry_run(&options.dry_run)).await?;
    Ok(accepted())
}

/// The names in a VMI action's path.
#[derive(serde::Deserialize)]
struct ActionTarget {
    version: String,
    namespace: String,
    name: String,
    action: String,
}

impl ActionTarget {
    fn target(&self) -> Target {
        Target {
            version: self.version.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// The subresources v1.9.0 serves that this project does not, and why.
const NOT_SERVED: &[(&str, &str)] = &[
    ("vnc", "the VMs have no display device"),
    ("usbredir", "the VMs have no USB controller"),
    ("vsock", "the VMs have no vsock device"),
    ("migrate", "live migration is not implemented yet"),
    ("evacuate", "live migration is not implemented yet"),
    ("addvolume", "volume hotplug is not implemented"),
    ("removevolume", "volume hotplug is not implemented"),
    ("memorydump", "memory dumps are not implemented"),
    ("removememorydump", "memory dumps are not implemented"),
    (
        "expand-spec",
        "instance types and preferences are not implemented",
    ),
    ("objectgraph", "object graphs are not implemented"),
    ("sev", "the VMs have no SEV"),
    ("backup", "backups are not implemented"),
    ("redefine-checkpoint", "backups are not implemented"),
];

/// 501 for a subresource v1.9.0 serves and this project does not (with the reason); the
/// API machinery's 404 for anything else.
fn not_served(resource: &str, action: &str) -> ApiError {
    match NOT_SERVED.iter().find(|(name, _)| *name == action) {
        Some((_, why)) => ApiError {
            code: 501,
            reason: "NotImplemented",
            message: format!("{resource}/{action} is not supported by kubevirt-rs: {why}"),
            details: None,
            plain: false,
        },
        None => page_not_found(),
    }
}

/// The names in a path of a subresource that is not served.
#[derive(serde::Deserialize)]
struct OtherTarget {
    version: String,
    action: String,
}

async fn not_served_path(resource: &'static str, Path(path): Path<OtherTarget>) -> ApiError {
    if !SUBRESOURCE_VERSIONS.contains(&path.version.as_str()) {
        return page_not_found();
    }
    not_served(resource, &path.action)
}

fn page_not_found() -> ApiError {
    ApiError {
        code: 404,
        reason: "NotFound",
        message: "404: Page Not Found".into(),
        details: None,
        plain: true,
    }
}

async fn get_vmi_or_404(
    state: &AppState,
    target: &Target,
) -> Result<VirtualMachineInstance, ApiError> {
    let api: Api<VirtualMachineInstance> = Api::namespaced(state.client.clone(), &target.namespace);
    match api.get_opt(&target.name).await {
        Ok(Some(vmi)) => Ok(vmi),
        Ok(None) => Err(ApiError::not_found(
            Kind::VirtualMachineInstance,
            &target.name,
        )),
        Err(e) => Err(ApiError::internal(format!(
            "unable to retrieve vmi [{}]: {e}",
            target.name
        ))),
    }
}

/// `pause`, `unpause`, `softreboot`, `reset`, `freeze`, `unfreeze`: 200 with no body once the
/// handler did it (v1.9.0 passes on no body of the handler's 202).
async fn vmi_action(
    State(state): State<Arc<AppState>>,
    Path(path): Path<ActionTarget>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let target = path.target();
    target.check_version()?;
    let Some(action) = handler_api::Action::from_segment(&path.action) else {
        return Err(not_served("virtualmachineinstances", &path.action));
    };
    let vmi = get_vmi_or_404(&state, &target).await?;
    let vm = if action == handler_api::Action::Unpause {
        let vms: Api<VirtualMachine> = Api::namespaced(state.client.clone(), &target.namespace);
        vms.get_opt(&target.name)
            .await
            .map_err(ApiError::internal)?
    } else {
        None
    };
    let options: vmi::DryRunOptions = match action {
        handler_api::Action::Pause | handler_api::Action::Unpause => decode(&body)?,
        _ => Default::default(),
    };
    vmi::check(action, &vmi, vm.as_ref())?;
    // Only freeze's body goes on (its unfreeze timeout); pause's options were read here.
    let forwarded = if action == handler_api::Action::Freeze {
        body.to_vec()
    } else {
        Vec::new()
    };
    let dry_run = options.dry_run.first().is_some_and(|o| o == "All");
    let done = forward(&state, &vmi, action, forwarded, dry_run).await;
    match (action, done) {
        (_, Ok(())) => Ok(StatusCode::OK.into_response()),
        (handler_api::Action::Reset, Err(e)) => Err(vmi::reset_error(Some(&vmi), e)),
        (_, Err(e)) => Err(e),
    }
}

/// Sends `action` to the handler of `vmi`'s node (v1.9.0 `kubecli/handler.go`): the one
/// virt-handler pod of the install namespace on that node, at its pod IP.
async fn forward(
    state: &AppState,
    vmi: &VirtualMachineInstance,
    action: handler_api::Action,
    body: Vec<u8>,
    dry_run: bool,
) -> Result<(), ApiError> {
    vmi::check_connectable(vmi)?;
    let address = handler_address(state, vmi).await?;
    if dry_run {
        return Ok(());
    }
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let name = vmi.metadata.name.as_deref().unwrap_or_default();
    let (status, answer) = handler_api::request(
        state.handler_tls.clone(),
        address,
        axum::http::Method::PUT,
        &handler_api::vmi_path(namespace, name, action),
        body,
        HANDLER_TIMEOUT,
    )
    .await
    .map_err(|e| ApiError::internal(format!("{e:#}")))?;
    if !status.is_success() {
        return Err(ApiError::internal(format!(
            "unexpected return code {} ({status}), message: {}",
            status.as_u16(),
            String::from_utf8_lossy(&answer)
        )));
    }
    Ok(())
}

/// The endpoint of the handler on `vmi`'s node (v1.9.0 `kubecli/handler.go`): the one
/// virt-handler pod of the install namespace there, at its pod IP (400 otherwise).
async fn handler_address(
    state: &AppState,
    vmi: &VirtualMachineInstance,
) -> Result<std::net::SocketAddr, ApiError> {
    let node = vmi
        .status
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(state.client.clone(), &state.namespace);
    let params = kube::api::ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .labels("kubevirt.io in (virt-handler)");
    let found = pods
        .list(&params)
        .await
        .map_err(|e| ApiError::bad_request(e.to_string()))?
        .items;
    let pod = match found.as_slice() {
        [] => {
            return Err(ApiError::bad_request(format!(
                "No virt-handler on node {node} found"
            )));
        }
        [pod] => pod,
        more => {
            return Err(ApiError::bad_request(format!(
                "Expected to find one Pod, found {} Pods",
                more.len()
            )));
        }
    };
    let ip: std::net::IpAddr = pod
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .ok_or_else(|| ApiError::bad_request(format!("virt-handler on node {node} has no IP")))?;
    Ok(std::net::SocketAddr::new(ip, handler_api::PORT))
}

/// v1.9.0's client gives a handler 10 s.
const HANDLER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `guestosinfo`, `userlist`, `filesystemlist`: as v1.9.0 answers for a VMI without a guest
/// agent; anything else under a VMI is not served here.
async fn agent_query(
    State(state): State<Arc<AppState>>,
    Path(path): Path<ActionTarget>,
) -> Result<Response, ApiError> {
    let target = path.target();
    target.check_version()?;
    if !matches!(
        path.action.as_str(),
        "guestosinfo" | "userlist" | "filesystemlist"
    ) {
        return Err(not_served("virtualmachineinstances", &path.action));
    }
    let api: Api<VirtualMachineInstance> = Api::namespaced(state.client.clone(), &target.namespace);
    let vmi = api
        .get_opt(&target.name)
        .await
        .map_err(|e| ApiError::internal(e).as_plain(500))?;
    Err(vmi::agent_query(vmi.as_ref(), &target.name))
}

/// `console`: v1.9.0's checks, then the handler's websocket dialed before the client's is
/// accepted (a failure is an ordinary answer), then bytes relayed both ways unchanged: the
/// client's websocket handshake goes to the handler, whose `Sec-WebSocket-Accept` answers the
/// client, so the frames pass through virt-api as they are (v1.9.0's raw streamer).
async fn console(
    State(state): State<Arc<AppState>>,
    Path(target): Path<Target>,
    mut request: Request,
) -> Result<Response, ApiError> {
    // What is needed of the request, taken before anything is awaited (its body is not Sync).
    let (key, offered_protocol, on_upgrade) = {
        let header = |name: &str| {
            request
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let key = header("sec-websocket-key");
        let offered = header("sec-websocket-protocol").is_some_and(|p| {
            p.split(',')
                .any(|p| p.trim() == handler_api::CONSOLE_PROTOCOL)
        });
        let on_upgrade = request
            .extensions_mut()
            .remove::<hyper::upgrade::OnUpgrade>();
        (key, offered, on_upgrade)
    };
    drop(request);
    target.check_version()?;
    let vmi = get_vmi_or_404(&state, &target).await?;
    vmi::check_console(&vmi)?;
    vmi::check_connectable(&vmi)?;
    let address = handler_address(&state, &vmi).await?;
    let (Some(key), Some(on_upgrade)) = (key, on_upgrade) else {
        return Err(ApiError::bad_request(
            "Bad Request: not a websocket request",
        ));
    };
    let namespace = vmi.metadata.namespace.clone().unwrap_or_default();
    let name = vmi.metadata.name.clone().unwrap_or_default();
    let (upstream, accept, early) = console_upstream(&state, address, &namespace, &name, &key)
        .await
        .map_err(|e| ApiError::internal(format!("{e:#}")))?;
    tokio::spawn(async move {
        let client = match on_upgrade.await {
            Ok(client) => client,
            Err(e) => {
                tracing::info!(error = %e, "the console's client went away before its upgrade");
                return;
            }
        };
        let mut client = hyper_util::rt::TokioIo::new(client);
        let mut upstream = upstream;
        use tokio::io::AsyncWriteExt;
        if !early.is_empty() && client.write_all(&early).await.is_err() {
            return;
        }
        match tokio::io::copy_bidirectional(&mut client, &mut upstream).await {
            Ok((sent, received)) => {
                tracing::info!(vmi = %format!("{namespace}/{name}"), sent, received, "console session ended")
            }
            Err(e) => {
                tracing::info!(vmi = %format!("{namespace}/{name}"), error = %e, "console session ended")
            }
        }
    });
    let mut response = Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::CONNECTION, "Upgrade")
        .header(header::UPGRADE, "websocket")
        .header("Sec-WebSocket-Accept", accept);
    if offered_protocol {
        response = response.header("Sec-WebSocket-Protocol", handler_api::CONSOLE_PROTOCOL);
    }
    response
        .body(axum::body::Body::empty())
        .map_err(ApiError::internal)
}

/// The handler's console websocket, upgraded with the client's key: the stream, the
/// handler's `Sec-WebSocket-Accept`, and any bytes that came after its answer.
async fn console_upstream(
    state: &AppState,
    address: std::net::SocketAddr,
    namespace: &str,
    name: &str,
    key: &str,
) -> anyhow::Result<(
    tokio_rustls::client::TlsStream<tokio::net::TcpStream>,
    String,
    Vec<u8>,
)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tokio::time::timeout(
        HANDLER_TIMEOUT,
        handler_api::connect(state.handler_tls.clone(), address),
    )
    .await
    .map_err(|_| anyhow::anyhow!("virt-handler at {address} did not answer"))??;
    let request = format!(
        "GET {} HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\
         Sec-WebSocket-Protocol: {}\r\n\r\n",
        handler_api::console_path(namespace, name),
        handler_api::SERVER_NAME,
        handler_api::CONSOLE_PROTOCOL,
    );
    tls.write_all(request.as_bytes()).await?;
    // The answer's head, bounded; what follows it is the console already.
    let mut received = Vec::new();
    loop {
        if let Some((accept, head_end)) = upgrade_answer(&received)? {
            return Ok((tls, accept, received[head_end..].to_vec()));
        }
        let mut chunk = [0u8; 4096];
        let n = tokio::time::timeout(HANDLER_TIMEOUT, tls.read(&mut chunk))
            .await
            .map_err(|_| anyhow::anyhow!("virt-handler at {address} did not answer"))??;
        anyhow::ensure!(n > 0, "virt-handler closed the connection");
        received.extend_from_slice(&chunk[..n]);
    }
}

/// The handler's answer to the console's upgrade, as far as `received`: `None` until its head
/// is complete; then its `Sec-WebSocket-Accept` and where the head ends, or why it is no
/// upgrade (its status and body, as v1.9.0's client says it).
fn upgrade_answer(received: &[u8]) -> anyhow::Result<Option<(String, usize)>> {
    /// A head longer than this is no answer of virt-handler's.
    const MAX_HEAD: usize = 16 << 10;
    let Some(end) = received.windows(4).position(|w| w == b"\r\n\r\n") else {
        anyhow::ensure!(
            received.len() < MAX_HEAD,
            "virt-handler's answer has no end"
        );
        return Ok(None);
    };
    let head_end = end + 4;
    anyhow::ensure!(head_end <= MAX_HEAD, "virt-handler's answer has no end");
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .unwrap_or(0);
    if code != 101 {
        let body = String::from_utf8_lossy(&received[head_end..]).into_owned();
        anyhow::bail!("Can't connect to websocket ({code}): websocket: bad handshake: {body}");
    }
    let accept = head
        .lines()
        .find_map(|line| {
            let (name, value) = line.split_once(':')?;
            name.trim()
                .eq_ignore_ascii_case("sec-websocket-accept")
                .then(|| value.trim().to_string())
        })
        .ok_or_else(|| anyhow::anyhow!("virt-handler's answer has no Sec-WebSocket-Accept"))?;
    Ok(Some((accept, head_end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_is_not_served_says_why() {
        let vnc = not_served("virtualmachineinstances", "vnc");
        assert_eq!(
            (vnc.code, vnc.message.as_str()),
            (
                501,
                "virtualmachineinstances/vnc is not supported by kubevirt-rs: the VMs have no display device"
            )
        );
        assert_eq!(not_served("virtualmachines", "nonsense").code, 404);
    }

    #[test]
    fn a_malformed_options_body_is_a_bad_request() {
        let e = decode::<vmi::DryRunOptions>(b"{\"dryRun\": ").unwrap_err();
        assert_eq!(e.code, 400);
        assert!(
            e.message
                .starts_with("Can not unmarshal Request body to struct, error: "),
            "{}",
            e.message
        );
        assert_eq!(decode::<vmi::DryRunOptions>(b"[1]").unwrap_err().code, 400);
        assert_eq!(
            decode::<vmi::DryRunOptions>(&[0xff, 0xfe])
                .unwrap_err()
                .code,
            400
        );
        // No body is the default options.
        assert!(
            decode::<vmi::DryRunOptions>(b" \n")
                .unwrap()
                .dry_run
                .is_empty()
        );
    }

    #[test]
    fn the_handlers_upgrade_answer_is_checked_not_trusted() {
        let ok = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\
                   sec-websocket-accept: abc=\r\n\r\nconsole bytes";
        let (accept, end) = upgrade_answer(ok).unwrap().unwrap();
        assert_eq!(
            (accept.as_str(), &ok[end..]),
            ("abc=", &b"console bytes"[..])
        );
        // Not complete yet: read on.
        assert!(upgrade_answer(&ok[..20]).unwrap().is_none());
        // Refusals and garbage are errors, never a panic.
        let refused = b"HTTP/1.1 404 Not Found\r\n\r\nno such VMI";
        let e = upgrade_answer(refused).unwrap_err().to_string();
        assert!(e.contains("(404)") && e.contains("no such VMI"), "{e}");
        for garbled in [
            &b"\xff\xfe\x00\r\n\r\n"[..],
            b"HTTP/1.1 101\r\n\r\n",
            b"101 HTTP\r\n\r\n",
            b"\r\n\r\n",
        ] {
            assert!(upgrade_answer(garbled).is_err(), "{garbled:?}");
        }
        // A head without end is refused once it passes the bound.
        let endless = vec![b'a'; 16 << 10];
        assert!(upgrade_answer(&endless[..1000]).unwrap().is_none());
        assert!(upgrade_answer(&endless).is_err());
        let mut late_end = vec![b'a'; 20 << 10];
        late_end.extend_from_slice(b"\r\n\r\n");
        assert!(upgrade_answer(&late_end).is_err());
    }
}
