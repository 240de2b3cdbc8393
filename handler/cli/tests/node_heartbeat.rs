//! The heartbeat and the node labeller against a real API server
//! (`integration::controlplane`), on a Node object each test creates, and the node side
//! as a whole (device plugins on a fake kubelet + heartbeat): unschedulable at start,
//! schedulable once the plugins are registered, unschedulable again on stop; and the
//! `virt-handler` binary itself: `/healthz`, and SIGTERM (unschedulable, plugins
//! deregistered, exit 0).
//!
//! Needs the control plane binaries (`integration/controlplane/build.sh`) and root (the
//! fake device nodes); fails (never skips) without them.

#[path = "../../tests/fake_kubelet/mod.rs"]
mod fake_kubelet;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use fake_kubelet::{FakeNode, Kubelet, Observer, require_root};
use handler::deviceplugins::permanent_devices;
use handler::node::NodeServices;
use handler::node::heartbeat::{self, Heartbeat, HeartbeatConfig};
use handler::node::labeller::{LabelError, Labelled, NodeLabeller};
use integration::controlplane;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(30);

async fn nodes() -> Api<Node> {
    let cp = match controlplane::shared().await {
        Ok(cp) => cp,
        Err(e) => panic!(
            "cannot run the test control plane: {e:#}\nbuild it with: {}",
            controlplane::build_script().display()
        ),
    };
    Api::all(cp.client().expect("client"))
}

/// A Node object with a unique name and `labels`, deleted on drop.
struct TestNode {
    api: Api<Node>,
    name: String,
}

impl TestNode {
    async fn create(api: &Api<Node>, labels: &[(&str, &str)]) -> TestNode {
        let name = format!("node-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let mut all: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.insert("kubernetes.io/hostname".into(), name.clone());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(all),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &node)
            .await
            .expect("create Node");
        TestNode {
            api: api.clone(),
            name,
        }
    }

    async fn get(&self) -> Node {
        self.api.get(&self.name).await.expect("get Node")
    }

    async fn label(&self, key: &str) -> Option<String> {
        self.get()
            .await
            .metadata
            .labels
            .and_then(|l| l.get(key).cloned())
    }

    async fn heartbeat(&self) -> Option<String> {
        self.get()
            .await
            .metadata
            .annotations
            .and_then(|a| a.get("kubevirt.io/heartbeat").cloned())
    }

    async fn wait_label(&self, key: &str, value: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            if self.label(key).await.as_deref() == Some(value) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{}: {key} not {value:?} within {WAIT:?} (now {:?})",
                self.name,
                self.label(key).await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestNode {
    fn drop(&mut self) {
        let api = self.api.clone();
        let name = self.name.clone();
        // Best effort: the control plane is shared by the tests of this binary.
        tokio::spawn(async move {
            let _ = api.delete(&name, &DeleteParams::default()).await;
        });
    }
}

fn fast() -> HeartbeatConfig {
    HeartbeatConfig {
        interval: Duration::from_millis(700),
        jitter: 0.2,
        plugin_poll: Duration::from_millis(100),
        plugin_wait: Duration::from_millis(500),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_follows_the_device_plugins_refreshes_and_ends_unschedulable() {
    let api = nodes().await;
    let node = TestNode::create(&api, &[("kubevirt.io/schedulable", "true")]).await;

    // Start-up: unschedulable before anything else.
    heartbeat::mark_unschedulable(&api, &node.name).await;
    assert_eq!(
        node.label("kubevirt.io/schedulable").await.as_deref(),
        Some("false")
    );

    let ready = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ready);
    let beat = Heartbeat::new(
        api.clone(),
        &node.name,
        Arc::new(move || flag.load(Ordering::SeqCst)),
        fast(),
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(beat.run(stopped));

    // Plugins not registered: false, with the heartbeat and the cpumanager labels.
    let deadline = tokio::time::Instant::now() + WAIT;
    while node.heartbeat().await.is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no heartbeat written"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        node.label("kubevirt.io/schedulable").await.as_deref(),
        Some("false")
    );
    assert_eq!(
        node.label("kubevirt.io/cpumanager").await.as_deref(),
        Some("false")
    );
    assert_eq!(node.label("cpumanager").await.as_deref(), Some("false"));

    // Registered: true. The annotation is an RFC 3339 time of now, and it moves on.
    ready.store(true, Ordering::SeqCst);
    node.wait_label("kubevirt.io/schedulable", "true").await;
    let first = node.heartbeat().await.expect("heartbeat");
    assert!(first.ends_with('Z') && !first.contains('.'), "{first}");
    let at: Timestamp = first.parse().expect("RFC 3339");
    let skew = Timestamp::now().as_second() - at.as_second();
    assert!(
        (-5..=60).contains(&skew),
        "heartbeat {first} is {skew} s off"
    );
    let deadline = tokio::time::Instant::now() + WAIT;
    while node.heartbeat().await.as_deref() == Some(first.as_str()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "heartbeat not refreshed"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A plugin drops out (the kubelet restarted): false at the next beat, true again after.
    ready.store(false, Ordering::SeqCst);
    node.wait_label("kubevirt.io/schedulable", "false").await;
    ready.store(true, Ordering::SeqCst);
    node.wait_label("kubevirt.io/schedulable", "true").await;

    // Stop: unschedulable, though the plugins are still fine.
    stop.send(true).expect("stop");
    tokio::time::timeout(WAIT, task)
        .await
        .expect("heartbeat stops")
        .expect("task");
    assert_eq!(
        node.label("kubevirt.io/schedulable").await.as_deref(),
        Some("false")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_node_is_an_error_not_a_crash() {
    let api = nodes().await;
    let name = format!("absent-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let beat = Heartbeat::new(api.clone(), &name, Arc::new(|| true), fast());
    match beat.beat().await {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 404),
        other => panic!("expected 404, got {other:?}"),
    }
    beat.label_unschedulable().await;
    heartbeat::mark_unschedulable(&api, &name).await;
    let labeller = NodeLabeller::new(api, &name);
    assert!(matches!(
        labeller.label_once().await,
        Err(LabelError::NotFound(n)) if n == name
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labeller_writes_machine_types_removes_stale_labeller_labels_and_detects_conflicts() {
    let api = nodes().await;
    let node = TestNode::create(
        &api,
        &[
            ("cpu-model.node.kubevirt.io/Haswell", "true"),
            ("machine-type.node.kubevirt.io/pc-q35-rhel9.6.0", "true"),
            ("kubevirt.io/realtime", "true"),
            ("cpu-vendor.node.kubevirt.io/Intel", "true"),
            ("team", "blue"),
        ],
    )
    .await;
    let labeller = NodeLabeller::new(api.clone(), &node.name);

    // A write between our read and our patch: the test operation fails the patch.
    let stale = node.get().await;
    api.patch(
        &node.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "red"}}})),
    )
    .await
    .expect("concurrent write");
    match labeller.label(&stale).await {
        Err(LabelError::Conflict(_)) => {}
        other => panic!("expected a conflict, got {other:?}"),
    }
    assert_eq!(
        node.label("cpu-model.node.kubevirt.io/Haswell")
            .await
            .as_deref(),
        Some("true"),
        "nothing written by the failed patch"
    );

    assert_eq!(
        labeller.label_once().await.expect("label"),
        Labelled::Patched
    );
    let labels = node.get().await.metadata.labels.expect("labels");
    assert_eq!(
        labels
            .get("machine-type.node.kubevirt.io/q35")
            .map(String::as_str),
        Some("true")
    );
    for gone in [
        "cpu-model.node.kubevirt.io/Haswell",
        "machine-type.node.kubevirt.io/pc-q35-rhel9.6.0",
        "kubevirt.io/realtime",
    ] {
        assert!(!labels.contains_key(gone), "{gone} removed");
    }
    assert_eq!(labels.get("team").map(String::as_str), Some("red"));
    assert_eq!(
        labels
            .get("cpu-vendor.node.kubevirt.io/Intel")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(labels.get("kubernetes.io/hostname"), Some(&node.name));
    assert_eq!(
        labeller.label_once().await.expect("label"),
        Labelled::Unchanged
    );

    // An opted-out node is left alone.
    api.patch(
        &node.name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {
            "annotations": {"node-labeller.kubevirt.io/skip-node": ""},
            "labels": {"machine-type.node.kubevirt.io/q35": null, "cpu-model.node.kubevirt.io/X": "true"},
        }})),
    )
    .await
    .expect("opt out");
    assert_eq!(
        labeller.label_once().await.expect("label"),
        Labelled::Skipped
    );
    assert_eq!(node.label("machine-type.node.kubevirt.io/q35").await, None);
    assert_eq!(
        node.label("cpu-model.node.kubevirt.io/X").await.as_deref(),
        Some("true")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_side_is_schedulable_once_plugins_register_and_unschedulable_after_stop() {
    require_root();
    let api = nodes().await;
    let node = TestNode::create(&api, &[("kubevirt.io/schedulable", "true")]).await;
    let host = FakeNode::new();
    let (kubelet, seen) = Kubelet::start(&host.plugin_dir());
    let mut seen = Observer::new(seen);

    // KubeVirt's timing: start-up beat, up to 10 s for the plugins, then every minute.
    let services = NodeServices::start(
        api.clone(),
        &node.name,
        host.config(),
        permanent_devices(),
        HeartbeatConfig::default(),
        true,
    )
    .await;
    seen.registrations().await;
    node.wait_label("kubevirt.io/schedulable", "true").await;
    node.wait_label("machine-type.node.kubevirt.io/q35", "true")
        .await;
    assert!(node.heartbeat().await.is_some());

    services.stop().await;
    assert_eq!(
        node.label("kubevirt.io/schedulable").await.as_deref(),
        Some("false")
    );
    seen.wait("the plugins' streams end", |o| o.ended.len() >= 3)
        .await;
    for device in ["kvm", "tun", "vhost-net"] {
        assert!(!host.socket(device).exists(), "{device} socket removed");
    }
    kubelet.stop().await;
}

/// `GET path` on 127.0.0.1:`port` over plain HTTP/1.1: (status line, body).
async fn http_get(port: u16, path: &str) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream
        .write_all(
            format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .expect("request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("reply");
    let status = reply.lines().next().unwrap_or_default().to_string();
    let body = reply
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_serves_healthz_and_stops_gracefully_on_sigterm() {
    require_root();
    let api = nodes().await;
    let cp = controlplane::shared().await.expect("control plane");
    let node = TestNode::create(&api, &[("kubevirt.io/schedulable", "true")]).await;
    let host = FakeNode::new();
    let (kubelet, seen) = Kubelet::start(&host.plugin_dir());
    let mut seen = Observer::new(seen);
    let state = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(state.path().join("pods")).expect("mkdir");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = state.path().join("handler.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_virt-handler"))
        .env("KUBECONFIG", cp.kubeconfig_path())
        .env("RUST_LOG", "info")
        .args(["--hostname-override", &node.name])
        .arg("--pods-dir")
        .arg(state.path().join("pods"))
        .arg("--kubevirt-share-dir")
        .arg(state.path().join("share"))
        .arg("--kubevirt-private-dir")
        .arg(state.path().join("private"))
        .arg("--device-plugin-dir")
        .arg(host.plugin_dir())
        .arg("--host-root")
        .arg(host.root())
        .args(["--metrics-listen", &format!("127.0.0.1:{port}")])
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start virt-handler");

    seen.registrations().await;
    node.wait_label("kubevirt.io/schedulable", "true").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("virt-handler running")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "handler not running: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, body) = http_get(port, "/healthz").await;
    assert!(status.contains(" 200 "), "{status}: {body}");
    let body: serde_json::Value = serde_json::from_str(&body).expect("JSON body");
    assert_eq!(body["apiserver"]["connectivity"], "ok");
    assert!(
        body["apiserver"]["version"]["gitVersion"].is_string(),
        "{body}"
    );

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("a pid fits pid_t")),
        nix::sys::signal::Signal::SIGTERM,
    )
    .expect("SIGTERM");
    let deadline = std::time::Instant::now() + WAIT;
    let exit = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "handler still running after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        exit.success(),
        "exit {exit}: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert_eq!(
        node.label("kubevirt.io/schedulable").await.as_deref(),
        Some("false")
    );
    seen.wait("the plugins' streams end", |o| o.ended.len() >= 3)
        .await;
    assert_eq!(seen.emptied.len(), 3, "each plugin sent an empty list");
    for device in ["kvm", "tun", "vhost-net"] {
        assert!(!host.socket(device).exists(), "{device} socket removed");
    }
    kubelet.stop().await;
}
