//! The migration controller's reconcile: read the caches, [`decide`], write what the plan
//! says.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use proto::kubevirt::{
    MigrationState, Time, VirtualMachineInstance, VirtualMachineInstanceMigration, well_known,
};
use serde_json::{Value, json};

use super::decide::{ABORT_REQUESTED_CONDITION, FINALIZER, Facts, HandOff, Plan, decide};
use super::target_pod::{MIGRATION_JOB_UID_LABEL, make_target};
use crate::context::{CACHE_WAIT, Context};
use crate::template::{RenderContext, render_launcher_pod};
use crate::vmi::decide::PodView;
use crate::writes::Write;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("cannot render the target pod: {0}")]
    Render(String),
}

impl crate::context::ReconcileError for Error {
    fn kube(&self) -> Option<&kube::Error> {
        match self {
            Error::Kube(e) => Some(e),
            Error::Render(_) => None,
        }
    }
}

pub fn controller(
    migrations: impl futures::Stream<
        Item = Result<VirtualMachineInstanceMigration, kube::runtime::watcher::Error>,
    > + Send
    + 'static,
    store: Store<VirtualMachineInstanceMigration>,
    related: impl futures::Stream<Item = ObjectRef<VirtualMachineInstanceMigration>> + Send + 'static,
) -> Controller<VirtualMachineInstanceMigration> {
    Controller::for_stream(migrations, store).reconcile_on(related)
}

/// The migrations of a VMI (`spec.vmiName` in its namespace), for reconcile triggers.
pub fn migrations_of(
    store: &Store<VirtualMachineInstanceMigration>,
    namespace: &str,
    vmi_name: &str,
) -> Vec<ObjectRef<VirtualMachineInstanceMigration>> {
    store
        .state()
        .iter()
        .filter(|m| {
            m.metadata.namespace.as_deref() == Some(namespace)
                && m.spec.vmi_name.as_deref() == Some(vmi_name)
        })
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// The migration a target pod is for (its `kubevirt.io/migrationJobUID` label).
pub fn migration_of_pod(
    store: &Store<VirtualMachineInstanceMigration>,
    pod: &Pod,
) -> Option<ObjectRef<VirtualMachineInstanceMigration>> {
    let uid = pod.labels().get(MIGRATION_JOB_UID_LABEL)?;
    store
        .state()
        .iter()
        .find(|m| m.metadata.uid.as_deref() == Some(uid.as_str()))
        .map(|m| ObjectRef::from_obj(m.as_ref()))
}

fn controlled_by(pod: &Pod, uid: &str) -> bool {
    pod.owner_references()
        .iter()
        .any(|r| r.controller == Some(true) && r.uid == uid)
}

pub async fn reconcile(
    migration: Arc<VirtualMachineInstanceMigration>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let namespace = migration.namespace().unwrap_or_default();
    let name = migration.name_any();
    let uid = migration.metadata.uid.clone().unwrap_or_default();
    let vmi_name = migration.spec.vmi_name.clone().unwrap_or_default();
    let vmi = ctx
        .vmis
        .get(&ObjectRef::new(&vmi_name).within(&namespace))
        .map(|v| (*v).clone());
    let vmi_uid = vmi
        .as_ref()
        .and_then(|v| v.metadata.uid.clone())
        .unwrap_or_default();
    let pods: Vec<Pod> = ctx
        .pods
        .state()
        .iter()
        .filter(|p| {
            p.metadata.namespace.as_deref() == Some(namespace.as_str())
                && !vmi_uid.is_empty()
                && controlled_by(p, &vmi_uid)
        })
        .map(|p| (**p).clone())
        .collect();
    let target = pods
        .iter()
        .find(|p| p.labels().get(MIGRATION_JOB_UID_LABEL) == Some(&uid))
        .map(PodView::from_pod);
    let vmi_node = vmi
        .as_ref()
        .and_then(|v| v.status.as_ref()?.node_name.clone());
    let source = pods
        .iter()
        .filter(|p| !p.labels().contains_key(MIGRATION_JOB_UID_LABEL))
        .map(PodView::from_pod)
        .find(|p| p.node_name.is_some() && p.node_name == vmi_node);
    let target_pod_expected = {
        let mut created = ctx
            .created_target_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        created.retain(|_, at| at.elapsed() < CACHE_WAIT);
        target.is_none() && created.contains_key(&uid)
    };
    let created_at = migration.metadata.creation_timestamp.clone();
    let older_unfinished = ctx.migrations.state().iter().any(|m| {
        m.metadata.namespace.as_deref() == Some(namespace.as_str())
            && m.spec.vmi_name.as_deref() == Some(vmi_name.as_str())
            && m.metadata.uid.as_deref() != Some(uid.as_str())
            && !m.phase().is_final()
            && (
                m.metadata.creation_timestamp.as_ref().map(|t| t.0),
                m.name_any(),
            ) < (created_at.as_ref().map(|t| t.0), name.clone())
    });
    let plan = decide(&Facts {
        migration: &migration,
        vmi: vmi.as_ref(),
        target_pod: target.as_ref(),
        source_pod: source.as_ref(),
        older_unfinished,
        target_pod_expected,
        now: k8s_openapi::jiff::Timestamp::now(),
    });
    tracing::debug!(migration = %name, ?plan, "migration plan");
    let vmi_api: Api<VirtualMachineInstance> = ctx.api(&namespace);
    let pod_api: Api<Pod> = ctx.api(&namespace);

    if let (Some(reason), Some(vmi)) = (&plan.fail_vmi_migration, &vmi) {
        fail_vmi_migration(&ctx, &vmi_api, vmi, &uid, reason).await?;
    }
    if plan.create_target_pod
        && let Some(vmi) = &vmi
    {
        let config = ctx.config();
        let pod = render_launcher_pod(
            vmi,
            &config,
            &RenderContext {
                qemu_timeout_jitter_seconds: rand::random_range(
                    0..crate::template::QEMU_TIMEOUT_JITTER_RANGE,
                ),
                ..Default::default()
            },
        )
        .map_err(|e| Error::Render(e.to_string()))?;
        let pod = make_target(pod, vmi, &migration);
        let created = pod_api.create(&PostParams::default(), &pod).await?;
        ctx.writes.record(Write::PodCreate);
        ctx.created_target_pods
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(uid.clone(), Instant::now());
        ctx.event(
            migration.as_ref(),
            false,
            "SuccessfulCreate",
            format!(
                "Created migration target pod {}/{}",
                namespace,
                created.name_any()
            ),
        )
        .await;
    }
    if let (Some(hand_off), Some(vmi)) = (&plan.hand_off, &vmi) {
        hand_off_vmi(&ctx, &vmi_api, vmi, &uid, hand_off).await?;
    }
    if let (Some(target), Some(vmi)) = (&plan.relabel, &vmi) {
        let labels = json!({"metadata": {
            "resourceVersion": vmi.resource_version(),
            "labels": {well_known::MIGRATION_TARGET_NODE_NAME_LABEL: target},
        }});
        let written = vmi_api
            .patch(&vmi_name, &PatchParams::default(), &Patch::Merge(&labels))
            .await?;
        ctx.writes.record(Write::VmiPatch);
        ctx.wrote_vmi(&written);
    }
    if plan.request_abort
        && let Some(vmi) = &vmi
    {
        let patch = json!({
            "metadata": {"resourceVersion": vmi.resource_version()},
            "status": {"migrationState": {"abortRequested": true}},
        });
        proto::kubevirt::status_write::patch_vmi_status(&vmi_api, &vmi_name, &patch).await?;
        ctx.writes.record(Write::VmiStatusPatch);
    }
    if let Some(pod) = &plan.delete_target_pod {
        match pod_api.delete(pod, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.writes.record(Write::PodDelete);
                // Said once: a repeat (the cache not showing the deletion yet) finds no pod.
                if let Some(why) = &plan.target_pod_timed_out {
                    tracing::info!(migration = %name, %pod, why, "deleted the pending migration target pod");
                    ctx.event(migration.as_ref(), false, "SuccessfulDelete", why.clone())
                        .await;
                }
            }
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    write_status(&ctx, &migration, &plan).await?;
    if let Some(failure) = &plan.failure {
        ctx.event(
            migration.as_ref(),
            true,
            "FailedMigration",
            format!("Migration failed: {failure}"),
        )
        .await;
    }
    if plan.phase == Some(proto::kubevirt::MigrationPhase::Succeeded) {
        ctx.event(
            migration.as_ref(),
            false,
            "SuccessfulMigration",
            format!("Source node reported migration succeeded for VMI {vmi_name}"),
        )
        .await;
    }
    if plan.remove_finalizer {
        let api: Api<VirtualMachineInstanceMigration> = ctx.api(&namespace);
        let finalizers: Vec<&String> = migration
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        let patch = json!({"metadata": {
            "resourceVersion": migration.resource_version(),
            "finalizers": finalizers,
        }});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        ctx.writes.record(Write::MigrationPatch);
    }
    Ok(Action::requeue(
        plan.requeue_after.unwrap_or(Duration::from_secs(60)),
    ))
}

/// The migration's status: its phase (with the transition's time), the abort condition,
/// the VMI's final migration state.
async fn write_status(
    ctx: &Context,
    migration: &VirtualMachineInstanceMigration,
    plan: &Plan,
) -> Result<(), Error> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let old = migration.status.clone().unwrap_or_default();
    let mut status = serde_json::Map::new();
    if let Some(phase) = plan.phase {
        let mut transitions =
            serde_json::to_value(&old.phase_transition_timestamps).unwrap_or_else(|_| json!([]));
        if let Some(list) = transitions.as_array_mut() {
            list.push(json!({"phase": phase, "phaseTransitionTimestamp": now}));
        }
        status.insert("phase".into(), json!(phase));
        status.insert("phaseTransitionTimestamps".into(), transitions);
    }
    if plan.abort_condition {
        let mut conditions = serde_json::to_value(&old.conditions).unwrap_or_else(|_| json!([]));
        if let Some(list) = conditions.as_array_mut() {
            list.push(json!({
                "type": ABORT_REQUESTED_CONDITION,
                "status": "True",
                "lastProbeTime": null,
                "lastTransitionTime": now,
            }));
        }
        status.insert("conditions".into(), conditions);
    }
    if let Some(state) = &plan.copy_state {
        status.insert(
            "migrationState".into(),
            serde_json::to_value(state).unwrap_or(Value::Null),
        );
    }
    if status.is_empty() {
        return Ok(());
    }
    let api: Api<VirtualMachineInstanceMigration> =
        ctx.api(&migration.namespace().unwrap_or_default());
    let patch = json!({
        "metadata": {"resourceVersion": migration.resource_version()},
        "status": status,
    });
    api.patch_status(
        &migration.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    ctx.writes.record(Write::MigrationPatch);
    Ok(())
}

/// The hand-off (`handleTargetPodHandoff`): the VMI's migration state starts afresh for
/// this migration, then the label that makes the target node's handler look.
async fn hand_off_vmi(
    ctx: &Context,
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    uid: &str,
    hand_off: &HandOff,
) -> Result<(), Error> {
    let fresh = MigrationState {
        migration_uid: Some(uid.to_string()),
        source_node: Some(hand_off.source_node.clone()),
        source_pod: Some(hand_off.source_pod.clone()).filter(|p| !p.is_empty()),
        target_node: Some(hand_off.target_node.clone()),
        target_pod: Some(hand_off.target_pod.clone()),
        migration_configuration: Some(ctx.config().migrations.clone()),
        ..Default::default()
    };
    let mut state = serde_json::to_value(&fresh).unwrap_or_default();
    // A merge patch merges objects: whatever an earlier migration left goes explicitly.
    if let Some(old) = vmi
        .status
        .as_ref()
        .and_then(|s| s.migration_state.as_ref())
        .and_then(Value::as_object)
        && let Some(new) = state.as_object_mut()
    {
        for key in old.keys() {
            new.entry(key.clone()).or_insert(Value::Null);
        }
    }
    let name = vmi.name_any();
    let patch = json!({
        "metadata": {"resourceVersion": vmi.resource_version()},
        "status": {"migrationState": state},
    });
    let written = proto::kubevirt::status_write::patch_vmi_status(api, &name, &patch).await?;
    ctx.writes.record(Write::VmiStatusPatch);
    ctx.wrote_vmi(&written);
    let labels = json!({"metadata": {
        "resourceVersion": written.resource_version(),
        "labels": {well_known::MIGRATION_TARGET_NODE_NAME_LABEL: hand_off.target_node},
    }});
    let written = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&labels))
        .await?;
    ctx.writes.record(Write::VmiPatch);
    ctx.wrote_vmi(&written);
    Ok(())
}

/// Ends the VMI's migration state as failed (`Target pod is down`), guarded by the
/// migration UID: a state of another migration is left alone.
async fn fail_vmi_migration(
    ctx: &Context,
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    uid: &str,
    reason: &str,
) -> Result<(), Error> {
    let Ok(Some(state)) = vmi.migration_state() else {
        return Ok(());
    };
    if state.migration_uid.as_deref() != Some(uid) {
        return Ok(());
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let mut change = json!({
        "failed": true,
        "completed": true,
        "endTimestamp": now,
        "failureReason": reason,
    });
    if state.start_timestamp.is_none() {
        change["startTimestamp"] = json!(now);
    }
    let patch = json!({
        "metadata": {"resourceVersion": vmi.resource_version()},
        "status": {"migrationState": change},
    });
    let written =
        proto::kubevirt::status_write::patch_vmi_status(api, &vmi.name_any(), &patch).await?;
    ctx.writes.record(Write::VmiStatusPatch);
    ctx.wrote_vmi(&written);
    Ok(())
}
