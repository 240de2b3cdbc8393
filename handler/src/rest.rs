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
    {
        let mut consoles = state.consoles.lock().unwrap_or_else(|p| p.into_inner());
        // Sessions that ended, or whose client left before its upgrade, are forgotten.
        consoles.retain(|_, session| !session.is_closed());
        if let Some(previous) = consoles.insert(uid.clone(), stop) {
            // The session before is over: its relay sees this and closes.
            let _ = previous.send(true);
        }
    }
    upgrade
        .protocols([handler_api::CONSOLE_PROTOCOL])
        .on_upgrade(move |socket| async move {
            // The launcher's socket is the pod's: a connect that hangs gives up.
            let serial = match state.launchers.serial_console(&vmi) {
                Ok(pinned) => {
                    match tokio::time::timeout(CONSOLE_CONNECT_TIMEOUT, pinned.connect_async())
                        .await
                    {
                        Ok(Ok(serial)) => Ok(serial),
                        Ok(Err(e)) => Err(e.to_string()),
                        Err(_) => Err("the serial console socket does not answer".to_string()),
                    }
                }
                Err(e) => Err(e),
            };
            match serial {
                Ok(serial) => {
                    tracing::info!(vmi = %format!("{namespace}/{name}"), "console session");
                    relay(socket, serial, stopped).await;
                }
                Err(e) => {
                    tracing::warn!(vmi = %format!("{namespace}/{name}"), error = %e, "no serial console");
                    drop(stopped);
                }
            }
            let mut consoles = state.consoles.lock().unwrap_or_else(|p| p.into_inner());
            if consoles.get(&uid).is_some_and(|s| s.is_closed()) {
                consoles.remove(&uid);
            }
        })
}

/// How long connecting to a launcher's serial console may take.
const CONSOLE_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Copies the console's bytes to the websocket and the websocket's binary messages to the
/// console, each direction on a task of its own (a side that stops reading holds up only its
/// direction), until either direction ends or `stop` turns true; then both end.
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
    let mut to_client = tokio::spawn(async move {
        let mut buffer = vec![0u8; 10240];
        loop {
            match serial_in.read(&mut buffer).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    let bytes = axum::body::Bytes::copy_from_slice(&buffer[..n]);
                    if ws_out.send(Message::Binary(bytes)).await.is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut to_guest = tokio::spawn(async move {
        while let Some(message) = ws_in.next().await {
            match message {
                Ok(Message::Binary(bytes)) => {
                    if serial_out.write_all(&bytes).await.is_err() {
                        break;
                    }
                }
                Ok(Message::Close(_)) | Err(_) => break,
                // Text, ping, pong: nothing for the console.
                Ok(_) => {}
            }
        }
    });
    tokio::select! {
        _ = &mut to_client => {}
        _ = &mut to_guest => {}
        _ = stop.changed() => {}
    }
    // Both halves dropped with their tasks: the websocket is closed without a close frame, as
    // v1.9.0's handler closes it (the client sees an abnormal closure; virtctl: "You were
    // disconnected from the console").
    to_client.abort();
    to_guest.abort();
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
