//! The handler's phase 1 of KubeVirt's bridge binding, the cluster's default binding for
//! the pod network (v1.9.0 `pkg/network/setup/netpod/netpod.go` `bridgeBindingSpec`,
//! `discoverbridge.go`), as one operation in the pod's network namespace:
//!
//! - the pod interface `eth0` becomes `eth0-nic`: it loses its addresses, takes the
//!   bridge's MAC (the guest will use the pod's), stops learning MACs and becomes a
//!   port of the bridge `k6t-eth0`;
//! - a dummy `eth0`, left down, takes the pod interface's MAC, MTU and addresses: the
//!   pod IP stays a local address of the pod, where tools looking for `eth0` find it
//!   (on a kernel without the dummy driver, an `ifb` link, equally inert, stands in);
//! - the bridge gets the fake address `169.254.75.1<i>/32` (the DHCP server's identity)
//!   and `net/ipv4/conf/all/arp_ignore=1`, so the pod never answers ARP for the pod IP
//!   it keeps: the guest does;
//! - the tap `tap0` joins the bridge.
//!
//! The guest then owns the pod's IP and MAC on the pod network. What the launcher's
//! DHCP server tells it (address, gateway, routes, the guest MAC it may serve) comes
//! back as KubeVirt's `cache.DHCPConfig`, for the handler to write into the pod. As in
//! KubeVirt, there is no DHCPv6: the pod's IPv6 addresses go to the dummy and the
//! guest gets none from the pod side.
//!
//! [`setup`] converges like the masquerade set-up: its bridge (alias `netsetup-bridge:`),
//! its dummy (alias `netsetup-pod:`) and the tap are recognised and reused, so a rerun
//! after success, or after a run that was stopped after the dummy existed, ends in the
//! same state; anything else in the way is a clash and nothing is touched. A failing run
//! undoes what it changed, including the pod interface's name, MAC, addresses and
//! routes. The pod interface's routes (which vanish when it goes down) are kept in the
//! dummy's alias, so a rerun and [`teardown`] find them without a file; [`teardown`]
//! gives `eth0` back to the pod as it was.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use proto::contract::dhcp_cache::{DhcpConfig as DhcpCache, NetlinkAddr, NetlinkRoute};
use proto::contract::pod_network::{
    FAKE_BRIDGE_IP_PREFIX_LEN, PRIMARY_POD_IFACE, PRIMARY_TAP, bridge_name, bridged_pod_iface_name,
    fake_bridge_ip,
};
use rtnetlink::Handle;
use rtnetlink::packet_route::link::InfoKind;

use crate::binding::{
    self, BindingError, Journal, Step, TapSpec, alias_record, in_netns, parse_alias_record,
    valid_ifname,
};
use crate::links::{self, AddrState, LinkChange, LinkState, RTPROT_KERNEL, RouteState};
use crate::masquerade::NON_ROOT_UID;
use crate::netns::NetnsTarget;
use crate::sysctl;

/// The bridge's alias starts with this; the rest records the sysctl set-up changes.
const BRIDGE_ALIAS_PREFIX: &str = "netsetup-bridge:";
/// The sysctls the bridge's alias may record.
const RECORDED_SYSCTLS: [&str; 1] = [sysctl::ARP_IGNORE_ALL];
/// The dummy's alias starts with this; the rest records the pod interface's routes.
const DUMMY_ALIAS_PREFIX: &str = "netsetup-pod:";
/// Longest alias the kernel keeps (`IFALIASZ` - 1).
const MAX_ALIAS_LEN: usize = 255;

/// What to build in the pod's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BridgeConfig {
    pub netns: NetnsTarget,
    /// The pod interface (`eth0`).
    pub iface: String,
    /// The tap the VMM opens (`tap0`).
    pub tap_name: String,
    pub tap_owner_uid: u32,
    pub tap_owner_gid: u32,
    /// Position of the VMI's interface in `spec.domain.devices.interfaces`: picks the
    /// bridge's fake address `169.254.75.1<index>`.
    pub iface_index: usize,
    /// The guest's MAC when the VMI names one (`macAddress`, else the one in its status);
    /// `None`: the pod interface's MAC.
    pub guest_mac: Option<[u8; 6]>,
}

impl BridgeConfig {
    /// KubeVirt's defaults for the primary pod network of a non-root VMI.
    pub fn new(netns: NetnsTarget) -> Self {
        BridgeConfig {
            netns,
            iface: PRIMARY_POD_IFACE.into(),
            tap_name: PRIMARY_TAP.into(),
            tap_owner_uid: NON_ROOT_UID,
            tap_owner_gid: NON_ROOT_UID,
            iface_index: 0,
            guest_mac: None,
        }
    }

    /// `k6t-<iface>`.
    pub fn bridge_name(&self) -> String {
        bridge_name(&self.iface)
    }

    /// The pod interface's name once bridged: `<iface>-nic`.
    pub(crate) fn nic_name(&self) -> String {
        bridged_pod_iface_name(&self.iface)
    }

    fn tap_spec(&self) -> TapSpec<'_> {
        TapSpec {
            name: &self.tap_name,
            owner_uid: self.tap_owner_uid,
            owner_gid: self.tap_owner_gid,
        }
    }

    /// Checks the inputs alone, before touching the namespace.
    pub fn validate(&self) -> Result<(), BindingError> {
        let invalid = |msg: String| Err(BindingError::InvalidConfig(msg));
        for (what, name) in [
            ("interface", &self.iface),
            ("tap", &self.tap_name),
            ("bridge", &self.bridge_name()),
            ("bridged interface", &self.nic_name()),
        ] {
            if !valid_ifname(name) {
                return invalid(format!(
                    "{what} name {name:?} is not a valid interface name (1-15 bytes, no '/', ':' or spaces)"
                ));
            }
        }
        if [self.iface.clone(), self.bridge_name(), self.nic_name()].contains(&self.tap_name) {
            return invalid(format!(
                "tap name {:?} collides with the pod interface or the bridge",
                self.tap_name
            ));
        }
        if fake_bridge_ip(self.iface_index).is_none() {
            return invalid(format!(
                "interface index {} has no bridge address 169.254.75.1<index> (at most 99)",
                self.iface_index
            ));
        }
        if self.guest_mac.is_some_and(|m| m[0] & 1 == 1) {
            return invalid("the guest MAC is a multicast address".into());
        }
        Ok(())
    }
}

/// What [`setup`] built, for the caller's records.
#[derive(Debug, Clone, PartialEq)]
pub struct BridgeOutcome {
    pub bridge: String,
    pub tap: String,
    /// The bridged pod interface (`eth0-nic`).
    pub nic: String,
    pub mtu: u32,
    /// The pod interface's original MAC (now the dummy's).
    pub pod_mac: [u8; 6],
    pub pod_ipv4: Option<Ipv4Addr>,
    /// The pod's IPv6 address; the guest does not get it (no DHCPv6 for bridge).
    pub pod_ipv6: Option<Ipv6Addr>,
    /// KubeVirt's `cache.DHCPConfig` for `vif-cache-<iface>.json`.
    pub dhcp: DhcpCache,
}

/// Builds the bridge binding in the pod's namespace (see the module docs).
pub fn setup(config: &BridgeConfig) -> Result<BridgeOutcome, BindingError> {
    config.validate()?;
    let config = config.clone();
    binding::journaled(&config.netns.clone(), async move |handle, journal| {
        setup_here(&config, handle, journal).await
    })
}

/// Gives the pod interface back (name, MAC, addresses, routes), removes the tap, the
/// dummy and the bridge and restores `arp_ignore`. Refuses (with
/// [`BindingError::Clash`]) to delete links netsetup did not make.
pub fn teardown(config: &BridgeConfig) -> Result<(), BindingError> {
    config.validate()?;
    let config = config.clone();
    in_netns(&config.netns.clone(), move |handle| async move {
        teardown_here(&config, &handle).await
    })
}

/// The pod interface as it was before the binding: what the dummy keeps and a
/// teardown or rollback gives back.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PodIface {
    mac: [u8; 6],
    mtu: u32,
    /// Every address, IPv4 and IPv6, in the kernel's order.
    addrs: Vec<(IpAddr, u8)>,
    /// Its main-table routes (see [`route_record`] for which); `oif` is not kept.
    routes: Vec<RouteState>,
}

/// Where a namespace stands with respect to the binding.
enum Found<'a> {
    /// The pod interface is untouched.
    Fresh { pod: &'a LinkState },
    /// An earlier run moved it: the dummy holds its state, `nic` is the renamed link.
    Moved {
        dummy: &'a LinkState,
        nic: &'a LinkState,
    },
}

fn is_our_bridge(link: &LinkState) -> bool {
    links::is_kind(link, InfoKind::Bridge)
        && link
            .alias
            .as_deref()
            .is_some_and(|a| a.starts_with(BRIDGE_ALIAS_PREFIX))
}

fn is_our_dummy(link: &LinkState) -> bool {
    (links::is_kind(link, InfoKind::Dummy) || links::is_kind(link, InfoKind::Ifb))
        && link
            .alias
            .as_deref()
            .is_some_and(|a| a.starts_with(DUMMY_ALIAS_PREFIX))
}

fn find<'a>(
    config: &BridgeConfig,
    all_links: &'a [LinkState],
) -> Result<Option<Found<'a>>, BindingError> {
    let nic_name = config.nic_name();
    let named = |name: &str| all_links.iter().find(|l| l.name == name);
    match (named(&config.iface), named(&nic_name)) {
        (Some(dummy), Some(nic)) if is_our_dummy(dummy) => Ok(Some(Found::Moved { dummy, nic })),
        (Some(dummy), None) if is_our_dummy(dummy) => Err(BindingError::Clash(format!(
            "{} is netsetup's dummy but the bridged pod interface {nic_name} is gone",
            config.iface
        ))),
        (Some(_), Some(_)) => Err(BindingError::Clash(format!(
            "link {nic_name} exists next to the pod interface {}",
            config.iface
        ))),
        (Some(pod), None) => Ok(Some(Found::Fresh { pod })),
        (None, Some(_)) => Err(BindingError::Clash(format!(
            "{nic_name} exists without the dummy {} that keeps the pod's addresses: an \
             earlier set-up stopped half-way and the pod's network cannot be recovered",
            config.iface
        ))),
        (None, None) => Ok(None),
    }
}

fn mac_of(link: &LinkState) -> Result<[u8; 6], BindingError> {
    link.mac
        .as_deref()
        .and_then(|m| <[u8; 6]>::try_from(m).ok())
        .ok_or_else(|| {
            BindingError::Clash(format!("link {} has no Ethernet MAC address", link.name))
        })
}

/// Go's `net.IP.IsGlobalUnicast`, which KubeVirt uses to pick the pod IP.
fn is_global_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            !(v4.is_broadcast()
                || v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_multicast()
                || v4.is_link_local())
        }
        IpAddr::V6(v6) => {
            !(v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unicast_link_local())
        }
    }
}

fn is_v6_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local())
}

impl PodIface {
    fn first_global_v4(&self) -> Option<(Ipv4Addr, u8)> {
        self.addrs.iter().find_map(|(ip, len)| match ip {
            IpAddr::V4(v4) if is_global_unicast(*ip) => Some((*v4, *len)),
            _ => None,
        })
    }

    fn first_global_v6(&self) -> Option<Ipv6Addr> {
        self.addrs.iter().find_map(|(ip, _)| match ip {
            IpAddr::V6(v6) if is_global_unicast(*ip) => Some(*v6),
            _ => None,
        })
    }
}

fn addrs_of(all_addrs: &[AddrState], index: u32) -> Vec<(IpAddr, u8)> {
    all_addrs
        .iter()
        .filter(|a| a.link_index == index)
        .map(|a| (a.addr, a.prefix_len))
        .collect()
}

/// The routes the dummy's alias keeps: every IPv4 route (in the kernel's order, which
/// decides the gateway) and the IPv6 routes the kernel does not make by itself. IPv6
/// routes are dropped (with a warning; only a teardown needs them) when the record
/// would not fit an alias.
fn route_record(routes: &[RouteState], iface: &str) -> Result<String, BindingError> {
    let entry = |r: &RouteState| {
        let gw = r.gateway.map_or("-".to_string(), |g| g.to_string());
        format!(
            "{}/{},{gw},{},{}",
            r.dst, r.prefix_len, r.protocol, r.priority
        )
    };
    let v4: Vec<String> = routes
        .iter()
        .filter(|r| r.dst.is_ipv4())
        .map(entry)
        .collect();
    let v6: Vec<String> = routes
        .iter()
        .filter(|r| r.dst.is_ipv6() && r.protocol != RTPROT_KERNEL)
        .map(entry)
        .collect();
    let record = |entries: &[String]| format!("{DUMMY_ALIAS_PREFIX} {}", entries.join(" "));
    let full = record(&[v4.clone(), v6].concat());
    if full.len() <= MAX_ALIAS_LEN {
        return Ok(full.trim_end().to_string());
    }
    let v4_only = record(&v4);
    if v4_only.len() <= MAX_ALIAS_LEN {
        tracing::warn!(
            "{iface} has too many IPv6 routes to record; a teardown will not restore them"
        );
        return Ok(v4_only.trim_end().to_string());
    }
    Err(BindingError::InvalidConfig(format!(
        "{iface} has more IPv4 routes than netsetup can record ({} bytes, at most {MAX_ALIAS_LEN})",
        v4_only.len()
    )))
}

fn parse_route_record(alias: &str) -> Option<Vec<RouteState>> {
    let rest = alias.strip_prefix(DUMMY_ALIAS_PREFIX)?;
    rest.split_whitespace()
        .map(|entry| {
            let mut fields = entry.split(',');
            let (dst, len) = fields.next()?.split_once('/')?;
            let dst: IpAddr = dst.parse().ok()?;
            let prefix_len: u8 = len.parse().ok()?;
            let gateway = match fields.next()? {
                "-" => None,
                gw => Some(gw.parse::<IpAddr>().ok()?),
            };
            let protocol = fields.next()?.parse().ok()?;
            let priority = fields.next()?.parse().ok()?;
            let max_len = if dst.is_ipv4() { 32 } else { 128 };
            let same_family = gateway.is_none_or(|g| g.is_ipv4() == dst.is_ipv4());
            (fields.next().is_none() && prefix_len <= max_len && same_family).then_some(
                RouteState {
                    dst,
                    prefix_len,
                    gateway,
                    oif: 0,
                    protocol,
                    priority,
                },
            )
        })
        .collect()
}

/// What the launcher's DHCP server serves (`storeBridgeBindingDHCPInterfaceData`): the
/// pod's first global IPv4 address, the guest MAC, the next hop of the pod interface's
/// first IPv4 route as router, and its IPv4 routes but the one to its own subnet.
/// Without an IPv4 address, DHCP is off (`IPAMDisabled`).
fn dhcp_cache(
    pod: &PodIface,
    iface: &str,
    guest_mac: Option<[u8; 6]>,
) -> Result<DhcpCache, BindingError> {
    let Some((ip, prefix_len)) = pod.first_global_v4() else {
        return Ok(DhcpCache {
            ipam_disabled: true,
            ..Default::default()
        });
    };
    let v4_routes: Vec<&RouteState> = pod.routes.iter().filter(|r| r.dst.is_ipv4()).collect();
    let first = v4_routes
        .first()
        .ok_or_else(|| BindingError::NoIpv4Route(iface.to_string()))?;
    let own_subnet = ipnet::Ipv4Net::new(ip, prefix_len)
        .map(|n| (IpAddr::V4(n.network()), prefix_len))
        .map_err(|e| BindingError::InvalidConfig(e.to_string()))?;
    let routes: Vec<NetlinkRoute> = v4_routes
        .iter()
        .filter(|r| r.prefix_len == 0 || (r.dst, r.prefix_len) != own_subnet)
        .map(|r| {
            NetlinkRoute::new(
                (r.prefix_len > 0).then_some((r.dst, r.prefix_len)),
                r.gateway,
            )
        })
        .collect();
    Ok(DhcpCache {
        ip: NetlinkAddr::from_cidr(IpAddr::V4(ip), prefix_len),
        mac: Some(guest_mac.unwrap_or(pod.mac).to_vec()),
        gateway: first.gateway,
        routes: (!routes.is_empty()).then_some(routes),
        ..Default::default()
    })
}

async fn setup_here(
    config: &BridgeConfig,
    handle: &Handle,
    journal: &mut Journal,
) -> Result<BridgeOutcome, BindingError> {
    let bridge_name = config.bridge_name();
    let nic_name = config.nic_name();
    let all_links = links::links(handle).await?;
    let all_addrs = links::addresses(handle).await?;

    // --- inspect, and check for clashes before changing anything
    let found = find(config, &all_links)?
        .ok_or_else(|| BindingError::PodInterfaceMissing(config.iface.clone()))?;
    let (pod, record) = match &found {
        Found::Fresh { pod } => {
            let mut routes = links::routes_via(handle, pod.index).await?;
            for r in &mut routes {
                r.oif = 0;
            }
            let state = PodIface {
                mac: mac_of(pod)?,
                mtu: pod.mtu,
                addrs: addrs_of(&all_addrs, pod.index),
                routes,
            };
            let record = route_record(&state.routes, &config.iface)?;
            (state, Some(record))
        }
        Found::Moved { dummy, .. } => {
            let routes = parse_route_record(dummy.alias.as_deref().unwrap_or_default())
                .ok_or_else(|| {
                    BindingError::Clash(format!(
                        "the route record of the dummy {} is unreadable",
                        config.iface
                    ))
                })?;
            let state = PodIface {
                mac: mac_of(dummy)?,
                mtu: dummy.mtu,
                addrs: addrs_of(&all_addrs, dummy.index),
                routes,
            };
            (state, None)
        }
    };
    let dhcp = dhcp_cache(&pod, &config.iface, config.guest_mac)?;
    let has_ipv4 = !dhcp.ipam_disabled;

    let existing_bridge = all_links.iter().find(|l| l.name == bridge_name);
    if let Some(bridge) = existing_bridge
        && !is_our_bridge(bridge)
    {
        return Err(BindingError::Clash(format!(
            "link {bridge_name} exists but is not a bridge made by netsetup's bridge binding"
        )));
    }
    if let Found::Moved { nic, .. } = &found
        && nic
            .controller
            .is_some_and(|c| existing_bridge.is_none_or(|b| b.index != c))
    {
        return Err(BindingError::Clash(format!(
            "{nic_name} is attached to another bridge than {bridge_name}"
        )));
    }
    let tap = config.tap_spec();
    let existing_tap = binding::reusable_tap(&all_links, tap, existing_bridge, &bridge_name)?;

    // --- bridge (its MAC is the kernel's random one, as in KubeVirt)
    let bridge_index = match existing_bridge {
        Some(bridge) => bridge.index,
        None => {
            let previous = vec![(
                sysctl::ARP_IGNORE_ALL,
                sysctl::read(sysctl::ARP_IGNORE_ALL)?,
            )];
            let index = links::create_bridge(handle, &bridge_name, None, None).await?;
            journal.push(Step::CreatedLink(index));
            links::change_link(
                handle,
                index,
                LinkChange {
                    alias: Some(alias_record(BRIDGE_ALIAS_PREFIX, &previous)),
                    ..Default::default()
                },
            )
            .await?;
            index
        }
    };

    // --- the pod interface becomes a bridge port; a dummy keeps its identity
    let nic_index = match (&found, record) {
        (Found::Fresh { pod: link }, Some(record)) => {
            move_pod_iface(handle, journal, config, link, &pod, &record, bridge_index).await?
        }
        (Found::Moved { nic, .. }, _) => {
            links::change_link(
                handle,
                nic.index,
                LinkChange {
                    controller: Some(bridge_index),
                    up: true,
                    ..Default::default()
                },
            )
            .await?;
            nic.index
        }
        (Found::Fresh { .. }, None) => unreachable!("a fresh pod interface always has a record"),
    };
    links::set_port_learning(handle, nic_index, false).await?;

    // --- tap, bridge address, sysctl
    binding::attach_tap(handle, journal, tap, existing_tap, bridge_index, pod.mtu).await?;
    if has_ipv4 {
        let fake =
            IpAddr::V4(fake_bridge_ip(config.iface_index).expect("validate() checked the index"));
        let present = all_addrs.iter().any(|a| {
            a.link_index == bridge_index
                && a.addr == fake
                && a.prefix_len == FAKE_BRIDGE_IP_PREFIX_LEN
        });
        if !present {
            links::add_address(handle, bridge_index, fake, FAKE_BRIDGE_IP_PREFIX_LEN).await?;
            journal.push(Step::AddedAddress(
                bridge_index,
                fake,
                FAKE_BRIDGE_IP_PREFIX_LEN,
            ));
        }
    }
    links::change_link(
        handle,
        bridge_index,
        LinkChange {
            up: true,
            ..Default::default()
        },
    )
    .await?;
    if has_ipv4 {
        binding::set_sysctl(journal, sysctl::ARP_IGNORE_ALL, "1")?;
    }

    Ok(BridgeOutcome {
        bridge: bridge_name,
        tap: config.tap_name.clone(),
        nic: nic_name,
        mtu: pod.mtu,
        pod_mac: pod.mac,
        pod_ipv4: pod.first_global_v4().map(|(ip, _)| ip),
        pod_ipv6: pod.first_global_v6(),
        dhcp,
    })
}

/// Renames the pod interface to `<iface>-nic`, puts a dummy with its MAC, MTU and
/// addresses in its place, and makes it a port of the bridge with the bridge's MAC.
/// Journals one step that gives the pod interface back whole.
async fn move_pod_iface(
    handle: &Handle,
    journal: &mut Journal,
    config: &BridgeConfig,
    link: &LinkState,
    pod: &PodIface,
    record: &str,
    bridge_index: u32,
) -> Result<u32, BindingError> {
    let index = link.index;
    {
        let (name, pod, was_up) = (config.iface.clone(), pod.clone(), link.up);
        journal.push(Step::Other {
            what: "give the pod interface back",
            undo: Box::new(move |handle| {
                Box::pin(async move {
                    restore_pod_iface(&handle, index, &name, &pod, was_up)
                        .await
                        .map_err(|e| e.to_string())
                })
            }),
        });
    }
    // A link is renamed only while down; going down drops its routes and IPv6 addresses.
    let down = LinkChange {
        down: true,
        ..Default::default()
    };
    links::change_link(handle, index, down).await?;
    links::change_link(
        handle,
        index,
        LinkChange {
            name: Some(config.nic_name()),
            ..Default::default()
        },
    )
    .await?;
    let dummy = create_identity_link(handle, &config.iface, pod, record).await?;
    journal.push(Step::CreatedLink(dummy));
    for (addr, prefix_len) in &pod.addrs {
        links::add_address(handle, dummy, *addr, *prefix_len).await?;
    }
    links::delete_addresses(handle, index, |_| true).await?;
    // The port must not keep the guest's (the pod's) MAC: the bridge would take frames
    // for the guest as its own. KubeVirt copies the bridge's MAC onto it.
    let bridge_mac = links::links(handle)
        .await?
        .iter()
        .find(|l| l.index == bridge_index)
        .map(mac_of)
        .transpose()?
        .ok_or_else(|| BindingError::Clash(format!("bridge #{bridge_index} vanished")))?;
    links::change_link(
        handle,
        index,
        LinkChange {
            mac: Some(bridge_mac),
            controller: Some(bridge_index),
            up: true,
            ..Default::default()
        },
    )
    .await?;
    Ok(index)
}

/// Creates KubeVirt's dummy. A kernel built without the dummy driver (`CONFIG_DUMMY`,
/// which KubeVirt needs) refuses it; there an `ifb` link, just as inert while down,
/// takes its place so the binding still works.
async fn create_identity_link(
    handle: &Handle,
    name: &str,
    pod: &PodIface,
    record: &str,
) -> Result<u32, BindingError> {
    let create = |kind| links::create_inert_link(handle, name, kind, pod.mac, pod.mtu, record);
    match create(InfoKind::Dummy).await {
        Err(e) if links::is_unsupported(&e) => {
            tracing::warn!("the kernel has no dummy links; {name} is an ifb link instead");
            Ok(create(InfoKind::Ifb).await?)
        }
        other => Ok(other?),
    }
}

/// Gives link `index` back the pod interface's name, MAC, addresses and routes.
async fn restore_pod_iface(
    handle: &Handle,
    index: u32,
    name: &str,
    pod: &PodIface,
    up: bool,
) -> Result<(), BindingError> {
    links::change_link(
        handle,
        index,
        LinkChange {
            no_controller: true,
            down: true,
            ..Default::default()
        },
    )
    .await?;
    links::change_link(
        handle,
        index,
        LinkChange {
            name: Some(name.to_string()),
            mac: Some(pod.mac),
            mtu: Some(pod.mtu),
            ..Default::default()
        },
    )
    .await?;
    links::delete_addresses(handle, index, |_| true).await?;
    // The kernel makes the IPv6 link-local address itself when the link comes up.
    for (addr, prefix_len) in pod.addrs.iter().filter(|(a, _)| !is_v6_link_local(*a)) {
        links::add_address(handle, index, *addr, *prefix_len).await?;
    }
    if !up {
        return Ok(());
    }
    links::change_link(
        handle,
        index,
        LinkChange {
            up: true,
            ..Default::default()
        },
    )
    .await?;
    // On-link routes first: a next hop must be reachable when its route is added
    // (Calico's default route goes through an on-link /32); default routes last.
    let mut routes: Vec<&RouteState> = pod
        .routes
        .iter()
        .filter(|r| r.protocol != RTPROT_KERNEL)
        .collect();
    routes.sort_by_key(|r| (r.gateway.is_some(), r.prefix_len == 0));
    for route in routes {
        links::add_route(
            handle,
            &RouteState {
                oif: index,
                ..route.clone()
            },
        )
        .await?;
    }
    Ok(())
}

async fn teardown_here(config: &BridgeConfig, handle: &Handle) -> Result<(), BindingError> {
    let bridge_name = config.bridge_name();
    let all_links = links::links(handle).await?;
    let all_addrs = links::addresses(handle).await?;
    let bridge = all_links.iter().find(|l| l.name == bridge_name);
    if let Some(b) = bridge
        && !is_our_bridge(b)
    {
        return Err(BindingError::Clash(format!(
            "link {bridge_name} is not a netsetup bridge; not removing it"
        )));
    }
    let tap_link = all_links.iter().find(|l| l.name == config.tap_name);
    if let Some(t) = tap_link
        && !t.tun.as_ref().is_some_and(|tun| tun.is_tap)
    {
        return Err(BindingError::Clash(format!(
            "link {} is not a tap; not removing it",
            config.tap_name
        )));
    }
    let moved = match find(config, &all_links)? {
        Some(Found::Moved { dummy, nic }) => {
            let routes = parse_route_record(dummy.alias.as_deref().unwrap_or_default())
                .ok_or_else(|| {
                    BindingError::Clash(format!(
                        "the route record of the dummy {} is unreadable",
                        config.iface
                    ))
                })?;
            let pod = PodIface {
                mac: mac_of(dummy)?,
                mtu: dummy.mtu,
                addrs: addrs_of(&all_addrs, dummy.index),
                routes,
            };
            Some((dummy.index, nic.index, pod))
        }
        _ => None,
    };

    if let Some(t) = tap_link {
        links::delete_link(handle, t.index).await?;
    }
    if let Some((dummy, nic, pod)) = moved {
        links::delete_link(handle, dummy).await?;
        restore_pod_iface(handle, nic, &config.iface, &pod, true).await?;
    }
    if let Some(b) = bridge {
        links::delete_link(handle, b.index).await?;
        let alias = b.alias.as_deref().unwrap_or_default();
        for (key, value) in parse_alias_record(alias, BRIDGE_ALIAS_PREFIX, &RECORDED_SYSCTLS) {
            sysctl::write(&key, &value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(dst: &str, len: u8, gw: Option<&str>, protocol: u8) -> RouteState {
        RouteState {
            dst: dst.parse().unwrap(),
            prefix_len: len,
            gateway: gw.map(|g| g.parse().unwrap()),
            oif: 0,
            protocol,
            priority: 0,
        }
    }

    fn pod(addrs: &[(&str, u8)], routes: Vec<RouteState>) -> PodIface {
        PodIface {
            mac: [0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05],
            mtu: 1450,
            addrs: addrs
                .iter()
                .map(|(a, l)| (a.parse().unwrap(), *l))
                .collect(),
            routes,
        }
    }

    #[test]
    fn dhcp_data_follows_kubevirt() {
        // A typical pod: default route first (the kernel's order), then its subnet.
        let p = pod(
            &[("fe80::1", 64), ("10.244.1.5", 24), ("fd00::5", 64)],
            vec![
                route("0.0.0.0", 0, Some("10.244.1.1"), 4),
                route("10.244.1.0", 24, None, RTPROT_KERNEL),
                route("fd00::", 64, None, RTPROT_KERNEL),
            ],
        );
        let cache = dhcp_cache(&p, "eth0", None).unwrap();
        assert!(!cache.ipam_disabled);
        assert_eq!(cache.ipv4(), Some((Ipv4Addr::new(10, 244, 1, 5), 24)));
        assert_eq!(cache.mac_address(), Some(p.mac));
        assert_eq!(cache.gateway, Some("10.244.1.1".parse().unwrap()));
        // The subnet route is left out; the default route has no Dst.
        assert_eq!(
            cache.routes,
            Some(vec![NetlinkRoute::new(
                None,
                Some("10.244.1.1".parse().unwrap())
            )])
        );

        // Calico-like: a /32 with an on-link route to the gateway.
        let calico = pod(
            &[("10.1.2.3", 32)],
            vec![
                route("0.0.0.0", 0, Some("169.254.1.1"), 3),
                route("169.254.1.1", 32, None, 3),
            ],
        );
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let cache = dhcp_cache(&calico, "eth0", Some(mac)).unwrap();
        assert_eq!(cache.mac_address(), Some(mac));
        assert_eq!(cache.routes.as_ref().map(Vec::len), Some(2));

        // No IPv4: DHCP off. IPv4 without any route: KubeVirt's error.
        let v6_only = pod(&[("fd00::5", 64)], vec![]);
        assert!(dhcp_cache(&v6_only, "eth0", None).unwrap().ipam_disabled);
        let no_route = pod(&[("10.1.2.3", 32)], vec![]);
        assert!(matches!(
            dhcp_cache(&no_route, "eth0", None),
            Err(BindingError::NoIpv4Route(_))
        ));
    }

    #[test]
    fn route_record_round_trips_and_drops_what_does_not_fit() {
        let routes = vec![
            route("0.0.0.0", 0, Some("10.244.1.1"), 4),
            route("10.244.1.0", 24, None, RTPROT_KERNEL),
            route("fd00::", 64, None, RTPROT_KERNEL),
            route("::", 0, Some("fe80::1"), 3),
        ];
        let record = route_record(&routes, "eth0").unwrap();
        assert_eq!(
            record,
            "netsetup-pod: 0.0.0.0/0,10.244.1.1,4,0 10.244.1.0/24,-,2,0 ::/0,fe80::1,3,0"
        );
        let back = parse_route_record(&record).unwrap();
        let kept: Vec<RouteState> = routes
            .iter()
            .filter(|r| r.dst.is_ipv4() || r.protocol != RTPROT_KERNEL)
            .cloned()
            .collect();
        assert_eq!(back, kept);
        assert_eq!(parse_route_record("netsetup-pod:"), Some(vec![]));

        let many_v6: Vec<RouteState> = (0..10)
            .map(|i| {
                route(
                    &format!("fd00:{i}:aaaa:bbbb::"),
                    64,
                    Some("fe80::1234:5678:9abc:def0"),
                    3,
                )
            })
            .chain([route("0.0.0.0", 0, Some("10.0.0.1"), 4)])
            .collect();
        let record = route_record(&many_v6, "eth0").unwrap();
        assert_eq!(record, "netsetup-pod: 0.0.0.0/0,10.0.0.1,4,0");
        let many_v4: Vec<RouteState> = (0..20)
            .map(|i| route(&format!("10.{i}.0.0"), 16, Some("10.255.255.254"), 4))
            .collect();
        assert!(route_record(&many_v4, "eth0").is_err());

        for bad in [
            "netsetup-pod: 10.0.0.0/33,-,4,0",
            "netsetup-pod: 10.0.0.0/8,fe80::1,4,0",
            "netsetup-pod: 10.0.0.0/8,-,4",
            "netsetup-pod: 10.0.0.0/8,-,4,0,9",
            "netsetup-pod: junk",
            "someone else's alias",
        ] {
            assert_eq!(parse_route_record(bad), None, "{bad}");
        }
    }

    #[test]
    fn validate_rejects_bad_inputs() {
        let base = BridgeConfig::new(NetnsTarget::Pid(1));
        assert!(base.validate().is_ok());
        assert_eq!(base.nic_name(), "eth0-nic");
        let bad = |f: fn(&mut BridgeConfig)| {
            let mut c = base.clone();
            f(&mut c);
            c.validate().unwrap_err()
        };
        for err in [
            bad(|c| c.iface = "eth0-long-name".into()), // "-nic" makes it too long
            bad(|c| c.tap_name = "eth0-nic".into()),
            bad(|c| c.tap_name = "k6t-eth0".into()),
            bad(|c| c.iface_index = 100),
            bad(|c| c.guest_mac = Some([0x01, 0, 0, 0, 0, 1])),
        ] {
            assert!(matches!(err, BindingError::InvalidConfig(_)), "{err}");
        }
    }

    #[test]
    fn global_unicast_is_gos() {
        for (ip, global) in [
            ("10.1.2.3", true),
            ("169.254.1.1", false),
            ("127.0.0.1", false),
            ("255.255.255.255", false),
            ("fd00::1", true),
            ("fe80::1", false),
            ("ff02::1", false),
        ] {
            assert_eq!(is_global_unicast(ip.parse().unwrap()), global, "{ip}");
        }
    }
}
