//! Writing a VMI's status on any KubeVirt v1.9.0 cluster.
//!
//! KubeVirt v1.9.0's VirtualMachineInstance CRD has no status subresource
//! (`pkg/virt-operator/resource/generate/components/crds.go`): its components
//! write the status with the object. The CRDs we generate have one (so that
//! a status write cannot change the spec). A status write therefore goes to
//! `/status` first, and to the object itself only when `/status` answers
//! 404 and the object exists: on a CRD with the subresource a write to the
//! object would silently drop the status, so the object path is never the
//! first choice, and nothing about the cluster is cached (a CRD may gain the
//! subresource at an upgrade).

use kube::Api;
use kube::api::{Patch, PatchParams};

use super::VirtualMachineInstance;

/// Applies `patch` (a JSON merge patch, usually `{"metadata":
/// {"resourceVersion": ..}, "status": {..}}`) to VMI `name`'s status.
/// A 404 from both paths means the VMI is gone; a 409 is a conflict on the
/// resource version, as with any write.
pub async fn patch_vmi_status(
    api: &Api<VirtualMachineInstance>,
    name: &str,
    patch: &serde_json::Value,
) -> Result<VirtualMachineInstance, kube::Error> {
    let params = PatchParams::default();
    match api.patch_status(name, &params, &Patch::Merge(patch)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => {
            api.patch(name, &params, &Patch::Merge(patch)).await
        }
        other => other,
    }
}
