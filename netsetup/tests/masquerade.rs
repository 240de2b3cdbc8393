//! The masquerade pod network in real namespaces: a node, a pod joined by a veth, and a
//! guest playing on the tap. Needs root; fails (never skips) without it.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;
use dhcproto::v4::{DhcpOption, Message, MessageType, OptionCode};
use dhcproto::{Decodable, Decoder, Encodable};
use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use netsetup::binding::BindingError;
use netsetup::dhcp::{DhcpConfig, DhcpServer};
use netsetup::masquerade::{self, BRIDGE_MAC, MasqueradeConfig};
use netsetup::nft::{L4Proto, Port};
use netsetup::resolv::ResolvConf;

const WAIT: Duration = Duration::from_secs(5);

fn config_for(pod: &Netns, ports: Vec<Port>) -> MasqueradeConfig {
    let mut config = MasqueradeConfig::new(pod.target());
    config.ports = ports;
    config
}

fn tcp(number: u16) -> Port {
    Port {
        number,
        protocol: L4Proto::Tcp,
    }
}

/// Frame from the guest to the gateway (bridge MAC) carrying a UDP datagram.
fn guest_udp_frame(src: IpAddr, dst: IpAddr, dport: u16, payload: &[u8]) -> Vec<u8> {
    let eth = PacketBuilder::ethernet2(GUEST_MAC, BRIDGE_MAC);
    let mut frame = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .udp(40000, dport)
            .write(&mut frame, payload)
            .unwrap(),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .udp(40000, dport)
            .write(&mut frame, payload)
            .unwrap(),
        _ => panic!("mixed families"),
    }
    frame
}

/// Destination address and port of a TCP SYN in a frame.
fn tcp_syn(frame: &[u8]) -> Option<(IpAddr, u16)> {
    let packet = SlicedPacket::from_ethernet(frame).ok()?;
    let dst = match packet.net? {
        NetSlice::Ipv4(ip) => IpAddr::V4(ip.header().destination_addr()),
        NetSlice::Ipv6(ip) => IpAddr::V6(ip.header().destination_addr()),
        _ => return None,
    };
    match packet.transport? {
        TransportSlice::Tcp(tcp) if tcp.syn() && !tcp.ack() => Some((dst, tcp.destination_port())),
        _ => None,
    }
}

/// Starts a non-blocking connection from the node namespace; the kernel keeps sending
/// SYNs while the returned socket lives.
fn connect_from_node(node: &Netns, to: SocketAddr) -> OwnedFd {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrStorage, connect, socket};
    node.run(move || {
        let family = if to.is_ipv4() {
            AddressFamily::Inet
        } else {
            AddressFamily::Inet6
        };
        let fd = socket(
            family,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            None,
        )
        .expect("tcp socket");
        // EINPROGRESS is the expected answer of a non-blocking connect.
        let _ = connect(fd.as_raw_fd(), &SockaddrStorage::from(to));
        fd
    })
}

/// One DHCP request from the guest (broadcast, retransmitted like a real client) and the
/// server's reply with the same transaction id.
fn dhcp_exchange(
    guest: &Guest,
    kind: MessageType,
    requested: Option<Ipv4Addr>,
    xid: u32,
) -> Message {
    let mut msg = Message::default();
    msg.set_xid(xid).set_chaddr(&GUEST_MAC);
    msg.opts_mut().insert(DhcpOption::MessageType(kind));
    if let Some(ip) = requested {
        msg.opts_mut().insert(DhcpOption::RequestedIpAddress(ip));
        msg.opts_mut()
            .insert(DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 2, 1)));
    }
    let mut frame = Vec::new();
    PacketBuilder::ethernet2(GUEST_MAC, [0xff; 6])
        .ipv4([0, 0, 0, 0], [255, 255, 255, 255], 64)
        .udp(68, 67)
        .write(&mut frame, &msg.to_vec().unwrap())
        .unwrap();
    // Like a real client, retransmit: the bridge port may still be coming up.
    for _ in 0..10 {
        guest.send(&frame);
        let reply = guest.recv_until(WAIT / 10, |frame| {
            let packet = SlicedPacket::from_ethernet(frame).ok()?;
            let TransportSlice::Udp(udp) = packet.transport? else {
                return None;
            };
            if udp.destination_port() != 68 {
                return None;
            }
            let reply = Message::decode(&mut Decoder::new(udp.payload())).ok()?;
            (reply.xid() == xid).then_some(reply)
        });
        if let Some(reply) = reply {
            return reply;
        }
    }
    panic!("no DHCP reply came out of the tap")
}

#[test]
fn setup_builds_contract_names_addresses_and_rules() {
    let topo = Topology::new(true);
    let outcome = masquerade::setup(&config_for(&topo.pod, vec![tcp(80)])).expect("setup");
    assert_eq!(outcome.bridge, "k6t-eth0");
    assert_eq!(outcome.tap, "tap0");
    assert_eq!(outcome.mtu, 1400);
    assert_eq!(outcome.pod_ipv4, Some(POD_V4.parse().unwrap()));
    assert_eq!(outcome.pod_ipv6, Some(POD_V6.parse().unwrap()));

    let links = topo.pod.sh("ip -o -d link show");
    let bridge = links
        .lines()
        .find(|l| l.contains("k6t-eth0:"))
        .expect("bridge");
    assert!(
        bridge.contains("mtu 1400") && bridge.contains("link/ether 02:00:00:00:00:00"),
        "{bridge}"
    );
    assert!(bridge.contains(",UP"), "{bridge}");
    let tap = links.lines().find(|l| l.contains("tap0:")).expect("tap");
    assert!(
        tap.contains("mtu 1400") && tap.contains("master k6t-eth0"),
        "{tap}"
    );
    assert!(
        tap.contains("tun type tap") && tap.contains("persist on"),
        "{tap}"
    );
    assert!(tap.contains("user 107 group 107"), "{tap}");
    let addrs = topo.pod.sh("ip -o addr show dev k6t-eth0");
    assert!(addrs.contains("inet 10.0.2.1/24"), "{addrs}");
    assert!(addrs.contains("inet6 fd10:0:2::1/120"), "{addrs}");
    let sysctls = topo.pod.sh(
        "cat /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv6/conf/all/forwarding /proc/sys/net/ipv4/conf/k6t-eth0/route_localnet",
    );
    assert_eq!(sysctls, "1\n1\n1\n");

    let rules = topo.pod.nft_ruleset();
    for expected in [
        "table ip nat",
        "table ip6 nat",
        "type nat hook prerouting priority dstnat; policy accept;",
        "type nat hook input priority 100; policy accept;",
        "type nat hook output priority -100; policy accept;",
        "type nat hook postrouting priority srcnat; policy accept;",
        "chain KUBEVIRT_PREINBOUND",
        "chain KUBEVIRT_POSTINBOUND",
        "ip saddr 10.0.2.2 counter packets 0 bytes 0 masquerade",
        "ip6 saddr fd10:0:2::2 counter packets 0 bytes 0 masquerade",
        "iifname \"eth0\" counter",
        "oifname \"k6t-eth0\" counter",
        "tcp dport 80 counter packets 0 bytes 0 dnat to 10.0.2.2",
        "tcp dport 80 ip saddr 127.0.0.1 counter packets 0 bytes 0 snat to 10.0.2.1",
        "ip daddr 127.0.0.1 tcp dport 80 counter packets 0 bytes 0 dnat to 10.0.2.2",
        "tcp dport 80 counter packets 0 bytes 0 dnat to fd10:0:2::2",
        "tcp dport 80 ip6 saddr ::1 counter packets 0 bytes 0 snat to fd10:0:2::1",
    ] {
        assert!(rules.contains(expected), "missing {expected:?} in\n{rules}");
    }
    // Migration goes over a unix socket by default: no legacy port rules.
    assert!(!rules.contains("49152"), "{rules}");
}

#[test]
fn istio_and_legacy_migration_rules_use_sets_like_kubevirt() {
    let topo = Topology::new(true);
    let mut config = config_for(&topo.pod, vec![]);
    config.istio = true;
    config.migration_over_unix = false;
    masquerade::setup(&config).expect("setup");
    let rules = topo.pod.nft_ruleset();
    for expected in [
        "tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter packets 0 bytes 0 return",
        "tcp dport { 49152, 49153 } ip6 saddr ::1 counter packets 0 bytes 0 return",
        "tcp dport { 15000, 15001, 15004, 15006, 15008, 15009, 15020, 15021, 15053, 15090 } ip saddr 127.0.0.1 counter packets 0 bytes 0 return",
        "tcp dport 22 counter packets 0 bytes 0 dnat to 10.0.2.2",
        "ip saddr { 127.0.0.1, 127.0.0.6 } counter packets 0 bytes 0 snat to 10.0.2.1",
        "ip daddr { 127.0.0.1, 192.168.77.2 } counter packets 0 bytes 0 dnat to 10.0.2.2",
        "ip6 daddr ::1 counter packets 0 bytes 0 dnat to fd10:0:2::2",
    ] {
        assert!(rules.contains(expected), "missing {expected:?} in\n{rules}");
    }
    // No catch-all DNAT with Istio.
    assert!(
        !rules.contains("KUBEVIRT_PREINBOUND {\n\t\tcounter"),
        "{rules}"
    );
    // Replacing the table also replaces its anonymous sets: a second run is identical.
    masquerade::setup(&config).expect("second setup");
    let without_counters = |r: &str| r.replace(|c: char| c.is_ascii_digit(), "");
    assert_eq!(
        without_counters(&topo.pod.nft_ruleset()),
        without_counters(&rules)
    );
}

#[test]
fn ipv6_only_pod_gets_only_ipv6() {
    let topo = Topology::with_pod_addrs(&[], true);
    let outcome = masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup");
    assert!(outcome.ipv4.is_none() && outcome.ipv6.is_some());
    let addrs = topo.pod.sh("ip -o addr show dev k6t-eth0");
    assert!(
        addrs.contains("fd10:0:2::1/120") && !addrs.contains("10.0.2.1"),
        "{addrs}"
    );
    let rules = topo.pod.nft_ruleset();
    assert!(
        rules.contains("table ip6 nat") && !rules.contains("table ip nat"),
        "{rules}"
    );
    assert_eq!(topo.pod.sh("cat /proc/sys/net/ipv4/ip_forward"), "0\n");
}

#[test]
fn second_run_while_the_vmm_holds_the_tap_succeeds() {
    let topo = Topology::new(true);
    let config = config_for(&topo.pod, vec![]);
    masquerade::setup(&config).expect("setup");
    let _vmm = Guest::attach(&topo.pod, "tap0");
    masquerade::setup(&config).expect("setup again with the tap in use");
}

#[test]
fn failure_midway_rolls_back_everything() {
    // A pod MTU the bridge accepts but a tap does not (tap max 65521): setup fails after
    // creating bridge, addresses and tap, and must undo them.
    let topo = Topology::new(true);
    topo.pod.netlink(|h| async move {
        let eth0 = netsetup::links::link_by_name(&h, "eth0")
            .await
            .unwrap()
            .unwrap();
        netsetup::links::change_link(
            &h,
            eth0.index,
            netsetup::links::LinkChange {
                mtu: Some(65535),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    });
    let before = topo.pod.snapshot();
    let err = masquerade::setup(&config_for(&topo.pod, vec![])).unwrap_err();
    assert!(matches!(err, BindingError::Link(_)), "{err}");
    assert_eq!(topo.pod.snapshot(), before, "failed setup left changes");
}

#[test]
fn ipv4_only_pod_gets_no_ipv6_gateway_or_rules() {
    let topo = Topology::new(false);
    let outcome = masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup");
    assert!(outcome.ipv6.is_none());
    let addrs = topo.pod.sh("ip -o addr show dev k6t-eth0");
    assert!(
        addrs.contains("10.0.2.1/24") && !addrs.contains("fd10"),
        "{addrs}"
    );
    let rules = topo.pod.nft_ruleset();
    assert!(
        rules.contains("table ip nat") && !rules.contains("table ip6 nat"),
        "{rules}"
    );
    assert!(
        rules.contains("counter packets 0 bytes 0 dnat to 10.0.2.2"),
        "{rules}"
    );
}

#[test]
fn dhcp_through_the_tap_returns_contract_options() {
    let topo = Topology::new(true);
    masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup");
    let guest = Guest::attach(&topo.pod, "tap0");

    let resolv = ResolvConf::parse(
        "search default.svc.cluster.local svc.cluster.local cluster.local\nnameserver 10.96.0.10\n",
    );
    let dhcp_config = DhcpConfig::masquerade(
        masquerade::DEFAULT_IPV4_CIDR,
        &resolv,
        Some("testvmi".into()),
        None,
        1400,
    )
    .unwrap();
    let server = topo
        .pod
        .run(move || DhcpServer::bind("k6t-eth0", dhcp_config))
        .expect("bind DHCP server");
    let stop = Arc::new(AtomicBool::new(false));
    let server_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || server.serve_until(&stop, Duration::from_millis(100)))
    };

    let exchange = |kind, requested, xid| dhcp_exchange(&guest, kind, requested, xid);

    let offer = exchange(MessageType::Discover, None, 0x1234_5678);
    let opts = offer.opts();
    assert_eq!(
        opts.get(OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Offer))
    );
    assert_eq!(offer.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));
    assert_eq!(
        opts.get(OptionCode::ServerIdentifier),
        Some(&DhcpOption::ServerIdentifier(Ipv4Addr::new(10, 0, 2, 1)))
    );
    assert_eq!(
        opts.get(OptionCode::Router),
        Some(&DhcpOption::Router(vec![Ipv4Addr::new(10, 0, 2, 1)]))
    );
    assert_eq!(
        opts.get(OptionCode::SubnetMask),
        Some(&DhcpOption::SubnetMask(Ipv4Addr::new(255, 255, 255, 0)))
    );
    assert_eq!(
        opts.get(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![Ipv4Addr::new(
            10, 96, 0, 10
        )]))
    );
    assert_eq!(
        opts.get(OptionCode::DomainName),
        Some(&DhcpOption::DomainName("default.svc.cluster.local".into()))
    );
    assert_eq!(
        opts.get(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("testvmi".into()))
    );
    assert_eq!(
        opts.get(OptionCode::InterfaceMtu),
        Some(&DhcpOption::InterfaceMtu(1400))
    );
    assert_eq!(
        opts.get(OptionCode::AddressLeaseTime),
        Some(&DhcpOption::AddressLeaseTime(86_313_600))
    );
    let Some(DhcpOption::DomainSearch(search)) = opts.get(OptionCode::DomainSearch) else {
        panic!("no option 119");
    };
    assert_eq!(search.len(), 3);

    let ack = exchange(
        MessageType::Request,
        Some(Ipv4Addr::new(10, 0, 2, 2)),
        0x1234_5679,
    );
    assert_eq!(
        ack.opts().get(OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Ack))
    );
    assert_eq!(ack.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));

    let nak = exchange(
        MessageType::Request,
        Some(Ipv4Addr::new(10, 0, 2, 77)),
        0x1234_567a,
    );
    assert_eq!(
        nak.opts().get(OptionCode::MessageType),
        Some(&DhcpOption::MessageType(MessageType::Nak))
    );

    // Garbage on port 67 is dropped and the server keeps serving.
    let mut junk = Vec::new();
    PacketBuilder::ethernet2(GUEST_MAC, [0xff; 6])
        .ipv4([0, 0, 0, 0], [255, 255, 255, 255], 64)
        .udp(68, 67)
        .write(&mut junk, &[0xde, 0xad, 0xbe, 0xef])
        .unwrap();
    guest.send(&junk);
    let again = exchange(MessageType::Discover, None, 0x1234_567b);
    assert_eq!(again.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));

    stop.store(true, Ordering::Relaxed);
    server_thread.join().unwrap().expect("server loop");
}

#[test]
fn guest_traffic_leaves_with_the_pod_address_ipv4_and_ipv6() {
    let topo = Topology::new(true);
    masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup");
    let guest = Guest::attach(&topo.pod, "tap0");
    let (server4, server6) = topo.node.run(|| {
        let s4 = UdpSocket::bind(format!("{NODE_V4}:5555")).unwrap();
        let s6 = UdpSocket::bind(format!("[{NODE_V6}]:5556")).unwrap();
        (s4, s6)
    });
    for (server, guest_ip, node_ip, port, pod_ip) in [
        (&server4, "10.0.2.2", NODE_V4, 5555, POD_V4),
        (&server6, "fd10:0:2::2", NODE_V6, 5556, POD_V6),
    ] {
        server
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let frame = guest_udp_frame(
            guest_ip.parse().unwrap(),
            node_ip.parse().unwrap(),
            port,
            b"hello",
        );
        // The first packets may wait for neighbour resolution on the veth: resend a few times.
        let mut got = None;
        for _ in 0..15 {
            guest.send(&frame);
            let mut buf = [0u8; 64];
            if let Ok((n, from)) = server.recv_from(&mut buf) {
                got = Some((buf[..n].to_vec(), from));
                break;
            }
        }
        let (payload, from) =
            got.unwrap_or_else(|| panic!("guest datagram from {guest_ip} never reached the node"));
        assert_eq!(payload, b"hello");
        assert_eq!(
            from.ip(),
            pod_ip.parse::<IpAddr>().unwrap(),
            "not masqueraded"
        );
    }
}

#[test]
fn declared_port_is_forwarded_to_the_guest_ipv4_and_ipv6() {
    let topo = Topology::new(true);
    masquerade::setup(&config_for(&topo.pod, vec![tcp(80)])).expect("setup");
    add_guest_neighbours(&topo.pod, "k6t-eth0");
    let guest = Guest::attach(&topo.pod, "tap0");

    for (pod_ip, guest_ip) in [(POD_V4, "10.0.2.2"), (POD_V6, "fd10:0:2::2")] {
        let pod_ip: IpAddr = pod_ip.parse().unwrap();
        let guest_ip: IpAddr = guest_ip.parse().unwrap();
        let _conn = connect_from_node(&topo.node, SocketAddr::new(pod_ip, 80));
        let syn = guest.recv_until(WAIT, |f| {
            tcp_syn(f).filter(|(ip, port)| *port == 80 && *ip == guest_ip)
        });
        assert_eq!(
            syn,
            Some((guest_ip, 80)),
            "SYN to {pod_ip}:80 not DNATed to the guest"
        );

        // A port that is not declared stays in the pod (nothing listens: reset, no guest traffic).
        let _conn = connect_from_node(&topo.node, SocketAddr::new(pod_ip, 8080));
        let leaked = guest.recv_until(Duration::from_secs(1), |f| {
            tcp_syn(f).filter(|(_, port)| *port == 8080)
        });
        assert_eq!(leaked, None, "undeclared port 8080 reached the guest");
    }
}

#[test]
fn without_ports_every_port_is_forwarded() {
    let topo = Topology::new(true);
    masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup");
    add_guest_neighbours(&topo.pod, "k6t-eth0");
    let guest = Guest::attach(&topo.pod, "tap0");
    for (pod_ip, guest_ip) in [(POD_V4, "10.0.2.2"), (POD_V6, "fd10:0:2::2")] {
        let pod_ip: IpAddr = pod_ip.parse().unwrap();
        let _conn = connect_from_node(&topo.node, SocketAddr::new(pod_ip, 8080));
        let guest_ip: IpAddr = guest_ip.parse().unwrap();
        let syn = guest.recv_until(WAIT, |f| {
            tcp_syn(f).filter(|(ip, port)| *port == 8080 && *ip == guest_ip)
        });
        assert_eq!(syn, Some((guest_ip, 8080)));
    }
}

#[test]
fn second_run_leaves_the_same_state_and_teardown_restores_the_namespace() {
    let topo = Topology::new(true);
    let before = topo.pod.snapshot();
    let config = config_for(
        &topo.pod,
        vec![
            tcp(80),
            Port {
                number: 53,
                protocol: L4Proto::Udp,
            },
        ],
    );
    masquerade::setup(&config).expect("first setup");
    let once = topo.pod.snapshot();
    assert_ne!(before, once);
    masquerade::setup(&config).expect("second setup");
    let twice = topo.pod.snapshot();
    assert_eq!(once, twice, "second run changed the namespace");
    masquerade::teardown(&config).expect("teardown");
    assert_eq!(topo.pod.snapshot(), before, "teardown left traces");
    // Teardown of nothing is fine too.
    masquerade::teardown(&config).expect("second teardown");
}

#[test]
fn half_done_earlier_run_is_completed() {
    let topo = Topology::new(true);
    // An earlier run that died right after creating the bridge.
    topo.pod.netlink(|h| async move {
        netsetup::links::create_bridge(&h, "k6t-eth0", Some(BRIDGE_MAC), Some(1400))
            .await
            .unwrap();
    });
    masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup over a half-done run");
    let links = topo.pod.link_names();
    assert!(links.contains(&"tap0".to_string()), "{links:?}");
    assert!(topo.pod.nft_ruleset().contains("dnat to 10.0.2.2"));
}

fn assert_untouched(pod: &Netns, allowed_extra: &[&str]) {
    let mut links = pod.link_names();
    links.retain(|l| !allowed_extra.contains(&l.as_str()));
    links.sort();
    let mut expected = vec!["lo".to_string()];
    if pod.link_names().contains(&"eth0".to_string()) {
        expected.push("eth0".into());
    }
    expected.sort();
    assert_eq!(links, expected, "setup left links behind");
    assert_eq!(pod.nft_ruleset().trim(), "", "setup left rules behind");
}

#[test]
fn pod_without_eth0_is_a_clear_error_and_nothing_is_created() {
    let pod = Netns::new();
    let err = masquerade::setup(&config_for(&pod, vec![])).unwrap_err();
    assert!(
        matches!(err, BindingError::PodInterfaceMissing(ref i) if i == "eth0"),
        "{err}"
    );
    assert!(err.to_string().contains("eth0"));
    assert_untouched(&pod, &[]);
}

#[test]
fn existing_foreign_bridge_name_is_a_clash() {
    let topo = Topology::new(true);
    topo.pod.netlink(|h| async move {
        h.link()
            .add(
                rtnetlink::LinkBridge::new("k6t-eth0")
                    .address(vec![0x02, 0, 0, 0, 0, 0x42])
                    .build(),
            )
            .execute()
            .await
            .unwrap();
    });
    let err = masquerade::setup(&config_for(&topo.pod, vec![])).unwrap_err();
    assert!(matches!(err, BindingError::Clash(_)), "{err}");
    assert!(err.to_string().contains("k6t-eth0"), "{err}");
    assert_untouched(&topo.pod, &["k6t-eth0"]);
}

#[test]
fn existing_non_tap_with_the_tap_name_is_a_clash() {
    let topo = Topology::new(true);
    topo.pod.netlink(|h| async move {
        h.link()
            .add(rtnetlink::LinkVeth::new("tap0", "tap0peer").build())
            .execute()
            .await
            .unwrap();
    });
    let err = masquerade::setup(&config_for(&topo.pod, vec![])).unwrap_err();
    assert!(matches!(err, BindingError::Clash(_)), "{err}");
    assert_untouched(&topo.pod, &["tap0", "tap0peer"]);
}

#[test]
fn pod_address_inside_the_guest_network_is_a_clash() {
    let topo = Topology::with_pod_addrs(&[("10.0.2.5", 24)], false);
    let err = masquerade::setup(&config_for(&topo.pod, vec![])).unwrap_err();
    assert!(matches!(err, BindingError::Clash(_)), "{err}");
    assert!(err.to_string().contains("10.0.2.0/24"), "{err}");
    assert_untouched(&topo.pod, &[]);

    // With a different vmNetworkCIDR it works.
    let mut config = config_for(&topo.pod, vec![]);
    config.ipv4_cidr = "10.11.0.0/24".parse().unwrap();
    let outcome = masquerade::setup(&config).expect("setup with own CIDR");
    assert_eq!(
        outcome.ipv4.map(|g| g.guest),
        Some(IpAddr::V4(Ipv4Addr::new(10, 11, 0, 2)))
    );
    assert!(topo.pod.nft_ruleset().contains("ip saddr 10.11.0.2"));
}

#[test]
fn cli_masquerade_and_teardown() {
    let topo = Topology::new(true);
    let bin = env!("CARGO_BIN_EXE_netsetup");
    let path = topo.pod.path();
    let out = std::process::Command::new(bin)
        .args(["masquerade", "--netns"])
        .arg(&path)
        .args([
            "--ports",
            "80/tcp,53/udp",
            "--tap-owner",
            "0",
            "--legacy-migration-ports",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("pod_ipv4=192.168.77.2"), "{stdout}");
    let rules = topo.pod.nft_ruleset();
    assert!(
        rules.contains("udp dport 53 counter packets 0 bytes 0 dnat to 10.0.2.2"),
        "{rules}"
    );
    assert!(
        rules.contains(
            "tcp dport { 49152, 49153 } ip saddr 127.0.0.1 counter packets 0 bytes 0 return"
        ),
        "{rules}"
    );
    let tap = topo.pod.sh("ip -d link show tap0");
    // iproute2 prints known users by name.
    assert!(
        tap.contains("user root group root") || tap.contains("user 0 group 0"),
        "{tap}"
    );

    let out = std::process::Command::new(bin)
        .args(["teardown", "--netns"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(topo.pod.nft_ruleset().trim(), "");

    let out = std::process::Command::new(bin)
        .args(["masquerade", "--netns"])
        .arg(&path)
        .args(["--iface", "eth9"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("pod interface eth9 does not exist"),
        "{stderr}"
    );

    let out = std::process::Command::new(bin)
        .args(["masquerade", "--netns"])
        .arg(&path)
        .args(["--ports", "80/sctp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn cli_dhcp_serves_the_guest() {
    let topo = Topology::new(true);
    masquerade::setup(&config_for(&topo.pod, vec![])).expect("setup");
    let guest = Guest::attach(&topo.pod, "tap0");
    let resolv =
        std::env::temp_dir().join(format!("netsetup-test-resolv-{}.conf", std::process::id()));
    std::fs::write(
        &resolv,
        "search example.org\nnameserver 192.0.2.53\nnameserver 192.0.2.54\n",
    )
    .unwrap();
    let server = std::process::Command::new(env!("CARGO_BIN_EXE_netsetup"))
        .args(["dhcp", "--netns"])
        .arg(topo.pod.path())
        .arg("--resolv-conf")
        .arg(&resolv)
        .args(["--hostname", "clivm"])
        .spawn()
        .expect("start netsetup dhcp");
    let server = KillOnDrop(server);
    // The server binds after reading its inputs; the exchange retransmits until it answers.
    let offer = dhcp_exchange(&guest, MessageType::Discover, None, 0x5151);
    drop(server);
    let _ = std::fs::remove_file(&resolv);
    let opts = offer.opts();
    assert_eq!(offer.yiaddr(), Ipv4Addr::new(10, 0, 2, 2));
    assert_eq!(
        opts.get(OptionCode::DomainNameServer),
        Some(&DhcpOption::DomainNameServer(vec![
            Ipv4Addr::new(192, 0, 2, 53),
            Ipv4Addr::new(192, 0, 2, 54)
        ]))
    );
    assert_eq!(
        opts.get(OptionCode::Hostname),
        Some(&DhcpOption::Hostname("clivm".into()))
    );
    assert_eq!(
        opts.get(OptionCode::DomainName),
        Some(&DhcpOption::DomainName("example.org".into()))
    );
    // MTU taken from the bridge, which has the pod's.
    assert_eq!(
        opts.get(OptionCode::InterfaceMtu),
        Some(&DhcpOption::InterfaceMtu(1400))
    );
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
fn namespace_by_pid() {
    let topo = Topology::new(false);
    // A process living in the pod's namespace, as the launcher would.
    let child = topo
        .pod
        .run(|| std::process::Command::new("sleep").arg("60").spawn())
        .expect("start a process in the pod namespace");
    let child = KillOnDrop(child);
    let mut config = MasqueradeConfig::new(netsetup::netns::NetnsTarget::Pid(child.0.id()));
    config.ports = vec![tcp(22)];
    masquerade::setup(&config).expect("setup by pid");
    assert!(topo.pod.link_names().contains(&"k6t-eth0".to_string()));
    masquerade::teardown(&config).expect("teardown by pid");
    assert!(!topo.pod.link_names().contains(&"k6t-eth0".to_string()));
}
