//! Names in the launcher pod's network namespace (KubeVirt v1.9.0
//! `pkg/network/link/names.go`, `pkg/network/namescheme/networknamescheme.go`).

/// The primary pod interface the CNI plugin creates.
pub const PRIMARY_POD_IFACE: &str = "eth0";

/// The tap the VMM opens for the primary pod network.
pub const PRIMARY_TAP: &str = "tap0";

/// The in-pod bridge of a pod interface: `k6t-` + the name without a `pod` prefix, so
/// `eth0` → `k6t-eth0` and a secondary `pod1a2b…` → `k6t-1a2b…`.
pub fn bridge_name(pod_iface: &str) -> String {
    format!("k6t-{}", pod_iface.strip_prefix("pod").unwrap_or(pod_iface))
}

/// What the bridge binding renames the pod interface to once it is a bridge port:
/// the name without a `pod` prefix, plus `-nic` (`eth0` → `eth0-nic`;
/// `link.GenerateNewBridgedVmiInterfaceName`).
pub fn bridged_pod_iface_name(pod_iface: &str) -> String {
    format!("{}-nic", pod_iface.strip_prefix("pod").unwrap_or(pod_iface))
}

/// The bridge binding's link-local address on the bridge, `169.254.75.1<index>/32`,
/// where `index` is the interface's position in `spec.domain.devices.interfaces`
/// (`link.GetFakeBridgeIP`, `netpod.bridgeBindingSpec`). The launcher's DHCP server
/// answers from it. `None` from index 100 on, where KubeVirt's text is no address.
pub fn fake_bridge_ip(index: usize) -> Option<std::net::Ipv4Addr> {
    format!("169.254.75.1{index}").parse().ok()
}

/// Prefix length of [`fake_bridge_ip`].
pub const FAKE_BRIDGE_IP_PREFIX_LEN: u8 = 32;

/// The bridge's MAC (KubeVirt's `StaticMasqueradeBridgeMAC`); reserved, so a guest may
/// not use it.
pub const BRIDGE_MAC: &str = "02:00:00:00:00:00";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bridge_names_follow_kubevirt() {
        assert_eq!(bridge_name(PRIMARY_POD_IFACE), "k6t-eth0");
        assert_eq!(bridge_name("pod16477688c0e"), "k6t-16477688c0e");
        assert_eq!(bridge_name("net1"), "k6t-net1");
    }

    #[test]
    fn bridge_binding_names_follow_kubevirt() {
        assert_eq!(bridged_pod_iface_name("eth0"), "eth0-nic");
        assert_eq!(bridged_pod_iface_name("pod16477688c0e"), "16477688c0e-nic");
        assert_eq!(fake_bridge_ip(0), Some("169.254.75.10".parse().unwrap()));
        assert_eq!(fake_bridge_ip(3), Some("169.254.75.13".parse().unwrap()));
        assert_eq!(fake_bridge_ip(12), Some("169.254.75.112".parse().unwrap()));
        assert_eq!(fake_bridge_ip(99), Some("169.254.75.199".parse().unwrap()));
        assert_eq!(fake_bridge_ip(100), None);
    }
}
