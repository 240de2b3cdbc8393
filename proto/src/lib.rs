//! Everything that crosses a process boundary, exactly as KubeVirt v1.9.0 has it.
//!
//! - [`grpc`]: the `kubevirt.cmd.v1` / `kubevirt.cmd.info` services the launcher
//!   serves and the `kubevirt.notify.v1` / `kubevirt.notify.info` services the
//!   handler serves, generated from `protos/` (wire-identical to v1.9.0), and the
//!   kubelet's device-plugin API `v1beta1` the handler serves to provide
//!   `devices.kubevirt.io/*` resources.
//! - [`kubevirt`]: the kubevirt.io/v1 resources (`VirtualMachineInstance`,
//!   `VirtualMachine`, `KubeVirt`) with the labels, annotations and finalizers around them.
//! - [`domain`]: the domain object the launcher reports, in KubeVirt's JSON
//!   (Go field names as keys).
//! - [`domain_stats`]: the statistics `GetDomainStats` returns (`stats.DomainStats`).
//! - [`crd`]: CustomResourceDefinitions generated from the types.
//! - [`wire`]: a canonical listing of the compiled protos, for contract tests.
//! - [`unix`]: unix socket paths of any length and gRPC channels over them.
//! - [`contract`]: names and paths several processes must agree on (pod network, pod
//!   mounts, kernel boot, node labels) and which VMIs the launcher can run, each written once.
//!
//! Unknown JSON fields are kept everywhere (`extra` maps), so a component that
//! reads, changes and writes back an object never erases what it does not know.

pub mod contract;
pub mod crd;
pub mod domain;
pub mod domain_stats;
pub mod grpc;
pub mod kubevirt;
pub mod unix;
pub mod wire;
