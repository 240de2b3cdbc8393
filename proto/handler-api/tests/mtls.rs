//! The handler's endpoint and virt-api's client over real TLS on loopback: only the handler
//! client certificate of the install's CA gets in, and virt-api accepts only a server
//! certificate of that CA for `virt-handler`.

use axum::routing::put;
use handler_api::{Action, TlsListener};
use std::sync::Arc;
use std::time::Duration;

use handler_api::test_certs::{Pair, ca, leaf};

fn server_leaf(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, names: &[&str]) -> Pair {
    leaf(
        issuer,
        handler_api::SERVER_COMMON_NAME,
        names,
        rcgen::ExtendedKeyUsagePurpose::ServerAuth,
    )
}

fn client_leaf(issuer: &rcgen::Issuer<'static, rcgen::KeyPair>, common_name: &str) -> Pair {
    leaf(
        issuer,
        common_name,
        &[],
        rcgen::ExtendedKeyUsagePurpose::ClientAuth,
    )
}

/// A handler-like server answering 202 to a pause; its address.
async fn serve(server: &Pair, ca: &Pair) -> std::net::SocketAddr {
    let config = handler_api::server_config(&server.cert, &server.key, &ca.cert).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let listener = TlsListener::new(listener, config).unwrap();
    let address = axum::serve::Listener::local_addr(&listener).unwrap();
    let router = axum::Router::new().route(
        "/v1/namespaces/{namespace}/virtualmachineinstances/{name}/pause",
        put(|| async { axum::http::StatusCode::ACCEPTED }),
    );
    tokio::spawn(async move { axum::serve(listener, router).await });
    address
}

async fn pause(
    client: &Pair,
    ca: &Pair,
    address: std::net::SocketAddr,
) -> anyhow::Result<axum::http::StatusCode> {
    let config = handler_api::client_config(&client.cert, &client.key, &ca.cert)?;
    let (status, _) = handler_api::request(
        Arc::new(config),
        address,
        axum::http::Method::PUT,
        &handler_api::vmi_path("ns", "vm1", Action::Pause),
        Vec::new(),
        Duration::from_secs(5),
    )
    .await?;
    Ok(status)
}

#[tokio::test]
async fn only_the_handler_client_certificate_of_the_ca_gets_in() {
    let (ca, issuer) = ca();
    let address = serve(&server_leaf(&issuer, &[handler_api::SERVER_NAME]), &ca).await;
    let client = client_leaf(&issuer, handler_api::CLIENT_COMMON_NAME);
    assert_eq!(pause(&client, &ca, address).await.unwrap(), 202);

    // The same CA, another name (say, virt-api's serving certificate used as a client).
    let other_name = client_leaf(&issuer, "virt-api.kubevirt.pod.cluster.local");
    assert!(pause(&other_name, &ca, address).await.is_err());
    // The right name from another CA (the client trusts the server's CA, so only the
    // server's check of the client certificate can fail).
    let (_, stranger_issuer) = self::ca();
    let stranger = client_leaf(&stranger_issuer, handler_api::CLIENT_COMMON_NAME);
    assert!(pause(&stranger, &ca, address).await.is_err());
}

#[tokio::test]
async fn virt_api_accepts_only_a_handler_server_certificate_of_the_ca() {
    let (ca, issuer) = ca();
    let client = client_leaf(&issuer, handler_api::CLIENT_COMMON_NAME);
    // Without the name virt-api asks for.
    let unnamed = serve(&server_leaf(&issuer, &["somewhere-else"]), &ca).await;
    assert!(pause(&client, &ca, unnamed).await.is_err());
    // Another CA's server: the client refuses it (the server would take our client, since
    // it trusts our CA).
    let (_, stranger_issuer) = self::ca();
    let impostor = serve(
        &server_leaf(&stranger_issuer, &[handler_api::SERVER_NAME]),
        &ca,
    )
    .await;
    assert!(pause(&client, &ca, impostor).await.is_err());
    // The genuine one.
    let genuine = serve(&server_leaf(&issuer, &[handler_api::SERVER_NAME]), &ca).await;
    assert_eq!(pause(&client, &ca, genuine).await.unwrap(), 202);
}

#[test]
fn paths_and_actions() {
    assert_eq!(
        handler_api::vmi_path("ns", "vm1", Action::SoftReboot),
        "/v1/namespaces/ns/virtualmachineinstances/vm1/softreboot"
    );
    for action in Action::ALL {
        assert_eq!(Action::from_segment(action.as_str()), Some(action));
    }
    assert_eq!(Action::from_segment("console"), None);
}
