//! `netsetup`: the masquerade and bridge pod networks and the guest's DHCP server, for
//! operators and tests.

use proto::contract::pod_network;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand};
use ipnet::{Ipv4Net, Ipv6Net};
use netsetup::bridge::{self, BridgeConfig};
use netsetup::dhcp::{DhcpConfig, DhcpServer};
use netsetup::masquerade::{self, MasqueradeConfig};
use netsetup::netns::{self, NetnsTarget};
use netsetup::nft::{L4Proto, Port};
use netsetup::resolv::ResolvConf;
use proto::contract::dhcp_cache::DhcpConfig as DhcpCache;

#[derive(Parser)]
#[command(about = "KubeVirt pod networks (masquerade and bridge bindings) and the guest's DHCP")]
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
    /// Bridge binding: bridge the pod interface (as <iface>-nic) with the tap, keep the pod
    /// IP on a dummy <iface>, and print (or write) the DHCP cache (idempotent).
    Bridge(BridgeArgs),
    /// Give back the pod interface and remove what `bridge` built.
    BridgeTeardown(BridgeArgs),
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

#[derive(Args)]
struct BridgeArgs {
    #[command(flatten)]
    namespace: Namespace,
    #[arg(long, default_value = pod_network::PRIMARY_POD_IFACE)]
    iface: String,
    #[arg(long, default_value = pod_network::PRIMARY_TAP)]
    tap_name: String,
    /// uid (and gid) owning the tap: 107 for non-root VMIs, 0 for root ones.
    #[arg(long, default_value_t = masquerade::NON_ROOT_UID)]
    tap_owner: u32,
    /// Position of the interface in spec.domain.devices.interfaces (bridge address
    /// 169.254.75.1<index>).
    #[arg(long, default_value_t = 0)]
    iface_index: usize,
    /// The guest's MAC, when the VMI sets one; default: the pod interface's.
    #[arg(long, value_parser = parse_mac)]
    guest_mac: Option<[u8; 6]>,
    /// Write the DHCP cache (KubeVirt's vif-cache JSON) here instead of to stdout.
    #[arg(long)]
    write_cache: Option<PathBuf>,
}

impl BridgeArgs {
    fn config(&self) -> BridgeConfig {
        let mut config = BridgeConfig::new(self.namespace.target());
        config.iface = self.iface.clone();
        config.tap_name = self.tap_name.clone();
        config.tap_owner_uid = self.tap_owner;
        config.tap_owner_gid = self.tap_owner;
        config.iface_index = self.iface_index;
        config.guest_mac = self.guest_mac;
        config
    }
}

fn parse_mac(text: &str) -> Result<[u8; 6], String> {
    let bytes: Vec<u8> = text
        .split(':')
        .map(|b| u8::from_str_radix(b, 16))
        .collect::<Result<_, _>>()
        .map_err(|_| format!("bad MAC address {text:?}"))?;
    <[u8; 6]>::try_from(bytes).map_err(|_| format!("bad MAC address {text:?}"))
}

fn mac_text(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
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
    /// Bridge binding: serve the pod's address from this DHCP cache (what `bridge`
    /// wrote) to the cached guest MAC only, instead of the masquerade answer.
    #[arg(long)]
    bridge_cache: Option<PathBuf>,
    /// Bridge binding: the interface's position (server address 169.254.75.1<index>).
    #[arg(long, default_value_t = 0)]
    iface_index: usize,
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
        Command::Bridge(args) => {
            let outcome = bridge::setup(&args.config())?;
            let addr = |a: Option<IpAddr>| a.map_or("-".to_string(), |a| a.to_string());
            eprintln!(
                "bridge={} tap={} nic={} mtu={} pod_mac={} pod_ipv4={} pod_ipv6={}",
                outcome.bridge,
                outcome.tap,
                outcome.nic,
                outcome.mtu,
                mac_text(&outcome.pod_mac),
                addr(outcome.pod_ipv4.map(IpAddr::V4)),
                addr(outcome.pod_ipv6.map(IpAddr::V6)),
            );
            let json = serde_json::to_string_pretty(&outcome.dhcp)?;
            match &args.write_cache {
                Some(path) => std::fs::write(path, json)
                    .with_context(|| format!("cannot write {}", path.display()))?,
                None => println!("{json}"),
            }
        }
        Command::BridgeTeardown(args) => bridge::teardown(&args.config())?,
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
    let config = match &args.bridge_cache {
        None => {
            DhcpConfig::masquerade(args.cidr, &resolv, hostname, args.subdomain.as_deref(), mtu)?
        }
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read {}", path.display()))?;
            let cache: DhcpCache = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a DHCP cache", path.display()))?;
            let server = pod_network::fake_bridge_ip(args.iface_index)
                .context("--iface-index has no bridge address (at most 99)")?;
            let subdomain = args.subdomain.as_deref();
            match DhcpConfig::bridge(&cache, server, &resolv, hostname, subdomain, mtu)? {
                Some(config) => config,
                None => bail!("the pod has no IPv4 address (IPAMDisabled): nothing to serve"),
            }
        }
    };
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
        *dst = libc::c_char::from_ne_bytes([*src]);
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
