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
}
