//! What the handler prepares in the launcher's pod before the first `SyncVirtualMachine`
//! (KubeVirt v1.9.0 `handleStartingVMI`): the pod network's phase 1 through `netsetup`
//! in the launcher's network namespace (masquerade or bridge binding, as the VMI's
//! interface says), the bridge binding's DHCP cache written into the pod, and device
//! ownership for the launcher's user. Also the pod-interface cache the status reads the
//! pod IPs from. The namespace and the root are opened through the launcher's pidfd
//! ([`LauncherProcess`]): a launcher whose PID went to another process fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use netsetup::bridge::{self, BridgeConfig};
use netsetup::masquerade::{self, MasqueradeConfig};
use netsetup::netns::NetnsTarget;
use proto::contract::dhcp_cache;
use proto::kubevirt::VirtualMachineInstance;

use crate::launchers::LauncherProcess;
use crate::vmis::status::PodInterface;

#[derive(Debug, thiserror::Error)]
pub enum PodSideError {
    #[error(
        "interface {iface}: binding {binding} is not supported by this handler (masquerade and bridge are)"
    )]
    UnsupportedBinding { iface: String, binding: String },
    #[error("interface {iface}: {mac:?} is not a MAC address")]
    InvalidMac { iface: String, mac: String },
    #[error("interface {0} has no network of the same name in spec.networks")]
    NoNetwork(String),
    #[error("only one pod network interface is supported, found {0}")]
    TooManyPodInterfaces(usize),
    #[error("invalid vmNetworkCIDR {cidr:?}: {reason}")]
    InvalidCidr { cidr: String, reason: String },
    #[error("invalid port {0} in interface ports")]
    InvalidPort(i32),
    #[error("pod network set-up failed: {0}")]
    Network(#[from] netsetup::binding::BindingError),
    #[error("cannot give {path} to user {uid}: {source}")]
    Ownership {
        path: PathBuf,
        uid: u32,
        source: std::io::Error,
    },
    #[error("pod-interface cache {0}: {1}")]
    Cache(PathBuf, std::io::Error),
    #[error("bridge binding's DHCP cache {0} in the pod: {1}")]
    DhcpCache(String, std::io::Error),
    #[error("cannot reach the launcher's pod: {0}")]
    Launcher(std::io::Error),
}

/// How the VMI's pod network interface is built.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PodNetworkPlan {
    Masquerade(MasqueradeConfig),
    Bridge(BridgeConfig),
}

/// The plan for the VMI's pod network interface (its name and binding), or `None` if it
/// has none.
pub(crate) fn pod_network_plan(
    vmi: &VirtualMachineInstance,
    netns: &NetnsTarget,
    owner: u32,
) -> Result<Option<(String, PodNetworkPlan)>, PodSideError> {
    let interfaces = &vmi.spec.domain.devices.interfaces;
    let mut pod_ifaces = Vec::new();
    for (index, iface) in interfaces.iter().enumerate() {
        let network = vmi
            .spec
            .networks
            .iter()
            .find(|n| n.name == iface.name)
            .ok_or_else(|| PodSideError::NoNetwork(iface.name.clone()))?;
        if network.pod.is_none() {
            continue;
        }
        if iface.masquerade.is_none() && iface.bridge.is_none() {
            return Err(PodSideError::UnsupportedBinding {
                iface: iface.name.clone(),
                binding: iface.binding_name().unwrap_or("none").to_string(),
            });
        }
        pod_ifaces.push(index);
    }
    let index = match pod_ifaces.as_slice() {
        [] => return Ok(None),
        [index] => *index,
        more => return Err(PodSideError::TooManyPodInterfaces(more.len())),
    };
    let iface = &interfaces[index];
    if iface.bridge.is_some() {
        return Ok(Some((
            iface.name.clone(),
            PodNetworkPlan::Bridge(bridge_plan(vmi, index, netns, owner)?),
        )));
    }
    Ok(masquerade_plan(vmi, netns, owner)?.map(|(name, c)| (name, PodNetworkPlan::Masquerade(c))))
}

/// The bridge binding for interface `index`: the tap's owner, the bridge address picked
/// by the interface's position, and the guest MAC the DHCP server may answer
/// (`macAddress`, else the one in the VMI's status, else the pod's; KubeVirt's
/// `resolveMacAddress`).
fn bridge_plan(
    vmi: &VirtualMachineInstance,
    index: usize,
    netns: &NetnsTarget,
    owner: u32,
) -> Result<BridgeConfig, PodSideError> {
    let iface = &vmi.spec.domain.devices.interfaces[index];
    let status_mac = vmi
        .status
        .as_ref()
        .and_then(|s| {
            s.interfaces
                .iter()
                .find(|i| i.name.as_deref() == Some(&iface.name))
        })
        .and_then(|i| i.mac.clone())
        .filter(|m| !m.is_empty());
    let guest_mac = match iface.mac_address.clone().or(status_mac) {
        None => None,
        Some(text) => Some(parse_mac(&text).ok_or_else(|| PodSideError::InvalidMac {
            iface: iface.name.clone(),
            mac: text,
        })?),
    };
    let mut config = BridgeConfig::new(netns.clone());
    config.tap_owner_uid = owner;
    config.tap_owner_gid = owner;
    config.iface_index = index;
    config.guest_mac = guest_mac;
    Ok(config)
}

/// A MAC as Go's `net.ParseMAC` reads the 6-byte forms: `:` or `-` between hex pairs.
fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let sep = if text.contains('-') { '-' } else { ':' };
    let bytes: Vec<u8> = text
        .split(sep)
        .map(|b| {
            (b.len() == 2)
                .then(|| u8::from_str_radix(b, 16).ok())
                .flatten()
        })
        .collect::<Option<_>>()?;
    bytes.try_into().ok()
}

/// The masquerade plan for the VMI's pod network interface, or `None` if it has none.
fn masquerade_plan(
    vmi: &VirtualMachineInstance,
    netns: &NetnsTarget,
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
    let mut config = MasqueradeConfig::new(netns.clone());
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
pub(crate) struct PodInterfaceCache {
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
pub(crate) const OWNED_DEVICES: &[&str] = &["/dev/kvm", "/dev/vhost-net", "/dev/net/tun"];

/// Prepares the pod: masquerade network, device ownership. Returns the pod interfaces
/// (also stored in `cache`).
pub(crate) fn prepare(
    vmi: &VirtualMachineInstance,
    launcher: &LauncherProcess,
    owner: u32,
    cache: &PodInterfaceCache,
) -> Result<BTreeMap<String, PodInterface>, PodSideError> {
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    // Held for the whole preparation: what the PID leads to later does not matter.
    let netns = launcher.netns().map_err(PodSideError::Launcher)?;
    let root = launcher.root().map_err(PodSideError::Launcher)?;
    let mut ifaces = BTreeMap::new();
    let entry = match pod_network_plan(vmi, &NetnsTarget::Path(netns.path()), owner)? {
        None => None,
        Some((name, PodNetworkPlan::Masquerade(config))) => {
            let outcome = masquerade::setup(&config)?;
            let mut ips = Vec::new();
            if let Some(v4) = outcome.pod_ipv4 {
                ips.push(v4.to_string());
            }
            if let Some(v6) = outcome.pod_ipv6 {
                ips.push(v6.to_string());
            }
            Some((name, config.iface.clone(), ips))
        }
        Some((name, PodNetworkPlan::Bridge(config))) => {
            let outcome = bridge::setup(&config)?;
            let path = dhcp_cache::path_in_pod(&config.iface);
            let json = serde_json::to_vec_pretty(&outcome.dhcp).expect("plain struct serializes");
            write_into_pod(
                &root.path(),
                &path,
                &json,
                netsetup::masquerade::NON_ROOT_UID,
            )
            .map_err(|e| PodSideError::DhcpCache(path, e))?;
            // No DHCPv6 for bridge: the pod's IPv6 never reaches the guest, so only the
            // IPv4 address is the VMI's (KubeVirt's discover drops it too).
            let ips = outcome
                .pod_ipv4
                .map(|v4| v4.to_string())
                .into_iter()
                .collect();
            Some((name, config.iface.clone(), ips))
        }
    };
    if let Some((name, iface, ips)) = entry.filter(|(_, _, ips)| !ips.is_empty()) {
        let entry = PodInterface {
            iface,
            pod_ip: ips.first().cloned().unwrap_or_default(),
            pod_ips: ips,
        };
        cache.store(&uid, &name, &entry)?;
        ifaces.insert(name, entry);
    }
    if owner != 0 {
        own_devices(&root.path(), owner)?;
    }
    Ok(ifaces)
}

/// Writes `bytes` to `path_in_pod` under `root` (the launcher's root), as KubeVirt writes
/// its caches: mode 0604, owned by the qemu user. The pod controls its filesystem, so no
/// link is followed out of it: the directory is resolved as the pod sees it, then
/// walked one component at a time without following links, and the file is written
/// under a fresh name and renamed over the target (which replaces a planted link
/// instead of writing through it).
pub(crate) fn write_into_pod(
    root: &Path,
    path_in_pod: &str,
    bytes: &[u8],
    owner: u32,
) -> std::io::Result<()> {
    use nix::fcntl::{OFlag, openat, renameat};
    use nix::sys::stat::{Mode, fchmod};
    use std::io::Write;

    let path = Path::new(path_in_pod);
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(std::io::Error::other("not a file path"));
    };
    let resolved = crate::launchers::socket::resolve_in_root(root, dir)?;
    let inside = resolved
        .strip_prefix(root)
        .map_err(|_| std::io::Error::other("the directory resolves outside the pod"))?;
    let dir_flags = OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    let mut dir_fd = openat(nix::fcntl::AT_FDCWD, root, dir_flags, Mode::empty())?;
    for component in inside.components() {
        dir_fd = openat(
            &dir_fd,
            component.as_os_str(),
            dir_flags | OFlag::O_NOFOLLOW,
            Mode::empty(),
        )?;
    }
    let temp = format!(".{}.{:016x}", name.to_string_lossy(), rand::random::<u64>());
    let file_flags =
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(
        &dir_fd,
        temp.as_str(),
        file_flags,
        Mode::from_bits_truncate(0o604),
    )?;
    let written = (|| {
        fchmod(&fd, Mode::from_bits_truncate(0o604))?;
        nix::unistd::fchown(&fd, Some(owner.into()), Some(owner.into()))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(bytes)?;
        file.sync_all()?;
        renameat(&dir_fd, temp.as_str(), &dir_fd, name)?;
        Ok::<(), std::io::Error>(())
    })();
    if written.is_err() {
        let _ = nix::unistd::unlinkat(
            &dir_fd,
            temp.as_str(),
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }
    written
}

/// Gives the pod's device nodes (under `root`, the launcher's root) to `owner`.
///
/// The pod controls its file system: each node is opened without following any link
/// (KubeVirt's `safepath.JoinNoFollow`), checked to be a character device and changed
/// through that same descriptor, so neither a planted link nor a swap after the check
/// can redirect the change to a host file.
pub(crate) fn own_devices(root: &Path, owner: u32) -> Result<(), PodSideError> {
    use crate::podfs;
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
        let (name, plan) = masquerade_plan(&v, &NetnsTarget::Pid(42), 107)
            .expect("plan")
            .expect("some");
        assert_eq!(name, "default");
        assert_eq!(plan.netns, NetnsTarget::Pid(42));
        assert_eq!(plan.ipv4_cidr.to_string(), "10.11.0.0/24");
        assert_eq!(plan.tap_owner_uid, 107);
        assert_eq!(plan.ports.len(), 2);
    }

    #[test]
    fn bad_inputs_are_errors() {
        let passt = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","passtBinding":{}}]}},
                "networks":[{"name":"default","pod":{}}]}}"#,
        );
        assert!(matches!(
            pod_network_plan(&passt, &NetnsTarget::Pid(1), 107),
            Err(PodSideError::UnsupportedBinding { ref binding, .. }) if binding == "passtBinding"
        ));
        let two = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[
                    {"name":"a","bridge":{}},{"name":"b","masquerade":{}}]}},
                "networks":[{"name":"a","pod":{}},{"name":"b","pod":{}}]}}"#,
        );
        assert!(matches!(
            pod_network_plan(&two, &NetnsTarget::Pid(1), 107),
            Err(PodSideError::TooManyPodInterfaces(2))
        ));
        let bad_mac = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","bridge":{},"macAddress":"02:00:00:00:00"}]}},
                "networks":[{"name":"default","pod":{}}]}}"#,
        );
        assert!(matches!(
            pod_network_plan(&bad_mac, &NetnsTarget::Pid(1), 107),
            Err(PodSideError::InvalidMac { .. })
        ));
        let bad_cidr = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}}]}},
                "networks":[{"name":"default","pod":{"vmNetworkCIDR":"nonsense"}}]}}"#,
        );
        assert!(matches!(
            masquerade_plan(&bad_cidr, &NetnsTarget::Pid(1), 107),
            Err(PodSideError::InvalidCidr { .. })
        ));
        let bad_port = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{},"ports":[{"port":70000}]}]}},
                "networks":[{"name":"default","pod":{}}]}}"#,
        );
        assert!(matches!(
            masquerade_plan(&bad_port, &NetnsTarget::Pid(1), 107),
            Err(PodSideError::InvalidPort(70000))
        ));
        let no_net = vmi(
            r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{"interfaces":[{"name":"x","masquerade":{}}]}}}}"#,
        );
        assert!(matches!(
            masquerade_plan(&no_net, &NetnsTarget::Pid(1), 107),
            Err(PodSideError::NoNetwork(_))
        ));
        let none = vmi(r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{}}}}"#);
        assert!(
            masquerade_plan(&none, &NetnsTarget::Pid(1), 107)
                .expect("ok")
                .is_none()
        );
    }

    #[test]
    fn bridge_plan_picks_index_owner_and_guest_mac() {
        // A Multus interface first: the pod interface is at index 1 (169.254.75.11).
        let spec = r#"{"metadata":{"name":"v","uid":"u"},
                "spec":{"domain":{"devices":{"interfaces":[{"name":"net1","bridge":{}},{"name":"default","bridge":{}MAC}]}},
                  "networks":[{"name":"net1","multus":{"networkName":"x"}},{"name":"default","pod":{}}]}STATUS}"#;
        let plan = |mac: &str, status: &str| {
            let v = vmi(&spec.replace("MAC", mac).replace("STATUS", status));
            match pod_network_plan(&v, &NetnsTarget::Pid(42), 0)
                .expect("plan")
                .expect("some")
            {
                (name, PodNetworkPlan::Bridge(c)) => {
                    assert_eq!(name, "default");
                    c
                }
                other => panic!("not bridge: {other:?}"),
            }
        };
        let c = plan("", "");
        assert_eq!(c.iface_index, 1);
        assert_eq!(c.netns, NetnsTarget::Pid(42));
        assert_eq!((c.tap_owner_uid, c.tap_owner_gid), (0, 0));
        assert_eq!(c.iface, "eth0");
        assert_eq!(c.guest_mac, None, "the pod's MAC");
        let status = r#","status":{"interfaces":[{"name":"default","mac":"02:aa:bb:cc:dd:ee"}]}"#;
        assert_eq!(
            plan("", status).guest_mac,
            Some([0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee]),
            "the status MAC when the spec has none"
        );
        assert_eq!(
            plan(r#","macAddress":"DE-AD-00-00-BE-AF""#, status).guest_mac,
            Some([0xde, 0xad, 0, 0, 0xbe, 0xaf]),
            "the spec MAC first"
        );
    }

    #[test]
    fn mac_parsing_follows_go() {
        assert_eq!(
            parse_mac("0a:58:0A:f4:01:05"),
            Some([0x0a, 0x58, 0x0a, 0xf4, 1, 5])
        );
        assert_eq!(
            parse_mac("0a-58-0a-f4-01-05"),
            Some([0x0a, 0x58, 0x0a, 0xf4, 1, 5])
        );
        for bad in [
            "",
            "0a:58:0a:f4:01",
            "0a:58:0a:f4:01:05:06",
            "0a:58:0a:f4:01:5",
            "zz:58:0a:f4:01:05",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad}");
        }
    }

    #[test]
    fn the_dhcp_cache_lands_inside_the_pod_and_never_follows_its_links() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let root = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let path = "/var/run/kubevirt-private/vif-cache-eth0.json";
        // Most images have /var/run -> /run: absolute links resolve inside the pod.
        std::fs::create_dir_all(root.path().join("var")).unwrap();
        std::fs::create_dir_all(root.path().join("run/kubevirt-private")).unwrap();
        std::os::unix::fs::symlink("/run", root.path().join("var/run")).unwrap();
        write_into_pod(root.path(), path, b"{}", 107).expect("write");
        let written = root.path().join("run/kubevirt-private/vif-cache-eth0.json");
        assert_eq!(std::fs::read(&written).unwrap(), b"{}");
        let meta = std::fs::metadata(&written).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (107, 107));
        assert_eq!(meta.permissions().mode() & 0o777, 0o604);

        // A link planted at the file's name is replaced, its target left alone.
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"host file").unwrap();
        std::fs::remove_file(&written).unwrap();
        std::os::unix::fs::symlink(&victim, &written).unwrap();
        write_into_pod(root.path(), path, b"new", 107).expect("write over a link");
        assert_eq!(std::fs::read(&victim).unwrap(), b"host file");
        assert!(!std::fs::symlink_metadata(&written).unwrap().is_symlink());
        assert_eq!(std::fs::read(&written).unwrap(), b"new");

        // A private dir that links out of the pod resolves inside it, where nothing is.
        std::fs::remove_dir_all(root.path().join("run/kubevirt-private")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("run/kubevirt-private"))
            .unwrap();
        assert!(write_into_pod(root.path(), path, b"x", 107).is_err());
        assert!(!outside.path().join("vif-cache-eth0.json").exists());
        // Nothing is left behind in the pod either.
        let leftovers: Vec<_> = std::fs::read_dir(root.path().join("run"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            leftovers,
            vec![std::ffi::OsString::from("kubevirt-private")]
        );
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
    fn a_launcher_whose_pid_went_to_another_process_gets_no_preparation() {
        use crate::launchers::process::tests::{kill_and_reap, sleeper};
        let dir = tempfile::tempdir().expect("tempdir");
        let cache = PodInterfaceCache::new(dir.path());
        // No network and a root VMI: the preparation itself would change nothing here.
        let v = vmi(r#"{"metadata":{"name":"v","namespace":"d","uid":"u"},
                "spec":{"domain":{"devices":{}}}}"#);
        let launcher = sleeper(None);
        let process =
            LauncherProcess::open(u32::try_from(launcher).expect("a PID")).expect("pidfd");
        prepare(&v, &process, 0, &cache).expect("prepared while the launcher lives");
        kill_and_reap(launcher);
        let impostor = sleeper(Some(launcher));
        let refused = prepare(&v, &process, 0, &cache);
        kill_and_reap(impostor);
        let err = refused.expect_err("the PID is another process's");
        assert!(matches!(err, PodSideError::Launcher(_)), "{err}");
        assert!(err.to_string().contains("has exited"), "{err}");
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
