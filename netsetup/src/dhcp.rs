//! The launcher's DHCPv4 server for the guest (KubeVirt v1.9.0 `pkg/network/dhcp/`), for
//! the masquerade binding (the guest gets `vmNetworkCIDR` + 2, any client is served) and
//! the bridge binding (the guest gets the pod's own address, gateway and routes, and only
//! the guest's MAC is served: the bridge also reaches the pod network).
//!
//! [`answer`] is the whole protocol as a pure function from a request datagram to the
//! reply datagram; [`DhcpServer`] only moves bytes between it and a UDP socket bound to
//! the bridge. Packets come from the guest, so they are untrusted: anything malformed gives
//! an error (the server logs it and drops the packet), never a panic; the guest decides how
//! many packets it sends, so those log lines are thinned ([`GuestLog`]).

use std::net::{IpAddr, Ipv4Addr, SocketAddrV4, UdpSocket};
use std::os::fd::{FromRawFd, IntoRawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use dhcproto::v4::{DhcpOption, HType, Message, MessageType, Opcode, OptionCode, UnknownOption};
use dhcproto::{Decodable, Decoder, Encodable, Encoder};
use ipnet::Ipv4Net;

use proto::contract::dhcp_cache::DhcpConfig as DhcpCache;

use crate::resolv::{ResolvConf, longest_domain};

/// `infiniteLease = 999*24h`, in seconds.
pub(crate) const INFINITE_LEASE_SECS: u32 = 999 * 24 * 3600;
/// DNS server when `resolv.conf` names no IPv4 one.
pub(crate) const DEFAULT_DNS: Ipv4Addr = Ipv4Addr::new(8, 8, 8, 8);
/// Search domain when `resolv.conf` has none.
pub(crate) const DEFAULT_SEARCH_DOMAIN: &str = "cluster.local";
/// Replies are padded to the BOOTP minimum; some clients drop shorter ones.
const BOOTP_MIN_LEN: usize = 300;
const SERVER_PORT: u16 = 67;
const CLIENT_PORT: u16 = 68;
/// An option's payload is at most 255 bytes; KubeVirt refuses longer search lists.
const MAX_OPTION_LEN: usize = 255;

/// What the guest is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DhcpConfig {
    /// The server identifier: the gateway on the bridge (masquerade) or the bridge's
    /// fake address (bridge).
    pub server_ip: Ipv4Addr,
    /// The address the guest gets.
    pub guest_ip: Ipv4Addr,
    pub subnet_mask: Ipv4Addr,
    /// Option 3, when there is one.
    pub router: Option<Ipv4Addr>,
    /// Option 121 (RFC 3442), in this order: destination and next hop (`0.0.0.0` for
    /// on-link). Empty: no option.
    pub classless_routes: Vec<(Ipv4Net, Ipv4Addr)>,
    /// Only this client is answered; `None` answers any.
    pub client_mac: Option<[u8; 6]>,
    pub dns: Vec<Ipv4Addr>,
    /// Search domains, in order (option 119).
    pub search: Vec<String>,
    /// `search` in RFC 1035 wire format, checked to fit one option.
    search_wire: Vec<u8>,
    /// Longest search domain (option 15).
    pub domain_name: Option<String>,
    pub hostname: Option<String>,
    pub mtu: u16,
    pub lease_secs: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum DhcpConfigError {
    #[error("invalid search domain {domain:?}: {reason}")]
    BadDomain { domain: String, reason: String },
    #[error("search domains take {0} bytes encoded, more than the 255 of one DHCP option")]
    SearchTooLong(usize),
    #[error("guest network {0} has no room for gateway and guest")]
    NetworkTooSmall(Ipv4Net),
    #[error("MTU {0} does not fit the 16-bit DHCP option or is below the IPv4 minimum 68")]
    BadMtu(u32),
    #[error("the bridge binding's DHCP cache has no valid IPv4 address for the guest")]
    NoGuestAddress,
    #[error("the bridge binding's DHCP cache has no valid guest MAC to serve")]
    NoGuestMac,
    #[error("the bridge binding's DHCP cache has an invalid route: {0}")]
    BadRoute(String),
}

/// What both bindings answer alike: DNS, search domains, hostname, MTU, lease.
struct Common {
    dns: Vec<Ipv4Addr>,
    search: Vec<String>,
    search_wire: Vec<u8>,
    domain_name: Option<String>,
    hostname: Option<String>,
    mtu: u16,
}

impl Common {
    /// DNS and search domains from the pod's `resolv.conf` (with
    /// `subdomain.<namespace domain>` first when the VMI sets `spec.subdomain`), the
    /// hostname, and the MTU of the pod interface.
    fn new(
        resolv: &ResolvConf,
        hostname: Option<String>,
        subdomain: Option<&str>,
        mtu: u32,
    ) -> Result<Self, DhcpConfigError> {
        let mtu = u16::try_from(mtu)
            .ok()
            .filter(|m| *m >= 68)
            .ok_or(DhcpConfigError::BadMtu(mtu))?;
        // 8.8.8.8 only when the pod has no name server at all (KubeVirt's
        // `ParseNameservers`); with IPv6 ones only, the guest gets no option 6
        // (KubeVirt sends it empty, which RFC 2132 does not allow).
        let dns = if resolv.nameservers_v4.is_empty() && resolv.nameservers_v6.is_empty() {
            vec![DEFAULT_DNS]
        } else {
            resolv.nameservers_v4.clone()
        };
        let mut search = if resolv.search.is_empty() {
            vec![DEFAULT_SEARCH_DOMAIN.to_string()]
        } else {
            resolv.search.clone()
        };
        if let Some(sub) = subdomain.filter(|s| !s.is_empty()) {
            // The pod's own namespace domain is the longest `*.svc.*` one; one that
            // already starts with the subdomain gets nothing in front (KubeVirt's
            // `dns.DomainNameWithSubdomain`, pkg/network/dns/resolveconf.go).
            let namespace_domain = longest_domain(search.iter().filter(|d| d.contains(".svc.")))
                .filter(|d| !d.starts_with(&format!("{sub}.")))
                .map(|d| format!("{sub}.{d}"));
            if let Some(domain) = namespace_domain {
                search.insert(0, domain);
            }
        }
        let search_wire = encode_search(&search)?;
        let domain_name = longest_domain(&search).map(str::to_string);
        Ok(Common {
            dns,
            search,
            search_wire,
            domain_name,
            hostname: hostname.filter(|h| !h.is_empty()),
            mtu,
        })
    }
}

impl DhcpConfig {
    /// KubeVirt's masquerade answer: gateway = network + 1, guest = network + 2, DNS and
    /// search domains from the pod's `resolv.conf` (see [`Common::new`]), MTU of the pod
    /// interface; any client is served.
    pub fn masquerade(
        network: Ipv4Net,
        resolv: &ResolvConf,
        hostname: Option<String>,
        subdomain: Option<&str>,
        mtu: u32,
    ) -> Result<Self, DhcpConfigError> {
        if network.prefix_len() > 30 {
            return Err(DhcpConfigError::NetworkTooSmall(network));
        }
        let common = Common::new(resolv, hostname, subdomain, mtu)?;
        let base = network.network().to_bits();
        let gateway = Ipv4Addr::from_bits(base.wrapping_add(1));
        Ok(Self::with(
            gateway,
            Ipv4Addr::from_bits(base.wrapping_add(2)),
            network.netmask(),
            Some(gateway),
            Vec::new(),
            None,
            common,
        ))
    }

    /// KubeVirt's bridge answer, from the cache the handler wrote
    /// (`vif-cache-<iface>.json`): the pod's address and mask, its gateway as router, its
    /// routes as option 121 (default route last, so its next hop is reachable first),
    /// served from `server_ip` (the bridge's `169.254.75.1<i>`) to the cached MAC only.
    /// `Ok(None)` when the pod has no IPv4 (`IPAMDisabled`): KubeVirt starts no server.
    pub fn bridge(
        cache: &DhcpCache,
        server_ip: Ipv4Addr,
        resolv: &ResolvConf,
        hostname: Option<String>,
        subdomain: Option<&str>,
        mtu: u32,
    ) -> Result<Option<Self>, DhcpConfigError> {
        if cache.ipam_disabled {
            return Ok(None);
        }
        let (guest_ip, prefix_len) = cache.ipv4().ok_or(DhcpConfigError::NoGuestAddress)?;
        let subnet =
            Ipv4Net::new(guest_ip, prefix_len).map_err(|_| DhcpConfigError::NoGuestAddress)?;
        let client_mac = cache
            .mac_address()
            .filter(|m| m[0] & 1 == 0)
            .ok_or(DhcpConfigError::NoGuestMac)?;
        let router = match cache.gateway {
            None => None,
            Some(IpAddr::V4(gw)) => Some(gw),
            Some(other) => {
                return Err(DhcpConfigError::BadRoute(format!(
                    "gateway {other} is not IPv4"
                )));
            }
        };
        let mut routes = Vec::new();
        for route in cache.routes.iter().flatten() {
            let dst = match &route.dst {
                None => Ipv4Net::default(),
                Some(net) => match net.cidr() {
                    Some((IpAddr::V4(ip), len)) => Ipv4Net::new(ip, len)
                        .map_err(|e| DhcpConfigError::BadRoute(e.to_string()))?
                        .trunc(),
                    _ => {
                        return Err(DhcpConfigError::BadRoute(format!(
                            "destination {net:?} is not an IPv4 network"
                        )));
                    }
                },
            };
            let gw = match route.gw {
                None => Ipv4Addr::UNSPECIFIED,
                Some(IpAddr::V4(gw)) => gw,
                Some(other) => {
                    return Err(DhcpConfigError::BadRoute(format!(
                        "next hop {other} is not IPv4"
                    )));
                }
            };
            routes.push((dst, gw));
        }
        // `sortRoutes`: default routes last, the others in the cache's order.
        routes.sort_by_key(|(dst, _)| dst.prefix_len() == 0);
        let common = Common::new(resolv, hostname, subdomain, mtu)?;
        Ok(Some(Self::with(
            server_ip,
            guest_ip,
            subnet.netmask(),
            router,
            routes,
            Some(client_mac),
            common,
        )))
    }

    fn with(
        server_ip: Ipv4Addr,
        guest_ip: Ipv4Addr,
        subnet_mask: Ipv4Addr,
        router: Option<Ipv4Addr>,
        classless_routes: Vec<(Ipv4Net, Ipv4Addr)>,
        client_mac: Option<[u8; 6]>,
        common: Common,
    ) -> Self {
        DhcpConfig {
            server_ip,
            guest_ip,
            subnet_mask,
            router,
            classless_routes,
            client_mac,
            dns: common.dns,
            search: common.search,
            search_wire: common.search_wire,
            domain_name: common.domain_name,
            hostname: common.hostname,
            mtu: common.mtu,
            lease_secs: INFINITE_LEASE_SECS,
        }
    }
}

/// KubeVirt's rule for a search domain: lower-case labels of letters, digits, `-` and `_`
/// (not ending in `-`), a last label starting with a letter, at most 253 bytes.
fn check_search_domain(domain: &str) -> Result<(), String> {
    if domain.is_empty() || domain.len() > 253 {
        return Err("empty or longer than 253 bytes".into());
    }
    let labels: Vec<&str> = domain.split('.').collect();
    for (i, label) in labels.iter().enumerate() {
        let bytes = label.as_bytes();
        let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
            return Err("empty label".into());
        };
        if bytes.len() > 63 {
            return Err(format!("label {label:?} is longer than 63 bytes"));
        }
        let is_last = i + 1 == labels.len();
        let first_ok = if is_last {
            first.is_ascii_lowercase()
        } else {
            first.is_ascii_lowercase() || first.is_ascii_digit() || *first == b'_'
        };
        let inner_ok = bytes.iter().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-' || (!is_last && *b == b'_')
        });
        let last_ok = last.is_ascii_lowercase() || last.is_ascii_digit() || bytes.len() == 1;
        if !(first_ok && inner_ok && last_ok) {
            return Err(format!(
                "label {label:?} must be lower-case letters, digits, '-' or '_'"
            ));
        }
    }
    Ok(())
}

/// Option 119 payload: each domain as RFC 1035 labels, uncompressed, like KubeVirt.
/// Written here because dhcproto encodes names through hickory with compression pointers,
/// which not every guest DHCP client follows.
fn encode_search(domains: &[String]) -> Result<Vec<u8>, DhcpConfigError> {
    let mut wire = Vec::new();
    for domain in domains {
        check_search_domain(domain).map_err(|reason| DhcpConfigError::BadDomain {
            domain: domain.clone(),
            reason,
        })?;
        for label in domain.split('.') {
            // check_search_domain bounds each label to 63 bytes.
            let len = u8::try_from(label.len()).map_err(|_| DhcpConfigError::BadDomain {
                domain: domain.clone(),
                reason: "a label longer than 255 bytes".into(),
            })?;
            wire.push(len);
            wire.extend_from_slice(label.as_bytes());
        }
        wire.push(0);
    }
    if wire.len() > MAX_OPTION_LEN {
        return Err(DhcpConfigError::SearchTooLong(wire.len()));
    }
    Ok(wire)
}

/// Why a datagram got no answer.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DhcpError {
    #[error("not a DHCP message: {0}")]
    Malformed(String),
    #[error("not a client request (BOOTREPLY)")]
    NotARequest,
    #[error("hardware type/length {0}/{1} is not Ethernet")]
    NotEthernet(u8, u8),
    #[error("no DHCP message type option")]
    NoMessageType,
    #[error("reply does not encode: {0}")]
    Encode(String),
}

/// Answers one DHCP request datagram. `Ok(None)` means the request needs no answer
/// (a message type the server ignores, a client that chose another server, or, for the
/// bridge binding, a client that is not the guest).
pub fn answer(request: &[u8], config: &DhcpConfig) -> Result<Option<Vec<u8>>, DhcpError> {
    let request = keep_used_options(request)?;
    let msg = Message::decode(&mut Decoder::new(&request))
        .map_err(|e| DhcpError::Malformed(e.to_string()))?;
    if msg.opcode() != Opcode::BootRequest {
        return Err(DhcpError::NotARequest);
    }
    if msg.htype() != HType::Eth || msg.hlen() != 6 || msg.chaddr().len() < 6 {
        return Err(DhcpError::NotEthernet(u8::from(msg.htype()), msg.hlen()));
    }
    if let Some(mac) = config.client_mac
        && msg.chaddr().get(..6) != Some(&mac[..])
    {
        // Bridge binding: another host on the pod network, not our guest.
        return Ok(None);
    }
    let Some(DhcpOption::MessageType(kind)) = msg.opts().get(OptionCode::MessageType) else {
        return Err(DhcpError::NoMessageType);
    };
    let reply_type = match kind {
        MessageType::Discover => MessageType::Offer,
        MessageType::Request => {
            if let Some(DhcpOption::ServerIdentifier(server)) =
                msg.opts().get(OptionCode::ServerIdentifier)
                && *server != config.server_ip
            {
                // The client accepted another server's offer.
                return Ok(None);
            }
            let requested = match msg.opts().get(OptionCode::RequestedIpAddress) {
                Some(DhcpOption::RequestedIpAddress(ip)) => Some(*ip),
                // Renewing/rebinding clients name their address in ciaddr instead.
                _ => Some(msg.ciaddr()).filter(|ip| !ip.is_unspecified()),
            };
            match requested {
                Some(ip) if ip != config.guest_ip => MessageType::Nak,
                _ => MessageType::Ack,
            }
        }
        // Release, decline, inform...: the lease is fixed and infinite, nothing to do.
        _ => return Ok(None),
    };
    encode_reply(&msg, reply_type, config).map(Some)
}

/// Fixed BOOTP header before the options: op..file (236 bytes) and the magic cookie.
const BOOTP_HEADER_LEN: usize = 236;
const MAGIC_COOKIE: [u8; 4] = [99, 130, 83, 99];
/// The options the server reads, with their required lengths.
const USED_OPTIONS: [(u8, usize); 3] = [
    (53, 1), // message type
    (50, 4), // requested IP address
    (54, 4), // server identifier
];

/// Copies the request with only the options the server reads, each checked for length.
///
/// dhcproto's decoders for some options assert their length (in debug builds) or subtract
/// from it unchecked, which the random-bytes test turned into panics. The server needs
/// three fixed-size options, so everything else the guest sent is dropped before the crate
/// decodes it.
fn keep_used_options(request: &[u8]) -> Result<Vec<u8>, DhcpError> {
    let malformed = |what: &str| DhcpError::Malformed(what.to_string());
    let header = request
        .get(..BOOTP_HEADER_LEN + MAGIC_COOKIE.len())
        .ok_or_else(|| malformed("shorter than the BOOTP header"))?;
    if header[BOOTP_HEADER_LEN..] != MAGIC_COOKIE {
        return Err(malformed("no DHCP magic cookie"));
    }
    let mut kept = header.to_vec();
    let mut seen = [false; USED_OPTIONS.len()];
    let mut rest = &request[header.len()..];
    loop {
        match rest {
            [] | [255, ..] => break,
            [0, tail @ ..] => rest = tail,
            [code, raw_len, tail @ ..] => {
                let len = usize::from(*raw_len);
                let value = tail
                    .get(..len)
                    .ok_or_else(|| malformed("option runs past the end"))?;
                if let Some(i) = USED_OPTIONS.iter().position(|(c, _)| c == code) {
                    if USED_OPTIONS[i].1 != len {
                        return Err(DhcpError::Malformed(format!(
                            "option {code} has length {len}, expected {}",
                            USED_OPTIONS[i].1
                        )));
                    }
                    if !seen[i] {
                        seen[i] = true;
                        kept.extend_from_slice(&[*code, *raw_len]);
                        kept.extend_from_slice(value);
                    }
                }
                rest = &tail[len..];
            }
            [_] => return Err(malformed("option without length")),
        }
    }
    kept.push(255);
    Ok(kept)
}

fn encode_reply(
    request: &Message,
    reply_type: MessageType,
    config: &DhcpConfig,
) -> Result<Vec<u8>, DhcpError> {
    let mut reply = Message::default();
    reply
        .set_opcode(Opcode::BootReply)
        .set_htype(HType::Eth)
        // Message::default() picks a random xid; the client matches on its own.
        .set_xid(request.xid())
        .set_flags(request.flags())
        .set_giaddr(request.giaddr())
        .set_chaddr(request.chaddr())
        .set_siaddr(Ipv4Addr::UNSPECIFIED)
        .set_ciaddr(Ipv4Addr::UNSPECIFIED)
        .set_yiaddr(Ipv4Addr::UNSPECIFIED);
    let opts = reply.opts_mut();
    opts.insert(DhcpOption::MessageType(reply_type));
    opts.insert(DhcpOption::ServerIdentifier(config.server_ip));
    if reply_type != MessageType::Nak {
        reply.set_yiaddr(config.guest_ip);
        let opts = reply.opts_mut();
        opts.insert(DhcpOption::SubnetMask(config.subnet_mask));
        if let Some(router) = config.router {
            opts.insert(DhcpOption::Router(vec![router]));
        }
        if !config.classless_routes.is_empty() {
            opts.insert(DhcpOption::ClasslessStaticRoute(
                config.classless_routes.clone(),
            ));
        }
        if !config.dns.is_empty() {
            opts.insert(DhcpOption::DomainNameServer(config.dns.clone()));
        }
        if let Some(hostname) = &config.hostname {
            opts.insert(DhcpOption::Hostname(hostname.clone()));
        }
        if let Some(domain) = &config.domain_name {
            opts.insert(DhcpOption::DomainName(domain.clone()));
        }
        opts.insert(DhcpOption::InterfaceMtu(config.mtu));
        opts.insert(DhcpOption::Unknown(UnknownOption::new(
            OptionCode::DomainSearch,
            config.search_wire.clone(),
        )));
        opts.insert(DhcpOption::AddressLeaseTime(config.lease_secs));
    }
    let mut bytes = Vec::with_capacity(BOOTP_MIN_LEN);
    reply
        .encode(&mut Encoder::new(&mut bytes))
        .map_err(|e| DhcpError::Encode(e.to_string()))?;
    if bytes.len() < BOOTP_MIN_LEN {
        bytes.resize(BOOTP_MIN_LEN, 0);
    }
    Ok(bytes)
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot set up the DHCP socket on {bridge}: {source}")]
    Socket { bridge: String, source: nix::Error },
    #[error("DHCP socket I/O: {0}")]
    Io(#[from] std::io::Error),
}

/// A DHCPv4 server socket on the bridge (UDP :67, bound to the bridge device).
pub struct DhcpServer {
    socket: UdpSocket,
    config: DhcpConfig,
    /// Packets dropped as malformed or not for us.
    dropped: GuestLog,
    /// Replies that could not be sent.
    unsent: GuestLog,
}

/// Counts a log line that a guest can cause once per packet: the first [`ALWAYS_LOGGED`]
/// occurrences are logged, then only every power-of-two one, with the running count, so a
/// guest sending garbage in a loop cannot fill the node's disk through the launcher's log.
/// This is the rule of `virtio-devices`' `GuestErrorLog`; one helper for both would belong in
/// a small leaf crate that the two depend on.
#[derive(Debug, Default)]
struct GuestLog(AtomicU64);

/// Occurrences always logged before the log thins out.
const ALWAYS_LOGGED: u64 = 32;

impl GuestLog {
    /// Counts one occurrence; the running count when this one is to be logged.
    fn tick(&self) -> Option<u64> {
        let n = self.0.fetch_add(1, Ordering::Relaxed).saturating_add(1);
        (n <= ALWAYS_LOGGED || n.is_power_of_two()).then_some(n)
    }
}

impl DhcpServer {
    /// Binds `0.0.0.0:67` on `bridge` with `SO_BINDTODEVICE`, so only the guest's side is
    /// served. Must be called in the pod's network namespace.
    pub fn bind(bridge: &str, config: DhcpConfig) -> Result<Self, ServerError> {
        use nix::sys::socket::{
            AddressFamily, SockFlag, SockType, SockaddrIn, bind, setsockopt, socket, sockopt,
        };
        let err = |source| ServerError::Socket {
            bridge: bridge.to_string(),
            source,
        };
        let fd = socket(
            AddressFamily::Inet,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .map_err(err)?;
        setsockopt(&fd, sockopt::ReuseAddr, &true).map_err(err)?;
        setsockopt(&fd, sockopt::Broadcast, &true).map_err(err)?;
        setsockopt(
            &fd,
            sockopt::BindToDevice,
            &std::ffi::OsString::from(bridge),
        )
        .map_err(err)?;
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, SERVER_PORT)),
        )
        .map_err(err)?;
        // SAFETY: fd is a freshly created, owned UDP socket handed over to UdpSocket.
        let socket = unsafe { UdpSocket::from_raw_fd(fd.into_raw_fd()) };
        Ok(DhcpServer::on(socket, config))
    }

    fn on(socket: UdpSocket, config: DhcpConfig) -> Self {
        DhcpServer {
            socket,
            config,
            dropped: GuestLog::default(),
            unsent: GuestLog::default(),
        }
    }

    /// Serves until `stop` is set (checked every `poll` interval).
    pub fn serve_until(&self, stop: &AtomicBool, poll: Duration) -> Result<(), ServerError> {
        self.socket.set_read_timeout(Some(poll))?;
        while !stop.load(Ordering::Relaxed) {
            match self.handle_one() {
                Ok(()) => {}
                Err(ServerError::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::TimedOut
                            | std::io::ErrorKind::Interrupted
                    ) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Receives one datagram and answers it; bad packets are logged and dropped.
    pub(crate) fn handle_one(&self) -> Result<(), ServerError> {
        let mut buf = [0u8; 1500];
        let (len, from) = self.socket.recv_from(&mut buf)?;
        let Some(request) = buf.get(..len) else {
            return Ok(());
        };
        match answer(request, &self.config) {
            Ok(Some(reply)) => {
                // Before the ACK the guest has no address: answer by broadcast, like
                // KubeVirt's server does for clients without ciaddr.
                let to = match from {
                    std::net::SocketAddr::V4(v4) if !v4.ip().is_unspecified() => {
                        SocketAddrV4::new(*v4.ip(), CLIENT_PORT)
                    }
                    _ => SocketAddrV4::new(Ipv4Addr::BROADCAST, CLIENT_PORT),
                };
                // A failed send (bridge flapping, guest gone) loses one reply, not the server.
                if let Err(e) = self.socket.send_to(&reply, to)
                    && let Some(n) = self.unsent.tick()
                {
                    tracing::warn!(unsent = n, "cannot send DHCP reply to {to}: {e}");
                }
            }
            Ok(None) => tracing::debug!("DHCP request from {from} needs no answer"),
            // The guest's doing, not a fault of the host: INFO, as virtio-devices logs them.
            Err(e) => {
                if let Some(n) = self.dropped.tick() {
                    tracing::info!(target: "guest_error", guest_errors = n, "dropping DHCP packet from {from}: {e}");
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dhcproto::v4::Flags;

    fn config() -> DhcpConfig {
        let resolv = ResolvConf::parse(
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\n",
        );
        DhcpConfig::masquerade(
            "10.0.2.0/24".parse().unwrap(),
            &resolv,
            Some("vmi-fedora".into()),
            None,
            1450,
        )
        .unwrap()
    }

    /// The masquerade answer for a pod whose resolv.conf is `resolv` (no
    /// hostname, MTU 1500).
    fn masquerade(resolv: &str, subdomain: Option<&str>) -> DhcpConfig {
        DhcpConfig::masquerade(
            "10.0.2.0/24".parse().unwrap(),
            &ResolvConf::parse(resolv),
            None,
            subdomain,
            1500,
        )
        .unwrap()
    }

    fn request(kind: MessageType, requested: Option<Ipv4Addr>) -> Vec<u8> {
        let mut msg = Message::default();
        msg.set_xid(0xdead_beef)
            .set_chaddr(&[0x52, 0x54, 0, 0x12, 0x34, 0x56])
            .set_flags(Flags::default().set_broadcast());
        msg.opts_mut().insert(DhcpOption::MessageType(kind));
        if let Some(ip) = requested {
            msg.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        }
        msg.to_vec().unwrap()
    }

    fn decode(bytes: &[u8]) -> Message {
        Message::decode(&mut Decoder::new(bytes)).unwrap()
    }

    #[test]
    fn discover_gets_offer_with_contract_options() {
        let reply = answer(&request(MessageType::Discover, None), &config())
            .unwrap()
            .unwrap();
        assert!(reply.len() >= BOOTP_MIN_LEN);
        let msg = decode(&reply);
        assert_eq!(msg.xid(), 0xdead_beef);
        assert_eq!(msg.opcode(), Opcode::BootReply);
        assert_eq!(msg.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));
        assert_eq!(&msg.chaddr()[..6], &[0x52, 0x54, 0, 0x12, 0x34, 0x56]);
        let o = msg.opts();
        assert_eq!(
            o.get(OptionCode::MessageType),
            Some(&DhcpOption::MessageType(MessageType::Offer))
        );
        assert_eq!(
            o.get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 2, 1)))
        );
        assert_eq!(
            o.get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
        );
        assert_eq!(
            o.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 2, 1)]))
        );
        assert_eq!(
            o.get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
                10, 96, 0, 10
            )]))
        );
        assert_eq!(
            o.get(OptionCode::Hostname),
            Some(&DhcpOption::Hostname("vmi-fedora".into()))
        );
        assert_eq!(
            o.get(OptionCode::DomainName),
            Some(&DhcpOption::DomainName("default.svc.cluster.local".into()))
        );
        assert_eq!(
            o.get(OptionCode::InterfaceMtu),
            Some(&DhcpOption::InterfaceMtu(1450))
        );
        assert_eq!(
            o.get(OptionCode::AddressLeaseTime),
            Some(&DhcpOption::AddressLeaseTime(86_313_600))
        );
        let Some(DhcpOption::DomainSearch(names)) = o.get(OptionCode::DomainSearch) else {
            panic!("no domain search option");
        };
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        assert_eq!(
            names,
            [
                "default.svc.cluster.local.",
                "svc.cluster.local.",
                "cluster.local."
            ]
        );
    }

    #[test]
    fn request_gets_ack_or_nak() {
        let ack = decode(
            &answer(
                &request(MessageType::Request, Some(Ipv4Addr::new(10, 0, 2, 2))),
                &config(),
            )
            .unwrap()
            .unwrap(),
        );
        assert_eq!(
            ack.opts().get(OptionCode::MessageType),
            Some(&DhcpOption::MessageType(MessageType::Ack))
        );
        assert_eq!(ack.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));
        let nak = decode(
            &answer(
                &request(MessageType::Request, Some(Ipv4Addr::new(10, 0, 2, 9))),
                &config(),
            )
            .unwrap()
            .unwrap(),
        );
        assert_eq!(
            nak.opts().get(OptionCode::MessageType),
            Some(&DhcpOption::MessageType(MessageType::Nak))
        );
        assert_eq!(nak.yiaddr(), Ipv4Addr::UNSPECIFIED);
        assert!(nak.opts().get(OptionCode::AddressLeaseTime).is_none());
    }

    #[test]
    fn request_for_another_server_is_ignored() {
        let mut msg = decode(&request(
            MessageType::Request,
            Some(Ipv4Addr::new(10, 0, 2, 2)),
        ));
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(192, 0, 2, 1)));
        assert_eq!(answer(&msg.to_vec().unwrap(), &config()), Ok(None));
    }

    #[test]
    fn hostile_inputs_are_errors_not_panics() {
        let cfg = config();
        assert!(matches!(answer(&[], &cfg), Err(DhcpError::Malformed(_))));
        assert!(matches!(
            answer(&[1; 10], &cfg),
            Err(DhcpError::Malformed(_))
        ));
        let mut reply = request(MessageType::Discover, None);
        reply[0] = 2; // BOOTREPLY
        assert_eq!(answer(&reply, &cfg), Err(DhcpError::NotARequest));
        let mut no_type = decode(&request(MessageType::Discover, None));
        no_type.opts_mut().remove(OptionCode::MessageType);
        assert_eq!(
            answer(&no_type.to_vec().unwrap(), &cfg),
            Err(DhcpError::NoMessageType)
        );
        let mut token_ring = request(MessageType::Discover, None);
        token_ring[1] = 6;
        assert!(answer(&token_ring, &cfg).is_err());
        assert_eq!(answer(&request(MessageType::Release, None), &cfg), Ok(None));
    }

    #[test]
    fn used_options_are_length_checked_and_others_dropped() {
        let mut bytes = request(MessageType::Discover, None);
        // Replace the End marker with a client-network-interface option of a wrong length
        // (dhcproto asserts on it) followed by End: it is dropped, the request answered.
        let end = bytes.iter().rposition(|b| *b == 255).unwrap();
        bytes.truncate(end);
        bytes.extend_from_slice(&[94, 1, 0, 255]);
        assert!(answer(&bytes, &config()).unwrap().is_some());
        // A requested-address option of length 3 is malformed.
        let end = bytes.iter().rposition(|b| *b == 255).unwrap();
        bytes.truncate(end);
        bytes.extend_from_slice(&[50, 3, 10, 0, 2, 255]);
        assert!(matches!(
            answer(&bytes, &config()),
            Err(DhcpError::Malformed(_))
        ));
        // An option running past the end is malformed.
        let mut cut = request(MessageType::Discover, None);
        let end = cut.iter().rposition(|b| *b == 255).unwrap();
        cut.truncate(end);
        cut.extend_from_slice(&[12, 40, b'x']);
        assert!(matches!(
            answer(&cut, &config()),
            Err(DhcpError::Malformed(_))
        ));
    }

    #[test]
    fn subdomain_goes_first_and_search_is_uncompressed_rfc1035() {
        let cfg = masquerade(
            "search ns1.svc.cluster.local svc.cluster.local cluster.local\n",
            Some("mysub"),
        );
        assert_eq!(
            cfg.search,
            [
                "mysub.ns1.svc.cluster.local",
                "ns1.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local"
            ]
        );
        assert_eq!(
            cfg.domain_name.as_deref(),
            Some("mysub.ns1.svc.cluster.local")
        );
        // A namespace domain that already starts with the subdomain gets no second one.
        let cfg = masquerade(
            "search mysub.ns1.svc.cluster.local svc.cluster.local\n",
            Some("mysub"),
        );
        assert_eq!(
            cfg.search,
            ["mysub.ns1.svc.cluster.local", "svc.cluster.local"]
        );
        // Of equally long domains the first is the domain name, as in KubeVirt.
        let cfg = masquerade("search a.svc.x b.svc.x\n", Some("s"));
        assert_eq!(cfg.search[0], "s.a.svc.x");
        let cfg = masquerade("search a.x b.x\n", None);
        assert_eq!(cfg.domain_name.as_deref(), Some("a.x"));
        let short = masquerade("search a.b\n", None);
        assert_eq!(short.search_wire, b"\x01a\x01b\x00");
        for bad in [
            "UPPER.case",
            "trailing-.dash",
            "a..b",
            "1.2",
            "under_score.x_y",
        ] {
            assert!(check_search_domain(bad).is_err(), "{bad}");
        }
        for good in ["_tcp.example.com", "a-b.c", "x", "0a.example"] {
            assert!(check_search_domain(good).is_ok(), "{good}");
        }
    }

    /// 8.8.8.8 stands in only when the pod has no name server at all; a pod
    /// with IPv6 servers only gets no option 6 (never an empty one).
    #[test]
    fn default_dns_only_without_any_name_server() {
        assert_eq!(masquerade("", None).dns, vec![DEFAULT_DNS]);
        let v6_only = masquerade("nameserver fd00::a\n", None);
        assert!(v6_only.dns.is_empty());
        let reply = answer(&request(MessageType::Discover, None), &v6_only)
            .unwrap()
            .unwrap();
        assert_eq!(
            decode(&reply).opts().get(OptionCode::DomainNameServer),
            None
        );
        let with_v4 = answer(
            &request(MessageType::Discover, None),
            &masquerade("nameserver 10.96.0.10\n", None),
        )
        .unwrap()
        .unwrap();
        assert_eq!(
            decode(&with_v4).opts().get(OptionCode::DomainNameServer),
            Some(&DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
                10, 96, 0, 10
            )]))
        );
    }

    #[test]
    fn defaults_and_bad_search_domains() {
        let cfg = masquerade("", None);
        assert_eq!(cfg.dns, vec![DEFAULT_DNS]);
        assert_eq!(cfg.search.len(), 1);
        assert_eq!(cfg.search, vec!["cluster.local"]);
        assert_eq!(cfg.domain_name.as_deref(), Some("cluster.local"));
        let bad = ResolvConf {
            search: vec!["bad domain!".into()],
            ..Default::default()
        };
        assert!(
            DhcpConfig::masquerade("10.0.2.0/24".parse().unwrap(), &bad, None, None, 1500).is_err()
        );
        let long = ResolvConf {
            search: (0..20)
                .map(|i| format!("domain-number-{i}.example.org"))
                .collect(),
            ..Default::default()
        };
        assert!(matches!(
            DhcpConfig::masquerade("10.0.2.0/24".parse().unwrap(), &long, None, None, 1500),
            Err(DhcpConfigError::SearchTooLong(_))
        ));
        assert!(
            DhcpConfig::masquerade(
                "10.0.2.0/24".parse().unwrap(),
                &ResolvConf::default(),
                None,
                None,
                70000
            )
            .is_err()
        );
    }

    fn bridge_cache() -> DhcpCache {
        use proto::contract::dhcp_cache::{NetlinkAddr, NetlinkRoute};
        let ip = |t: &str| t.parse::<IpAddr>().unwrap();
        DhcpCache {
            ip: NetlinkAddr::from_cidr(ip("10.1.2.3"), 32),
            mac: Some(vec![0x52, 0x54, 0, 0x12, 0x34, 0x56]),
            gateway: Some(ip("169.254.1.1")),
            // As the handler records them: the default route first (kernel order).
            routes: Some(vec![
                NetlinkRoute::new(None, Some(ip("169.254.1.1"))),
                NetlinkRoute::new(Some((ip("169.254.1.1"), 32)), None),
                NetlinkRoute::new(Some((ip("192.168.0.0"), 16)), Some(ip("169.254.1.1"))),
            ]),
            ..Default::default()
        }
    }

    fn bridge_config() -> DhcpConfig {
        DhcpConfig::bridge(
            &bridge_cache(),
            Ipv4Addr::new(169, 254, 75, 10),
            &ResolvConf::parse("search ns.svc.cluster.local\nnameserver 10.96.0.10\n"),
            Some("vmi".into()),
            None,
            1440,
        )
        .unwrap()
        .unwrap()
    }

    #[test]
    fn bridge_offer_carries_the_pod_address_gateway_and_routes() {
        let reply = answer(&request(MessageType::Discover, None), &bridge_config())
            .unwrap()
            .unwrap();
        let msg = decode(&reply);
        assert_eq!(msg.yiaddr(), Ipv4Addr::new(10, 1, 2, 3));
        let o = msg.opts();
        assert_eq!(
            o.get(OptionCode::ServerIdentifier),
            Some(&DhcpOption::ServerIdentifier(Ipv4Addr::new(
                169, 254, 75, 10
            )))
        );
        assert_eq!(
            o.get(OptionCode::SubnetMask),
            Some(&DhcpOption::SubnetMask(Ipv4Addr::BROADCAST))
        );
        assert_eq!(
            o.get(OptionCode::Router),
            Some(&DhcpOption::Router(vec![Ipv4Addr::new(169, 254, 1, 1)]))
        );
        assert_eq!(
            o.get(OptionCode::InterfaceMtu),
            Some(&DhcpOption::InterfaceMtu(1440))
        );
        // Option 121 bytes as KubeVirt's formClasslessRoutes writes them: the default
        // route moved last, on-link next hops as 0.0.0.0.
        let mut wire = Vec::new();
        o.get(OptionCode::ClasslessStaticRoute)
            .expect("option 121")
            .encode(&mut Encoder::new(&mut wire))
            .unwrap();
        assert_eq!(
            wire,
            [
                121, 21, //
                32, 169, 254, 1, 1, 0, 0, 0, 0, // 169.254.1.1/32 on-link
                16, 192, 168, 169, 254, 1, 1, // 192.168.0.0/16 via 169.254.1.1
                0, 169, 254, 1, 1, // default via 169.254.1.1
            ]
        );
        let ack = decode(
            &answer(
                &request(MessageType::Request, Some(Ipv4Addr::new(10, 1, 2, 3))),
                &bridge_config(),
            )
            .unwrap()
            .unwrap(),
        );
        assert_eq!(
            ack.opts().get(OptionCode::MessageType),
            Some(&DhcpOption::MessageType(MessageType::Ack))
        );
    }

    #[test]
    fn bridge_serves_only_the_guest_mac() {
        let mut other = decode(&request(MessageType::Discover, None));
        other.set_chaddr(&[0x52, 0x54, 0, 0x12, 0x34, 0x57]);
        assert_eq!(answer(&other.to_vec().unwrap(), &bridge_config()), Ok(None));
        // Masquerade serves anyone.
        assert!(
            answer(&other.to_vec().unwrap(), &config())
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn bridge_cache_problems_are_errors() {
        let server = Ipv4Addr::new(169, 254, 75, 10);
        let build = |cache: &DhcpCache| {
            DhcpConfig::bridge(cache, server, &ResolvConf::default(), None, None, 1500)
        };
        let disabled = DhcpCache {
            ipam_disabled: true,
            ..Default::default()
        };
        assert_eq!(build(&disabled).unwrap(), None);
        let mut no_mac = bridge_cache();
        no_mac.mac = None;
        assert!(matches!(build(&no_mac), Err(DhcpConfigError::NoGuestMac)));
        let mut multicast_mac = bridge_cache();
        multicast_mac.mac = Some(vec![1, 0, 0x5e, 0, 0, 1]);
        assert!(matches!(
            build(&multicast_mac),
            Err(DhcpConfigError::NoGuestMac)
        ));
        let mut no_ip = bridge_cache();
        no_ip.ip = Default::default();
        assert!(matches!(
            build(&no_ip),
            Err(DhcpConfigError::NoGuestAddress)
        ));
        let mut v6_route = bridge_cache();
        v6_route.routes = Some(vec![proto::contract::dhcp_cache::NetlinkRoute::new(
            Some(("fd00::".parse().unwrap(), 64)),
            None,
        )]);
        assert!(matches!(
            build(&v6_route),
            Err(DhcpConfigError::BadRoute(_))
        ));
        let mut no_gateway = bridge_cache();
        no_gateway.gateway = None;
        no_gateway.routes = None;
        let cfg = build(&no_gateway).unwrap().unwrap();
        let offer = decode(
            &answer(&request(MessageType::Discover, None), &cfg)
                .unwrap()
                .unwrap(),
        );
        assert!(offer.opts().get(OptionCode::Router).is_none());
        assert!(offer.opts().get(OptionCode::ClasslessStaticRoute).is_none());
    }

    /// A guest sending a malformed packet in a loop: every packet is dropped, but the log
    /// gets the first 32 lines and then one per power of two, not one per packet.
    #[test]
    fn a_guest_flooding_bad_packets_gets_a_thinned_log() {
        use std::io::Write;
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Lines(Arc<Mutex<Vec<u8>>>);
        impl Write for Lines {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .finish();

        let server = DhcpServer::on(UdpSocket::bind("127.0.0.1:0").unwrap(), config());
        let guest = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = server.socket.local_addr().unwrap();
        tracing::subscriber::with_default(subscriber, || {
            for _ in 0..1000 {
                guest.send_to(b"not a DHCP packet", to).unwrap();
                server.handle_one().unwrap();
            }
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let logged: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("dropping DHCP packet"))
            .collect();
        // 1..=32, then 64, 128, 256, 512.
        assert_eq!(logged.len(), 36, "{text}");
        assert!(logged[35].contains("guest_errors=512"), "{}", logged[35]);
        assert!(
            logged.iter().all(|l| l.contains("INFO guest_error")),
            "{text}"
        );
    }
}
