//! Network sysctls of the current network namespace, through `/proc/sys/net`.
//!
//! `/proc/sys/net` shows the namespace of the *thread* that opens the file, so these must
//! run on the thread that entered the pod's namespace (see [`crate::netns`]).

use std::path::PathBuf;

pub(crate) const IPV4_FORWARD: &str = "net/ipv4/ip_forward";
pub(crate) const IPV6_FORWARDING: &str = "net/ipv6/conf/all/forwarding";
/// ARP replies only for addresses of the receiving interface (mode 1): set by the bridge
/// binding, whose pod IP stays a local address of the pod (`procsys.ARPReplyMode1`).
pub const ARP_IGNORE_ALL: &str = "net/ipv4/conf/all/arp_ignore";

/// `net/ipv4/conf/<iface>/route_localnet`.
pub fn route_localnet(iface: &str) -> String {
    format!("net/ipv4/conf/{iface}/route_localnet")
}

#[derive(Debug, thiserror::Error)]
#[error("sysctl {key}: {source}")]
pub struct SysctlError {
    pub key: String,
    pub source: std::io::Error,
}

fn path(key: &str) -> PathBuf {
    PathBuf::from("/proc/sys").join(key)
}

/// Reads a sysctl, trimmed.
pub fn read(key: &str) -> Result<String, SysctlError> {
    std::fs::read_to_string(path(key))
        .map(|v| v.trim().to_string())
        .map_err(|source| SysctlError {
            key: key.to_string(),
            source,
        })
}

/// Writes a sysctl.
pub fn write(key: &str, value: &str) -> Result<(), SysctlError> {
    std::fs::write(path(key), value).map_err(|source| SysctlError {
        key: key.to_string(),
        source,
    })
}
