//! kubevirt.io/v1 resources, the subset the node side and the thin controller use: VMIs, VMs
//! and the `KubeVirt` install with its configuration.
//!
//! JSON names follow `staging/src/kubevirt.io/api/core/v1/types.go` (v1.9.0).
//! Every struct keeps the fields it does not model in `extra`, so that a
//! read-modify-write never drops what another writer put there.

pub mod kv;
pub mod migration;
pub mod quantity;
pub mod ready;
mod schema;
pub mod status_write;
pub mod vm;
pub mod vmi;
pub mod well_known;

pub use kv::{KubeVirt, KubeVirtConfiguration, KubeVirtSpec, KubeVirtStatus};
pub use migration::{
    MigrationPhase, MigrationState, VirtualMachineInstanceMigration,
    VirtualMachineInstanceMigrationSpec, VirtualMachineInstanceMigrationStatus,
};
pub use vm::{RunStrategy, VirtualMachine, VirtualMachineSpec, VirtualMachineStatus};
pub use vmi::*;

/// Fields a type does not model, kept verbatim.
pub type Extra = std::collections::BTreeMap<String, serde_json::Value>;

/// `Quantity` and `Time` as Kubernetes spells them.
pub use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// Errors while reading a resource from a manifest or a wire message.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    // The parser's message is part of ours and not also a `source`: error chains
    // printed with `{:#}` would show it twice.
    #[error("invalid JSON: {0}")]
    Json(serde_json::Error),
    #[error("invalid YAML: {0}")]
    Yaml(serde_yaml::Error),
    #[error("expected kind {expected}, found {found:?}")]
    WrongKind {
        expected: &'static str,
        found: String,
    },
}

impl From<serde_json::Error> for ParseError {
    fn from(e: serde_json::Error) -> Self {
        ParseError::Json(e)
    }
}

impl From<serde_yaml::Error> for ParseError {
    fn from(e: serde_yaml::Error) -> Self {
        ParseError::Yaml(e)
    }
}

/// Parses a VMI given as JSON or YAML (YAML is a superset of JSON, but the
/// JSON parser gives better messages for JSON input, so it is tried first).
pub fn parse_vmi(text: &str) -> Result<VirtualMachineInstance, ParseError> {
    parse_kind(text, "VirtualMachineInstance")
}

/// Parses a VirtualMachine given as JSON or YAML.
pub fn parse_vm(text: &str) -> Result<VirtualMachine, ParseError> {
    parse_kind(text, "VirtualMachine")
}

fn parse_kind<T: serde::de::DeserializeOwned>(
    text: &str,
    expected: &'static str,
) -> Result<T, ParseError> {
    let value: serde_json::Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text)?
    } else {
        serde_yaml::from_str(text)?
    };
    // The handler sends VMIs without kind/apiVersion: only a present,
    // different kind is an error.
    if let Some(kind) = value.get("kind").and_then(|k| k.as_str())
        && kind != expected
    {
        return Err(ParseError::WrongKind {
            expected,
            found: kind.to_string(),
        });
    }
    Ok(serde_json::from_value(value)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_parse_error_says_the_parsers_message_once() {
        for text in ["metadata: {name: x\nspec: [\n", "{\"metadata\": 3}"] {
            let err = parse_vmi(text).expect_err("invalid");
            // Chains printed as `outer: inner` (anyhow's `{:#}`) must not repeat it.
            assert!(std::error::Error::source(&err).is_none(), "{err}");
            let shown = err.to_string();
            let detail = shown.split_once(": ").expect("kind: detail").1;
            assert_eq!(shown.matches(detail).count(), 1, "{shown}");
        }
    }
}
