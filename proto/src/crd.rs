//! CustomResourceDefinitions for the kubevirt.io/v1 resources we serve.
//!
//! `cargo run -p proto --bin crdgen -- images/deploy/crds` writes them.
//! Every CRD gets the status subresource, so status is written through
//! `/status` and a spec writer can never clobber it (and the other way round).

use crate::kubevirt::{
    KubeVirt, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

/// Every CRD, with the file name it is written under.
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("kubevirt.io_kubevirts.yaml", KubeVirt::crd()),
        (
            "kubevirt.io_virtualmachineinstances.yaml",
            VirtualMachineInstance::crd(),
        ),
        ("kubevirt.io_virtualmachines.yaml", VirtualMachine::crd()),
        (
            "kubevirt.io_virtualmachineinstancemigrations.yaml",
            VirtualMachineInstanceMigration::crd(),
        ),
    ]
}

/// A CRD as the YAML document we ship.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    Ok(format!("---\n{}", serde_yaml::to_string(crd)?))
}
