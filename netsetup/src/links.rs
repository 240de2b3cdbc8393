//! Links and addresses of the current network namespace, through rtnetlink.
//!
//! Thin async helpers over the `rtnetlink` crate that return plain structs, so the
//! bindings can inspect and compare state without netlink types.

use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_core::{DefaultNla, Nla};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoTun, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};

/// Netlink attribute numbers inside `IFLA_INFO_DATA` of a tun/tap link (linux/if_link.h).
const IFLA_TUN_OWNER: u16 = 1;
const IFLA_TUN_GROUP: u16 = 2;
const IFLA_TUN_TYPE: u16 = 3;
const IFLA_TUN_PERSIST: u16 = 6;

#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct LinkError {
    pub what: String,
    #[source]
    pub source: rtnetlink::Error,
}

impl LinkError {
    fn new(what: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> LinkError {
        let what = what.into();
        move |source| LinkError { what, source }
    }
}

/// What a tun/tap link reports about itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TunState {
    pub is_tap: bool,
    pub persistent: bool,
    pub owner: Option<u32>,
    pub group: Option<u32>,
}

/// A link as the masquerade logic needs to see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkState {
    pub index: u32,
    pub name: String,
    /// `bridge`, `tun`, `veth`... (`None` for devices without a kind, like `lo`).
    pub kind: Option<String>,
    pub mtu: u32,
    pub mac: Option<Vec<u8>>,
    /// Index of the bridge this link is attached to.
    pub controller: Option<u32>,
    pub up: bool,
    pub alias: Option<String>,
    pub tun: Option<TunState>,
}

/// An address on a link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrState {
    pub link_index: u32,
    pub addr: IpAddr,
    pub prefix_len: u8,
    /// Global (universe scope), as opposed to link-local or host.
    pub global: bool,
}

/// All links of the namespace.
pub async fn links(handle: &Handle) -> Result<Vec<LinkState>, LinkError> {
    let messages: Vec<LinkMessage> = handle
        .link()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(LinkError::new("cannot list links"))?;
    Ok(messages.iter().map(link_state).collect())
}

/// The link called `name`, if any.
pub async fn link_by_name(handle: &Handle, name: &str) -> Result<Option<LinkState>, LinkError> {
    Ok(links(handle).await?.into_iter().find(|l| l.name == name))
}

fn link_state(msg: &LinkMessage) -> LinkState {
    let mut state = LinkState {
        index: msg.header.index,
        name: String::new(),
        kind: None,
        mtu: 0,
        mac: None,
        controller: None,
        up: msg.header.flags.contains(LinkFlags::Up),
        alias: None,
        tun: None,
    };
    for attr in &msg.attributes {
        match attr {
            LinkAttribute::IfName(name) => state.name = name.clone(),
            LinkAttribute::Mtu(mtu) => state.mtu = *mtu,
            LinkAttribute::Address(mac) => state.mac = Some(mac.clone()),
            LinkAttribute::Controller(index) => state.controller = Some(*index),
            LinkAttribute::IfAlias(alias) => state.alias = Some(alias.clone()),
            LinkAttribute::LinkInfo(infos) => {
                for info in infos {
                    match info {
                        LinkInfo::Kind(kind) => state.kind = Some(kind.to_string()),
                        LinkInfo::Data(InfoData::Tun(attrs)) => state.tun = Some(tun_state(attrs)),
                        _ => {}
                    }
                }
            }
            _ => {}
        }
    }
    state
}

fn nla_value(nla: &DefaultNla) -> Vec<u8> {
    let mut value = vec![0u8; nla.value_len()];
    nla.emit_value(&mut value);
    value
}

fn tun_state(attrs: &[InfoTun]) -> TunState {
    let mut state = TunState::default();
    for attr in attrs {
        // The crate does not decode tun attributes; everything arrives as `Other`.
        let InfoTun::Other(nla) = attr else { continue };
        let value = nla_value(nla);
        let as_u32 = || {
            value
                .get(..4)
                .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        };
        match nla.kind() {
            IFLA_TUN_OWNER => state.owner = as_u32(),
            IFLA_TUN_GROUP => state.group = as_u32(),
            IFLA_TUN_TYPE => state.is_tap = value.first() == Some(&(libc::IFF_TAP as u8)),
            IFLA_TUN_PERSIST => state.persistent = value.first() == Some(&1),
            _ => {}
        }
    }
    state
}

/// All addresses of the namespace.
pub async fn addresses(handle: &Handle) -> Result<Vec<AddrState>, LinkError> {
    let messages: Vec<AddressMessage> = handle
        .address()
        .get()
        .execute()
        .try_collect()
        .await
        .map_err(LinkError::new("cannot list addresses"))?;
    Ok(messages.iter().filter_map(addr_state).collect())
}

fn addr_state(msg: &AddressMessage) -> Option<AddrState> {
    // IPv4 carries the interface's own address in IFA_LOCAL (IFA_ADDRESS is the peer on
    // point-to-point links); IPv6 only has IFA_ADDRESS.
    let mut local = None;
    let mut address = None;
    for attr in &msg.attributes {
        match attr {
            AddressAttribute::Local(ip) => local = Some(*ip),
            AddressAttribute::Address(ip) => address = Some(*ip),
            _ => {}
        }
    }
    let addr = if msg.header.family == AddressFamily::Inet {
        local.or(address)
    } else {
        address.or(local)
    }?;
    Some(AddrState {
        link_index: msg.header.index,
        addr,
        prefix_len: msg.header.prefix_len,
        global: msg.header.scope == AddressScope::Universe,
    })
}

/// Creates a bridge (down) and returns its index. Without `mac` the kernel picks a
/// random one; without `mtu` the bridge follows its ports' smallest MTU.
pub async fn create_bridge(
    handle: &Handle,
    name: &str,
    mac: Option<[u8; 6]>,
    mtu: Option<u32>,
) -> Result<u32, LinkError> {
    let mut builder = rtnetlink::LinkBridge::new(name);
    if let Some(mac) = mac {
        builder = builder.address(mac.to_vec());
    }
    if let Some(mtu) = mtu {
        builder = builder.mtu(mtu);
    }
    handle
        .link()
        .add(builder.build())
        .execute()
        .await
        .map_err(LinkError::new(format!("cannot create bridge {name}")))?;
    created_index(handle, name).await
}

/// Creates a link of a kind that needs no parent and carries no traffic while down
/// (`dummy`, `ifb`), with a MAC, MTU and alias, and returns its index.
pub(crate) async fn create_inert_link(
    handle: &Handle,
    name: &str,
    kind: InfoKind,
    mac: [u8; 6],
    mtu: u32,
    alias: &str,
) -> Result<u32, LinkError> {
    let message =
        rtnetlink::LinkMessageBuilder::<rtnetlink::LinkUnspec>::new_with_info_kind(kind.clone())
            .name(name.to_string())
            .address(mac.to_vec())
            .mtu(mtu)
            .build();
    handle
        .link()
        .add(message)
        .execute()
        .await
        .map_err(LinkError::new(format!("cannot create {kind} link {name}")))?;
    let index = created_index(handle, name).await?;
    // The kernel ignores IFLA_IFALIAS when it creates a link.
    change_link(
        handle,
        index,
        LinkChange {
            alias: Some(alias.to_string()),
            ..Default::default()
        },
    )
    .await?;
    Ok(index)
}

/// Whether the kernel refused a request as unsupported (`EOPNOTSUPP`), e.g. a link kind
/// whose driver it was built without.
pub(crate) fn is_unsupported(err: &LinkError) -> bool {
    matches!(&err.source, rtnetlink::Error::NetlinkError(msg)
        if msg.code.is_some_and(|c| c.get() == -libc::EOPNOTSUPP))
}

async fn created_index(handle: &Handle, name: &str) -> Result<u32, LinkError> {
    link_by_name(handle, name)
        .await?
        .map(|l| l.index)
        .ok_or_else(|| LinkError {
            what: format!("link {name} vanished right after creation"),
            source: rtnetlink::Error::RequestFailed,
        })
}

/// Changes an existing link in one request; `None`/`false` leaves a property alone.
#[derive(Debug, Default, Clone)]
pub struct LinkChange {
    pub name: Option<String>,
    pub mtu: Option<u32>,
    pub controller: Option<u32>,
    /// Detach the link from its bridge.
    pub no_controller: bool,
    pub mac: Option<[u8; 6]>,
    pub alias: Option<String>,
    pub up: bool,
    pub down: bool,
}

pub async fn change_link(handle: &Handle, index: u32, change: LinkChange) -> Result<(), LinkError> {
    let mut builder = rtnetlink::LinkUnspec::new_with_index(index);
    if let Some(name) = change.name {
        builder = builder.name(name);
    }
    if let Some(mtu) = change.mtu {
        builder = builder.mtu(mtu);
    }
    if let Some(controller) = change.controller {
        builder = builder.controller(controller);
    }
    if change.no_controller {
        builder = builder.nocontroller();
    }
    if let Some(mac) = change.mac {
        builder = builder.address(mac.to_vec());
    }
    if let Some(alias) = change.alias {
        builder = builder.alias(alias);
    }
    if change.up {
        builder = builder.up();
    }
    if change.down {
        builder = builder.down();
    }
    handle
        .link()
        .set(builder.build())
        .execute()
        .await
        .map_err(LinkError::new(format!("cannot configure link #{index}")))
}

pub(crate) async fn delete_link(handle: &Handle, index: u32) -> Result<(), LinkError> {
    handle
        .link()
        .del(index)
        .execute()
        .await
        .map_err(LinkError::new(format!("cannot delete link #{index}")))
}

pub async fn add_address(
    handle: &Handle,
    index: u32,
    addr: IpAddr,
    prefix_len: u8,
) -> Result<(), LinkError> {
    handle
        .address()
        .add(index, addr, prefix_len)
        .execute()
        .await
        .map_err(LinkError::new(format!(
            "cannot add {addr}/{prefix_len} to link #{index}"
        )))
}

/// Removes every address of link `index` for which `pick` is true.
pub(crate) async fn delete_addresses(
    handle: &Handle,
    index: u32,
    pick: impl Fn(&AddrState) -> bool,
) -> Result<(), LinkError> {
    let messages: Vec<AddressMessage> = handle
        .address()
        .get()
        .set_link_index_filter(index)
        .execute()
        .try_collect()
        .await
        .map_err(LinkError::new(format!(
            "cannot list addresses of link #{index}"
        )))?;
    for msg in messages {
        if addr_state(&msg).is_some_and(|a| a.link_index == index && pick(&a)) {
            handle
                .address()
                .del(msg)
                .execute()
                .await
                .map_err(LinkError::new(format!(
                    "cannot remove an address of link #{index}"
                )))?;
        }
    }
    Ok(())
}

/// Turns MAC learning of bridge port `index` on or off
/// (`ip link set DEV type bridge_slave learning on|off`).
pub(crate) async fn set_port_learning(
    handle: &Handle,
    index: u32,
    on: bool,
) -> Result<(), LinkError> {
    // RTM_NEWLINK on the existing link, as `ip link set` sends it: the kernel hands the
    // port ("slave") data to the bridge. Without NLM_F_EXCL (the link exists) and without
    // NLM_F_REPLACE, which the kernel refuses for an existing link.
    handle
        .link()
        .add(rtnetlink::LinkBridgePort::new(index).learning(on).build())
        .set_flags(rtnetlink::packet_core::NLM_F_REQUEST | rtnetlink::packet_core::NLM_F_ACK)
        .execute()
        .await
        .map_err(LinkError::new(format!(
            "cannot set learning on bridge port #{index}"
        )))
}

/// A unicast route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RouteState {
    /// Destination network (the network address) and prefix length; `/0` is the default.
    pub dst: IpAddr,
    pub prefix_len: u8,
    /// Next hop; `None` for a route on the link itself.
    pub gateway: Option<IpAddr>,
    /// Outgoing link.
    pub oif: u32,
    /// Who made it (`RTPROT_*`: 2 kernel, 3 boot, 4 static...).
    pub protocol: u8,
    /// Metric; 0 when the kernel reports none.
    pub priority: u32,
}

/// `RTPROT_KERNEL`: routes the kernel derives from addresses (and makes again with them).
pub(crate) const RTPROT_KERNEL: u8 = 2;

/// The unicast routes of the main table that leave through link `oif`, IPv4 first, each
/// family in the kernel's dump order (what `ip route show dev X` lists).
pub(crate) async fn routes_via(handle: &Handle, oif: u32) -> Result<Vec<RouteState>, LinkError> {
    let mut out = Vec::new();
    let queries = [
        rtnetlink::RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
        rtnetlink::RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
    ];
    for query in queries {
        let messages: Vec<RouteMessage> = handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(LinkError::new("cannot list routes"))?;
        out.extend(
            messages
                .iter()
                .filter_map(route_state)
                .filter(|r| r.oif == oif),
        );
    }
    Ok(out)
}

fn route_state(msg: &RouteMessage) -> Option<RouteState> {
    let header = &msg.header;
    let table = msg
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Table(t) => Some(*t),
            _ => None,
        })
        .unwrap_or(u32::from(header.table));
    if table != u32::from(RouteHeader::RT_TABLE_MAIN) || header.kind != RouteType::Unicast {
        return None;
    }
    let ip = |a: &RouteAddress| match a {
        RouteAddress::Inet(v4) => Some(IpAddr::V4(*v4)),
        RouteAddress::Inet6(v6) => Some(IpAddr::V6(*v6)),
        _ => None,
    };
    let mut dst = None;
    let mut gateway = None;
    let mut oif = None;
    let mut priority = 0;
    for attr in &msg.attributes {
        match attr {
            RouteAttribute::Destination(a) => dst = ip(a),
            RouteAttribute::Gateway(a) => gateway = ip(a),
            RouteAttribute::Oif(i) => oif = Some(*i),
            RouteAttribute::Priority(p) => priority = *p,
            _ => {}
        }
    }
    let dst = match (dst, header.address_family) {
        (Some(d), _) => d,
        (None, AddressFamily::Inet) => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
        (None, AddressFamily::Inet6) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
        _ => return None,
    };
    Some(RouteState {
        dst,
        prefix_len: header.destination_prefix_length,
        gateway,
        // Multipath routes have no single outgoing link: never "through" one link.
        oif: oif?,
        protocol: u8::from(header.protocol),
        priority,
    })
}

/// Adds `route` to the main table (scope link when it has no gateway).
pub(crate) async fn add_route(handle: &Handle, route: &RouteState) -> Result<(), LinkError> {
    let mut message = rtnetlink::RouteMessageBuilder::<IpAddr>::new().build();
    message.header.address_family = if route.dst.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    message.header.destination_prefix_length = route.prefix_len;
    message.header.protocol = RouteProtocol::from(route.protocol);
    message.header.scope = if route.gateway.is_some() {
        RouteScope::Universe
    } else {
        RouteScope::Link
    };
    if route.prefix_len > 0 {
        message
            .attributes
            .push(RouteAttribute::Destination(route.dst.into()));
    }
    if let Some(gw) = route.gateway {
        message.attributes.push(RouteAttribute::Gateway(gw.into()));
    }
    message.attributes.push(RouteAttribute::Oif(route.oif));
    if route.priority > 0 {
        message
            .attributes
            .push(RouteAttribute::Priority(route.priority));
    }
    handle
        .route()
        .add(message)
        .execute()
        .await
        .map_err(LinkError::new(format!(
            "cannot add route {}/{} via {:?}",
            route.dst, route.prefix_len, route.gateway
        )))
}

/// Whether `link` is of the given kind (`bridge`, `tun`...).
pub(crate) fn is_kind(link: &LinkState, kind: InfoKind) -> bool {
    link.kind.as_deref() == Some(kind.to_string().as_str())
}
