//! The migration proxies over real mutual TLS on loopback and real unix sockets: a
//! "launcher" in the source pod connects to its socket, the bytes reach the target pod's
//! socket through the source handler's listener, TCP with TLS, and the target handler's
//! listener, both ways; a peer without the CA's client certificate, or with another common
//! name, never reaches the target pod.

use std::net::SocketAddr;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use handler::migration::proxy::{PodSocket, SourceListener, TargetListener};
use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;

use handler_api::test_certs::{Pair, ca, leaf, rcgen};

/// The install's certificates: the CA, the handlers' serving certificate, and a client
/// certificate with `client_cn` (of this CA, or of `other_ca`'s).
struct Certs {
    ca: Pair,
    server: Pair,
}

fn certs() -> (Certs, rcgen::Issuer<'static, rcgen::KeyPair>) {
    let (ca, issuer) = ca();
    let server = leaf(
        &issuer,
        handler_api::SERVER_COMMON_NAME,
        &[handler_api::SERVER_NAME],
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    );
    (Certs { ca, server }, issuer)
}

fn client_tls(
    issuer: &rcgen::Issuer<'static, rcgen::KeyPair>,
    cn: &str,
    ca: &Pair,
) -> Arc<rustls::ClientConfig> {
    let pair = leaf(issuer, cn, &[], rcgen::ExtendedKeyUsagePurpose::ClientAuth);
    Arc::new(handler_api::migration_client_config(&pair.cert, &pair.key, &ca.cert).unwrap())
}

fn server(certs: &Certs) -> Arc<rustls::ServerConfig> {
    Arc::new(
        handler_api::migration_server_config(&certs.server.cert, &certs.server.key, &certs.ca.cert)
            .unwrap(),
    )
}

/// The target launcher: echoes what it reads, each byte plus one, until EOF; counts
/// the connections it got.
fn target_launcher(path: &Path) -> Arc<std::sync::atomic::AtomicUsize> {
    let listener = UnixListener::bind(path).unwrap();
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 65536];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            buf[..n].iter_mut().for_each(|b| *b = b.wrapping_add(1));
                            if conn.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    count
}

const LOOPBACK: &str = "127.0.0.1:0";

async fn pods(
    tls_server: Option<Arc<rustls::ServerConfig>>,
    tls_client: Option<Arc<rustls::ClientConfig>>,
) -> (
    tempfile::TempDir,
    SourceListener,
    TargetListener,
    Arc<std::sync::atomic::AtomicUsize>,
) {
    let dir = tempfile::tempdir().unwrap();
    let target_pod = dir
        .path()
        .join("target/migrationproxy/uid-49152-source.sock");
    std::fs::create_dir_all(target_pod.parent().unwrap()).unwrap();
    let connections = target_launcher(&target_pod);
    let target_socket =
        PodSocket::in_dir(target_pod.parent().unwrap(), "uid-49152-source.sock").unwrap();
    let target = TargetListener::start(LOOPBACK.parse().unwrap(), target_socket, tls_server)
        .await
        .unwrap();
    let address: SocketAddr = format!("127.0.0.1:{}", target.port).parse().unwrap();
    let source_pod = dir
        .path()
        .join("source/migrationproxy/uid-49152-source.sock");
    std::fs::create_dir_all(source_pod.parent().unwrap()).unwrap();
    let source_socket =
        PodSocket::in_dir(source_pod.parent().unwrap(), "uid-49152-source.sock").unwrap();
    let source = SourceListener::start(source_socket, None, address, tls_client)
        .await
        .unwrap();
    (dir, source, target, connections)
}

/// The source pod's socket, as the launcher there dials it.
fn source_socket(dir: &tempfile::TempDir) -> std::path::PathBuf {
    dir.path()
        .join("source/migrationproxy/uid-49152-source.sock")
}

/// Sends 8 MiB through the source pod's socket while reading the answer; checks it.
fn round_trip(socket: &Path) -> std::io::Result<()> {
    let mut conn = UnixStream::connect(socket)?;
    conn.set_read_timeout(Some(Duration::from_secs(20)))?;
    let data: Vec<u8> = (0..8usize << 20)
        .map(|i| (i % 251).to_le_bytes()[0])
        .collect();
    let mut writer = conn.try_clone()?;
    let sent = data.clone();
    let sender = std::thread::spawn(move || writer.write_all(&sent));
    let mut back = vec![0u8; data.len()];
    conn.read_exact(&mut back)?;
    sender.join().unwrap()?;
    assert!(
        back.iter().zip(&data).all(|(b, d)| *b == d.wrapping_add(1)),
        "the bytes came back changed"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_crosses_both_handlers_over_mutual_tls_both_ways() {
    let (certs, issuer) = certs();
    let client = client_tls(&issuer, handler_api::CLIENT_COMMON_NAME, &certs.ca);
    let (dir, _source, _target, connections) = pods(Some(server(&certs)), Some(client)).await;
    // The target pod's socket is dialled only for a connection.
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
    let socket = source_socket(&dir);
    tokio::task::spawn_blocking(move || {
        round_trip(&socket).unwrap();
        round_trip(&socket).unwrap();
    })
    .await
    .unwrap();
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 2);
    // Only the owner may connect to the source pod's socket.
    let mode = std::fs::metadata(source_socket(&dir)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );
    // A certificate made for migrations is accepted too.
    let migration = client_tls(&issuer, "kubevirt.io:system:client:migration", &certs.ca);
    let (dir, source, _target, _) = pods(Some(server(&certs)), Some(migration)).await;
    let socket = source_socket(&dir);
    tokio::task::spawn_blocking(move || round_trip(&socket).unwrap())
        .await
        .unwrap();
    // Dropped, the source's socket goes.
    let gone = source_socket(&dir);
    drop(source);
    assert!(!gone.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_without_the_right_certificate_never_reach_the_target_pod() {
    let (certs, issuer) = certs();
    let (other_ca, other_issuer) = ca();
    for (what, client) in [
        (
            "another common name",
            client_tls(&issuer, "kubevirt.io:system:client:virt-api", &certs.ca),
        ),
        (
            "another CA's certificate",
            client_tls(&other_issuer, handler_api::CLIENT_COMMON_NAME, &certs.ca),
        ),
    ] {
        let (dir, _source, _target, connections) = pods(Some(server(&certs)), Some(client)).await;
        let socket = source_socket(&dir);
        let result = tokio::task::spawn_blocking(move || round_trip(&socket))
            .await
            .unwrap();
        assert!(result.is_err(), "{what}: the stream went through");
        assert_eq!(
            connections.load(std::sync::atomic::Ordering::SeqCst),
            0,
            "{what}: the target pod was dialled"
        );
    }
    drop(other_ca);
    // A plain TCP client (no TLS at all) is refused by a TLS target as well.
    let (dir, _source, _target, connections) = pods(Some(server(&certs)), None).await;
    let socket = source_socket(&dir);
    let result = tokio::task::spawn_blocking(move || round_trip(&socket))
        .await
        .unwrap();
    assert!(result.is_err());
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tls_the_stream_goes_plain() {
    // KubeVirt's `migrations.disableTLS`.
    let (dir, _source, _target, connections) = pods(None, None).await;
    let socket = source_socket(&dir);
    tokio::task::spawn_blocking(move || round_trip(&socket).unwrap())
        .await
        .unwrap();
    assert_eq!(connections.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// The pods own their `migrationproxy` directories: a link put where the target launcher's
/// socket should be is not followed (it could lead to any socket on the node), and a link
/// at the source socket's name is replaced, its target's mode and owner left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_in_the_pods_are_never_followed() {
    let dir = tempfile::tempdir().unwrap();
    let host = dir.path().join("host");
    std::fs::create_dir_all(&host).unwrap();
    let host_socket = host.join("some-daemon.sock");
    let reached = target_launcher(&host_socket);
    let target_dir = dir.path().join("target/migrationproxy");
    std::fs::create_dir_all(&target_dir).unwrap();
    std::os::unix::fs::symlink(&host_socket, target_dir.join("uid-49152-source.sock")).unwrap();
    let target = TargetListener::start(
        LOOPBACK.parse().unwrap(),
        PodSocket::in_dir(&target_dir, "uid-49152-source.sock").unwrap(),
        None,
    )
    .await
    .unwrap();
    let source_dir = dir.path().join("source/migrationproxy");
    std::fs::create_dir_all(&source_dir).unwrap();
    let host_file = host.join("precious");
    std::fs::write(&host_file, b"x").unwrap();
    std::fs::set_permissions(
        &host_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    std::os::unix::fs::symlink(&host_file, source_dir.join("uid-49152-source.sock")).unwrap();
    let address: SocketAddr = format!("127.0.0.1:{}", target.port).parse().unwrap();
    let source = SourceListener::start(
        PodSocket::in_dir(&source_dir, "uid-49152-source.sock").unwrap(),
        None,
        address,
        None,
    )
    .await
    .unwrap();
    let mode = std::fs::metadata(&host_file).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o644
    );
    let socket = source_socket(&dir);
    assert!(
        std::fs::symlink_metadata(&socket)
            .unwrap()
            .file_type()
            .is_socket()
    );
    let result = tokio::task::spawn_blocking(move || round_trip(&socket))
        .await
        .unwrap();
    assert!(
        result.is_err(),
        "the stream reached a socket through a link"
    );
    assert_eq!(reached.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(source);
}
