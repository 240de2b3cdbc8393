//! The VMI controller's reconcile: read the caches, [`decide`], write what the plan says.

use super::decide::{PodView, VmiPlan, decide};
use crate::context::{CACHE_WAIT, Context};
use crate::template::{PvcInfo, RenderContext, TemplateConfig, render_launcher_pod};
use crate::writes::Write;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, ResourceExt};
use proto::kubevirt::well_known::{FOREGROUND_DELETE_FINALIZER, NODE_NAME_LABEL};
use proto::kubevirt::{
    Condition, Phase, PhaseTransitionTimestamp, VirtualMachineInstance, VolumeStatus,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("{0}")]
    Render(String),
    #[error("encoding: {0}")]
    Json(#[from] serde_json::Error),
}

/// The VMI controller: reconciles each VMI of `vmis` (the watch's objects, see
/// `crate::run::run`) and each VMI named by `related` (owners of changed or deleted pods).
pub fn controller(
    vmis: impl futures::Stream<Item = Result<VirtualMachineInstance, kube::runtime::watcher::Error>>
    + Send
    + 'static,
    store: Store<VirtualMachineInstance>,
    related: impl futures::Stream<Item = ObjectRef<VirtualMachineInstance>> + Send + 'static,
) -> Controller<VirtualMachineInstance> {
    Controller::for_stream(vmis, store).reconcile_on(related)
}

impl crate::context::ReconcileError for Error {
    fn kube(&self) -> Option<&kube::Error> {
        match self {
            Error::Kube(e) => Some(e),
            Error::Render(_) | Error::Json(_) => None,
        }
    }
}

/// The pods controlled by `uid`, from the cache plus those created and not yet cached.
fn controlled_pods(ctx: &Context, namespace: &str, uid: &str) -> Vec<PodView> {
    let controlled = |pod: &Pod| {
        pod.metadata.namespace.as_deref() == Some(namespace)
            && pod
                .owner_references()
                .iter()
                .any(|r| r.controller == Some(true) && r.uid == uid)
    };
    let mut pods: Vec<PodView> = ctx
        .pods
        .state()
        .iter()
        .filter(|p| controlled(p))
        .map(|p| PodView::from_pod(p))
        .collect();
    let mut created = ctx.created_pods.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((pod, since)) = created.get(uid) {
        let name = pod.metadata.name.clone().unwrap_or_default();
        if pods.iter().any(|p| p.name == name) || since.elapsed() > CACHE_WAIT {
            created.remove(uid);
        } else {
            pods.push(PodView::from_pod(pod));
        }
    }
    pods
}

fn owner_vm_exists(ctx: &Context, vmi: &VirtualMachineInstance) -> bool {
    let Some(owner) = vmi
        .owner_references()
        .iter()
        .find(|r| r.controller == Some(true) && r.kind == "VirtualMachine")
    else {
        return false;
    };
    let namespace = vmi.namespace().unwrap_or_default();
    ctx.vms
        .get(&kube::runtime::reflector::ObjectRef::new(&owner.name).within(&namespace))
        .is_some_and(|vm| vm.metadata.uid.as_deref() == Some(owner.uid.as_str()))
}

pub async fn reconcile(
    vmi: Arc<VirtualMachineInstance>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    if !ctx.vmi_cache_current(&vmi) {
        // Our last write is not in the cache yet; its watch event brings us back.
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let namespace = vmi.namespace().unwrap_or_default();
    let name = vmi.name_any();
    let uid = vmi.metadata.uid.clone().unwrap_or_default();
    let pods = controlled_pods(&ctx, &namespace, &uid);
    let mut plan = decide(&vmi, &pods, owner_vm_exists(&ctx, &vmi));
    tracing::debug!(vmi = %name, ?plan, "VMI plan");
    let api: Api<VirtualMachineInstance> = ctx.api(&namespace);
    let mut current: VirtualMachineInstance = (*vmi).clone();
    // The cluster configuration as it is now (the KubeVirt CR): new pods get it, existing
    // ones keep theirs.
    let config = ctx.config();

    // The foreground finalizer (a new VMI) and v1.9.0's API-version annotations.
    let finalizer = plan
        .add_foreground_finalizer
        .then_some(FOREGROUND_DELETE_FINALIZER);
    if let Some(metadata) = crate::context::first_metadata_patch(&current.metadata, finalizer) {
        current = patch_metadata(&ctx, &api, &current, metadata).await?;
    }

    // A VMI created directly never went through virt-api's mutating webhook (there is none
    // here): store its defaults before the first pod, as the webhook would have at creation,
    // so the handler and the launcher see the same spec KubeVirt's would (a default pod
    // interface, ACPI, ...). VMIs the VM controller creates are stored defaulted already.
    if plan.create_pod {
        let mut defaulted = current.clone();
        crate::defaults::apply_vmi(&mut defaulted, &config);
        if defaulted.spec != current.spec
            || defaulted.metadata.annotations != current.metadata.annotations
        {
            current = store_defaults(&ctx, &api, &current, &defaulted).await?;
        }
    }

    let mut created_pod = None;
    let mut sync_failure = None;
    if plan.create_pod {
        let attempt = match crate::admission::refusal(&current, &config) {
            // What virt-api would have refused at creation: no pod, ever, for this spec.
            Some(refusal) => Err(SyncFailure {
                reason: FAILED_CREATE.into(),
                message: format!("{RENDER_FAILED}: {refusal}"),
                permanent: true,
            }),
            None => create_pod(&ctx, &current, &config, plan.admission_attempt).await,
        };
        match attempt {
            Ok(pod) => created_pod = Some(pod),
            Err(failure) => {
                without_pod(&mut plan, &current);
                sync_failure = Some(failure);
            }
        }
    }

    let patch_body = status_patch(
        &current,
        &plan,
        &pods,
        created_pod.as_ref(),
        sync_failure.as_ref(),
        &config,
    );
    // What the claims behind its volumes say, once the VMI has its volume statuses.
    let pvc_api: Api<PersistentVolumeClaim> = ctx.api(&namespace);
    let patch_body = super::claims::with_claim_info(&pvc_api, &current, patch_body).await;
    // A refusal is said once, when its condition first appears.
    let refusal_known = sync_failure.as_ref().is_some_and(|f| {
        current.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.condition_type == SYNCHRONIZED
                    && c.status == "False"
                    && c.message.as_deref() == Some(f.message.as_str())
            })
        })
    });
    if let Some(status) = patch_body {
        let patch = json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "status": status,
        });
        current = proto::kubevirt::status_write::patch_vmi_status(&api, &name, &patch).await?;
        ctx.writes.record(Write::VmiStatusPatch);
        ctx.wrote_vmi(&current);
    }
    if let Some(failure) = &plan.failure {
        ctx.event(&current, true, &failure.reason, failure.message.clone())
            .await;
    }
    if let Some(failure) = sync_failure {
        if failure.permanent {
            // A new spec would need a new VMI: nothing to retry.
            if !refusal_known {
                ctx.event(&current, true, &failure.reason, failure.message.clone())
                    .await;
            }
            return Ok(Action::requeue(Duration::from_secs(300)));
        }
        // The event is out already; the error policy retries.
        return Err(Error::Render(failure.message));
    }

    if let Some(node) = &plan.node_name {
        let mut labels = current.labels().clone();
        if labels.get(NODE_NAME_LABEL) != Some(node) {
            labels.insert(NODE_NAME_LABEL.into(), node.clone());
            current = patch_metadata(&ctx, &api, &current, json!({"labels": labels})).await?;
        }
    }

    let pod_api: Api<Pod> = ctx.api(&namespace);
    let gate = plan.set_unpaused.as_ref().filter(|(pod, unpaused)| {
        // Skip a write the pod cache has not caught up with yet.
        let uid = pods
            .iter()
            .find(|p| &p.name == pod)
            .map(|p| p.uid.clone())
            .unwrap_or_default();
        let mut written = ctx.pod_gates.lock().unwrap_or_else(|p| p.into_inner());
        written.retain(|_, (_, at)| at.elapsed() < CACHE_WAIT);
        let fresh = written
            .get(&uid)
            .is_some_and(|(value, _)| value == unpaused);
        if !fresh {
            written.insert(uid, (*unpaused, Instant::now()));
        }
        !fresh
    });
    if let Some((pod, unpaused)) = gate {
        let (status, reason) = if *unpaused {
            ("True", "NotPaused")
        } else {
            ("False", "Paused")
        };
        let patch = json!({"status": {"conditions": [{
            "type": crate::template::UNPAUSED_READINESS_GATE,
            "status": status,
            "reason": reason,
            "lastProbeTime": null,
            "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
        }]}});
        match pod_api
            .patch_status(pod, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
        {
            Ok(_) => ctx.writes.record(Write::PodPatch),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    for pod in &plan.delete_pods {
        match pod_api.delete(pod, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.writes.record(Write::PodDelete);
                ctx.event(
                    &current,
                    false,
                    "SuccessfulDelete",
                    format!("Deleted virtual machine pod {pod}"),
                )
                .await;
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(e) => {
                ctx.event(
                    &current,
                    true,
                    "FailedDelete",
                    format!("Failed to delete virtual machine pod {pod}"),
                )
                .await;
                return Err(e.into());
            }
        }
    }

    // A drain's eviction marked the VMI: a migration moves it off its node.
    let evacuation_wait = crate::migration::evacuation::reconcile(&ctx, &current).await?;

    if !plan.remove_finalizers.is_empty() {
        let finalizers: Vec<String> = current
            .finalizers()
            .iter()
            .filter(|f| !plan.remove_finalizers.contains(f))
            .cloned()
            .collect();
        patch_metadata(&ctx, &api, &current, json!({"finalizers": finalizers})).await?;
    }

    let requeue = plan.requeue_after.unwrap_or(Duration::from_secs(300));
    Ok(Action::requeue(
        evacuation_wait.map_or(requeue, |w| w.min(requeue)),
    ))
}

/// A merge patch of `metadata` guarded by the resource version (a conflict retries).
async fn patch_metadata(
    ctx: &Context,
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    mut metadata: serde_json::Value,
) -> Result<VirtualMachineInstance, Error> {
    metadata["resourceVersion"] = json!(vmi.resource_version());
    let patched = api
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": metadata})),
        )
        .await?;
    ctx.writes.record(Write::VmiPatch);
    ctx.wrote_vmi(&patched);
    Ok(patched)
}

/// Writes the webhook's defaults into a VMI created without them (spec and annotations, as
/// one merge patch guarded by the resource version).
async fn store_defaults(
    ctx: &Context,
    api: &Api<VirtualMachineInstance>,
    vmi: &VirtualMachineInstance,
    defaulted: &VirtualMachineInstance,
) -> Result<VirtualMachineInstance, Error> {
    let patch = json!({
        "metadata": {
            "resourceVersion": vmi.resource_version(),
            "annotations": defaulted.metadata.annotations,
        },
        "spec": serde_json::to_value(&defaulted.spec)?,
    });
    let patched = api
        .patch(
            &vmi.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
    ctx.writes.record(Write::VmiPatch);
    ctx.wrote_vmi(&patched);
    Ok(patched)
}

/// The plan once its pod could not be made: the VMI stays Pending, without a pod.
fn without_pod(plan: &mut VmiPlan, vmi: &VirtualMachineInstance) {
    plan.phase = (vmi.phase() == Phase::Unset).then_some(Phase::Pending);
    plan.ready = super::decide::ready_condition(Phase::Pending, None);
}

/// `VirtualMachineInstanceSynchronized`: false while the controller cannot make the pod.
const SYNCHRONIZED: &str = "Synchronized";
/// `FailedCreatePodReason`: the reason of a failed pod creation, in events and conditions.
const FAILED_CREATE: &str = "FailedCreate";
/// `FailedPvcNotFoundReason`.
const FAILED_PVC_NOT_FOUND: &str = "FailedPvcNotFound";
/// `services.FailedToRenderLaunchManifestErrFormat`, without its `%v`.
const RENDER_FAILED: &str = "failed to render launch manifest";

/// Why no launcher pod exists for a VMI that needs one: KubeVirt's sync error, shown as the
/// VMI's `Synchronized=False` condition (`CheckFailure`).
#[derive(Debug, Clone, PartialEq, Eq)]
struct SyncFailure {
    reason: String,
    message: String,
    /// Retrying cannot help: the VMI's spec is the problem.
    permanent: bool,
}

impl SyncFailure {
    fn retry(reason: &str, message: String) -> Self {
        SyncFailure {
            reason: reason.into(),
            message,
            permanent: false,
        }
    }
}

/// Renders and creates the launcher pod; on failure, KubeVirt's events
/// (`lifecycle.go` `sync`) and the sync failure for the VMI's conditions.
async fn create_pod(
    ctx: &Context,
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    admission_attempt: Option<u32>,
) -> Result<Pod, SyncFailure> {
    let namespace = vmi.namespace().unwrap_or_default();
    let mut pvcs = BTreeMap::new();
    let claims = vmi
        .spec
        .volumes
        .iter()
        .filter_map(crate::template::claim_name);
    let pvc_api: Api<PersistentVolumeClaim> = ctx.api(&namespace);
    for claim in claims {
        match pvc_api.get_opt(&claim).await {
            Ok(Some(pvc)) => {
                let block = pvc.spec.and_then(|s| s.volume_mode).as_deref() == Some("Block");
                pvcs.insert(claim, PvcInfo { block });
            }
            Ok(None) => {}
            Err(e) => {
                return Err(SyncFailure::retry(
                    FAILED_CREATE,
                    format!("looking up PVC {claim}: {e}"),
                ));
            }
        }
    }
    let render_context = RenderContext {
        pvcs,
        qemu_timeout_jitter_seconds: rand::random_range(
            0..crate::template::QEMU_TIMEOUT_JITTER_RANGE,
        ),
    };
    let mut pod = match render_launcher_pod(vmi, config, &render_context) {
        Ok(pod) => pod,
        Err(e) => {
            let message = format!("{RENDER_FAILED}: {e}");
            // KubeVirt has an event for a missing PVC only; the condition says the rest.
            let reason = match e {
                crate::template::TemplateError::PvcNotFound(_) => FAILED_PVC_NOT_FOUND,
                _ => FAILED_CREATE,
            };
            ctx.event(vmi, true, reason, message.clone()).await;
            return Err(SyncFailure::retry(reason, message));
        }
    };
    if let Some(attempt) = admission_attempt {
        pod.metadata.annotations.get_or_insert_default().insert(
            super::decide::ADMISSION_ATTEMPT_ANNOTATION.to_string(),
            attempt.to_string(),
        );
    }
    let pod_api: Api<Pod> = ctx.api(&namespace);
    match pod_api.create(&PostParams::default(), &pod).await {
        Ok(created) => {
            ctx.writes.record(Write::PodCreate);
            let pod_name = created.name_any();
            if let Some(uid) = &vmi.metadata.uid {
                ctx.created_pods
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(uid.clone(), (created.clone(), Instant::now()));
            }
            ctx.event(
                vmi,
                false,
                "SuccessfulCreate",
                format!("Created virtual machine pod {pod_name}"),
            )
            .await;
            Ok(created)
        }
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("violates PodSecurity") =>
        {
            let message = format!(
                "failed to create pod for vmi {namespace}/{}, it needs a privileged namespace to run: {}",
                vmi.name_any(),
                status.message
            );
            ctx.event(
                vmi,
                true,
                FAILED_CREATE,
                format!("{RENDER_FAILED}: {message}"),
            )
            .await;
            Err(SyncFailure::retry(FAILED_CREATE, message))
        }
        Err(e) => {
            ctx.event(vmi, true, FAILED_CREATE, format!("Error creating pod: {e}"))
                .await;
            Err(SyncFailure::retry(
                FAILED_CREATE,
                format!("failed to create virtual machine pod: {e}"),
            ))
        }
    }
}

/// The status fields the plan changes, as a merge patch, or `None` when nothing changes.
fn status_patch(
    vmi: &VirtualMachineInstance,
    plan: &VmiPlan,
    pods: &[PodView],
    created: Option<&Pod>,
    sync: Option<&SyncFailure>,
    config: &TemplateConfig,
) -> Option<serde_json::Value> {
    let old = vmi.status.clone().unwrap_or_default();
    let mut new = old.clone();
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let current = created
        .map(PodView::from_pod)
        .or_else(|| super::decide::current_pod(vmi, pods).cloned());

    // The runtime user: the one the pod runs as, else the one the pod will run as, decided
    // as KubeVirt's webhook decides it. Never what the VMI's creator wrote.
    new.runtime_user = Some(
        current
            .as_ref()
            .and_then(|p| p.runtime_user)
            .unwrap_or_else(|| crate::template::runtime_user(vmi, config)),
    );
    // The webhook's other status defaults (`setGuestMemoryStatus`,
    // `setCurrentCPUTopologyStatus`), from the spec it would have stored.
    if matches!(vmi.phase(), Phase::Unset | Phase::Pending) {
        let mut spec = vmi.spec.clone();
        crate::defaults::apply(&mut spec, config);
        proto::contract::defaults::status_from_spec(&mut new, &spec);
    }
    // `VmiMemoryOverheadReport`: the overhead the pod was sized with.
    if config.memory_overhead_report
        && let Some(bytes) = current.as_ref().and_then(|p| p.memory_overhead)
    {
        let overhead = crate::quantity::Qty::bytes(bytes, crate::quantity::Format::BinarySi);
        new.memory
            .get_or_insert_with(Default::default)
            .extra
            .insert("memoryOverhead".into(), json!(overhead.to_string()));
    }
    let phase = plan.phase.unwrap_or(vmi.phase());
    if vmi.phase() == Phase::Unset && phase != Phase::Pending {
        // Record Pending too: the webhook would have set it at creation.
        push_transition(&mut new.phase_transition_timestamps, Phase::Pending, &now);
    }
    if let Some(phase) = plan.phase {
        new.phase = Some(phase);
        push_transition(&mut new.phase_transition_timestamps, phase, &now);
    }

    // From the current pod: its image (`setLauncherContainerInfo`) and, while scheduling, its
    // QoS class. Once the pods are gone the image version is cleared.
    match &current {
        Some(pod) => {
            if pod.compute_image.is_some() {
                new.launcher_container_image_version = pod.compute_image.clone();
            }
            if matches!(
                vmi.phase(),
                Phase::Unset | Phase::Pending | Phase::Scheduling
            ) {
                new.qos_class = pod.qos_class.clone();
            }
        }
        None if vmi.phase().is_final() => new.launcher_container_image_version = None,
        None => {}
    }

    // `activePods`: pod UID → node of every controlled pod.
    let mut active: BTreeMap<String, String> = pods
        .iter()
        .filter(|p| !p.uid.is_empty())
        .map(|p| (p.uid.clone(), p.node_name.clone().unwrap_or_default()))
        .collect();
    if let Some(pod) = created
        && let Some(uid) = &pod.metadata.uid
    {
        active.insert(uid.clone(), String::new());
    }
    // While the VMI stays Scheduling, a listed pod's node (the scheduler's binding) waits for
    // the Scheduled write, which comes once the pod runs: one status write fewer per VMI
    // (KubeVirt writes the binding on its own). A new pod is listed at once.
    if phase == Phase::Scheduling
        && let Some(listed) = &old.active_pods
    {
        for (uid, node) in active.iter_mut() {
            if let Some(listed_node) = listed.get(uid) {
                node.clone_from(listed_node);
            }
        }
    }
    new.active_pods = (!active.is_empty() || old.active_pods.is_some()).then_some(active);

    if let Some(node) = &plan.node_name
        && plan.phase == Some(Phase::Scheduled)
    {
        new.node_name = Some(node.clone());
        // The volumes the handler fills in; existing entries are kept.
        let mut volumes = Vec::new();
        for volume in &vmi.spec.volumes {
            volumes.push(
                old.volume_status
                    .iter()
                    .find(|s| s.name == volume.name)
                    .cloned()
                    .unwrap_or(VolumeStatus {
                        name: volume.name.clone(),
                        ..Default::default()
                    }),
            );
        }
        new.volume_status = volumes;
        new.migration_transport = Some("Unix".into());
    }

    // A missing PVC makes the VMI unschedulable (`lifecycle.go` `updateStatus`).
    let unschedulable = match sync {
        Some(failure) if failure.reason == FAILED_PVC_NOT_FOUND => {
            Some(("Unschedulable", failure.message.as_str()))
        }
        _ => plan
            .unschedulable
            .as_ref()
            .map(|(reason, message)| (reason.as_str(), message.as_str())),
    };
    set_condition(
        &mut new.conditions,
        "PodScheduled",
        unschedulable.map(|(reason, message)| ("False", reason, message)),
        &now,
    );
    // `CheckFailure`: why no pod could be made, until one is.
    set_condition(
        &mut new.conditions,
        SYNCHRONIZED,
        sync.map(|f| ("False", f.reason.as_str(), f.message.as_str())),
        &now,
    );
    // Ready as KubeVirt computes it; a failure explains itself in the message.
    let (status, reason, message) = &plan.ready;
    let message = plan
        .failure
        .as_ref()
        .map_or(message.as_str(), |f| f.message.as_str());
    let reason = plan
        .failure
        .as_ref()
        .map_or(reason.as_str(), |f| f.reason.as_str());
    // Once final, the condition keeps saying why (the pod is gone by then).
    if !vmi.phase().is_final() {
        set_condition(
            &mut new.conditions,
            "Ready",
            Some((status.as_str(), reason, message)),
            &now,
        );
    }

    if new == old {
        return None;
    }
    let old_json = serde_json::to_value(&old).ok()?;
    let new_json = serde_json::to_value(&new).ok()?;
    Some(crate::context::merge_diff(&old_json, &new_json))
}

fn push_transition(list: &mut Vec<PhaseTransitionTimestamp>, phase: Phase, now: &Time) {
    if !list.iter().any(|t| t.phase == phase) {
        list.push(PhaseTransitionTimestamp {
            phase,
            phase_transition_timestamp: now.clone(),
            extra: Default::default(),
        });
    }
}

/// Sets (`Some((status, reason, message))`) or removes (`None`) a condition.
fn set_condition(
    conditions: &mut Vec<Condition>,
    kind: &str,
    value: Option<(&str, &str, &str)>,
    now: &Time,
) {
    let existing = conditions.iter().position(|c| c.condition_type == kind);
    match (value, existing) {
        (None, Some(index)) => {
            conditions.remove(index);
        }
        (None, None) => {}
        (Some((status, reason, message)), existing) => {
            // Empty strings are left out, as Go's `omitempty` does.
            let reason = Some(reason).filter(|r| !r.is_empty());
            let message = Some(message).filter(|m| !m.is_empty());
            let same = existing.and_then(|i| conditions.get(i)).is_some_and(|c| {
                c.status == status
                    && c.reason.as_deref() == reason
                    && c.message.as_deref() == message
            });
            if same {
                return;
            }
            let condition = Condition {
                condition_type: kind.into(),
                status: status.into(),
                last_probe_time: None,
                last_transition_time: Some(now.clone()),
                reason: reason.map(str::to_string),
                message: message.map(str::to_string),
                extra: Default::default(),
            };
            match existing {
                Some(index) => conditions[index] = condition,
                None => conditions.push(condition),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vmi::decide::decide;

    fn vmi(status: serde_json::Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "n", "uid": "u",
                         "finalizers": [FOREGROUND_DELETE_FINALIZER]},
            "spec": {"domain": {"devices": {}},
                     "volumes": [{"name": "root", "containerDisk": {"image": "i:1"}}]},
            "status": status,
        }))
        .expect("valid VMI")
    }

    fn pod(phase: &str, ready: bool) -> PodView {
        PodView {
            name: "p".into(),
            uid: "pod-uid".into(),
            node_name: Some("n1".into()),
            phase: phase.into(),
            ready,
            unpaused_condition: Some("True".into()),
            ..Default::default()
        }
    }

    #[test]
    fn first_write_records_pending_and_scheduling() {
        let v = vmi(json!({}));
        let plan = decide(&v, &[], true);
        let created: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "pod-uid"},
            "spec": {"containers": [{"name": "compute", "image": "launcher:1"}]},
            "status": {"qosClass": "Burstable"}}))
        .unwrap();
        let patch = status_patch(
            &v,
            &plan,
            &[],
            Some(&created),
            None,
            &TemplateConfig::default(),
        )
        .expect("a write");
        assert_eq!(patch["phase"], json!("Scheduling"));
        let phases: Vec<_> = patch["phaseTransitionTimestamps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["phase"].clone())
            .collect();
        assert_eq!(phases, [json!("Pending"), json!("Scheduling")]);
        assert_eq!(patch["runtimeUser"], json!(107));
        assert_eq!(patch["activePods"], json!({"pod-uid": ""}));
        assert_eq!(patch["launcherContainerImageVersion"], json!("launcher:1"));
        assert_eq!(patch["qosClass"], json!("Burstable"));
        assert_eq!(patch["conditions"][0]["reason"], json!("GuestNotRunning"));
        // The webhook's status defaults, from the defaulted spec.
        assert_eq!(
            patch["currentCPUTopology"],
            json!({"cores": 1, "sockets": 1, "threads": 1})
        );
    }

    /// A VMI the launcher cannot run (or whose pod cannot be made) stays Pending, without a
    /// pod, with KubeVirt's `Synchronized=False` condition; once a pod exists it goes.
    #[test]
    fn a_failed_pod_creation_is_a_synchronized_condition() {
        let v = vmi(json!({}));
        let mut plan = decide(&v, &[], true);
        assert!(plan.create_pod);
        without_pod(&mut plan, &v);
        let failure = SyncFailure {
            reason: FAILED_CREATE.into(),
            message: "failed to render launch manifest: spec.domain.firmware.kernelBoot: required"
                .into(),
            permanent: true,
        };
        let config = TemplateConfig::default();
        let patch = status_patch(&v, &plan, &[], None, Some(&failure), &config).expect("a write");
        assert_eq!(patch["phase"], json!("Pending"));
        let condition = |patch: &serde_json::Value, kind: &str| {
            patch["conditions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["type"] == kind)
                .cloned()
        };
        let synchronized = condition(&patch, "Synchronized").expect("Synchronized");
        assert_eq!(synchronized["status"], json!("False"));
        assert_eq!(synchronized["reason"], json!("FailedCreate"));
        assert_eq!(synchronized["message"], json!(failure.message));
        assert_eq!(
            condition(&patch, "Ready").unwrap()["reason"],
            json!("PodNotExists")
        );
        assert!(patch.get("activePods").is_none(), "{patch}");

        // Stored, then the same failure again: nothing to write.
        let mut stored = v.clone();
        let mut status: proto::kubevirt::VirtualMachineInstanceStatus =
            serde_json::from_value(patch.clone()).unwrap();
        status.phase_transition_timestamps.clear();
        stored.status = Some(status);
        let mut plan = decide(&stored, &[], true);
        without_pod(&mut plan, &stored);
        assert_eq!(
            status_patch(&stored, &plan, &[], None, Some(&failure), &config),
            None
        );

        // A missing PVC also makes the VMI unschedulable.
        let missing = SyncFailure::retry(FAILED_PVC_NOT_FOUND, "didn't find PVC x".into());
        let patch = status_patch(&v, &plan, &[], None, Some(&missing), &config).unwrap();
        let scheduled = condition(&patch, "PodScheduled").expect("PodScheduled");
        assert_eq!(
            (scheduled["status"].clone(), scheduled["reason"].clone()),
            (json!("False"), json!("Unschedulable"))
        );
        assert_eq!(
            condition(&patch, "Synchronized").unwrap()["reason"],
            json!("FailedPvcNotFound")
        );

        // The pod made at last: the condition goes.
        let plan = decide(&stored, &[], true);
        let created: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "pod-uid"},
            "spec": {"containers": [{"name": "compute", "image": "launcher:1"}]}}))
        .unwrap();
        let patch = status_patch(&stored, &plan, &[], Some(&created), None, &config).unwrap();
        assert!(
            condition(&patch, "Synchronized").is_none(),
            "the condition stays: {patch}"
        );
    }

    /// On KubeVirt's CRD whoever creates a VMI writes its status: `runtimeUser: 0` must not
    /// make a root launcher unless the Root feature gate is on.
    #[test]
    fn the_runtime_user_is_decided_not_read() {
        let v = vmi(json!({"runtimeUser": 0}));
        let plan = decide(&v, &[], true);
        let patch = status_patch(&v, &plan, &[], None, None, &TemplateConfig::default()).unwrap();
        assert_eq!(patch["runtimeUser"], json!(107));
        let root = TemplateConfig {
            root: true,
            ..TemplateConfig::default()
        };
        let v = vmi(json!({"runtimeUser": 0}));
        let patch = status_patch(&v, &plan, &[], None, None, &root);
        assert!(
            patch
                .as_ref()
                .is_none_or(|p| p.get("runtimeUser").is_none()),
            "{patch:?}"
        );
        // Once the pod exists, the user it runs as.
        let created: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "uid": "pod-uid",
                         "annotations": {"kubevirt.io/memory-overhead-bytes": "281018368"}},
            "spec": {"containers": [{"name": "compute", "image": "launcher:1",
                                     "securityContext": {"runAsUser": 107}}]}}))
        .unwrap();
        let patch = status_patch(&v, &plan, &[], Some(&created), None, &root).unwrap();
        assert_eq!(patch["runtimeUser"], json!(107));
        // `VmiMemoryOverheadReport`: the pod's overhead, as a quantity.
        assert_eq!(patch["memory"]["memoryOverhead"], json!("268Mi"));
    }

    #[test]
    fn hand_off_write_and_nothing_to_write() {
        let v = vmi(json!({"phase": "Scheduling", "runtimeUser": 107,
            "activePods": {"pod-uid": "n1"},
            "conditions": [{"type": "Ready", "status": "False", "reason": "GuestNotRunning",
                            "message": "Guest VM is not reported as running"}]}));
        let pods = [pod("Running", true)];
        let plan = decide(&v, &pods, true);
        let patch = status_patch(&v, &plan, &pods, None, None, &TemplateConfig::default())
            .expect("a write");
        assert_eq!(patch["phase"], json!("Scheduled"));
        assert_eq!(patch["nodeName"], json!("n1"));
        assert_eq!(patch["migrationTransport"], json!("Unix"));
        assert_eq!(
            patch["volumeStatus"],
            json!([{"name": "root", "target": ""}])
        );
        assert!(
            patch.get("conditions").is_none(),
            "Ready did not change: {patch}"
        );

        // Pod not ready yet and nothing new: no write at all.
        let pods = [pod("Pending", false)];
        let plan = decide(&v, &pods, true);
        assert_eq!(
            status_patch(&v, &plan, &pods, None, None, &TemplateConfig::default()),
            None
        );

        // Nor when the pod was only bound: its node comes with the Scheduled write.
        let unbound = vmi(json!({"phase": "Scheduling", "runtimeUser": 107,
            "activePods": {"pod-uid": ""},
            "conditions": [{"type": "Ready", "status": "False", "reason": "GuestNotRunning",
                            "message": "Guest VM is not reported as running"}]}));
        let plan = decide(&unbound, &pods, true);
        assert_eq!(
            status_patch(
                &unbound,
                &plan,
                &pods,
                None,
                None,
                &TemplateConfig::default()
            ),
            None
        );
        let pods = [pod("Running", true)];
        let plan = decide(&unbound, &pods, true);
        let patch = status_patch(
            &unbound,
            &plan,
            &pods,
            None,
            None,
            &TemplateConfig::default(),
        )
        .expect("a write");
        assert_eq!(patch["phase"], json!("Scheduled"));
        assert_eq!(patch["activePods"], json!({"pod-uid": "n1"}));
    }

    #[test]
    fn removed_fields_are_nulled() {
        // A final VMI without pods: the image version goes.
        let v = vmi(json!({"phase": "Failed", "runtimeUser": 107,
            "launcherContainerImageVersion": "launcher:1", "activePods": {}}));
        let plan = decide(&v, &[], true);
        let patch =
            status_patch(&v, &plan, &[], None, None, &TemplateConfig::default()).expect("a write");
        assert_eq!(
            patch["launcherContainerImageVersion"],
            serde_json::Value::Null
        );
    }
}
