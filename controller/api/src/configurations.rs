//! The webhook configurations virt-api serves, as KubeVirt v1.9.0's operator writes them
//! (`components.NewVirtAPIValidatingWebhookConfiguration`, `NewVirtAPIMutatingWebhookConfiguration`),
//! for the webhooks served here: names, paths, rules, `failurePolicy: Fail`, 10 s timeouts,
//! `sideEffects: None` (`NoneOnDryRun` for the pod-eviction interceptors, which mark VMIs),
//! `admissionReviewVersions: [v1]`, the interceptors' `matchConditions`. How the API server reaches virt-api
//! is the caller's (`client`: KubeVirt's Service `virt-api` of the install namespace, or a
//! URL); the `caBundle` is left for virt-api to write.

use crate::server;
use crate::{MUTATING_WEBHOOK, VALIDATING_WEBHOOK};
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::{
    APIService, APIServiceSpec, ServiceReference as ApiServiceReference,
};
use kube::api::ObjectMeta;
use std::collections::BTreeMap;

/// `defaultTimeoutSeconds`.
pub const TIMEOUT_SECONDS: i32 = 10;

/// The client configuration of KubeVirt's Service `virt-api` in `namespace` at `path`.
pub fn service(namespace: &str) -> impl Fn(&str) -> WebhookClientConfig {
    let namespace = namespace.to_string();
    move |path| WebhookClientConfig {
        service: Some(ServiceReference {
            namespace: namespace.clone(),
            name: crate::SERVICE.into(),
            path: Some(path.into()),
            port: None,
        }),
        ..Default::default()
    }
}

/// The client configuration of `https://<address>` at `path` (tests).
pub fn url(address: &str) -> impl Fn(&str) -> WebhookClientConfig {
    let address = address.to_string();
    move |path| WebhookClientConfig {
        url: Some(format!("https://{address}{path}")),
        ..Default::default()
    }
}

/// A rule for `resource` of kubevirt.io in KubeVirt's webhook versions.
fn rule(operations: &[&str], resource: &str) -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        operations: Some(operations.iter().map(|o| o.to_string()).collect()),
        api_groups: Some(vec![crate::admit::GROUP.into()]),
        api_versions: Some(
            crate::admit::VERSIONS
                .iter()
                .map(|v| v.to_string())
                .collect(),
        ),
        resources: Some(vec![resource.into()]),
        scope: None,
    }]
}

/// v1.9.0's rule of the pod-eviction interceptors: every operation on `pods/eviction` (core
/// group, v1); the API server only ever creates an Eviction.
fn eviction_rule() -> Vec<RuleWithOperations> {
    vec![RuleWithOperations {
        operations: Some(vec!["*".into()]),
        api_groups: Some(vec!["".into()]),
        api_versions: Some(vec!["v1".into()]),
        resources: Some(vec!["pods/eviction".into()]),
        scope: None,
    }]
}

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        labels: Some(BTreeMap::from([
            ("kubevirt.io".to_string(), name.to_string()),
            (
                "app.kubernetes.io/managed-by".to_string(),
                "virt-api".to_string(),
            ),
        ])),
        ..Default::default()
    }
}

/// `virt-api-validator`, in v1.9.0's order: the pod-eviction interceptors (launcher pods,
/// hotplug-volume pods; both `/pod-eviction-validate`), VMI create, VMI update, VM create and
/// update, migration create, migration update.
pub fn validating(client: impl Fn(&str) -> WebhookClientConfig) -> ValidatingWebhookConfiguration {
    let webhook = |name: &str, operations: &[&str], resource: &str, path: &str| ValidatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        failure_policy: Some("Fail".into()),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        side_effects: "None".into(),
        rules: Some(rule(operations, resource)),
        client_config: client(path),
        ..Default::default()
    };
    // The eviction interceptors mark VMIs (not on a dry run: `NoneOnDryRun`). `Fail` as
    // v1.9.0 sets it (its comment speaks of not blocking evictions, its code fails closed):
    // while no replica answers, a pod the condition names cannot be evicted.
    let interceptor =
        |name: &str, versions: &[&str], condition: &str, expression: &str| ValidatingWebhook {
            name: name.into(),
            admission_review_versions: versions.iter().map(|v| v.to_string()).collect(),
            failure_policy: Some("Fail".into()),
            timeout_seconds: Some(TIMEOUT_SECONDS),
            side_effects: "NoneOnDryRun".into(),
            rules: Some(eviction_rule()),
            client_config: client(server::POD_EVICTION_VALIDATE),
            match_conditions: Some(vec![MatchCondition {
                name: condition.into(),
                expression: expression.into(),
            }]),
            ..Default::default()
        };
    ValidatingWebhookConfiguration {
        metadata: metadata(VALIDATING_WEBHOOK),
        webhooks: Some(vec![
            interceptor(
                "virt-launcher-eviction-interceptor.kubevirt.io",
                &["v1"],
                "only-vms",
                r#"object.metadata.name.startsWith("virt-launcher")"#,
            ),
            interceptor(
                "hotplug-pod-eviction-interceptor.kubevirt.io",
                &["v1", "v1beta1"],
                "only-hotplug-pods",
                r#"object.metadata.name.startsWith("hp-volume-")"#,
            ),
            webhook(
                "virtualmachineinstances-create-validator.kubevirt.io",
                &["CREATE"],
                crate::admit::VMIS,
                server::VMI_CREATE_VALIDATE,
            ),
            webhook(
                "virtualmachineinstances-update-validator.kubevirt.io",
                &["UPDATE"],
                crate::admit::VMIS,
                server::VMI_UPDATE_VALIDATE,
            ),
            webhook(
                "virtualmachine-validator.kubevirt.io",
                &["CREATE", "UPDATE"],
                crate::admit::VMS,
                server::VM_VALIDATE,
            ),
            webhook(
                "migration-create-validator.kubevirt.io",
                &["CREATE"],
                crate::migration::MIGRATIONS,
                server::MIGRATION_CREATE_VALIDATE,
            ),
            webhook(
                "migration-update-validator.kubevirt.io",
                &["UPDATE"],
                crate::migration::MIGRATIONS,
                server::MIGRATION_UPDATE_VALIDATE,
            ),
        ]),
    }
}

/// `virt-api-mutator`: VMs and VMIs on create and update, migrations on create.
pub fn mutating(client: impl Fn(&str) -> WebhookClientConfig) -> MutatingWebhookConfiguration {
    let webhook = |name: &str, operations: &[&str], resource: &str, path: &str| MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        failure_policy: Some("Fail".into()),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        side_effects: "None".into(),
        rules: Some(rule(operations, resource)),
        client_config: client(path),
        ..Default::default()
    };
    MutatingWebhookConfiguration {
        metadata: metadata(MUTATING_WEBHOOK),
        webhooks: Some(vec![
            webhook(
                "virtualmachines-mutator.kubevirt.io",
                &["CREATE", "UPDATE"],
                crate::admit::VMS,
                server::VM_MUTATE,
            ),
            webhook(
                "virtualmachineinstances-mutator.kubevirt.io",
                &["CREATE", "UPDATE"],
                crate::admit::VMIS,
                server::VMI_MUTATE,
            ),
            webhook(
                "migrations-mutator.kubevirt.io",
                &["CREATE"],
                crate::migration::MIGRATIONS,
                server::MIGRATION_MUTATE,
            ),
        ]),
    }
}

/// The APIService of `version` (`components.NewVirtAPIAPIServices`): the group
/// `subresources.kubevirt.io` served by the Service `virt-api` of `namespace` (port 443),
/// priorities 1000/15; the `caBundle` is left for virt-api to write.
pub fn api_service(namespace: &str, version: &str) -> APIService {
    let mut metadata = metadata(&api_service_name(version));
    metadata
        .labels
        .get_or_insert_default()
        .insert("kubevirt.io".into(), "virt-api-aggregator".into());
    metadata.annotations = Some(BTreeMap::from([(
        "certificates.kubevirt.io/secret".to_string(),
        crate::certs::SERVING_SECRET.to_string(),
    )]));
    APIService {
        metadata,
        spec: Some(APIServiceSpec {
            service: Some(ApiServiceReference {
                namespace: Some(namespace.into()),
                name: Some(crate::SERVICE.into()),
                port: None,
            }),
            group: Some(crate::discovery::GROUP.into()),
            version: Some(version.into()),
            group_priority_minimum: 1000,
            version_priority: 15,
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `v1.subresources.kubevirt.io`, `v1alpha3.subresources.kubevirt.io`.
pub fn api_service_name(version: &str) -> String {
    format!("{version}.{}", crate::discovery::GROUP)
}

/// Every APIService of the group.
pub fn api_services(namespace: &str) -> Vec<APIService> {
    server::SUBRESOURCE_VERSIONS
        .iter()
        .map(|version| api_service(namespace, version))
        .collect()
}
