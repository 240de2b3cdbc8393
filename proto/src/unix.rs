//! Unix sockets between the handler and its launchers: paths of any length,
//! and gRPC channels over them. Both sides dial the other's socket (the
//! handler the launcher's cmd socket, the launcher the handler's notify
//! socket), so this lives with the contracts they speak.

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint, Uri};

/// Longest path a `sockaddr_un` holds (with its NUL).
const SUN_PATH_MAX: usize = 107;

/// A unix socket path short enough for `connect`/`bind`. Kubelet paths with a state
/// directory in front can exceed the 108 bytes of `sockaddr_un`: then the socket's
/// directory is opened (`O_PATH`) and reached as `/proc/self/fd/<n>/<name>`, valid while
/// this value lives.
pub struct SocketPath {
    path: PathBuf,
    _dir: Option<std::fs::File>,
}

impl SocketPath {
    pub fn new(path: &Path) -> std::io::Result<Self> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::OpenOptionsExt;
        if path.as_os_str().len() <= SUN_PATH_MAX {
            return Ok(SocketPath {
                path: path.to_path_buf(),
                _dir: None,
            });
        }
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(std::io::Error::other(format!(
                "socket path {} has no directory",
                path.display()
            )));
        };
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY)
            .open(dir)?;
        let short = PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())).join(name);
        Ok(SocketPath {
            path: short,
            _dir: Some(dir),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `UnixStream::connect` for paths of any length.
pub fn connect(path: &Path) -> std::io::Result<UnixStream> {
    let short = SocketPath::new(path)?;
    UnixStream::connect(short.path())
}

/// Async connect for paths of any length.
pub async fn connect_async(path: &Path) -> std::io::Result<tokio::net::UnixStream> {
    let short = SocketPath::new(path)?;
    tokio::net::UnixStream::connect(short.path()).await
}

/// A tonic channel over the unix socket at `path` (any length). The URI is
/// a placeholder the connector ignores; `:authority` is `localhost`, as with
/// KubeVirt's `grpc.WithAuthority`. Gives up after `timeout`.
pub async fn channel(path: &Path, timeout: Duration) -> std::io::Result<Channel> {
    let socket = path.to_path_buf();
    channel_with(
        move || {
            let socket = socket.clone();
            async move { connect_async(&socket).await }
        },
        timeout,
    )
    .await
}

/// A tonic channel whose connections come from `dial` (also on reconnects), for
/// sockets reached some other way than by path (e.g. pinned by a file descriptor).
/// Whatever `dial` captures lives as long as the channel.
pub async fn channel_with<F, Fut>(dial: F, timeout: Duration) -> std::io::Result<Channel>
where
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = std::io::Result<tokio::net::UnixStream>> + Send + 'static,
{
    let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
    let connect = endpoint.connect_with_connector(tower::service_fn(move |_: Uri| {
        let dial = dial.clone();
        async move {
            let stream = dial().await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    }));
    match tokio::time::timeout(timeout, connect).await {
        Ok(Ok(channel)) => Ok(channel),
        Ok(Err(e)) => Err(std::io::Error::other(match std::error::Error::source(&e) {
            Some(source) => format!("{e}: {source}"),
            None => e.to_string(),
        })),
        Err(_) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("timed out after {timeout:?}"),
        )),
    }
}
