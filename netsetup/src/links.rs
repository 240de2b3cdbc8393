//! Links and addresses of the current network namespace, through rtnetlink.
//!
//! Thin async helpers over the `rtnetlink` crate that return plain structs, so the
//! masquerade logic can inspect and compare state without netlink types.

use std::net::IpAddr;

use futures::TryStreamExt;
use rtnetlink::Handle;
use rtnetlink::packet_core::{DefaultNla, Nla};
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::{AddressAttribute, AddressMessage, AddressScope};
use rtnetlink::packet_route::link::{
    InfoData, InfoKind, InfoTun, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
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

/// Creates a bridge with a fixed MAC and MTU (down) and returns its index.
pub async fn create_bridge(
    handle: &Handle,
    name: &str,
    mac: [u8; 6],
    mtu: u32,
) -> Result<u32, LinkError> {
    let message = rtnetlink::LinkBridge::new(name)
        .address(mac.to_vec())
        .mtu(mtu)
        .build();
    handle
        .link()
        .add(message)
        .execute()
        .await
        .map_err(LinkError::new(format!("cannot create bridge {name}")))?;
    link_by_name(handle, name)
        .await?
        .map(|l| l.index)
        .ok_or_else(|| LinkError {
            what: format!("bridge {name} vanished right after creation"),
            source: rtnetlink::Error::RequestFailed,
        })
}

/// Sets MTU, controller (bridge), MAC, alias and state of an existing link in one request.
#[derive(Debug, Default, Clone)]
pub struct LinkChange {
    pub mtu: Option<u32>,
    pub controller: Option<u32>,
    pub mac: Option<[u8; 6]>,
    pub alias: Option<String>,
    pub up: bool,
}

pub async fn change_link(handle: &Handle, index: u32, change: LinkChange) -> Result<(), LinkError> {
    let mut builder = rtnetlink::LinkUnspec::new_with_index(index);
    if let Some(mtu) = change.mtu {
        builder = builder.mtu(mtu);
    }
    if let Some(controller) = change.controller {
        builder = builder.controller(controller);
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
    handle
        .link()
        .set(builder.build())
        .execute()
        .await
        .map_err(LinkError::new(format!("cannot configure link #{index}")))
}

pub async fn delete_link(handle: &Handle, index: u32) -> Result<(), LinkError> {
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

/// Whether `link` is of the given kind (`bridge`, `tun`...).
pub fn is_kind(link: &LinkState, kind: InfoKind) -> bool {
    link.kind.as_deref() == Some(kind.to_string().as_str())
}
