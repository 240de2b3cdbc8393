//! The defaults KubeVirt's API webhook gives every VMI at creation, written once in
//! `proto::contract::defaults` (virt-api's mutating webhook stores them; this crate and
//! standalone mode share them). Here with the cluster's configuration as this controller
//! reads it ([`TemplateConfig`]): the VM controller applies them to the VMIs it creates, the
//! VMI controller writes them into a VMI stored without them (created while virt-api was
//! absent) before its first pod, and the template renders from a defaulted copy.

use crate::template::TemplateConfig;
use proto::contract::defaults;
use proto::kubevirt::{VirtualMachineInstance, VirtualMachineInstanceSpec};

impl TemplateConfig {
    /// What of the configuration the webhook's defaults depend on.
    pub fn defaults(&self) -> defaults::Config {
        defaults::Config {
            default_architecture: self.default_architecture.clone(),
            cpu_model: self.cpu_model.clone(),
            cpu_request: self.cpu_request.clone(),
            eviction_strategy: self.eviction_strategy.clone(),
            default_network_interface: self.default_network_interface.clone(),
            root: self.root,
        }
    }
}

/// Applies the webhook's defaults to a new VMI: the spec's, then the metadata's.
pub(crate) fn apply_vmi(vmi: &mut VirtualMachineInstance, config: &TemplateConfig) {
    defaults::apply_vmi(vmi, &config.defaults());
}

/// Applies the webhook's spec defaults in place; fields already set are kept.
pub fn apply(spec: &mut VirtualMachineInstanceSpec, config: &TemplateConfig) {
    defaults::apply_spec(spec, &config.defaults());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field the defaults read comes from the configuration this controller builds
    /// from the CR, and the defaults without a CR are KubeVirt's.
    #[test]
    fn the_configuration_the_defaults_read() {
        assert_eq!(
            TemplateConfig::default().defaults(),
            defaults::Config::default()
        );
        let config = TemplateConfig {
            default_architecture: "arm64".into(),
            cpu_model: Some("Haswell".into()),
            cpu_request: Some(proto::kubevirt::Quantity("2".into())),
            eviction_strategy: Some("LiveMigrate".into()),
            default_network_interface: "masquerade".into(),
            root: true,
            ..TemplateConfig::default()
        };
        assert_eq!(
            config.defaults(),
            defaults::Config {
                default_architecture: "arm64".into(),
                cpu_model: Some("Haswell".into()),
                cpu_request: Some(proto::kubevirt::Quantity("2".into())),
                eviction_strategy: Some("LiveMigrate".into()),
                default_network_interface: "masquerade".into(),
                root: true,
            }
        );
    }
}
