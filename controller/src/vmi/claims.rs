//! `status.volumeStatus[].persistentVolumeClaimInfo` (KubeVirt v1.9.0's `storage.go`
//! `processPVCInfo`): what the claim behind a PVC or DataVolume volume says — access modes
//! (virt-handler decides from them whether a disk is shared, hence whether the VMI may
//! migrate), volume mode, capacity, requests, preallocation and the filesystem overhead.
//!
//! v1.9.0 reads the claims from an informer on every reconcile; here a claim is read (one GET)
//! only while a volume's entry lacks its info, so the info is written once per volume: a
//! claim resized later is not followed.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::Api;
use proto::kubevirt::{VirtualMachineInstance, Volume, VolumeStatus};
use serde_json::{Value, json};

/// v1.9.0's `DefaultFSOverhead`: what it records while no single CDI install says otherwise
/// (this project deploys no CDI).
const DEFAULT_FILESYSTEM_OVERHEAD: &str = "0.055";

/// `PVCNameFromVirtVolume` for the volumes that get claim info: a DataVolume's name (its
/// PVC has it), else a PVC's or a memory dump's claim name.
fn claim_of(volume: &Volume) -> Option<String> {
    if let Some(data_volume) = &volume.data_volume {
        return data_volume
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string);
    }
    if let Some(pvc) = &volume.persistent_volume_claim {
        return Some(pvc.claim_name.clone());
    }
    volume
        .extra
        .get("memoryDump")
        .and_then(|m| m.get("claimName"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The claims of volumes whose status entry exists and has no claim info yet.
pub(crate) fn missing(volumes: &[Volume], statuses: &[VolumeStatus]) -> Vec<String> {
    volumes
        .iter()
        .filter(|v| {
            statuses
                .iter()
                .any(|s| s.name == v.name && s.persistent_volume_claim_info.is_none())
        })
        .filter_map(claim_of)
        .filter(|claim| !claim.is_empty())
        .collect()
}

/// `IsPreallocated`: an annotation ending in `/storage.preallocation` or
/// `/storage.thick-provisioned` set to `true`.
fn preallocated(pvc: &PersistentVolumeClaim) -> bool {
    pvc.metadata
        .annotations
        .iter()
        .flatten()
        .any(|(key, value)| {
            value == "true"
                && (key.contains("/storage.preallocation")
                    || key.contains("/storage.thick-provisioned"))
        })
}

/// The claim info v1.9.0 records for `pvc` (its JSON keys, empty fields left out).
pub(crate) fn info(pvc: &PersistentVolumeClaim) -> Value {
    let spec = pvc.spec.clone().unwrap_or_default();
    let mut info = json!({
        "claimName": pvc.metadata.name.clone().unwrap_or_default(),
        "filesystemOverhead": DEFAULT_FILESYSTEM_OVERHEAD,
    });
    if let Some(modes) = spec.access_modes.filter(|m| !m.is_empty()) {
        info["accessModes"] = json!(modes);
    }
    if let Some(mode) = spec.volume_mode {
        info["volumeMode"] = json!(mode);
    }
    if let Some(capacity) = pvc
        .status
        .as_ref()
        .and_then(|s| s.capacity.clone())
        .filter(|c| !c.is_empty())
    {
        info["capacity"] = json!(capacity);
    }
    if let Some(requests) = spec
        .resources
        .and_then(|r| r.requests)
        .filter(|r| !r.is_empty())
    {
        info["requests"] = json!(requests);
    }
    if preallocated(pvc) {
        info["preallocated"] = json!(true);
    }
    info
}

/// Fills the claim info of every entry without it whose claim is in `claims`; whether
/// anything changed.
pub(crate) fn fill(
    statuses: &mut [VolumeStatus],
    volumes: &[Volume],
    claims: &BTreeMap<String, PersistentVolumeClaim>,
) -> bool {
    let mut changed = false;
    for status in statuses
        .iter_mut()
        .filter(|s| s.persistent_volume_claim_info.is_none())
    {
        let claim = volumes
            .iter()
            .find(|v| v.name == status.name)
            .and_then(claim_of);
        if let Some(pvc) = claim.and_then(|c| claims.get(&c)) {
            status.persistent_volume_claim_info = Some(info(pvc));
            changed = true;
        }
    }
    changed
}

/// `patch` (a status merge patch, or none) with the claim info of the VMI's volumes added
/// where it is missing: the volume statuses it writes (else the VMI's) with the info of
/// the claims that exist. A claim that does not exist is left for a later reconcile.
pub(crate) async fn with_claim_info(
    api: &Api<PersistentVolumeClaim>,
    vmi: &VirtualMachineInstance,
    patch: Option<Value>,
) -> Option<Value> {
    if vmi.phase().is_final() {
        return patch;
    }
    let written = patch.as_ref().and_then(|p| p.get("volumeStatus")).cloned();
    let mut statuses: Vec<VolumeStatus> = match written {
        Some(list) => match serde_json::from_value(list) {
            Ok(statuses) => statuses,
            Err(_) => return patch,
        },
        None => vmi
            .status
            .as_ref()
            .map(|s| s.volume_status.clone())
            .unwrap_or_default(),
    };
    let wanted = missing(&vmi.spec.volumes, &statuses);
    if wanted.is_empty() {
        return patch;
    }
    let mut claims = BTreeMap::new();
    for claim in wanted {
        // Best effort: a claim that cannot be read now must not hold the status write back
        // (phase, conditions); a later reconcile fills its info in.
        match api.get_opt(&claim).await {
            Ok(Some(pvc)) => {
                claims.insert(claim, pvc);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::info!(%claim, error = %e, "cannot read the claim of a volume yet");
            }
        }
    }
    if !fill(&mut statuses, &vmi.spec.volumes, &claims) {
        return patch;
    }
    let mut patch = patch.unwrap_or_else(|| json!({}));
    patch["volumeStatus"] = serde_json::to_value(&statuses).unwrap_or(Value::Null);
    Some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volumes() -> Vec<Volume> {
        serde_json::from_value(json!([
            {"name": "root", "persistentVolumeClaim": {"claimName": "root-claim"}},
            {"name": "data", "dataVolume": {"name": "data-dv"}},
            {"name": "disk", "containerDisk": {"image": "x"}},
            {"name": "dump", "memoryDump": {"claimName": "dump-claim"}},
        ]))
        .unwrap()
    }

    fn pvc(name: &str, annotations: Value) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": annotations},
            "spec": {"accessModes": ["ReadWriteMany"], "volumeMode": "Block",
                     "resources": {"requests": {"storage": "1Gi"}}},
            "status": {"capacity": {"storage": "2Gi"}},
        }))
        .unwrap()
    }

    #[test]
    fn the_claim_behind_each_pvc_or_data_volume_is_recorded_once() {
        let volumes = volumes();
        let mut statuses: Vec<VolumeStatus> = ["root", "data", "disk", "dump"]
            .into_iter()
            .map(|name| VolumeStatus {
                name: name.into(),
                ..Default::default()
            })
            .collect();
        assert_eq!(
            missing(&volumes, &statuses),
            ["root-claim", "data-dv", "dump-claim"]
        );
        let claims: BTreeMap<String, PersistentVolumeClaim> = [
            ("root-claim".to_string(), pvc("root-claim", json!({}))),
            (
                "data-dv".to_string(),
                pvc(
                    "data-dv",
                    json!({"cdi.kubevirt.io/storage.preallocation": "true"}),
                ),
            ),
        ]
        .into();
        assert!(fill(&mut statuses, &volumes, &claims));
        assert_eq!(
            statuses[0].persistent_volume_claim_info,
            Some(json!({
                "claimName": "root-claim", "accessModes": ["ReadWriteMany"], "volumeMode": "Block",
                "capacity": {"storage": "2Gi"}, "requests": {"storage": "1Gi"},
                "filesystemOverhead": "0.055",
            }))
        );
        assert_eq!(
            statuses[1].persistent_volume_claim_info.as_ref().unwrap()["preallocated"],
            true
        );
        assert_eq!(statuses[2].persistent_volume_claim_info, None);
        // Recorded: nothing more to read or write (but the dump's claim, not read here).
        assert_eq!(missing(&volumes, &statuses), ["dump-claim"]);
        assert!(!fill(&mut statuses, &volumes, &claims));
    }

    #[test]
    fn a_claim_that_does_not_exist_leaves_its_entry_as_it_is() {
        let volumes = volumes();
        let mut statuses = vec![VolumeStatus {
            name: "root".into(),
            ..Default::default()
        }];
        assert!(!fill(&mut statuses, &volumes, &BTreeMap::new()));
        assert_eq!(statuses[0].persistent_volume_claim_info, None);
        // A volume without a status entry yet (before the Scheduled write) is not read.
        assert!(missing(&volumes, &[]).is_empty());
    }
}
