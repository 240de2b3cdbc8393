//! KubeVirt's masquerade NAT ruleset (proto/CONTRACT.md §5.1), built and installed over netlink.
//!
//! The ruleset is first described as plain data ([`NatRuleset`] → [`Rule`]s, printable in
//! `nft` syntax so it can be compared with KubeVirt's commands), then encoded with the
//! young `netlink-bindings` crate, which only this module touches.
//!
//! Installation is one atomic nf_tables batch per call: "add table, delete table, add
//! everything". Adding the same rules twice would duplicate them; replacing the table in
//! one transaction makes a second run leave exactly the same state, and a failing batch
//! changes nothing.
//!
//! Sets are encoded the way `nft` does: a match on one value is a plain comparison, a match
//! on several (`tcp dport { 49152, 49153 }`) an anonymous constant set in the same batch
//! plus a `lookup` expression, so `nft list ruleset` shows KubeVirt's rules.

use std::fmt;
use std::net::IpAddr;

use netlink_bindings::nftables::{
    self, CmpOps, MetaKeys, Nfgenmsg, PayloadBase, PushExprListAttrs, PushRuleAttrs, Registers,
    VerdictCode,
};
use netlink_bindings::traits::Pusher;
use netlink_bindings::utils::{RequestBuf, push_header};
use netlink_socket2::NetlinkSocket;

/// The table KubeVirt uses in both families.
pub(crate) const NAT_TABLE: &str = "nat";
pub(crate) const PREROUTING: &str = "prerouting";
pub(crate) const INPUT: &str = "input";
pub(crate) const OUTPUT: &str = "output";
pub(crate) const POSTROUTING: &str = "postrouting";
pub const KUBEVIRT_PREINBOUND: &str = "KUBEVIRT_PREINBOUND";
pub const KUBEVIRT_POSTINBOUND: &str = "KUBEVIRT_POSTINBOUND";

/// Legacy (TCP) migration ports kept away from the guest when migration does not go over a unix socket.
pub(crate) const LEGACY_MIGRATION_PORTS: [u16; 2] = [49152, 49153];
/// Ports the Istio sidecar owns (`istio.ReservedPorts()`).
pub(crate) const ISTIO_RESERVED_PORTS: [u16; 10] = [
    15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090,
];
/// Ports Istio does not proxy, so they still go to the guest (`istio.NonProxiedPorts()`).
pub(crate) const ISTIO_NON_PROXIED_PORTS: [u16; 1] = [22];
/// Source address of traffic the Istio sidecar forwards (`istio.GetLoopbackAddress()`).
pub(crate) const ISTIO_LOOPBACK: std::net::Ipv4Addr = std::net::Ipv4Addr::new(127, 0, 0, 6);

const NFPROTO_IPV4: u8 = libc::NFPROTO_IPV4 as u8;
const NFPROTO_IPV6: u8 = libc::NFPROTO_IPV6 as u8;
const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFT_NAT_SNAT: u32 = 0;
const NFT_NAT_DNAT: u32 = 1;
const IFNAMSIZ: usize = 16;
const NFT_SET_ANONYMOUS: u32 = 0x1;
const NFT_SET_CONSTANT: u32 = 0x2;
/// The kernel picks the number (`__set0`, `__set1`...) as `nft` asks it to.
const ANONYMOUS_SET_NAME: &[u8] = b"__set%d";
/// nft's data type ids, stored with a set so `nft list` prints its elements properly.
const NFT_TYPE_IPADDR: u32 = 7;
const NFT_TYPE_IP6ADDR: u32 = 8;
const NFT_TYPE_INET_SERVICE: u32 = 13;

/// `ip` (IPv4) or `ip6` (IPv6) nftables family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Ip,
    Ip6,
}

impl Family {
    fn nfproto(self) -> u8 {
        match self {
            Family::Ip => NFPROTO_IPV4,
            Family::Ip6 => NFPROTO_IPV6,
        }
    }
    fn loopback(self) -> IpAddr {
        match self {
            Family::Ip => IpAddr::V4(std::net::Ipv4Addr::LOCALHOST),
            Family::Ip6 => IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
        }
    }
    /// Offsets of the source and destination address in the network header, and the address length.
    fn addr_layout(self) -> (u32, u32, u32) {
        match self {
            Family::Ip => (12, 16, 4),
            Family::Ip6 => (8, 24, 16),
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::Ip => "ip",
            Family::Ip6 => "ip6",
        })
    }
}

/// Transport protocol of a forwarded port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum L4Proto {
    Tcp,
    Udp,
}

impl L4Proto {
    fn number(self) -> u8 {
        match self {
            L4Proto::Tcp => libc::IPPROTO_TCP as u8,
            L4Proto::Udp => libc::IPPROTO_UDP as u8,
        }
    }
}

impl fmt::Display for L4Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            L4Proto::Tcp => "tcp",
            L4Proto::Udp => "udp",
        })
    }
}

/// A port the VMI declares (`interfaces[].ports[]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Port {
    pub number: u16,
    pub protocol: L4Proto,
}

/// One match of a rule, in the order `nft` evaluates it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Match {
    IifName(String),
    OifName(String),
    /// Source address is one of these.
    Saddr(Family, Vec<IpAddr>),
    /// Destination address is one of these.
    Daddr(Family, Vec<IpAddr>),
    /// Transport protocol is this one and the destination port is one of these.
    Dport(L4Proto, Vec<u16>),
}

/// What a matching packet gets. Every rule also counts (`counter`) before acting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Masquerade,
    Jump(&'static str),
    Return,
    Dnat(IpAddr),
    Snat(IpAddr),
}

/// One rule in a chain of the `nat` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub chain: &'static str,
    pub matches: Vec<Match>,
    pub action: Action,
}

/// A base chain: `type nat hook <hook> priority <priority>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BaseChain {
    pub name: &'static str,
    pub hook: u32,
    pub priority: i32,
}

/// The base chains in KubeVirt's order, with their hooks and priorities.
pub(crate) const BASE_CHAINS: [BaseChain; 4] = [
    BaseChain {
        name: PREROUTING,
        hook: libc::NF_INET_PRE_ROUTING as u32,
        priority: -100,
    },
    BaseChain {
        name: INPUT,
        hook: libc::NF_INET_LOCAL_IN as u32,
        priority: 100,
    },
    BaseChain {
        name: OUTPUT,
        hook: libc::NF_INET_LOCAL_OUT as u32,
        priority: -100,
    },
    BaseChain {
        name: POSTROUTING,
        hook: libc::NF_INET_POST_ROUTING as u32,
        priority: 100,
    },
];
/// The regular chains.
pub(crate) const REGULAR_CHAINS: [&str; 2] = [KUBEVIRT_PREINBOUND, KUBEVIRT_POSTINBOUND];

/// Everything that decides the NAT rules of one family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NatRuleset {
    pub family: Family,
    /// The pod interface (`eth0`).
    pub pod_iface: String,
    /// The bridge (`k6t-eth0`).
    pub bridge: String,
    /// Gateway address on the bridge (`10.0.2.1`).
    pub gateway: IpAddr,
    /// The guest's address (`10.0.2.2`).
    pub guest: IpAddr,
    /// The pod's own address; only used by the Istio variant (IPv4 output DNAT).
    pub pod_ip: Option<IpAddr>,
    /// Declared ports; empty means "forward everything".
    pub ports: Vec<Port>,
    pub istio: bool,
    /// `status.migrationTransport == "Unix"`; otherwise the legacy migration ports are kept local.
    pub migration_over_unix: bool,
}

impl NatRuleset {
    /// The rules in the order KubeVirt adds them (proto/CONTRACT.md §5.1 rows 7–11).
    pub fn rules(&self) -> Vec<Rule> {
        let fam = self.family;
        let loopback = fam.loopback();
        let rule = |chain, matches, action| Rule {
            chain,
            matches,
            action,
        };
        let mut rules = vec![
            rule(
                POSTROUTING,
                vec![Match::Saddr(fam, vec![self.guest])],
                Action::Masquerade,
            ),
            rule(
                PREROUTING,
                vec![Match::IifName(self.pod_iface.clone())],
                Action::Jump(KUBEVIRT_PREINBOUND),
            ),
            rule(
                POSTROUTING,
                vec![Match::OifName(self.bridge.clone())],
                Action::Jump(KUBEVIRT_POSTINBOUND),
            ),
        ];
        let keep_local = |rules: &mut Vec<Rule>, ports: &[u16]| {
            for chain in [OUTPUT, KUBEVIRT_POSTINBOUND] {
                rules.push(rule(
                    chain,
                    vec![
                        Match::Dport(L4Proto::Tcp, ports.to_vec()),
                        Match::Saddr(fam, vec![loopback]),
                    ],
                    Action::Return,
                ));
            }
        };
        if !self.migration_over_unix {
            keep_local(&mut rules, &LEGACY_MIGRATION_PORTS);
        }

        let mut dnat_daddrs = vec![loopback];
        let mut snat_saddrs = vec![loopback];
        // Istio only widens the IPv4 sets (sidecar loopback source, pod IP destination).
        if self.istio && fam == Family::Ip {
            if let Some(pod_ip) = self.pod_ip {
                dnat_daddrs.push(pod_ip);
            }
            snat_saddrs.push(IpAddr::V4(ISTIO_LOOPBACK));
        }
        let gateway = self.gateway;
        let guest = self.guest;

        for port in &self.ports {
            if self.istio {
                // Only ports Istio does not proxy reach the guest directly.
                if ISTIO_NON_PROXIED_PORTS.contains(&port.number) {
                    rules.push(rule(
                        KUBEVIRT_PREINBOUND,
                        vec![Match::Dport(L4Proto::Tcp, vec![port.number])],
                        Action::Dnat(guest),
                    ));
                }
            } else {
                rules.push(rule(
                    KUBEVIRT_PREINBOUND,
                    vec![Match::Dport(port.protocol, vec![port.number])],
                    Action::Dnat(guest),
                ));
            }
            rules.push(rule(
                KUBEVIRT_POSTINBOUND,
                vec![
                    Match::Dport(port.protocol, vec![port.number]),
                    Match::Saddr(fam, snat_saddrs.clone()),
                ],
                Action::Snat(gateway),
            ));
            rules.push(rule(
                OUTPUT,
                vec![
                    Match::Daddr(fam, dnat_daddrs.clone()),
                    Match::Dport(port.protocol, vec![port.number]),
                ],
                Action::Dnat(guest),
            ));
        }

        if self.ports.is_empty() {
            if self.istio {
                keep_local(&mut rules, &ISTIO_RESERVED_PORTS);
                rules.push(rule(
                    KUBEVIRT_PREINBOUND,
                    vec![Match::Dport(L4Proto::Tcp, ISTIO_NON_PROXIED_PORTS.to_vec())],
                    Action::Dnat(guest),
                ));
            } else {
                rules.push(rule(KUBEVIRT_PREINBOUND, vec![], Action::Dnat(guest)));
            }
            rules.push(rule(
                KUBEVIRT_POSTINBOUND,
                vec![Match::Saddr(fam, snat_saddrs)],
                Action::Snat(gateway),
            ));
            rules.push(rule(
                OUTPUT,
                vec![Match::Daddr(fam, dnat_daddrs)],
                Action::Dnat(guest),
            ));
        }
        rules
    }
}

fn fmt_set<T: fmt::Display>(items: &[T], always_braces: bool) -> String {
    let joined: Vec<String> = items.iter().map(|i| i.to_string()).collect();
    if items.len() == 1 && !always_braces {
        joined.join("")
    } else {
        format!("{{ {} }}", joined.join(", "))
    }
}

impl fmt::Display for Rule {
    /// The rule in `nft add rule <fam> nat` syntax (as KubeVirt writes it), without the prefix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.chain)?;
        for m in &self.matches {
            match m {
                Match::IifName(name) => write!(f, " iifname {name}")?,
                Match::OifName(name) => write!(f, " oifname {name}")?,
                // KubeVirt writes source sets in braces only for its SNAT rules.
                Match::Saddr(fam, addrs) => write!(
                    f,
                    " {fam} saddr {}",
                    fmt_set(addrs, matches!(self.action, Action::Snat(_)))
                )?,
                Match::Daddr(fam, addrs) => write!(f, " {fam} daddr {}", fmt_set(addrs, true))?,
                // KubeVirt braces the DNAT port sets and multi-port sets; its per-port
                // SNAT and output rules name a bare port.
                Match::Dport(proto, ports) => {
                    let per_port_rule = self.chain == KUBEVIRT_POSTINBOUND || self.chain == OUTPUT;
                    let braces = !per_port_rule || ports.len() > 1;
                    write!(f, " {proto} dport {}", fmt_set(ports, braces))?
                }
            }
        }
        match &self.action {
            Action::Masquerade => write!(f, " counter masquerade"),
            Action::Jump(chain) => write!(f, " counter jump {chain}"),
            Action::Return => write!(f, " counter return"),
            Action::Dnat(to) => write!(f, " counter dnat to {to}"),
            Action::Snat(to) => write!(f, " counter snat to {to}"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("nf_tables batch failed: {0}")]
    Batch(String),
    #[error("cannot read the nf_tables generation: {0}")]
    Generation(String),
}

/// Replaces the `nat` table of each given family with the given rules, atomically.
/// Families not listed are left alone. Must run inside the target network namespace.
pub fn install(rulesets: &[NatRuleset]) -> Result<(), NftError> {
    let mut batch = Batch::begin()?;
    for ruleset in rulesets {
        batch.replace_table(ruleset.family);
        for chain in BASE_CHAINS {
            batch.add_base_chain(ruleset.family, chain);
        }
        for chain in REGULAR_CHAINS {
            batch.add_regular_chain(ruleset.family, chain);
        }
        for rule in ruleset.rules() {
            batch.add_rule(ruleset.family, &rule);
        }
    }
    batch.commit()
}

/// Removes the `nat` table of each given family if present, atomically.
pub fn remove(families: &[Family]) -> Result<(), NftError> {
    let mut batch = Batch::begin()?;
    for family in families {
        // "add" makes the delete valid whether or not the table exists.
        batch.add_table(*family);
        batch.delete_table(*family);
    }
    batch.commit()
}

type PushExprs<'a> = PushExprListAttrs<PushRuleAttrs<RequestBuf<'a>>>;

/// One nf_tables transaction being built.
struct Batch {
    sock: NetlinkSocket,
    chained: nftables::Chained<'static>,
    /// Batch-local ids of anonymous sets, so rules can refer to sets not yet named.
    next_set_id: u32,
}

fn header(family: u8) -> Nfgenmsg {
    let mut h = Nfgenmsg::new();
    h.nfgen_family = family;
    h
}

impl Batch {
    fn begin() -> Result<Self, NftError> {
        let mut sock = NetlinkSocket::new();
        // Sequence numbers for every message of the batch; 4096 is far above the largest ruleset.
        let seq = sock.reserve_seq(4096);
        let genid = {
            let request = nftables::Request::new().op_getgen_do(&Nfgenmsg::new());
            let mut reply = sock
                .request(&request)
                .map_err(|e| NftError::Generation(e.to_string()))?;
            let (_, attrs) = reply
                .recv_one()
                .map_err(|e| NftError::Generation(e.to_string()))?;
            attrs
                .get_id()
                .map_err(|e| NftError::Generation(format!("{e:?}")))?
        };
        let mut chained = nftables::Chained::new(seq);
        let mut h = Nfgenmsg::new();
        h.set_res_id(NFNL_SUBSYS_NFTABLES);
        // The generation id makes the kernel refuse the batch if the ruleset changed meanwhile.
        chained
            .request()
            .op_batch_begin_do(&h)
            .encode()
            .push_genid(genid);
        Ok(Batch {
            sock,
            chained,
            next_set_id: 0,
        })
    }

    fn add_table(&mut self, family: Family) {
        self.chained
            .request()
            .set_create()
            .op_newtable_do(&header(family.nfproto()))
            .encode()
            .push_name_bytes(NAT_TABLE.as_bytes());
    }

    fn delete_table(&mut self, family: Family) {
        self.chained
            .request()
            .op_deltable_do(&header(family.nfproto()))
            .encode()
            .push_name_bytes(NAT_TABLE.as_bytes());
    }

    fn replace_table(&mut self, family: Family) {
        self.add_table(family);
        self.delete_table(family);
        self.add_table(family);
    }

    fn add_base_chain(&mut self, family: Family, chain: BaseChain) {
        self.chained
            .request()
            .set_create()
            .op_newchain_do(&header(family.nfproto()))
            .encode()
            .push_table_bytes(NAT_TABLE.as_bytes())
            .push_name_bytes(chain.name.as_bytes())
            .nested_hook()
            .push_num(chain.hook)
            .push_priority(chain.priority)
            .end_nested()
            .push_type_bytes(b"nat");
    }

    fn add_regular_chain(&mut self, family: Family, name: &str) {
        self.chained
            .request()
            .set_create()
            .op_newchain_do(&header(family.nfproto()))
            .encode()
            .push_table_bytes(NAT_TABLE.as_bytes())
            .push_name_bytes(name.as_bytes());
    }

    /// Adds an anonymous constant set (`{ a, b }`) and returns its batch-local id.
    fn add_anonymous_set(&mut self, family: Family, key_type: u32, elements: &[Vec<u8>]) -> u32 {
        self.next_set_id += 1;
        let id = self.next_set_id;
        let key_len = elements.first().map_or(0, Vec::len) as u32;
        self.chained
            .request()
            .set_create()
            .op_newset_do(&header(family.nfproto()))
            .encode()
            .push_table_bytes(NAT_TABLE.as_bytes())
            .push_name_bytes(ANONYMOUS_SET_NAME)
            .push_flags(NFT_SET_ANONYMOUS | NFT_SET_CONSTANT)
            .push_key_type(key_type)
            .push_key_len(key_len)
            .push_id(be32_for_ne_pusher(id));
        let mut list = self
            .chained
            .request()
            .set_create()
            .op_newsetelem_do(&header(family.nfproto()))
            .into_encoder()
            .push_table_bytes(NAT_TABLE.as_bytes())
            .push_set_bytes(ANONYMOUS_SET_NAME)
            .push_set_id(be32_for_ne_pusher(id))
            .nested_elements();
        for element in elements {
            list = list
                .nested_elem()
                .nested_key()
                .push_value(element)
                .end_nested()
                .end_nested();
        }
        list.end_nested();
        id
    }

    fn add_rule(&mut self, family: Family, rule: &Rule) {
        // Sets first: the rule's lookup refers to them by their batch-local id.
        let set_ids: Vec<Option<u32>> = rule
            .matches
            .iter()
            .map(|m| match m {
                Match::Saddr(_, addrs) | Match::Daddr(_, addrs) if addrs.len() > 1 => {
                    let key_type = match family {
                        Family::Ip => NFT_TYPE_IPADDR,
                        Family::Ip6 => NFT_TYPE_IP6ADDR,
                    };
                    let elements: Vec<Vec<u8>> = addrs.iter().map(|a| ip_bytes(*a)).collect();
                    Some(self.add_anonymous_set(family, key_type, &elements))
                }
                Match::Dport(_, ports) if ports.len() > 1 => {
                    let elements: Vec<Vec<u8>> =
                        ports.iter().map(|p| p.to_be_bytes().to_vec()).collect();
                    Some(self.add_anonymous_set(family, NFT_TYPE_INET_SERVICE, &elements))
                }
                _ => None,
            })
            .collect();

        let mut exprs: PushExprs<'_> = self
            .chained
            .request()
            .set_append()
            .set_create()
            .op_newrule_do(&header(family.nfproto()))
            .into_encoder()
            .push_table_bytes(NAT_TABLE.as_bytes())
            .push_chain_bytes(rule.chain.as_bytes())
            .nested_expressions();
        for (m, set_id) in rule.matches.iter().zip(set_ids) {
            let (saddr_offset, daddr_offset, addr_len) = family.addr_layout();
            exprs = match m {
                Match::IifName(name) => match_ifname(exprs, MetaKeys::Iifname, name),
                Match::OifName(name) => match_ifname(exprs, MetaKeys::Oifname, name),
                Match::Saddr(_, addrs) | Match::Daddr(_, addrs) => {
                    let offset = if matches!(m, Match::Saddr(..)) {
                        saddr_offset
                    } else {
                        daddr_offset
                    };
                    let exprs = load_payload(exprs, PayloadBase::NetworkHeader, offset, addr_len);
                    match (set_id, addrs.first()) {
                        (Some(id), _) => lookup(exprs, id),
                        (None, Some(addr)) => cmp_eq(exprs, &ip_bytes(*addr)),
                        // An empty set matches nothing; rules() never builds one.
                        (None, None) => exprs,
                    }
                }
                Match::Dport(proto, ports) => {
                    let exprs = match_meta(exprs, MetaKeys::L4Proto, &[proto.number()]);
                    // The destination port is bytes 2..4 of both the TCP and the UDP header.
                    let exprs = load_payload(exprs, PayloadBase::TransportHeader, 2, 2);
                    match (set_id, ports.first()) {
                        (Some(id), _) => lookup(exprs, id),
                        (None, Some(port)) => cmp_eq(exprs, &port.to_be_bytes()),
                        (None, None) => exprs,
                    }
                }
            };
        }
        exprs = counter(exprs);
        exprs = match &rule.action {
            // Masquerade is a bare expression: the kernel picks the outgoing address.
            Action::Masquerade => exprs.nested_elem().push_name(c"masq").end_nested(),
            Action::Jump(chain) => verdict(exprs, VerdictCode::Jump, Some(chain)),
            Action::Return => verdict(exprs, VerdictCode::Return, None),
            Action::Dnat(to) => nat(exprs, family, NFT_NAT_DNAT, *to),
            Action::Snat(to) => nat(exprs, family, NFT_NAT_SNAT, *to),
        };
        // Dropping the encoder closes the nested attributes and the message.
        drop(exprs);
    }

    fn commit(mut self) -> Result<(), NftError> {
        let mut h = Nfgenmsg::new();
        h.set_res_id(NFNL_SUBSYS_NFTABLES);
        self.chained.request().op_batch_end_do(&h);
        let chained = self.chained.finalize();
        let mut replies = self
            .sock
            .request_chained(&chained)
            .map_err(|e| NftError::Batch(format!("cannot send: {e}")))?;
        replies.recv_all().map_err(|e| {
            let detail = match e.as_io_error().raw_os_error() {
                Some(libc::ERESTART) => " (the ruleset changed during the batch; retry)".into(),
                _ => e
                    .ext_ack()
                    .and_then(|ack| ack.get_msg().ok().map(|m| format!(" ({m:?})")))
                    .unwrap_or_default(),
            };
            NftError::Batch(format!("{e}{detail}"))
        })
    }
}

fn ip_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

fn cmp_eq<'a>(exprs: PushExprs<'a>, value: &[u8]) -> PushExprs<'a> {
    exprs
        .nested_elem()
        .nested_data_cmp()
        .push_sreg(Registers::Reg1 as u32)
        .push_op(CmpOps::Eq as u32)
        .nested_data()
        .push_value(value)
        .end_nested()
        .end_nested()
        .end_nested()
}

fn match_meta<'a>(exprs: PushExprs<'a>, key: MetaKeys, value: &[u8]) -> PushExprs<'a> {
    let exprs = exprs
        .nested_elem()
        .nested_data_meta()
        .push_dreg(Registers::Reg1 as u32)
        .push_key(key as u32)
        .end_nested()
        .end_nested();
    cmp_eq(exprs, value)
}

fn match_ifname<'a>(exprs: PushExprs<'a>, key: MetaKeys, name: &str) -> PushExprs<'a> {
    // nft compares interface names as the full IFNAMSIZ buffer, NUL-padded.
    let mut padded = [0u8; IFNAMSIZ];
    let len = name.len().min(IFNAMSIZ - 1);
    padded[..len].copy_from_slice(&name.as_bytes()[..len]);
    match_meta(exprs, key, &padded)
}

fn load_payload(exprs: PushExprs<'_>, base: PayloadBase, offset: u32, len: u32) -> PushExprs<'_> {
    exprs
        .nested_elem()
        .nested_data_payload()
        .push_dreg(Registers::Reg1 as u32)
        .push_base(base as u32)
        .push_offset(offset)
        .push_len(len)
        .end_nested()
        .end_nested()
}

/// The kernel reads every set id attribute as big-endian, but netlink-bindings 0.3.5
/// writes `NFTA_SET_ID` and `NFTA_SET_ELEM_LIST_SET_ID` in native order (its spec lacks the
/// byte order) while it writes `NFTA_LOOKUP_SET_ID` big-endian. Pre-swapping the value for
/// the two native-order pushers makes all three carry the same bytes.
fn be32_for_ne_pusher(value: u32) -> u32 {
    u32::from_ne_bytes(value.to_be_bytes())
}

/// Attribute numbers of the `lookup` expression (`enum nft_lookup_attributes`).
/// netlink-bindings 0.3.5 numbers them wrongly (its `set-id` is 2, `sreg` 3, the kernel's
/// are 4 and 2), so only the set name goes through the crate and the rest is written here.
const NFTA_LOOKUP_SREG: u16 = 2;
const NFTA_LOOKUP_SET_ID: u16 = 4;

fn push_be32_attr(pusher: &mut impl Pusher, kind: u16, value: u32) {
    let buf = pusher.as_vec_mut();
    push_header(buf, kind, 4);
    buf.extend_from_slice(&value.to_be_bytes());
}

fn lookup(exprs: PushExprs<'_>, set_id: u32) -> PushExprs<'_> {
    let mut attrs = exprs
        .nested_elem()
        .nested_data_lookup()
        .push_set_bytes(ANONYMOUS_SET_NAME);
    push_be32_attr(&mut attrs, NFTA_LOOKUP_SREG, Registers::Reg1 as u32);
    push_be32_attr(&mut attrs, NFTA_LOOKUP_SET_ID, set_id);
    attrs.end_nested().end_nested()
}

fn counter(exprs: PushExprs<'_>) -> PushExprs<'_> {
    exprs
        .nested_elem()
        .nested_data_counter()
        .push_bytes(0)
        .push_packets(0)
        .end_nested()
        .end_nested()
}

fn verdict<'a>(exprs: PushExprs<'a>, code: VerdictCode, chain: Option<&str>) -> PushExprs<'a> {
    let v = exprs
        .nested_elem()
        .nested_data_immediate()
        .push_dreg(Registers::RegVerdict as u32)
        .nested_data()
        .nested_verdict()
        .push_code(code as u32);
    let v = match chain {
        Some(chain) => v.push_chain_bytes(chain.as_bytes()),
        None => v,
    };
    v.end_nested().end_nested().end_nested().end_nested()
}

fn nat<'a>(exprs: PushExprs<'a>, family: Family, kind: u32, to: IpAddr) -> PushExprs<'a> {
    exprs
        .nested_elem()
        .nested_data_immediate()
        .push_dreg(Registers::Reg1 as u32)
        .nested_data()
        .push_value(&ip_bytes(to))
        .end_nested()
        .end_nested()
        .end_nested()
        .nested_elem()
        .nested_data_nat()
        .push_type(kind)
        .push_family(u32::from(family.nfproto()))
        .push_reg_addr_min(Registers::Reg1 as u32)
        .end_nested()
        .end_nested()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v4_ruleset(ports: Vec<Port>, istio: bool, migration_over_unix: bool) -> NatRuleset {
        NatRuleset {
            family: Family::Ip,
            pod_iface: "eth0".into(),
            bridge: "k6t-eth0".into(),
            gateway: "10.0.2.1".parse().unwrap(),
            guest: "10.0.2.2".parse().unwrap(),
            pod_ip: Some("10.244.0.7".parse().unwrap()),
            ports,
            istio,
            migration_over_unix,
        }
    }

    fn printed(rules: &NatRuleset) -> Vec<String> {
        rules.rules().iter().map(|r| r.to_string()).collect()
    }

    #[test]
    fn no_ports_forwards_everything_like_kubevirt() {
        assert_eq!(
            printed(&v4_ruleset(vec![], false, false)),
            vec![
                "postrouting ip saddr 10.0.2.2 counter masquerade",
                "prerouting iifname eth0 counter jump KUBEVIRT_PREINBOUND",
                "postrouting oifname k6t-eth0 counter jump KUBEVIRT_POSTINBOUND",
                "output tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter return",
                "KUBEVIRT_POSTINBOUND tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter return",
                "KUBEVIRT_PREINBOUND counter dnat to 10.0.2.2",
                "KUBEVIRT_POSTINBOUND ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
                "output ip daddr { 127.0.0.1 } counter dnat to 10.0.2.2",
            ]
        );
    }

    #[test]
    fn declared_ports_are_forwarded_one_by_one() {
        let ports = vec![
            Port {
                number: 80,
                protocol: L4Proto::Tcp,
            },
            Port {
                number: 53,
                protocol: L4Proto::Udp,
            },
        ];
        assert_eq!(
            printed(&v4_ruleset(ports, false, true))[3..],
            [
                "KUBEVIRT_PREINBOUND tcp dport { 80 } counter dnat to 10.0.2.2",
                "KUBEVIRT_POSTINBOUND tcp dport 80 ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
                "output ip daddr { 127.0.0.1 } tcp dport 80 counter dnat to 10.0.2.2",
                "KUBEVIRT_PREINBOUND udp dport { 53 } counter dnat to 10.0.2.2",
                "KUBEVIRT_POSTINBOUND udp dport 53 ip saddr { 127.0.0.1 } counter snat to 10.0.2.1",
                "output ip daddr { 127.0.0.1 } udp dport 53 counter dnat to 10.0.2.2",
            ]
        );
    }

    #[test]
    fn istio_keeps_reserved_ports_and_forwards_only_ssh() {
        let rules = printed(&v4_ruleset(vec![], true, true));
        assert_eq!(
            rules[3],
            "output tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip saddr 127.0.0.1 counter return"
        );
        assert_eq!(
            rules[5],
            "KUBEVIRT_PREINBOUND tcp dport { 22 } counter dnat to 10.0.2.2"
        );
        assert_eq!(
            rules[6],
            "KUBEVIRT_POSTINBOUND ip saddr { 127.0.0.1, 127.0.0.6 } counter snat to 10.0.2.1"
        );
        assert_eq!(
            rules[7],
            "output ip daddr { 127.0.0.1, 10.244.0.7 } counter dnat to 10.0.2.2"
        );
        assert_eq!(rules.len(), 8);
    }

    #[test]
    fn ipv6_uses_ip6_loopback_and_no_istio_pod_ip() {
        let mut set = v4_ruleset(vec![], true, true);
        set.family = Family::Ip6;
        set.gateway = "fd10:0:2::1".parse().unwrap();
        set.guest = "fd10:0:2::2".parse().unwrap();
        let rules = printed(&set);
        assert_eq!(
            rules[0],
            "postrouting ip6 saddr fd10:0:2::2 counter masquerade"
        );
        assert_eq!(
            rules[rules.len() - 1],
            "output ip6 daddr { ::1 } counter dnat to fd10:0:2::2"
        );
    }
}
