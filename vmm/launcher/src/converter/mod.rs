//! VMI → domain, as a list of small configurators (one per concern).
//!
//! Each configurator is a pure function of the VMI and a [`Context`] (what
//! the launcher found in the pod: disk files, kernel-boot artifacts, the pod
//! interface) that fills its part of the domain or refuses the VMI with an
//! error naming the field. Naming follows KubeVirt: domain `<ns>_<name>`,
//! device aliases are the VMI's device names (`ua-<name>` in libvirt XML).

mod cpu;
mod devices;
mod disks;
pub(crate) mod interfaces;
mod memory;
mod metadata;
mod os;
pub use os::SmbiosSettings;
mod serial;

use crate::disks::{DiskPlan, KernelBoot};
use crate::paths::Paths;
use proto::domain::{Devices, Domain};
use proto::kubevirt::VirtualMachineInstance;
use std::collections::BTreeMap;

/// A VMI the launcher cannot run, with the field that makes it so.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConvertError {
    pub field: String,
    pub reason: String,
}

impl ConvertError {
    pub(crate) fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConvertError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, ConvertError>;

/// The pod's primary interface, as the launcher sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodInterface {
    /// MTU of the pod's `eth0`.
    pub mtu: u32,
    /// MAC of the pod's `eth0` (the guest's MAC when the VMI sets none).
    pub mac: Option<String>,
    /// Whether `tap0` exists (else the domain names the pod interface, as KubeVirt does).
    pub tap_exists: bool,
}

/// What the converter needs besides the VMI.
#[derive(Clone, Debug, Default)]
pub struct Context {
    pub paths: Paths,
    /// One plan per `spec.volumes[]` entry that resolved (same order), by volume name.
    pub disks: BTreeMap<String, DiskPlan>,
    pub kernel_boot: Option<KernelBoot>,
    pub pod_interface: PodInterface,
    /// Interface name → how it attaches (`tap`), from `VirtualMachineOptions`.
    pub interface_attachment: BTreeMap<String, String>,
    /// The cluster's SMBIOS settings, from `VirtualMachineOptions` (none without options).
    pub smbios: Option<SmbiosSettings>,
    /// Interface name → the MAC the guest already has (a migration's target: the
    /// source's, from `status.interfaces`); wins over the pod interface's MAC.
    pub guest_macs: BTreeMap<String, String>,
}

/// Converts a VMI into the domain the launcher will run.
pub fn convert(vmi: &VirtualMachineInstance, ctx: &Context) -> Result<Domain> {
    // What every process agrees this launcher can run; the configurators below add detail.
    proto::contract::runnable::check(vmi).map_err(|r| ConvertError::new(r.field, r.reason))?;
    let namespace = vmi.metadata.namespace.clone().unwrap_or_default();
    let name = vmi
        .metadata
        .name
        .clone()
        .ok_or_else(|| ConvertError::new("metadata.name", "is required"))?;
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let mut domain = Domain::new(&namespace, &name, &uid);
    let spec = &mut domain.spec;
    let mut devices = Devices::default();

    devices::refuse_unsupported(vmi)?;
    metadata::configure(vmi, spec)?;
    memory::configure(vmi, spec)?;
    cpu::configure(vmi, spec)?;
    os::configure(vmi, ctx, spec)?;
    disks::configure(vmi, ctx, &mut devices)?;
    interfaces::configure(vmi, ctx, &mut devices)?;
    serial::configure(vmi, ctx, &mut devices)?;
    devices::configure_rng(vmi, &mut devices);
    spec.devices = Some(devices);
    Ok(domain)
}

#[cfg(test)]
mod runnable_agreement;

#[cfg(test)]
pub(crate) mod test_support {
    use proto::kubevirt::{VirtualMachineInstance, parse_vmi};

    /// A VMI from YAML, with name, namespace and uid filled in.
    pub fn vmi(spec_yaml: &str) -> VirtualMachineInstance {
        let text = format!(
            "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: testvmi\n  namespace: ns1\n  uid: 11111111-2222-3333-4444-555555555555\nspec:\n{}",
            spec_yaml
                .lines()
                .map(|l| format!("  {l}\n"))
                .collect::<String>()
        );
        parse_vmi(&text).unwrap()
    }
}
