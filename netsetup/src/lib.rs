//! KubeVirt's pod network bindings, rebuilt in Rust (KubeVirt v1.9.0 `pkg/network/`).
//!
//! - [`masquerade::setup`] / [`masquerade::teardown`]: the handler's phase 1 of the
//!   masquerade binding inside the pod's network namespace (bridge `k6t-eth0`, tap `tap0`,
//!   sysctls, nftables NAT).
//! - [`bridge::setup`] / [`bridge::teardown`]: the same for the bridge binding (the pod
//!   interface bridged as `eth0-nic`, a dummy `eth0` keeping the pod IP, the tap), which
//!   also returns the DHCP cache the launcher serves from.
//! - [`dhcp`]: the launcher's DHCPv4 server for the guest on the bridge, for either binding.
//!
//! No `ip` or `nft` binary is used: links and addresses go through rtnetlink, rules through
//! nf_tables netlink, and namespaces are entered with `setns` on a dedicated thread.
//!
//! Handler side:
//!
//! ```no_run
//! use netsetup::masquerade::{self, MasqueradeConfig};
//! use netsetup::netns::NetnsTarget;
//! use netsetup::nft::{L4Proto, Port};
//!
//! let mut config = MasqueradeConfig::new(NetnsTarget::Pid(4242)); // the launcher's PID
//! config.ports = vec![Port { number: 80, protocol: L4Proto::Tcp }];
//! let outcome = masquerade::setup(&config)?; // idempotent; rolls back on failure
//! println!("pod IP for status.interfaces: {:?}", outcome.pod_ipv4);
//! # Ok::<(), netsetup::binding::BindingError>(())
//! ```
//!
//! Launcher side (already inside the pod's namespace):
//!
//! ```no_run
//! use std::sync::atomic::AtomicBool;
//! use std::time::Duration;
//! use netsetup::dhcp::{DhcpConfig, DhcpServer};
//! use netsetup::masquerade::DEFAULT_IPV4_CIDR;
//! use netsetup::resolv::ResolvConf;
//!
//! let resolv = ResolvConf::read("/etc/resolv.conf".as_ref())?;
//! let config = DhcpConfig::masquerade(DEFAULT_IPV4_CIDR, &resolv, Some("myvmi".into()), None, 1450)?;
//! let server = DhcpServer::bind("k6t-eth0", config)?;
//! let stop = AtomicBool::new(false);
//! server.serve_until(&stop, Duration::from_secs(1))?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod binding;
pub mod bridge;
pub mod dhcp;
pub mod links;
pub mod masquerade;
pub mod netns;
pub mod nft;
pub mod resolv;
pub mod sysctl;
pub mod tap;

/// A small non-negative libc constant (a protocol number, a flag) as the one byte a netlink
/// message carries it in. Used in const items only, so a constant that does not fit fails the
/// build instead of being truncated.
pub(crate) const fn libc_byte(value: libc::c_int) -> u8 {
    match value.to_le_bytes() {
        [byte, 0, 0, 0] => byte,
        _ => panic!("libc constant does not fit in one byte"),
    }
}
