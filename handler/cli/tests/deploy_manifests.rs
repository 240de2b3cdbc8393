//! `images/deploy/handler-*.yaml` against the binary and a real API server:
//! the DaemonSet passes only flags the handler knows and mounts what its defaults expect,
//! and the ClusterRole is enough for every call the handler makes (VMI watch and status,
//! node heartbeat and labels, events, /version) and no more than that.
//!
//! The RBAC test needs the control plane binaries (`integration/controlplane/build.sh`).

use std::collections::BTreeMap;
use std::sync::Arc;

use handler::node::heartbeat::{Heartbeat, HeartbeatConfig};
use handler::node::labeller::NodeLabeller;
use handler::vmis::VmiStore;
use handler::vmis::kube::KubeVmis;
use integration::controlplane;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use proto::kubevirt::VirtualMachineInstance;
use serde::Deserialize;

const DEPLOY: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/deploy");

fn documents(file: &str) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(format!("{DEPLOY}/{file}")).expect("manifest");
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| serde_yaml::Value::deserialize(d).expect("YAML document"))
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<T: serde::de::DeserializeOwned>(docs: &[serde_yaml::Value], kind: &str) -> Vec<T> {
    docs.iter()
        .filter(|d| d.get("kind").and_then(|k| k.as_str()) == Some(kind))
        .map(|d| serde_yaml::from_value(d.clone()).expect("typed object"))
        .collect()
}

#[test]
fn the_daemonset_runs_the_handler_as_kubevirts_does() {
    let docs = documents("handler-daemonset.yaml");
    let ds: DaemonSet = of_kind(&docs, "DaemonSet").pop().expect("a DaemonSet");
    assert_eq!(ds.metadata.namespace.as_deref(), Some("kubevirt"));
    let pod = ds.spec.template.spec.expect("pod spec");
    assert_eq!(pod.host_pid, Some(true));
    assert_eq!(
        pod.service_account_name.as_deref(),
        Some("kubevirt-handler")
    );
    let c = &pod.containers[0];
    assert_eq!(
        c.image.as_deref(),
        Some("localhost/kubevirt-rs/virt-handler:devel")
    );
    assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
    assert_eq!(
        c.security_context.as_ref().and_then(|s| s.privileged),
        Some(true)
    );
    let node_name = c
        .env
        .as_ref()
        .and_then(|e| e.iter().find(|v| v.name == "NODE_NAME"))
        .and_then(|v| v.value_from.as_ref())
        .and_then(|f| f.field_ref.as_ref())
        .map(|f| f.field_path.clone());
    assert_eq!(node_name.as_deref(), Some("spec.nodeName"));
    for probe in [&c.liveness_probe, &c.readiness_probe] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("HTTP probe");
        assert_eq!(get.path.as_deref(), Some("/healthz"));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(8443)
        );
    }

    // Every flag the DaemonSet passes exists, and each mount is where a default looks.
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_virt-handler"))
        .arg("--help")
        .output()
        .expect("virt-handler --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for arg in c.args.as_ref().expect("args") {
        if let Some(flag) = arg.strip_prefix("--") {
            assert!(
                help.contains(&format!("--{flag} ")),
                "unknown flag --{flag}"
            );
        }
    }
    // Each volume by what it shows: a host path, or `secret:<name>` / `configmap:<name>` (the
    // endpoint for virt-api's certificate and CA, optional: written by virt-api).
    let volumes: BTreeMap<String, String> = pod
        .volumes
        .as_ref()
        .expect("volumes")
        .iter()
        .map(|v| {
            let source = if let Some(host) = &v.host_path {
                host.path.clone()
            } else if let Some(secret) = &v.secret {
                assert_eq!(secret.optional, Some(true), "{}", v.name);
                format!("secret:{}", secret.secret_name.clone().unwrap_or_default())
            } else if let Some(config_map) = &v.config_map {
                assert_eq!(config_map.optional, Some(true), "{}", v.name);
                format!("configmap:{}", config_map.name)
            } else {
                panic!(
                    "volume {} is neither a host path, a Secret nor a ConfigMap",
                    v.name
                )
            };
            (v.name.clone(), source)
        })
        .collect();
    let mounts: BTreeMap<String, String> = c
        .volume_mounts
        .as_ref()
        .expect("mounts")
        .iter()
        .map(|m| (m.mount_path.clone(), volumes[&m.name].clone()))
        .collect();
    for (container, host, flag_default) in [
        (
            "/var/run/kubevirt",
            "/var/run/kubevirt",
            "[default: /var/run/kubevirt]",
        ),
        (
            "/var/run/kubevirt-private",
            "/var/run/kubevirt-private",
            "[default: /var/run/kubevirt-private]",
        ),
        ("/pods", "/var/lib/kubelet/pods", "[default: /pods]"),
        (
            "/var/lib/kubelet/device-plugins",
            "/var/lib/kubelet/device-plugins",
            "[default: /var/lib/kubelet/device-plugins]",
        ),
        (
            "/etc/virt-handler/servercertificates",
            "secret:kubevirt-virt-handler-server-certs",
            "[default: /etc/virt-handler/servercertificates]",
        ),
        (
            "/etc/virt-handler/ca",
            "configmap:kubevirt-ca",
            "[default: /etc/virt-handler/ca/ca-bundle]",
        ),
        (
            "/etc/virt-handler/clientcertificates",
            "secret:kubevirt-virt-handler-certs",
            "[default: /etc/virt-handler/clientcertificates]",
        ),
    ] {
        assert_eq!(
            mounts.get(container).map(String::as_str),
            Some(host),
            "{container}"
        );
        assert!(
            help.contains(flag_default),
            "a flag defaults to {container}"
        );
    }
    assert!(
        help.contains("[default: /proc/1/root]"),
        "host root through hostPID"
    );
    // The DaemonSet does not rely on /proc/1/root (denied on some hosts even to privileged
    // root): the host's /dev is mounted at /host/dev and the host root is /host.
    let args = c.args.as_ref().expect("args");
    let host_root = args
        .iter()
        .position(|a| a == "--host-root")
        .and_then(|i| args.get(i + 1));
    assert_eq!(host_root.map(String::as_str), Some("/host"), "{args:?}");
    assert_eq!(mounts.get("/host/dev").map(String::as_str), Some("/dev"));
}

/// A client that authenticates as the handler's ServiceAccount.
async fn as_handler(admin: kube::Client, cp: &controlplane::ControlPlane) -> kube::Client {
    let docs = documents("handler-rbac.yaml");
    let ns: Namespace = of_kind(&docs, "Namespace").pop().expect("namespace");
    let sa: ServiceAccount = of_kind(&docs, "ServiceAccount").pop().expect("SA");
    let role: ClusterRole = of_kind(&docs, "ClusterRole").pop().expect("role");
    let binding: ClusterRoleBinding = of_kind(&docs, "ClusterRoleBinding").pop().expect("binding");
    let pp = PostParams::default();
    let _ = Api::<Namespace>::all(admin.clone()).create(&pp, &ns).await;
    let namespace = sa.metadata.namespace.clone().expect("SA namespace");
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), &namespace);
    let _ = accounts.create(&pp, &sa).await;
    let _ = Api::<ClusterRole>::all(admin.clone())
        .create(&pp, &role)
        .await;
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&pp, &binding)
        .await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request(sa.metadata.name.as_deref().expect("name"), &pp, &request)
        .await
        .expect("token for the handler's ServiceAccount")
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let mut config = cp.config().clone();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    kube::Client::try_from(config).expect("client as the handler")
}

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) {
    match result {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{what}: {e:?}"),
        other => panic!("{what} should be forbidden: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_role_covers_every_call_of_the_handler_and_no_more() {
    let cp = match controlplane::shared().await {
        Ok(cp) => cp,
        Err(e) => panic!(
            "cannot run the test control plane: {e:#}\nbuild it with: {}",
            controlplane::build_script().display()
        ),
    };
    let admin = cp.client().expect("admin client");
    let handler = as_handler(admin.clone(), cp).await;
    let node = format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let pp = PostParams::default();
    Api::<Node>::all(admin.clone())
        .create(
            &pp,
            &Node {
                metadata: ObjectMeta {
                    name: Some(node.clone()),
                    labels: Some([("kubernetes.io/hostname".to_string(), node.clone())].into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("node");

    // Node side: heartbeat (strategic merge), labels (get + JSON patch).
    let nodes: Api<Node> = Api::all(handler.clone());
    let beat = Heartbeat::new(
        nodes.clone(),
        &node,
        Arc::new(|| true),
        HeartbeatConfig::default(),
    );
    beat.beat().await.expect("heartbeat as the handler");
    NodeLabeller::new(nodes.clone(), &node)
        .label_once()
        .await
        .expect("labels as the handler");
    handler
        .apiserver_version()
        .await
        .expect("/version for /healthz");

    // VMIs: list and watch this node's, write status (subresource, then the VMI itself).
    let ns = cp.create_namespace("rbac").await.expect("namespace");
    let vmi = proto::kubevirt::parse_vmi(&format!(
        r#"{{"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {{"name": "v", "labels": {{"kubevirt.io/nodeName": "{node}"}}}},
            "spec": {{"domain": {{"devices": {{}}}}}}}}"#
    ))
    .expect("VMI");
    Api::<VirtualMachineInstance>::namespaced(admin.clone(), &ns)
        .create(&pp, &vmi)
        .await
        .expect("create VMI");
    let (vmis, _changes, watch) = KubeVmis::start(handler.clone(), &node);
    tokio::time::timeout(std::time::Duration::from_secs(30), vmis.wait_until_ready())
        .await
        .expect("the handler's VMI watch syncs");
    assert!(vmis.get(&format!("{ns}/v")).is_some());
    let mine: Api<VirtualMachineInstance> = Api::namespaced(handler.clone(), &ns);
    proto::kubevirt::status_write::patch_vmi_status(
        &mine,
        "v",
        &serde_json::json!({"status": {"phase": "Scheduled"}}),
    )
    .await
    .expect("status write as the handler");
    watch.abort();

    // Events through kube's recorder (events.k8s.io).
    let recorder = Recorder::new(
        handler.clone(),
        Reporter {
            controller: "virt-handler".into(),
            instance: Some(node.clone()),
        },
    );
    let reference = kube::Resource::object_ref(
        &Api::<VirtualMachineInstance>::namespaced(admin.clone(), &ns)
            .get("v")
            .await
            .expect("VMI"),
        &(),
    );
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "Started".into(),
                note: Some("VirtualMachineInstance started.".into()),
                action: "Started".into(),
                secondary: None,
            },
            &reference,
        )
        .await
        .expect("event as the handler");

    // And nothing more.
    forbidden(nodes.list(&ListParams::default()).await, "listing nodes");
    forbidden(
        nodes.delete(&node, &DeleteParams::default()).await,
        "deleting a node",
    );
    forbidden(
        Api::<Secret>::namespaced(handler.clone(), "kubevirt")
            .list(&ListParams::default())
            .await,
        "reading secrets",
    );
    forbidden(
        mine.delete("v", &DeleteParams::default()).await,
        "deleting a VMI",
    );
    forbidden(mine.create(&pp, &vmi).await, "creating a VMI");

    let _ = Api::<Node>::all(admin.clone())
        .delete(&node, &DeleteParams::default())
        .await;
    let _ = Api::<Namespace>::all(admin)
        .delete(&ns, &DeleteParams::default())
        .await;
}
