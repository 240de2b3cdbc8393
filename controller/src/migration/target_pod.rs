//! The target pod of a migration: the VMI's launcher pod as the template renders it, plus
//! what makes it a migration target (`createTargetPod` in v1.9.0's migration controller).

use k8s_openapi::api::core::v1::{Affinity, Pod, PodAffinityTerm, PodAntiAffinity};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use proto::kubevirt::{VirtualMachineInstance, VirtualMachineInstanceMigration, well_known};

/// Pod label naming the migration a target pod is for.
pub const MIGRATION_JOB_UID_LABEL: &str = "kubevirt.io/migrationJobUID";
/// Pod annotation naming the migration.
pub const MIGRATION_JOB_NAME_ANNOTATION: &str = "kubevirt.io/migrationJobName";
/// `kubernetes.io/hostname`: one pod of the VMI per node.
const HOSTNAME_TOPOLOGY: &str = "kubernetes.io/hostname";

/// Turns the VMI's rendered launcher pod into `migration`'s target pod: labelled for the
/// migration, never on a node that has a pod of this VMI (the source's), and restricted
/// further by the migration's `addedNodeSelector` (the VMI's own selector wins a clash).
pub fn make_target(
    mut pod: Pod,
    vmi: &VirtualMachineInstance,
    migration: &VirtualMachineInstanceMigration,
) -> Pod {
    let uid = migration.metadata.uid.clone().unwrap_or_default();
    let name = migration.metadata.name.clone().unwrap_or_default();
    pod.metadata
        .labels
        .get_or_insert_default()
        .insert(MIGRATION_JOB_UID_LABEL.into(), uid);
    pod.metadata
        .annotations
        .get_or_insert_default()
        .insert(MIGRATION_JOB_NAME_ANNOTATION.into(), name);
    let spec = pod.spec.get_or_insert_default();
    let anti = spec
        .affinity
        .get_or_insert_with(Affinity::default)
        .pod_anti_affinity
        .get_or_insert_with(PodAntiAffinity::default);
    anti.required_during_scheduling_ignored_during_execution
        .get_or_insert_default()
        .push(PodAffinityTerm {
            label_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: well_known::CREATED_BY_LABEL.into(),
                    operator: "In".into(),
                    values: Some(vec![vmi.metadata.uid.clone().unwrap_or_default()]),
                }]),
                ..Default::default()
            }),
            topology_key: HOSTNAME_TOPOLOGY.into(),
            ..Default::default()
        });
    if let Some(added) = &migration.spec.added_node_selector {
        let selector = spec.node_selector.get_or_insert_default();
        for (key, value) in added {
            selector.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_target_pod_is_labelled_kept_off_the_vmis_nodes_and_selected_further() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "n", "uid": "vmi-uid"},
            "spec": {"domain": {"devices": {}}}
        }))
        .unwrap();
        let migration: VirtualMachineInstanceMigration = serde_json::from_value(json!({
            "metadata": {"name": "m", "namespace": "n", "uid": "m-uid"},
            "spec": {"vmiName": "v", "addedNodeSelector": {"zone": "b", "kubevirt.io/schedulable": "false"}}
        }))
        .unwrap();
        let rendered: Pod = serde_json::from_value(json!({
            "metadata": {"generateName": "virt-launcher-v-", "labels": {"kubevirt.io": "virt-launcher"}},
            "spec": {"containers": [], "nodeSelector": {"kubevirt.io/schedulable": "true"}}
        }))
        .unwrap();
        let pod = serde_json::to_value(make_target(rendered, &vmi, &migration)).unwrap();
        assert_eq!(pod["metadata"]["labels"][MIGRATION_JOB_UID_LABEL], "m-uid");
        assert_eq!(
            pod["metadata"]["annotations"][MIGRATION_JOB_NAME_ANNOTATION],
            "m"
        );
        assert_eq!(
            pod["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"],
            json!([{
                "labelSelector": {"matchExpressions": [{"key": "kubevirt.io/created-by", "operator": "In", "values": ["vmi-uid"]}]},
                "topologyKey": "kubernetes.io/hostname"
            }])
        );
        assert_eq!(
            pod["spec"]["nodeSelector"],
            json!({"kubevirt.io/schedulable": "true", "zone": "b"})
        );
    }
}
