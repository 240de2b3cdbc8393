//! The webhook configurations `images/deploy/20-virt-api.yaml` installs are the ones
//! `configurations.rs` builds for KubeVirt's Service `virt-api` in `kubevirt`, field for
//! field (read through the same `k8s-openapi` types), and the Service and Deployment there
//! use the names and port virt-api serves with.

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use pretty_assertions::assert_eq;
use serde::Deserialize;
use std::path::Path;
use virt_api::configurations;

const MANIFEST: &str = "../../images/deploy/20-virt-api.yaml";

/// Every document of the manifest of `kind`, as `T`.
fn objects<T: serde::de::DeserializeOwned>(kind: &str) -> Vec<T> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(MANIFEST);
    let text = std::fs::read_to_string(&path).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|document| serde_yaml::Value::deserialize(document).unwrap())
        .filter(|value| value["kind"].as_str() == Some(kind))
        .map(|value| serde_yaml::from_value(value).unwrap())
        .collect()
}

#[test]
fn the_deployed_webhook_configurations_are_the_ones_configurations_rs_builds() {
    let validating: Vec<ValidatingWebhookConfiguration> = objects("ValidatingWebhookConfiguration");
    assert_eq!(
        validating,
        [configurations::validating(configurations::service(
            "kubevirt"
        ))]
    );
    let mutating: Vec<MutatingWebhookConfiguration> = objects("MutatingWebhookConfiguration");
    assert_eq!(
        mutating,
        [configurations::mutating(configurations::service(
            "kubevirt"
        ))]
    );
    for webhook in validating[0].webhooks.iter().flatten() {
        assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
    }
    for webhook in mutating[0].webhooks.iter().flatten() {
        assert_eq!(webhook.failure_policy.as_deref(), Some("Fail"));
    }
}

#[test]
fn the_service_and_deployment_are_the_ones_the_webhooks_name() {
    let services: Vec<Service> = objects("Service");
    assert_eq!(services.len(), 1);
    let service = &services[0];
    assert_eq!(service.metadata.name.as_deref(), Some(virt_api::SERVICE));
    assert_eq!(service.metadata.namespace.as_deref(), Some("kubevirt"));
    let port = &service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 443);
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8443))
    );

    let deployments: Vec<Deployment> = objects("Deployment");
    assert_eq!(deployments.len(), 1);
    let pod = deployments[0].spec.template.spec.as_ref().unwrap();
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("kubevirt-apiserver")
    );
    let container = &pod.containers[0];
    assert_eq!(
        container.image.as_deref(),
        Some("localhost/kubevirt-rs/virt-api:devel")
    );
    assert!(
        container
            .args
            .iter()
            .flatten()
            .any(|a| a == "--listen=0.0.0.0:8443")
    );
    let probe = container.readiness_probe.as_ref().unwrap();
    let get = probe.http_get.as_ref().unwrap();
    assert_eq!(get.scheme.as_deref(), Some("HTTPS"));
    assert_eq!(
        get.path.as_deref(),
        Some("/apis/subresources.kubevirt.io/v1/healthz")
    );
}

#[test]
fn the_deployed_api_services_are_the_ones_configurations_rs_builds() {
    use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
    let deployed: Vec<APIService> = objects("APIService");
    assert_eq!(deployed, configurations::api_services("kubevirt"));
    let names: Vec<_> = deployed
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(
        names,
        virt_api::Options::new("kubevirt").api_services,
        "virt-api writes the caBundle of every deployed APIService"
    );
}
