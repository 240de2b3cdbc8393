//! `virt-controller`: runs the VM and VMI controllers of whichever replica holds the Lease.

use clap::Parser;
use controller::leader::{LeaderOptions, LeaderWork, run_when_leader};
use controller::metrics::Metrics;
use controller::run::{Options, run};
use controller::template::{OverheadModel, TemplateConfig, VmiSeccompProfile};
use controller::writes::Writes;
use std::sync::Arc;

#[derive(Parser, Debug)]
#[command(
    name = "virt-controller",
    about = "KubeVirt VM and VMI controllers (v1.9.0 behaviour)"
)]
struct Args {
    /// Image of the launcher pods' compute container.
    #[arg(long)]
    launcher_image: String,
    /// Base of the launcher's `--qemu-timeout`, in seconds (a jitter of up to 119 s is added).
    #[arg(long, default_value_t = 240)]
    launcher_qemu_timeout: u32,
    /// Watch only this namespace (default: all).
    #[arg(long)]
    watch_namespace: Option<String>,
    /// Namespace of the leader-election Lease.
    #[arg(long, default_value = "kubevirt")]
    leader_namespace: String,
    /// Namespace of the `KubeVirt` CR (the configuration, which wins over the flags below)
    /// and of virt-handler's DaemonSet (default: the leader namespace); empty: read no CR.
    #[arg(long)]
    kubevirt_namespace: Option<String>,
    #[arg(long, default_value = "virt-controller")]
    lease_name: String,
    /// This replica's identity (default: $POD_NAME, else the host name).
    #[arg(long)]
    identity: Option<String>,
    /// Let VMIs run without /dev/kvm (no kvm and vhost-net device requests).
    #[arg(long)]
    allow_emulation: bool,
    /// Do not request devices.kubevirt.io/vhost-net for virtio NICs: the launcher's virtio-net
    /// is userspace and never opens /dev/vhost-net (for nodes whose kernel has none).
    #[arg(long)]
    no_vhost_net: bool,
    /// Serve Prometheus metrics (`/metrics`: reconciles, their durations and failures, API
    /// writes) on this address, e.g. 0.0.0.0:8443.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// KubeVirt's `Root` feature gate: launcher pods run as root (uid 0, SYS_NICE) unless a
    /// VMI's creator asked for a non-root one. Off: always uid 107. A default: the
    /// `KubeVirt` CR's feature gates, when it lists any, decide.
    #[arg(long)]
    root: bool,
    /// KubeVirt's feature gates that are on, comma-separated (`HostDisk,Root`), when the
    /// `KubeVirt` CR lists none (`developerConfiguration.featureGates` wins). `hostDisk`
    /// volumes are refused unless `HostDisk` is on.
    #[arg(long, default_value = "")]
    feature_gates: proto::contract::feature_gates::FeatureGates,
    /// Launcher pods get the container runtime's default seccomp profile: the `KubeVirt`
    /// CR's `seccompConfiguration.virtualMachineInstanceProfile.customProfile.
    /// runtimeDefaultProfile: true`. Without it or the next, no profile (KubeVirt's default).
    #[arg(long, conflicts_with = "vmi_seccomp_localhost_profile")]
    vmi_seccomp_runtime_default: bool,
    /// Launcher pods get this node-local seccomp profile (relative to the kubelet's seccomp
    /// directory): the CR's `...customProfile.localhostProfile`.
    #[arg(long)]
    vmi_seccomp_localhost_profile: Option<String>,
    /// How the launcher pod's memory overhead is estimated: `launcher` (what this project's
    /// launcher needs, measured: about 28 MiB for a small VMI) or `kubevirt` (v1.9.0's
    /// estimate for QEMU and libvirt: 268 MiB and up). The `KubeVirt` CR's annotation
    /// `kubevirt-rs.io/memory-overhead-model` wins.
    #[arg(long, default_value = "launcher", value_parser = parse_overhead_model)]
    memory_overhead: OverheadModel,
}

fn parse_overhead_model(text: &str) -> Result<OverheadModel, String> {
    OverheadModel::parse(text).ok_or_else(|| format!("{text:?}: launcher or kubevirt"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    controller::init_logging();
    let args = Args::parse();
    let identity = args
        .identity
        .or_else(|| std::env::var("POD_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "virt-controller".into());
    let client = kube::Client::try_default().await?;
    let options = Options {
        template: TemplateConfig {
            launcher_image: args.launcher_image,
            launcher_qemu_timeout_seconds: args.launcher_qemu_timeout,
            allow_emulation: args.allow_emulation,
            request_vhost_net: !args.no_vhost_net,
            root: args.root
                || args
                    .feature_gates
                    .enabled(proto::contract::feature_gates::ROOT),
            feature_gates: args.feature_gates,
            vmi_seccomp_profile: match (
                args.vmi_seccomp_runtime_default,
                args.vmi_seccomp_localhost_profile,
            ) {
                (_, Some(path)) => Some(VmiSeccompProfile::Localhost(path)),
                (true, None) => Some(VmiSeccompProfile::RuntimeDefault),
                (false, None) => None,
            },
            memory_overhead_model: args.memory_overhead,
            ..TemplateConfig::default()
        },
        namespace: args.watch_namespace,
        identity: identity.clone(),
        kubevirt_namespace: match args.kubevirt_namespace {
            Some(namespace) if namespace.is_empty() => None,
            Some(namespace) => Some(namespace),
            None => Some(args.leader_namespace.clone()),
        },
    };
    let writes = Arc::new(Writes::default());
    let metrics = Arc::new(Metrics::new(writes.clone()));
    // Served by every replica (a follower reports no reconciles), for the whole process.
    let _metrics_task = match args.metrics_listen {
        Some(addr) => Some(controller::metrics::serve(metrics.clone(), addr).await?.1),
        None => None,
    };
    let work_client = client.clone();
    let work: LeaderWork = Box::new(move |lost| {
        Box::pin(run(
            work_client.clone(),
            options.clone(),
            writes.clone(),
            metrics.clone(),
            lost,
        ))
    });
    // SIGTERM or SIGINT releases the Lease.
    let shutdown = controller::shutdown_signal()?;
    run_when_leader(
        client,
        LeaderOptions {
            namespace: args.leader_namespace,
            lease_name: args.lease_name,
            identity,
        },
        work,
        shutdown,
    )
    .await
}
