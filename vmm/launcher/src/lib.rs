//! virt-launcher without libvirt or QEMU.
//!
//! The process in a VMI pod's compute container. It answers KubeVirt's
//! handler on the `kubevirt.cmd.v1` contract ([`server`]; [`no_agent`] for
//! the RPCs that need a guest agent), turns the VMI into a domain
//! ([`converter`], then [`live`] for what libvirt adds), prepares the disks
//! ([`disks`]) and the pod side of the network ([`network`]), configures the
//! VMM from the domain ([`to_vm`]) and runs the VM with the `vmm` crate
//! ([`manager`]), and reports every change of the domain to the handler
//! ([`notify`]). [`run`] is the main flow, [`monitor`] the container's PID 1
//! (virt-launcher-monitor). See the crate's README.
//!
//! The VMM runs inside the launcher process: there is no separate emulator
//! process, so "the VMM is gone" is simply "the VM has ended". Its threads
//! are confined apart from the rest of the launcher ([`sandbox`]).

pub(crate) mod console_log;
pub mod converter;
pub mod disks;
pub mod flags;
pub(crate) mod live;
pub(crate) mod manager;
pub mod monitor;
pub(crate) mod network;
pub(crate) mod no_agent;
pub(crate) mod notify;
pub mod paths;
pub mod run;
pub mod sandbox;
pub mod server;
pub(crate) mod signals;
pub(crate) mod stats;
pub mod to_vm;

/// Current time as Kubernetes writes it.
pub(crate) fn now() -> proto::kubevirt::Time {
    proto::kubevirt::Time(k8s_openapi::jiff::Timestamp::now())
}
