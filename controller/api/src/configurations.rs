//! The webhook configurations virt-api serves, as KubeVirt v1.9.0's operator writes them
//! (`components.NewVirtAPIValidatingWebhookConfiguration`, `NewVirtAPIMutatingWebhookConfiguration`),
//! for the webhooks served here: names, paths, rules, `failurePolicy: Fail`, 10 s timeouts,
//! `sideEffects: None`, `admissionReviewVersions: [v1]`. How the API server reaches virt-api
//! is the caller's (`client`: KubeVirt's Service `virt-api` of the install namespace, or a
//! URL); the `caBundle` is left for virt-api to write.

use crate::server;
use crate::{MUTATING_WEBHOOK, VALIDATING_WEBHOOK};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ServiceReference,
    ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
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

/// `virt-api-validator`: VMI create, VMI update, VM create and update.
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
    ValidatingWebhookConfiguration {
        metadata: metadata(VALIDATING_WEBHOOK),
        webhooks: Some(vec![
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
        ]),
    }
}

/// `virt-api-mutator`: VMs and VMIs, create and update.
pub fn mutating(client: impl Fn(&str) -> WebhookClientConfig) -> MutatingWebhookConfiguration {
    let webhook = |name: &str, resource: &str, path: &str| MutatingWebhook {
        name: name.into(),
        admission_review_versions: vec!["v1".into()],
        failure_policy: Some("Fail".into()),
        timeout_seconds: Some(TIMEOUT_SECONDS),
        side_effects: "None".into(),
        rules: Some(rule(&["CREATE", "UPDATE"], resource)),
        client_config: client(path),
        ..Default::default()
    };
    MutatingWebhookConfiguration {
        metadata: metadata(MUTATING_WEBHOOK),
        webhooks: Some(vec![
            webhook(
                "virtualmachines-mutator.kubevirt.io",
                crate::admit::VMS,
                server::VM_MUTATE,
            ),
            webhook(
                "virtualmachineinstances-mutator.kubevirt.io",
                crate::admit::VMIS,
                server::VMI_MUTATE,
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
