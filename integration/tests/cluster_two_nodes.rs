//! The two-node cluster of `scripts/cluster.sh up --nodes 2` (for live migration): node 2 is
//! really elsewhere. Both nodes are Ready, schedulable and labelled alike; pods pinned to each
//! node get addresses in their node's pod network and reach each other, both nodes and Services
//! with endpoints on the other node; the apiserver reaches node 2's kubelet (logs, exec); a pod
//! on node 2 sees node 2's `/var/lib/kubelet` and `/var/run/kubevirt-private` through hostPath
//! volumes, not node 1's, and runs in node 2's cgroup subtree. Needs root; brings node 2 up
//! beside a running single-node cluster (or the whole cluster); fails (never skips) when it
//! cannot.

use std::path::Path;
use std::time::Duration;

use integration::cluster::{self, Cluster, TestImage};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{Api, PostParams};
use serde_json::json;
use tokio::sync::OnceCell;

/// Generous: pods start in seconds, but the CI machines are small and shared.
const POD_TIMEOUT: Duration = Duration::from_secs(180);

/// busybox (static) only: pods run `/bin/busybox <applet>`.
const BOX_IMAGE: &str = "localhost/kubevirt-rs-test/two-nodes-box:1";

/// The two-node cluster, with the box image imported into both nodes (once per test binary).
async fn cluster() -> &'static Cluster {
    static IMAGES: OnceCell<()> = OnceCell::const_new();
    let cluster = match cluster::shared_with_nodes(2).await {
        Ok(cluster) => cluster,
        Err(e) => panic!("cannot bring up the two-node test cluster: {e:#}"),
    };
    IMAGES
        .get_or_init(|| async {
            let image = TestImage::new(BOX_IMAGE)
                .with_busybox()
                .expect("the box test image")
                .entrypoint(&["/bin/busybox", "sh"]);
            cluster
                .import_test_image(&image)
                .unwrap_or_else(|e| panic!("importing {}: {e:#}", image.name()));
        })
        .await;
    cluster
}

/// A pod running `script` in the box image on `node` (a `kubernetes.io/hostname` node
/// selector), `restartPolicy: Never`, with extra spec fields.
fn pinned_pod(name: &str, node: &str, script: &str, extra_spec: serde_json::Value) -> Pod {
    let mut pod = cluster::box_pod::box_pod(BOX_IMAGE, name, script, extra_spec);
    pod.spec
        .get_or_insert_default()
        .node_selector
        .get_or_insert_default()
        .insert("kubernetes.io/hostname".into(), node.into());
    pod
}

async fn create_pod(cluster: &Cluster, namespace: &str, pod: &Pod) {
    cluster
        .create_pod(namespace, pod)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"));
}

/// A Service `name` (port 80) in front of the pod labelled `app: <pod>` (port 8080).
async fn create_service(cluster: &Cluster, namespace: &str, name: &str, pod: &str) -> String {
    let service: Service = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": pod}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(cluster.client().unwrap(), namespace)
        .create(&PostParams::default(), &service)
        .await
        .unwrap_or_else(|e| panic!("creating service {name}: {e}"))
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("a cluster IP")
}

fn logs(cluster: &Cluster, namespace: &str, pod: &str) -> String {
    cluster
        .pod_logs(namespace, pod)
        .unwrap_or_else(|e| panic!("kubectl logs {namespace}/{pod}: {e:#}"))
}

/// `kubectl exec` of a busybox shell script (the apiserver through the pod's node's kubelet).
fn exec(cluster: &Cluster, namespace: &str, pod: &str, script: &str) -> String {
    cluster
        .kubectl_output(&[
            "exec",
            "-n",
            namespace,
            pod,
            "--",
            "/bin/busybox",
            "sh",
            "-c",
            script,
        ])
        .unwrap_or_else(|e| panic!("kubectl exec {namespace}/{pod}: {e:#}"))
}

fn pod_ip(pod: &Pod) -> String {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .expect("a running pod has an IP")
}

fn pod_node(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .expect("a scheduled pod has a node")
}

fn pod_uid(pod: &Pod) -> String {
    pod.metadata.uid.clone().expect("a created pod has a UID")
}

/// Whether the IPv4 address `ip` is in `cidr` (`a.b.c.d/n`).
fn in_cidr(ip: &str, cidr: &str) -> bool {
    let (network, bits) = cidr.split_once('/').expect("a CIDR");
    let bits: u32 = bits.parse().expect("a prefix length");
    let parse = |s: &str| u32::from(s.parse::<std::net::Ipv4Addr>().expect("an IPv4 address"));
    let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
    parse(ip) & mask == parse(network) & mask
}

#[tokio::test]
async fn both_nodes_are_ready_schedulable_and_labelled_alike() {
    let cluster = cluster().await;
    let nodes: Api<Node> = Api::all(cluster.client().unwrap());
    let mut labels = Vec::new();
    for (name, ip) in [
        (cluster::NODE_NAME, cluster::NODE_IP),
        (cluster::NODE2_NAME, cluster::NODE2_IP),
    ] {
        let node = nodes.get(name).await.expect("the node object");
        let spec = node.spec.clone().unwrap_or_default();
        assert_ne!(spec.unschedulable, Some(true), "{name} is schedulable");
        assert!(
            spec.taints.unwrap_or_default().is_empty(),
            "{name} has no taints"
        );
        let status = node.status.expect("node status");
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("a Ready condition");
        assert_eq!(ready.status, "True", "{name}: {ready:?}");
        let info = status.node_info.expect("node info");
        assert_eq!(info.kubelet_version, "v1.36.3", "{name}");
        assert_eq!(
            info.container_runtime_version, "containerd://2.3.7",
            "{name}"
        );
        let addresses: Vec<(String, String)> = status
            .addresses
            .unwrap_or_default()
            .into_iter()
            .map(|a| (a.type_, a.address))
            .collect();
        assert!(
            addresses.contains(&("InternalIP".to_owned(), ip.to_owned())),
            "{name}: {addresses:?}"
        );
        // The same labels, the hostname apart.
        let mut node_labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(
            node_labels.remove("kubernetes.io/hostname").as_deref(),
            Some(name)
        );
        labels.push(node_labels);
    }
    assert_eq!(labels[0], labels[1], "node 1's and node 2's labels");
}

#[tokio::test]
async fn pods_on_the_two_nodes_reach_each_other_both_nodes_and_services() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("two-nodes-net").await.unwrap();

    // A web server on each node, each behind a Service.
    let serve = "mkdir /www && echo served-by-$(hostname) >/www/index.html && \
                 exec /bin/busybox httpd -f -p 8080 -h /www";
    let mut servers = Vec::new();
    for (name, node) in [
        ("server-1", cluster::NODE_NAME),
        ("server-2", cluster::NODE2_NAME),
    ] {
        let pod = pinned_pod(name, node, serve, json!({"restartPolicy": "Always"}));
        create_pod(cluster, &ns, &pod).await;
    }
    for name in ["server-1", "server-2"] {
        servers.push(
            cluster
                .wait_for_pod_running(&ns, name, POD_TIMEOUT)
                .await
                .unwrap(),
        );
    }
    let service_1 = create_service(cluster, &ns, "web-1", "server-1").await;
    let service_2 = create_service(cluster, &ns, "web-2", "server-2").await;

    // From each node: the other node's server directly, the other node's address (its kubelet
    // on node 2, the apiserver on node 1), the `kubernetes` Service (the node's kube-proxy to
    // the apiserver on node 1), and the other node's server through its Service (retried while
    // kube-proxy writes its rules). `timeout` rather than wget's -T, which crashes Debian's
    // static busybox 1.35.
    let client_script = |server_ip: &str, other_node: &str, other_port: u16, service: &str| {
        format!(
            "set -e; \
             /bin/busybox timeout 10 /bin/busybox wget -q -O- http://{server_ip}:8080/index.html; \
             /bin/busybox nc -w 10 {other_node} {other_port} </dev/null && echo node-reachable; \
             /bin/busybox nc -w 10 $KUBERNETES_SERVICE_HOST $KUBERNETES_SERVICE_PORT </dev/null \
               && echo kubernetes-service-reachable; \
             for i in $(seq 30); do \
               /bin/busybox timeout 5 /bin/busybox wget -q -O- http://{service}/index.html \
                 && exit 0; sleep 1; \
             done; exit 1"
        )
    };
    let clients = [
        (
            "client-1",
            cluster::NODE_NAME,
            client_script(&pod_ip(&servers[1]), cluster::NODE2_IP, 10250, &service_2),
        ),
        (
            "client-2",
            cluster::NODE2_NAME,
            client_script(&pod_ip(&servers[0]), cluster::NODE_IP, 6443, &service_1),
        ),
    ];
    for (name, node, script) in &clients {
        create_pod(cluster, &ns, &pinned_pod(name, node, script, json!({}))).await;
    }
    let mut client_pods = Vec::new();
    for (name, _, _) in &clients {
        client_pods.push(
            cluster
                .wait_for_pod_completion(&ns, name, POD_TIMEOUT)
                .await
                .unwrap(),
        );
    }
    // `kubectl logs` of client-2 also goes through node 2's kubelet.
    assert_eq!(
        logs(cluster, &ns, "client-1"),
        "served-by-server-2\nnode-reachable\nkubernetes-service-reachable\nserved-by-server-2\n"
    );
    assert_eq!(
        logs(cluster, &ns, "client-2"),
        "served-by-server-1\nnode-reachable\nkubernetes-service-reachable\nserved-by-server-1\n"
    );

    // Each pod on the node it was pinned to, with an address of that node's pod network.
    for (pod, node, cidr) in [
        (&servers[0], cluster::NODE_NAME, cluster::POD_CIDR),
        (&client_pods[0], cluster::NODE_NAME, cluster::POD_CIDR),
        (&servers[1], cluster::NODE2_NAME, cluster::NODE2_POD_CIDR),
        (
            &client_pods[1],
            cluster::NODE2_NAME,
            cluster::NODE2_POD_CIDR,
        ),
    ] {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        assert_eq!(pod_node(pod), node, "pod {name}");
        let ip = pod_ip(pod);
        assert!(in_cidr(&ip, cidr), "pod {name}: {ip} is in {cidr}");
    }

    // exec: the apiserver through node 2's kubelet to its containerd's streaming server.
    assert_eq!(
        exec(cluster, &ns, "server-2", "cat /www/index.html"),
        "served-by-server-2\n"
    );
}

#[tokio::test]
async fn a_pod_on_node_2_sees_node_2s_paths_and_runs_in_its_cgroups() {
    let cluster = cluster().await;
    let ns = cluster.create_namespace("two-nodes-paths").await.unwrap();

    // A pod on each node with the kubelet's root as a hostPath volume (with HostToContainer
    // propagation, as KubeVirt's handler mounts it: the source must be a shared mount); node 2's
    // also with KubeVirt's /var/run/kubevirt-private (created there by the kubelet: node 2's
    // /run is its own, so the machine's is untouched).
    let paths_pod = |name: &str, node: &str, private: bool| {
        let mut mounts = vec![json!({
            "name": "kubelet", "mountPath": "/host-kubelet", "mountPropagation": "HostToContainer",
        })];
        let mut volumes = vec![json!({
            "name": "kubelet", "hostPath": {"path": "/var/lib/kubelet", "type": "Directory"},
        })];
        if private {
            mounts.push(json!({"name": "private", "mountPath": "/host-private"}));
            volumes.push(json!({
                "name": "private",
                "hostPath": {"path": "/var/run/kubevirt-private", "type": "DirectoryOrCreate"},
            }));
        }
        let mut pod = pinned_pod(
            name,
            node,
            "exec /bin/busybox sleep 3600",
            json!({"restartPolicy": "Always", "volumes": volumes}),
        );
        if let Some(spec) = pod.spec.as_mut() {
            spec.containers[0].volume_mounts =
                Some(serde_json::from_value(json!(mounts)).expect("valid volume mounts"));
        }
        pod
    };
    create_pod(
        cluster,
        &ns,
        &paths_pod("paths-1", cluster::NODE_NAME, false),
    )
    .await;
    create_pod(
        cluster,
        &ns,
        &paths_pod("paths-2", cluster::NODE2_NAME, true),
    )
    .await;
    let pod_1 = cluster
        .wait_for_pod_running(&ns, "paths-1", POD_TIMEOUT)
        .await
        .unwrap();
    let pod_2 = cluster
        .wait_for_pod_running(&ns, "paths-2", POD_TIMEOUT)
        .await
        .unwrap();
    assert_eq!(pod_node(&pod_1), cluster::NODE_NAME);
    assert_eq!(pod_node(&pod_2), cluster::NODE2_NAME);
    let (uid_1, uid_2) = (pod_uid(&pod_1), pod_uid(&pod_2));

    // Each sees its own node's kubelet directory: its own pod's, not the other's.
    let listing_1 = exec(cluster, &ns, "paths-1", "ls /host-kubelet/pods");
    let listing_2 = exec(cluster, &ns, "paths-2", "ls /host-kubelet/pods");
    let lines = |listing: &str| listing.lines().map(str::to_owned).collect::<Vec<_>>();
    assert!(lines(&listing_1).contains(&uid_1), "node 1: {listing_1}");
    assert!(!lines(&listing_1).contains(&uid_2), "node 1: {listing_1}");
    assert!(lines(&listing_2).contains(&uid_2), "node 2: {listing_2}");
    assert!(!lines(&listing_2).contains(&uid_1), "node 2: {listing_2}");
    // From the machine (node 1's view): node 2's pod is in node 2's directory only.
    let node2_kubelet = Path::new(cluster::NODE2_STATE_DIR).join("kubelet/pods");
    assert!(Path::new("/var/lib/kubelet/pods").join(&uid_1).is_dir());
    assert!(!Path::new("/var/lib/kubelet/pods").join(&uid_2).exists());
    assert!(node2_kubelet.join(&uid_2).is_dir());
    assert!(!node2_kubelet.join(&uid_1).exists());
    // And from node 2's mount namespace, where its kubelet and containerd run.
    let output = cluster
        .node2_command("ls")
        .arg("/var/lib/kubelet/pods")
        .output()
        .expect("running ls in node 2's namespaces");
    assert!(output.status.success(), "{output:?}");
    let listing = String::from_utf8_lossy(&output.stdout);
    assert!(lines(&listing).contains(&uid_2), "node 2's view: {listing}");
    assert!(
        !lines(&listing).contains(&uid_1),
        "node 2's view: {listing}"
    );

    // A file node 2's pod writes to its /var/run/kubevirt-private lands in node 2's /run.
    let token = format!("two-nodes-{:016x}", rand::random::<u64>());
    exec(
        cluster,
        &ns,
        "paths-2",
        &format!("echo {token} >/host-private/{token}"),
    );
    assert_eq!(
        std::fs::read_to_string(
            Path::new(cluster::NODE2_STATE_DIR).join(format!("run/kubevirt-private/{token}"))
        )
        .expect("node 2's /run/kubevirt-private has the file"),
        format!("{token}\n")
    );
    assert!(!Path::new("/run/kubevirt-private").join(&token).exists());

    // Each pod's processes are in its node's cgroup subtree (the kubelets' cgroupRoots
    // /kubevirt-rs and /kubevirt-rs/node-2).
    let cgroup = |pod: &str| {
        let cgroups = exec(cluster, &ns, pod, "cat /proc/self/cgroup");
        cgroups
            .lines()
            .find_map(|line| line.split_once(":pids:"))
            .map(|(_, path)| path.to_owned())
            .unwrap_or_else(|| panic!("no pids cgroup for {pod}: {cgroups}"))
    };
    let cgroup_1 = cgroup("paths-1");
    let cgroup_2 = cgroup("paths-2");
    assert!(
        cgroup_1.starts_with("/kubevirt-rs/kubepods/"),
        "node 1's pod: {cgroup_1}"
    );
    assert!(
        cgroup_2.starts_with("/kubevirt-rs/node-2/kubepods/"),
        "node 2's pod: {cgroup_2}"
    );
}
