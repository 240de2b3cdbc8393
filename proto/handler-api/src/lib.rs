//! virt-handler's HTTPS endpoint for virt-api (KubeVirt v1.9.0's "console server",
//! `pkg/virt-handler/rest`): virt-api forwards a VMI subresource (`pause`, `unpause`,
//! `softreboot`, `reset`, `freeze`, `unfreeze`) to the handler of the VMI's node, which sends it
//! to the VMI's launcher.
//!
//! Both sides hold certificates of the install's CA (`kubevirt-ca`), as in v1.9.0: the handler
//! serves with `kubevirt-virt-handler-server-certs` (common name
//! [`SERVER_COMMON_NAME`]) and accepts only clients with `kubevirt-virt-handler-certs`
//! ([`CLIENT_COMMON_NAME`]); virt-api calls with that client certificate and accepts only a
//! server certificate of the CA for server use. v1.9.0 checks the server's common name and no
//! host name (it calls a pod IP); rustls checks a name, so the server certificate also carries
//! the DNS name [`SERVER_NAME`], which the client asks for.
//!
//! Also here, because virt-api serves TLS the same way: [`TlsListener`], TCP connections
//! through a TLS handshake for `axum::serve`.

use anyhow::{Context as _, Result, bail};
use http_body_util::{BodyExt as _, Full};
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

#[cfg(feature = "testing")]
pub mod test_certs;

/// `--console-server-port`.
pub const PORT: u16 = 8186;
/// The handler's serving certificate's common name (`components.VirtHandlerServerCertSecretName`'s).
pub const SERVER_COMMON_NAME: &str = "kubevirt.io:system:node:virt-handler";
/// The client certificate's common name (the one handlers and virt-api present).
pub const CLIENT_COMMON_NAME: &str = "kubevirt.io:system:client:virt-handler";
/// The common names a handler accepts on its migration proxies' TLS (v1.9.0's
/// `--migration-cn-types` default, `virt-handler` and `migration`, as
/// `kubevirt.io:system:client:<type>`): the handler client certificate, or a certificate
/// made for migrations.
pub const MIGRATION_CLIENT_COMMON_NAMES: &[&str] =
    &[CLIENT_COMMON_NAME, "kubevirt.io:system:client:migration"];
/// The DNS name the serving certificate carries and the client asks for.
pub const SERVER_NAME: &str = "virt-handler";
/// The Secrets (`kubernetes.io/tls`) of the two certificates.
pub const SERVER_SECRET: &str = "kubevirt-virt-handler-server-certs";
pub const CLIENT_SECRET: &str = "kubevirt-virt-handler-certs";
/// The ConfigMap with the CA certificate both sides trust, and its key.
pub const CA_CONFIG_MAP: &str = "kubevirt-ca";
pub const CA_BUNDLE_KEY: &str = "ca-bundle";

/// The websocket subprotocol of the console (`plain.kubevirt.io`): raw bytes in binary
/// messages.
pub const CONSOLE_PROTOCOL: &str = "plain.kubevirt.io";

/// The handler's path for a VMI's console websocket.
pub fn console_path(namespace: &str, name: &str) -> String {
    format!("/v1/namespaces/{namespace}/virtualmachineinstances/{name}/console")
}

/// What virt-api forwards (v1.9.0 `kubecli/handler.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Pause,
    Unpause,
    SoftReboot,
    Reset,
    Freeze,
    Unfreeze,
}

impl Action {
    pub const ALL: [Action; 6] = [
        Action::Pause,
        Action::Unpause,
        Action::SoftReboot,
        Action::Reset,
        Action::Freeze,
        Action::Unfreeze,
    ];

    /// The last path segment, as the subresource is named.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Pause => "pause",
            Action::Unpause => "unpause",
            Action::SoftReboot => "softreboot",
            Action::Reset => "reset",
            Action::Freeze => "freeze",
            Action::Unfreeze => "unfreeze",
        }
    }

    pub fn from_segment(segment: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == segment)
    }
}

/// The handler's path for `action` on a VMI (always `/v1`, whatever version virt-api was
/// called with).
pub fn vmi_path(namespace: &str, name: &str, action: Action) -> String {
    format!(
        "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/{}",
        action.as_str()
    )
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(pem: &str, what: &str) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{what} is not PEM"))?;
    if certs.is_empty() {
        bail!("{what} holds no certificate");
    }
    Ok(certs)
}

/// The CA certificates of a PEM bundle.
pub fn roots(ca_pem: &str) -> Result<Arc<rustls::RootCertStore>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certificates(ca_pem, "the CA bundle")? {
        roots.add(cert).context("the CA bundle")?;
    }
    Ok(Arc::new(roots))
}

/// The handler's TLS: its certificate, and a client certificate of the CA with
/// [`CLIENT_COMMON_NAME`] required of every client.
pub fn server_config(cert_pem: &str, key_pem: &str, ca_pem: &str) -> Result<rustls::ServerConfig> {
    let mut config = mutual_server_config(cert_pem, key_pem, ca_pem, &[CLIENT_COMMON_NAME])?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The TLS of a handler's migration proxy towards the source's handler: its serving
/// certificate, and a client certificate of the CA with one of
/// [`MIGRATION_CLIENT_COMMON_NAMES`] required. A byte stream: no ALPN.
pub fn migration_server_config(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<rustls::ServerConfig> {
    mutual_server_config(cert_pem, key_pem, ca_pem, MIGRATION_CLIENT_COMMON_NAMES)
}

/// The source handler's side of a migration proxy: as virt-api's towards handlers, without
/// ALPN.
pub fn migration_client_config(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
) -> Result<rustls::ClientConfig> {
    let mut config = client_config(cert_pem, key_pem, ca_pem)?;
    config.alpn_protocols.clear();
    Ok(config)
}

fn mutual_server_config(
    cert_pem: &str,
    key_pem: &str,
    ca_pem: &str,
    common_names: &'static [&'static str],
) -> Result<rustls::ServerConfig> {
    let chain = chain_verifier(roots(ca_pem)?)?;
    let verifier = Arc::new(ClientVerifier::new(
        move || Some(chain.clone()),
        common_names,
        true,
    ));
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("the serving key is not PEM")?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certificates(cert_pem, "the serving certificate")?, key)
        .context("the serving certificate and key")
}

/// virt-api's TLS towards handlers: its client certificate, and a server certificate of the
/// CA for [`SERVER_NAME`].
pub fn client_config(cert_pem: &str, key_pem: &str, ca_pem: &str) -> Result<rustls::ClientConfig> {
    let key =
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes()).context("the client key is not PEM")?;
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots(ca_pem)?)
        .with_client_auth_cert(certificates(cert_pem, "the client certificate")?, key)
        .context("the client certificate and key")?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// A client-certificate verifier that judges each handshake's chain by the verifier `current`
/// gives at that moment (none: every certificate is refused), then, if `common_names` is not
/// empty, the leaf's common name (v1.9.0 `verifyPeerCert`: "common name is invalid").
/// `mandatory: false` asks for a certificate but lets a client without one in.
pub struct ClientVerifier {
    current: Box<dyn Fn() -> Option<Arc<dyn ClientCertVerifier>> + Send + Sync>,
    common_names: &'static [&'static str],
    mandatory: bool,
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl std::fmt::Debug for ClientVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientVerifier")
            .field("common_names", &self.common_names)
            .field("mandatory", &self.mandatory)
            .finish()
    }
}

impl ClientVerifier {
    pub fn new(
        current: impl Fn() -> Option<Arc<dyn ClientCertVerifier>> + Send + Sync + 'static,
        common_names: &'static [&'static str],
        mandatory: bool,
    ) -> Self {
        ClientVerifier {
            current: Box::new(current),
            common_names,
            mandatory,
            algorithms: provider().signature_verification_algorithms,
        }
    }
}

impl ClientCertVerifier for ClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        self.mandatory
    }

    // No hints: a client with one certificate sends it whatever the server names.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let Some(chain) = (self.current)() else {
            return Err(rustls::Error::General("no client CA known yet".into()));
        };
        let verified = chain.verify_client_cert(end_entity, intermediates, now)?;
        if self.common_names.is_empty() {
            return Ok(verified);
        }
        match common_name(end_entity) {
            Some(name) if self.common_names.contains(&name.as_str()) => Ok(verified),
            other => Err(rustls::Error::General(format!(
                "common name is invalid, got {}",
                other.unwrap_or_default()
            ))),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A chain verifier for clients of `roots` (for [`ClientVerifier`]).
pub fn chain_verifier(roots: Arc<rustls::RootCertStore>) -> Result<Arc<dyn ClientCertVerifier>> {
    WebPkiClientVerifier::builder_with_provider(roots, provider())
        .allow_unauthenticated()
        .build()
        .context("the client-certificate verifier")
}

/// The common name of a DER certificate.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_string)
}

/// A TLS connection to the handler at `address` (for a websocket relay).
pub async fn connect(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to virt-handler at {address}"))?;
    let name = ServerName::try_from(SERVER_NAME)?;
    TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .with_context(|| format!("TLS with virt-handler at {address}"))
}

/// One request to a handler at `address`: the status and the body. `timeout` bounds all of
/// it (v1.9.0's client gives a handler 10 s).
pub async fn request(
    config: Arc<rustls::ClientConfig>,
    address: SocketAddr,
    method: http::Method,
    path: &str,
    body: Vec<u8>,
    timeout: Duration,
) -> Result<(http::StatusCode, Vec<u8>)> {
    tokio::time::timeout(timeout, async {
        let tls = connect(config, address).await?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
        let connection = tokio::spawn(connection);
        let request = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, address.to_string())
            .header(http::header::ACCEPT, "application/json")
            .body(Full::new(axum::body::Bytes::from(body)))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes().to_vec();
        connection.abort();
        Ok((status, body))
    })
    .await
    .with_context(|| format!("virt-handler at {address} did not answer within {timeout:?}"))?
}

/// TCP connections through a TLS handshake, each on its own task (a slow client holds up
/// no other), for `axum::serve`.
pub struct TlsListener {
    local: SocketAddr,
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    acceptor: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, config: rustls::ServerConfig) -> std::io::Result<Self> {
        let local = listener.local_addr()?;
        let tls = TlsAcceptor::from(Arc::new(config));
        let (send, accepted) = mpsc::channel(64);
        let acceptor = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let tls = tls.clone();
                let send = send.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(Duration::from_secs(10), tls.accept(stream)).await {
                        Ok(Ok(session)) => {
                            let _ = send.send((session, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            accepted,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The acceptor ended (it never does by itself): no more connections.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
