//! Where a launcher's sockets are and who is listening on them (proto/CONTRACT.md §3.1).
//!
//! Pod directories are written by pods: a socket is only taken when the whole path below
//! the pods directory is free of links (see [`crate::podfs`]).

use std::path::{Path, PathBuf};

use proto::kubevirt::VirtualMachineInstance;
pub use proto::unix::{SocketPath, connect, connect_async};

/// The cmd socket once the launcher is ready (`StandardLauncherSocketFileName`).
pub(crate) const LAUNCHER_SOCK: &str = "launcher-sock";
/// Touched by the handler when a launcher stops answering.
pub(crate) const UNRESPONSIVE_MARKER: &str = "launcher-unresponsive";
/// The notify pipe inside the pod, relative to the launcher's root.
pub(crate) const NOTIFY_PIPE_IN_POD: &str = "/var/run/kubevirt/domain-notify-pipe.sock";
/// The serial console socket inside the pod.
pub fn serial_console_in_pod(vmi_uid: &str) -> String {
    format!("/var/run/kubevirt-private/{vmi_uid}/virt-serial0")
}

/// The kubelet layout of one pod under the pods directory (`/pods` in the handler's
/// container, `/var/lib/kubelet/pods` on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodPaths {
    pub pod_dir: PathBuf,
}

impl PodPaths {
    pub fn new(pods_dir: &Path, pod_uid: &str) -> Self {
        PodPaths {
            pod_dir: pods_dir.join(pod_uid),
        }
    }

    /// An emptyDir volume of the pod.
    pub fn empty_dir(&self, volume: &str) -> PathBuf {
        self.pod_dir
            .join("volumes/kubernetes.io~empty-dir")
            .join(volume)
    }

    pub fn sockets_dir(&self) -> PathBuf {
        self.empty_dir("sockets")
    }

    pub fn launcher_socket(&self) -> PathBuf {
        self.sockets_dir().join(LAUNCHER_SOCK)
    }

    pub(crate) fn unresponsive_marker(&self) -> PathBuf {
        self.sockets_dir().join(UNRESPONSIVE_MARKER)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum FindSocketError {
    #[error("VMI has no active pods on node {0}")]
    NoActivePods(String),
    #[error("no launcher socket found for the VMI's pods on node {0}")]
    NotFound(String),
    #[error("found {0} launcher sockets, expected exactly one")]
    Ambiguous(usize),
}

/// A pod UID as a directory name: one plain path component.
pub(crate) fn valid_pod_uid(uid: &str) -> bool {
    !uid.is_empty() && uid != "." && uid != ".." && !uid.contains('/') && !uid.contains('\0')
}

/// The pods of the VMI on this node (`status.activePods` entries whose node matches;
/// an empty node name matches any). A UID that is no plain directory name is ignored.
pub(crate) fn active_pods_on_node<'a>(
    vmi: &'a VirtualMachineInstance,
    node: &'a str,
) -> Vec<&'a str> {
    vmi.status
        .as_ref()
        .and_then(|s| s.active_pods.as_ref())
        .map(|pods| {
            pods.iter()
                .filter(|(_, n)| node.is_empty() || n.as_str() == node)
                .map(|(uid, _)| uid.as_str())
                .filter(|uid| valid_pod_uid(uid))
                .collect()
        })
        .unwrap_or_default()
}

/// `FindSocket`: exactly one `launcher-sock` among the VMI's pods on this node, each a
/// socket reached without any link below `pods_dir` (KubeVirt: `safepath.NewPathNoFollow`).
pub(crate) fn find_socket(
    vmi: &VirtualMachineInstance,
    node: &str,
    pods_dir: &Path,
) -> Result<PodPaths, FindSocketError> {
    let pods = active_pods_on_node(vmi, node);
    if pods.is_empty() {
        return Err(FindSocketError::NoActivePods(node.to_string()));
    }
    let found: Vec<PodPaths> = pods
        .into_iter()
        .map(|uid| PodPaths::new(pods_dir, uid))
        .filter(|p| crate::podfs::PinnedSocket::open(pods_dir, &p.launcher_socket()).is_ok())
        .collect();
    match found.len() {
        0 => Err(FindSocketError::NotFound(node.to_string())),
        1 => Ok(found.into_iter().next().expect("length checked above")),
        n => Err(FindSocketError::Ambiguous(n)),
    }
}

/// The PID of the process listening on a unix socket, through `SO_PEERCRED` of a
/// connection to it (the isolation detector's trick: that PID's `/proc` entries give the
/// pod's root and namespaces).
#[cfg(test)]
pub(crate) fn peer_pid(socket: &Path) -> std::io::Result<u32> {
    crate::podfs::peer_pid_of(&connect(socket)?)
}

/// Most symlinks followed in one resolution (Linux's limit).
const MAX_SYMLINKS: usize = 40;

/// Resolves `path` (absolute inside the pod) under `root`, following symlinks as the pod
/// sees them: an absolute link target restarts from `root`, never from the handler's own
/// `/`. (`/proc/<pid>/root/var/run` is a symlink to `/run` in most images: resolved by
/// the kernel it would land in the host's `/run`.) Like KubeVirt's safepath, `..` never
/// climbs above `root`. The last component is not resolved (it may not exist yet).
pub(crate) fn resolve_in_root(root: &Path, path: &Path) -> std::io::Result<PathBuf> {
    use std::path::Component;
    let mut pending: Vec<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .rev()
        .collect();
    let mut resolved: Vec<std::ffi::OsString> = Vec::new();
    let mut hops = 0;
    while let Some(name) = pending.pop() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        let candidate: PathBuf = resolved
            .iter()
            .fold(root.to_path_buf(), |p, c| p.join(c))
            .join(&name);
        let is_last = pending.is_empty();
        match std::fs::symlink_metadata(&candidate) {
            Ok(meta) if meta.file_type().is_symlink() && !is_last => {
                hops += 1;
                if hops > MAX_SYMLINKS {
                    return Err(std::io::Error::other(format!(
                        "too many symlinks resolving {} in {}",
                        path.display(),
                        root.display()
                    )));
                }
                let target = std::fs::read_link(&candidate)?;
                if target.is_absolute() {
                    resolved.clear();
                }
                for c in target.components().rev() {
                    match c {
                        Component::Normal(n) => pending.push(n.to_os_string()),
                        Component::ParentDir => pending.push("..".into()),
                        _ => {}
                    }
                }
            }
            _ => resolved.push(name),
        }
    }
    Ok(resolved.iter().fold(root.to_path_buf(), |p, c| p.join(c)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::kubevirt::VirtualMachineInstanceStatus;

    fn vmi_with_pods(pods: &[(&str, &str)]) -> VirtualMachineInstance {
        let mut vmi = proto::kubevirt::parse_vmi(
            r#"{"metadata":{"name":"v","namespace":"d","uid":"u"},"spec":{"domain":{"devices":{}}}}"#,
        )
        .expect("valid VMI");
        vmi.status = Some(VirtualMachineInstanceStatus {
            active_pods: Some(
                pods.iter()
                    .map(|(p, n)| (p.to_string(), n.to_string()))
                    .collect(),
            ),
            ..Default::default()
        });
        vmi
    }

    #[test]
    fn socket_path_follows_kubelet_layout() {
        let p = PodPaths::new(Path::new("/pods"), "abc");
        assert_eq!(
            p.launcher_socket(),
            Path::new("/pods/abc/volumes/kubernetes.io~empty-dir/sockets/launcher-sock")
        );
    }

    #[test]
    fn find_socket_requires_exactly_one_on_this_node() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vmi = vmi_with_pods(&[("p1", "n1"), ("p2", "n1"), ("p3", "other")]);
        assert_eq!(
            find_socket(&vmi, "n1", dir.path()),
            Err(FindSocketError::NotFound("n1".into()))
        );
        let mut listeners = Vec::new();
        for pod in ["p1", "p3"] {
            let s = PodPaths::new(dir.path(), pod).sockets_dir();
            std::fs::create_dir_all(&s).expect("mkdir");
            listeners
                .push(std::os::unix::net::UnixListener::bind(s.join(LAUNCHER_SOCK)).expect("bind"));
        }
        assert_eq!(
            find_socket(&vmi, "n1", dir.path()).map(|p| p.pod_dir),
            Ok(dir.path().join("p1"))
        );
        // Empty node name matches every pod: now two sockets.
        assert_eq!(
            find_socket(&vmi, "", dir.path()),
            Err(FindSocketError::Ambiguous(2))
        );
        let none = vmi_with_pods(&[]);
        assert!(matches!(
            find_socket(&none, "n1", dir.path()),
            Err(FindSocketError::NoActivePods(_))
        ));
    }

    #[test]
    fn planted_links_files_and_odd_pod_uids_are_no_launcher_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        // A real socket of another pod, and a pod whose launcher-sock links to it.
        let other = PodPaths::new(&pods, "other").sockets_dir();
        std::fs::create_dir_all(&other).expect("mkdir");
        let _listener =
            std::os::unix::net::UnixListener::bind(other.join(LAUNCHER_SOCK)).expect("bind");
        let mine = PodPaths::new(&pods, "mine").sockets_dir();
        std::fs::create_dir_all(&mine).expect("mkdir");
        // Relative, so it stays below the pods directory: only "no link at all" stops it.
        std::os::unix::fs::symlink(
            "../../../../other/volumes/kubernetes.io~empty-dir/sockets/launcher-sock",
            mine.join(LAUNCHER_SOCK),
        )
        .expect("symlink");
        assert!(
            std::fs::metadata(mine.join(LAUNCHER_SOCK)).is_ok(),
            "the link leads to the other pod's socket"
        );
        let vmi = vmi_with_pods(&[("mine", "n1")]);
        assert_eq!(
            find_socket(&vmi, "n1", &pods),
            Err(FindSocketError::NotFound("n1".into()))
        );
        // A regular file is no socket either.
        std::fs::remove_file(mine.join(LAUNCHER_SOCK)).expect("rm");
        std::fs::write(mine.join(LAUNCHER_SOCK), b"").expect("file");
        assert!(find_socket(&vmi, "n1", &pods).is_err());
        // A pod UID that walks out of the pods directory is not even looked at.
        let sneaky = vmi_with_pods(&[("../pods/other", "n1"), ("..", "n1"), ("", "n1")]);
        assert!(active_pods_on_node(&sneaky, "n1").is_empty());
        assert!(matches!(
            find_socket(&sneaky, "n1", &pods),
            Err(FindSocketError::NoActivePods(_))
        ));
    }

    #[test]
    fn symlinks_resolve_inside_the_root() {
        let root = tempfile::tempdir().expect("tempdir");
        let r = root.path();
        std::fs::create_dir_all(r.join("run/kubevirt")).expect("mkdir");
        std::os::unix::fs::symlink("/run", r.join("var-run")).expect("symlink");
        std::fs::create_dir_all(r.join("var")).expect("mkdir");
        std::os::unix::fs::symlink("/run", r.join("var/run")).expect("symlink");
        std::os::unix::fs::symlink("../../..", r.join("run/kubevirt/up")).expect("symlink");
        assert_eq!(
            resolve_in_root(r, Path::new("/var/run/kubevirt/x.sock")).expect("resolve"),
            r.join("run/kubevirt/x.sock")
        );
        // `..` and relative links never leave the root.
        assert_eq!(
            resolve_in_root(r, Path::new("/run/kubevirt/up/etc/passwd")).expect("resolve"),
            r.join("etc/passwd")
        );
        assert_eq!(
            resolve_in_root(r, Path::new("/../../etc")).expect("resolve"),
            r.join("etc")
        );
        std::os::unix::fs::symlink("loop", r.join("loop")).expect("symlink");
        assert!(resolve_in_root(r, Path::new("/loop/x")).is_err());
    }

    #[test]
    fn long_socket_paths_are_reached_through_proc_fd() {
        let dir = tempfile::tempdir().expect("tempdir");
        let deep = dir.path().join("x".repeat(60)).join("y".repeat(60));
        std::fs::create_dir_all(&deep).expect("mkdir");
        let path = deep.join("launcher-sock");
        assert!(path.as_os_str().len() > 108);
        let short = SocketPath::new(&path).expect("short path");
        let _listener = std::os::unix::net::UnixListener::bind(short.path()).expect("bind");
        assert!(path.exists(), "bound at the real location");
        assert_eq!(peer_pid(&path).expect("peer pid"), std::process::id());
    }

    #[test]
    fn peer_pid_is_the_listener() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        assert_eq!(peer_pid(&path).expect("peer pid"), std::process::id());
        assert!(peer_pid(&dir.path().join("missing")).is_err());
    }
}
