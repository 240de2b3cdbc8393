//! The handler's phase 1 of KubeVirt's masquerade binding (proto/CONTRACT.md §5.1), as one operation.
//!
//! [`setup`] inspects the pod's namespace, checks the plan against what is there, then
//! creates the bridge, gateway addresses, tap, sysctls and NAT rules. It converges: what an
//! earlier run of netsetup left (its bridge, recognised by the reserved MAC, and its tap) is
//! reused, so a second run leaves the same state. Anything else in the way is a clash and
//! nothing is touched. If a step fails, what this run changed is undone.
//!
//! [`teardown`] removes what [`setup`] created and restores the forwarding sysctls it
//! changed. Their earlier values are kept in the bridge's alias (`IFLA_IFALIAS`), so the
//! record lives and dies with the bridge and needs no file.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use rtnetlink::Handle;
use rtnetlink::packet_route::link::InfoKind;

use crate::binding::{
    self, BindingError, Journal, Step, TapSpec, alias_record, in_netns, parse_alias_record,
    valid_ifname,
};
use crate::links::{self, AddrState, LinkChange, LinkState};
use crate::netns::NetnsTarget;
use crate::nft::{self, Family, NatRuleset, Port};
use crate::sysctl;

/// `StaticMasqueradeBridgeMAC`: the bridge's MAC, reserved (never a guest MAC).
pub const BRIDGE_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0];
/// Default guest network for IPv4 (`api.DefaultVMCIDR`).
pub const DEFAULT_IPV4_CIDR: Ipv4Net = match Ipv4Net::new(Ipv4Addr::new(10, 0, 2, 0), 24) {
    Ok(net) => net,
    Err(_) => panic!("constant prefix length is valid"),
};
/// Default guest network for IPv6 (`api.DefaultVMIpv6CIDR`).
pub const DEFAULT_IPV6_CIDR: Ipv6Net =
    match Ipv6Net::new(Ipv6Addr::new(0xfd10, 0, 2, 0, 0, 0, 0, 0), 120) {
        Ok(net) => net,
        Err(_) => panic!("constant prefix length is valid"),
    };
/// Owner of the tap for non-root VMIs (the launcher's qemu user).
pub const NON_ROOT_UID: u32 = 107;

/// The bridge's alias starts with this; the rest records the forwarding sysctls.
const ALIAS_PREFIX: &str = "netsetup:";
/// The sysctls the alias may record.
const RECORDED_SYSCTLS: [&str; 2] = [sysctl::IPV4_FORWARD, sysctl::IPV6_FORWARDING];

/// What to build in the pod's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqueradeConfig {
    pub netns: NetnsTarget,
    /// The pod interface (`eth0`).
    pub iface: String,
    /// The tap the VMM opens (`tap0`).
    pub tap_name: String,
    pub tap_owner_uid: u32,
    pub tap_owner_gid: u32,
    /// Declared `interfaces[].ports`; empty forwards every port to the guest.
    pub ports: Vec<Port>,
    /// `vmNetworkCIDR`: gateway = network + 1, guest = network + 2.
    pub ipv4_cidr: Ipv4Net,
    /// `vmIPv6NetworkCIDR`.
    pub ipv6_cidr: Ipv6Net,
    /// VMI annotation `sidecar.istio.io/inject: "true"`.
    pub istio: bool,
    /// `status.migrationTransport == "Unix"`; when false the legacy migration ports stay local.
    pub migration_over_unix: bool,
}

impl MasqueradeConfig {
    /// KubeVirt's defaults for the primary pod network of a non-root VMI.
    pub fn new(netns: NetnsTarget) -> Self {
        MasqueradeConfig {
            netns,
            iface: PRIMARY_POD_IFACE.into(),
            tap_name: PRIMARY_TAP.into(),
            tap_owner_uid: NON_ROOT_UID,
            tap_owner_gid: NON_ROOT_UID,
            ports: Vec::new(),
            ipv4_cidr: DEFAULT_IPV4_CIDR,
            ipv6_cidr: DEFAULT_IPV6_CIDR,
            istio: false,
            migration_over_unix: true,
        }
    }

    /// The bridge: `k6t-` + the pod interface name without a `pod` prefix.
    pub fn bridge_name(&self) -> String {
        bridge_name(&self.iface)
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
        ] {
            if !valid_ifname(name) {
                return invalid(format!(
                    "{what} name {name:?} is not a valid interface name (1-15 bytes, no '/', ':' or spaces)"
                ));
            }
        }
        if self.tap_name == self.iface || self.tap_name == self.bridge_name() {
            return invalid(format!(
                "tap name {:?} collides with the pod interface or the bridge",
                self.tap_name
            ));
        }
        // network + 2 must be a host address: at least 4 addresses (/30, /126).
        if self.ipv4_cidr.prefix_len() > 30 {
            return invalid(format!(
                "IPv4 guest network {} is too small",
                self.ipv4_cidr
            ));
        }
        if self.ipv6_cidr.prefix_len() > 126 {
            return invalid(format!(
                "IPv6 guest network {} is too small",
                self.ipv6_cidr
            ));
        }
        if self.ipv4_cidr.network() != self.ipv4_cidr.addr()
            || self.ipv6_cidr.network() != self.ipv6_cidr.addr()
        {
            return invalid(format!(
                "guest networks must be given by their network address ({} / {})",
                self.ipv4_cidr, self.ipv6_cidr
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for port in &self.ports {
            if port.number == 0 {
                return invalid("port 0 cannot be forwarded".into());
            }
            if !seen.insert(*port) {
                return invalid(format!(
                    "port {}/{} is declared twice",
                    port.number, port.protocol
                ));
            }
        }
        Ok(())
    }
}

pub use proto::contract::pod_network::bridge_name;
use proto::contract::pod_network::{PRIMARY_POD_IFACE, PRIMARY_TAP};

/// Gateway and guest address of one family, with the guest network's prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuestAddresses {
    pub gateway: IpAddr,
    pub guest: IpAddr,
    pub prefix_len: u8,
}

pub(crate) fn guest_addresses_v4(net: Ipv4Net) -> GuestAddresses {
    let base = net.network().to_bits();
    GuestAddresses {
        gateway: IpAddr::V4(Ipv4Addr::from_bits(base.wrapping_add(1))),
        guest: IpAddr::V4(Ipv4Addr::from_bits(base.wrapping_add(2))),
        prefix_len: net.prefix_len(),
    }
}

pub(crate) fn guest_addresses_v6(net: Ipv6Net) -> GuestAddresses {
    let base = net.network().to_bits();
    GuestAddresses {
        gateway: IpAddr::V6(Ipv6Addr::from_bits(base.wrapping_add(1))),
        guest: IpAddr::V6(Ipv6Addr::from_bits(base.wrapping_add(2))),
        prefix_len: net.prefix_len(),
    }
}

/// What [`setup`] built, for the caller's records (the handler reports the pod IPs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MasqueradeOutcome {
    pub bridge: String,
    pub tap: String,
    pub mtu: u32,
    pub pod_ipv4: Option<Ipv4Addr>,
    pub pod_ipv6: Option<Ipv6Addr>,
    /// Present when the pod has a global IPv4 address.
    pub ipv4: Option<GuestAddresses>,
    /// Present when the pod has a global IPv6 address.
    pub ipv6: Option<GuestAddresses>,
}

/// Builds the masquerade network in the pod's namespace (see the module docs).
pub fn setup(config: &MasqueradeConfig) -> Result<MasqueradeOutcome, BindingError> {
    config.validate()?;
    let config = config.clone();
    binding::journaled(&config.netns.clone(), async move |handle, journal| {
        setup_here(&config, handle, journal).await
    })
}

/// Removes the NAT tables, the tap and the bridge, and restores the forwarding sysctls.
/// Refuses (with [`BindingError::Clash`]) to delete a bridge or tap netsetup did not make.
pub fn teardown(config: &MasqueradeConfig) -> Result<(), BindingError> {
    config.validate()?;
    let config = config.clone();
    in_netns(&config.netns.clone(), move |handle| async move {
        teardown_here(&config, &handle).await
    })
}

fn mac_matches(link: &LinkState, mac: &[u8; 6]) -> bool {
    link.mac.as_deref() == Some(&mac[..])
}

fn overlaps(a: IpNet, b: IpNet) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The sysctls setup sets to 1 for the enabled families.
fn forwarding_keys(v4: bool, v6: bool) -> Vec<&'static str> {
    let mut keys = Vec::new();
    if v4 {
        keys.push(sysctl::IPV4_FORWARD);
    }
    if v6 {
        keys.push(sysctl::IPV6_FORWARDING);
    }
    keys
}

async fn setup_here(
    config: &MasqueradeConfig,
    handle: &Handle,
    journal: &mut Journal,
) -> Result<MasqueradeOutcome, BindingError> {
    let bridge_name = config.bridge_name();
    let all_links = links::links(handle).await?;
    let all_addrs = links::addresses(handle).await?;

    // --- inspect the pod interface
    let pod = all_links
        .iter()
        .find(|l| l.name == config.iface)
        .ok_or_else(|| BindingError::PodInterfaceMissing(config.iface.clone()))?;
    let pod_global = |want_v4: bool| {
        all_addrs
            .iter()
            .filter(|a| a.link_index == pod.index && a.global)
            .map(|a| a.addr)
            .find(|addr| addr.is_ipv4() == want_v4)
    };
    let pod_ipv4 = match pod_global(true) {
        Some(IpAddr::V4(v4)) => Some(v4),
        _ => None,
    };
    let pod_ipv6 = match pod_global(false) {
        Some(IpAddr::V6(v6)) => Some(v6),
        _ => None,
    };
    if pod_ipv4.is_none() && pod_ipv6.is_none() {
        return Err(BindingError::NoPodAddress(config.iface.clone()));
    }
    let ipv4 = pod_ipv4.map(|_| guest_addresses_v4(config.ipv4_cidr));
    let ipv6 = pod_ipv6.map(|_| guest_addresses_v6(config.ipv6_cidr));
    let gateways: Vec<GuestAddresses> = ipv4.iter().chain(ipv6.iter()).copied().collect();
    let mtu = pod.mtu;

    // --- check for clashes before changing anything
    let existing_bridge = all_links.iter().find(|l| l.name == bridge_name);
    if let Some(bridge) = existing_bridge
        && !(links::is_kind(bridge, InfoKind::Bridge) && mac_matches(bridge, &BRIDGE_MAC))
    {
        return Err(BindingError::Clash(format!(
            "link {bridge_name} exists but is not a bridge with MAC 02:00:00:00:00:00 (not made by netsetup)"
        )));
    }
    let tap = config.tap_spec();
    let existing_tap = binding::reusable_tap(&all_links, tap, existing_bridge, &bridge_name)?;
    let guest_nets: Vec<IpNet> = [
        ipv4.map(|_| IpNet::V4(config.ipv4_cidr)),
        ipv6.map(|_| IpNet::V6(config.ipv6_cidr)),
    ]
    .into_iter()
    .flatten()
    .collect();
    for addr in &all_addrs {
        let on_our_bridge = existing_bridge.is_some_and(|b| b.index == addr.link_index);
        let Ok(net) = IpNet::new(addr.addr, addr.prefix_len) else {
            continue;
        };
        for guest_net in &guest_nets {
            if !overlaps(net, *guest_net) {
                continue;
            }
            let expected_gateway = gateways
                .iter()
                .any(|g| g.gateway == addr.addr && g.prefix_len == addr.prefix_len);
            if !(on_our_bridge && expected_gateway) {
                let owner = all_links
                    .iter()
                    .find(|l| l.index == addr.link_index)
                    .map_or("?", |l| l.name.as_str());
                return Err(BindingError::Clash(format!(
                    "address {}/{} on {owner} overlaps the guest network {guest_net}",
                    addr.addr, addr.prefix_len
                )));
            }
        }
    }

    // --- bridge
    let enabled_keys = forwarding_keys(ipv4.is_some(), ipv6.is_some());
    let bridge_index = match existing_bridge {
        Some(bridge) => bridge.index,
        None => {
            let mut previous = Vec::new();
            for key in &enabled_keys {
                previous.push((*key, sysctl::read(key)?));
            }
            let index =
                links::create_bridge(handle, &bridge_name, Some(BRIDGE_MAC), Some(mtu)).await?;
            journal.push(Step::CreatedLink(index));
            links::change_link(
                handle,
                index,
                LinkChange {
                    alias: Some(alias_record(ALIAS_PREFIX, &previous)),
                    ..Default::default()
                },
            )
            .await?;
            index
        }
    };
    for gw in &gateways {
        let present = all_addrs.iter().any(|a: &AddrState| {
            a.link_index == bridge_index && a.addr == gw.gateway && a.prefix_len == gw.prefix_len
        });
        if !present {
            links::add_address(handle, bridge_index, gw.gateway, gw.prefix_len).await?;
            journal.push(Step::AddedAddress(bridge_index, gw.gateway, gw.prefix_len));
        }
    }

    // --- tap
    binding::attach_tap(handle, journal, tap, existing_tap, bridge_index, mtu).await?;
    // After the port joined: a bridge takes the smallest MTU of its ports unless set.
    links::change_link(
        handle,
        bridge_index,
        LinkChange {
            mtu: Some(mtu),
            up: true,
            ..Default::default()
        },
    )
    .await?;

    // --- sysctls
    let mut wanted: Vec<String> = enabled_keys.iter().map(|k| k.to_string()).collect();
    if ipv4.is_some() {
        wanted.push(sysctl::route_localnet(&bridge_name));
    }
    for key in wanted {
        binding::set_sysctl(journal, &key, "1")?;
    }

    // --- NAT rules, last: one atomic batch, nothing to undo if it fails
    let ruleset = |family, guest: GuestAddresses, pod_ip: Option<IpAddr>| NatRuleset {
        family,
        pod_iface: config.iface.clone(),
        bridge: bridge_name.clone(),
        gateway: guest.gateway,
        guest: guest.guest,
        pod_ip,
        ports: config.ports.clone(),
        istio: config.istio,
        migration_over_unix: config.migration_over_unix,
    };
    let mut rulesets = Vec::new();
    if let Some(v4) = ipv4 {
        rulesets.push(ruleset(Family::Ip, v4, pod_ipv4.map(IpAddr::V4)));
    }
    if let Some(v6) = ipv6 {
        rulesets.push(ruleset(Family::Ip6, v6, pod_ipv6.map(IpAddr::V6)));
    }
    nft::install(&rulesets)?;

    Ok(MasqueradeOutcome {
        bridge: bridge_name,
        tap: config.tap_name.clone(),
        mtu,
        pod_ipv4,
        pod_ipv6,
        ipv4,
        ipv6,
    })
}

async fn teardown_here(config: &MasqueradeConfig, handle: &Handle) -> Result<(), BindingError> {
    let bridge_name = config.bridge_name();
    let all_links = links::links(handle).await?;
    let bridge = all_links.iter().find(|l| l.name == bridge_name);
    if let Some(b) = bridge
        && !(links::is_kind(b, InfoKind::Bridge) && mac_matches(b, &BRIDGE_MAC))
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

    nft::remove(&[Family::Ip, Family::Ip6])?;
    if let Some(t) = tap_link {
        links::delete_link(handle, t.index).await?;
    }
    if let Some(b) = bridge {
        links::delete_link(handle, b.index).await?;
        for (key, value) in parse_alias_record(
            b.alias.as_deref().unwrap_or(""),
            ALIAS_PREFIX,
            &RECORDED_SYSCTLS,
        ) {
            sysctl::write(&key, &value)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_addresses_match_the_contract() {
        let v4 = guest_addresses_v4(DEFAULT_IPV4_CIDR);
        assert_eq!(v4.gateway, "10.0.2.1".parse::<IpAddr>().unwrap());
        assert_eq!(v4.guest, "10.0.2.2".parse::<IpAddr>().unwrap());
        assert_eq!(v4.prefix_len, 24);
        let v6 = guest_addresses_v6(DEFAULT_IPV6_CIDR);
        assert_eq!(v6.gateway, "fd10:0:2::1".parse::<IpAddr>().unwrap());
        assert_eq!(v6.guest, "fd10:0:2::2".parse::<IpAddr>().unwrap());
        assert_eq!(v6.prefix_len, 120);
    }

    #[test]
    fn bridge_name_drops_pod_prefix() {
        assert_eq!(bridge_name("eth0"), "k6t-eth0");
        assert_eq!(bridge_name("pod16477688c0e"), "k6t-16477688c0e");
    }

    #[test]
    fn validate_rejects_bad_inputs() {
        let base = MasqueradeConfig::new(NetnsTarget::Pid(1));
        assert!(base.validate().is_ok());
        let bad = |f: fn(&mut MasqueradeConfig)| {
            let mut c = base.clone();
            f(&mut c);
            c.validate().unwrap_err()
        };
        for err in [
            bad(|c| c.iface = "eth0-with-a-very-long-name".into()),
            bad(|c| c.tap_name = "bad/name".into()),
            bad(|c| c.tap_name = "eth0".into()),
            bad(|c| c.ipv4_cidr = "10.0.2.0/31".parse().unwrap()),
            bad(|c| c.ipv4_cidr = "10.0.2.5/24".parse().unwrap()),
            bad(|c| c.ipv6_cidr = "fd10::/127".parse().unwrap()),
            bad(|c| {
                c.ports = vec![Port {
                    number: 0,
                    protocol: nft::L4Proto::Tcp,
                }]
            }),
            bad(|c| {
                let p = Port {
                    number: 80,
                    protocol: nft::L4Proto::Tcp,
                };
                c.ports = vec![p, p];
            }),
        ] {
            assert!(matches!(err, BindingError::InvalidConfig(_)), "{err}");
        }
    }
}
