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
    if !vm.finalizers().iter().any(|f| f == VM_CONTROLLER_FINALIZER) {
        let mut finalizers = vm.finalizers().to_vec();
        finalizers.push(VM_CONTROLLER_FINALIZER.into());
        vm = patch_vm_metadata(&ctx, &vm_api, &vm, json!({"finalizers": finalizers})).await?;
    }

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
    vmi_api
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    ctx.writes.record(Write::VmiPatch);
    Ok(())
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
    new.created = Some(vmi.is_some());
    let vmi_ready = vmi.is_some_and(|v| {
        v.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.condition_type == "Ready" && c.status == "True")
        })
    });
    new.ready = Some(vmi_ready);
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

    // Conditions: Ready mirrors the VMI; Failure carries a sync error; RestartRequired when
    // the spec moved past the generation the VMI was started from.
    let time =
        k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now());
    let upsert = |conditions: &mut Vec<Condition>,
                  kind: &str,
                  status: &str,
                  reason: Option<&str>,
                  message: Option<String>| {
        let index = conditions.iter().position(|c| c.condition_type == kind);
        let same = index.and_then(|i| conditions.get(i)).is_some_and(|c| {
            c.status == status && c.reason.as_deref() == reason && c.message == message
        });
        if same {
            return;
        }
        let condition = Condition {
            condition_type: kind.into(),
            status: status.into(),
            last_probe_time: None,
            last_transition_time: Some(time.clone()),
            reason: reason.map(str::to_string),
            message,
            extra: Default::default(),
        };
        match index {
            Some(i) => conditions[i] = condition,
            None => conditions.push(condition),
        }
    };
    match vmi {
        Some(_) if vmi_ready => upsert(&mut new.conditions, "Ready", "True", None, None),
        Some(_) => upsert(
            &mut new.conditions,
            "Ready",
            "False",
            Some("VMINotReady"),
            Some("VMI is not ready".into()),
        ),
        None => upsert(
            &mut new.conditions,
            "Ready",
            "False",
            Some("VMINotExists"),
            Some("VMI does not exist".into()),
        ),
    }
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
