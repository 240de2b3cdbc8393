//! Whether a device node can be handed to a container, and the inotify watch that says
//! when to look again.
//!
//! KubeVirt's generic plugin watches the device's directory with fsnotify and flips the
//! health on create/remove. This does the same with inotify (no polling: the kernel
//! tells us the moment a node appears, disappears or changes), but a change re-runs one
//! full probe instead of trusting the event kind: the node must be a character device
//! that opens read-write. That also catches a node replaced by something unusable (a
//! regular file, a node of an unloaded driver), which the event kind alone would call
//! healthy. Loading or unloading a driver creates or removes its node in devtmpfs, so
//! the watch sees those too.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, InotifyEvent};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

/// The health of every device of one plugin (they all stand for the same node).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Healthy,
    Unhealthy,
}

impl Health {
    /// The `Device.health` string of the device-plugin API.
    pub(crate) fn as_api_str(self) -> &'static str {
        use proto::grpc::deviceplugin::v1beta1::{HEALTHY, UNHEALTHY};
        match self {
            Health::Healthy => HEALTHY,
            Health::Unhealthy => UNHEALTHY,
        }
    }
}

/// Probes `node` (the device as the handler sees it, e.g. `/proc/1/root/dev/kvm`):
/// healthy when it is a character device (a link is not followed) that opens read-write.
/// Opening also makes the kernel load the driver of a node that triggers it on first use
/// (tun, vhost-net), as KubeVirt's pre-open does.
pub fn probe(node: &Path) -> Health {
    let is_char_device = std::fs::symlink_metadata(node)
        .map(|m| m.file_type().is_char_device())
        .unwrap_or(false);
    if !is_char_device {
        return Health::Unhealthy;
    }
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(node);
    match opened {
        Ok(_) => Health::Healthy,
        Err(e) => {
            tracing::debug!(node = %node.display(), error = %e, "device node does not open");
            Health::Unhealthy
        }
    }
}

/// The directories to watch for `node` under `root`: every directory from `root` down to
/// the node's parent, so a parent that appears late (`/dev/net`) is noticed too.
pub(crate) fn watched_dirs(root: &Path, device: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut current = root.to_path_buf();
    if let Some(parent) = device.parent() {
        for part in parent.components() {
            if let std::path::Component::Normal(name) = part {
                current = current.join(name);
                dirs.push(current.clone());
            }
        }
    }
    dirs
}

struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl AsFd for InotifyFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// An inotify instance watching directories for entries that come, go or change.
pub(crate) struct DirWatch {
    fd: AsyncFd<InotifyFd>,
}

/// What a directory watch reports: the directory and the entry name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DirEvent {
    pub dir: PathBuf,
    pub name: Option<std::ffi::OsString>,
    /// The entry is gone (deleted or moved away), or the directory itself is.
    pub gone: bool,
}

impl DirWatch {
    pub fn new() -> std::io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // SAFETY: `InotifyFd` owns the descriptor (an `OwnedFd` inside `Inotify`), so it
        // stays open exactly as long as the `AsyncFd` holding it.
        let fd = unsafe { AsyncFd::register_with_interest(InotifyFd(inotify), Interest::READABLE) }
            .map_err(std::io::Error::from)?;
        Ok(DirWatch { fd })
    }

    /// Watches `dir` (again: adding a watched directory is harmless). Returns false when
    /// the directory does not exist (yet).
    pub fn watch(&self, dir: &Path, watches: &mut Vec<(i32, PathBuf)>) -> std::io::Result<bool> {
        let flags = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_ATTRIB
            | AddWatchFlags::IN_DELETE_SELF
            | AddWatchFlags::IN_MOVE_SELF
            | AddWatchFlags::IN_ONLYDIR;
        match self.fd.get_ref().0.add_watch(dir, flags) {
            Ok(wd) => {
                let wd = wd.as_raw();
                watches.retain(|(w, _)| *w != wd);
                watches.push((wd, dir.to_path_buf()));
                Ok(true)
            }
            Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ENOTDIR) => Ok(false),
            Err(e) => Err(std::io::Error::from(e)),
        }
    }

    /// Waits for the next batch of events, mapped to the watched directories.
    pub async fn next(&self, watches: &[(i32, PathBuf)]) -> std::io::Result<Vec<DirEvent>> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from)) {
                Ok(Ok(events)) => return Ok(map_events(events, watches)),
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

fn map_events(events: Vec<InotifyEvent>, watches: &[(i32, PathBuf)]) -> Vec<DirEvent> {
    events
        .into_iter()
        .filter_map(|e| {
            let dir = watches
                .iter()
                .find(|(wd, _)| *wd == e.wd.as_raw())
                .map(|(_, d)| d.clone())?;
            let gone = e.mask.intersects(
                AddWatchFlags::IN_DELETE
                    | AddWatchFlags::IN_MOVED_FROM
                    | AddWatchFlags::IN_DELETE_SELF
                    | AddWatchFlags::IN_MOVE_SELF
                    | AddWatchFlags::IN_IGNORED,
            );
            Some(DirEvent {
                dir,
                name: e.name,
                gone,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};

    /// A character device node with /dev/null's numbers: opens read-write anywhere.
    pub(crate) fn null_node(path: &Path) {
        mknod(
            path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(1, 3),
        )
        .expect("mknod (tests run as root)");
    }

    #[test]
    fn only_an_openable_character_device_is_healthy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let node = dir.path().join("kvm");
        assert_eq!(probe(&node), Health::Unhealthy, "missing");
        std::fs::write(&node, b"").expect("file");
        assert_eq!(probe(&node), Health::Unhealthy, "a regular file");
        std::fs::remove_file(&node).expect("rm");
        null_node(&node);
        assert_eq!(probe(&node), Health::Healthy);
        // A link to a good node is not followed.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&node, &link).expect("symlink");
        assert_eq!(probe(&link), Health::Unhealthy, "a symlink");
        // A node whose driver is not there (no character driver has major 4000): ENXIO.
        std::fs::remove_file(&node).expect("rm");
        mknod(
            &node,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            makedev(4000, 7),
        )
        .expect("mknod");
        assert_eq!(probe(&node), Health::Unhealthy, "no driver");
    }

    #[test]
    fn every_directory_down_to_the_parent_is_watched() {
        assert_eq!(
            watched_dirs(Path::new("/proc/1/root"), Path::new("/dev/net/tun")),
            vec![
                PathBuf::from("/proc/1/root"),
                PathBuf::from("/proc/1/root/dev"),
                PathBuf::from("/proc/1/root/dev/net"),
            ]
        );
        assert_eq!(
            watched_dirs(Path::new("/r"), Path::new("/dev/kvm")),
            vec![PathBuf::from("/r"), PathBuf::from("/r/dev")]
        );
    }

    #[tokio::test]
    async fn the_watch_reports_entries_that_come_and_go() {
        let dir = tempfile::tempdir().expect("tempdir");
        let watch = DirWatch::new().expect("inotify");
        let mut watches = Vec::new();
        assert!(
            !watch
                .watch(&dir.path().join("missing"), &mut watches)
                .expect("watch")
        );
        assert!(watch.watch(dir.path(), &mut watches).expect("watch"));
        std::fs::write(dir.path().join("a"), b"").expect("create");
        let events = tokio::time::timeout(std::time::Duration::from_secs(10), watch.next(&watches))
            .await
            .expect("event in time")
            .expect("events");
        assert!(
            events
                .iter()
                .any(|e| e.name.as_deref() == Some("a".as_ref()) && !e.gone)
        );
        std::fs::remove_file(dir.path().join("a")).expect("rm");
        let mut seen_gone = false;
        while !seen_gone {
            let events =
                tokio::time::timeout(std::time::Duration::from_secs(10), watch.next(&watches))
                    .await
                    .expect("event in time")
                    .expect("events");
            seen_gone = events
                .iter()
                .any(|e| e.name.as_deref() == Some("a".as_ref()) && e.gone);
        }
    }
}
