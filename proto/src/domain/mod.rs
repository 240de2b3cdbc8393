//! The domain: the launcher's view of its VM, as KubeVirt's handler reads it.
//!
//! This is `api.Domain` of `pkg/virt-launcher/virtwrap/api/schema.go` (v1.9.0)
//! in JSON. Its casing is unusual and must be exact: `kind`/`apiVersion` at the
//! top, `"ObjectMeta"` with lower-camel keys inside, and everything else keyed
//! by Go field names (`"Spec"`, `"Status"`, `"Devices"`, `"Alias"`, `"UUID"`).
//! Go emits pointer fields without `omitempty` as `null`; we emit those the
//! handler looks at (grace-period metadata, status) and skip empty optional
//! parts. Unknown keys are kept in `extra` maps.

mod spec;
mod status;

pub use spec::*;
pub use status::*;

use crate::kubevirt::{Extra, Time};
use serde::{Deserialize, Serialize};

/// `kind` the Go launcher puts on every domain.
pub const DOMAIN_KIND: &str = "Domain";
/// `apiVersion` the Go launcher puts on every domain.
pub const DOMAIN_API_VERSION: &str = "1.2.2";

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Domain {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(
        rename = "apiVersion",
        default,
        skip_serializing_if = "String::is_empty"
    )]
    pub api_version: String,
    #[serde(rename = "ObjectMeta", default)]
    pub object_meta: DomainObjectMeta,
    #[serde(rename = "Spec", default)]
    pub spec: DomainSpec,
    #[serde(rename = "Status", default)]
    pub status: DomainStatus,
    #[serde(flatten)]
    pub extra: Extra,
}

/// The domain's Kubernetes-style metadata: the VMI's name and namespace.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DomainObjectMeta {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Go always writes this key (a struct cannot be omitted); `null` here.
    #[serde(default)]
    pub creation_timestamp: Option<Time>,
    /// Set when the domain is gone: the handler treats it as non-existent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Time>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl Domain {
    /// An empty domain for the VMI `namespace/name`, as the Go launcher makes
    /// one before filling in the spec (`NewDomainReferenceFromName`).
    pub fn new(namespace: &str, name: &str, vmi_uid: &str) -> Self {
        let mut domain = Domain {
            kind: DOMAIN_KIND.to_string(),
            api_version: DOMAIN_API_VERSION.to_string(),
            object_meta: DomainObjectMeta {
                name: name.to_string(),
                namespace: namespace.to_string(),
                uid: vmi_uid.to_string(),
                ..Default::default()
            },
            spec: DomainSpec::default(),
            status: DomainStatus::default(),
            extra: Extra::new(),
        };
        domain.spec.metadata.kubevirt.uid = vmi_uid.to_string();
        domain
    }

    /// The informer key `<namespace>/<name>` the handler files domains under.
    pub fn key(&self) -> String {
        format!("{}/{}", self.object_meta.namespace, self.object_meta.name)
    }

    /// The domain name libvirt would use: `<namespace>_<name>`.
    pub fn domain_name(namespace: &str, name: &str) -> String {
        format!("{namespace}_{name}")
    }

    /// The final event after a domain is deleted: `NoState/NonExistent` with a
    /// deletion timestamp (KubeVirt signals deletion this way, not with DELETED).
    pub fn gone(namespace: &str, name: &str, vmi_uid: &str, now: Time) -> Self {
        let mut domain = Domain::new(namespace, name, vmi_uid);
        domain.object_meta.deletion_timestamp = Some(now);
        domain.status.status = LifeCycle::NoState;
        domain.status.reason = StateChangeReason::NonExistent;
        domain
    }

    /// Whether the handler would consider the domain deleted.
    pub fn is_gone(&self) -> bool {
        self.object_meta.deletion_timestamp.is_some()
    }

    pub fn to_json(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).expect("domain serializes to JSON")
    }

    pub fn from_json(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }
}
