//! Where a launcher's sockets are and who is listening on them (contract §3.1).

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use proto::kubevirt::VirtualMachineInstance;

/// The cmd socket once the launcher is ready (`StandardLauncherSocketFileName`).
pub const LAUNCHER_SOCK: &str = "launcher-sock";
/// The cmd socket before the launcher answers its own Ping.
pub const LAUNCHER_INIT_SOCK: &str = "launcher-init-sock";
/// Touched by the handler when a launcher stops answering.
pub const UNRESPONSIVE_MARKER: &str = "launcher-unresponsive";
/// The notify pipe inside the pod, relative to the launcher's root.
pub const NOTIFY_PIPE_IN_POD: &str = "var/run/kubevirt/domain-notify-pipe.sock";
/// The serial console socket inside the pod, relative to the launcher's root.
pub fn serial_console_in_pod(vmi_uid: &str) -> String {
    format!("var/run/kubevirt-private/{vmi_uid}/virt-serial0")
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

    pub fn unresponsive_marker(&self) -> PathBuf {
        self.sockets_dir().join(UNRESPONSIVE_MARKER)
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FindSocketError {
    #[error("VMI has no active pods on node {0}")]
    NoActivePods(String),
    #[error("no launcher socket found for the VMI's pods on node {0}")]
    NotFound(String),
    #[error("found {0} launcher sockets, expected exactly one")]
    Ambiguous(usize),
}

/// The pods of the VMI on this node (`status.activePods` entries whose node matches;
/// an empty node name matches any).
pub fn active_pods_on_node<'a>(vmi: &'a VirtualMachineInstance, node: &'a str) -> Vec<&'a str> {
    vmi.status
        .as_ref()
        .and_then(|s| s.active_pods.as_ref())
        .map(|pods| {
            pods.iter()
                .filter(|(_, n)| node.is_empty() || n.as_str() == node)
                .map(|(uid, _)| uid.as_str())
                .collect()
        })
        .unwrap_or_default()
}

/// `FindSocket`: exactly one existing `launcher-sock` among the VMI's pods on this node.
pub fn find_socket(
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
        .filter(|p| p.launcher_socket().exists())
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
pub fn peer_pid(socket: &Path) -> std::io::Result<u32> {
    let stream = UnixStream::connect(socket)?;
    let creds = getsockopt(&stream, PeerCredentials).map_err(std::io::Error::from)?;
    u32::try_from(creds.pid())
        .ok()
        .filter(|pid| *pid > 0)
        .ok_or_else(|| std::io::Error::other(format!("invalid peer pid {}", creds.pid())))
}

/// The launcher's root filesystem as the handler sees it.
pub fn launcher_root(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root"))
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
        for pod in ["p1", "p3"] {
            let s = PodPaths::new(dir.path(), pod).sockets_dir();
            std::fs::create_dir_all(&s).expect("mkdir");
            std::fs::write(s.join(LAUNCHER_SOCK), b"").expect("touch");
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
    fn peer_pid_is_the_listener() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        assert_eq!(peer_pid(&path).expect("peer pid"), std::process::id());
        assert!(peer_pid(&dir.path().join("missing")).is_err());
    }
}
