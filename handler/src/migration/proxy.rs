//! The migration proxies between two nodes' handlers (KubeVirt v1.9.0's
//! `pkg/virt-handler/migration-proxy`): a live migration's stream goes from the source
//! launcher's unix socket in its pod, through the source handler, over TCP with mutual TLS,
//! to the target handler, and into the target launcher's unix socket in its pod.
//!
//! - [`TargetListener`]: on the target node, a TCP listener on a random port; each
//!   connection that passes the TLS handshake (the CA's client certificate, a migration
//!   common name: `handler_api::migration_server_config`) is joined to the target pod's
//!   socket, dialled only then (as v1.9.0 does: the launcher listens once
//!   SyncMigrationTarget returned).
//! - [`SourceListener`]: on the source node, a unix socket created in the source pod; each
//!   connection the launcher opens is joined to the target node's port over TLS.
//!
//! Each connection carries bytes both ways and ends, both legs closed, as soon as either
//! direction ends (as v1.9.0's proxy does: the migration stream needs no half-close). A
//! TLS handshake must finish within [`HANDSHAKE_TIMEOUT`]. `disableTLS` (plain TCP) is
//! `None` for the TLS configuration. A proxy stops when its handle is dropped;
//! established connections are cut with it.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The name the source asks the target's certificate for (the handlers' serving
/// certificate carries it; v1.9.0 checks the common name instead).
const SERVER_NAME: &str = handler_api::SERVER_NAME;

/// How long a peer has to finish its TLS handshake (a stalled one holds nothing).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// After a failed accept (out of descriptors): a pause, not a spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Joins the two legs of one connection until either direction ends; both legs are
/// dropped (closed) then.
async fn join<A, B>(a: A, b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut a_read, mut a_write) = tokio::io::split(a);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let ended = tokio::select! {
        r = tokio::io::copy(&mut a_read, &mut b_write) => r,
        r = tokio::io::copy(&mut b_read, &mut a_write) => r,
    };
    if let Err(e) = ended {
        tracing::debug!("migration proxy connection ended: {e}");
    }
}

/// A running proxy; dropping it stops it and cuts its connections.
pub struct Proxy {
    tasks: JoinSet<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// The target node's end: `port` is what the target handler publishes in
/// `status.migrationState.targetDirectMigrationNodePorts`.
pub struct TargetListener {
    pub port: u16,
    _proxy: Proxy,
}

impl TargetListener {
    /// Listens on `address` (port 0: a random one) and joins each connection to
    /// `pod_socket`, the target launcher's socket seen from the handler
    /// (`/proc/<pid>/root/var/run/kubevirt/migrationproxy/<uid>-49152-source.sock`).
    pub async fn start(
        address: SocketAddr,
        pod_socket: PathBuf,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<TargetListener> {
        let listener = TcpListener::bind(address).await?;
        let port = listener.local_addr()?.port();
        let acceptor = tls.map(TlsAcceptor::from);
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("migration target listener: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let (acceptor, pod_socket) = (acceptor.clone(), pod_socket.clone());
                connections.spawn(async move {
                    let _ = tcp.set_nodelay(true);
                    // The handshake first: nothing reaches the pod without it.
                    let remote: Box<dyn Stream> = match acceptor {
                        Some(acceptor) => {
                            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp))
                                .await
                            {
                                Ok(Ok(tls)) => Box::new(tls),
                                Ok(Err(e)) => {
                                    tracing::warn!(%peer, "migration connection refused: {e}");
                                    return;
                                }
                                Err(_) => {
                                    tracing::warn!(%peer, "migration connection: no handshake");
                                    return;
                                }
                            }
                        }
                        None => Box::new(tcp),
                    };
                    match UnixStream::connect(&pod_socket).await {
                        Ok(pod) => join(remote, pod).await,
                        Err(e) => {
                            tracing::warn!("migration: cannot reach {}: {e}", pod_socket.display())
                        }
                    }
                });
                // Finished connections are reaped as new ones come.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(TargetListener {
            port,
            _proxy: Proxy { tasks },
        })
    }
}

/// The source node's end.
pub struct SourceListener {
    pub socket: PathBuf,
    _proxy: Proxy,
}

impl SourceListener {
    /// Creates `pod_socket` (in the source pod, owned by `owner` so that the launcher
    /// may connect; a stale file is replaced) and joins each connection to `target`.
    pub async fn start(
        pod_socket: PathBuf,
        owner: Option<(u32, u32)>,
        target: SocketAddr,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> std::io::Result<SourceListener> {
        if let Some(dir) = pod_socket.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let _ = std::fs::remove_file(&pod_socket);
        let listener = UnixListener::bind(&pod_socket)?;
        restrict(&pod_socket, owner)?;
        let connector = tls.map(TlsConnector::from);
        let mut tasks = JoinSet::new();
        tasks.spawn(async move {
            let mut connections = JoinSet::new();
            loop {
                let pod = match listener.accept().await {
                    Ok((pod, _)) => pod,
                    Err(e) => {
                        tracing::warn!("migration source listener: {e}");
                        tokio::time::sleep(ACCEPT_BACKOFF).await;
                        continue;
                    }
                };
                let connector = connector.clone();
                connections.spawn(async move {
                    let tcp = match TcpStream::connect(target).await {
                        Ok(tcp) => tcp,
                        Err(e) => {
                            tracing::warn!(%target, "migration: cannot reach the target: {e}");
                            return;
                        }
                    };
                    let _ = tcp.set_nodelay(true);
                    match connector {
                        Some(connector) => {
                            let name = rustls::pki_types::ServerName::try_from(SERVER_NAME)
                                .expect("a valid DNS name");
                            match tokio::time::timeout(
                                HANDSHAKE_TIMEOUT,
                                connector.connect(name, tcp),
                            )
                            .await
                            {
                                Ok(Ok(tls)) => join(pod, tls).await,
                                Ok(Err(e)) => {
                                    tracing::warn!(%target, "migration: TLS to the target: {e}")
                                }
                                Err(_) => {
                                    tracing::warn!(%target, "migration: TLS to the target: no handshake")
                                }
                            }
                        }
                        None => join(pod, tcp).await,
                    }
                });
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(SourceListener {
            socket: pod_socket,
            _proxy: Proxy { tasks },
        })
    }
}

impl Drop for SourceListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Only the launcher's user (and root) may connect.
fn restrict(socket: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(socket, Some(uid), Some(gid))?;
    }
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
}

/// Either leg's stream.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
