//! `netsetup`: the masquerade pod network and the guest's DHCP server, for operators and tests.

use proto::contract::pod_network;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use ipnet::{Ipv4Net, Ipv6Net};
use netsetup::dhcp::{DhcpConfig, DhcpServer};
use netsetup::masquerade::{self, MasqueradeConfig};
use netsetup::netns::{self, NetnsTarget};
use netsetup::nft::{L4Proto, Port};
use netsetup::resolv::ResolvConf;

#[derive(Parser)]
#[command(about = "KubeVirt masquerade pod network: bridge, tap, NAT rules and DHCP")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build bridge, tap, sysctls and NAT rules in the pod's network namespace (idempotent).
    Masquerade(MasqueradeArgs),
    /// Remove what `masquerade` built.
    Teardown(MasqueradeArgs),
    /// Serve DHCPv4 to the guest on the bridge, inside the pod's namespace.
    Dhcp(DhcpArgs),
}

#[derive(Args)]
#[group(required = true, multiple = false)]
struct Namespace {
    /// Network namespace file (e.g. /var/run/netns/NAME).
    #[arg(long)]
    netns: Option<PathBuf>,
    /// A process whose network namespace to use.
    #[arg(long)]
    pid: Option<u32>,
}

impl Namespace {
    fn target(&self) -> NetnsTarget {
        match (&self.netns, self.pid) {
            (Some(path), _) => NetnsTarget::Path(path.clone()),
            (None, Some(pid)) => NetnsTarget::Pid(pid),
            // clap's group makes one of them required.
            (None, None) => unreachable!("clap requires --netns or --pid"),
        }
    }
}

#[derive(Args)]
struct MasqueradeArgs {
    #[command(flatten)]
    namespace: Namespace,
    #[arg(long, default_value = pod_network::PRIMARY_POD_IFACE)]
    iface: String,
    #[arg(long, default_value = pod_network::PRIMARY_TAP)]
    tap_name: String,
    /// uid (and gid) owning the tap: 107 for non-root VMIs, 0 for root ones.
    #[arg(long, default_value_t = masquerade::NON_ROOT_UID)]
    tap_owner: u32,
    /// Declared ports, e.g. `80/tcp,53/udp` (protocol defaults to tcp). None: forward all.
    #[arg(long, value_delimiter = ',', value_parser = parse_port)]
    ports: Vec<Port>,
    /// vmNetworkCIDR.
    #[arg(long, default_value_t = masquerade::DEFAULT_IPV4_CIDR)]
    cidr: Ipv4Net,
    /// vmIPv6NetworkCIDR.
    #[arg(long, default_value_t = masquerade::DEFAULT_IPV6_CIDR)]
    cidr6: Ipv6Net,
    /// The VMI has the Istio sidecar (`sidecar.istio.io/inject: "true"`).
    #[arg(long)]
    istio: bool,
    /// Migration uses TCP ports 49152/49153 (not a unix socket): keep them local.
    #[arg(long)]
    legacy_migration_ports: bool,
}

impl MasqueradeArgs {
    fn config(&self) -> MasqueradeConfig {
        let mut config = MasqueradeConfig::new(self.namespace.target());
        config.iface = self.iface.clone();
        config.tap_name = self.tap_name.clone();
        config.tap_owner_uid = self.tap_owner;
        config.tap_owner_gid = self.tap_owner;
        config.ports = self.ports.clone();
        config.ipv4_cidr = self.cidr;
        config.ipv6_cidr = self.cidr6;
        config.istio = self.istio;
        config.migration_over_unix = !self.legacy_migration_ports;
        config
    }
}

fn parse_port(text: &str) -> Result<Port, String> {
    let (number, protocol) = text.split_once('/').unwrap_or((text, "tcp"));
    let number: u16 = number
        .trim()
        .parse()
        .map_err(|_| format!("bad port number in {text:?}"))?;
    let protocol = match protocol.trim().to_ascii_lowercase().as_str() {
        "tcp" => L4Proto::Tcp,
        "udp" => L4Proto::Udp,
        other => return Err(format!("unsupported protocol {other:?} (tcp or udp)")),
    };
    Ok(Port { number, protocol })
}

#[derive(Args)]
struct DhcpArgs {
    #[command(flatten)]
    namespace: Namespace,
    #[arg(long, default_value_t = pod_network::bridge_name(pod_network::PRIMARY_POD_IFACE))]
    bridge: String,
    #[arg(long, default_value = "/etc/resolv.conf")]
    resolv_conf: PathBuf,
    /// Hostname for the guest (option 12); default: this host's name.
    #[arg(long)]
    hostname: Option<String>,
    /// The VMI's `spec.subdomain`: adds `SUBDOMAIN.<namespace domain>` to the search list.
    #[arg(long)]
    subdomain: Option<String>,
    /// MTU for the guest (option 26); default: the bridge's MTU.
    #[arg(long)]
    mtu: Option<u32>,
    /// vmNetworkCIDR.
    #[arg(long, default_value_t = masquerade::DEFAULT_IPV4_CIDR)]
    cidr: Ipv4Net,
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colour only on a terminal: logs in files and pipes stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().command {
        Command::Masquerade(args) => {
            let outcome = masquerade::setup(&args.config())?;
            let addr = |a: Option<IpAddr>| a.map_or("-".to_string(), |a| a.to_string());
            println!(
                "bridge={} tap={} mtu={} pod_ipv4={} pod_ipv6={}",
                outcome.bridge,
                outcome.tap,
                outcome.mtu,
                addr(outcome.pod_ipv4.map(IpAddr::V4)),
                addr(outcome.pod_ipv6.map(IpAddr::V6)),
            );
        }
        Command::Teardown(args) => masquerade::teardown(&args.config())?,
        Command::Dhcp(args) => serve_dhcp(args)?,
    }
    Ok(())
}

fn serve_dhcp(args: DhcpArgs) -> Result<()> {
    let resolv = ResolvConf::read(&args.resolv_conf)
        .with_context(|| format!("cannot read {}", args.resolv_conf.display()))?;
    let hostname = match args.hostname {
        Some(h) => Some(h),
        None => nix::unistd::gethostname()
            .ok()
            .and_then(|h| h.into_string().ok()),
    };
    let bridge = args.bridge.clone();
    let mtu = match args.mtu {
        Some(mtu) => mtu,
        None => netns::run_in(&args.namespace.target(), move || bridge_mtu(&bridge))??,
    };
    let config =
        DhcpConfig::masquerade(args.cidr, &resolv, hostname, args.subdomain.as_deref(), mtu)?;
    let bridge = args.bridge.clone();
    netns::run_in(&args.namespace.target(), move || -> Result<()> {
        let server = DhcpServer::bind(&bridge, config)?;
        tracing::info!("serving DHCPv4 on {bridge}");
        let never = AtomicBool::new(false);
        server.serve_until(&never, Duration::from_secs(1))?;
        Ok(())
    })??;
    Ok(())
}

/// The MTU of `bridge` in the current thread's namespace.
fn bridge_mtu(bridge: &str) -> Result<u32> {
    // SIOCGIFMTU through a throwaway socket: simpler than a netlink round trip for one value.
    let sock = std::net::UdpSocket::bind("0.0.0.0:0")?;
    if bridge.len() >= libc::IFNAMSIZ {
        bail!("bridge name {bridge:?} is too long");
    }
    // SAFETY: ifreq is plain old data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(bridge.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFMTU fills ifr_mtu of the ifreq that lives across the call.
    let rc = unsafe {
        libc::ioctl(
            std::os::fd::AsRawFd::as_raw_fd(&sock),
            libc::SIOCGIFMTU,
            &mut ifr as *mut libc::ifreq,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error())
            .context(format!("cannot read the MTU of {bridge}"));
    }
    // SAFETY: the kernel filled the mtu member of the union.
    let mtu = unsafe { ifr.ifr_ifru.ifru_mtu };
    u32::try_from(mtu).context("negative MTU")
}
