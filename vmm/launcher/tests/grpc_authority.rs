//! The launcher's gRPC server serves a request whose HTTP/2 `:authority` is
//! not a URI authority: the unix socket's path, percent-encoded as gRPC's C
//! core sends it (Python `grpcio` and every language wrapping the core), or
//! raw as grpc-java sends it, for the RPCs the handler starts with. Stock h2 answers such a request with
//! `RST_STREAM(PROTOCOL_ERROR)`; the workspace builds the patched h2 in
//! `vendor/h2` (see its `PATCHED.md`) through `[patch.crates-io]`. These
//! tests fail when that patch is gone: the `[patch]` entry removed, or
//! dropped by cargo ("patch was not used") because a dependency asks for an
//! h2 newer than the vendored one.
//!
//! h2's client cannot send such an authority (it builds `:authority` from an
//! `http::Uri`), so the request goes through a small in-test relay that
//! replaces the client's one HEADERS frame with a hand-encoded header block
//! carrying the authority; the relay passes everything else through, and
//! the h2 client reads the response as usual.

mod common;

use common::*;
use proto::grpc::cmd::info::{CmdInfoRequest, CmdInfoResponse};
use proto::grpc::cmd::v1::{EmptyRequest, Response as CmdResponse};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// `s` with every byte outside RFC 3986's unreserved set percent-encoded.
fn percent_encoded(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// An HPACK integer with a `prefix`-bit prefix whose high bits are `first`
/// (RFC 7541 section 5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, value: usize) {
    let max = (1u8 << prefix) - 1;
    if let Ok(small) = u8::try_from(value)
        && small < max
    {
        out.push(first | small);
        return;
    }
    out.push(first | max);
    let mut rest = value - usize::from(max);
    while rest >= 128 {
        out.push(u8::try_from(rest % 128).unwrap() | 0x80);
        rest /= 128;
    }
    out.push(u8::try_from(rest).unwrap());
}

/// An HPACK string literal, not Huffman-coded.
fn hpack_str(out: &mut Vec<u8>, s: &str) {
    hpack_int(out, 0, 7, s.len());
    out.extend_from_slice(s.as_bytes());
}

/// A gRPC request's header block, every field indexed from the static table
/// or a literal without indexing, so that the server's dynamic table stays
/// empty as the h2 client expects (RFC 7541 sections 6.1 and 6.2.2).
fn grpc_header_block(path: &str, authority: &str) -> Vec<u8> {
    let mut block = vec![
        0x83, // :method POST (static index 3)
        0x86, // :scheme http (static index 6)
    ];
    hpack_int(&mut block, 0x00, 4, 4); // :path (static name 4)
    hpack_str(&mut block, path);
    hpack_int(&mut block, 0x00, 4, 1); // :authority (static name 1)
    hpack_str(&mut block, authority);
    hpack_int(&mut block, 0x00, 4, 31); // content-type (static name 31)
    hpack_str(&mut block, "application/grpc");
    block.push(0x00); // a new name
    hpack_str(&mut block, "te");
    hpack_str(&mut block, "trailers");
    block
}

/// Copies the client's bytes to the server, replacing the header block of
/// every HEADERS frame with `block`; counts the frames replaced.
async fn relay_to_server(
    mut from_client: tokio::io::ReadHalf<UnixStream>,
    mut to_server: tokio::net::unix::OwnedWriteHalf,
    block: Vec<u8>,
    replaced: Arc<AtomicUsize>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut preface_sent = false;
    loop {
        if !preface_sent && buf.len() >= PREFACE.len() {
            assert_eq!(&buf[..PREFACE.len()], PREFACE, "the client preface");
            to_server.write_all(PREFACE).await?;
            buf.drain(..PREFACE.len());
            preface_sent = true;
        }
        while preface_sent && buf.len() >= FRAME_HEADER_LEN {
            let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]) as usize;
            if buf.len() < FRAME_HEADER_LEN + len {
                break;
            }
            let frame: Vec<u8> = buf.drain(..FRAME_HEADER_LEN + len).collect();
            let (kind, flags) = (frame[3], frame[4]);
            if kind != HEADERS {
                to_server.write_all(&frame).await?;
                continue;
            }
            // One block in one frame, nothing around it: no CONTINUATION
            // follows, and the payload is the header block alone.
            assert_eq!(flags & (END_HEADERS | PADDED | PRIORITY), END_HEADERS);
            let mut out = u32::try_from(block.len()).unwrap().to_be_bytes()[1..].to_vec();
            out.extend_from_slice(&frame[3..FRAME_HEADER_LEN]); // type, flags, stream
            out.extend_from_slice(&block);
            to_server.write_all(&out).await?;
            replaced.fetch_add(1, Ordering::SeqCst);
        }
        if from_client.read_buf(&mut buf).await? == 0 {
            return to_server.shutdown().await;
        }
    }
}

/// What the server answered a gRPC call.
#[derive(Debug)]
struct Answer {
    status: http::StatusCode,
    content_type: Option<String>,
    /// The message, without gRPC's 5-byte length prefix.
    message: Vec<u8>,
    grpc_status: Option<String>,
    grpc_message: Option<String>,
}

/// Calls `path` (`/package.Service/Method`) on the server at `socket` with
/// `request` over HTTP/2, sending `authority` as `:authority`. An `Err` is
/// the stream's or connection's failure (a stream reset among them).
async fn call(
    socket: &Path,
    authority: &str,
    path: &str,
    request: &[u8],
) -> Result<Answer, String> {
    let server = UnixStream::connect(socket).await.expect("connects");
    let (from_server, to_server) = server.into_split();
    let (client_io, relay_io) = UnixStream::pair().unwrap();
    let (from_client, mut to_client) = tokio::io::split(relay_io);
    let replaced = Arc::new(AtomicUsize::new(0));
    let relay = tokio::spawn(relay_to_server(
        from_client,
        to_server,
        grpc_header_block(path, authority),
        replaced.clone(),
    ));
    let back = tokio::spawn(async move {
        let mut from_server = from_server;
        let _ = tokio::io::copy(&mut from_server, &mut to_client).await;
    });

    let result = async {
        let (mut client, connection) = h2::client::handshake(client_io)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        tokio::spawn(connection);
        client = client.ready().await.map_err(|e| format!("ready: {e}"))?;
        // The relay replaces these headers with the block it was given.
        let head = http::Request::post(format!("http://localhost{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(())
            .unwrap();
        let (response, mut body) = client
            .send_request(head, false)
            .map_err(|e| format!("send_request: {e}"))?;
        let mut framed = vec![0u8];
        framed.extend_from_slice(&u32::try_from(request.len()).unwrap().to_be_bytes());
        framed.extend_from_slice(request);
        body.send_data(bytes::Bytes::from(framed), true)
            .map_err(|e| format!("send_data: {e}"))?;

        let response = response.await.map_err(|e| format!("response: {e:?}"))?;
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .map(|v| v.to_str().unwrap().to_owned());
        let mut body = response.into_body();
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(|e| format!("body: {e:?}"))?;
            let _ = body.flow_control().release_capacity(chunk.len());
            data.extend_from_slice(&chunk);
        }
        let trailers = body
            .trailers()
            .await
            .map_err(|e| format!("trailers: {e:?}"))?
            .unwrap_or_default();
        let header = |name: &str| trailers.get(name).map(|v| v.to_str().unwrap().to_owned());
        let message = match data.len() {
            0 => Vec::new(),
            n => {
                assert!(n >= 5, "a gRPC message prefix: {data:?}");
                assert_eq!(data[0], 0, "an uncompressed message");
                let len = u32::from_be_bytes(data[1..5].try_into().unwrap()) as usize;
                assert_eq!(len, n - 5, "one message: {data:?}");
                data[5..].to_vec()
            }
        };
        Ok(Answer {
            status,
            content_type,
            message,
            grpc_status: header("grpc-status"),
            grpc_message: header("grpc-message"),
        })
    };
    let result = tokio::time::timeout(Duration::from_secs(10), result)
        .await
        .unwrap_or_else(|_| Err("no answer within 10s".into()));
    relay.abort();
    back.abort();
    assert_eq!(
        replaced.load(Ordering::SeqCst),
        1,
        "the relay replaced the request's HEADERS frame"
    );
    result
}

async fn assert_served(socket: &Path, authority: &str) {
    let ping = call(
        socket,
        authority,
        "/kubevirt.cmd.v1.Cmd/Ping",
        &prost::Message::encode_to_vec(&EmptyRequest {}),
    )
    .await
    .unwrap_or_else(|e| panic!("Ping with :authority {authority:?} failed: {e}"));
    assert_eq!(ping.status, http::StatusCode::OK, "{ping:?}");
    assert_eq!(
        ping.content_type.as_deref(),
        Some("application/grpc"),
        "{ping:?}"
    );
    assert_eq!(ping.grpc_status.as_deref(), Some("0"), "{ping:?}");
    let response: CmdResponse = prost::Message::decode(&ping.message[..]).unwrap();
    assert!(response.success, "Ping: {response:?}");

    // The handler's first call on a launcher's socket.
    let info = call(
        socket,
        authority,
        "/kubevirt.cmd.info.CmdInfo/Info",
        &prost::Message::encode_to_vec(&CmdInfoRequest {}),
    )
    .await
    .unwrap_or_else(|e| panic!("Info with :authority {authority:?} failed: {e}"));
    assert_eq!(
        (info.status, info.grpc_status.as_deref(), &info.grpc_message),
        (http::StatusCode::OK, Some("0"), &None),
        "{info:?}"
    );
    let response: CmdInfoResponse = prost::Message::decode(&info.message[..]).unwrap();
    assert_eq!(response.supported_cmd_versions, vec![1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_path_as_authority_is_served() {
    require_root_and_kvm();
    let pod = Pod::new();
    let _launcher = pod.start_launcher(&[]);
    let socket = pod.paths.launcher_socket();
    let path = socket.to_str().unwrap();

    // The relay itself, with an authority any h2 accepts.
    assert_served(&socket, "localhost").await;
    // gRPC's C core (Python grpcio, C++, Ruby, ...) for `unix:<path>`: the
    // path without its leading `/`, percent-encoded; grpcio 1.85 sends
    // `tmp%2F.tmpXXXXXX%2Fvar%2Frun%2Fkubevirt%2Fsockets%2Flauncher-sock` here.
    let c_core = percent_encoded(path.strip_prefix('/').unwrap());
    assert!(c_core.contains("%2Fvar%2Frun%2F"), "{c_core}");
    assert_served(&socket, &c_core).await;
    // The same with the leading `/` encoded too.
    assert_served(&socket, &percent_encoded(path)).await;
    // grpc-java: the path as it is.
    assert_served(&socket, path).await;
}

/// The lock file, which every build of the workspace reads, takes h2 from
/// `vendor/h2` (a path package has no `source`), at the vendored version,
/// and records no unused patch. Runs without root or KVM, so a dropped
/// patch fails even where the launcher cannot start.
#[test]
fn the_lock_file_takes_h2_from_vendor() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let lock = std::fs::read_to_string(root.join("Cargo.lock")).unwrap();
    let vendored = std::fs::read_to_string(root.join("vendor/h2/Cargo.toml")).unwrap();
    let version = vendored
        .lines()
        .find_map(|l| l.strip_prefix("version = "))
        .expect("vendor/h2/Cargo.toml has a version")
        .trim_matches('"');
    assert!(
        !lock.contains("[[patch.unused]]"),
        "Cargo.lock records an unused [patch] (cargo dropped vendor/h2?)"
    );
    let h2: Vec<&str> = lock
        .split("\n[[")
        .filter(|entry| entry.starts_with("package]]\nname = \"h2\"\n"))
        .collect();
    assert_eq!(h2.len(), 1, "one h2 in Cargo.lock: {h2:#?}");
    let entry = h2[0];
    assert!(
        entry.contains(&format!("\nversion = \"{version}\"\n")),
        "Cargo.lock's h2 is not the vendored {version}:\n{entry}"
    );
    assert!(
        !entry.contains("\nsource = "),
        "Cargo.lock takes h2 from a registry, not vendor/h2 (is [patch.crates-io] gone or unused?):\n{entry}"
    );
}
