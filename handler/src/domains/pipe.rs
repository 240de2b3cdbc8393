//! The notify pipe: a socket the handler places inside each launcher pod
//! (`<launcher root>/var/run/kubevirt/domain-notify-pipe.sock`) and byte-proxies to its own
//! notify server, so launchers reach the handler without sharing a directory with it
//! (KubeVirt's `notify-server/pipe`).

use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio::task::JoinHandle;

/// A listening pipe; dropping it stops accepting and removes the socket file.
pub struct NotifyPipe {
    path: PathBuf,
    /// (device, inode) of the socket file this pipe bound, so that dropping an older
    /// pipe never removes a newer one bound at the same path.
    identity: Option<(u64, u64)>,
    task: JoinHandle<()>,
}

fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(path)
        .ok()
        .map(|m| (m.dev(), m.ino()))
}

impl NotifyPipe {
    /// Binds `pipe` (replacing a stale file), gives it to `owner` (the launcher's user, so a
    /// non-root launcher can connect) and proxies every connection to `target`.
    pub fn start(pipe: &Path, target: &Path, owner: Option<u32>) -> std::io::Result<Self> {
        match std::fs::remove_file(pipe) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        let short = crate::launchers::socket::SocketPath::new(pipe)?;
        let listener = UnixListener::bind(short.path())?;
        if let Some(uid) = owner {
            // lchown: the pod owns the directory; never follow a link it may plant.
            std::os::unix::fs::lchown(pipe, Some(uid), Some(uid))?;
        }
        let target = target.to_path_buf();
        let task = tokio::spawn(async move {
            loop {
                let (mut inbound, _) = match listener.accept().await {
                    Ok(conn) => conn,
                    Err(e) => {
                        tracing::warn!(error = %e, "notify pipe accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let target = target.clone();
                tokio::spawn(async move {
                    match crate::launchers::socket::connect_async(&target).await {
                        Ok(mut outbound) => {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                        Err(e) => tracing::warn!(
                            target = %target.display(),
                            error = %e,
                            "notify pipe cannot reach the notify server"
                        ),
                    }
                });
            }
        });
        Ok(NotifyPipe {
            path: pipe.to_path_buf(),
            identity: identity(pipe),
            task,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for NotifyPipe {
    fn drop(&mut self) {
        self.task.abort();
        // The pod may already be gone, taking the file with it; and a newer pipe may
        // have replaced ours at the same path.
        if self.identity.is_some() && identity(&self.path) == self.identity {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dropping_an_older_pipe_keeps_the_newer_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pipe.sock");
        let target = dir.path().join("server.sock");
        let old = NotifyPipe::start(&path, &target, None).expect("old pipe");
        let new = NotifyPipe::start(&path, &target, None).expect("new pipe");
        drop(old);
        assert!(path.exists(), "the newer pipe's socket stays");
        drop(new);
        assert!(!path.exists());
    }
}
