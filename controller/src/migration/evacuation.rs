//! Evacuation (KubeVirt v1.9.0's `pkg/virt-controller/watch/drain/evacuation`): a VMI whose
//! `status.evacuationNodeName` names the node it runs on (virt-api's eviction webhook writes
//! it when a drain evicts the launcher pod of a `LiveMigrate` VMI) gets a migration.

use std::time::Instant;

use kube::api::PostParams;
use kube::{Api, ResourceExt};
use proto::kubevirt::{Condition, Phase, VirtualMachineInstance, VirtualMachineInstanceMigration};
use serde_json::json;

use super::decide::FINALIZER;
use crate::context::{CACHE_WAIT, Context};
use crate::writes::Write;

/// The annotation on an evacuation's migration, naming the node being drained.
pub const EVACUATION_ANNOTATION: &str = "kubevirt.io/evacuationMigration";
/// The label virt-api's mutator puts on every migration.
pub const VMI_NAME_LABEL: &str = "kubevirt.io/vmi-name";

/// Whether `vmi` must be moved off its node now: marked for evacuation from the node it
/// runs on, running, migratable, and no migration of it under way.
pub fn needs_evacuation(
    vmi: &VirtualMachineInstance,
    migrations: &[&VirtualMachineInstanceMigration],
) -> Option<String> {
    let status = vmi.status.as_ref()?;
    let node = status
        .extra
        .get("evacuationNodeName")
        .and_then(|v| v.as_str())
        .filter(|n| !n.is_empty())?;
    if status.node_name.as_deref() != Some(node)
        || vmi.phase() != Phase::Running
        || vmi.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let migratable =
        Condition::find(&status.conditions, "LiveMigratable").is_some_and(|c| c.status == "True");
    let migrating = vmi
        .migration_state()
        .ok()
        .flatten()
        .is_some_and(|s| !s.is_done());
    let unfinished = migrations.iter().any(|m| {
        m.spec.vmi_name.as_deref() == vmi.metadata.name.as_deref() && !m.phase().is_final()
    });
    (migratable && !migrating && !unfinished).then(|| node.to_string())
}

/// Creates the evacuation's migration when [`needs_evacuation`] says so (at most one per
/// VMI until the cache shows it).
pub async fn reconcile(ctx: &Context, vmi: &VirtualMachineInstance) -> Result<(), kube::Error> {
    let namespace = vmi.namespace().unwrap_or_default();
    let cached = ctx.migrations.state();
    let of_namespace: Vec<&VirtualMachineInstanceMigration> = cached
        .iter()
        .filter(|m| m.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .map(|m| m.as_ref())
        .collect();
    let Some(node) = needs_evacuation(vmi, &of_namespace) else {
        return Ok(());
    };
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    {
        let mut created = ctx.evacuations.lock().unwrap_or_else(|p| p.into_inner());
        created.retain(|_, at| at.elapsed() < CACHE_WAIT);
        if created.contains_key(&uid) {
            return Ok(());
        }
    }
    let migration: VirtualMachineInstanceMigration = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstanceMigration",
        "metadata": {
            "generateName": "kubevirt-evacuation-",
            "annotations": {EVACUATION_ANNOTATION: node},
            "labels": {VMI_NAME_LABEL: vmi.name_any()},
            "finalizers": [FINALIZER],
        },
        "spec": {"vmiName": vmi.name_any(), "priority": "system-critical"},
    }))
    .expect("a well-formed migration");
    let api: Api<VirtualMachineInstanceMigration> = ctx.api(&namespace);
    let created = api.create(&PostParams::default(), &migration).await?;
    ctx.writes.record(Write::MigrationPatch);
    ctx.evacuations
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(uid, Instant::now());
    ctx.event(
        vmi,
        false,
        "SuccessfulCreate",
        format!(
            "Created Migration {} for evacuation of node {node}",
            created.name_any()
        ),
    )
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(evacuate: Option<&str>, migratable: &str) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "n"},
            "spec": {"domain": {"devices": {}}},
            "status": {
                "phase": "Running", "nodeName": "n1", "evacuationNodeName": evacuate,
                "conditions": [{"type": "LiveMigratable", "status": migratable}],
            }
        }))
        .unwrap()
    }

    #[test]
    fn a_marked_migratable_vmi_is_evacuated_once() {
        assert_eq!(
            needs_evacuation(&vmi(Some("n1"), "True"), &[]).as_deref(),
            Some("n1")
        );
        assert_eq!(needs_evacuation(&vmi(None, "True"), &[]), None);
        // Marked for another node (it moved already), or not migratable: nothing.
        assert_eq!(needs_evacuation(&vmi(Some("n2"), "True"), &[]), None);
        assert_eq!(needs_evacuation(&vmi(Some("n1"), "False"), &[]), None);
        let running: VirtualMachineInstanceMigration = serde_json::from_value(json!({
            "metadata": {"name": "m", "namespace": "n"}, "spec": {"vmiName": "v"},
            "status": {"phase": "Running"}
        }))
        .unwrap();
        assert_eq!(
            needs_evacuation(&vmi(Some("n1"), "True"), &[&running]),
            None
        );
        let mut failed = running.clone();
        failed.status.as_mut().unwrap().phase = Some(proto::kubevirt::MigrationPhase::Failed);
        assert!(needs_evacuation(&vmi(Some("n1"), "True"), &[&failed]).is_some());
    }
}
