//! What the handler prepares in the launcher's pod before the first `SyncVirtualMachine`
//! (contract §3.4 `handleStartingVMI`): the pod network's phase 1 (masquerade through
//! `netsetup`, in the namespace of the launcher's PID) and device ownership for the
//! launcher's user. Also the pod-interface cache the status reads the pod IPs from.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use netsetup::masquerade::{self, MasqueradeConfig};
use netsetup::netns::NetnsTarget;
use proto::kubevirt::VirtualMachineInstance;

use crate::vmis::status::PodInterface;

#[derive(Debug, thiserror::Error)]
pub enum PodSideError {
    #[error(
        "interface {iface}: binding {binding} is not supported by this handler (only masquerade)"
    )]
    UnsupportedBinding { iface: String, binding: String },
    #[error("interface {0} has no network of the same name in spec.networks")]
    NoNetwork(String),
    #[error("only one pod network interface is supported, found {0}")]
    TooManyPodInterfaces(usize),
    #[error("invalid vmNetworkCIDR {cidr:?}: {reason}")]
    InvalidCidr { cidr: String, reason: String },
    #[error("invalid port {0} in interface ports")]
    InvalidPort(i32),
    #[error("pod network set-up failed: {0}")]
    Network(#[from] masquerade::MasqueradeError),
    #[error("cannot give {path} to user {uid}: {source}")]
    Ownership {
        path: PathBuf,
        uid: u32,
        source: std::io::Error,
    },
    #[error("pod-interface cache {0}: {1}")]
    Cache(PathBuf, std::io::Error),
}

/// The masquerade plan for the VMI's pod network interface, or `None` if it has none.
pub fn masquerade_plan(
    vmi: &VirtualMachineInstance,
    pid: u32,
    owner: u32,
) -> Result<Option<(String, MasqueradeConfig)>, PodSideError> {
    let mut pod_ifaces = Vec::new();
    for iface in &vmi.spec.domain.devices.interfaces {
        let network = vmi
            .spec
            .networks
            .iter()
            .find(|n| n.name == iface.name)
            .ok_or_else(|| PodSideError::NoNetwork(iface.name.clone()))?;
        if network.pod.is_none() {
            continue;
        }
        if iface.masquerade.is_none() {
            return Err(PodSideError::UnsupportedBinding {
                iface: iface.name.clone(),
                binding: iface
                    .binding_name()
                    .unwrap_or("bridge (default)")
                    .to_string(),
            });
        }
        pod_ifaces.push((iface, network));
    }
    let (iface, network) = match pod_ifaces.len() {
        0 => return Ok(None),
        1 => pod_ifaces.remove(0),
        n => return Err(PodSideError::TooManyPodInterfaces(n)),
    };
    let mut config = MasqueradeConfig::new(NetnsTarget::Pid(pid));
    config.tap_owner_uid = owner;
    config.tap_owner_gid = owner;
    if let Some(cidr) = network
        .pod
        .as_ref()
        .and_then(|p| p.vm_network_cidr.as_ref())
    {
        config.ipv4_cidr =
            cidr.parse()
                .map_err(|e: ipnet::AddrParseError| PodSideError::InvalidCidr {
                    cidr: cidr.clone(),
                    reason: e.to_string(),
                })?;
    }
    if let Some(cidr) = network
        .pod
        .as_ref()
        .and_then(|p| p.vm_ipv6_network_cidr.as_ref())
    {
        config.ipv6_cidr =
            cidr.parse()
                .map_err(|e: ipnet::AddrParseError| PodSideError::InvalidCidr {
                    cidr: cidr.clone(),
                    reason: e.to_string(),
                })?;
    }
    for port in &iface.ports {
        let number = u16::try_from(port.port)
            .ok()
            .filter(|p| *p != 0)
            .ok_or(PodSideError::InvalidPort(port.port))?;
        let udp = port
            .protocol
            .as_deref()
            .is_some_and(|p| p.eq_ignore_ascii_case("udp"));
        config.ports.push(netsetup::nft::Port {
            number,
            protocol: if udp {
                netsetup::nft::L4Proto::Udp
            } else {
                netsetup::nft::L4Proto::Tcp
            },
        });
    }
    config.istio = vmi
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("sidecar.istio.io/inject"))
        .is_some_and(|v| v == "true");
    config.migration_over_unix = vmi
        .status
        .as_ref()
        .and_then(|s| s.migration_transport.as_deref())
        == Some("Unix");
    Ok(Some((iface.name.clone(), config)))
}

/// Where pod interfaces are remembered across handler restarts:
/// `<private dir>/network-info-cache/<vmiUID>/<ifaceName>`.
#[derive(Debug, Clone)]
pub struct PodInterfaceCache {
    dir: PathBuf,
}

fn safe_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

impl PodInterfaceCache {
    pub fn new(private_dir: &Path) -> Self {
        PodInterfaceCache {
            dir: private_dir.join("network-info-cache"),
        }
    }

    pub fn store(&self, uid: &str, name: &str, entry: &PodInterface) -> Result<(), PodSideError> {
        if !safe_name(uid) || !safe_name(name) {
            return Err(PodSideError::Cache(
                self.dir.clone(),
                std::io::Error::other(format!("unsafe cache name {uid:?}/{name:?}")),
            ));
        }
        let dir = self.dir.join(uid);
        std::fs::create_dir_all(&dir).map_err(|e| PodSideError::Cache(dir.clone(), e))?;
        let path = dir.join(name);
        let json = serde_json::to_vec(entry).expect("plain struct serializes");
        std::fs::write(&path, json).map_err(|e| PodSideError::Cache(path, e))
    }

    /// Every cached interface of `uid` (corrupt entries are skipped).
    pub fn load(&self, uid: &str) -> BTreeMap<String, PodInterface> {
        let mut out = BTreeMap::new();
        if !safe_name(uid) {
            return out;
        }
        let Ok(entries) = std::fs::read_dir(self.dir.join(uid)) else {
            return out;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Ok(bytes) = std::fs::read(entry.path())
                && let Ok(parsed) = serde_json::from_slice::<PodInterface>(&bytes)
            {
                out.insert(name, parsed);
            }
        }
        out
    }

    pub fn remove(&self, uid: &str) {
        if safe_name(uid) {
            let _ = std::fs::remove_dir_all(self.dir.join(uid));
        }
    }
}

/// Device nodes the launcher's user must own when it is not root, as KubeVirt's
/// `claimDeviceOwnership` gives them (`pkg/virt-handler/controller.go`, `non-root.go`):
/// the hypervisor device, and the network devices the pod network uses. A node the pod
/// does not have is skipped.
pub const OWNED_DEVICES: &[&str] = &["/dev/kvm", "/dev/vhost-net", "/dev/net/tun"];

/// Prepares the pod: masquerade network, device ownership. Returns the pod interfaces
/// (also stored in `cache`).
pub fn prepare(
    vmi: &VirtualMachineInstance,
    pid: u32,
    owner: u32,
    cache: &PodInterfaceCache,
) -> Result<BTreeMap<String, PodInterface>, PodSideError> {
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let mut ifaces = BTreeMap::new();
    if let Some((name, config)) = masquerade_plan(vmi, pid, owner)? {
        let outcome = masquerade::setup(&config)?;
        let mut ips = Vec::new();
        if let Some(v4) = outcome.pod_ipv4 {
            ips.push(v4.to_string());
        }
        if let Some(v6) = outcome.pod_ipv6 {
            ips.push(v6.to_string());
        }
        let entry = PodInterface {
            iface: config.iface.clone(),
            pod_ip: ips.first().cloned().unwrap_or_default(),
            pod_ips: ips,
        };
        cache.store(&uid, &name, &entry)?;
        ifaces.insert(name, entry);
    }
    if owner != 0 {
        own_devices(&crate::launchers::socket::launcher_root(pid), owner)?;
    }
    Ok(ifaces)
}

/// Gives the pod's device nodes (under `root`, the launcher's root) to `owner`.
///
/// The pod controls its file system: each node is opened without following any link
/// (KubeVirt's `safepath.JoinNoFollow`), checked to be a character device and changed
/// through that same descriptor, so neither a planted link nor a swap after the check
/// can redirect the change to a host file.
pub fn own_devices(root: &Path, owner: u32) -> Result<(), PodSideError> {
    use crate::launchers::podfs;
    use nix::fcntl::{AtFlags, OFlag};
    use nix::sys::stat::SFlag;
    let fail = |path: &str, source: std::io::Error| PodSideError::Ownership {
        path: path.into(),
        uid: owner,
        source,
    };
    for dev in OWNED_DEVICES {
        let node = match podfs::open_in_root_no_symlinks(
            root,
            Path::new(dev),
            OFlag::O_PATH | OFlag::O_NOFOLLOW,
        ) {
            Ok(fd) => fd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => {
                tracing::warn!(device = dev, error = %e, "device node not taken: not a plain path in the pod");
                continue;
            }
        };
        let stat = nix::sys::stat::fstat(&node).map_err(|e| fail(dev, e.into()))?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFCHR {
            continue;
        }
        nix::unistd::fchownat(
            &node,
            "",
            Some(nix::unistd::Uid::from_raw(owner)),
            Some(nix::unistd::Gid::from_raw(owner)),
            AtFlags::AT_EMPTY_PATH,
        )
        .map_err(|e| fail(dev, e.into()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(json: &str) -> VirtualMachineInstance {
        proto::kubevirt::parse_vmi(json).expect("vmi")
    }

    #[test]
    fn masquerade_plan_reads_ports_cidr_and_owner() {
        let v = vmi(r#"{"metadata":{"name":"v","namespace":"d","uid":"u"},
                "spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{},
                    "ports":[{"port":80},{"port":53,"protocol":"UDP"}]}]}},
                  "networks":[{"name":"default","pod":{"vmNetworkCIDR":"10.11.0.0/24"}}]}}"#);
        let (name, plan) = masquerade_plan(&v, 42, 107).expect("plan").expect("some");
        assert_eq!(name, "default");
        assert_eq!(plan.netns, NetnsTarget::Pid(42));
        assert_eq!(plan.ipv4_cidr.to_string(), "10.11.0.0/24");
        assert_eq!(plan.tap_owner_uid, 107);
        assert_eq!(plan.ports.len(), 2);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let bridge = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","bridge":{}}]}},
                "networks":[{"name":"default","pod":{}}]}}"#,
        );
        assert!(matches!(
            masquerade_plan(&bridge, 1, 107),
            Err(PodSideError::UnsupportedBinding { .. })
        ));
        let bad_cidr = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}}]}},
                "networks":[{"name":"default","pod":{"vmNetworkCIDR":"nonsense"}}]}}"#,
        );
        assert!(matches!(
            masquerade_plan(&bad_cidr, 1, 107),
            Err(PodSideError::InvalidCidr { .. })
        ));
        let bad_port = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{},"ports":[{"port":70000}]}]}},
                "networks":[{"name":"default","pod":{}}]}}"#,
        );
        assert!(matches!(
            masquerade_plan(&bad_port, 1, 107),
            Err(PodSideError::InvalidPort(70000))
        ));
        let no_net = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"x","masquerade":{}}]}}}}"#,
        );
        assert!(matches!(
            masquerade_plan(&no_net, 1, 107),
            Err(PodSideError::NoNetwork(_))
        ));
        let none = vmi(r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{}}}}"#);
        assert!(masquerade_plan(&none, 1, 107).expect("ok").is_none());
    }

    #[test]
    fn only_real_device_nodes_are_given_away() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().expect("tempdir");
        let dev = root.path().join("dev");
        std::fs::create_dir_all(&dev).expect("mkdir");
        // A planted link to a host file: neither it nor its target changes owner.
        let victim = root.path().join("victim");
        std::fs::write(&victim, b"secret").expect("write");
        std::os::unix::fs::symlink(&victim, dev.join("kvm")).expect("symlink");
        own_devices(root.path(), 107).expect("ignored");
        assert_eq!(std::fs::metadata(&victim).expect("victim").uid(), 0);
        // A real character device node is given to the launcher's user.
        std::fs::remove_file(dev.join("kvm")).expect("rm");
        nix::sys::stat::mknod(
            &dev.join("kvm"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .expect("mknod (tests run as root)");
        own_devices(root.path(), 107).expect("chown");
        assert_eq!(
            std::fs::symlink_metadata(dev.join("kvm"))
                .expect("node")
                .uid(),
            107
        );
        // A node behind a linked directory (dev/net -> a host directory) is not taken,
        // and neither is what the link leads to.
        let host_dir = root.path().join("host-net");
        std::fs::create_dir_all(&host_dir).expect("mkdir");
        nix::sys::stat::mknod(
            &host_dir.join("tun"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .expect("mknod");
        std::os::unix::fs::symlink(&host_dir, dev.join("net")).expect("symlink");
        own_devices(root.path(), 107).expect("the linked node is skipped");
        assert_eq!(
            std::fs::symlink_metadata(host_dir.join("tun"))
                .expect("node")
                .uid(),
            0
        );
        // The network nodes of a non-root pod are its user's too.
        std::fs::remove_file(dev.join("net")).expect("rm link");
        std::fs::create_dir_all(dev.join("net")).expect("mkdir");
        for node in ["net/tun", "vhost-net"] {
            nix::sys::stat::mknod(
                &dev.join(node),
                nix::sys::stat::SFlag::S_IFCHR,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                nix::sys::stat::makedev(1, 3),
            )
            .expect("mknod");
        }
        own_devices(root.path(), 107).expect("chown");
        for node in ["net/tun", "vhost-net"] {
            assert_eq!(
                std::fs::symlink_metadata(dev.join(node))
                    .expect("node")
                    .uid(),
                107,
                "{node}"
            );
        }
    }

    #[test]
    fn pod_interface_cache_round_trips_and_refuses_escapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = PodInterfaceCache::new(dir.path());
        let e = PodInterface {
            iface: "eth0".into(),
            pod_ip: "10.244.1.2".into(),
            pod_ips: vec!["10.244.1.2".into()],
        };
        cache.store("uid1", "default", &e).expect("store");
        assert_eq!(cache.load("uid1").get("default"), Some(&e));
        assert!(cache.store("../x", "default", &e).is_err());
        assert!(cache.load("..").is_empty());
        cache.remove("uid1");
        assert!(cache.load("uid1").is_empty());
    }
}
