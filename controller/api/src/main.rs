//! `virt-api`: KubeVirt v1.9.0's admission webhooks for VMs and VMIs over HTTPS, judged by
//! the `KubeVirt` CR of its namespace (read at every request, no restart).

use clap::Parser;
use controller::template::TemplateConfig;
use virt_api::{Options, run};

#[derive(Parser, Debug)]
#[command(
    name = "virt-api",
    about = "KubeVirt admission webhooks for VMs and VMIs (v1.9.0 behaviour)"
)]
struct Args {
    /// The install namespace: the `KubeVirt` CR, the certificates' Secrets, the Service.
    #[arg(long, default_value = "kubevirt")]
    namespace: String,
    /// Where to serve HTTPS (webhooks, healthz, version).
    #[arg(long, default_value = "0.0.0.0:8443")]
    listen: std::net::SocketAddr,
    /// The Service the API server calls: the serving certificate's DNS names.
    #[arg(long, default_value = virt_api::SERVICE)]
    service: String,
    /// Another name for the serving certificate (repeatable; an IP address becomes an IP
    /// name), e.g. 127.0.0.1 for webhooks configured by URL.
    #[arg(long = "extra-name")]
    extra_names: Vec<String>,
    /// The ValidatingWebhookConfiguration whose `caBundle` virt-api writes.
    #[arg(long, default_value = virt_api::VALIDATING_WEBHOOK)]
    validating_webhook: String,
    /// The MutatingWebhookConfiguration whose `caBundle` virt-api writes.
    #[arg(long, default_value = virt_api::MUTATING_WEBHOOK)]
    mutating_webhook: String,
    /// KubeVirt's feature gates that are on, comma-separated (`HostDisk,Root`), when the
    /// `KubeVirt` CR lists none (`developerConfiguration.featureGates` wins).
    #[arg(long, default_value = "")]
    feature_gates: proto::contract::feature_gates::FeatureGates,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    controller::init_logging();
    let args = Args::parse();
    let client = kube::Client::try_default().await?;
    let mut options = Options::new(&args.namespace);
    options.service = args.service;
    options.extra_names = args.extra_names;
    options.validating_webhook = args.validating_webhook;
    options.mutating_webhook = args.mutating_webhook;
    options.defaults = TemplateConfig {
        root: args
            .feature_gates
            .enabled(proto::contract::feature_gates::ROOT),
        feature_gates: args.feature_gates,
        ..TemplateConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let shutdown = controller::shutdown_signal()?;
    run(client, listener, options, shutdown).await
}
