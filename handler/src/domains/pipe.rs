//! The notify pipe: a socket the handler places inside each launcher pod
//! (`<launcher root>/var/run/kubevirt/domain-notify-pipe.sock`), so launchers reach the
//! handler without sharing a directory with it (KubeVirt's `notify-server/pipe`).
//!
//! KubeVirt's pipe copies bytes to the handler's one notify socket, where every event is
//! taken about whichever VMI it names. Here the pipe serves the notify services itself,
//! bound to the VMI of the pod it was placed in ([`super::notify`]): a pod can report about
//! its own VMI only, within the pipe's bounds.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::fcntl::{AtFlags, OFlag};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use tokio::net::UnixListener;

use super::notify::{self, NotifyHub, VmiIdentity};
use crate::podfs;

/// A listening pipe; dropping it stops accepting and removes the socket file.
pub struct NotifyPipe {
    path: PathBuf,
    /// The directory the socket was bound in, held open: the removal on drop happens
    /// there even if the pod swapped a directory on the way for a link meanwhile.
    dir: OwnedFd,
    name: std::ffi::OsString,
    /// (device, inode) of the socket file this pipe bound, so that dropping an older
    /// pipe never removes a newer one bound at the same path.
    identity: Option<(u64, u64)>,
    /// Ends the pipe's server: it accepts nothing more and its connections close once
    /// their requests are answered.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

fn identity(dir: &OwnedFd, name: &std::ffi::OsStr) -> Option<(u64, u64)> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .ok()
        .map(|s| (s.st_dev, s.st_ino))
}

impl NotifyPipe {
    /// Binds `pipe` (a path the handler controls; its directory must exist), replacing a
    /// stale file, gives it to `owner` and serves notify events about `vmi` on it.
    pub fn start(
        pipe: &Path,
        hub: NotifyHub,
        vmi: VmiIdentity,
        owner: Option<u32>,
    ) -> std::io::Result<Self> {
        let (parent, name) = split(pipe)?;
        let dir = nix::fcntl::open(
            parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(std::io::Error::from)?;
        Self::start_at(dir, name, pipe.to_path_buf(), hub, vmi, owner)
    }

    /// Binds `pipe` inside a launcher's root (`/proc/<pid>/root`): the directory is
    /// resolved as the pod sees it and never outside `root` (the pod's `/var/run` is
    /// usually a link to `/run`), then the socket is bound, owned and later removed
    /// through that directory's descriptor, never by name.
    pub(crate) fn start_in_root(
        root: &Path,
        pipe: &Path,
        hub: NotifyHub,
        vmi: VmiIdentity,
        owner: Option<u32>,
    ) -> std::io::Result<Self> {
        let (parent, name) = split(pipe)?;
        let dir = podfs::open_in_root(root, parent, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
        let shown = root.join(pipe.strip_prefix("/").unwrap_or(pipe));
        Self::start_at(dir, name, shown, hub, vmi, owner)
    }

    fn start_at(
        dir: OwnedFd,
        name: &std::ffi::OsStr,
        path: PathBuf,
        hub: NotifyHub,
        vmi: VmiIdentity,
        owner: Option<u32>,
    ) -> std::io::Result<Self> {
        match nix::unistd::unlinkat(&dir, name, UnlinkatFlags::NoRemoveDir) {
            Err(nix::errno::Errno::ENOENT) | Ok(()) => {}
            Err(e) => return Err(std::io::Error::from(e)),
        }
        let listener = UnixListener::bind(podfs::fd_path(&dir).join(name))?;
        if let Some(uid) = owner {
            // The socket just bound, by name in the pinned directory, never a link.
            nix::unistd::fchownat(
                &dir,
                name,
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(uid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(std::io::Error::from)?;
        }
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let shown = path.display().to_string();
        tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            if let Err(e) = notify::serve(listener, hub, Some(vmi), shutdown).await {
                tracing::warn!(pipe = %shown, error = %e, "notify pipe stopped");
            }
        });
        let identity = identity(&dir, name);
        Ok(NotifyPipe {
            path,
            dir,
            name: name.to_os_string(),
            identity,
            stop: Some(stop),
        })
    }

    /// Where the pipe is, as the handler sees it (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

fn split(pipe: &Path) -> std::io::Result<(&Path, &std::ffi::OsStr)> {
    match (pipe.parent(), pipe.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name)),
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} has no directory and name", pipe.display()),
        )),
    }
}

impl Drop for NotifyPipe {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // The pod may already be gone, taking the file with it; and a newer pipe may
        // have replaced ours at the same path.
        if self.identity.is_some() && identity(&self.dir, &self.name) == self.identity {
            let _ =
                nix::unistd::unlinkat(&self.dir, self.name.as_os_str(), UnlinkatFlags::NoRemoveDir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub() -> NotifyHub {
        notify::test_hub()
    }

    fn vmi() -> VmiIdentity {
        VmiIdentity {
            namespace: "ns".into(),
            name: "vmi".into(),
            uid: "u-1".into(),
        }
    }

    #[tokio::test]
    async fn dropping_an_older_pipe_keeps_the_newer_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pipe.sock");
        let old = NotifyPipe::start(&path, hub(), vmi(), None).expect("old pipe");
        let new = NotifyPipe::start(&path, hub(), vmi(), None).expect("new pipe");
        drop(old);
        assert!(path.exists(), "the newer pipe's socket stays");
        drop(new);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn the_pipe_goes_where_the_pod_sees_its_directory_never_outside_the_root() {
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("run/kubevirt")).expect("mkdir");
        std::fs::create_dir_all(root.join("var")).expect("mkdir");
        std::os::unix::fs::symlink("/run", root.join("var/run")).expect("symlink");
        let pipe_in_pod = Path::new("/var/run/kubevirt/domain-notify-pipe.sock");
        let pipe = NotifyPipe::start_in_root(&root, pipe_in_pod, hub(), vmi(), Some(107))
            .expect("pipe in the pod's /run");
        let bound = root.join("run/kubevirt/domain-notify-pipe.sock");
        let meta = std::fs::symlink_metadata(&bound).expect("socket in the pod");
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.uid(), 107);
        drop(pipe);
        assert!(!bound.exists(), "removed with the pipe");

        // The pod turns its directory into a link that would leave the root from the
        // handler's side: it resolves inside the root, or not at all.
        std::fs::create_dir_all(dir.path().join("outside")).expect("mkdir");
        std::fs::remove_dir(root.join("run/kubevirt")).expect("rmdir");
        let escape = format!("/../../../{}", dir.path().join("outside").display());
        std::os::unix::fs::symlink(&escape, root.join("run/kubevirt")).expect("symlink");
        // The result is held while the outside is looked at: a pipe bound there would be
        // removed again by its drop.
        let escaped = NotifyPipe::start_in_root(&root, pipe_in_pod, hub(), vmi(), Some(107));
        assert!(
            !dir.path().join("outside/domain-notify-pipe.sock").exists(),
            "nothing bound outside the pod's root"
        );
        let err = escaped
            .map(|pipe| pipe.path().to_path_buf())
            .expect_err("a directory that leaves the root is not found inside it");
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound, "{err}");
    }
}
