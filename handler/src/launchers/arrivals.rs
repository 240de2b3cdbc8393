//! Waking a VMI the moment its launcher's cmd socket appears, instead of looking again
//! and again: an inotify watch on the sockets directory of each pod whose launcher is
//! awaited (the launcher creates `launcher-sock` by renaming its init socket once it
//! answers, KubeVirt v1.9.0's `cmd-server` does the same, so `IN_MOVED_TO` or
//! `IN_CREATE` of that name is the signal). The watch only wakes the VMI's reconcile,
//! which then finds and opens the socket the safe way (`find_socket`); a pod that plays
//! with its directory gets its own VMI reconciled, de-duplicated by the work queue.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::path::Path;
use std::sync::{Arc, Mutex};

use nix::fcntl::OFlag;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use super::socket::LAUNCHER_SOCK;
use crate::podfs;

struct Shared(Arc<Inotify>);

impl AsRawFd for Shared {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

impl AsFd for Shared {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// The watched sockets directories, and which VMI keys wait on each.
#[derive(Default)]
struct Watches {
    by_wd: HashMap<WatchDescriptor, Vec<String>>,
    by_key: HashMap<String, WatchDescriptor>,
}

/// The inotify watches of the launcher sockets awaited.
pub struct SocketArrivals {
    inotify: Arc<Inotify>,
    watches: Mutex<Watches>,
}

impl SocketArrivals {
    pub fn new() -> std::io::Result<Self> {
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        Ok(SocketArrivals {
            inotify: Arc::new(inotify),
            watches: Mutex::new(Watches::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Watches> {
        // Both maps are changed together under the lock; a poisoned one is consistent.
        self.watches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Watches `sockets_dir` (below `pods_dir`, reached without any link) for `key`'s
    /// launcher socket. `Ok(false)`: the directory is not there (yet).
    pub(crate) fn watch(
        &self,
        key: &str,
        pods_dir: &Path,
        sockets_dir: &Path,
    ) -> std::io::Result<bool> {
        if self.lock().by_key.contains_key(key) {
            return Ok(true);
        }
        let Ok(inner) = sockets_dir.strip_prefix(pods_dir) else {
            return Ok(false);
        };
        let dir = match podfs::open_beneath(pods_dir, inner, OFlag::O_PATH | OFlag::O_DIRECTORY) {
            Ok(dir) => dir,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(e),
        };
        let wd = self.inotify.add_watch(
            &podfs::fd_path(&dir),
            AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO | AddWatchFlags::IN_ONLYDIR,
        )?;
        let mut w = self.lock();
        w.by_wd.entry(wd).or_default().push(key.to_string());
        w.by_key.insert(key.to_string(), wd);
        Ok(true)
    }

    /// Stops watching for `key` (its launcher was found, or its VMI is gone).
    pub(crate) fn forget(&self, key: &str) {
        let mut w = self.lock();
        let Some(wd) = w.by_key.remove(key) else {
            return;
        };
        let last = match w.by_wd.get_mut(&wd) {
            Some(keys) => {
                keys.retain(|k| k != key);
                keys.is_empty()
            }
            None => false,
        };
        if last {
            w.by_wd.remove(&wd);
            // The directory may be gone already (the kernel removed the watch then).
            let _ = self.inotify.rm_watch(wd);
        }
    }

    /// Calls `wake` with each key whose launcher socket appeared, until the inotify
    /// descriptor fails. The watch of an arrived socket is removed.
    pub async fn run(self: Arc<Self>, wake: impl Fn(&str)) -> std::io::Result<()> {
        // SAFETY: `Shared` holds the `Inotify` (its `OwnedFd`) by an `Arc`, so the
        // descriptor stays open at least as long as the `AsyncFd` holding it.
        let fd = unsafe {
            AsyncFd::register_with_interest(Shared(Arc::clone(&self.inotify)), Interest::READABLE)
        }
        .map_err(std::io::Error::from)?;
        loop {
            let mut guard = fd.readable().await?;
            let events =
                match guard.try_io(|f| f.get_ref().0.read_events().map_err(std::io::Error::from)) {
                    Ok(Ok(events)) => events,
                    Ok(Err(e)) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Ok(Err(e)) => return Err(e),
                    Err(_would_block) => continue,
                };
            for event in events {
                if event.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    // Events were lost: wake every waiting VMI, each looks for itself.
                    let keys: Vec<String> = self.lock().by_key.keys().cloned().collect();
                    keys.iter().for_each(|k| wake(k));
                    continue;
                }
                if event.name.as_deref() != Some(std::ffi::OsStr::new(LAUNCHER_SOCK)) {
                    continue;
                }
                let keys = self
                    .lock()
                    .by_wd
                    .get(&event.wd)
                    .cloned()
                    .unwrap_or_default();
                for key in keys {
                    tracing::debug!(target: crate::takeover::TARGET, %key, "launcher socket appeared (inotify)");
                    self.forget(&key);
                    wake(&key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn woken_keys() -> (Arc<Mutex<Vec<String>>>, impl Fn(&str)) {
        let woken = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&woken);
        (woken, move |k: &str| {
            sink.lock().expect("lock").push(k.to_string())
        })
    }

    async fn wait_for_wake(woken: &Mutex<Vec<String>>) -> Vec<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = woken.lock().expect("lock").clone();
            if !now.is_empty() || std::time::Instant::now() > deadline {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn the_socket_renamed_into_place_wakes_its_vmi_and_nothing_else_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let sockets = pods.join("p1/volumes/kubernetes.io~empty-dir/sockets");
        std::fs::create_dir_all(&sockets).expect("mkdir");
        let arrivals = Arc::new(SocketArrivals::new().expect("inotify"));
        assert!(arrivals.watch("ns/a", &pods, &sockets).expect("watch"));
        let (woken, wake) = woken_keys();
        let task = tokio::spawn(Arc::clone(&arrivals).run(wake));

        // Other names (the init socket, a marker) wake nothing.
        let _init = std::os::unix::net::UnixListener::bind(sockets.join("launcher-init-sock"))
            .expect("bind");
        std::fs::write(sockets.join("other"), b"").expect("write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(
            woken.lock().expect("lock").is_empty(),
            "woken by another name"
        );

        // The launcher renames its socket into place once it answers.
        std::fs::rename(
            sockets.join("launcher-init-sock"),
            sockets.join(LAUNCHER_SOCK),
        )
        .expect("rename");
        assert_eq!(wait_for_wake(&woken).await, ["ns/a"]);
        // The watch is gone after the arrival: a new socket wakes nobody.
        std::fs::remove_file(sockets.join(LAUNCHER_SOCK)).expect("rm");
        std::fs::write(sockets.join(LAUNCHER_SOCK), b"").expect("write");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(woken.lock().expect("lock").len(), 1);
        task.abort();
    }

    #[tokio::test]
    async fn a_forgotten_key_is_not_woken() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let sockets = pods.join("p1/sockets");
        std::fs::create_dir_all(&sockets).expect("mkdir");
        let arrivals = Arc::new(SocketArrivals::new().expect("inotify"));
        assert!(arrivals.watch("ns/a", &pods, &sockets).expect("watch"));
        assert!(
            arrivals
                .watch("ns/b", &pods, &sockets)
                .expect("same dir, second key")
        );
        arrivals.forget("ns/a");
        let (woken, wake) = woken_keys();
        let task = tokio::spawn(Arc::clone(&arrivals).run(wake));
        std::fs::write(sockets.join(LAUNCHER_SOCK), b"").expect("write");
        assert_eq!(wait_for_wake(&woken).await, ["ns/b"]);
        task.abort();
    }

    #[test]
    fn a_sockets_dir_reached_through_a_link_or_missing_is_not_watched() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(pods.join("p1")).expect("mkdir");
        std::fs::create_dir_all(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, pods.join("p1/sockets")).expect("symlink");
        let arrivals = SocketArrivals::new().expect("inotify");
        assert!(
            arrivals
                .watch("ns/a", &pods, &pods.join("p1/sockets"))
                .is_err()
        );
        assert!(
            !arrivals
                .watch("ns/a", &pods, &pods.join("p2/sockets"))
                .expect("missing")
        );
        assert!(
            !arrivals
                .watch("ns/a", &pods, &elsewhere)
                .expect("outside the pods dir")
        );
    }
}
