//! The pod side of the network, launcher part (KubeVirt v1.9.0
//! `pkg/network/setup/launcher/configurator.go`, `pkg/network/dhcp/`): what the pod
//! interface looks like, and the DHCP server that hands the guest its address: the
//! masquerade guest address, or for the bridge binding the pod's own address, gateway
//! and routes from the cache the handler wrote (`vif-cache-eth0.json` in the private
//! directory), answered to the guest's MAC only.

use crate::converter::PodInterface;
use crate::paths::Paths;
use ipnet::Ipv4Net;
use netsetup::dhcp::{DhcpConfig, DhcpServer};
use netsetup::resolv::ResolvConf;
use proto::contract::dhcp_cache;
use proto::kubevirt::VirtualMachineInstance;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proto::contract::pod_network::{PRIMARY_POD_IFACE as POD_IFACE, PRIMARY_TAP};
/// The bridge of the primary pod interface (`k6t-eth0`), for either binding.
fn bridge() -> String {
    proto::contract::pod_network::bridge_name(POD_IFACE)
}
/// KubeVirt's default guest network for masquerade.
pub(crate) const DEFAULT_VM_CIDR: &str = "10.0.2.0/24";

/// Reads `eth0`'s MTU and MAC and whether `tap0` exists, from sysfs.
pub(crate) fn pod_interface(sys_class_net: &Path) -> PodInterface {
    let read = |p: &Path| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let eth0 = sys_class_net.join(POD_IFACE);
    PodInterface {
        mtu: read(&eth0.join("mtu"))
            .and_then(|m| m.parse().ok())
            .unwrap_or(1500),
        mac: read(&eth0.join("address")).filter(|m| !m.is_empty()),
        tap_exists: sys_class_net.join(PRIMARY_TAP).exists(),
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum NetworkError {
    #[error("spec.networks[{0}].pod.vmNetworkCIDR: {1:?} is not an IPv4 network")]
    BadCidr(usize, String),
    #[error("DHCP configuration: {0}")]
    Dhcp(#[from] netsetup::dhcp::DhcpConfigError),
    #[error("DHCP server on k6t-eth0: {0}")]
    Server(#[from] netsetup::dhcp::ServerError),
    #[error("the bridge binding's DHCP cache {0}: {1}")]
    Cache(PathBuf, String),
    #[error(
        "spec.domain.devices.interfaces[{0}]: no bridge address 169.254.75.1<index> at this index"
    )]
    BadIndex(usize),
}

/// A running DHCP server; stops when dropped.
pub(crate) struct DhcpHandle {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for DhcpHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Starts the guest's DHCP server when the VMI has a masquerade or bridge interface.
/// Returns `None` when there is nothing to serve (no such interface, or a bridge
/// binding on a pod without IPv4).
pub(crate) fn start_dhcp(
    vmi: &VirtualMachineInstance,
    paths: &Paths,
    pod: &PodInterface,
) -> Result<Option<DhcpHandle>, NetworkError> {
    let Some(config) = dhcp_config(vmi, paths, pod)? else {
        return Ok(None);
    };
    let server = DhcpServer::bind(&bridge(), config)?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_thread = stop.clone();
    let thread = std::thread::Builder::new()
        .name("dhcp".into())
        .spawn(move || {
            if let Err(e) = server.serve_until(&stop_thread, Duration::from_millis(200)) {
                tracing::error!("DHCP server stopped: {e}");
            }
        })
        .map_err(|e| NetworkError::Server(netsetup::dhcp::ServerError::Io(e)))?;
    Ok(Some(DhcpHandle {
        stop,
        thread: Some(thread),
    }))
}

/// What the guest's DHCP server answers, or `None` when there is nothing to serve.
fn dhcp_config(
    vmi: &VirtualMachineInstance,
    paths: &Paths,
    pod: &PodInterface,
) -> Result<Option<DhcpConfig>, NetworkError> {
    let on_pod_network = |name: &str| {
        vmi.spec
            .networks
            .iter()
            .any(|n| n.name == name && n.pod.is_some())
    };
    let interfaces = &vmi.spec.domain.devices.interfaces;
    let Some((iface_index, iface)) = interfaces
        .iter()
        .enumerate()
        .find(|(_, i)| (i.masquerade.is_some() || i.bridge.is_some()) && on_pod_network(&i.name))
    else {
        return Ok(None);
    };
    // A missing resolv.conf means KubeVirt's defaults (8.8.8.8, cluster.local).
    let resolv = ResolvConf::read(&paths.resolv_conf).unwrap_or_default();
    let hostname = vmi
        .spec
        .hostname
        .clone()
        .or_else(|| vmi.metadata.name.clone());
    let subdomain = vmi.spec.subdomain.as_deref();
    let config = if iface.bridge.is_some() {
        let cache = read_bridge_cache(paths)?;
        let server = proto::contract::pod_network::fake_bridge_ip(iface_index)
            .ok_or(NetworkError::BadIndex(iface_index))?;
        // The pod's MTU: the dummy eth0 and eth0-nic both keep it.
        DhcpConfig::bridge(&cache, server, &resolv, hostname, subdomain, pod.mtu)?
    } else {
        let (index, cidr) = vmi
            .spec
            .networks
            .iter()
            .enumerate()
            .find(|(_, n)| n.name == iface.name)
            .and_then(|(i, n)| n.pod.as_ref().map(|p| (i, p.vm_network_cidr.clone())))
            .unwrap_or((0, None));
        let cidr = cidr.unwrap_or_else(|| DEFAULT_VM_CIDR.to_string());
        let network: Ipv4Net = cidr
            .parse()
            .map_err(|_| NetworkError::BadCidr(index, cidr.clone()))?;
        Some(DhcpConfig::masquerade(
            network, &resolv, hostname, subdomain, pod.mtu,
        )?)
    };
    Ok(config)
}

/// The bridge binding's DHCP cache the handler wrote into the pod
/// (`/var/run/kubevirt-private/vif-cache-eth0.json`; KubeVirt's launcher reads it
/// through `/proc/self/root`).
fn read_bridge_cache(paths: &Paths) -> Result<dhcp_cache::DhcpConfig, NetworkError> {
    let path = paths.private_dir.join(dhcp_cache::file_name(POD_IFACE));
    let text = std::fs::read_to_string(&path)
        .map_err(|e| NetworkError::Cache(path.clone(), e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| NetworkError::Cache(path, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::converter::test_support::vmi;
    use std::net::{IpAddr, Ipv4Addr};

    const BRIDGE: &str = "domain:\n  devices:\n    interfaces:\n    - name: default\n      bridge: {}\nnetworks:\n- name: default\n  pod: {}";

    fn pod() -> PodInterface {
        PodInterface {
            mtu: 1450,
            mac: Some("0a:58:0a:f4:01:05".into()),
            tap_exists: true,
        }
    }

    fn paths_with_cache(cache: Option<&dhcp_cache::DhcpConfig>) -> (tempfile::TempDir, Paths) {
        let root = tempfile::tempdir().unwrap();
        let paths = Paths::under(root.path());
        std::fs::create_dir_all(&paths.private_dir).unwrap();
        if let Some(cache) = cache {
            std::fs::write(
                paths.private_dir.join("vif-cache-eth0.json"),
                serde_json::to_vec_pretty(cache).unwrap(),
            )
            .unwrap();
        }
        (root, paths)
    }

    fn cache() -> dhcp_cache::DhcpConfig {
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        dhcp_cache::DhcpConfig {
            ip: dhcp_cache::NetlinkAddr::from_cidr(ip("10.244.1.5"), 24),
            mac: Some(vec![0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05]),
            gateway: Some(ip("10.244.1.1")),
            routes: Some(vec![dhcp_cache::NetlinkRoute::new(
                None,
                Some(ip("10.244.1.1")),
            )]),
            ..Default::default()
        }
    }

    #[test]
    fn bridge_serves_the_cached_pod_address_from_the_fake_bridge_address() {
        let (_root, paths) = paths_with_cache(Some(&cache()));
        let config = dhcp_config(&vmi(BRIDGE), &paths, &pod()).unwrap().unwrap();
        assert_eq!(config.guest_ip, Ipv4Addr::new(10, 244, 1, 5));
        assert_eq!(config.server_ip, Ipv4Addr::new(169, 254, 75, 10));
        assert_eq!(config.router, Some(Ipv4Addr::new(10, 244, 1, 1)));
        assert_eq!(
            config.client_mac,
            Some([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05])
        );
        assert_eq!(config.mtu, 1450);
        assert_eq!(config.hostname.as_deref(), Some("testvmi"));

        // The pod interface second in the list: 169.254.75.11.
        let second = "domain:\n  devices:\n    interfaces:\n    - name: net1\n      bridge: {}\n    - name: default\n      bridge: {}\nnetworks:\n- name: net1\n  multus:\n    networkName: x\n- name: default\n  pod: {}";
        let config = dhcp_config(&vmi(second), &paths, &pod()).unwrap().unwrap();
        assert_eq!(config.server_ip, Ipv4Addr::new(169, 254, 75, 11));
    }

    #[test]
    fn bridge_without_ipv4_serves_nothing_and_a_missing_cache_is_an_error() {
        let disabled = dhcp_cache::DhcpConfig {
            ipam_disabled: true,
            ..Default::default()
        };
        let (_root, paths) = paths_with_cache(Some(&disabled));
        assert!(dhcp_config(&vmi(BRIDGE), &paths, &pod()).unwrap().is_none());

        let (_root, paths) = paths_with_cache(None);
        let err = dhcp_config(&vmi(BRIDGE), &paths, &pod()).unwrap_err();
        assert!(matches!(err, NetworkError::Cache(..)), "{err}");
        assert!(err.to_string().contains("vif-cache-eth0.json"), "{err}");

        let (_root, paths) = paths_with_cache(None);
        std::fs::write(paths.private_dir.join("vif-cache-eth0.json"), "{not json").unwrap();
        assert!(matches!(
            dhcp_config(&vmi(BRIDGE), &paths, &pod()),
            Err(NetworkError::Cache(..))
        ));
    }

    #[test]
    fn masquerade_is_unchanged() {
        let (_root, paths) = paths_with_cache(None);
        let masq = BRIDGE.replace("bridge", "masquerade");
        let config = dhcp_config(&vmi(&masq), &paths, &pod()).unwrap().unwrap();
        assert_eq!(config.guest_ip, Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(config.server_ip, Ipv4Addr::new(10, 0, 2, 1));
        assert_eq!(config.client_mac, None);
        let none = "domain:\n  devices: {}";
        assert!(dhcp_config(&vmi(none), &paths, &pod()).unwrap().is_none());
    }
}
