//! kubevirt-rs on the test cluster: the project's images imported, `images/deploy/` (and
//! the `KubeVirt` CR) applied, and everything ready for VMs — shared by every cluster test
//! binary that runs VMs.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};

use super::Cluster;

/// The install's namespace.
pub const NAMESPACE: &str = "kubevirt";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `images/examples/vm-testguest.yaml` renamed, `Halted`: what a server-side dry run sends
/// to virt-api's webhooks.
fn probe_vm() -> Result<DynamicObject> {
    let path = repo().join("images/examples/vm-testguest.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("{}", path.display()))?;
    let mut vm: serde_json::Value = serde_yaml::from_str(&text)?;
    vm["metadata"] = serde_json::json!({"name": "webhooks-ready"});
    vm["spec"]["runStrategy"] = serde_json::json!("Halted");
    Ok(serde_json::from_value(vm)?)
}

/// Polls `check` every 250 ms for up to `limit`.
async fn poll<F, Fut>(what: &str, limit: Duration, mut check: F) -> Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        if Instant::now() > deadline {
            bail!("timed out ({limit:?}) waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Whether `node` is labelled `kubevirt.io/schedulable=true` with kvm and tun allocatable
/// (virt-handler runs there and its device plugins registered).
pub async fn node_ready_for_vms(client: &kube::Client, node: &str) -> bool {
    let Ok(node) = Api::<Node>::all(client.clone()).get(node).await else {
        return false;
    };
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get("kubevirt.io/schedulable"))
        .is_some_and(|v| v == "true");
    let allocatable = |resource: &str| {
        node.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get(resource))
            .is_some_and(|q| q.0 != "0")
    };
    labelled && allocatable("devices.kubevirt.io/kvm") && allocatable("devices.kubevirt.io/tun")
}

/// Imports the project's images, applies `images/deploy/` and the CR, waits for the three
/// components, the install `Deployed`, virt-api's webhooks answering and every node of
/// `nodes` ready for VMs. A deployment kept from an earlier run is restarted (its pods may
/// run older images).
pub async fn deploy(cluster: &Cluster, nodes: &[&str]) -> Result<()> {
    let started = Instant::now();
    std::thread::scope(|s| s.spawn(|| cluster.import_project_images()).join())
        .map_err(|_| anyhow::anyhow!("the image import panicked"))??;
    let client = cluster.client()?;
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let redeploy = daemonsets.get_opt("virt-handler").await?.is_some();
    let deploy_dir = repo().join("images/deploy");
    cluster.kubectl_output(&["apply", "-f", &deploy_dir.to_string_lossy()])?;
    // The KubeVirt CR once its CRD is served (kubectl cannot map it in the same apply).
    cluster.kubectl_output(&[
        "wait",
        "crd/kubevirts.kubevirt.io",
        "--for=condition=established",
        "--timeout=60s",
    ])?;
    cluster.kubectl_output(&["apply", "-f", &deploy_dir.join("cr").to_string_lossy()])?;
    if redeploy {
        cluster.kubectl_output(&[
            "-n",
            NAMESPACE,
            "rollout",
            "restart",
            "deployment/virt-controller",
            "deployment/virt-api",
            "daemonset/virt-handler",
        ])?;
    }
    for what in [
        "deployment/virt-controller",
        "deployment/virt-api",
        "daemonset/virt-handler",
    ] {
        cluster.kubectl_output(&["-n", NAMESPACE, "rollout", "status", what, "--timeout=300s"])?;
    }
    // What tools wait on: the leader marks the install Deployed once virt-handler is ready.
    cluster.kubectl_output(&[
        "-n",
        NAMESPACE,
        "wait",
        "kv/kubevirt",
        "--for=jsonpath={.status.phase}=Deployed",
        "--timeout=300s",
    ])?;
    // virt-api's webhooks (failurePolicy Fail) refuse every VM and VMI until a replica is
    // ready and the API server reaches it through the Service: the Deployment Available, then
    // a server-side dry run of a VM answered by the webhooks.
    cluster.kubectl_output(&[
        "-n",
        NAMESPACE,
        "wait",
        "deployment/virt-api",
        "--for=condition=Available",
        "--timeout=300s",
    ])?;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kubevirt.io",
        "v1",
        "VirtualMachine",
    ));
    let vms: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let probe = probe_vm()?;
    poll(
        "virt-api's webhooks to answer",
        Duration::from_secs(240),
        || async { vms.create(&dry_run, &probe).await.is_ok() },
    )
    .await?;
    for node in nodes {
        poll(
            &format!("node {node} schedulable with device-plugin resources"),
            Duration::from_secs(240),
            || node_ready_for_vms(&client, node),
        )
        .await?;
    }
    eprintln!(
        "kubevirt-rs deployed on the test cluster in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
