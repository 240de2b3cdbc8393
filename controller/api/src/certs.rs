//! The certificates virt-api serves with, as small as the job needs: a CA and a serving
//! certificate it signed, each in a Secret of the install namespace under KubeVirt v1.9.0's
//! names (`kubevirt-ca`, `kubevirt-virt-api-certs`; type `kubernetes.io/tls`, `tls.crt` and
//! `tls.key`; the CA's subject `CN=kubevirt.io`, the serving certificate's
//! `CN=virt-api.<namespace>.pod.cluster.local` with the Service's names as DNS names,
//! ECDSA P-256 keys), and the CA as the `caBundle` of every webhook of the webhook
//! configurations virt-api owns.
//!
//! The Secrets are the one source replicas agree on: each is created only if absent (a
//! replica that loses the race reads the winner's). A serving certificate that the CA does
//! not verify for the Service's name (another CA, expired, a name missing) is replaced,
//! guarded by its resource version. Both are valid for ten years; nothing rotates them
//! (KubeVirt's operator does): delete both Secrets and restart virt-api for new ones.

use anyhow::{Context as _, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `KubeVirtCASecretName`.
pub const CA_SECRET: &str = "kubevirt-ca";
/// `VirtApiCertSecretName`.
pub const SERVING_SECRET: &str = "kubevirt-virt-api-certs";
/// The CA's common name (`triple.NewCA("kubevirt.io")`).
pub const CA_COMMON_NAME: &str = "kubevirt.io";
/// `bootstrap.CertBytesValue`, `bootstrap.KeyBytesValue`.
pub const CERT_KEY: &str = "tls.crt";
pub const KEY_KEY: &str = "tls.key";

/// How long both certificates are valid.
const VALIDITY: time::Duration = time::Duration::days(3650);

/// A certificate and its key, PEM.
#[derive(Clone, Debug)]
pub struct Pair {
    pub cert_pem: String,
    pub key_pem: String,
}

/// What virt-api serves with: its certificate and key, and the CA that signed it.
#[derive(Clone, Debug)]
pub struct Tls {
    pub ca: Pair,
    pub serving: Pair,
}

/// The names the serving certificate holds (`triple.NewServerKeyPair`): the Service's
/// short, namespaced and cluster names, then `extra` (an IP address becomes an IP name).
pub fn serving_names(service: &str, namespace: &str, extra: &[String]) -> Vec<String> {
    let mut names = vec![
        service.to_string(),
        format!("{service}.{namespace}"),
        format!("{service}.{namespace}.svc"),
        format!("{service}.{namespace}.svc.cluster.local"),
    ];
    names.extend(extra.iter().cloned());
    names
}

fn validity(params: &mut rcgen::CertificateParams) {
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + VALIDITY;
}

fn common_name(name: &str) -> rcgen::DistinguishedName {
    let mut dn = rcgen::DistinguishedName::new();
    dn.push(rcgen::DnType::CommonName, name);
    dn
}

/// A new self-signed CA.
pub fn new_ca() -> Result<Pair> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = common_name(CA_COMMON_NAME);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    validity(&mut params);
    let cert = params.self_signed(&key)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A new serving certificate for `names` (the first is the Service), signed by `ca`.
pub fn new_serving(ca: &Pair, service: &str, namespace: &str, names: &[String]) -> Result<Pair> {
    let ca_key = rcgen::KeyPair::from_pem(&ca.key_pem).context("the CA's key")?;
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).context("the CA's certificate")?;
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names.to_vec())?;
    // `LocalPodDNStemplateString`: `<service>.<namespace>.pod.cluster.local`.
    params.distinguished_name = common_name(&format!("{service}.{namespace}.pod.cluster.local"));
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    validity(&mut params);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Whether `serving` is a certificate `ca` verifies, now, for every one of `names`, with a
/// key that goes with it.
pub fn verifies(ca: &Pair, serving: &Pair, names: &[String]) -> bool {
    let check = || -> Result<()> {
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        verify_server_cert(ca, serving, &names)?;
        // The key must be the certificate's: rustls checks that when it loads both.
        server_config(serving)?;
        Ok(())
    };
    check().is_ok()
}

/// Whether a TLS client trusting only `ca` accepts `serving` for each of `names`.
fn verify_server_cert(ca: &Pair, serving: &Pair, names: &[&str]) -> Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())?)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier =
        rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
            .build()?;
    let cert = CertificateDer::from_pem_slice(serving.cert_pem.as_bytes())?;
    for name in names {
        rustls::client::danger::ServerCertVerifier::verify_server_cert(
            verifier.as_ref(),
            &cert,
            &[],
            &ServerName::try_from(name.to_string())?,
            &[],
            UnixTime::now(),
        )?;
    }
    Ok(())
}

/// rustls' server configuration for `serving` (HTTP/1.1, ring, TLS 1.2 and 1.3), without
/// client certificates.
pub fn server_config(serving: &Pair) -> Result<rustls::ServerConfig> {
    server_config_with(
        serving,
        rustls::server::WebPkiClientVerifier::no_client_auth(),
    )
}

/// The same, with client certificates judged by `clients`.
pub fn server_config_with(
    serving: &Pair,
    clients: Arc<dyn rustls::server::danger::ClientCertVerifier>,
) -> Result<rustls::ServerConfig> {
    let certs = CertificateDer::pem_slice_iter(serving.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .context("the serving certificate")?;
    let key = PrivateKeyDer::from_pem_slice(serving.key_pem.as_bytes())
        .context("the serving certificate's key")?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_client_cert_verifier(clients)
    .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

fn secret(name: &str, namespace: &str, pair: &Pair) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([(
                "app.kubernetes.io/managed-by".to_string(),
                "virt-api".to_string(),
            )])),
            ..Default::default()
        },
        type_: Some("kubernetes.io/tls".into()),
        data: Some(BTreeMap::from([
            (
                CERT_KEY.to_string(),
                ByteString(pair.cert_pem.clone().into_bytes()),
            ),
            (
                KEY_KEY.to_string(),
                ByteString(pair.key_pem.clone().into_bytes()),
            ),
        ])),
        ..Default::default()
    }
}

fn pair_of(secret: &Secret) -> Option<Pair> {
    let data = secret.data.as_ref()?;
    let text = |key: &str| String::from_utf8(data.get(key)?.0.clone()).ok();
    Some(Pair {
        cert_pem: text(CERT_KEY)?,
        key_pem: text(KEY_KEY)?,
    })
}

fn is_status(error: &kube::Error, code: u16) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == code)
}

/// The CA of `kubevirt-ca`, created if absent.
async fn ensure_ca(secrets: &Api<Secret>, namespace: &str) -> Result<Pair> {
    loop {
        if let Some(existing) = secrets.get_opt(CA_SECRET).await? {
            return pair_of(&existing).with_context(|| {
                format!("Secret {namespace}/{CA_SECRET} has no {CERT_KEY} and {KEY_KEY}")
            });
        }
        let ca = new_ca()?;
        match secrets
            .create(&PostParams::default(), &secret(CA_SECRET, namespace, &ca))
            .await
        {
            Ok(_) => {
                tracing::info!(secret = CA_SECRET, "CA created");
                return Ok(ca);
            }
            // Another replica was first: use its CA.
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => return Err(e).context(format!("creating Secret {namespace}/{CA_SECRET}")),
        }
    }
}

/// The CA and serving certificate from their Secrets in `namespace`, each created if absent;
/// a serving certificate the CA does not verify for `names` is replaced.
pub async fn ensure(
    client: kube::Client,
    namespace: &str,
    service: &str,
    names: &[String],
) -> Result<Tls> {
    let secrets: Api<Secret> = Api::namespaced(client, namespace);
    let ca = ensure_ca(&secrets, namespace).await?;
    let serving = ensure_pair(
        &secrets,
        SERVING_SECRET,
        |pair| verifies(&ca, pair, names),
        || new_serving(&ca, service, namespace, names),
    )
    .await?;
    Ok(Tls { ca, serving })
}

/// The pair in Secret `name`, created if absent; one that `good` refuses is replaced
/// (guarded by its resource version; another replica's write wins and is read back).
async fn ensure_pair(
    secrets: &Api<Secret>,
    name: &str,
    good: impl Fn(&Pair) -> bool,
    make: impl Fn() -> Result<Pair>,
) -> Result<Pair> {
    let namespace = secrets.namespace().unwrap_or_default().to_string();
    for _ in 0..10 {
        let existing = secrets.get_opt(name).await?;
        if let Some(pair) = existing.as_ref().and_then(pair_of)
            && good(&pair)
        {
            return Ok(pair);
        }
        let pair = make()?;
        let mut object = secret(name, &namespace, &pair);
        let written = match &existing {
            None => secrets
                .create(&PostParams::default(), &object)
                .await
                .map(|_| ()),
            Some(old) => {
                tracing::warn!(
                    secret = name,
                    "a certificate the CA does not verify for its use: replaced"
                );
                object.metadata.resource_version = old.metadata.resource_version.clone();
                secrets
                    .replace(name, &PostParams::default(), &object)
                    .await
                    .map(|_| ())
            }
        };
        match written {
            Ok(()) => {
                tracing::info!(secret = name, "certificate written");
                return Ok(pair);
            }
            // Another replica wrote it meanwhile: read theirs.
            Err(e) if is_status(&e, 409) => continue,
            Err(e) => {
                return Err(e).context(format!("writing Secret {namespace}/{name}"));
            }
        }
    }
    bail!("Secret {namespace}/{name} kept changing under virt-api")
}

/// virt-handler's certificates (`handler_api`): its serving one and the client one virt-api
/// and handlers present to each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandlerCert {
    Server,
    Client,
}

/// A new handler certificate signed by `ca`: v1.9.0's common names; the serving one also
/// names [`handler_api::SERVER_NAME`].
pub fn new_handler_cert(ca: &Pair, kind: HandlerCert) -> Result<Pair> {
    let ca_key = rcgen::KeyPair::from_pem(&ca.key_pem).context("the CA's key")?;
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&ca.cert_pem, ca_key).context("the CA's certificate")?;
    let key = rcgen::KeyPair::generate()?;
    let (names, common, usage) = match kind {
        HandlerCert::Server => (
            vec![handler_api::SERVER_NAME.to_string()],
            handler_api::SERVER_COMMON_NAME,
            rcgen::ExtendedKeyUsagePurpose::ServerAuth,
        ),
        HandlerCert::Client => (
            Vec::new(),
            handler_api::CLIENT_COMMON_NAME,
            rcgen::ExtendedKeyUsagePurpose::ClientAuth,
        ),
    };
    let mut params = rcgen::CertificateParams::new(names)?;
    params.distinguished_name = common_name(common);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![usage];
    validity(&mut params);
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Pair {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Whether `pair` is a handler certificate of `kind` that `ca` verifies now, with its key.
pub fn handler_cert_verifies(ca: &Pair, pair: &Pair, kind: HandlerCert) -> bool {
    let check = || -> Result<()> {
        match kind {
            HandlerCert::Server => {
                verify_server_cert(ca, pair, &[handler_api::SERVER_NAME])?;
                handler_api::server_config(&pair.cert_pem, &pair.key_pem, &ca.cert_pem)?;
            }
            HandlerCert::Client => {
                let cert = CertificateDer::from_pem_slice(pair.cert_pem.as_bytes())?;
                let mut roots = rustls::RootCertStore::empty();
                roots.add(CertificateDer::from_pem_slice(ca.cert_pem.as_bytes())?)?;
                let roots = Arc::new(roots);
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let verifier =
                    rustls::server::WebPkiClientVerifier::builder_with_provider(roots, provider)
                        .build()?;
                verifier.verify_client_cert(&cert, &[], UnixTime::now())?;
                if handler_api::common_name(&cert).as_deref()
                    != Some(handler_api::CLIENT_COMMON_NAME)
                {
                    bail!("not the handler's client certificate");
                }
                handler_api::client_config(&pair.cert_pem, &pair.key_pem, &ca.cert_pem)?;
            }
        }
        Ok(())
    };
    check().is_ok()
}

/// What virt-api needs to call handlers: the CA and the client certificate. Makes sure of
/// the handlers' two Secrets and of the ConfigMap `kubevirt-ca` (the CA as `ca-bundle`,
/// which the handlers trust).
pub async fn ensure_handler(client: kube::Client, namespace: &str, ca: &Pair) -> Result<Pair> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    ensure_pair(
        &secrets,
        handler_api::SERVER_SECRET,
        |pair| handler_cert_verifies(ca, pair, HandlerCert::Server),
        || new_handler_cert(ca, HandlerCert::Server),
    )
    .await?;
    let client_pair = ensure_pair(
        &secrets,
        handler_api::CLIENT_SECRET,
        |pair| handler_cert_verifies(ca, pair, HandlerCert::Client),
        || new_handler_cert(ca, HandlerCert::Client),
    )
    .await?;
    let config_maps: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(client, namespace);
    let bundle = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": handler_api::CA_CONFIG_MAP, "namespace": namespace,
                     "labels": {"app.kubernetes.io/managed-by": "virt-api"}},
        "data": {handler_api::CA_BUNDLE_KEY: ca.cert_pem},
    });
    let current = config_maps.get_opt(handler_api::CA_CONFIG_MAP).await?;
    let written = current
        .as_ref()
        .and_then(|c| c.data.as_ref())
        .and_then(|d| d.get(handler_api::CA_BUNDLE_KEY));
    if written != Some(&ca.cert_pem) {
        let object = serde_json::from_value(bundle)?;
        let result = match current {
            None => config_maps.create(&PostParams::default(), &object).await,
            Some(_) => {
                config_maps
                    .replace(handler_api::CA_CONFIG_MAP, &PostParams::default(), &object)
                    .await
            }
        };
        match result {
            Ok(_) => tracing::info!(config_map = handler_api::CA_CONFIG_MAP, "CA bundle written"),
            // Another replica wrote the same CA meanwhile.
            Err(e) if is_status(&e, 409) => {}
            Err(e) => return Err(e).context("writing the ConfigMap kubevirt-ca"),
        }
    }
    Ok(client_pair)
}

/// Writes `ca_pem` as the `caBundle` of every webhook of the configuration `name` (only
/// those that differ; each operation guarded by the webhook's name at its index). Whether
/// anything was written.
pub async fn write_ca_bundle<K>(api: &Api<K>, name: &str, ca_pem: &str) -> Result<bool>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    use base64::Engine;
    let object = api
        .get(name)
        .await
        .with_context(|| format!("reading the webhook configuration {name}"))?;
    let value = serde_json::to_value(&object)?;
    let bundle = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut ops = Vec::new();
    for (i, webhook) in value["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if webhook["clientConfig"]["caBundle"].as_str() == Some(bundle.as_str()) {
            continue;
        }
        ops.push(serde_json::json!({"op": "test", "path": format!("/webhooks/{i}/name"), "value": webhook["name"]}));
        ops.push(serde_json::json!({"op": "add", "path": format!("/webhooks/{i}/clientConfig/caBundle"), "value": bundle}));
    }
    if ops.is_empty() {
        return Ok(false);
    }
    let patch: json_patch::Patch = serde_json::from_value(serde_json::Value::Array(ops))?;
    api.patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
        .await
        .with_context(|| format!("writing the caBundle of {name}"))?;
    Ok(true)
}

/// Writes `ca_pem` as the `caBundle` of the APIService `name` (when it differs). Whether
/// anything was written. No such APIService: nothing to write (the group is not registered
/// with the aggregation layer; the webhooks work without it).
pub async fn write_api_service_ca_bundle(
    api: &Api<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>,
    name: &str,
    ca_pem: &str,
) -> Result<bool> {
    let Some(object) = api
        .get_opt(name)
        .await
        .with_context(|| format!("reading the APIService {name}"))?
    else {
        tracing::debug!(api_service = name, "not registered");
        return Ok(false);
    };
    let current = object.spec.as_ref().and_then(|s| s.ca_bundle.as_ref());
    if current.is_some_and(|bundle| bundle.0 == ca_pem.as_bytes()) {
        return Ok(false);
    }
    let patch = serde_json::json!({"spec": {"caBundle": ByteString(ca_pem.as_bytes().to_vec())}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("writing the caBundle of the APIService {name}"))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_serving_certificate_the_ca_verifies_for_the_services_names() {
        let ca = new_ca().unwrap();
        let names = serving_names("virt-api", "kubevirt", &["127.0.0.1".into()]);
        assert_eq!(
            &names[..4],
            [
                "virt-api",
                "virt-api.kubevirt",
                "virt-api.kubevirt.svc",
                "virt-api.kubevirt.svc.cluster.local"
            ]
        );
        let serving = new_serving(&ca, "virt-api", "kubevirt", &names).unwrap();
        assert!(verifies(&ca, &serving, &names));
        server_config(&serving).unwrap();
        // Another CA, a name not in it, or another key: not verified.
        assert!(!verifies(&new_ca().unwrap(), &serving, &names));
        assert!(!verifies(
            &ca,
            &serving,
            &["virt-api.other.svc".to_string()]
        ));
        let other = new_serving(&ca, "virt-api", "kubevirt", &names).unwrap();
        let mixed = Pair {
            cert_pem: serving.cert_pem.clone(),
            key_pem: other.key_pem,
        };
        assert!(!verifies(&ca, &mixed, &names));
        // A CA read back from its PEM signs again.
        let again = new_serving(&ca, "virt-api", "kubevirt", &names[..1]).unwrap();
        assert!(verifies(&ca, &again, &names[..1]));
        assert!(!verifies(&ca, &again, &names));
    }
}
