//! The bridge binding in real namespaces: a "node" and a "pod" joined by a veth (as a
//! CNI bridge plugin leaves them: the pod's `eth0` with the pod IP and a default route
//! via the node), and a guest playing on the tap with raw Ethernet frames. Needs root;
//! fails (never skips) without it.

mod common;

use std::net::{IpAddr, Ipv4Addr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use netsetup::binding::BindingError;
use netsetup::bridge::{self, BridgeConfig, BridgeOutcome};
use netsetup::dhcp::{DhcpConfig, DhcpServer};
use netsetup::links::LinkState;
use netsetup::resolv::ResolvConf;

const WAIT: Duration = Duration::from_secs(5);
const FAKE_BRIDGE_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 75, 10);
const OTHER_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0xbb, 0xbb, 0xbb];

/// The pod as a CNI bridge plugin leaves it: `eth0` addressed, default route via the node.
fn pod_topology(with_v6: bool) -> Topology {
    let topo = Topology::new(with_v6);
    topo.pod
        .sh(&format!("ip route add default via {NODE_V4} dev eth0"));
    if with_v6 {
        topo.pod
            .sh(&format!("ip -6 route add default via {NODE_V6} dev eth0"));
    }
    topo
}

fn config_for(pod: &Netns) -> BridgeConfig {
    BridgeConfig::new(pod.target())
}

fn link(ns: &Netns, name: &str) -> Option<LinkState> {
    let name = name.to_string();
    ns.netlink(move |h| async move { netsetup::links::link_by_name(&h, &name).await.unwrap() })
}

fn mac(link: &LinkState) -> [u8; 6] {
    link.mac.as_deref().unwrap().try_into().unwrap()
}

/// KubeVirt's dummy, or the ifb link netsetup uses where the kernel has no dummy driver.
fn identity_kind() -> &'static str {
    let probe = Netns::new();
    let out = probe.run(|| {
        std::process::Command::new("ip")
            .args(["link", "add", "probe0", "type", "dummy"])
            .output()
            .expect("run ip")
    });
    if out.status.success() { "dummy" } else { "ifb" }
}

fn read_sysctl(ns: &Netns, key: &'static str) -> String {
    ns.run(move || netsetup::sysctl::read(key).unwrap())
}

/// Everything the binding may change, sorted so that dump order does not matter:
/// links (with MACs and MTUs), tap owners, addresses, IPv4/IPv6 routes, `arp_ignore`.
fn snapshot(ns: &Netns) -> String {
    let text = ns.sh(
        "ip -o link show | sed -e 's/^[0-9]*: //' -e 's/@if[0-9]*//' -e 's/link-netnsid [0-9]*//' -e 's/state [A-Z]* //' -e 's/NO-CARRIER,//' -e 's/,LOWER_UP//'; \
         ip -o -d link show | grep -o 'tun type.*group [0-9]*' || true; \
         ip -o addr show | sed -e 's/^[0-9]*: //' -e 's/ tentative//' -e 's/ dadfailed//' -e 's/ nodad//'; \
         ip route show; ip -6 route show; \
         cat /proc/sys/net/ipv4/conf/all/arp_ignore",
    );
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    lines.join("\n")
}

fn arp_frame(
    op: u16,
    eth_dst: [u8; 6],
    sender: ([u8; 6], Ipv4Addr),
    target: ([u8; 6], Ipv4Addr),
) -> Vec<u8> {
    let mut f = Vec::with_capacity(42);
    f.extend_from_slice(&eth_dst);
    f.extend_from_slice(&sender.0);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0x00, 6, 4]);
    f.extend_from_slice(&op.to_be_bytes());
    f.extend_from_slice(&sender.0);
    f.extend_from_slice(&sender.1.octets());
    f.extend_from_slice(&target.0);
    f.extend_from_slice(&target.1.octets());
    f
}

/// (operation, sender MAC, sender IP, target IP) of an ARP frame.
fn parse_arp(frame: &[u8]) -> Option<(u16, [u8; 6], Ipv4Addr, Ipv4Addr)> {
    if frame.len() < 42 || frame[12..14] != [0x08, 0x06] {
        return None;
    }
    let a = &frame[14..];
    let ip = |b: &[u8]| Ipv4Addr::new(b[0], b[1], b[2], b[3]);
    Some((
        u16::from_be_bytes([a[6], a[7]]),
        a[8..14].try_into().ok()?,
        ip(&a[14..18]),
        ip(&a[24..28]),
    ))
}

/// One DHCP request from `chaddr` (broadcast, retransmitted like a real client); the
/// reply with the same transaction id and its IP source, or `None` after `tries`.
fn dhcp_exchange(
    guest: &Guest,
    chaddr: [u8; 6],
    kind: MessageType,
    requested: Option<Ipv4Addr>,
    xid: u32,
    tries: usize,
) -> Option<(Message, Ipv4Addr, Ipv4Addr)> {
    let mut msg = Message::default();
    msg.set_xid(xid).set_chaddr(&chaddr);
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    if let Some(ip) = requested {
        msg.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(FAKE_BRIDGE_IP));
    }
    let mut frame = Vec::new();
    PacketBuilder::ethernet2(chaddr, [0xff; 6])
        .ipv4([0, 0, 0, 0], [255, 255, 255, 255], 64)
        .udp(68, 67)
        .write(&mut frame, &msg.to_vec().unwrap())
        .unwrap();
    for _ in 0..tries {
        guest.send(&frame);
        let reply = guest.recv_until(WAIT / 10, |frame| {
            let packet = SlicedPacket::from_ethernet(frame).ok()?;
            let Some(NetSlice::Ipv4(ip)) = &packet.net else {
                return None;
            };
            let (src, dst) = (ip.header().source_addr(), ip.header().destination_addr());
            let TransportSlice::Udp(udp) = packet.transport? else {
                return None;
            };
            if udp.destination_port() != 68 {
                return None;
            }
            let reply = Message::decode(&mut Decoder::new(udp.payload())).ok()?;
            (reply.xid() == xid).then_some((reply, src, dst))
        });
        if reply.is_some() {
            return reply;
        }
    }
    None
}

/// Serves DHCP in the pod's namespace from the outcome's cache until dropped.
struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    fn start(pod: &Netns, outcome: &BridgeOutcome) -> Server {
        let resolv = ResolvConf::parse(
            "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\n",
        );
        let config = DhcpConfig::bridge(
            &outcome.dhcp,
            FAKE_BRIDGE_IP,
            &resolv,
            Some("testvmi".into()),
            None,
            outcome.mtu,
        )
        .expect("bridge DHCP config")
        .expect("the pod has IPv4");
        let server = pod
            .run(move || DhcpServer::bind("k6t-eth0", config))
            .expect("bind DHCP server");
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                server
                    .serve_until(&stop, Duration::from_millis(100))
                    .expect("server loop")
            })
        };
        Server {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn setup_bridges_the_pod_interface_and_keeps_the_pod_identity_on_a_dummy() {
    let topo = pod_topology(true);
    let pod_mac = mac(&link(&topo.pod, "eth0").unwrap());
    let outcome = bridge::setup(&config_for(&topo.pod)).expect("setup");
    assert_eq!(outcome.bridge, "k6t-eth0");
    assert_eq!(outcome.nic, "eth0-nic");
    assert_eq!(outcome.tap, "tap0");
    assert_eq!(outcome.mtu, 1400);
    assert_eq!(outcome.pod_mac, pod_mac);
    assert_eq!(outcome.pod_ipv4, Some(POD_V4.parse().unwrap()));
    assert_eq!(outcome.pod_ipv6, Some(POD_V6.parse().unwrap()));

    let bridge = link(&topo.pod, "k6t-eth0").expect("bridge");
    let dummy = link(&topo.pod, "eth0").expect("dummy eth0");
    let nic = link(&topo.pod, "eth0-nic").expect("eth0-nic");
    let tap = link(&topo.pod, "tap0").expect("tap0");
    assert_eq!(bridge.kind.as_deref(), Some("bridge"));
    assert!(bridge.up);
    assert_eq!(bridge.mtu, 1400, "the bridge follows its ports' MTU");
    assert_eq!(dummy.kind.as_deref(), Some(identity_kind()));
    assert_eq!(mac(&dummy), pod_mac, "the dummy keeps the pod's MAC");
    assert_eq!(dummy.mtu, 1400);
    assert!(!dummy.up, "KubeVirt leaves the dummy down");
    assert_eq!(nic.kind.as_deref(), Some("veth"));
    assert_eq!(nic.controller, Some(bridge.index));
    assert!(nic.up);
    assert_ne!(
        mac(&nic),
        pod_mac,
        "the bridge port must give up the guest's MAC"
    );
    let tun = tap.tun.as_ref().expect("tap info");
    assert!(tun.is_tap && tun.persistent);
    assert_eq!((tun.owner, tun.group), (Some(107), Some(107)));
    assert_eq!(tap.controller, Some(bridge.index));
    assert_eq!(tap.mtu, 1400);

    let addrs = |dev: &str| topo.pod.sh(&format!("ip -o addr show dev {dev}"));
    let on_dummy = addrs("eth0");
    assert!(
        on_dummy.contains(&format!("{POD_V4}/24")) && on_dummy.contains(&format!("{POD_V6}/64")),
        "{on_dummy}"
    );
    let on_nic = addrs("eth0-nic");
    assert!(
        !on_nic.contains("inet ") && !on_nic.contains("scope global"),
        "{on_nic}"
    );
    let on_bridge = addrs("k6t-eth0");
    assert!(on_bridge.contains("inet 169.254.75.10/32"), "{on_bridge}");
    // The pod IP stays a local address of the pod, as in KubeVirt.
    let local = topo.pod.sh("ip route show table local");
    assert!(
        local.contains(&format!("local {POD_V4} dev eth0")),
        "{local}"
    );
    assert!(
        topo.pod.sh("ip route show").trim().is_empty(),
        "the pod keeps no route of its own"
    );
    let nic_details = topo.pod.sh("ip -d link show eth0-nic");
    assert!(nic_details.contains("learning off"), "{nic_details}");
    assert_eq!(
        read_sysctl(&topo.pod, netsetup::sysctl::ARP_IGNORE_ALL),
        "1"
    );

    // What the handler writes for the launcher's DHCP server.
    let dhcp = &outcome.dhcp;
    assert!(!dhcp.ipam_disabled);
    assert_eq!(dhcp.ipv4(), Some((POD_V4.parse().unwrap(), 24)));
    assert_eq!(dhcp.mac_address(), Some(pod_mac));
    assert_eq!(dhcp.gateway, Some(NODE_V4.parse().unwrap()));
    let routes = dhcp.routes.as_ref().expect("routes");
    assert_eq!(routes.len(), 1, "the subnet route is left out: {routes:?}");
    assert_eq!(routes[0].dst, None);
    assert_eq!(routes[0].gw, Some(NODE_V4.parse().unwrap()));
}

#[test]
fn the_guest_gets_the_pods_address_by_dhcp_and_only_its_mac_is_answered() {
    let topo = pod_topology(false);
    let outcome = bridge::setup(&config_for(&topo.pod)).expect("setup");
    let guest = Guest::attach(&topo.pod, "tap0");
    let _server = Server::start(&topo.pod, &outcome);
    let pod_mac = outcome.pod_mac;

    let (offer, src, dst) = dhcp_exchange(
        &guest,
        pod_mac,
        MessageType::Discover,
        None,
        0x0b0b_0001,
        10,
    )
    .expect("no DHCP offer came out of the tap");
    assert_eq!(
        src, FAKE_BRIDGE_IP,
        "replies come from the bridge's address"
    );
    assert_eq!(dst, Ipv4Addr::BROADCAST);
    let o = offer.opts();
    assert_eq!(
        o.get(OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Offer))
    );
    assert_eq!(offer.yiaddr(), POD_V4.parse::<Ipv4Addr>().unwrap());
    assert_eq!(
        o.get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(FAKE_BRIDGE_IP))
    );
    assert_eq!(
        o.get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
    );
    assert_eq!(
        o.get(OptionCode::Router),
        Some(&DhcpOption::Router(vec![NODE_V4.parse().unwrap()]))
    );
    assert_eq!(
        o.get(OptionCode::ClasslessStaticRoute),
        Some(&DhcpOption::ClasslessStaticRoute(vec![(
            "0.0.0.0/0".parse().unwrap(),
            NODE_V4.parse().unwrap()
        )]))
    );
    assert_eq!(
        o.get(OptionCode::InterfaceMtu),
        Some(&DhcpOption::InterfaceMtu(1400))
    );
    assert_eq!(
        o.get(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
            10, 96, 0, 10
        )]))
    );
    assert_eq!(
        o.get(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("testvmi".into()))
    );
    let (ack, _, _) = dhcp_exchange(
        &guest,
        pod_mac,
        MessageType::Request,
        Some(POD_V4.parse().unwrap()),
        0x0b0b_0002,
        10,
    )
    .expect("no DHCP ack");
    assert_eq!(
        ack.opts().get(OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Ack))
    );
    assert_eq!(ack.yiaddr(), POD_V4.parse::<Ipv4Addr>().unwrap());

    // Another client on the same bridge (the bridge reaches the whole pod network)
    // gets nothing.
    assert!(
        dhcp_exchange(
            &guest,
            OTHER_MAC,
            MessageType::Discover,
            None,
            0x0b0b_0003,
            10
        )
        .is_none(),
        "the server answered a MAC that is not the guest's"
    );
    // ...and the guest still does.
    assert!(
        dhcp_exchange(
            &guest,
            pod_mac,
            MessageType::Discover,
            None,
            0x0b0b_0004,
            10
        )
        .is_some()
    );
}

#[test]
fn the_guest_talks_to_the_node_as_the_pod() {
    let topo = pod_topology(false);
    let outcome = bridge::setup(&config_for(&topo.pod)).expect("setup");
    let guest = Guest::attach(&topo.pod, "tap0");
    let guest_mac = outcome.pod_mac;
    let pod_ip: Ipv4Addr = POD_V4.parse().unwrap();
    let node_ip: Ipv4Addr = NODE_V4.parse().unwrap();
    let node_mac = mac(&link(&topo.node, "vnode").unwrap());

    // Node → guest: the node resolves the pod IP; the guest, not the pod, answers.
    let node_socket = topo
        .node
        .run(move || UdpSocket::bind((node_ip, 0)).expect("node socket"));
    node_socket
        .send_to(b"to the guest", (pod_ip, 7777))
        .unwrap();
    let request = guest
        .recv_until(WAIT, |frame| {
            parse_arp(frame).filter(|(op, _, _, target)| *op == 1 && *target == pod_ip)
        })
        .expect("the node's ARP request for the pod IP never reached the guest");
    assert_eq!(request.1, node_mac);
    guest.send(&arp_frame(
        2,
        node_mac,
        (guest_mac, pod_ip),
        (node_mac, node_ip),
    ));
    let datagram = guest
        .recv_until(WAIT, |frame| {
            let packet = SlicedPacket::from_ethernet(frame).ok()?;
            let TransportSlice::Udp(udp) = packet.transport? else {
                return None;
            };
            (udp.destination_port() == 7777).then(|| udp.payload().to_vec())
        })
        .expect("the node's datagram for the pod IP never reached the guest");
    assert_eq!(datagram, b"to the guest");
    let neigh = topo.node.sh(&format!("ip neigh show {POD_V4}"));
    let guest_mac_text = guest_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    assert!(
        neigh.contains(&guest_mac_text),
        "the node must know the pod IP at the guest's MAC (arp_ignore): {neigh}"
    );

    // Guest → node: ARP for the node, then a datagram the node receives from the pod IP.
    let listener = topo
        .node
        .run(move || UdpSocket::bind((node_ip, 9999)).expect("node listener"));
    listener.set_read_timeout(Some(WAIT)).unwrap();
    guest.send(&arp_frame(
        1,
        [0xff; 6],
        (guest_mac, pod_ip),
        ([0; 6], node_ip),
    ));
    let reply = guest
        .recv_until(WAIT, |frame| {
            parse_arp(frame).filter(|(op, _, sender, _)| *op == 2 && *sender == node_ip)
        })
        .expect("no ARP reply from the node reached the guest");
    assert_eq!(reply.1, node_mac);
    let mut frame = Vec::new();
    PacketBuilder::ethernet2(guest_mac, node_mac)
        .ipv4(pod_ip.octets(), node_ip.octets(), 64)
        .udp(40000, 9999)
        .write(&mut frame, b"from the guest")
        .unwrap();
    guest.send(&frame);
    let mut buf = [0u8; 64];
    let (n, from) = listener
        .recv_from(&mut buf)
        .expect("the guest's datagram never reached the node");
    assert_eq!(&buf[..n], b"from the guest");
    assert_eq!(from.ip(), IpAddr::V4(pod_ip));
}

#[test]
fn rerun_converges_and_teardown_gives_the_pod_interface_back() {
    let topo = pod_topology(true);
    let before = snapshot(&topo.pod);
    let arp_ignore_before = read_sysctl(&topo.pod, netsetup::sysctl::ARP_IGNORE_ALL);
    let config = config_for(&topo.pod);
    let first = bridge::setup(&config).expect("first setup");
    let once = snapshot(&topo.pod);
    assert_ne!(before, once);
    let second = bridge::setup(&config).expect("second setup");
    assert_eq!(first, second, "a rerun reports the same DHCP data");
    assert_eq!(
        once,
        snapshot(&topo.pod),
        "second run changed the namespace"
    );
    {
        let _vmm = Guest::attach(&topo.pod, "tap0");
        bridge::setup(&config).expect("setup again with the tap in use");
    }
    bridge::teardown(&config).expect("teardown");
    assert_eq!(snapshot(&topo.pod), before, "teardown left traces");
    assert_eq!(
        read_sysctl(&topo.pod, netsetup::sysctl::ARP_IGNORE_ALL),
        arp_ignore_before
    );
    bridge::teardown(&config).expect("teardown of nothing");
    // The pod's own traffic works again, through its default route too.
    let node_ip: Ipv4Addr = NODE_V4.parse().unwrap();
    let listener = topo
        .node
        .run(move || UdpSocket::bind((node_ip, 9998)).expect("node listener"));
    listener.set_read_timeout(Some(WAIT)).unwrap();
    topo.node.sh("ip addr add 198.51.100.1/32 dev vnode");
    let far = topo
        .node
        .run(|| UdpSocket::bind(("198.51.100.1", 9997)).unwrap());
    far.set_read_timeout(Some(WAIT)).unwrap();
    topo.pod.run(move || {
        let s = UdpSocket::bind(("0.0.0.0", 0)).unwrap();
        s.send_to(b"back", (node_ip, 9998)).unwrap();
        s.send_to(b"far", ("198.51.100.1", 9997)).unwrap();
    });
    let mut buf = [0u8; 8];
    let (n, from) = listener
        .recv_from(&mut buf)
        .expect("pod → node after teardown");
    assert_eq!(
        (&buf[..n], from.ip()),
        (&b"back"[..], POD_V4.parse::<IpAddr>().unwrap())
    );
    let (n, _) = far
        .recv_from(&mut buf)
        .expect("pod → default route after teardown");
    assert_eq!(&buf[..n], b"far");
}

#[test]
fn failure_midway_rolls_back_everything() {
    // A pod MTU a veth, dummy and bridge accept but a tap does not (tap max 65521): the
    // set-up fails after moving the pod interface, and must give it back.
    let topo = pod_topology(true);
    topo.pod.sh("ip link set eth0 mtu 65535");
    let before = snapshot(&topo.pod);
    let err = bridge::setup(&config_for(&topo.pod)).unwrap_err();
    assert!(matches!(err, BindingError::Link(_)), "{err}");
    assert_eq!(snapshot(&topo.pod), before, "failed setup left changes");
    // And a later run with a usable MTU succeeds.
    topo.pod.sh("ip link set eth0 mtu 1400");
    bridge::setup(&config_for(&topo.pod)).expect("setup after the rollback");
}

#[test]
fn a_run_stopped_after_the_move_is_completed() {
    let topo = pod_topology(false);
    let config = config_for(&topo.pod);
    let first = bridge::setup(&config).expect("setup");
    // As if the first run had stopped right after moving the pod interface.
    topo.pod.sh(
        "ip link del tap0; ip addr del 169.254.75.10/32 dev k6t-eth0; \
         echo 0 > /proc/sys/net/ipv4/conf/all/arp_ignore",
    );
    let again = bridge::setup(&config).expect("setup over a half-done run");
    assert_eq!(first, again, "the dummy's record gives the same DHCP data");
    let tap = link(&topo.pod, "tap0").expect("tap0 again");
    assert_eq!(tap.controller, link(&topo.pod, "k6t-eth0").map(|b| b.index));
    assert!(
        topo.pod
            .sh("ip -o addr show dev k6t-eth0")
            .contains("169.254.75.10/32")
    );
    assert_eq!(
        read_sysctl(&topo.pod, netsetup::sysctl::ARP_IGNORE_ALL),
        "1"
    );
}

#[test]
fn clashes_are_clear_errors_and_touch_nothing() {
    // A bridge of that name netsetup did not make.
    let topo = pod_topology(false);
    let before = snapshot(&topo.pod);
    topo.pod.sh("ip link add k6t-eth0 type bridge");
    let err = bridge::setup(&config_for(&topo.pod)).unwrap_err();
    assert!(matches!(err, BindingError::Clash(_)), "{err}");
    assert!(err.to_string().contains("k6t-eth0"), "{err}");
    topo.pod.sh("ip link del k6t-eth0");
    assert_eq!(snapshot(&topo.pod), before);

    // A masquerade bridge is not the bridge binding's.
    netsetup::masquerade::setup(&netsetup::masquerade::MasqueradeConfig::new(
        topo.pod.target(),
    ))
    .expect("masquerade");
    let err = bridge::setup(&config_for(&topo.pod)).unwrap_err();
    assert!(matches!(err, BindingError::Clash(_)), "{err}");
    netsetup::masquerade::teardown(&netsetup::masquerade::MasqueradeConfig::new(
        topo.pod.target(),
    ))
    .expect("masquerade teardown");
    assert_eq!(snapshot(&topo.pod), before);

    // A foreign link with the bridged name.
    topo.pod
        .sh("ip link add eth0-nic type veth peer name nicpeer");
    let err = bridge::setup(&config_for(&topo.pod)).unwrap_err();
    assert!(
        matches!(err, BindingError::Clash(ref m) if m.contains("eth0-nic")),
        "{err}"
    );
    topo.pod.sh("ip link del eth0-nic");

    // A pod interface renamed without the dummy: nothing to recover from.
    topo.pod
        .sh("ip link set eth0 down; ip link set eth0 name eth0-nic");
    let err = bridge::setup(&config_for(&topo.pod)).unwrap_err();
    assert!(
        matches!(err, BindingError::Clash(ref m) if m.contains("half-way")),
        "{err}"
    );

    // No pod interface at all.
    let empty = Netns::new();
    let err = bridge::setup(&config_for(&empty)).unwrap_err();
    assert!(
        matches!(err, BindingError::PodInterfaceMissing(ref i) if i == "eth0"),
        "{err}"
    );
    assert_eq!(empty.link_names(), vec!["lo".to_string()]);
}

#[test]
fn ipv6_only_pod_gets_no_dhcp_and_no_fake_address() {
    let topo = Topology::with_pod_addrs(&[], true);
    let before = snapshot(&topo.pod);
    let arp_ignore_before = read_sysctl(&topo.pod, netsetup::sysctl::ARP_IGNORE_ALL);
    let outcome = bridge::setup(&config_for(&topo.pod)).expect("setup");
    assert!(outcome.dhcp.ipam_disabled);
    assert_eq!(outcome.pod_ipv4, None);
    assert_eq!(outcome.pod_ipv6, Some(POD_V6.parse().unwrap()));
    let on_bridge = topo.pod.sh("ip -o addr show dev k6t-eth0");
    assert!(!on_bridge.contains("169.254"), "{on_bridge}");
    assert_eq!(
        read_sysctl(&topo.pod, netsetup::sysctl::ARP_IGNORE_ALL),
        arp_ignore_before
    );
    let on_dummy = topo.pod.sh("ip -o addr show dev eth0");
    assert!(on_dummy.contains(&format!("{POD_V6}/64")), "{on_dummy}");
    assert_eq!(
        DhcpConfig::bridge(
            &outcome.dhcp,
            FAKE_BRIDGE_IP,
            &ResolvConf::default(),
            None,
            None,
            1400
        )
        .unwrap(),
        None,
        "no DHCP server without IPv4"
    );
    bridge::teardown(&config_for(&topo.pod)).expect("teardown");
    assert_eq!(snapshot(&topo.pod), before);
}

#[test]
fn calico_style_pod_gets_its_routes_as_option_121() {
    // A /32 pod address with an on-link route to the gateway, as Calico makes it.
    let topo = Topology::with_pod_addrs(&[("10.1.2.3", 32)], false);
    topo.pod.sh("ip route add 169.254.1.1 dev eth0 scope link; \
         ip route add default via 169.254.1.1 dev eth0");
    let before = snapshot(&topo.pod);
    let outcome = bridge::setup(&config_for(&topo.pod)).expect("setup");
    assert_eq!(outcome.dhcp.ipv4(), Some((Ipv4Addr::new(10, 1, 2, 3), 32)));
    assert_eq!(outcome.dhcp.gateway, Some("169.254.1.1".parse().unwrap()));
    let guest = Guest::attach(&topo.pod, "tap0");
    let _server = Server::start(&topo.pod, &outcome);
    let (offer, _, _) = dhcp_exchange(
        &guest,
        outcome.pod_mac,
        MessageType::Discover,
        None,
        0x0c0c_0001,
        10,
    )
    .expect("no offer");
    assert_eq!(offer.yiaddr(), Ipv4Addr::new(10, 1, 2, 3));
    assert_eq!(
        offer.opts().get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::BROADCAST))
    );
    // On-link route first, default route last (KubeVirt's sortRoutes).
    assert_eq!(
        offer.opts().get(OptionCode::ClasslessStaticRoute),
        Some(&DhcpOption::ClasslessStaticRoute(vec![
            ("169.254.1.1/32".parse().unwrap(), Ipv4Addr::UNSPECIFIED),
            ("0.0.0.0/0".parse().unwrap(), "169.254.1.1".parse().unwrap()),
        ]))
    );
    drop(guest);
    bridge::teardown(&config_for(&topo.pod)).expect("teardown");
    assert_eq!(snapshot(&topo.pod), before, "both routes come back");
}

#[test]
fn a_vmi_mac_is_what_dhcp_serves() {
    let topo = pod_topology(false);
    let mut config = config_for(&topo.pod);
    config.guest_mac = Some(OTHER_MAC);
    config.iface_index = 2;
    let outcome = bridge::setup(&config).expect("setup");
    assert_eq!(outcome.dhcp.mac_address(), Some(OTHER_MAC));
    let on_bridge = topo.pod.sh("ip -o addr show dev k6t-eth0");
    assert!(on_bridge.contains("169.254.75.12/32"), "{on_bridge}");
}

/// Stops a child process this test started, also when the test fails half-way.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn cli_bridge_dhcp_and_teardown() {
    let topo = pod_topology(false);
    let before = snapshot(&topo.pod);
    let bin = env!("CARGO_BIN_EXE_netsetup");
    let cache = std::env::temp_dir().join(format!(
        "netsetup-test-vif-cache-{}.json",
        std::process::id()
    ));
    let out = std::process::Command::new(bin)
        .args(["bridge", "--netns"])
        .arg(topo.pod.path())
        .args(["--tap-owner", "0", "--write-cache"])
        .arg(&cache)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("nic=eth0-nic") && stderr.contains(&format!("pod_ipv4={POD_V4}")),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&cache).unwrap();
    assert!(text.contains("\"IPAMDisabled\": false"), "{text}");
    let pod_mac = mac(&link(&topo.pod, "eth0").unwrap());

    let guest = Guest::attach(&topo.pod, "tap0");
    let resolv = std::env::temp_dir().join(format!(
        "netsetup-test-resolv-br-{}.conf",
        std::process::id()
    ));
    std::fs::write(&resolv, "search example.org\nnameserver 192.0.2.53\n").unwrap();
    let server = std::process::Command::new(bin)
        .args(["dhcp", "--netns"])
        .arg(topo.pod.path())
        .arg("--resolv-conf")
        .arg(&resolv)
        .arg("--bridge-cache")
        .arg(&cache)
        .args(["--hostname", "clivm"])
        .spawn()
        .expect("start netsetup dhcp");
    let server = KillOnDrop(server);
    let offer = dhcp_exchange(&guest, pod_mac, MessageType::Discover, None, 0x5252, 30);
    let foreign = dhcp_exchange(&guest, OTHER_MAC, MessageType::Discover, None, 0x5253, 5);
    drop(server);
    drop(guest);
    let _ = std::fs::remove_file(&resolv);
    let _ = std::fs::remove_file(&cache);
    let (offer, src, _) = offer.expect("no offer from `netsetup dhcp --bridge-cache`");
    assert_eq!(offer.yiaddr(), POD_V4.parse::<Ipv4Addr>().unwrap());
    assert_eq!(src, FAKE_BRIDGE_IP);
    assert_eq!(
        offer.opts().get(OptionCode::InterfaceMtu),
        Some(&DhcpOption::InterfaceMtu(1400))
    );
    assert!(foreign.is_none(), "the CLI server answered another MAC");

    let out = std::process::Command::new(bin)
        .args(["bridge-teardown", "--netns"])
        .arg(topo.pod.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(snapshot(&topo.pod), before);
}
