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
//! Both meet their launcher through a [`PodSocket`]: the pod's `migrationproxy` directory,
//! held by a descriptor opened inside the pod's root, and a name in it. The pod owns that
//! directory and may swap any entry for a link at any time, so the target dials only a
//! socket it opened without following links, and the source creates, owns and removes
//! its socket relative to the descriptor, never by a path walked again.
//!
//! Each connection carries bytes both ways and ends, both legs closed, as soon as either
//! direction ends (as v1.9.0's proxy does: the migration stream needs no half-close). A
//! TLS handshake must finish within [`HANDSHAKE_TIMEOUT`]. `disableTLS` (plain TCP) is
//! `None` for the TLS configuration. A proxy stops when its handle is dropped;
//! established connections are cut with it.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::task::JoinSet;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use nix::fcntl::OFlag;
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, fstat};
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use crate::podfs;

/// A socket name in a pod's `migrationproxy` directory, the directory held by a
/// descriptor.
pub struct PodSocket {
    dir: OwnedFd,
    name: String,
}

impl PodSocket {
    /// `name` in the directory `dir` (an `O_PATH` descriptor of it). `name` must be one
    /// plain path component.
    pub fn new(dir: OwnedFd, name: &str) -> std::io::Result<Self> {
        if name.is_empty()
            || name == "."
            || name == ".."
            || name.contains('/')
            || name.contains('\0')
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{name:?} is no socket name"),
            ));
        }
        Ok(PodSocket {
            dir,
            name: name.to_string(),
        })
    }

    /// `name` in a directory the handler itself controls (tests, standalone set-ups).
    pub fn in_dir(dir: &Path, name: &str) -> std::io::Result<Self> {
        let dir = nix::fcntl::open(
            dir,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        Self::new(dir, name)
    }

    /// The socket's path through the directory's descriptor (valid while `self` lives).
    fn path(&self) -> std::path::PathBuf {
        podfs::fd_path(&self.dir).join(&self.name)
    }

    /// Dials the socket: the entry is opened without following a link and must be a
    /// socket; the connection goes to exactly what was opened.
    async fn dial(&self) -> std::io::Result<UnixStream> {
        let fd = podfs::open_beneath(
            &podfs::fd_path(&self.dir),
            Path::new(&self.name),
            OFlag::O_PATH | OFlag::O_NOFOLLOW,
        )?;
        let stat = fstat(&fd).map_err(std::io::Error::from)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} in the pod is not a socket", self.name),
            ));
        }
        UnixStream::connect(podfs::fd_path(&fd)).await
    }

    /// Creates the socket (a stale entry of the name is removed first), owned by `owner`
    /// with mode 0600; ownership and mode are set without following a link.
    fn bind(&self, owner: Option<(u32, u32)>) -> std::io::Result<UnixListener> {
        match nix::unistd::unlinkat(&self.dir, self.name.as_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        let listener = UnixListener::bind(self.path())?;
        if let Some((uid, gid)) = owner {
            nix::unistd::fchownat(
                &self.dir,
                self.name.as_str(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )?;
        }
        nix::sys::stat::fchmodat(
            &self.dir,
            self.name.as_str(),
            Mode::from_bits_truncate(0o600),
            FchmodatFlags::NoFollowSymlink,
        )?;
        Ok(listener)
    }

    fn remove(&self) {
        let _ = nix::unistd::unlinkat(&self.dir, self.name.as_str(), UnlinkatFlags::NoRemoveDir);
    }
}

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
    /// `pod_socket`, the target launcher's socket in its pod
    /// (`/var/run/kubevirt/migrationproxy/<uid>-49152-source.sock`).
    pub async fn start(
        address: SocketAddr,
        pod_socket: PodSocket,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> std::io::Result<TargetListener> {
        let pod_socket = Arc::new(pod_socket);
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
                let (acceptor, pod_socket) = (acceptor.clone(), Arc::clone(&pod_socket));
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
                    match pod_socket.dial().await {
                        Ok(pod) => join(remote, pod).await,
                        Err(e) => {
                            tracing::warn!(
                                "migration: cannot reach {} in the target pod: {e}",
                                pod_socket.name
                            )
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
    socket: PodSocket,
    /// Where it sends to, to tell whether a later call names the same target.
    pub target: SocketAddr,
    _proxy: Proxy,
}

impl SourceListener {
    /// Creates `pod_socket` (in the source pod, owned by `owner` so that the launcher
    /// may connect; a stale file is replaced) and joins each connection to `target`.
    pub async fn start(
        pod_socket: PodSocket,
        owner: Option<(u32, u32)>,
        target: SocketAddr,
        tls: Option<Arc<rustls::ClientConfig>>,
    ) -> std::io::Result<SourceListener> {
        let listener = pod_socket.bind(owner)?;
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
            target,
            _proxy: Proxy { tasks },
        })
    }
}

impl Drop for SourceListener {
    fn drop(&mut self) {
        self.socket.remove();
    }
}

/// Either leg's stream.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
