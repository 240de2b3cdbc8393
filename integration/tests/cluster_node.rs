//! The single-node cluster of `scripts/cluster.sh` works as a Kubernetes node: it is Ready with
//! our containerd, runs pods from locally imported images (logs readable with kubectl), mounts
//! image volumes (KubeVirt v1.9.0's container-disk layout), and gives pods addresses from which
//! they reach each other, the node, and Services (kube-proxy). Needs root; fails (never skips)
//! when the cluster cannot be brought up.

use std::time::Duration;

use integration::cluster::{self, Cluster, TestImage};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;

/// Generous: pods start in seconds, but the CI machines are small and shared.
const POD_TIMEOUT: Duration = Duration::from_secs(180);

/// busybox (static) only: pods run `/bin/busybox <applet>`.
const BOX_IMAGE: &str = "localhost/kubevirt-rs-test/box:1";
/// Files only, for image volumes.
const DISK_IMAGE: &str = "localhost/kubevirt-rs-test/disk:1";
const DISK_FILE: &str = "disk/hello.txt";
const DISK_CONTENTS: &str = "a file from the container-disk image\n";

/// The cluster, with the test images imported (once per test binary).
async fn cluster() -> &'static Cluster {
    static IMAGES: OnceCell<()> = OnceCell::const_new();
    let cluster = match cluster::shared().await {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot bring up the test cluster: {e:#}"),
    };
    IMAGES
        .get_or_init(|| async {
            let images = [
                TestImage::new(BOX_IMAGE)
                    .with_busybox()
                    .expect("the box test image")
                    .entrypoint(&["/bin/busybox", "sh"]),
                TestImage::new(DISK_IMAGE).file(DISK_FILE, DISK_CONTENTS, 0o644),
            ];
            for image in &images {
                cluster
                    .import_test_image(image)
                    .unwrap_or_else(|e| panic!("importing {}: {e:#}", image.name()));
            }
        })
        .await;
    cluster
}

/// A pod running `script` in the box image (`restartPolicy: Never`), with extra spec fields.
fn box_pod(name: &str, script: &str, extra_spec: serde_json::Value) -> Pod {
    cluster::box_pod::box_pod(BOX_IMAGE, name, script, extra_spec)
}

async fn create_pod(cluster: &Cluster, namespace: &str, pod: &Pod) {
    cluster
        .create_pod(namespace, pod)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

fn logs(cluster: &Cluster, namespace: &str, pod: &str) -> String {
    cluster
        .pod_logs(namespace, pod)
        .unwrap_or_else(|e| panic!("kubectl logs {namespace}/{pod}: {e:#}"))
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a running pod has an IP")
}

#[tokio::test]
async fn node_is_ready_on_containerd_with_the_pod_network_address() {
    let cluster = cluster().await;
    let node: Node = Api::all(cluster.client().unwrap())
        .get(cluster::NODE_NAME)
        .await
        .expect("the node object");
    let status = node.status.expect("node status");
    let ready = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .expect("a Ready condition");
    assert_eq!(ready.status, "True", "{ready:?}");
    let info = status.node_info.expect("node info");
    assert_eq!(info.kubelet_version, "v1.36.3");
    assert_eq!(info.container_runtime_version, "containerd://2.3.7");
    let addresses: Vec<(String, String)> = status
        .addresses
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert!(
        addresses.contains(&("InternalIP".to_owned(), cluster::NODE_IP.to_owned())),
        "{addresses:?}"
    );
}

#[tokio::test]
async fn pod_from_an_imported_image_runs_to_completion_and_kubectl_reads_its_logs() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("completion").await.unwrap();
    let token = format!("{:016x}", rand::random::<u64>());
    let pod = box_pod(
        "echo",
        &format!(
            "echo token={token}; echo namespace=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
        ),
        json!({}),
    );
    create_pod(cluster, &ns, &pod).await;
    cluster
        .wait_for_pod_completion(&ns, "echo", POD_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        logs(cluster, &ns, "echo"),
        format!("token={token}\nnamespace={ns}\n"),
        "the pod's output, through kubelet and the apiserver"
    );
}

#[tokio::test]
async fn image_volume_shows_the_image_files_read_only() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("image-volume").await.unwrap();
    // Where KubeVirt v1.9.0 puts the first container disk (pkg/container-disk).
    let mount = "/var/run/kubevirt-image-volume/disk_0";
    let script = format!(
        "cat {mount}/{DISK_FILE}; \
         if touch {mount}/new 2>/dev/null; then echo writable; else echo read-only; fi"
    );
    let pod = box_pod(
        "reader",
        &script,
        json!({
            "containers": [{
                "name": "main",
                "image": BOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["/bin/busybox", "sh", "-c", script],
                "volumeMounts": [{"name": "disk-0", "mountPath": mount}],
            }],
            "volumes": [{
                "name": "disk-0",
                "image": {"reference": DISK_IMAGE, "pullPolicy": "IfNotPresent"},
            }],
        }),
    );
    create_pod(cluster, &ns, &pod).await;
    cluster
        .wait_for_pod_completion(&ns, "reader", POD_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(
        logs(cluster, &ns, "reader"),
        format!("{DISK_CONTENTS}read-only\n")
    );
}

#[tokio::test]
async fn pods_get_distinct_addresses_and_reach_each_other_the_node_and_services() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("network").await.unwrap();
    let client = cluster.client().unwrap();

    let mut server = box_pod(
        "server",
        "mkdir /www && echo served-by-$(hostname) >/www/index.html && \
         exec /bin/busybox httpd -f -p 8080 -h /www",
        json!({"restartPolicy": "Always"}),
    );
    server.metadata.labels = Some([("app".to_owned(), "server".to_owned())].into());
    create_pod(cluster, &ns, &server).await;
    let server = cluster
        .wait_for_pod_running(&ns, "server", POD_TIMEOUT)
        .await
        .unwrap();
    let server_ip = pod_ip(&server);

    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    let service = Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &service)
        .await
        .expect("creating the service");
    let service_ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a cluster IP");

    // Direct to the other pod, to the node (the apiserver on the bridge address), to the
    // `kubernetes` Service from the environment in-cluster clients use, and to our Service
    // (kube-proxy must have its rules in place; retried while they are being written).
    // `timeout` rather than wget's -T, which crashes Debian's static busybox 1.35.
    let script = format!(
        "set -e; \
         /bin/busybox timeout 10 /bin/busybox wget -q -O- http://{server_ip}:8080/index.html; \
         /bin/busybox nc -w 10 {node_ip} 6443 </dev/null && echo node-reachable; \
         /bin/busybox nc -w 10 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null \
           && echo kubernetes-service-reachable; \
         for i in $(seq 30); do \
           /bin/busybox timeout 5 /bin/busybox wget -q -O- http://{service_ip}/index.html \
             && exit 0; sleep 1; \
         done; exit 1",
        node_ip = cluster::NODE_IP,
    );
    create_pod(cluster, &ns, &box_pod("client", &script, json!({}))).await;
    let client_pod = cluster
        .wait_for_pod_completion(&ns, "client", POD_TIMEOUT)
        .await
        .unwrap();
    let client_ip = pod_ip(&client_pod);
    assert_ne!(client_ip, server_ip, "two pods, two addresses");
    for ip in [&client_ip, &server_ip] {
        assert!(
            ip.starts_with("10.217."),
            "{ip} is in {}",
            cluster::POD_CIDR
        );
    }
    assert_eq!(
        logs(cluster, &ns, "client"),
        "served-by-server\nnode-reachable\nkubernetes-service-reachable\nserved-by-server\n"
    );
}
