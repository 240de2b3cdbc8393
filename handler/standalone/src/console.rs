//! Prints a VMI's serial console: connects to the launcher's `virt-serial0` socket through
//! `/proc/<pid>/root` (as the handler's console endpoint does) and prints each line as
//! `[<ns>/<name>] console: <line>`, reconnecting while the launcher lives.
//!
//! The pod writes the socket's directory, so the socket is opened in one `openat2` inside
//! the pod's root (links resolved as the pod sees them, never out of it) and a link in
//! its place is refused; the connection goes through that descriptor. A launcher that
//! puts a link to a host socket there cannot make the handler connect to it and print
//! what it says (a name resolved first and connected to later could be swapped between).
//!
//! The guest decides what the console carries, so what the handler holds for it is bounded:
//! a line is printed in pieces of at most [`MAX_LINE`] bytes, and only whether a console
//! showed the `--stop-after-console` text is kept, not the lines.

use std::collections::HashSet;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag, fstat};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt};

use crate::store::say;
use handler::launchers::socket;

/// The longest piece of a console line printed at once (and held while it is read).
pub const MAX_LINE: usize = 4096;

/// Which consoles printed the `--stop-after-console` text.
#[derive(Default)]
pub struct ConsoleLines {
    /// The text looked for (`None`: nothing is looked for, nothing is kept).
    wanted: Option<String>,
    shown: Mutex<HashSet<String>>,
}

impl ConsoleLines {
    /// Looks for `wanted` in every console line.
    pub fn watching(wanted: Option<String>) -> Self {
        ConsoleLines {
            wanted: wanted.filter(|w| !w.is_empty()),
            shown: Mutex::new(HashSet::new()),
        }
    }

    pub fn push(&self, key: &str, line: &str) {
        if self.wanted.as_deref().is_some_and(|w| line.contains(w)) {
            self.shown
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_string());
        }
    }

    /// Whether `key`'s console printed a line containing the wanted text.
    pub fn has_shown(&self, key: &str) -> bool {
        self.shown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }
}

/// The console socket of VMI `uid` in the pod whose root is `root` (`/proc/<pid>/root`),
/// held by an `O_PATH` descriptor: resolved inside the root, the socket itself no link.
pub fn open_console(root: &Path, uid: &str) -> std::io::Result<OwnedFd> {
    let path = socket::serial_console_in_pod(uid);
    let context = |e: nix::errno::Errno| {
        std::io::Error::new(
            std::io::Error::from(e).kind(),
            format!("{path} in {}: {e}", root.display()),
        )
    };
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(context)?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let fd = openat2(&dir, path.as_str(), how).map_err(context)?;
    let kind = SFlag::from_bits_truncate(fstat(&fd).map_err(context)?.st_mode) & SFlag::S_IFMT;
    if kind != SFlag::S_IFSOCK {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{path} in {} is not a socket", root.display()),
        ));
    }
    Ok(fd)
}

/// Connects to the console socket of VMI `uid` in the pod whose root is `root`.
pub async fn connect_console(root: &Path, uid: &str) -> std::io::Result<tokio::net::UnixStream> {
    let socket = open_console(root, uid)?;
    // The descriptor's magic link reaches exactly the socket opened, whatever its name
    // leads to now.
    let dial = PathBuf::from(format!("/proc/self/fd/{}", socket.as_raw_fd()));
    tokio::net::UnixStream::connect(dial).await
}

/// Follows the console until the launcher is gone (`alive` returns false).
pub fn follow(
    key: String,
    pid: u32,
    uid: String,
    lines: Arc<ConsoleLines>,
    alive: impl Fn() -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let root = PathBuf::from(format!("/proc/{pid}/root"));
        while alive() {
            if let Ok(stream) = connect_console(&root, &uid).await {
                print_lines(stream, &key, &lines, |line| {
                    say(&format!("[{key}] console: {line}"))
                })
                .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Hands each line of `stream` (without its end; a longer line in pieces of [`MAX_LINE`]
/// bytes) to `show` and to `lines`, until the stream ends.
async fn print_lines(
    stream: impl AsyncRead + Unpin,
    key: &str,
    lines: &ConsoleLines,
    mut show: impl FnMut(&str),
) {
    let mut reader = tokio::io::BufReader::new(stream);
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        match (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                // Guest bytes are untrusted: show them lossily, without the line end.
                let text = String::from_utf8_lossy(&buf);
                let line = text.trim_end_matches(['\r', '\n']);
                show(line);
                lines.push(key, line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A guest writing a long stretch without a newline: printed in bounded pieces, and
    /// nothing of it is kept.
    /// A pod root as the launcher's: `/var/run` a link to `/run`, the VMI's private
    /// directory under it. Returns the root and the console socket's place.
    fn pod_root(dir: &Path, uid: &str) -> (PathBuf, PathBuf) {
        let root = dir.join("root");
        let private = root.join("run/kubevirt-private").join(uid);
        std::fs::create_dir_all(&private).expect("mkdir");
        std::fs::create_dir_all(root.join("var")).expect("mkdir");
        std::os::unix::fs::symlink("/run", root.join("var/run")).expect("symlink");
        (root, private.join("virt-serial0"))
    }

    /// A socket outside the pod that says something when connected to.
    fn host_socket(path: &Path) -> std::os::unix::net::UnixListener {
        let listener = std::os::unix::net::UnixListener::bind(path).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        listener
    }

    fn connections(listener: &std::os::unix::net::UnixListener) -> usize {
        std::iter::from_fn(|| listener.accept().ok()).count()
    }

    /// The launcher replaces its console socket with a link to a host socket: the
    /// handler refuses it and never connects there; a link of a directory on the way
    /// stays inside the pod's root.
    #[tokio::test]
    async fn a_console_link_out_of_the_pod_is_never_followed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let uid = "0c4e1a52-7d2b-4b7e-9f41-3f2a1c9d8e01";
        let (root, console) = pod_root(dir.path(), uid);
        let host = host_socket(&dir.path().join("host.sock"));
        std::os::unix::fs::symlink(dir.path().join("host.sock"), &console).expect("symlink");
        let err = connect_console(&root, uid)
            .await
            .expect_err("a link in place of the socket");
        assert_eq!(connections(&host), 0, "connected to the host socket: {err}");

        // The private directory a link to a host directory holding a socket of that name.
        std::fs::remove_file(&console).expect("rm");
        let outside = dir.path().join("outside").join(uid);
        std::fs::create_dir_all(&outside).expect("mkdir");
        let host_dir = host_socket(&outside.join("virt-serial0"));
        let private = root.join("run/kubevirt-private");
        std::fs::remove_dir_all(&private).expect("rm");
        std::os::unix::fs::symlink(dir.path().join("outside"), &private).expect("symlink");
        assert!(connect_console(&root, uid).await.is_err());
        assert_eq!(connections(&host_dir), 0, "connected out of the root");

        // The pod's own socket is reached, through the pod's /var/run link.
        std::fs::remove_file(&private).expect("rm");
        std::fs::create_dir_all(private.join(uid)).expect("mkdir");
        let pod = tokio::net::UnixListener::bind(&console).expect("bind");
        let serve = tokio::spawn(async move {
            let (mut stream, _) = pod.accept().await.expect("accept");
            tokio::io::AsyncWriteExt::write_all(&mut stream, b"pod console\n")
                .await
                .expect("write");
        });
        let stream = connect_console(&root, uid).await.expect("the pod's socket");
        let mut shown = Vec::new();
        print_lines(stream, "ns/v", &ConsoleLines::default(), |l| {
            shown.push(l.to_string())
        })
        .await;
        serve.await.expect("join");
        assert_eq!(shown, ["pod console"]);
        assert_eq!(connections(&host), 0);
    }

    #[tokio::test]
    async fn console_lines_are_bounded() {
        let (mut guest, console) = tokio::net::UnixStream::pair().expect("pair");
        let writer = tokio::spawn(async move {
            guest.write_all(&vec![b'x'; 1 << 20]).await.expect("write");
            guest.write_all(b"\nlogin: ready\r\n").await.expect("write");
        });
        let lines = ConsoleLines::watching(Some("ready".into()));
        let mut longest = 0;
        let mut pieces = 0;
        let mut last = String::new();
        print_lines(console, "ns/v", &lines, |line| {
            longest = longest.max(line.len());
            pieces += 1;
            last = line.to_string();
        })
        .await;
        writer.await.expect("join");
        assert_eq!(longest, MAX_LINE);
        assert_eq!(pieces, (1 << 20) / MAX_LINE + 2);
        assert_eq!(last, "login: ready");
        assert!(lines.has_shown("ns/v"));
        assert!(!lines.has_shown("ns/other"));
        assert_eq!(lines.shown.lock().expect("lock").len(), 1);
    }
}
