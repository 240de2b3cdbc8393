//! Finding and calling launchers (proto/CONTRACT.md §3.1): socket discovery, the peer process
//! (held by a pidfd), one cached cmd client per VMI UID, ghost records, and the notify pipe in
//! each pod.

pub(crate) mod arrivals;
pub mod client;
pub mod ghost;
pub mod process;
pub mod socket;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto::kubevirt::{VirtualMachineInstance, well_known};

pub use client::{CmdError, LauncherClient, MigrationCommand, VmiCommand};
pub use ghost::{GhostRecord, GhostRecords};
pub use process::LauncherProcess;
pub use socket::PodPaths;

use crate::domains::notify::{NotifyHub, VmiIdentity};
use crate::domains::pipe::NotifyPipe;
use crate::podfs;
use crate::sync::LauncherState;

/// How long a pod may exist without a launcher socket before the launcher counts as
/// unresponsive (KubeVirt: 3 minutes).
pub(crate) const SOCKET_APPEAR_TIMEOUT: Duration = Duration::from_secs(180);

/// Where things are on this node.
#[derive(Debug, Clone)]
pub struct LauncherPaths {
    /// The kubelet pods directory as the handler sees it (`/pods` in a cluster).
    pub pods_dir: PathBuf,
    /// `--kubevirt-share-dir`: holds the handler's notify socket (`domains::notify::start`).
    pub share_dir: PathBuf,
    /// Ghost records (`<private dir>/ghost-records`).
    pub ghost_dir: PathBuf,
}

struct Entry {
    key: String,
    socket: PathBuf,
    client: LauncherClient,
    process: Arc<LauncherProcess>,
    _pipe: Option<NotifyPipe>,
}

/// The launchers of this node's VMIs.
pub struct Launchers {
    paths: LauncherPaths,
    node: String,
    ghosts: GhostRecords,
    connected: Mutex<HashMap<String, Entry>>,
    first_looked: Mutex<HashMap<String, Instant>>,
    /// What the notify pipes placed in pods feed; `None`: no pipes.
    notify: Option<NotifyHub>,
}

/// The answer for one VMI: how its launcher is, and a client when it is ready.
pub struct LauncherLookup {
    pub state: LauncherState,
    pub client: Option<LauncherClient>,
    /// The launcher's process, known since the first contact; every use of its `/proc`
    /// entries goes through it (checked against a reused PID).
    pub process: Option<Arc<LauncherProcess>>,
}

impl LauncherLookup {
    fn not_ready() -> Self {
        LauncherLookup {
            state: LauncherState::NotReady,
            client: None,
            process: None,
        }
    }
    fn unresponsive() -> Self {
        LauncherLookup {
            state: LauncherState::Unresponsive,
            client: None,
            process: None,
        }
    }
}

fn vmi_key(vmi: &VirtualMachineInstance) -> String {
    format!(
        "{}/{}",
        vmi.metadata.namespace.as_deref().unwrap_or_default(),
        vmi.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The user owning the launcher's files: `status.runtimeUser` (107 unless root).
pub fn runtime_user(vmi: &VirtualMachineInstance) -> u32 {
    vmi.status
        .as_ref()
        .and_then(|s| s.runtime_user)
        .and_then(|u| u32::try_from(u).ok())
        .unwrap_or(well_known::NON_ROOT_UID)
}

impl Launchers {
    /// Launchers whose notify pipes feed `notify`.
    pub fn new(paths: LauncherPaths, node: &str, notify: NotifyHub) -> Self {
        let ghosts = GhostRecords::new(&paths.ghost_dir);
        Launchers {
            paths,
            node: node.to_string(),
            ghosts,
            connected: Mutex::new(HashMap::new()),
            first_looked: Mutex::new(HashMap::new()),
            notify: Some(notify),
        }
    }

    /// For launchers that are not in a pod of their own (in-process test launchers): their
    /// root is the handler's, so a pipe would land in the host's `/var/run/kubevirt`.
    /// Such launchers report to the notify socket directly.
    pub fn without_notify_pipes(mut self) -> Self {
        self.notify = None;
        self
    }

    /// The serial console socket of `vmi`'s launcher (`virt-serial0` in its pod's `private`
    /// volume), opened without following links and pinned: a connection reaches that socket.
    pub(crate) fn serial_console(
        &self,
        vmi: &VirtualMachineInstance,
    ) -> Result<podfs::PinnedSocket, String> {
        let pod = socket::find_socket(vmi, &self.node, &self.paths.pods_dir)
            .map_err(|e| e.to_string())?;
        let uid = vmi.metadata.uid.as_deref().unwrap_or_default();
        let path = pod
            .empty_dir(proto::contract::pod_paths::PRIVATE_VOLUME)
            .join(uid)
            .join(proto::contract::pod_paths::SERIAL_CONSOLE_SOCKET);
        podfs::PinnedSocket::open(&self.paths.pods_dir, &path)
            .map_err(|e| format!("the serial console socket {}: {e}", path.display()))
    }

    pub fn paths(&self) -> &LauncherPaths {
        &self.paths
    }

    pub fn ghosts(&self) -> &GhostRecords {
        &self.ghosts
    }

    fn connected(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        // Entries are inserted/removed whole; a poisoned lock leaves a consistent map.
        self.connected.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Connects to `socket` for VMI `key`/`uid`: pins the socket (no link below the pods
    /// directory), negotiates, takes the listener's process (a pidfd) through the same
    /// socket, records a ghost record and places the notify pipe in the pod, bound to that
    /// VMI.
    async fn connect(
        &self,
        key: &str,
        uid: &str,
        socket: &Path,
        owner: u32,
    ) -> Result<(LauncherClient, Arc<LauncherProcess>), CmdError> {
        let pinned = podfs::PinnedSocket::open(&self.paths.pods_dir, socket).map_err(|e| {
            CmdError::Connect {
                path: socket.to_path_buf(),
                reason: e.to_string(),
            }
        })?;
        let pinned = std::sync::Arc::new(pinned);
        let client = crate::takeover::step(
            "cmd_connect",
            LauncherClient::connect_pinned(std::sync::Arc::clone(&pinned)),
        )
        .await?;
        let process =
            process::LauncherProcess::listening_on(&pinned).map_err(|e| CmdError::Connect {
                path: socket.to_path_buf(),
                reason: format!("cannot identify the listening process: {e}"),
            })?;
        let process = Arc::new(process);
        let pid = process.pid();
        let placed = Instant::now();
        let (namespace, name) = key.split_once('/').unwrap_or(("", key));
        if let Err(e) = self.ghosts.add(&GhostRecord {
            name: name.to_string(),
            namespace: namespace.to_string(),
            socket_file: socket.to_path_buf(),
            uid: uid.to_string(),
        }) {
            tracing::warn!(key, error = %e, "cannot write ghost record");
        }
        let owner = (owner != 0).then_some(owner);
        let pipe = match &self.notify {
            None => None,
            Some(hub) => match process.root().and_then(|root| {
                NotifyPipe::start_in_root(
                    &root.path(),
                    Path::new(socket::NOTIFY_PIPE_IN_POD),
                    hub.clone(),
                    VmiIdentity {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                        uid: uid.to_string(),
                    },
                    owner,
                )
            }) {
                Ok(p) => Some(p),
                // Without its pipe the launcher's events never arrive and the VMI would
                // wait for the next periodic sync (minutes): fail the connection, as
                // KubeVirt's handler fails the sync, so that it is retried soon.
                Err(e) => {
                    tracing::warn!(key, pid, error = %e, "cannot place the notify pipe in the pod");
                    return Err(CmdError::Connect {
                        path: socket.to_path_buf(),
                        reason: format!("cannot place the notify pipe in the pod: {e}"),
                    });
                }
            },
        };
        tracing::debug!(target: crate::takeover::TARGET, ms = placed.elapsed().as_secs_f64() * 1e3, "ghost record and notify pipe placed");
        self.connected().insert(
            uid.to_string(),
            Entry {
                key: key.to_string(),
                socket: socket.to_path_buf(),
                client: client.clone(),
                process: Arc::clone(&process),
                _pipe: pipe,
            },
        );
        Ok((client, process))
    }

    /// The launcher of `vmi` (proto/CONTRACT.md §3.1 `GetLauncherClient` + responsiveness).
    pub async fn lookup(&self, vmi: &VirtualMachineInstance) -> LauncherLookup {
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let key = vmi_key(vmi);
        let cached = self.connected().get(&uid).map(|e| {
            (
                e.client.clone(),
                Arc::clone(&e.process),
                e.socket.clone(),
                e.socket.with_file_name(socket::UNRESPONSIVE_MARKER),
            )
        });
        if let Some((client, process, socket, marker)) = cached {
            if podfs::entry_exists(&socket) && !podfs::entry_exists(&marker) {
                return LauncherLookup {
                    state: LauncherState::Ready,
                    client: Some(client),
                    process: Some(process),
                };
            }
            // The launcher behind the client is gone or marked. The VMI may have another
            // launcher on this node since: it migrated away and came back (a migration
            // target here, its old pod completed beside the new one). When the old socket
            // is gone, `find_socket` finds only the new one, which replaces the old client;
            // otherwise the VMI would wait on the dead launcher forever.
            match socket::find_socket(vmi, &self.node, &self.paths.pods_dir) {
                Ok(pod) if pod.launcher_socket() != socket => {
                    tracing::info!(%key, old = %socket.display(), new = %pod.launcher_socket().display(),
                        "the VMI has a new launcher on this node: the old one's client is dropped");
                    self.connected().remove(&uid);
                }
                _ => return LauncherLookup::unresponsive(),
            }
        }
        match socket::find_socket(vmi, &self.node, &self.paths.pods_dir) {
            Ok(pod) => {
                if podfs::entry_exists(&pod.unresponsive_marker()) {
                    return LauncherLookup::unresponsive();
                }
                match self
                    .connect(&key, &uid, &pod.launcher_socket(), runtime_user(vmi))
                    .await
                {
                    Ok((client, process)) => LauncherLookup {
                        state: LauncherState::Ready,
                        client: Some(client),
                        process: Some(process),
                    },
                    Err(e) => {
                        tracing::info!(%key, error = %e, "launcher socket present but not answering yet");
                        self.not_ready_or_timed_out(vmi, &uid)
                    }
                }
            }
            Err(socket::FindSocketError::Ambiguous(_)) => LauncherLookup::not_ready(),
            Err(_) => {
                let pods = socket::active_pods_on_node(vmi, &self.node);
                if pods.is_empty() {
                    return LauncherLookup::not_ready();
                }
                let pod_dirs_gone = pods
                    .iter()
                    .all(|p| !PodPaths::new(&self.paths.pods_dir, p).pod_dir.exists());
                if pod_dirs_gone {
                    return LauncherLookup::unresponsive();
                }
                self.not_ready_or_timed_out(vmi, &uid)
            }
        }
    }

    /// Not ready, until the VMI's pods on this node have waited [`SOCKET_APPEAR_TIMEOUT`]
    /// for a launcher socket. Counted per set of pods: a VMI that comes back to this node
    /// (a migration's target pod beside its old, completed pod) waits afresh.
    fn not_ready_or_timed_out(&self, vmi: &VirtualMachineInstance, uid: &str) -> LauncherLookup {
        let mut pods = socket::active_pods_on_node(vmi, &self.node);
        pods.sort_unstable();
        let waiting = format!("{uid}/{}", pods.join(","));
        let mut looked = self.first_looked.lock().unwrap_or_else(|p| p.into_inner());
        let first = *looked.entry(waiting).or_insert_with(Instant::now);
        if first.elapsed() > SOCKET_APPEAR_TIMEOUT {
            LauncherLookup::unresponsive()
        } else {
            LauncherLookup::not_ready()
        }
    }

    /// A client for a launcher known only by UID (stale domains, VMIs already gone),
    /// through the cache or its ghost record. `None` when it cannot be reached.
    pub(crate) async fn client_for_uid(&self, uid: &str) -> Option<LauncherClient> {
        if let Some(e) = self.connected().get(uid) {
            return Some(e.client.clone());
        }
        let record = self.ghosts.list().into_iter().find(|r| r.uid == uid)?;
        if !podfs::entry_exists(&record.socket_file) {
            return None;
        }
        self.connect(
            &record.key(),
            uid,
            &record.socket_file,
            well_known::NON_ROOT_UID,
        )
        .await
        .ok()
        .map(|(c, _)| c)
    }

    /// Whether the launcher of `uid` is gone for good (socket missing or marked).
    pub(crate) fn is_unresponsive(&self, uid: &str) -> bool {
        let socket = self
            .connected()
            .get(uid)
            .map(|e| e.socket.clone())
            .or_else(|| {
                self.ghosts
                    .list()
                    .into_iter()
                    .find(|r| r.uid == uid)
                    .map(|r| r.socket_file)
            });
        match socket {
            Some(s) => {
                !podfs::entry_exists(&s)
                    || podfs::entry_exists(&s.with_file_name(socket::UNRESPONSIVE_MARKER))
            }
            None => true,
        }
    }

    /// Whether the launcher socket at `socket` (a ghost record's) accepts a connection,
    /// reached without links below the pods directory.
    pub(crate) async fn socket_reachable(&self, socket: &Path) -> bool {
        match podfs::PinnedSocket::open(&self.paths.pods_dir, socket) {
            Ok(pinned) => pinned.connect_async().await.is_ok(),
            Err(_) => false,
        }
    }

    /// Marks the launcher behind `socket` unresponsive (`launcher-unresponsive` next to
    /// it), creating the marker without following links.
    pub(crate) fn mark_unresponsive(&self, socket: &Path) {
        let marker = socket.with_file_name(socket::UNRESPONSIVE_MARKER);
        let Ok(inner) = marker.strip_prefix(&self.paths.pods_dir) else {
            tracing::warn!(socket = %socket.display(), "launcher socket is not under the pods directory");
            return;
        };
        if let Err(e) = podfs::touch_beneath(&self.paths.pods_dir, inner) {
            tracing::debug!(marker = %marker.display(), error = %e, "cannot write the unresponsive marker");
        }
    }

    /// The launcher's PID at the first contact, when connected (for messages: its `/proc`
    /// entries are reached through [`LauncherLookup::process`]).
    pub fn pid(&self, uid: &str) -> Option<u32> {
        self.connected().get(uid).map(|e| e.process.pid())
    }

    /// Forgets the launcher of `uid`: client, notify pipe, ghost record.
    pub fn cleanup(&self, uid: &str) {
        if let Some(entry) = self.connected().remove(uid) {
            tracing::debug!(key = %entry.key, uid, "launcher client closed");
        }
        let waiting = format!("{uid}/");
        self.first_looked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|k, _| !k.starts_with(&waiting));
        if let Err(e) = self.ghosts.remove(uid) {
            tracing::warn!(uid, error = %e, "cannot remove ghost record");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launchers(dir: &Path) -> Launchers {
        Launchers::new(
            LauncherPaths {
                pods_dir: dir.join("pods"),
                share_dir: dir.join("share"),
                ghost_dir: dir.join("ghosts"),
            },
            "n1",
            crate::domains::notify::test_hub(),
        )
    }

    #[test]
    fn the_unresponsive_marker_never_follows_a_planted_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = launchers(dir.path());
        let pod = PodPaths::new(&dir.path().join("pods"), "p1");
        std::fs::create_dir_all(pod.sockets_dir()).expect("mkdir");
        let victim = dir.path().join("host-file");
        std::fs::write(&victim, b"precious").expect("write");
        std::os::unix::fs::symlink(&victim, pod.unresponsive_marker()).expect("symlink");
        l.mark_unresponsive(&pod.launcher_socket());
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        std::fs::remove_file(pod.unresponsive_marker()).expect("rm");
        l.mark_unresponsive(&pod.launcher_socket());
        assert!(pod.unresponsive_marker().is_file());
        assert!(l.is_unresponsive("unknown-uid"));
    }

    #[tokio::test]
    async fn a_socket_reached_through_a_link_is_not_reachable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let l = launchers(dir.path());
        let pod = PodPaths::new(&dir.path().join("pods"), "p1");
        std::fs::create_dir_all(pod.sockets_dir()).expect("mkdir");
        let elsewhere = dir.path().join("elsewhere.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&elsewhere).expect("bind");
        std::os::unix::fs::symlink(&elsewhere, pod.launcher_socket()).expect("symlink");
        assert!(!l.socket_reachable(&pod.launcher_socket()).await);
        std::fs::remove_file(pod.launcher_socket()).expect("rm");
        let _own = std::os::unix::net::UnixListener::bind(pod.launcher_socket()).expect("bind");
        assert!(l.socket_reachable(&pod.launcher_socket()).await);
    }
}
