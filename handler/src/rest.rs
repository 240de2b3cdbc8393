//! The handler's HTTPS endpoint for virt-api (v1.9.0 `pkg/virt-handler/rest`, port
//! [`handler_api::PORT`]): a VMI subresource forwarded by virt-api goes to the VMI's launcher.
//! Only clients with the install's handler client certificate get in (`handler_api`).
//!
//! `PUT /v1/namespaces/{namespace}/virtualmachineinstances/{name}/{action}` for `pause`,
//! `unpause`, `softreboot`, `reset`, `freeze` (body `{"unfreezeTimeout": "<Go duration>"}`) and
//! `unfreeze`: 202 once the launcher did it; 404 for a VMI this node does not run; 500 (400 for
//! freeze and unfreeze) with the launcher's message when it refused. The VMI's status follows
//! from the domain's events, as for every other change.
//!
//! `GET …/console`: a websocket (`plain.kubevirt.io`) on the VMI's serial console, the
//! launcher's `virt-serial0` socket in its pod: the console's bytes go out as binary messages,
//! binary messages come in as typed bytes (text messages are dropped, as v1.9.0 does). One
//! session per VMI: a new one takes over and the old one is closed (v1.9.0's behaviour).

use crate::launchers::Launchers;
use crate::launchers::client::VmiCommand;
use crate::vmis::VmiStore;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::put;
use handler_api::Action;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Where the certificates are mounted (the DaemonSet's volumes).
#[derive(Debug, Clone)]
pub struct RestConfig {
    pub listen: std::net::SocketAddr,
    /// `tls.crt` and `tls.key` of `kubevirt-virt-handler-server-certs`.
    pub server_cert_dir: PathBuf,
    /// The CA bundle of the ConfigMap `kubevirt-ca`.
    pub ca_bundle: PathBuf,
}

struct RestState {
    store: Arc<dyn VmiStore>,
    launchers: Arc<Launchers>,
    /// The console session of each VMI UID; a new one ends the one before.
    consoles: std::sync::Mutex<std::collections::HashMap<String, tokio::sync::watch::Sender<bool>>>,
}

/// The routes (also driven directly by tests).
pub fn router(store: Arc<dyn VmiStore>, launchers: Arc<Launchers>) -> Router {
    Router::new()
        .route(
            "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{action}",
            put(act).get(console),
        )
        .with_state(Arc::new(RestState {
            store,
            launchers,
            consoles: Default::default(),
        }))
}

fn text(code: StatusCode, message: impl Into<String>) -> Response {
    (code, message.into()).into_response()
}

async fn act(
    State(state): State<Arc<RestState>>,
    Path((namespace, name, action)): Path<(String, String, String)>,
    body: Bytes,
) -> Response {
    let Some(action) = Action::from_segment(&action) else {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    };
    let Some(vmi) = state.store.get(&format!("{namespace}/{name}")) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("VMI {namespace}/{name} does not exist"),
        );
    };
    // freeze's timeout is checked before the launcher is looked for, as v1.9.0 reads it.
    let unfreeze_timeout = match action {
        Action::Freeze => match unfreeze_timeout(&body) {
            Ok(seconds) => Some(seconds),
            Err(message) => return text(StatusCode::BAD_REQUEST, message),
        },
        _ => None,
    };
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let Some(client) = state.launchers.lookup(&vmi).await.client else {
        return text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("No command socket found for vmi {uid}"),
        );
    };
    let (result, failure_code) = match action {
        Action::Pause => (
            client.send(VmiCommand::Pause, &vmi).await,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        Action::Unpause => (
            client.send(VmiCommand::Unpause, &vmi).await,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        Action::SoftReboot => (
            client.send(VmiCommand::SoftReboot, &vmi).await,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        Action::Reset => (
            client.send(VmiCommand::Reset, &vmi).await,
            StatusCode::INTERNAL_SERVER_ERROR,
        ),
        Action::Freeze => (
            client
                .freeze(&vmi, unfreeze_timeout.unwrap_or_default())
                .await,
            StatusCode::BAD_REQUEST,
        ),
        Action::Unfreeze => (
            client.send(VmiCommand::Unfreeze, &vmi).await,
            StatusCode::BAD_REQUEST,
        ),
    };
    match result {
        Ok(()) => {
            tracing::info!(vmi = %format!("{namespace}/{name}"), action = action.as_str(), "done for virt-api");
            StatusCode::ACCEPTED.into_response()
        }
        Err(e) => {
            tracing::warn!(vmi = %format!("{namespace}/{name}"), action = action.as_str(), error = %e, "refused");
            text(failure_code, e.to_string())
        }
    }
}

/// The console: the websocket upgraded first, then the launcher's socket dialed (a failure
/// closes the websocket), then bytes both ways until either side ends or a newer session of
/// the same VMI takes over.
async fn console(
    State(state): State<Arc<RestState>>,
    Path((namespace, name, action)): Path<(String, String, String)>,
    upgrade: axum::extract::ws::WebSocketUpgrade,
) -> Response {
    if action != "console" {
        return text(StatusCode::NOT_FOUND, "404 page not found");
    }
    let Some(vmi) = state.store.get(&format!("{namespace}/{name}")) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("VMI {namespace}/{name} does not exist"),
        );
    };
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    if let Some(previous) = state
        .consoles
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(uid.clone(), stop)
    {
        // The session before is over: its relay sees this and closes.
        let _ = previous.send(true);
    }
    upgrade
        .protocols([handler_api::CONSOLE_PROTOCOL])
        .on_upgrade(move |socket| async move {
            let serial = state.launchers.serial_console(&vmi).and_then(|pinned| {
                let stream = pinned.connect().map_err(|e| e.to_string())?;
                stream.set_nonblocking(true).map_err(|e| e.to_string())?;
                tokio::net::UnixStream::from_std(stream).map_err(|e| e.to_string())
            });
            match serial {
                Ok(serial) => {
                    tracing::info!(vmi = %format!("{namespace}/{name}"), "console session");
                    relay(socket, serial, stopped).await;
                }
                Err(e) => {
                    tracing::warn!(vmi = %format!("{namespace}/{name}"), error = %e, "no serial console");
                }
            }
            let mut consoles = state.consoles.lock().unwrap_or_else(|p| p.into_inner());
            if consoles.get(&uid).is_some_and(|s| s.is_closed()) {
                consoles.remove(&uid);
            }
        })
}

/// Copies the console's bytes to the websocket and the websocket's binary messages to the
/// console, until either ends or `stop` turns true.
async fn relay(
    socket: axum::extract::ws::WebSocket,
    serial: tokio::net::UnixStream,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    use axum::extract::ws::Message;
    use futures::{SinkExt, StreamExt};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut ws_out, mut ws_in) = socket.split();
    let (mut serial_in, mut serial_out) = serial.into_split();
    let mut buffer = vec![0u8; 10240];
    loop {
        tokio::select! {
            read = serial_in.read(&mut buffer) => match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let bytes = axum::body::Bytes::copy_from_slice(&buffer[..n]);
                    if ws_out.send(Message::Binary(bytes)).await.is_err() {
                        break;
                    }
                }
            },
            message = ws_in.next() => match message {
                Some(Ok(Message::Binary(bytes))) => {
                    if serial_out.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Some(Ok(Message::Close(_))) | Some(Err(_)) | None => break,
                // Text, ping, pong: nothing for the console.
                Some(Ok(_)) => {}
            },
            _ = stop.changed() => break,
        }
    }
    // Closed without a close frame, as v1.9.0's handler closes it: the client sees an abnormal
    // closure (virtctl: "You were disconnected from the console").
    drop((ws_out, ws_in));
}

/// The freeze request's `unfreezeTimeout` in whole seconds (v1.9.0's messages).
fn unfreeze_timeout(body: &[u8]) -> Result<i32, String> {
    if body.is_empty() {
        return Err("failed to retrieve unfreeze timeout".into());
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|_| "failed to unmarshal unfreeze timeout".to_string())?;
    let Some(timeout) = value.get("unfreezeTimeout").filter(|t| !t.is_null()) else {
        return Err("Unfreeze timeout in freeze request is not set".into());
    };
    let duration = timeout
        .as_str()
        .and_then(|t| proto::contract::go_duration::parse(t).ok())
        .ok_or_else(|| "failed to unmarshal unfreeze timeout".to_string())?;
    i32::try_from(duration.as_secs()).map_err(|_| "failed to unmarshal unfreeze timeout".into())
}

/// Reads the certificate files, waiting until they are there: the Secret and ConfigMap are
/// written by virt-api, which may start after the handler (the volumes are optional).
async fn tls_config(config: &RestConfig) -> rustls::ServerConfig {
    let mut said = false;
    loop {
        let read = |path: &FsPath| std::fs::read_to_string(path);
        let attempt = (|| -> anyhow::Result<rustls::ServerConfig> {
            use anyhow::Context as _;
            let cert =
                read(&config.server_cert_dir.join("tls.crt")).context("the serving certificate")?;
            let key = read(&config.server_cert_dir.join("tls.key")).context("its key")?;
            let ca = read(&config.ca_bundle).context("the CA bundle")?;
            handler_api::server_config(&cert, &key, &ca)
        })();
        match attempt {
            Ok(tls) => return tls,
            Err(e) if !said => {
                tracing::info!(
                    error = format!("{e:#}"),
                    "the endpoint for virt-api waits for its certificates"
                );
                said = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Serves until `stop` turns true.
pub async fn serve(
    config: RestConfig,
    store: Arc<dyn VmiStore>,
    launchers: Arc<Launchers>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let tls = tokio::select! {
        tls = tls_config(&config) => tls,
        _ = stop.wait_for(|s| *s) => return Ok(()),
    };
    let listener = tokio::net::TcpListener::bind(config.listen).await?;
    let listener = handler_api::TlsListener::new(listener, tls)?;
    tracing::info!(address = %config.listen, "serving virt-api's subresources");
    axum::serve(listener, router(store, launchers))
        .with_graceful_shutdown(async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn freeze_needs_its_timeout() {
        assert_eq!(unfreeze_timeout(br#"{"unfreezeTimeout":"5m0s"}"#), Ok(300));
        assert_eq!(
            unfreeze_timeout(b""),
            Err("failed to retrieve unfreeze timeout".into())
        );
        assert_eq!(
            unfreeze_timeout(b"{"),
            Err("failed to unmarshal unfreeze timeout".into())
        );
        assert_eq!(
            unfreeze_timeout(br#"{"unfreezeTimeout":null}"#),
            Err("Unfreeze timeout in freeze request is not set".into())
        );
        assert_eq!(
            unfreeze_timeout(br#"{"unfreezeTimeout":"soon"}"#),
            Err("failed to unmarshal unfreeze timeout".into())
        );
    }
}
