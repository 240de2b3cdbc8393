//! `kubectl apply -f images/deploy/` works on a cluster that has nothing of ours yet: every
//! object of every manifest there, in kubectl's order, is first checked by the API server
//! (server-side dry run, strict field validation) and then applied, on a fresh control plane
//! without the kubevirt.io CRDs. Applying them for real is what shows the order works: each
//! object is dry-run only once the namespace and the CRDs before it exist.

use integration::controlplane::{ControlPlane, Options};
use integration::manifests;
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deploy_manifest_is_accepted_in_kubectl_order() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/deploy");
    let manifests = manifests::read_dir(&dir).expect("images/deploy");
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane (integration/controlplane/build.sh builds it)");
    let client = cp.client().unwrap();
    let mut applied = Vec::new();
    for manifest in &manifests {
        let file = manifest.path.file_name().unwrap().to_string_lossy();
        assert!(!manifest.objects.is_empty(), "{file} holds no object");
        for object in &manifest.objects {
            for dry_run in [true, false] {
                manifests::apply(&client, object, None, dry_run)
                    .await
                    .unwrap_or_else(|e| panic!("{file}: {e:#}"));
            }
            applied.push(manifests::describe(object));
        }
    }
    assert_eq!(
        applied[0], "Namespace/kubevirt",
        "the namespace comes first"
    );
    for ours in [
        "CustomResourceDefinition/virtualmachineinstances.kubevirt.io",
        "CustomResourceDefinition/virtualmachines.kubevirt.io",
        "ServiceAccount/kubevirt/virt-controller",
        "ClusterRole/kubevirt-rs-virt-controller",
        "ClusterRoleBinding/kubevirt-rs-virt-controller",
        "Role/kubevirt/virt-controller-leader-election",
        "RoleBinding/kubevirt/virt-controller-leader-election",
        "Deployment/kubevirt/virt-controller",
    ] {
        assert!(applied.iter().any(|a| a == ours), "{ours} in {applied:?}");
    }
}
