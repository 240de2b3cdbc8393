//! `portforward`: v1.9.0's websocket streamer with its direct dialer
//! (`pkg/virt-api/rest/portforward.go`, `dialers.go` `netDial`, `streamer.go`). virt-api itself
//! connects to the VMI's first interface address (under masquerade the pod's address, which
//! the pod's NAT forwards into the guest) at the port of the path, with its protocol (`tcp`
//! unless the path names one), and only then accepts the client's websocket
//! (`plain.kubevirt.io`): each binary message is written to the connection, what the
//! connection gives is sent as binary messages. The client is pinged every second and the
//! session ends when nothing came from it for a minute, or when either side ends.

use super::status::Kind;
use super::{ApiError, AppState, Target, get_vmi_or_404, vmi};
use axum::extract::ws::{
    Message, WebSocket, WebSocketUpgrade, rejection::WebSocketUpgradeRejection,
};
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use futures::{SinkExt, StreamExt};
use proto::kubevirt::{VirtualMachine, VirtualMachineInstance};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

/// Go's `net.Dial` waits as long as the kernel does; a dial here gives up sooner.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// v1.9.0's keep-alive: a ping every second, the session over after a minute of silence.
const PING_EVERY: Duration = Duration::from_secs(1);
const KEEP_ALIVE: Duration = Duration::from_secs(60);
/// The largest piece read from the VM's side at once (one message; a UDP datagram fits).
const CHUNK: usize = 64 << 10;
/// The largest datagram sent to the VM: Go's copy buffer, which v1.9.0's relay writes through.
const UDP_PIECE: usize = 32 << 10;
/// The largest message accepted from the client (virtctl sends at most 32 KiB at once): a
/// client cannot make virt-api hold more per session.
const MAX_CLIENT_MESSAGE: usize = 1 << 20;

/// The names in a port-forward path.
#[derive(serde::Deserialize)]
pub(super) struct PortForwardTarget {
    version: String,
    namespace: String,
    name: String,
    port: String,
    #[serde(default)]
    protocol: Option<String>,
}

/// The connection to the VM: a TCP stream or a connected UDP socket.
enum Upstream {
    Tcp(tokio::net::TcpStream),
    Udp(tokio::net::UdpSocket),
}

/// `virtualmachineinstances/{name}/portforward/{port}[/{protocol}]`.
pub(super) async fn vmi_portforward(
    State(state): State<Arc<AppState>>,
    Path(target): Path<PortForwardTarget>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    forward(Kind::VirtualMachineInstance, &state, target, upgrade).await
}

/// `virtualmachines/{name}/portforward/{port}[/{protocol}]`: to the VM's VMI.
pub(super) async fn vm_portforward(
    State(state): State<Arc<AppState>>,
    Path(target): Path<PortForwardTarget>,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    forward(Kind::VirtualMachine, &state, target, upgrade).await
}

/// `FetchVirtualMachineInstanceForVM`: the VMI of the VM's name, if the VM created it.
async fn vmi_of_vm(state: &AppState, names: &Target) -> Result<VirtualMachineInstance, ApiError> {
    let name = names.name.as_str();
    let vms: kube::Api<VirtualMachine> =
        kube::Api::namespaced(state.client.clone(), &names.namespace);
    let vm = match vms.get_opt(name).await {
        Ok(Some(vm)) => vm,
        Ok(None) => return Err(ApiError::not_found(Kind::VirtualMachine, name)),
        Err(e) => {
            return Err(ApiError::internal(format!(
                "unable to retrieve vm [{name}]: {e}"
            )));
        }
    };
    if vm.status.as_ref().and_then(|s| s.created) != Some(true) {
        return Err(ApiError::conflict(
            Kind::VirtualMachine,
            name,
            "VMI is not started",
        ));
    }
    let vmi = get_vmi_or_404(state, names).await?;
    let owned = vmi
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|r| Some(&r.uid) == vm.metadata.uid.as_ref());
    if !owned {
        return Err(ApiError::internal(format!(
            "unable to retrieve vmi [{name}] for vm: <nil>"
        )));
    }
    Ok(vmi)
}

async fn forward(
    kind: Kind,
    state: &AppState,
    target: PortForwardTarget,
    upgrade: Result<WebSocketUpgrade, WebSocketUpgradeRejection>,
) -> Result<Response, ApiError> {
    let names = Target {
        version: target.version.clone(),
        namespace: target.namespace.clone(),
        name: target.name.clone(),
    };
    names.check_version()?;
    let vmi = match kind {
        Kind::VirtualMachineInstance => get_vmi_or_404(state, &names).await?,
        Kind::VirtualMachine => vmi_of_vm(state, &names).await?,
    };
    vmi::check_port_forward(&vmi)?;
    let protocol = target.protocol.as_deref().unwrap_or("tcp");
    let address = target_address(&vmi, &target.port)?;
    let upstream = dial(protocol, &target.port, address)
        .await
        .map_err(|e| ApiError::internal(format!("dialing VM: {e}")))?;
    let upgrade = upgrade.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let session = format!(
        "{}/{} {protocol}/{}",
        target.namespace, target.name, target.port
    );
    Ok(upgrade
        .max_message_size(MAX_CLIENT_MESSAGE)
        .max_frame_size(MAX_CLIENT_MESSAGE)
        .protocols([handler_api::CONSOLE_PROTOCOL])
        .on_upgrade(move |socket| async move {
            relay(socket, upstream).await;
            tracing::info!(%session, "port-forward session ended");
        })
        .into_response())
}

/// `getTargetInterfaceIP` and the port: the first interface's address, or v1.9.0's 400s.
fn target_address(vmi: &VirtualMachineInstance, port: &str) -> Result<IpAddr, ApiError> {
    if port.is_empty() {
        return Err(ApiError::bad_request("port must not be empty"));
    }
    let interfaces = vmi
        .status
        .as_ref()
        .map(|s| s.interfaces.as_slice())
        .unwrap_or_default();
    let Some(first) = interfaces.first() else {
        return Err(ApiError::bad_request("no network interfaces are present"));
    };
    let text = first.ip_address.as_deref().unwrap_or_default();
    let unusable = || {
        ApiError::internal(format!(
            "dialing VM: the VMI's first interface has no usable address {text:?}"
        ))
    };
    let ip: IpAddr = text.parse().map_err(|_| unusable())?;
    // Not in v1.9.0, which dials whatever the status says: virt-api's own loopback, "any" and
    // multicast are no VM's address, whoever wrote the status.
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return Err(unusable());
    }
    Ok(ip)
}

/// `net.Dial(protocol, ip:port)` for the protocols Go names `tcp` and `udp` (and their
/// `4`/`6` forms), its errors worded as Go's (`dial tcp 10.0.0.7:22: connect: connection
/// refused`); a port must be a number (Go also looks service names up).
async fn dial(protocol: &str, port: &str, ip: IpAddr) -> std::io::Result<Upstream> {
    use std::io::{Error, ErrorKind};
    let tcp = protocol.strip_prefix("tcp");
    let udp = protocol.strip_prefix("udp");
    let Some(family) = tcp.or(udp).filter(|f| ["", "4", "6"].contains(f)) else {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("dial {protocol}: unknown network {protocol}"),
        ));
    };
    let port: u16 = port.parse().map_err(|_| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("dial {protocol}: address {port}: invalid port"),
        )
    })?;
    let address = SocketAddr::new(ip, port);
    if (family == "4" && !ip.is_ipv4()) || (family == "6" && !ip.is_ipv6()) {
        return Err(Error::new(
            ErrorKind::InvalidInput,
            format!("dial {protocol}: address {address}: no suitable address found"),
        ));
    }
    let op_error = |e: Error| {
        let detail = match e.kind() {
            ErrorKind::ConnectionRefused => "connection refused".to_string(),
            ErrorKind::TimedOut => "i/o timeout".to_string(),
            _ => e.to_string(),
        };
        Error::new(
            e.kind(),
            format!("dial {protocol} {address}: connect: {detail}"),
        )
    };
    if tcp.is_some() {
        let stream = tokio::time::timeout(DIAL_TIMEOUT, tokio::net::TcpStream::connect(address))
            .await
            .map_err(|_| op_error(ErrorKind::TimedOut.into()))?
            .map_err(op_error)?;
        return Ok(Upstream::Tcp(stream));
    }
    let local: SocketAddr = if ip.is_ipv4() {
        (std::net::Ipv4Addr::UNSPECIFIED, 0).into()
    } else {
        (std::net::Ipv6Addr::UNSPECIFIED, 0).into()
    };
    let socket = tokio::net::UdpSocket::bind(local).await.map_err(op_error)?;
    socket.connect(address).await.map_err(op_error)?;
    Ok(Upstream::Udp(socket))
}

/// Relays until either side ends or the client is silent for [`KEEP_ALIVE`]; each direction
/// on its own task, so that one side that stops reading holds up only its direction, and no
/// write waits longer than [`KEEP_ALIVE`] either. The client's close is answered.
async fn relay(socket: WebSocket, upstream: Upstream) {
    let (mut to_client, mut from_client) = socket.split();
    let udp = matches!(upstream, Upstream::Udp(_));
    let (mut reader, mut writer) = match upstream {
        Upstream::Tcp(stream) => {
            let (r, w) = stream.into_split();
            (UpRead::Tcp(r), UpWrite::Tcp(w))
        }
        Upstream::Udp(socket) => {
            let socket = Arc::new(socket);
            (UpRead::Udp(socket.clone()), UpWrite::Udp(socket))
        }
    };
    let client_gone = Arc::new(tokio::sync::Notify::new());
    // Client → VM; any frame (a pong included) proves the client alive. As v1.9.0's reader,
    // only binary messages carry data; an empty one sends nothing.
    let mut inbound = tokio::spawn({
        let client_gone = client_gone.clone();
        async move {
            loop {
                let data = match tokio::time::timeout(KEEP_ALIVE, from_client.next()).await {
                    Ok(Some(Ok(Message::Binary(data)))) => data,
                    Ok(Some(Ok(Message::Close(_)))) => {
                        client_gone.notify_one();
                        return;
                    }
                    Err(_) | Ok(None) | Ok(Some(Err(_))) => return,
                    Ok(Some(Ok(_))) => continue,
                };
                // Datagrams of at most what Go's copy buffer holds, as v1.9.0 sends them.
                let pieces: Vec<&[u8]> = if udp {
                    data.chunks(UDP_PIECE).collect()
                } else {
                    vec![&data[..]]
                };
                for piece in pieces.into_iter().filter(|p| !p.is_empty()) {
                    match tokio::time::timeout(KEEP_ALIVE, writer.write(piece)).await {
                        Ok(Ok(())) => {}
                        _ => return,
                    }
                }
            }
        }
    });
    // VM → client, and the pings.
    let mut outbound = tokio::spawn(async move {
        let mut ping = tokio::time::interval(PING_EVERY);
        let mut buffer = vec![0u8; CHUNK];
        let send = async |to_client: &mut futures::stream::SplitSink<WebSocket, Message>,
                          message: Message| {
            matches!(
                tokio::time::timeout(KEEP_ALIVE, to_client.send(message)).await,
                Ok(Ok(()))
            )
        };
        loop {
            let message = tokio::select! {
                read = reader.read(&mut buffer) => match read {
                    // An empty datagram is a datagram; an empty TCP read is the end.
                    Ok(0) if udp => continue,
                    Ok(0) | Err(_) => break,
                    Ok(n) => Message::Binary(axum::body::Bytes::copy_from_slice(&buffer[..n])),
                },
                _ = ping.tick() => Message::Ping(Default::default()),
                _ = client_gone.notified() => break,
            };
            if !send(&mut to_client, message).await {
                return;
            }
        }
        let _ = send(&mut to_client, Message::Close(None)).await;
    });
    tokio::select! {
        _ = &mut inbound => {
            // The VM's side may still owe the client its close.
            if tokio::time::timeout(Duration::from_secs(5), &mut outbound).await.is_err() {
                outbound.abort();
            }
        }
        _ = &mut outbound => inbound.abort(),
    }
}

/// The VM side's reading half.
enum UpRead {
    Tcp(tokio::net::tcp::OwnedReadHalf),
    Udp(Arc<tokio::net::UdpSocket>),
}

impl UpRead {
    async fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        match self {
            UpRead::Tcp(r) => tokio::io::AsyncReadExt::read(r, buffer).await,
            UpRead::Udp(s) => s.recv(buffer).await,
        }
    }
}

/// The VM side's writing half (a UDP message is one datagram).
enum UpWrite {
    Tcp(tokio::net::tcp::OwnedWriteHalf),
    Udp(Arc<tokio::net::UdpSocket>),
}

impl UpWrite {
    async fn write(&mut self, data: &[u8]) -> std::io::Result<()> {
        match self {
            UpWrite::Tcp(w) => tokio::io::AsyncWriteExt::write_all(w, data).await,
            UpWrite::Udp(s) => s.send(data).await.map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi_with(status: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "ns"},
            "spec": {"domain": {"devices": {}}},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn the_target_is_the_first_interfaces_address() {
        let vmi =
            vmi_with(json!({"interfaces": [{"ipAddress": "10.0.0.7"}, {"ipAddress": "10.0.0.8"}]}));
        assert_eq!(
            target_address(&vmi, "22").unwrap(),
            "10.0.0.7".parse::<IpAddr>().unwrap()
        );
        let e = target_address(&vmi, "").unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "port must not be empty")
        );
        let e = target_address(&vmi_with(json!({})), "22").unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "no network interfaces are present")
        );
        // An interface without a usable address: no dial to garbage, nor to virt-api itself.
        for address in [
            "10.0.0.7; rm",
            "127.0.0.1",
            "0.0.0.0",
            "::1",
            "224.0.0.1",
            "",
        ] {
            let vmi = vmi_with(json!({"interfaces": [{"ipAddress": address}]}));
            assert_eq!(
                target_address(&vmi, "22").unwrap_err().code,
                500,
                "{address}"
            );
        }
    }

    #[tokio::test]
    async fn dials_tcp_and_udp_and_refuses_the_rest_as_go_does() {
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port().to_string();
        assert!(matches!(dial("tcp", &port, ip).await, Ok(Upstream::Tcp(_))));
        assert!(matches!(
            dial("tcp4", &port, ip).await,
            Ok(Upstream::Tcp(_))
        ));
        assert!(matches!(dial("udp", &port, ip).await, Ok(Upstream::Udp(_))));
        for (protocol, port, says) in [
            (
                "sctp",
                port.as_str(),
                "dial sctp: unknown network sctp".to_string(),
            ),
            (
                "tcp6",
                port.as_str(),
                format!("dial tcp6: address 127.0.0.1:{port}: no suitable address found"),
            ),
            (
                "tcp",
                "http",
                "dial tcp: address http: invalid port".to_string(),
            ),
            (
                "tcp",
                "70000",
                "dial tcp: address 70000: invalid port".to_string(),
            ),
        ] {
            let e = dial(protocol, port, ip).await.err().expect(protocol);
            assert_eq!(e.to_string(), says);
        }
        drop(listener);
        // Nothing listening: the kernel's refusal, worded as Go's dial reports it.
        let e = dial("tcp", &port, ip).await.err().expect("refused");
        assert_eq!(
            e.to_string(),
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
    }
}
