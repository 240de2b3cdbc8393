//! VMI status writes (`proto::kubevirt::status_write`, used by the handler and the
//! controller) against both CRD shapes a cluster may have: ours, with a status subresource,
//! and KubeVirt v1.9.0's, without one. Real etcd + kube-apiserver; fails (never skips)
//! when the control plane cannot be built or started.

use integration::controlplane::{self, ControlPlane, Options, kubevirt_crds};
use kube::api::{Api, Patch, PatchParams, PostParams};
use proto::kubevirt::status_write::patch_vmi_status;
use proto::kubevirt::{Phase, VirtualMachineInstance, parse_vmi};
use serde_json::json;

fn start_failed(e: anyhow::Error) -> ! {
    panic!(
        "cannot run the test control plane: {e:#}\nbuild it with: {}",
        controlplane::build_script().display()
    )
}

fn vmi(name: &str) -> VirtualMachineInstance {
    parse_vmi(&format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: {name}\nspec:\n  domain:\n    devices: {{}}\n    resources:\n      requests:\n        memory: 64Mi\n"
    ))
    .expect("VMI manifest")
}

fn api_code<T>(result: Result<T, kube::Error>) -> Option<u16> {
    match result {
        Err(kube::Error::Api(e)) => Some(e.code),
        _ => None,
    }
}

/// Writes a phase through `patch_vmi_status` and checks it landed; then the error cases.
async fn status_writes_land(api: &Api<VirtualMachineInstance>) {
    let created = api
        .create(&PostParams::default(), &vmi("writer"))
        .await
        .expect("create VMI");
    let patch = json!({
        "metadata": {"resourceVersion": created.metadata.resource_version},
        "status": {"phase": "Scheduled", "nodeName": "node-a"},
    });
    let written = patch_vmi_status(api, "writer", &patch)
        .await
        .expect("status write");
    let read = api.get("writer").await.expect("get VMI");
    for vmi in [&written, &read] {
        let status = vmi.status.as_ref().expect("a status");
        assert_eq!(status.phase, Some(Phase::Scheduled));
        assert_eq!(status.node_name.as_deref(), Some("node-a"));
    }
    // The same (now stale) resource version: a conflict, not a silent overwrite.
    assert_eq!(
        api_code(patch_vmi_status(api, "writer", &patch).await),
        Some(409)
    );
    // A VMI that does not exist: 404 from both paths.
    assert_eq!(
        api_code(patch_vmi_status(api, "no-such-vmi", &json!({"status": {}})).await),
        Some(404)
    );
}

#[tokio::test]
async fn status_writes_land_on_our_crd_through_the_status_subresource() {
    let cp = controlplane::shared()
        .await
        .unwrap_or_else(|e| start_failed(e));
    let ns = cp.create_namespace("status-ours").await.expect("namespace");
    let api: Api<VirtualMachineInstance> = Api::namespaced(cp.client().expect("client"), &ns);
    status_writes_land(&api).await;
    // Why `/status` comes first: with the subresource, a status in a write to the object
    // itself is dropped without an error.
    api.patch(
        "writer",
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": {"phase": "Failed"}})),
    )
    .await
    .expect("patch the object");
    let status = api
        .get("writer")
        .await
        .expect("get")
        .status
        .expect("status");
    assert_eq!(status.phase, Some(Phase::Scheduled));
}

#[tokio::test]
async fn status_writes_land_on_kubevirt_s_crd_without_a_status_subresource() {
    let mut crds = kubevirt_crds().unwrap_or_else(|e| start_failed(e));
    // KubeVirt v1.9.0's shape (`NewVirtualMachineInstanceCrd` adds no subresources).
    for crd in &mut crds {
        if crd.spec.names.kind == "VirtualMachineInstance" {
            for version in &mut crd.spec.versions {
                version.subresources = None;
            }
        }
    }
    let cp = ControlPlane::start(Options {
        crds,
        ..Options::default()
    })
    .await
    .unwrap_or_else(|e| start_failed(e));
    let ns = cp
        .create_namespace("status-stock")
        .await
        .expect("namespace");
    let api: Api<VirtualMachineInstance> = Api::namespaced(cp.client().expect("client"), &ns);
    api.create(&PostParams::default(), &vmi("probe"))
        .await
        .expect("create VMI");
    // The stock shape indeed has no `/status`.
    assert_eq!(
        api_code(
            api.patch_status(
                "probe",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Pending"}})),
            )
            .await
        ),
        Some(404)
    );
    status_writes_land(&api).await;
}
