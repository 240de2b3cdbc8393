//! The bridge binding's DHCP cache: what the handler learns about the pod interface before
//! it hands the pod's address to the guest, and the launcher serves over DHCP.
//!
//! KubeVirt v1.9.0 writes it as `/var/run/kubevirt-private/vif-cache-<podIface>.json` in
//! the launcher pod (`pkg/network/cache/dhcpconfig.go`, written by
//! `pkg/network/setup/netpod/discoverbridge.go`, read by `pkg/network/dhcp/bridge.go`).
//! The file is Go's `json.MarshalIndent` of `cache.DHCPConfig`, whose fields have no JSON
//! tags and embed `vishvananda/netlink` v1.3.1 types, so the keys are Go field names and
//! the values follow Go's encoding: `net.IP` as its text (`""` for nil), `net.IPMask` and
//! `net.HardwareAddr` as base64, nil pointers as `null`. [`DhcpConfig`] reproduces that
//! byte for byte (checked against Go's own output in `proto/tests/vif_cache.rs`), so a
//! stock launcher reads what this handler writes and the other way round.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::{Deserialize, Serialize};

use super::pod_paths::PRIVATE_DIR;

/// `vif-cache-<podIface>.json`.
pub fn file_name(pod_iface: &str) -> String {
    format!("vif-cache-{pod_iface}.json")
}

/// `/var/run/kubevirt-private/vif-cache-<podIface>.json`, inside the launcher pod.
pub fn path_in_pod(pod_iface: &str) -> String {
    format!("{PRIVATE_DIR}/{}", file_name(pod_iface))
}

/// KubeVirt's `cache.DHCPConfig`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct DhcpConfig {
    /// The pod interface; filled by the launcher, empty in the handler's file.
    #[serde(rename = "Name", default)]
    pub name: String,
    /// The pod's IPv4 address and prefix, which the guest gets.
    #[serde(rename = "IP", default)]
    pub ip: NetlinkAddr,
    /// Never set for the bridge binding (no DHCPv6 there).
    #[serde(rename = "IPv6", default)]
    pub ipv6: NetlinkAddr,
    /// The guest's MAC: the DHCP server answers only this client.
    #[serde(rename = "MAC", default, with = "go_bytes")]
    pub mac: Option<Vec<u8>>,
    /// The server identifier; filled by the launcher (the bridge's fake address).
    #[serde(rename = "AdvertisingIPAddr", default, with = "go_ip")]
    pub advertising_ip_addr: Option<IpAddr>,
    #[serde(rename = "AdvertisingIPv6Addr", default, with = "go_ip")]
    pub advertising_ipv6_addr: Option<IpAddr>,
    /// The pod interface's IPv4 routes but its own subnet's (DHCP option 121).
    #[serde(rename = "Routes", default)]
    pub routes: Option<Vec<NetlinkRoute>>,
    /// Filled by the launcher from the bridged pod interface.
    #[serde(rename = "Mtu", default)]
    pub mtu: u16,
    /// The pod has no IPv4 address: no DHCP server is started.
    #[serde(rename = "IPAMDisabled", default)]
    pub ipam_disabled: bool,
    /// The router (option 3): the next hop of the pod interface's first IPv4 route.
    #[serde(rename = "Gateway", default, with = "go_ip")]
    pub gateway: Option<IpAddr>,
    #[serde(rename = "Subdomain", default)]
    pub subdomain: String,
}

impl DhcpConfig {
    /// The guest's MAC, when it is a 6-byte Ethernet address.
    pub fn mac_address(&self) -> Option<[u8; 6]> {
        self.mac.as_deref().and_then(|m| m.try_into().ok())
    }

    /// The guest's IPv4 address and prefix length, when the file has a valid one.
    pub fn ipv4(&self) -> Option<(Ipv4Addr, u8)> {
        match self.ip.cidr()? {
            (IpAddr::V4(v4), len) if len <= 32 => Some((v4, len)),
            _ => None,
        }
    }
}

/// `netlink.Addr`: an address with its mask (the embedded `*net.IPNet`, absent when nil)
/// and netlink's extra fields, which KubeVirt leaves at zero.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NetlinkAddr {
    #[serde(
        rename = "IP",
        default,
        with = "go_ip",
        skip_serializing_if = "Option::is_none"
    )]
    pub ip: Option<IpAddr>,
    #[serde(
        rename = "Mask",
        default,
        with = "go_bytes",
        skip_serializing_if = "Option::is_none"
    )]
    pub mask: Option<Vec<u8>>,
    #[serde(rename = "Label", default)]
    pub label: String,
    #[serde(rename = "Flags", default)]
    pub flags: i64,
    #[serde(rename = "Scope", default)]
    pub scope: i64,
    #[serde(rename = "Peer", default)]
    pub peer: Option<GoIpNet>,
    #[serde(rename = "Broadcast", default, with = "go_ip")]
    pub broadcast: Option<IpAddr>,
    #[serde(rename = "PreferedLft", default)]
    pub prefered_lft: i64,
    #[serde(rename = "ValidLft", default)]
    pub valid_lft: i64,
    #[serde(rename = "LinkIndex", default)]
    pub link_index: i64,
}

impl NetlinkAddr {
    /// `netlink.ParseAddr("<ip>/<len>")`.
    pub fn from_cidr(ip: IpAddr, prefix_len: u8) -> Self {
        NetlinkAddr {
            ip: Some(ip),
            mask: Some(mask_bytes(ip, prefix_len)),
            ..Default::default()
        }
    }

    /// Address and prefix length; `None` without an address or with a non-contiguous mask.
    pub fn cidr(&self) -> Option<(IpAddr, u8)> {
        Some((self.ip?, prefix_len(self.mask.as_deref()?)?))
    }
}

/// `*net.IPNet`: `{"IP": ..., "Mask": ...}`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GoIpNet {
    #[serde(rename = "IP", default, with = "go_ip")]
    pub ip: Option<IpAddr>,
    #[serde(rename = "Mask", default, with = "go_bytes")]
    pub mask: Option<Vec<u8>>,
}

impl GoIpNet {
    /// A network as Go's `net.ParseCIDR` gives it (the address masked to the prefix).
    pub fn network(ip: IpAddr, prefix_len: u8) -> Self {
        let masked = match ip {
            IpAddr::V4(v4) => {
                let bits = u32::from(v4)
                    & u32::MAX
                        .checked_shl(32 - u32::from(prefix_len.min(32)))
                        .unwrap_or(0);
                IpAddr::V4(Ipv4Addr::from(bits))
            }
            IpAddr::V6(v6) => {
                let bits = u128::from(v6)
                    & u128::MAX
                        .checked_shl(128 - u32::from(prefix_len.min(128)))
                        .unwrap_or(0);
                IpAddr::V6(Ipv6Addr::from(bits))
            }
        };
        GoIpNet {
            ip: Some(masked),
            mask: Some(mask_bytes(ip, prefix_len)),
        }
    }

    /// Network address and prefix length, when both are valid.
    pub fn cidr(&self) -> Option<(IpAddr, u8)> {
        Some((self.ip?, prefix_len(self.mask.as_deref()?)?))
    }
}

/// `netlink.Route` (v1.3.1). KubeVirt sets only `Dst` (nil for the default route) and
/// `Gw` (nil for an on-link route); every other field keeps Go's zero value, written out
/// because Go writes every field.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(default)]
pub struct NetlinkRoute {
    #[serde(rename = "LinkIndex")]
    pub link_index: i64,
    #[serde(rename = "ILinkIndex")]
    pub ilink_index: i64,
    #[serde(rename = "Scope")]
    pub scope: u8,
    #[serde(rename = "Dst")]
    pub dst: Option<GoIpNet>,
    #[serde(rename = "Src", with = "go_ip")]
    pub src: Option<IpAddr>,
    #[serde(rename = "Gw", with = "go_ip")]
    pub gw: Option<IpAddr>,
    /// Go interfaces and pointers KubeVirt leaves nil, kept verbatim.
    #[serde(rename = "MultiPath")]
    pub multi_path: serde_json::Value,
    #[serde(rename = "Protocol")]
    pub protocol: i64,
    #[serde(rename = "Priority")]
    pub priority: i64,
    #[serde(rename = "Family")]
    pub family: i64,
    #[serde(rename = "Table")]
    pub table: i64,
    #[serde(rename = "Type")]
    pub r#type: i64,
    #[serde(rename = "Tos")]
    pub tos: i64,
    #[serde(rename = "Flags")]
    pub flags: i64,
    #[serde(rename = "MPLSDst")]
    pub mpls_dst: serde_json::Value,
    #[serde(rename = "NewDst")]
    pub new_dst: serde_json::Value,
    #[serde(rename = "Encap")]
    pub encap: serde_json::Value,
    #[serde(rename = "Via")]
    pub via: serde_json::Value,
    #[serde(rename = "Realm")]
    pub realm: i64,
    #[serde(rename = "MTU")]
    pub mtu: i64,
    #[serde(rename = "MTULock")]
    pub mtu_lock: bool,
    #[serde(rename = "Window")]
    pub window: i64,
    #[serde(rename = "Rtt")]
    pub rtt: i64,
    #[serde(rename = "RttVar")]
    pub rtt_var: i64,
    #[serde(rename = "Ssthresh")]
    pub ssthresh: i64,
    #[serde(rename = "Cwnd")]
    pub cwnd: i64,
    #[serde(rename = "AdvMSS")]
    pub adv_mss: i64,
    #[serde(rename = "Reordering")]
    pub reordering: i64,
    #[serde(rename = "Hoplimit")]
    pub hoplimit: i64,
    #[serde(rename = "InitCwnd")]
    pub init_cwnd: i64,
    #[serde(rename = "Features")]
    pub features: i64,
    #[serde(rename = "RtoMin")]
    pub rto_min: i64,
    #[serde(rename = "RtoMinLock")]
    pub rto_min_lock: bool,
    #[serde(rename = "InitRwnd")]
    pub init_rwnd: i64,
    #[serde(rename = "QuickACK")]
    pub quick_ack: i64,
    #[serde(rename = "Congctl")]
    pub congctl: String,
    #[serde(rename = "FastOpenNoCookie")]
    pub fast_open_no_cookie: i64,
}

impl NetlinkRoute {
    /// A route as KubeVirt records it: destination (`None`: the default route) and next
    /// hop (`None`: on-link).
    pub fn new(dst: Option<(IpAddr, u8)>, gw: Option<IpAddr>) -> Self {
        NetlinkRoute {
            dst: dst.map(|(ip, len)| GoIpNet::network(ip, len)),
            gw,
            ..Default::default()
        }
    }
}

/// The mask of `prefix_len` bits, 4 bytes for IPv4 and 16 for IPv6 (as `net.CIDRMask`).
fn mask_bytes(ip: IpAddr, prefix_len: u8) -> Vec<u8> {
    let width = if ip.is_ipv4() { 4 } else { 16 };
    let mut left = usize::from(prefix_len).min(width * 8);
    (0..width)
        .map(|_| {
            let bits = left.min(8);
            left -= bits;
            // `bits` ones from the top of the byte: the low byte of 0xff00 shifted right.
            let [low, _high] = (0xff00u16 >> bits).to_le_bytes();
            low
        })
        .collect()
}

/// The prefix length of a canonical mask (`net.IPMask.Size`); `None` if not contiguous.
fn prefix_len(mask: &[u8]) -> Option<u8> {
    if mask.len() != 4 && mask.len() != 16 {
        return None;
    }
    let ones: u32 = mask.iter().map(|b| b.count_ones()).sum();
    let canonical = mask_bytes(
        if mask.len() == 4 {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        },
        u8::try_from(ones).ok()?,
    );
    (canonical == mask)
        .then(|| u8::try_from(ones).ok())
        .flatten()
}

/// `net.IP` in Go's JSON: the text form, `""` for nil (`null` is read as nil too).
/// IPv4-mapped addresses are read as IPv4, as Go prints them.
mod go_ip {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::net::IpAddr;

    pub fn serialize<S: Serializer>(ip: &Option<IpAddr>, s: S) -> Result<S::Ok, S::Error> {
        match ip {
            Some(ip) => s.collect_str(ip),
            None => s.serialize_str(""),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpAddr>, D::Error> {
        match Option::<String>::deserialize(d)?.as_deref() {
            None | Some("") => Ok(None),
            Some(text) => text
                .parse::<IpAddr>()
                .map(|ip| Some(ip.to_canonical()))
                .map_err(|_| serde::de::Error::custom(format!("invalid IP address {text:?}"))),
        }
    }
}

/// `[]byte` in Go's JSON: standard base64, `null` for nil.
mod go_bytes {
    use base64::Engine;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match bytes {
            Some(b) => s.serialize_str(&STANDARD.encode(b)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| {
                STANDARD
                    .decode(&text)
                    .map_err(|e| serde::de::Error::custom(format!("invalid base64 {text:?}: {e}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_prefix_lengths() {
        let v4 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
        assert_eq!(mask_bytes(v4, 24), [255, 255, 255, 0]);
        assert_eq!(mask_bytes(v4, 0), [0, 0, 0, 0]);
        assert_eq!(mask_bytes(v4, 19), [255, 255, 224, 0]);
        assert_eq!(prefix_len(&[255, 255, 224, 0]), Some(19));
        assert_eq!(prefix_len(&[255, 255, 255, 255]), Some(32));
        assert_eq!(prefix_len(&[255, 0, 255, 0]), None);
        assert_eq!(prefix_len(&[255, 255]), None);
        let v6 = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
        assert_eq!(prefix_len(&mask_bytes(v6, 64)), Some(64));
    }

    #[test]
    fn networks_are_masked_like_parse_cidr() {
        let net = GoIpNet::network("10.244.1.77".parse().unwrap(), 24);
        assert_eq!(net.cidr(), Some(("10.244.1.0".parse().unwrap(), 24)));
        let all = GoIpNet::network("10.244.1.77".parse().unwrap(), 0);
        assert_eq!(all.cidr(), Some(("0.0.0.0".parse().unwrap(), 0)));
    }

    #[test]
    fn file_names_follow_kubevirt() {
        assert_eq!(file_name("eth0"), "vif-cache-eth0.json");
        assert_eq!(
            path_in_pod("eth0"),
            "/var/run/kubevirt-private/vif-cache-eth0.json"
        );
    }

    #[test]
    fn bad_values_are_errors() {
        for bad in [
            r#"{"IP": {"IP": "10.0.0.300"}}"#,
            r#"{"MAC": "not base64!"}"#,
            r#"{"Gateway": 5}"#,
        ] {
            assert!(serde_json::from_str::<DhcpConfig>(bad).is_err(), "{bad}");
        }
        // A MAC of the wrong length parses, but is no Ethernet address.
        let short: DhcpConfig = serde_json::from_str(r#"{"MAC": "AQI="}"#).unwrap();
        assert_eq!(short.mac_address(), None);
        let bad_mask: DhcpConfig =
            serde_json::from_str(r#"{"IP": {"IP": "10.0.0.1", "Mask": "/wD/AA=="}}"#).unwrap();
        assert_eq!(bad_mask.ipv4(), None);
    }
}
