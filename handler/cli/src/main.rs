//! `virt-handler`: the node agent. Without a subcommand it runs against Kubernetes (as the
//! DaemonSet does); `virt-handler standalone VMI.yaml...` runs VMIs on this machine alone.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use handler::agent::{Agent, AgentConfig};
use handler::domains::{DomainCache, notify};
use handler::launchers::{LauncherPaths, Launchers};
use handler::metrics::Metrics;
use handler::vmis::kube::KubeVmis;
use handler_standalone::{self as standalone, StandaloneOptions, store::StatusOutput};

#[derive(Parser, Debug)]
#[command(
    name = "virt-handler",
    version,
    about = "KubeVirt's node agent: brings the VMIs scheduled to this node to life through their launchers and keeps their status true",
    long_about = "KubeVirt's node agent: brings the VMIs scheduled to this node to life through their \
                  launchers and keeps their status true.\n\nWithout a subcommand it runs against \
                  Kubernetes, as KubeVirt's DaemonSet does; `virt-handler standalone VMI.yaml...` \
                  runs VMIs from manifests on this machine without a cluster."
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    common: Common,
    #[command(flatten)]
    cluster: Cluster,
    #[command(flatten)]
    node_side: NodeSide,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run VMIs from manifests on this machine, without Kubernetes.
    Standalone(Standalone),
}

/// Flags of both modes (KubeVirt's names where it has them).
#[derive(Args, Debug, Clone)]
struct Common {
    /// This node's name (default: $NODE_NAME, else the host name).
    #[arg(long = "hostname-override", global = true)]
    node: Option<String>,
    /// Ask every launcher for its domain this often.
    #[arg(long, default_value_t = 300, global = true)]
    domain_resync_period_seconds: u64,
    /// A launcher socket unreachable this long counts as gone (seconds).
    #[arg(long, default_value_t = 30, global = true)]
    watchdog_timeout: u64,
    /// Serve Prometheus metrics here (e.g. 0.0.0.0:8185).
    #[arg(long, global = true)]
    metrics_listen: Option<SocketAddr>,
}

/// Flags of the Kubernetes mode.
#[derive(Args, Debug, Clone)]
struct Cluster {
    /// The handler's share dir (its notify socket).
    #[arg(long, default_value = "/var/run/kubevirt")]
    kubevirt_share_dir: PathBuf,
    /// The handler's private dir (ghost records, pod-interface cache).
    #[arg(long, default_value = "/var/run/kubevirt-private")]
    kubevirt_private_dir: PathBuf,
    /// The kubelet pods directory as mounted in the handler.
    #[arg(long, default_value = "/pods")]
    pods_dir: PathBuf,
    /// Serve virt-api's VMI subresources (pause, reset, ...) on this port, over mutual TLS.
    #[arg(long, default_value_t = handler_api::PORT)]
    console_server_port: u16,
    /// `tls.crt` and `tls.key` of the Secret kubevirt-virt-handler-server-certs.
    #[arg(long, default_value = "/etc/virt-handler/servercertificates")]
    server_cert_dir: PathBuf,
    /// The CA bundle clients must chain to (ConfigMap kubevirt-ca, key ca-bundle).
    #[arg(long, default_value = "/etc/virt-handler/ca/ca-bundle")]
    ca_bundle: PathBuf,
    /// `tls.crt` and `tls.key` of the Secret kubevirt-virt-handler-certs: the handler's
    /// client certificate, shown to the target node's handler when a VM migrates.
    #[arg(long, default_value = "/etc/virt-handler/clientcertificates")]
    client_cert_dir: PathBuf,
    /// This handler's address for live migrations (its pod's IP): target listeners bind
    /// and publish it. Without it the node takes no part in migrations.
    #[arg(long)]
    pod_ip_address: Option<std::net::IpAddr>,
}

/// Flags of the Kubernetes mode's node side: device plugins, heartbeat, node labels.
#[derive(Args, Debug, Clone)]
struct NodeSide {
    /// The kubelet's device-plugin directory (kubelet.sock and the plugins' sockets).
    #[arg(long, default_value = proto::grpc::deviceplugin::v1beta1::DEVICE_PLUGIN_PATH)]
    device_plugin_dir: PathBuf,
    /// Where the host's root (its /dev) is seen; /proc/1/root with hostPID.
    #[arg(long, default_value = handler::deviceplugins::HOST_ROOT)]
    host_root: PathBuf,
    /// Devices each device plugin advertises (bounds the VMIs per node).
    #[arg(long, default_value_t = handler::deviceplugins::MAX_DEVICES)]
    max_devices: usize,
    /// Label the node with what its launchers run (machine types).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    enable_node_labeller: bool,
}

#[derive(Args, Debug, Clone)]
struct Standalone {
    /// VirtualMachineInstance manifests (YAML or JSON).
    #[arg(required = true)]
    manifests: Vec<PathBuf>,
    /// Map a containerDisk / kernelBoot image name to a local file or directory.
    #[arg(long = "image", value_name = "NAME=PATH", value_parser = parse_image)]
    images: Vec<(String, PathBuf)>,
    /// Where pods, sockets and records live while running.
    #[arg(long, default_value = "/var/run/virt-handler-standalone")]
    state_dir: PathBuf,
    /// virt-launcher-monitor (default: next to this program, else /usr/bin).
    #[arg(long)]
    launcher: Option<PathBuf>,
    /// Print the status on stdout instead of writing
    /// <state-dir>/status/<namespace>_<name>.status.yaml.
    #[arg(long)]
    status_stdout: bool,
    /// Stop gracefully once every VMI's console printed a line containing TEXT.
    #[arg(long, value_name = "TEXT")]
    stop_after_console: Option<String>,
    /// KubeVirt's feature gates that are on, comma-separated (`HostDisk`): `hostDisk`
    /// volumes are refused without `HostDisk`, as KubeVirt's admission does.
    #[arg(long, default_value = "")]
    feature_gates: proto::contract::feature_gates::FeatureGates,
}

fn parse_image(text: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = text
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PATH, got {text:?}"))?;
    if name.is_empty() || path.is_empty() {
        return Err(format!("expected NAME=PATH, got {text:?}"));
    }
    let path = std::fs::canonicalize(path).map_err(|e| format!("{path}: {e}"))?;
    Ok((name.to_string(), path))
}

fn default_node() -> String {
    if let Ok(node) = std::env::var("NODE_NAME")
        && !node.is_empty()
    {
        return node;
    }
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "localhost".into())
}

fn default_launcher() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("virt-launcher-monitor")))
        .filter(|p| p.exists())
        .unwrap_or_else(|| "/usr/bin/virt-launcher-monitor".into())
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        // Colour only on a terminal: logs in files and pipes stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Some(Command::Standalone(s)) => run_standalone(cli.common, s).await,
        None => run_cluster(cli.common, cli.cluster, cli.node_side).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virt-handler: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run_standalone(common: Common, s: Standalone) -> Result<()> {
    let manifests = s
        .manifests
        .iter()
        .map(|m| std::fs::canonicalize(m).with_context(|| format!("{}", m.display())))
        .collect::<Result<Vec<_>>>()?;
    standalone::run(StandaloneOptions {
        manifests,
        images: s.images,
        state_dir: s.state_dir,
        node: common.node.unwrap_or_else(default_node),
        launcher: s.launcher.unwrap_or_else(default_launcher),
        status_output: if s.status_stdout {
            StatusOutput::Stdout
        } else {
            StatusOutput::StateDir
        },
        stop_after_console: s.stop_after_console,
        resync_period: Duration::from_secs(common.domain_resync_period_seconds.max(1)),
        watchdog_timeout: Duration::from_secs(common.watchdog_timeout.max(1)),
        metrics: common.metrics_listen,
        feature_gates: s.feature_gates,
    })
    .await
}

async fn run_cluster(common: Common, cluster: Cluster, node_side: NodeSide) -> Result<()> {
    let node = common.node.unwrap_or_else(default_node);
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let node_services = start_node_side(&client, &node, &node_side).await;
    let (vmis, vmi_changes, watch_task) = KubeVmis::start(client.clone(), &node);
    let vmis = Arc::new(vmis);
    let (cache, cache_changes) = DomainCache::new();
    let cache = Arc::new(cache);
    let metrics = Arc::new(Metrics::new());
    let hub = notify::NotifyHub::new(Arc::clone(&cache), vmis.clone(), Arc::clone(&metrics));
    let launchers = Arc::new(Launchers::new(
        LauncherPaths {
            pods_dir: cluster.pods_dir.clone(),
            share_dir: cluster.kubevirt_share_dir.clone(),
            ghost_dir: cluster.kubevirt_private_dir.join("ghost-records"),
        },
        &node,
        hub.clone(),
    ));
    let notify_server = notify::start(&cluster.kubevirt_share_dir, hub)?;
    let metrics_task = match common.metrics_listen {
        Some(addr) => {
            let health = Arc::new(handler::healthz::ApiHealth::new(client.clone()));
            let served =
                handler::metrics::serve_with_health(Arc::clone(&metrics), addr, Some(health));
            Some(served.await?.1)
        }
        None => None,
    };
    vmis.wait_until_ready().await;
    let mut config = AgentConfig::new(&node, cluster.kubevirt_private_dir.clone());
    config.resync_period = Duration::from_secs(common.domain_resync_period_seconds.max(1));
    config.watchdog_timeout = Duration::from_secs(common.watchdog_timeout.max(1));
    // Live migration between handlers over mutual TLS: the serving certificate for the
    // target side, the client certificate for the source side, both of the install's CA
    // (read when a migration needs them).
    config.migration =
        cluster
            .pod_ip_address
            .map(|address| handler::migration::MigrationSettings {
                address,
                tls: handler::migration::MigrationTls::Files {
                    server_dir: cluster.server_cert_dir.clone(),
                    client_dir: cluster.client_cert_dir.clone(),
                    ca_bundle: cluster.ca_bundle.clone(),
                },
            });
    if config.migration.is_none() {
        tracing::warn!("no --pod-ip-address: this node takes no part in live migrations");
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let rest = handler::rest::serve(
        handler::rest::RestConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], cluster.console_server_port)),
            server_cert_dir: cluster.server_cert_dir.clone(),
            ca_bundle: cluster.ca_bundle.clone(),
        },
        vmis.clone(),
        Arc::clone(&launchers),
        stopped.clone(),
    );
    let rest_task = tokio::spawn(async move {
        if let Err(e) = rest.await {
            tracing::error!(error = format!("{e:#}"), "the endpoint for virt-api failed");
        }
    });
    let agent = Agent::new(config, vmis.clone(), vmis, cache, launchers, metrics);
    let agent_task = tokio::spawn(agent.run(cache_changes, vmi_changes, stopped));
    tracing::info!(%node, "virt-handler running");
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
    }
    // Unschedulable first, then the plugins and the agent; the VMs keep running.
    node_services.stop().await;
    let _ = stop.send(true);
    let _ = agent_task.await;
    let _ = rest_task.await;
    watch_task.abort();
    let _ = notify_server.stop().await;
    if let Some(t) = metrics_task {
        t.abort();
    }
    Ok(())
}

/// Device plugins, heartbeat and node labeller (see `handler::node`).
async fn start_node_side(
    client: &kube::Client,
    node: &str,
    flags: &NodeSide,
) -> handler::node::NodeServices {
    use handler::deviceplugins::{DevicePluginConfig, permanent_devices};
    let mut plugins = DevicePluginConfig::new(&flags.device_plugin_dir, &flags.host_root);
    plugins.max_devices = flags.max_devices.max(1);
    handler::node::NodeServices::start(
        kube::Api::all(client.clone()),
        node,
        plugins,
        permanent_devices(),
        Default::default(),
        flags.enable_node_labeller,
    )
    .await
}
