//! The VM controller's reconcile: expectations, finalizers, the run strategy, the status.

use super::decide::{
    MAX_START_BACKOFF_SECONDS, RunAction, VmiFacts, change_request_done, decide_run, failed_early,
    first_change_request, printable_status, run_strategy, start_backoff_base,
};
use super::{Expectation, revision_name, vm_owner_reference, vmi_from_vm};
use crate::context::Context;
use crate::writes::Write;
use k8s_openapi::api::apps::v1::ControllerRevision;
use k8s_openapi::apimachinery::pkg::runtime::RawExtension;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use proto::kubevirt::well_known::{VM_CONTROLLER_FINALIZER, VM_GENERATION_ANNOTATION};
use proto::kubevirt::{Condition, Phase, VirtualMachine, VirtualMachineInstance};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Sync(String),
}

/// The VM controller: reconciles each VM of `vms` (the watch's objects, see
/// `crate::run::run`) and each VM named by `related` (owners of changed or deleted VMIs).
pub fn controller(
    vms: impl futures::Stream<Item = Result<VirtualMachine, kube::runtime::watcher::Error>>
    + Send
    + 'static,
    store: Store<VirtualMachine>,
    related: impl futures::Stream<Item = ObjectRef<VirtualMachine>> + Send + 'static,
) -> Controller<VirtualMachine> {
    Controller::for_stream(vms, store).reconcile_on(related)
}

impl crate::context::ReconcileError for Error {
    fn kube(&self) -> Option<&kube::Error> {
        match self {
            Error::Kube(e) => Some(e),
            Error::Sync(_) => None,
        }
    }
}

fn key(vm: &VirtualMachine) -> String {
    format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any())
}

pub async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action, Error> {
    let namespace = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let vm_uid = vm.metadata.uid.clone().unwrap_or_default();
    let vmi = ctx
        .vmis
        .get(&ObjectRef::new(&name).within(&namespace))
        .filter(|vmi| {
            vmi.owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && r.uid == vm_uid)
        });
    let cached = vmi.as_ref().map(|v| {
        (
            v.metadata.name.as_deref().unwrap_or_default(),
            v.metadata.uid.as_deref().unwrap_or_default(),
            v.metadata.deletion_timestamp.is_some(),
        )
    });
    if !ctx.vm_expectations.satisfied(&key(&vm), cached) {
        tracing::debug!(vm = %name, "waiting for the VMI cache");
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let vm_api: Api<VirtualMachine> = ctx.api(&namespace);
    let vmi_api: Api<VirtualMachineInstance> = ctx.api(&namespace);
    let mut vm = (*vm).clone();

    if vm.metadata.deletion_timestamp.is_some() {
        match &vmi {
            None => {
                if vm.finalizers().iter().any(|f| f == VM_CONTROLLER_FINALIZER) {
                    let finalizers: Vec<_> = vm
                        .finalizers()
                        .iter()
                        .filter(|f| *f != VM_CONTROLLER_FINALIZER)
                        .cloned()
                        .collect();
                    patch_vm_metadata(&ctx, &vm_api, &vm, json!({"finalizers": finalizers}))
                        .await?;
                }
            }
            Some(vmi) => {
                stop_vmi(&ctx, &vm, vmi, &vmi_api).await?;
                let strategy = run_strategy(&vm).unwrap_or(proto::kubevirt::RunStrategy::Halted);
                update_status(&ctx, &vm, &vm_api, Some(vmi), strategy, (false, true), None).await?;
                release_final_vmi(&ctx, Some(vmi), &vmi_api).await?;
            }
        }
        return Ok(Action::await_change());
    }
    // The finalizer and v1.9.0's API-version annotations.
    if let Some(metadata) =
        crate::context::first_metadata_patch(&vm.metadata, Some(VM_CONTROLLER_FINALIZER))
    {
        vm = patch_vm_metadata(&ctx, &vm_api, &vm, metadata).await?;
    }

    let vmi = match vmi {
        Some(current) => Some(
            bump_generation_annotation(&ctx, &vm, &current, &vmi_api)
                .await?
                .map_or(current, Arc::new),
        ),
        None => None,
    };

    let strategy = run_strategy(&vm).map_err(Error::Sync)?;
    let request = first_change_request(&vm);
    let facts = vmi.as_deref().map(VmiFacts::of);
    let status = vm.status.clone().unwrap_or_default();
    let backoff_left = backoff_left(&status);
    let action = decide_run(
        strategy,
        facts.as_ref(),
        request.as_ref(),
        status.run_strategy,
        backoff_left,
    );
    tracing::debug!(vm = %name, ?strategy, vmi = ?facts, ?request, ?action, "VM plan");
    let mut requeue = None;
    let mut sync_error = None;
    // For the printable status: a start or stop this reconcile made, not yet in the cache.
    let (mut start_expected, mut stop_expected) = (false, false);
    match action {
        Ok(RunAction::Nothing) => {}
        Ok(RunAction::Start) => match start_vmi(&ctx, &vm, &vmi_api).await {
            Ok(()) => start_expected = true,
            Err(e) => sync_error = Some(e.to_string()),
        },
        Ok(RunAction::Stop {
            request_start: start,
        }) => {
            if let Some(vmi) = &vmi {
                stop_vmi(&ctx, &vm, vmi, &vmi_api).await?;
                stop_expected = true;
            }
            if start {
                // Written at once and on its own (like `addStartRequest`): the next
                // reconcile sees a VMI being deleted and would not ask again.
                let mut requests = vm.status.clone().unwrap_or_default().state_change_requests;
                requests.push(json!({"action": "Start"}));
                let patch = json!({"status": {"stateChangeRequests": requests}});
                vm = vm_api
                    .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                ctx.writes.record(Write::VmStatusPatch);
            }
        }
        Ok(RunAction::WaitBackoff(seconds)) => requeue = Some(Duration::from_secs(seconds)),
        Err(e) => sync_error = Some(e),
    }

    update_status(
        &ctx,
        &vm,
        &vm_api,
        vmi.as_deref(),
        strategy,
        (start_expected, stop_expected),
        sync_error.as_deref(),
    )
    .await?;

    release_final_vmi(&ctx, vmi.as_deref(), &vmi_api).await?;

    if let Some(error) = sync_error {
        return Err(Error::Sync(error));
    }
    Ok(requeue.map_or_else(
        || Action::requeue(Duration::from_secs(300)),
        Action::requeue,
    ))
}

/// Removes the VM controller's finalizer from a final VMI: the VM has seen how it ended.
async fn release_final_vmi(
    ctx: &Context,
    vmi: Option<&VirtualMachineInstance>,
    vmi_api: &Api<VirtualMachineInstance>,
) -> Result<(), Error> {
    let Some(vmi) = vmi.filter(|v| v.phase().is_final()) else {
        return Ok(());
    };
    if !vmi
        .finalizers()
        .iter()
        .any(|f| f == VM_CONTROLLER_FINALIZER)
    {
        return Ok(());
    }
    let finalizers: Vec<_> = vmi
        .finalizers()
        .iter()
        .filter(|f| *f != VM_CONTROLLER_FINALIZER)
        .cloned()
        .collect();
    let patch =
        json!({"metadata": {"resourceVersion": vmi.resource_version(), "finalizers": finalizers}});
    patch_vmi(ctx, vmi_api, vmi, &patch).await.map(drop)
}

/// A merge patch of the VMI, counted.
async fn patch_vmi(
    ctx: &Context,
    vmi_api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    patch: &serde_json::Value,
) -> Result<VirtualMachineInstance, Error> {
    let patched = vmi_api
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(patch),
        )
        .await?;
    ctx.writes.record(Write::VmiPatch);
    Ok(patched)
}

fn backoff_left(status: &proto::kubevirt::VirtualMachineStatus) -> u64 {
    let retry_after = status
        .start_failure
        .as_ref()
        .and_then(|f| f.get("retryAfterTimestamp"))
        .and_then(|t| t.as_str())
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok());
    retry_after.map_or(0, |t| {
        u64::try_from((t.with_timezone(&chrono::Utc) - chrono::Utc::now()).num_seconds())
            .unwrap_or(0)
    })
}

async fn patch_vm_metadata(
    ctx: &Context,
    api: &Api<VirtualMachine>,
    vm: &VirtualMachine,
    mut metadata: serde_json::Value,
) -> Result<VirtualMachine, Error> {
    metadata["resourceVersion"] = json!(vm.resource_version());
    let patched = api
        .patch(
            &vm.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": metadata})),
        )
        .await?;
    ctx.writes.record(Write::VmPatch);
    Ok(patched)
}

/// v1.9.0 `conditionallyBumpGenerationAnnotationOnVmi`: when the VM's generation moved on but
/// its template is still the one the VMI was started from (only the run strategy changed, as
/// `virtctl stop` or `start` change it), the VMI's `kubevirt.io/vm-generation` is brought up to
/// date, so the change asks for no restart (`RestartRequired`) and `observedGeneration`
/// follows. Returns the patched VMI, or `None` when nothing was to be done.
async fn bump_generation_annotation(
    ctx: &Context,
    vm: &VirtualMachine,
    vmi: &VirtualMachineInstance,
    vmi_api: &Api<VirtualMachineInstance>,
) -> Result<Option<VirtualMachineInstance>, Error> {
    let generation = vm.metadata.generation.unwrap_or(0);
    let annotated = vmi.annotations().get(VM_GENERATION_ANNOTATION);
    if annotated.is_some_and(|g| *g == generation.to_string())
        || vmi.metadata.deletion_timestamp.is_some()
    {
        return Ok(None);
    }
    // The start revision the VMI names (`status.virtualMachineRevisionName`, written when it
    // was created); a VMI without it, by the generation it was started from.
    let vm_uid = vm.metadata.uid.clone().unwrap_or_default();
    let named = vmi
        .status
        .as_ref()
        .and_then(|s| s.extra.get("virtualMachineRevisionName"))
        .and_then(|n| n.as_str())
        .map(str::to_string);
    let Some(revision_name) = named.or_else(|| {
        annotated
            .and_then(|g| g.parse::<i64>().ok())
            .map(|started| revision_name(&vm_uid, started))
    }) else {
        return Ok(None);
    };
    let revisions: Api<ControllerRevision> = ctx.api(&vm.namespace().unwrap_or_default());
    let Some(revision) = revisions.get_opt(&revision_name).await? else {
        return Ok(None);
    };
    let started_template = revision.data.0.get("spec").and_then(|s| s.get("template"));
    let template =
        serde_json::to_value(&vm.spec.template).map_err(|e| Error::Sync(e.to_string()))?;
    if started_template != Some(&template) {
        return Ok(None);
    }
    let patch =
        json!({"metadata": {"annotations": {VM_GENERATION_ANNOTATION: generation.to_string()}}});
    patch_vmi(ctx, vmi_api, vmi, &patch).await.map(Some)
}

/// Records the started spec as a ControllerRevision, then creates the VMI.
async fn start_vmi(
    ctx: &Context,
    vm: &VirtualMachine,
    vmi_api: &Api<VirtualMachineInstance>,
) -> Result<(), Error> {
    let namespace = vm.namespace().unwrap_or_default();
    let vm_uid = vm.metadata.uid.clone().unwrap_or_default();
    let generation = vm.metadata.generation.unwrap_or(0);
    let revision = revision_name(&vm_uid, generation);

    // Older start revisions of this VM are replaced.
    let revisions: Api<ControllerRevision> = ctx.api(&namespace);
    let prefix = format!("revision-start-vm-{vm_uid}-");
    for old in revisions.list(&ListParams::default()).await? {
        let old_name = old.name_any();
        if old_name.starts_with(&prefix) && old_name != revision {
            match revisions.delete(&old_name, &DeleteParams::default()).await {
                Ok(_) => ctx.writes.record(Write::RevisionDelete),
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    let data = serde_json::to_value(&vm.spec).map_err(|e| Error::Sync(e.to_string()))?;
    let controller_revision = ControllerRevision {
        metadata: kube::api::ObjectMeta {
            name: Some(revision.clone()),
            namespace: Some(namespace.clone()),
            owner_references: vm_owner_reference(vm).map(|r| vec![r]),
            ..Default::default()
        },
        data: RawExtension(json!({"spec": data})),
        revision: Some(generation),
    };
    match revisions
        .create(&PostParams::default(), &controller_revision)
        .await
    {
        Ok(_) => ctx.writes.record(Write::RevisionCreate),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }

    let mut vmi = vmi_from_vm(vm).map_err(Error::Sync)?;
    // What virt-api's webhook would add on create (there is none in this deployment).
    crate::defaults::apply_vmi(&mut vmi, &ctx.config());
    let vmi_name = vmi.name_any();
    ctx.vm_expectations
        .expect(&key(vm), Expectation::Creation(vmi_name.clone()));
    let created = match vmi_api.create(&PostParams::default(), &vmi).await {
        Ok(created) => created,
        Err(e) => {
            ctx.vm_expectations.forget(&key(vm));
            ctx.event(
                vm,
                true,
                "FailedCreate",
                format!("Error creating virtual machine instance: {e}"),
            )
            .await;
            return Err(e.into());
        }
    };
    ctx.writes.record(Write::VmiCreate);
    // The status is not part of a create when the CRD has a status subresource.
    let patch = json!({"status": {"virtualMachineRevisionName": revision}});
    proto::kubevirt::status_write::patch_vmi_status(vmi_api, &vmi_name, &patch).await?;
    ctx.writes.record(Write::VmiStatusPatch);
    tracing::info!(vm = %vm.name_any(), uid = ?created.metadata.uid, "started VM by creating a VMI");
    ctx.event(
        vm,
        false,
        "SuccessfulCreate",
        format!(
            "Started the virtual machine by creating the new virtual machine instance {vmi_name}"
        ),
    )
    .await;
    Ok(())
}

async fn stop_vmi(
    ctx: &Context,
    vm: &VirtualMachine,
    vmi: &VirtualMachineInstance,
    vmi_api: &Api<VirtualMachineInstance>,
) -> Result<(), Error> {
    if vmi.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    ctx.vm_expectations
        .expect(&key(vm), Expectation::Deletion(uid.clone()));
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    match vmi_api.delete(&vmi.name_any(), &params).await {
        Ok(_) => ctx.writes.record(Write::VmiDelete),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            ctx.vm_expectations.forget(&key(vm));
            ctx.event(
                vm,
                true,
                "FailedDelete",
                format!(
                    "Error deleting virtual machine instance {}: {e}",
                    vmi.name_any()
                ),
            )
            .await;
            return Err(e.into());
        }
    }
    ctx.event(
        vm,
        false,
        "SuccessfulDelete",
        format!("Stopped the virtual machine by deleting the virtual machine instance {uid}"),
    )
    .await;
    Ok(())
}

/// v1.9.0's `UpdateCondition`: a condition of a new type is appended; one of a known type is
/// replaced only when its status or reason changed (its times then say when it changed).
fn update_condition(conditions: &mut Vec<Condition>, condition: Condition) {
    match conditions
        .iter_mut()
        .find(|c| c.condition_type == condition.condition_type)
    {
        Some(known) => {
            if known.status != condition.status || known.reason != condition.reason {
                *known = condition;
            }
        }
        None => conditions.push(condition),
    }
}

/// v1.9.0 `syncConditions` without the failure: the VM's `Ready` from the VMI's (or why
/// there is none, at `time`); while there is a VMI, its other conditions copied and the VM's
/// conditions it no longer has removed (`Failure` and `RestartRequired` are the VM's own).
fn sync_conditions(
    conditions: &mut Vec<Condition>,
    vmi: Option<&VirtualMachineInstance>,
    time: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) {
    const NOT_COPIED: [&str; 3] = ["Ready", "Failure", "RestartRequired"];
    let not_ready = |reason: &str, message: &str| Condition {
        condition_type: "Ready".into(),
        status: "False".into(),
        last_probe_time: Some(time.clone()),
        last_transition_time: Some(time.clone()),
        reason: Some(reason.into()),
        message: Some(message.into()),
        extra: Default::default(),
    };
    let ready = match vmi {
        None => not_ready("VMINotExists", "VMI does not exist"),
        Some(vmi) => match vmi.condition("Ready") {
            Some(condition) => condition.clone(),
            None => not_ready("VMIConditionMissing", "VMI is missing the Ready condition"),
        },
    };
    update_condition(conditions, ready);
    let Some(vmi) = vmi else {
        return;
    };
    let copied: Vec<&Condition> = vmi
        .status
        .iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| !NOT_COPIED.contains(&c.condition_type.as_str()))
        .collect();
    for condition in &copied {
        update_condition(conditions, (*condition).clone());
    }
    conditions.retain(|c| {
        NOT_COPIED.contains(&c.condition_type.as_str())
            || copied.iter().any(|v| v.condition_type == c.condition_type)
    });
}

#[allow(clippy::too_many_arguments)]
async fn update_status(
    ctx: &Context,
    vm: &VirtualMachine,
    api: &Api<VirtualMachine>,
    vmi: Option<&VirtualMachineInstance>,
    strategy: proto::kubevirt::RunStrategy,
    (start_expected, stop_expected): (bool, bool),
    sync_error: Option<&str>,
) -> Result<(), Error> {
    let old = vm.status.clone().unwrap_or_default();
    let mut new = old.clone();
    let now = chrono::Utc::now();
    // `created` and `ready` are omitted when false (Go's `omitempty`), as v1.9.0 stores them.
    new.created = vmi.is_some().then_some(true);
    let vmi_ready = vmi
        .and_then(|v| v.condition("Ready"))
        .is_some_and(Condition::is_true);
    new.ready = vmi_ready.then_some(true);
    if old.run_strategy.is_some() || vmi.is_some() {
        new.run_strategy = Some(strategy);
    }

    // Generations: what the running VMI was started from.
    if let Some(generation) = vmi
        .and_then(|v| v.annotations().get(VM_GENERATION_ANNOTATION).cloned())
        .and_then(|g| g.parse::<i64>().ok())
    {
        new.observed_generation = Some(generation);
    }
    new.desired_generation = vm.metadata.generation;

    // State-change requests: drop the served one.
    let facts = vmi.map(VmiFacts::of);
    if change_request_done(first_change_request(vm).as_ref(), facts.as_ref())
        && !new.state_change_requests.is_empty()
    {
        new.state_change_requests.remove(0);
    }

    // Start failures: reset once a VMI ran; count a VMI that ended without running.
    if let Some(vmi) = vmi {
        let ran = vmi.status.as_ref().is_some_and(|s| {
            s.phase_transition_timestamps
                .iter()
                .any(|t| t.phase == Phase::Running)
        });
        let restarting = matches!(
            strategy,
            proto::kubevirt::RunStrategy::Always
                | proto::kubevirt::RunStrategy::RerunOnFailure
                | proto::kubevirt::RunStrategy::Once
        );
        if ran || !restarting {
            new.start_failure = None;
        } else if failed_early(vmi) {
            let uid = vmi.metadata.uid.clone().unwrap_or_default();
            let previous = old.start_failure.as_ref();
            let counted = previous
                .and_then(|f| f.get("lastFailedVMIUID"))
                .and_then(|u| u.as_str())
                == Some(uid.as_str());
            if !counted {
                let count = previous
                    .and_then(|f| f.get("consecutiveFailCount"))
                    .and_then(|c| c.as_u64())
                    .map_or(1, |c| c + 1);
                let base = start_backoff_base(
                    u32::try_from(count).unwrap_or(u32::MAX),
                    MAX_START_BACKOFF_SECONDS,
                );
                let delay =
                    (base + rand::random_range(0..=base / 2)).min(MAX_START_BACKOFF_SECONDS);
                let retry_after =
                    now + chrono::Duration::seconds(i64::try_from(delay).unwrap_or(i64::MAX / 2));
                new.start_failure = Some(json!({
                    "lastFailedVMIUID": uid,
                    "retryAfterTimestamp": retry_after.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    "consecutiveFailCount": count,
                }));
            }
        }
    }

    // Conditions (v1.9.0 `syncConditions`): Ready from the VMI's; every other condition of the
    // VMI copied, and those it no longer has removed, while there is a VMI; Failure carries a
    // sync error; RestartRequired when the spec moved past the generation the VMI was started
    // from.
    let time =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let upsert = |conditions: &mut Vec<Condition>,
                  kind: &str,
                  status: &str,
                  reason: Option<&str>,
                  message: Option<String>| {
        update_condition(
            conditions,
            Condition {
                condition_type: kind.into(),
                status: status.into(),
                last_probe_time: None,
                last_transition_time: Some(time.clone()),
                reason: reason.map(str::to_string),
                message,
                extra: Default::default(),
            },
        );
    };
    sync_conditions(&mut new.conditions, vmi, &time);
    match sync_error {
        Some(message) => upsert(
            &mut new.conditions,
            "Failure",
            "True",
            Some("FailedCreate"),
            Some(message.into()),
        ),
        None => new.conditions.retain(|c| c.condition_type != "Failure"),
    }
    let restart_required = vmi.is_some_and(|v| !v.phase().is_final())
        && new.observed_generation.is_some()
        && new.observed_generation != vm.metadata.generation;
    if restart_required {
        upsert(
            &mut new.conditions,
            "RestartRequired",
            "True",
            None,
            Some("a non-live-updatable field was changed in the template spec".into()),
        );
    } else {
        new.conditions
            .retain(|c| c.condition_type != "RestartRequired");
    }

    let in_backoff = backoff_left(&new) > 0;
    new.printable_status = Some(
        printable_status(
            vm.metadata.deletion_timestamp.is_some(),
            vmi,
            start_expected,
            stop_expected,
            in_backoff,
        )
        .into(),
    );

    if new == old {
        return Ok(());
    }
    let patch = json!({
        "metadata": {"resourceVersion": vm.resource_version()},
        "status": crate::context::merge_diff(
            &serde_json::to_value(&old).map_err(|e| Error::Sync(e.to_string()))?,
            &serde_json::to_value(&new).map_err(|e| Error::Sync(e.to_string()))?,
        ),
    });
    api.patch_status(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await?;
    ctx.writes.record(Write::VmStatusPatch);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::decide::ChangeRequest;

    #[test]
    fn conditions_follow_the_vmis_as_v1_9_0_syncs_them() {
        let time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let vmi = |conditions: serde_json::Value| -> VirtualMachineInstance {
            serde_json::from_value(json!({
                "metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}},
                "status": {"conditions": conditions},
            }))
            .unwrap()
        };
        let kinds = |conditions: &[Condition]| -> Vec<(String, String, Option<String>)> {
            conditions
                .iter()
                .map(|c| (c.condition_type.clone(), c.status.clone(), c.reason.clone()))
                .collect()
        };
        let owned = |k: &str, s: &str, r: Option<&str>| {
            (k.to_string(), s.to_string(), r.map(str::to_string))
        };

        // No VMI: Ready False VMINotExists, probed and changed now.
        let mut conditions = Vec::new();
        sync_conditions(&mut conditions, None, &time);
        assert_eq!(
            kinds(&conditions),
            vec![owned("Ready", "False", Some("VMINotExists"))]
        );
        assert_eq!(conditions[0].last_probe_time, Some(time.clone()));

        // A running, paused VMI: its Ready and Paused copied (times and all).
        let paused = vmi(json!([
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-05T01:00:00Z"},
            {"type": "Paused", "status": "True", "reason": "PausedByUser", "message": "VMI was paused by user"},
        ]));
        sync_conditions(&mut conditions, Some(&paused), &time);
        assert_eq!(
            kinds(&conditions),
            vec![
                owned("Ready", "True", None),
                owned("Paused", "True", Some("PausedByUser"))
            ]
        );
        assert_eq!(conditions[0], paused.condition("Ready").unwrap().clone());

        // Unpaused: Paused goes; the VM's own Failure stays.
        conditions.push(Condition {
            condition_type: "Failure".into(),
            status: "True".into(),
            last_probe_time: None,
            last_transition_time: None,
            reason: Some("FailedCreate".into()),
            message: None,
            extra: Default::default(),
        });
        let running = vmi(json!([{"type": "Ready", "status": "True", "message": "new text"}]));
        sync_conditions(&mut conditions, Some(&running), &time);
        assert_eq!(
            kinds(&conditions),
            vec![
                owned("Ready", "True", None),
                owned("Failure", "True", Some("FailedCreate"))
            ]
        );
        // Same status and reason: the condition is kept as it was (v1.9.0's UpdateCondition).
        assert_eq!(conditions[0].message, None);

        // A VMI without Ready.
        sync_conditions(&mut conditions, Some(&vmi(json!([]))), &time);
        assert_eq!(conditions[0].reason.as_deref(), Some("VMIConditionMissing"));
    }

    #[test]
    fn backoff_is_read_from_the_status() {
        let mut status = proto::kubevirt::VirtualMachineStatus::default();
        assert_eq!(backoff_left(&status), 0);
        let later = chrono::Utc::now() + chrono::Duration::seconds(60);
        status.start_failure = Some(
            json!({"retryAfterTimestamp": later.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)}),
        );
        let left = backoff_left(&status);
        assert!((55..=60).contains(&left), "{left}");
        status.start_failure = Some(json!({"retryAfterTimestamp": "not a time"}));
        assert_eq!(backoff_left(&status), 0);
    }

    #[test]
    fn request_start_is_a_change_request() {
        assert_eq!(
            first_change_request(&serde_json::from_value(json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine", "metadata": {"name": "v"},
                "spec": {"template": {}}, "status": {"stateChangeRequests": [{"action": "Start"}]}})).unwrap()),
            Some(ChangeRequest::Start)
        );
    }
}
