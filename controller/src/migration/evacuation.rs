//! Evacuation (KubeVirt v1.9.0's `pkg/virt-controller/watch/drain/evacuation`): a VMI whose
//! `status.evacuationNodeName` names the node it runs on (virt-api's eviction webhook writes
//! it when a drain evicts the launcher pod of a `LiveMigrate` VMI) gets a migration.

use std::time::Instant;

use kube::api::PostParams;
use kube::{Api, ResourceExt};
use proto::kubevirt::{Condition, Phase, VirtualMachineInstance, VirtualMachineInstanceMigration};
use serde_json::json;

use crate::context::{CACHE_WAIT, Context};
use crate::writes::Write;

/// The annotation on an evacuation's migration, naming the node being drained.
pub const EVACUATION_ANNOTATION: &str = "kubevirt.io/evacuationMigration";
/// The annotation virt-api's eviction webhook puts on a VMI the descheduler evicts.
pub const EVICTION_SOURCE_ANNOTATION: &str = "kubevirt.io/eviction-source";

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

/// How long after its last failed evacuation migration a VMI waits before the next one:
/// 10 s, doubling per failure, at most 5 minutes (a failure that always recurs must not
/// churn target pods).
pub fn backoff_left(
    vmi: &VirtualMachineInstance,
    migrations: &[&VirtualMachineInstanceMigration],
    now: k8s_openapi::jiff::Timestamp,
) -> Option<std::time::Duration> {
    let failed: Vec<k8s_openapi::jiff::Timestamp> = migrations
        .iter()
        .filter(|m| {
            m.spec.vmi_name.as_deref() == vmi.metadata.name.as_deref()
                && m.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key(EVACUATION_ANNOTATION))
                && m.phase() == proto::kubevirt::MigrationPhase::Failed
        })
        .filter_map(|m| {
            m.status
                .as_ref()?
                .phase_transition_timestamps
                .iter()
                .map(|t| t.phase_transition_timestamp.0)
                .max()
        })
        .collect();
    let last = failed.iter().max()?;
    let exponent = u32::try_from(failed.len().saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(5);
    let wait =
        std::time::Duration::from_secs(10u64 << exponent).min(std::time::Duration::from_secs(300));
    let since = std::time::Duration::try_from(now.duration_since(*last)).unwrap_or_default();
    wait.checked_sub(since).filter(|left| !left.is_zero())
}

/// Creates the evacuation's migration when [`needs_evacuation`] says so (at most one per
/// VMI until the cache shows it, none during the back-off after failed ones); `Some` is
/// when to look again.
pub async fn reconcile(
    ctx: &Context,
    vmi: &VirtualMachineInstance,
) -> Result<Option<std::time::Duration>, kube::Error> {
    let namespace = vmi.namespace().unwrap_or_default();
    let cached = ctx.migrations.state();
    let of_namespace: Vec<&VirtualMachineInstanceMigration> = cached
        .iter()
        .filter(|m| m.metadata.namespace.as_deref() == Some(namespace.as_str()))
        .map(|m| m.as_ref())
        .collect();
    let Some(node) = needs_evacuation(vmi, &of_namespace) else {
        return Ok(None);
    };
    if let Some(left) = backoff_left(vmi, &of_namespace, k8s_openapi::jiff::Timestamp::now()) {
        return Ok(Some(left));
    }
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    {
        let mut created = ctx.evacuations.lock().unwrap_or_else(|p| p.into_inner());
        created.retain(|_, at| at.elapsed() < CACHE_WAIT);
        if created.contains_key(&uid) {
            return Ok(None);
        }
    }
    // As v1.9.0's `GenerateNewMigration`: virt-api's mutator adds the `kubevirt.io/vmi-name`
    // label and the finalizer (adding them here too doubled the finalizer).
    let descheduled = vmi
        .annotations()
        .get(EVICTION_SOURCE_ANNOTATION)
        .is_some_and(|v| v == "descheduler");
    let priority = if descheduled {
        "system-maintenance"
    } else {
        "system-critical"
    };
    let migration: VirtualMachineInstanceMigration = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstanceMigration",
        "metadata": {
            "generateName": "kubevirt-evacuation-",
            "annotations": {EVACUATION_ANNOTATION: node},
        },
        "spec": {"vmiName": vmi.name_any(), "priority": priority},
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
    Ok(None)
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

    #[test]
    fn failed_evacuations_back_off() {
        let failed_at = |name: &str, second: i64| -> VirtualMachineInstanceMigration {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "n", "annotations": {EVACUATION_ANNOTATION: "n1"}},
                "spec": {"vmiName": "v"},
                "status": {"phase": "Failed", "phaseTransitionTimestamps": [
                    {"phase": "Failed", "phaseTransitionTimestamp": k8s_openapi::jiff::Timestamp::from_second(second).unwrap().to_string()}]}
            }))
            .unwrap()
        };
        let at = |s: i64| k8s_openapi::jiff::Timestamp::from_second(s).unwrap();
        let v = vmi(Some("n1"), "True");
        assert_eq!(backoff_left(&v, &[], at(1000)), None);
        let one = failed_at("a", 1000);
        assert_eq!(
            backoff_left(&v, &[&one], at(1004)),
            Some(std::time::Duration::from_secs(6))
        );
        assert_eq!(backoff_left(&v, &[&one], at(1010)), None);
        let two = failed_at("b", 1010);
        assert_eq!(
            backoff_left(&v, &[&one, &two], at(1015)),
            Some(std::time::Duration::from_secs(15))
        );
        let many: Vec<VirtualMachineInstanceMigration> =
            (0..9).map(|i| failed_at(&format!("m{i}"), 2000)).collect();
        let refs: Vec<&VirtualMachineInstanceMigration> = many.iter().collect();
        assert_eq!(
            backoff_left(&v, &refs, at(2000)),
            Some(std::time::Duration::from_secs(300))
        );
    }
}
