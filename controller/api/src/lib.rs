//! virt-api: KubeVirt v1.9.0's admission webhooks for VMs, VMIs, migrations and pod
//! evictions, served over HTTPS at v1.9.0's paths, with the configuration of the `KubeVirt` CR.
//!
//! - [`admit`]: the VM and VMI webhooks as pure functions (validating: what the feature gates
//!   forbid, what the launcher cannot run, KubeVirt's update and label rules; mutating: the
//!   defaults KubeVirt stores, `proto::contract::defaults`).
//! - [`migration`]: the `VirtualMachineInstanceMigration` webhooks (label and finalizer;
//!   create and update rules); [`eviction`]: evictions of launcher pods turned into
//!   evacuations. Both read (and the eviction webhook writes) the cluster through
//!   [`cluster::Cluster`], as v1.9.0 does with direct API calls.
//! - [`review`]: `AdmissionReview` v1 and KubeVirt's answers (causes, JSON patches).
//! - [`certs`]: the CA and serving certificate in Secrets, the webhooks' `caBundle`.
//! - [`configurations`]: the Validating/MutatingWebhookConfigurations, as v1.9.0 names them.
//! - [`server`]: the endpoints (webhooks, `healthz`, `version`) and the TLS listener.
//! - [`run`]: all of it, until shutdown.
//!
//! The configuration and the admission rules are the controller's (`controller::kubevirt_cr`,
//! `controller::admission`), so both judge a VMI the same way: virt-api when it is created,
//! the controller again before its pod (a VMI stored while virt-api was absent).

pub mod admit;
pub mod authorize;
pub mod certs;
pub mod cluster;
pub mod configurations;
pub mod discovery;
pub mod eviction;
pub mod frontproxy;
pub mod migration;
pub mod review;
pub mod server;
pub mod subresources;

use anyhow::{Context as _, Result};
use controller::kubevirt_cr::ClusterConfig;
use controller::template::TemplateConfig;
use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService;
use kube::Api;
use kube::runtime::{WatchStreamExt, reflector, watcher};
use proto::kubevirt::KubeVirt;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// KubeVirt's names (`components.VirtAPIValidatingWebhookName`, `VirtAPIMutatingWebhookName`,
/// `VirtApiServiceName`).
pub const VALIDATING_WEBHOOK: &str = "virt-api-validator";
pub const MUTATING_WEBHOOK: &str = "virt-api-mutator";
pub const SERVICE: &str = "virt-api";

/// How virt-api runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The install namespace: the `KubeVirt` CR, the certificates' Secrets, the Service.
    pub namespace: String,
    /// The Service the API server calls (`virt-api`): the serving certificate's names.
    pub service: String,
    /// More names for the serving certificate (tests call by `127.0.0.1`).
    pub extra_names: Vec<String>,
    /// The webhook configurations whose `caBundle` virt-api writes.
    pub validating_webhook: String,
    pub mutating_webhook: String,
    /// The configuration without a `KubeVirt` CR (the CR's fields win).
    pub defaults: TemplateConfig,
    /// KubeVirt's service accounts as user names (`admit::service_accounts`).
    pub service_accounts: BTreeSet<String>,
    /// How often the `caBundle` is checked again (someone may replace a configuration).
    pub ca_bundle_interval: Duration,
    /// The APIServices whose `caBundle` virt-api writes (none: the subresources are not
    /// registered with the aggregation layer, as in the control-plane tests).
    pub api_services: Vec<String>,
}

impl Options {
    /// KubeVirt's names in `namespace`, v1.9.0's configuration defaults.
    pub fn new(namespace: &str) -> Self {
        Options {
            namespace: namespace.to_string(),
            service: SERVICE.into(),
            extra_names: Vec::new(),
            validating_webhook: VALIDATING_WEBHOOK.into(),
            mutating_webhook: MUTATING_WEBHOOK.into(),
            defaults: TemplateConfig::default(),
            service_accounts: admit::service_accounts(namespace),
            ca_bundle_interval: Duration::from_secs(30),
            api_services: server::SUBRESOURCE_VERSIONS
                .iter()
                .map(|v| configurations::api_service_name(v))
                .collect(),
        }
    }
}

/// Runs virt-api on `listener` until `shutdown`: watches the `KubeVirt` CRs of the
/// namespace (and waits for their first list, as KubeVirt waits for its informers), makes
/// sure of the certificates, serves, and keeps the webhooks' `caBundle` the CA.
pub async fn run(
    client: kube::Client,
    listener: tokio::net::TcpListener,
    options: Options,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let namespace = options.namespace.clone();
    let (kubevirts, writer) = reflector::store::<KubeVirt>();
    let watch = reflector(
        writer,
        watcher(
            Api::<KubeVirt>::namespaced(client.clone(), &namespace),
            watcher::Config::default(),
        )
        .default_backoff(),
    )
    .for_each(|event| async move {
        if let Err(e) = event {
            tracing::warn!(error = %e, "watching KubeVirt CRs (is the kubevirts.kubevirt.io CRD installed?)");
        }
    });
    let watch = tokio::spawn(watch);
    let _stop_watch = AbortOnDrop(watch);
    kubevirts
        .wait_until_ready()
        .await
        .context("the KubeVirt CR watch ended")?;
    let config = Arc::new(ClusterConfig::new(
        options.defaults.clone(),
        &namespace,
        kubevirts.clone(),
    ));

    let names = certs::serving_names(&options.service, &namespace, &options.extra_names);
    let tls = certs::ensure(client.clone(), &namespace, &options.service, &names).await?;
    let handler_client = certs::ensure_handler(client.clone(), &namespace, &tls.ca).await?;
    let handler_tls = Arc::new(handler_api::client_config(
        &handler_client.cert_pem,
        &handler_client.key_pem,
        &tls.ca.cert_pem,
    )?);
    let front_proxy = Arc::new(frontproxy::FrontProxy::new());
    let front_proxy_watch = tokio::spawn(frontproxy::watch(client.clone(), front_proxy.clone()));
    let _stop_front_proxy_watch = AbortOnDrop(front_proxy_watch);
    let state = Arc::new(server::AppState {
        config,
        kubevirts,
        service_accounts: options.service_accounts.clone(),
        client: client.clone(),
        webhooks_ready: Default::default(),
        apiserver_version: Default::default(),
        front_proxy: front_proxy.clone(),
        namespace: namespace.clone(),
        handler_tls,
    });
    let local = listener.local_addr()?;
    let listener = server::TlsListener::new(
        listener,
        certs::server_config_with(&tls.serving, front_proxy.client_verifier())?,
    )?;
    let serve = axum::serve(
        listener,
        server::router(state.clone()).into_make_service_with_connect_info::<frontproxy::Peer>(),
    )
    .with_graceful_shutdown(shutdown)
    .into_future();
    tracing::info!(address = %local, namespace = %namespace, "serving the webhooks");

    let validating: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let api_services: Api<APIService> = Api::all(client.clone());
    let ca_bundles = async {
        loop {
            let written = async {
                let a = certs::write_ca_bundle(
                    &validating,
                    &options.validating_webhook,
                    &tls.ca.cert_pem,
                )
                .await?;
                let b =
                    certs::write_ca_bundle(&mutating, &options.mutating_webhook, &tls.ca.cert_pem)
                        .await?;
                let mut c = false;
                for name in &options.api_services {
                    c |= certs::write_api_service_ca_bundle(&api_services, name, &tls.ca.cert_pem)
                        .await?;
                }
                anyhow::Ok(a || b || c)
            }
            .await;
            match written {
                Ok(changed) => {
                    if changed {
                        tracing::info!(
                            validating = %options.validating_webhook,
                            mutating = %options.mutating_webhook,
                            api_services = ?options.api_services,
                            "caBundle written"
                        );
                    }
                    state.webhooks_ready.store(true, Ordering::Release);
                    tokio::time::sleep(options.ca_bundle_interval).await;
                }
                Err(e) => {
                    tracing::warn!(error = format!("{e:#}"), "the webhooks' caBundle");
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    };
    tokio::select! {
        served = serve => served.context("serving"),
        () = ca_bundles => Ok(()),
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
