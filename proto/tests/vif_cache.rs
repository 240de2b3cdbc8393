//! The bridge binding's `vif-cache-<iface>.json` against files Go wrote: the two goldens
//! are `json.MarshalIndent(&cfg, "", "  ")` of KubeVirt v1.9.0's `cache.DHCPConfig` with
//! `github.com/vishvananda/netlink` v1.3.1, run once with Go 1.26:
//!
//! - `vif-cache-bridge.json`: IP `netlink.ParseAddr("10.244.1.5/24")`, MAC
//!   `0a:58:0a:f4:01:05`, Gateway `10.244.1.1`, Routes = the default route via
//!   `10.244.1.1` and an on-link `169.254.1.1/32` (Dst from `net.ParseCIDR`).
//! - `vif-cache-ipam-disabled.json`: the zero value with `IPAMDisabled: true`.

use std::net::{IpAddr, Ipv4Addr};

use proto::contract::dhcp_cache::{DhcpConfig, NetlinkAddr, NetlinkRoute};

const BRIDGE: &str = include_str!("testdata/vif-cache-bridge.json");
const IPAM_DISABLED: &str = include_str!("testdata/vif-cache-ipam-disabled.json");

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

fn bridge_config() -> DhcpConfig {
    DhcpConfig {
        ip: NetlinkAddr::from_cidr(ip("10.244.1.5"), 24),
        mac: Some(vec![0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05]),
        gateway: Some(ip("10.244.1.1")),
        routes: Some(vec![
            NetlinkRoute::new(None, Some(ip("10.244.1.1"))),
            NetlinkRoute::new(Some((ip("169.254.1.1"), 32)), None),
        ]),
        ..Default::default()
    }
}

#[test]
fn what_we_write_is_byte_for_byte_what_go_writes() {
    let ours = serde_json::to_string_pretty(&bridge_config()).unwrap();
    assert_eq!(ours, BRIDGE.trim_end());
    let disabled = DhcpConfig {
        ipam_disabled: true,
        ..Default::default()
    };
    assert_eq!(
        serde_json::to_string_pretty(&disabled).unwrap(),
        IPAM_DISABLED.trim_end()
    );
}

#[test]
fn what_go_writes_reads_back_with_its_meaning() {
    let config: DhcpConfig = serde_json::from_str(BRIDGE).unwrap();
    assert_eq!(config, bridge_config());
    assert_eq!(config.ipv4(), Some((Ipv4Addr::new(10, 244, 1, 5), 24)));
    assert_eq!(
        config.mac_address(),
        Some([0x0a, 0x58, 0x0a, 0xf4, 0x01, 0x05])
    );
    let routes = config.routes.unwrap();
    assert_eq!(routes[0].dst, None);
    assert_eq!(routes[0].gw, Some(ip("10.244.1.1")));
    assert_eq!(
        routes[1].dst.as_ref().and_then(|d| d.cidr()),
        Some((ip("169.254.1.1"), 32))
    );
    assert_eq!(routes[1].gw, None);

    let disabled: DhcpConfig = serde_json::from_str(IPAM_DISABLED).unwrap();
    assert!(disabled.ipam_disabled);
    assert_eq!(disabled.ipv4(), None);
    assert_eq!(disabled.mac_address(), None);
    assert_eq!(disabled.routes, None);
}

#[test]
fn the_launchers_additions_round_trip() {
    // The launcher fills Name, AdvertisingIPAddr, Mtu and Subdomain before serving.
    let mut config = bridge_config();
    config.name = "eth0".into();
    config.advertising_ip_addr = Some(ip("169.254.75.10"));
    config.mtu = 1450;
    config.subdomain = "sub".into();
    let text = serde_json::to_string(&config).unwrap();
    assert!(
        text.contains(r#""AdvertisingIPAddr":"169.254.75.10""#),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<DhcpConfig>(&text).unwrap(), config);
}
