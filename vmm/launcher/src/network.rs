//! The pod side of the network, launcher part (contract §5.2): what the pod
//! interface looks like, and the DHCP server that hands the guest its address.

use crate::converter::PodInterface;
use crate::paths::Paths;
use ipnet::Ipv4Net;
use netsetup::dhcp::{DhcpConfig, DhcpServer};
use netsetup::resolv::ResolvConf;
use proto::kubevirt::VirtualMachineInstance;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use proto::contract::pod_network::{PRIMARY_POD_IFACE as POD_IFACE, PRIMARY_TAP};
/// The masquerade bridge of the primary pod interface (`k6t-eth0`).
fn bridge() -> String {
    proto::contract::pod_network::bridge_name(POD_IFACE)
}
/// KubeVirt's default guest network for masquerade.
pub const DEFAULT_VM_CIDR: &str = "10.0.2.0/24";

/// Reads `eth0`'s MTU and MAC and whether `tap0` exists, from sysfs.
pub fn pod_interface(sys_class_net: &Path) -> PodInterface {
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
pub enum NetworkError {
    #[error("spec.networks[{0}].pod.vmNetworkCIDR: {1:?} is not an IPv4 network")]
    BadCidr(usize, String),
    #[error("DHCP configuration: {0}")]
    Dhcp(#[from] netsetup::dhcp::DhcpConfigError),
    #[error("DHCP server on k6t-eth0: {0}")]
    Server(#[from] netsetup::dhcp::ServerError),
}

/// A running DHCP server; stops when dropped.
pub struct DhcpHandle {
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

/// Starts the guest's DHCP server when the VMI has a masquerade interface.
/// Returns `None` when there is nothing to serve.
pub fn start_dhcp(
    vmi: &VirtualMachineInstance,
    paths: &Paths,
    pod: &PodInterface,
) -> Result<Option<DhcpHandle>, NetworkError> {
    let Some(iface) = vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .find(|i| i.masquerade.is_some())
    else {
        return Ok(None);
    };
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
    // A missing resolv.conf means KubeVirt's defaults (8.8.8.8, cluster.local).
    let resolv = ResolvConf::read(&paths.resolv_conf).unwrap_or_default();
    let hostname = vmi
        .spec
        .hostname
        .clone()
        .or_else(|| vmi.metadata.name.clone());
    let config = DhcpConfig::masquerade(
        network,
        &resolv,
        hostname,
        vmi.spec.subdomain.as_deref(),
        pod.mtu,
    )?;
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
