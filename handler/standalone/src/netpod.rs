//! The pod's network, as a CNI plugin would make it: a fresh network namespace whose
//! `eth0` is one end of a veth pair, the other end on the host. Both ends are addressed
//! in `10.244.<n>.0/24` (host `.1`, pod `.2`) and the pod routes everything via the host,
//! so the masquerade NAT in the pod has a real pod IP to hide the guest behind.
//!
//! The namespace lives as long as a process is in it or [`PodNetwork::netns`] is open;
//! deleting the host end of the veth removes both ends.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use futures::TryStreamExt;
use netsetup::links::{self, LinkChange};
use netsetup::netns::{self, NetnsTarget};

use proto::contract::pod_network::PRIMARY_POD_IFACE as POD_IFACE;

#[derive(Debug, thiserror::Error)]
pub enum PodNetError {
    #[error("cannot create the pod network namespace: {0}")]
    Namespace(String),
    #[error("netlink: {0}")]
    Netlink(String),
    #[error("no free 10.244.x.0/24 subnet on this host")]
    NoSubnet,
}

fn netlink_err(e: impl std::fmt::Display) -> PodNetError {
    PodNetError::Netlink(e.to_string())
}

/// A pod network namespace and its veth.
#[derive(Debug)]
pub struct PodNetwork {
    /// Keeps the namespace alive until the launcher is in it.
    pub netns: File,
    pub host_veth: String,
    pub subnet: u8,
}

impl PodNetwork {
    pub fn host_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.subnet, 1)
    }

    pub fn pod_ip(&self) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, self.subnet, 2)
    }

    /// A path any process of this host can open to reach the namespace.
    pub fn netns_path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.netns.as_raw_fd()
        ))
    }
}

/// Runs async netlink work in the namespace `target`, on its own thread and runtime.
fn in_netns<T, F, Fut>(target: &NetnsTarget, work: F) -> Result<T, PodNetError>
where
    T: Send + 'static,
    F: FnOnce(rtnetlink::Handle) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<T, PodNetError>>,
{
    netns::run_in(target, move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .map_err(netlink_err)?;
        runtime.block_on(async move {
            let (connection, handle, _) = rtnetlink::new_connection().map_err(netlink_err)?;
            tokio::spawn(connection);
            work(handle).await
        })
    })
    .map_err(|e| PodNetError::Namespace(e.to_string()))?
}

/// The subnets (third octet of 10.244.x.0/24) the host already uses.
async fn used_subnets(handle: &rtnetlink::Handle) -> Result<Vec<u8>, PodNetError> {
    let addrs = links::addresses(handle).await.map_err(netlink_err)?;
    Ok(addrs
        .iter()
        .filter_map(|a| match a.addr {
            IpAddr::V4(v4) if v4.octets()[0] == 10 && v4.octets()[1] == 244 => Some(v4.octets()[2]),
            _ => None,
        })
        .collect())
}

/// Creates the namespace and the veth; `name_hint` (8+ hex characters of the pod UID)
/// names the host end `vh<hint>`.
pub async fn create(name_hint: &str) -> Result<PodNetwork, PodNetError> {
    let netns = std::thread::spawn(|| -> Result<File, PodNetError> {
        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
            .map_err(|e| PodNetError::Namespace(format!("unshare: {e}")))?;
        File::open("/proc/thread-self/ns/net")
            .map_err(|e| PodNetError::Namespace(format!("open: {e}")))
    })
    .join()
    .map_err(|_| PodNetError::Namespace("namespace thread panicked".into()))??;

    let short: String = name_hint
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(8)
        .collect();
    let host_veth = format!("vh{short}");
    let peer = format!("vp{short}");

    let (connection, handle, _) = rtnetlink::new_connection().map_err(netlink_err)?;
    tokio::spawn(connection);

    let used = used_subnets(&handle).await?;
    // Spread pods over the range; a clash with a parallel creation shows up as an
    // address already in use on the next pod and is rare enough for a stand-in CNI.
    let start = (rand::random::<u32>() % 254) as u8;
    let subnet = (0..254u16)
        // 1..=254: the conversion never fails.
        .filter_map(|i| u8::try_from((u16::from(start) + i) % 254 + 1).ok())
        .find(|s| !used.contains(s))
        .ok_or(PodNetError::NoSubnet)?;

    handle
        .link()
        .add(rtnetlink::LinkVeth::new(&host_veth, &peer).build())
        .execute()
        .await
        .map_err(netlink_err)?;
    let network = PodNetwork {
        netns,
        host_veth: host_veth.clone(),
        subnet,
    };
    let result = configure(&handle, &network, &peer).await;
    if let Err(e) = result {
        // Undo the veth; the namespace goes when `network` is dropped.
        let _ = delete_host_veth(&host_veth).await;
        return Err(e);
    }
    Ok(network)
}

async fn configure(
    handle: &rtnetlink::Handle,
    network: &PodNetwork,
    peer: &str,
) -> Result<(), PodNetError> {
    let peer_link = links::link_by_name(handle, peer)
        .await
        .map_err(netlink_err)?
        .ok_or_else(|| PodNetError::Netlink(format!("veth peer {peer} missing")))?;
    // Moving and renaming in one request: the kernel names the link in the target
    // namespace, so `eth0` never clashes with the host's own eth0.
    handle
        .link()
        .set(
            rtnetlink::LinkUnspec::new_with_index(peer_link.index)
                .setns_by_fd(network.netns.as_raw_fd())
                .name(POD_IFACE)
                .build(),
        )
        .execute()
        .await
        .map_err(netlink_err)?;
    let host = links::link_by_name(handle, &network.host_veth)
        .await
        .map_err(netlink_err)?
        .ok_or_else(|| PodNetError::Netlink("host veth missing".into()))?;
    links::add_address(handle, host.index, IpAddr::V4(network.host_ip()), 24)
        .await
        .map_err(netlink_err)?;
    links::change_link(
        handle,
        host.index,
        LinkChange {
            up: true,
            ..Default::default()
        },
    )
    .await
    .map_err(netlink_err)?;

    let pod_ip = network.pod_ip();
    let gateway = network.host_ip();
    in_netns(
        &NetnsTarget::Path(network.netns_path()),
        move |h| async move {
            for name in ["lo", POD_IFACE] {
                let link = links::link_by_name(&h, name)
                    .await
                    .map_err(netlink_err)?
                    .ok_or_else(|| PodNetError::Netlink(format!("{name} missing in pod")))?;
                if name == POD_IFACE {
                    links::add_address(&h, link.index, IpAddr::V4(pod_ip), 24)
                        .await
                        .map_err(netlink_err)?;
                }
                links::change_link(
                    &h,
                    link.index,
                    LinkChange {
                        up: true,
                        ..Default::default()
                    },
                )
                .await
                .map_err(netlink_err)?;
            }
            h.route()
                .add(
                    rtnetlink::RouteMessageBuilder::<Ipv4Addr>::new()
                        .gateway(gateway)
                        .build(),
                )
                .execute()
                .await
                .map_err(netlink_err)?;
            Ok(())
        },
    )
}

/// Deletes the host end of a pod's veth (and so the pod end); missing is fine.
pub async fn delete_host_veth(name: &str) -> Result<(), PodNetError> {
    let (connection, handle, _) = rtnetlink::new_connection().map_err(netlink_err)?;
    tokio::spawn(connection);
    let mut found = handle.link().get().match_name(name.to_string()).execute();
    let link = match found.try_next().await {
        Ok(Some(link)) => link,
        // ENODEV: already gone with its namespace.
        Ok(None) | Err(_) => return Ok(()),
    };
    handle
        .link()
        .del(link.header.index)
        .execute()
        .await
        .map_err(netlink_err)
}

/// Whether a host link with this name exists.
pub async fn host_link_exists(name: &str) -> bool {
    let Ok((connection, handle, _)) = rtnetlink::new_connection() else {
        return false;
    };
    tokio::spawn(connection);
    links::link_by_name(&handle, name)
        .await
        .ok()
        .flatten()
        .is_some()
}
