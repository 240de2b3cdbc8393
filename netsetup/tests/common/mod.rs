//! Test rig: a "node" and a "pod" network namespace joined by a veth, and a guest that
//! plays on the pod's tap with raw Ethernet frames.
//!
//! Namespaces are anonymous (made with `unshare` on a throwaway thread) and kept alive by
//! an open file; dropping the [`Netns`] frees them with everything inside, so tests running
//! in parallel never share names or leave anything behind.

#![allow(dead_code)] // each test binary uses a different part of the rig

use std::fs::{File, OpenOptions};
use std::future::Future;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use netsetup::netns::{self, NetnsTarget};
use rtnetlink::Handle;

pub const POD_V4: &str = "192.168.77.2";
pub const NODE_V4: &str = "192.168.77.1";
pub const POD_V6: &str = "fd00:77::2";
pub const NODE_V6: &str = "fd00:77::1";
pub const GUEST_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];

/// Fails the test (never skips it) when not root.
pub fn require_root() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests build network namespaces, bridges and taps: run them as root"
    );
}

/// An anonymous network namespace, alive while this value is.
pub struct Netns {
    file: File,
}

impl Netns {
    pub fn new() -> Netns {
        require_root();
        let file = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET)");
            File::open("/proc/thread-self/ns/net").expect("open own netns")
        })
        .join()
        .expect("netns thread");
        let ns = Netns { file };
        // Loopback up, as in any pod.
        ns.netlink(|h| async move {
            let lo = netsetup::links::link_by_name(&h, "lo")
                .await
                .unwrap()
                .unwrap();
            netsetup::links::change_link(
                &h,
                lo.index,
                netsetup::links::LinkChange {
                    up: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        });
        ns
    }

    /// A path any process of this machine can open to reach the namespace.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.file.as_raw_fd()
        ))
    }

    pub fn target(&self) -> NetnsTarget {
        NetnsTarget::Path(self.path())
    }

    pub fn run<T: Send + 'static>(&self, work: impl FnOnce() -> T + Send + 'static) -> T {
        netns::run_in(&self.target(), work).expect("enter test netns")
    }

    /// Runs async rtnetlink work inside the namespace.
    pub fn netlink<T, F, Fut>(&self, work: F) -> T
    where
        T: Send + 'static,
        F: FnOnce(Handle) -> Fut + Send + 'static,
        Fut: Future<Output = T>,
    {
        self.run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (conn, handle, _) = rtnetlink::new_connection().unwrap();
                tokio::spawn(conn);
                work(handle).await
            })
        })
    }

    /// Runs a command inside the namespace (children inherit the forking thread's namespace).
    pub fn sh(&self, script: &str) -> String {
        let script = script.to_string();
        let out = self.run(move || Command::new("sh").arg("-c").arg(&script).output());
        let out = out.expect("run sh");
        assert!(
            out.status.success(),
            "command failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// What setup changes, in a comparable form: links, addresses, NAT rules, sysctls.
    /// Carrier and operational state are left out: they follow whether a VMM holds the tap
    /// and settle asynchronously after the tap's creating descriptor closes.
    pub fn snapshot(&self) -> String {
        self.sh(
            "ip -o link show | sed -e 's/^[0-9]*: //' -e 's/@if[0-9]*//' -e 's/link-netnsid [0-9]*//' -e 's/state [A-Z]* //' -e 's/NO-CARRIER,//' -e 's/,LOWER_UP//'; \
             ip -o -d link show | grep -o 'tun type.*group [0-9]*' || true; \
             ip -o addr show | sed -e 's/^[0-9]*: //' -e 's/ tentative//' -e 's/ dadfailed//'; \
             nft list ruleset | sed -e 's/packets [0-9]* bytes [0-9]*//'; \
             cat /proc/sys/net/ipv4/ip_forward /proc/sys/net/ipv6/conf/all/forwarding",
        )
    }

    pub fn nft_ruleset(&self) -> String {
        self.sh("nft list ruleset")
    }

    pub fn link_names(&self) -> Vec<String> {
        self.netlink(|h| async move {
            netsetup::links::links(&h)
                .await
                .unwrap()
                .into_iter()
                .map(|l| l.name)
                .collect()
        })
    }
}

/// Adds an address; IPv6 without duplicate address detection so it is usable at once.
pub async fn add_addr(h: &Handle, index: u32, addr: &str, prefix: u8) {
    let addr: IpAddr = addr.parse().unwrap();
    let mut req = h.address().add(index, addr, prefix);
    if addr.is_ipv6() {
        req.message_mut().header.flags |=
            rtnetlink::packet_route::address::AddressHeaderFlags::Nodad;
    }
    req.execute().await.unwrap();
}

/// A node and a pod namespace joined by a veth; the pod side is `eth0` with an IPv4 and
/// (if `with_v6`) an IPv6 address.
pub struct Topology {
    pub node: Netns,
    pub pod: Netns,
}

impl Topology {
    pub fn new(with_v6: bool) -> Topology {
        Self::with_pod_addrs(&[(POD_V4, 24)], with_v6)
    }

    pub fn with_pod_addrs(pod_v4: &[(&'static str, u8)], with_v6: bool) -> Topology {
        let node = Netns::new();
        let pod = Netns::new();
        let pod_fd = pod.file.as_raw_fd();
        node.netlink(move |h| async move {
            h.link()
                .add(rtnetlink::LinkVeth::new("vnode", "eth0").mtu(1400).build())
                .execute()
                .await
                .unwrap();
            let peer = netsetup::links::link_by_name(&h, "eth0")
                .await
                .unwrap()
                .unwrap();
            h.link()
                .set(
                    rtnetlink::LinkUnspec::new_with_index(peer.index)
                        .setns_by_fd(pod_fd)
                        .build(),
                )
                .execute()
                .await
                .unwrap();
            let own = netsetup::links::link_by_name(&h, "vnode")
                .await
                .unwrap()
                .unwrap();
            add_addr(&h, own.index, NODE_V4, 24).await;
            if with_v6 {
                add_addr(&h, own.index, NODE_V6, 64).await;
            }
            up(&h, own.index).await;
        });
        let pod_v4: Vec<(&'static str, u8)> = pod_v4.to_vec();
        pod.netlink(move |h| async move {
            let eth0 = netsetup::links::link_by_name(&h, "eth0")
                .await
                .unwrap()
                .unwrap();
            for (addr, prefix) in pod_v4 {
                add_addr(&h, eth0.index, addr, prefix).await;
            }
            if with_v6 {
                add_addr(&h, eth0.index, POD_V6, 64).await;
            }
            netsetup::links::change_link(
                &h,
                eth0.index,
                netsetup::links::LinkChange {
                    mtu: Some(1400),
                    up: true,
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        });
        Topology { node, pod }
    }
}

pub async fn up(h: &Handle, index: u32) {
    netsetup::links::change_link(
        h,
        index,
        netsetup::links::LinkChange {
            up: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
}

/// Static neighbour entries for the guest's addresses on the bridge, standing in for the
/// guest's ARP/NDP answers so that forwarded packets leave the tap at once.
pub fn add_guest_neighbours(pod: &Netns, bridge: &str) {
    let bridge = bridge.to_string();
    pod.netlink(move |h| async move {
        let br = netsetup::links::link_by_name(&h, &bridge)
            .await
            .unwrap()
            .unwrap();
        for ip in ["10.0.2.2", "fd10:0:2::2"] {
            h.neighbours()
                .add(br.index, ip.parse().unwrap())
                .link_layer_address(&GUEST_MAC)
                .state(rtnetlink::packet_route::neighbour::NeighbourState::Permanent)
                .execute()
                .await
                .unwrap();
        }
    });
}

/// The guest's end of the tap: raw Ethernet frames in and out.
pub struct Guest {
    tap: File,
}

impl Guest {
    /// Opens the persistent tap `name` in `pod` as the VMM would (IFF_TAP | IFF_NO_PI).
    pub fn attach(pod: &Netns, name: &str) -> Guest {
        let name = name.to_string();
        let tap = pod.run(move || {
            let tap = OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/net/tun")
                .expect("open /dev/net/tun");
            // SAFETY: zeroed ifreq is valid; TUNSETIFF reads it during the call.
            let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
            for (d, s) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
                *d = libc::c_char::from_ne_bytes([*s]);
            }
            ifr.ifr_ifru.ifru_flags = libc::c_short::try_from(libc::IFF_TAP | libc::IFF_NO_PI)
                .expect("tap flags fit in a short");
            // SAFETY: TUNSETIFF reads the ifreq, which lives across the call, on an open fd.
            let rc = unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
            assert!(
                rc >= 0,
                "attach to tap: {}",
                std::io::Error::last_os_error()
            );
            tap
        });
        // Non-blocking so reads can time out.
        let fd = tap.as_raw_fd();
        // SAFETY: plain fcntl on an owned fd.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK);
        }
        Guest { tap }
    }

    pub fn send(&self, frame: &[u8]) {
        use std::io::Write;
        (&self.tap).write_all(frame).expect("write frame to tap");
    }

    /// Reads frames until `pick` returns something or `timeout` passes.
    pub fn recv_until<T>(
        &self,
        timeout: Duration,
        mut pick: impl FnMut(&[u8]) -> Option<T>,
    ) -> Option<T> {
        use std::io::Read;
        let deadline = Instant::now() + timeout;
        let mut buf = vec![0u8; 65536];
        while Instant::now() < deadline {
            match (&self.tap).read(&mut buf) {
                Ok(n) => {
                    if let Some(found) = pick(&buf[..n]) {
                        return Some(found);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("read from tap: {e}"),
            }
        }
        None
    }
}
