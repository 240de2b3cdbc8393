//! OpenAPI schemas for the CRDs.
//!
//! The API server prunes fields a structural schema does not declare. Our
//! types model a subset of KubeVirt's API, so a derived schema would make the
//! server erase everything else. The schema therefore declares the top-level
//! sections and marks `spec` and `status` `x-kubernetes-preserve-unknown-fields`,
//! which keeps whatever a client (or a stock KubeVirt component) writes.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use std::borrow::Cow;

macro_rules! open_resource_schema {
    ($ty:ty, $name:literal, $description:literal) => {
        impl JsonSchema for $ty {
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed($name)
            }
            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "description": $description,
                    "type": "object",
                    "properties": {
                        "apiVersion": {"type": "string"},
                        "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": true
                        },
                        "status": {
                            "type": "object",
                            "nullable": true,
                            "x-kubernetes-preserve-unknown-fields": true
                        }
                    },
                    "required": ["spec"]
                })
            }
        }
    };
}

open_resource_schema!(
    super::VirtualMachineInstance,
    "VirtualMachineInstance",
    "VirtualMachineInstance is the running VM: its virtual hardware (spec) and what it is doing (status)."
);
open_resource_schema!(
    super::VirtualMachine,
    "VirtualMachine",
    "VirtualMachine keeps a VirtualMachineInstance running according to its run strategy."
);
open_resource_schema!(
    super::KubeVirt,
    "KubeVirt",
    "KubeVirt is the one install of KubeVirt in a cluster: its configuration (spec.configuration) and the install's progress (status)."
);
open_resource_schema!(
    super::VirtualMachineInstanceMigration,
    "VirtualMachineInstanceMigration",
    "VirtualMachineInstanceMigration asks to move a running VirtualMachineInstance to another node (spec.vmiName), and reports how far it got (status)."
);
