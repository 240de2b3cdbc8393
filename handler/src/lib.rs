//! virt-handler: the node agent of KubeVirt v1.9.0, rebuilt in Rust.
//!
//! It brings the VMIs scheduled to its node to life and keeps their status true, talking
//! to launchers only over the cmd/notify gRPC contract (never linking the VMM).
//!
//! - [`sync`]: the decision table as pure functions (proto/CONTRACT.md §3.3–§3.6).
//! - [`launchers`]: finding launchers (socket paths, peer PID), the cmd client, ghost records.
//! - [`domains`]: the domain cache, the notify server and the notify pipes.
//! - [`vmis`]: where VMIs come from and where status goes ([`vmis::kube`] for Kubernetes).
//! - [`podfs`]: opening paths in pods (their volumes, a launcher's root) without following
//!   links out of them; used by `launchers` and `domains` alike.
//! - [`podside`]: pod network phase 1 through `netsetup` (masquerade or bridge binding, and
//!   the bridge binding's DHCP cache), device ownership, the pod-interface cache.
//! - [`agent`]: the work queue and the reconcile loop tying it all together.
//! - [`metrics`]: the Prometheus metrics (served by `metrics-http`); [`healthz`]: the endpoint's
//!   `/healthz` in Kubernetes mode.
//! - [`takeover`]: the debug trace of a VMI's way from `Scheduled` to `Running` written.
//! - [`node`]: the node heartbeat (`kubevirt.io/schedulable`) and the node labels.
//! - [`deviceplugins`]: the kubelet device plugins for `devices.kubevirt.io/{kvm,tun,vhost-net}`.
//! - [`rest`]: the HTTPS endpoint virt-api forwards VMI subresources to (`pause`, `reset`, ...).
//!
//! The `virt-handler` command is the `virt-handler` crate (`handler/cli`); standalone mode
//! (the same agent without Kubernetes) is the `handler-standalone` crate.

pub mod agent;
mod backoff;
pub mod deviceplugins;
pub mod domains;
pub mod healthz;
pub mod launchers;
pub mod metrics;
pub mod migration;
pub mod node;
pub(crate) mod podfs;
pub(crate) mod podside;
pub mod rest;
pub mod sync;
pub mod takeover;
pub mod vmis;
