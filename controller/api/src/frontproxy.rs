//! Who is calling: virt-api is an aggregated API server, so a user's request reaches it only
//! through the API server's front proxy, which authenticates the user, then connects with its
//! own client certificate (signed by the request-header CA, with one of the allowed names)
//! and names the user in `X-Remote-*` headers.
//!
//! The CA, the allowed names and the header names are what the API server publishes in the
//! ConfigMap `kube-system/extension-apiserver-authentication` (its `--requestheader-*`
//! flags); virt-api watches it, so a rotated CA takes effect without a restart.
//!
//! The TLS layer asks every client for a certificate but requires none (the webhooks are
//! called without one): a certificate that is sent must chain to the current request-header
//! CA or the handshake fails. Each subresource request then needs a verified certificate with
//! an allowed name ([`FrontProxy::authenticate`]); anything else is refused before a header
//! is read, so `X-Remote-User` from any other caller is never believed.

use anyhow::{Context as _, Result, bail};
use axum::http::HeaderMap;
use k8s_openapi::api::core::v1::ConfigMap;
use percent_encoding::percent_decode_str;
use rustls::server::danger::ClientCertVerifier;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

/// The ConfigMap the API server writes (`kube-system/extension-apiserver-authentication`).
pub const CONFIG_MAP_NAMESPACE: &str = "kube-system";
pub const CONFIG_MAP: &str = "extension-apiserver-authentication";

/// The front proxy's side of that ConfigMap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeaderConfig {
    pub ca_pem: String,
    /// Common names a front-proxy certificate may have; empty: any the CA signed.
    pub allowed_names: Vec<String>,
    pub username_headers: Vec<String>,
    pub uid_headers: Vec<String>,
    pub group_headers: Vec<String>,
    pub extra_header_prefixes: Vec<String>,
}

impl RequestHeaderConfig {
    /// The `requestheader-*` keys (lists are JSON arrays, as the API server writes them).
    pub fn from_config_map(config_map: &ConfigMap) -> Result<Self> {
        let data = config_map.data.clone().unwrap_or_default();
        let ca_pem = data
            .get("requestheader-client-ca-file")
            .filter(|ca| !ca.trim().is_empty())
            .context(
                "no requestheader-client-ca-file: the API server runs without \
                 --requestheader-client-ca-file (no aggregation layer)",
            )?
            .clone();
        let list = |key: &str| -> Result<Vec<String>> {
            match data.get(key) {
                None => Ok(Vec::new()),
                Some(text) if text.trim().is_empty() => Ok(Vec::new()),
                Some(text) => serde_json::from_str(text)
                    .with_context(|| format!("{key} is not a JSON list of strings: {text:?}")),
            }
        };
        let config = RequestHeaderConfig {
            ca_pem,
            allowed_names: list("requestheader-allowed-names")?,
            username_headers: list("requestheader-username-headers")?,
            uid_headers: list("requestheader-uid-headers")?,
            group_headers: list("requestheader-group-headers")?,
            extra_header_prefixes: list("requestheader-extra-headers-prefix")?,
        };
        if config.username_headers.is_empty() {
            bail!("no requestheader-username-headers: no header names the user");
        }
        Ok(config)
    }
}

/// A user as the front proxy named it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: BTreeMap<String, Vec<String>>,
}

/// What the TLS handshake established about the caller.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub address: Option<std::net::SocketAddr>,
    /// The common name of the client certificate, which the handshake verified against the
    /// request-header CA of that moment.
    pub verified_common_name: Option<String>,
}

/// Why a request is not from the front proxy (answered 401).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unauthenticated(pub String);

/// The current request-header configuration, and the client-certificate verifier built from
/// it for the TLS layer.
pub struct FrontProxy {
    current: RwLock<Option<Current>>,
}

#[derive(Clone)]
struct Current {
    config: Arc<RequestHeaderConfig>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl std::fmt::Debug for FrontProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let config = self.config();
        f.debug_struct("FrontProxy")
            .field("config", &config)
            .finish()
    }
}

impl Default for FrontProxy {
    fn default() -> Self {
        Self::new()
    }
}

impl FrontProxy {
    /// Knows no CA yet: every client certificate is refused until [`FrontProxy::update`].
    pub fn new() -> Self {
        FrontProxy {
            current: RwLock::new(None),
        }
    }

    /// Takes a new configuration (its CA must parse).
    pub fn update(&self, config: RequestHeaderConfig) -> Result<()> {
        let roots = handler_api::roots(&config.ca_pem).context("requestheader-client-ca-file")?;
        let verifier = handler_api::chain_verifier(roots)
            .context("the front proxy's client-certificate verifier")?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = Some(Current {
            config: Arc::new(config),
            verifier,
        });
        Ok(())
    }

    pub fn config(&self) -> Option<Arc<RequestHeaderConfig>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.config.clone())
    }

    fn verifier(&self) -> Option<Arc<dyn ClientCertVerifier>> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|c| c.verifier.clone())
    }

    /// The user of a request that came through the front proxy: a verified certificate with
    /// an allowed name, then the user, groups and extra from the configured headers.
    pub fn authenticate(&self, peer: &Peer, headers: &HeaderMap) -> Result<User, Unauthenticated> {
        let config = self.config().ok_or_else(|| {
            Unauthenticated("the front proxy's configuration is not known yet".into())
        })?;
        let name = peer.verified_common_name.as_deref().ok_or_else(|| {
            Unauthenticated(
                "no client certificate of the API server's front proxy: call through the \
                 Kubernetes API server"
                    .into(),
            )
        })?;
        if !config.allowed_names.is_empty() && !config.allowed_names.iter().any(|n| n == name) {
            return Err(Unauthenticated(format!(
                "client certificate {name:?} is not one of the front proxy's allowed names"
            )));
        }
        let values = |header: &str| -> Vec<String> {
            headers
                .get_all(header)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_string)
                .collect()
        };
        let first = |names: &[String]| names.iter().flat_map(|h| values(h)).find(|v| !v.is_empty());
        let user_name = first(&config.username_headers)
            .ok_or_else(|| Unauthenticated("the front proxy named no user".into()))?;
        let uid = first(&config.uid_headers).unwrap_or_default();
        let groups = config
            .group_headers
            .iter()
            .flat_map(|h| values(h))
            .collect();
        let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (header, value) in headers {
            let lower = header.as_str().to_ascii_lowercase();
            let Some(key) = config
                .extra_header_prefixes
                .iter()
                .find_map(|prefix| lower.strip_prefix(&prefix.to_ascii_lowercase()))
            else {
                continue;
            };
            if let Ok(value) = value.to_str() {
                // Keys travel percent-encoded (they may hold characters a header name cannot).
                extra
                    .entry(percent_decode_str(key).decode_utf8_lossy().into_owned())
                    .or_default()
                    .push(value.to_string());
            }
        }
        Ok(User {
            name: user_name,
            uid,
            groups,
            extra,
        })
    }

    /// The verifier for the TLS layer: always the current configuration's; a client
    /// without a certificate gets in (the webhooks' caller), one with a certificate the
    /// current CA did not sign does not.
    pub fn client_verifier(self: &Arc<Self>) -> Arc<dyn ClientCertVerifier> {
        let front_proxy = self.clone();
        Arc::new(handler_api::ClientVerifier::new(
            move || front_proxy.verifier(),
            &[],
            false,
        ))
    }
}

/// Keeps `front_proxy` at the ConfigMap's configuration: a watch of that one object, for
/// as long as virt-api runs. Until a valid one is read every subresource request is refused;
/// a bad one later keeps the last good one (said in the log).
pub async fn watch(client: kube::Client, front_proxy: Arc<FrontProxy>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, CONFIG_MAP_NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
    let mut events = std::pin::pin!(watcher(api, config).default_backoff().applied_objects());
    while let Some(event) = events.next().await {
        let config_map = match event {
            Ok(config_map) => config_map,
            Err(e) => {
                tracing::warn!(error = %e, "watching {CONFIG_MAP_NAMESPACE}/{CONFIG_MAP}");
                continue;
            }
        };
        let loaded = RequestHeaderConfig::from_config_map(&config_map).and_then(|config| {
            let names = config.allowed_names.clone();
            front_proxy.update(config).map(|()| names)
        });
        match loaded {
            Ok(names) => tracing::info!(
                allowed_names = ?names,
                "the front proxy's request-header configuration"
            ),
            Err(e) => tracing::warn!(
                error = format!("{e:#}"),
                "{CONFIG_MAP_NAMESPACE}/{CONFIG_MAP}: subresource requests cannot be authenticated"
            ),
        }
    }
}

/// The common name of a DER certificate (the handshake verified it already).
pub use handler_api::common_name;

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn config_map(data: &[(&str, &str)]) -> ConfigMap {
        ConfigMap {
            data: Some(
                data.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    fn front_proxy(allowed: &str) -> FrontProxy {
        let ca = crate::certs::new_ca().unwrap();
        let config = RequestHeaderConfig::from_config_map(&config_map(&[
            ("requestheader-client-ca-file", &ca.cert_pem),
            ("requestheader-allowed-names", allowed),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
            ("requestheader-group-headers", r#"["X-Remote-Group"]"#),
            (
                "requestheader-extra-headers-prefix",
                r#"["X-Remote-Extra-"]"#,
            ),
        ]))
        .unwrap();
        let front_proxy = FrontProxy::new();
        front_proxy.update(config).unwrap();
        front_proxy
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        map
    }

    fn peer(name: Option<&str>) -> Peer {
        Peer {
            address: None,
            verified_common_name: name.map(str::to_string),
        }
    }

    #[test]
    fn the_user_comes_from_the_headers_of_an_allowed_front_proxy() {
        let fp = front_proxy(r#"["front-proxy-client"]"#);
        let h = headers(&[
            ("X-Remote-User", "alice"),
            ("X-Remote-Group", "dev"),
            ("X-Remote-Group", "system:authenticated"),
            ("X-Remote-Extra-Scopes", "a"),
            ("X-Remote-Extra-Scopes", "b"),
            ("X-Remote-Extra-Acme.com%2Fproject", "p"),
        ]);
        let user = fp
            .authenticate(&peer(Some("front-proxy-client")), &h)
            .unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.groups, ["dev", "system:authenticated"]);
        assert_eq!(user.extra["scopes"], ["a", "b"]);
        assert_eq!(user.extra["acme.com/project"], ["p"]);
    }

    #[test]
    fn headers_without_the_front_proxys_certificate_are_not_believed() {
        let fp = front_proxy(r#"["front-proxy-client"]"#);
        let h = headers(&[("X-Remote-User", "system:admin")]);
        let no_cert = fp.authenticate(&peer(None), &h).unwrap_err();
        assert!(no_cert.0.contains("no client certificate"), "{no_cert:?}");
        let other = fp.authenticate(&peer(Some("someone")), &h).unwrap_err();
        assert!(other.0.contains("allowed names"), "{other:?}");
        let nobody = fp
            .authenticate(&peer(Some("front-proxy-client")), &HeaderMap::new())
            .unwrap_err();
        assert!(nobody.0.contains("no user"), "{nobody:?}");
        // No allowed names configured: any certificate the CA signed.
        let any = front_proxy("");
        assert_eq!(
            any.authenticate(&peer(Some("someone")), &h).unwrap().name,
            "system:admin"
        );
        // Nothing known yet: nobody.
        assert!(
            FrontProxy::new()
                .authenticate(&peer(Some("x")), &h)
                .is_err()
        );
    }

    #[test]
    fn a_config_map_without_the_front_proxy_is_a_clear_error() {
        let error = RequestHeaderConfig::from_config_map(&config_map(&[("client-ca-file", "x")]))
            .unwrap_err();
        assert!(format!("{error:#}").contains("requestheader-client-ca-file"));
        let bad = RequestHeaderConfig::from_config_map(&config_map(&[
            ("requestheader-client-ca-file", "x"),
            ("requestheader-username-headers", "X-Remote-User"),
        ]))
        .unwrap_err();
        assert!(format!("{bad:#}").contains("not a JSON list"), "{bad:#}");
        let config = RequestHeaderConfig::from_config_map(&config_map(&[
            ("requestheader-client-ca-file", "not pem"),
            ("requestheader-username-headers", r#"["X-Remote-User"]"#),
        ]))
        .unwrap();
        assert!(FrontProxy::new().update(config).is_err());
    }
}
