//! Facts that several processes must agree on, each written once.
//!
//! The controller renders a launcher pod, the handler prepares it, netsetup plumbs its
//! network and the launcher runs inside it: each of them names the same interfaces,
//! paths and image mounts. Those names are KubeVirt v1.9.0's (a stock handler or launcher
//! must find them where its own counterpart puts them), so they live here, next to the
//! wire types, instead of as copies in each crate.
//!
//! - [`pod_network`]: interface, bridge and tap names in the launcher pod's netns.
//! - [`pod_paths`]: where the launcher pod mounts images, sockets and disks.
//! - [`dhcp_cache`]: the bridge binding's `vif-cache-<iface>.json`, handler → launcher.
//! - [`kernel_boot`]: reading `spec.domain.firmware.kernelBoot.container` from a VMI.
//! - [`boot_disk`]: which disk a VMI without kernel boot boots, and as which firmware.
//! - [`defaults`]: the defaults virt-api's mutating webhook stores in new VMs and VMIs
//!   (shared with the controller and standalone mode).
//! - [`feature_gates`]: KubeVirt's feature gates and the admission rules behind them.
//! - [`node_labels`]: the node labels launcher pods select on (the node labeller writes them).
//! - [`runnable`]: which VMIs this project's launcher can run, checked by the controller,
//!   the launcher and standalone mode alike.

pub mod boot_disk;
pub mod defaults;
pub mod dhcp_cache;
pub mod feature_gates;
pub mod go_duration;
pub mod kernel_boot;
pub mod node_labels;
pub mod pod_network;
pub mod pod_paths;
pub mod runnable;
