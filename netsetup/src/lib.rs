//! KubeVirt's masquerade pod network, rebuilt in Rust (contract §5).
//!
//! - [`masquerade::setup`] / [`masquerade::teardown`]: the handler's phase 1 inside the pod's
//!   network namespace (bridge `k6t-eth0`, tap `tap0`, sysctls, nftables NAT).
//! - [`dhcp`]: the launcher's DHCPv4 server for the guest on the bridge.
//!
//! No `ip` or `nft` binary is used: links and addresses go through rtnetlink, rules through
//! nf_tables netlink, and namespaces are entered with `setns` on a dedicated thread.

pub mod dhcp;
pub mod links;
pub mod masquerade;
pub mod netns;
pub mod nft;
pub mod resolv;
pub mod sysctl;
pub mod tap;
