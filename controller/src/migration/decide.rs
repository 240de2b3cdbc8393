//! The migration controller's decision (KubeVirt v1.9.0's
//! `pkg/virt-controller/watch/migration/migration.go`, `vmm/launcher/docs/migration-contract.md`
//! §5.2–5.4), as a pure function of the `VirtualMachineInstanceMigration`, its VMI and the
//! VMI's launcher pods.

use std::time::Duration;

use proto::kubevirt::{
    MigrationPhase, MigrationState, Phase, VirtualMachineInstance, VirtualMachineInstanceMigration,
};

use crate::vmi::decide::PodView;

/// The finalizer virt-api's mutating webhook puts on every migration.
pub const FINALIZER: &str = "kubevirt.io/migrationJobFinalize";
/// The condition a deleted (cancelled) migration gets.
pub const ABORT_REQUESTED_CONDITION: &str = "migrationAbortRequested";
/// How long the target pod may be missing from the cache after its creation before the
/// migration counts it as gone.
pub const TARGET_POD_GRACE: Duration = Duration::from_secs(30);

/// What one reconcile knows.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub migration: &'a VirtualMachineInstanceMigration,
    pub vmi: Option<&'a VirtualMachineInstance>,
    /// The migration's target pod (label `kubevirt.io/migrationJobUID`), if it exists.
    pub target_pod: Option<&'a PodView>,
    /// The VMI's launcher pod on its node (the source).
    pub source_pod: Option<&'a PodView>,
    /// Another migration of the same VMI is older and not final: this one waits.
    pub older_unfinished: bool,
    /// The target pod was created by this controller recently and may not be cached yet.
    pub target_pod_expected: bool,
    pub now: k8s_openapi::jiff::Timestamp,
}

/// How long a target pod may stay Pending while the scheduler finds no node for it
/// (v1.9.0's default; the migration's `kubevirt.io/migrationUnschedulablePodTimeoutSeconds`
/// annotation overrides it).
pub const UNSCHEDULABLE_PENDING_TIMEOUT: Duration = Duration::from_secs(5 * 60);
/// How long a target pod may stay Pending for any reason (v1.9.0's default;
/// `kubevirt.io/migrationPendingPodTimeoutSeconds` overrides it).
pub const CATCH_ALL_PENDING_TIMEOUT: Duration = Duration::from_secs(15 * 60);
const UNSCHEDULABLE_TIMEOUT_ANNOTATION: &str =
    "kubevirt.io/migrationUnschedulablePodTimeoutSeconds";
const PENDING_TIMEOUT_ANNOTATION: &str = "kubevirt.io/migrationPendingPodTimeoutSeconds";

/// A timeout from the migration's `annotation` (whole seconds; a negative one is zero, as
/// v1.9.0's comparison makes it), else `default`; a value that does not parse is ignored,
/// as v1.9.0 does.
fn timeout(
    migration: &VirtualMachineInstanceMigration,
    annotation: &str,
    default: Duration,
) -> Duration {
    migration
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(annotation))
        .and_then(|v| v.parse::<i64>().ok())
        .map_or(default, |secs| {
            Duration::from_secs(u64::try_from(secs).unwrap_or(0))
        })
}

/// v1.9.0's `handlePendingPodTimeout`: a target pod Pending past its timeout is deleted
/// (the migration then fails on the pod going down); otherwise look again when it would
/// expire. A drain must not wait for good on a target pod no node takes.
fn pending_timeout(facts: &Facts<'_>, pod: &PodView, plan: &mut Plan) {
    if pod.phase != "Pending" || pod.deleting || pod.created.is_none() {
        return;
    }
    let migration = facts.migration;
    let age = pod.age(facts.now);
    let namespace = migration.metadata.namespace.as_deref().unwrap_or_default();
    let unschedulable = pod
        .unschedulable
        .as_ref()
        .is_some_and(|(reason, _)| reason == "Unschedulable");
    let mut limits = vec![(
        timeout(
            migration,
            PENDING_TIMEOUT_ANNOTATION,
            CATCH_ALL_PENDING_TIMEOUT,
        ),
        "pending",
    )];
    if unschedulable {
        limits.push((
            timeout(
                migration,
                UNSCHEDULABLE_TIMEOUT_ANNOTATION,
                UNSCHEDULABLE_PENDING_TIMEOUT,
            ),
            "unschedulable",
        ));
    }
    // The shorter limit counts; on a tie, the unschedulable one (v1.9.0 checks it first).
    limits.sort_by_key(|(limit, kind)| (*limit, *kind != "unschedulable"));
    let (limit, kind) = limits[0];
    if age >= limit {
        plan.delete_target_pod = Some(pod.name.clone());
        plan.target_pod_timed_out = Some(format!(
            "{kind} pod {namespace}/{} timeout period exceeded",
            pod.name
        ));
    } else {
        plan.requeue_after = Some(limit - age);
    }
}

/// The hand-off: the VMI's fresh migration state and the label that wakes the target node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandOff {
    pub target_node: String,
    pub target_pod: String,
    pub source_node: String,
    pub source_pod: String,
}

/// What the reconcile writes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub phase: Option<MigrationPhase>,
    pub create_target_pod: bool,
    pub hand_off: Option<HandOff>,
    /// Patch `status.migrationState.abortRequested` on the VMI.
    pub request_abort: bool,
    /// Put the label `kubevirt.io/migrationTargetNodeName` (the hand-off's) on the VMI again.
    pub relabel: Option<String>,
    /// Delete the target pod (a failed or cancelled migration, or a pod Pending too long).
    pub delete_target_pod: Option<String>,
    /// Why the target pod is deleted when it stayed Pending too long (an event).
    pub target_pod_timed_out: Option<String>,
    /// End the VMI's migration state as failed, with this reason (its target pod died
    /// before the migration started).
    pub fail_vmi_migration: Option<String>,
    /// Add the `migrationAbortRequested` condition.
    pub abort_condition: bool,
    /// Copy the VMI's migration state into the migration's status.
    pub copy_state: Option<MigrationState>,
    pub remove_finalizer: bool,
    /// Why the migration failed (an event).
    pub failure: Option<String>,
    pub requeue_after: Option<Duration>,
}

fn has_condition(migration: &VirtualMachineInstanceMigration, kind: &str) -> bool {
    migration
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.condition_type == kind))
}

/// The reconcile's decision.
pub fn decide(facts: &Facts<'_>) -> Plan {
    let mut plan = Plan::default();
    let migration = facts.migration;
    let uid = migration.metadata.uid.as_deref().unwrap_or_default();
    let phase = migration.phase();
    let deleting = migration.metadata.deletion_timestamp.is_some();
    let state = facts.vmi.and_then(|v| v.migration_state().ok().flatten());
    let ours = state
        .as_ref()
        .filter(|s| s.migration_uid.as_deref() == Some(uid));
    let live_target = facts.target_pod.filter(|p| !p.deleting && !p.is_final());

    if phase.is_final() {
        if let Some(state) = ours
            && migration
                .status
                .as_ref()
                .is_none_or(|s| s.migration_state.as_ref() != Some(state))
        {
            plan.copy_state = Some(state.clone());
        }
        if phase == MigrationPhase::Failed
            && let Some(pod) = live_target
        {
            plan.delete_target_pod = Some(pod.name.clone());
        }
        plan.remove_finalizer = migration
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER);
        return plan;
    }

    let fail = |plan: &mut Plan, reason: String| {
        plan.phase = Some(MigrationPhase::Failed);
        plan.failure = Some(reason);
        if let Some(pod) = live_target {
            plan.delete_target_pod = Some(pod.name.clone());
        }
    };

    let Some(vmi) = facts.vmi else {
        fail(&mut plan, "the VMI does not exist".into());
        return plan;
    };
    if vmi.phase().is_final() {
        fail(&mut plan, format!("the VMI is {}", vmi.phase()));
        return plan;
    }

    if deleting && !has_condition(migration, ABORT_REQUESTED_CONDITION) {
        plan.abort_condition = true;
    }
    if let Some(state) = ours {
        // After the hand-off the handlers report through the VMI.
        if state.is_failed() {
            fail(&mut plan, "source node reported migration failed".into());
            return plan;
        }
        if state.is_completed() {
            plan.phase = Some(MigrationPhase::Succeeded);
            return plan;
        }
        if deleting && state.start_timestamp.is_none() {
            // Cancelled after the hand-off but before the source started: nothing to abort
            // yet, so the VMI's migration ends here (both handlers clean up on that).
            plan.fail_vmi_migration = Some("Migration was cancelled before it started".into());
            fail(
                &mut plan,
                "Migration was cancelled before it started".into(),
            );
            return plan;
        }
        if deleting && state.abort_requested != Some(true) {
            plan.request_abort = true;
        }
        // The hand-off's second write (the label that wakes the target) may have been lost.
        let label = vmi
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(proto::kubevirt::well_known::MIGRATION_TARGET_NODE_NAME_LABEL));
        if state.end_timestamp.is_none()
            && let Some(target) = &state.target_node
            && label != Some(target)
        {
            plan.relabel = Some(target.clone());
        }
        // A target pod that died before the guest started moving: nothing will come.
        if state.start_timestamp.is_none()
            && facts.target_pod.is_none_or(|p| p.is_down_or_going_down())
            && !facts.target_pod_expected
        {
            plan.fail_vmi_migration = Some("Target pod is down".into());
            fail(&mut plan, "Target pod is down".into());
            return plan;
        }
        let next = if state.start_timestamp.is_some() {
            MigrationPhase::Running
        } else if state.target_node_address.is_some() {
            MigrationPhase::TargetReady
        } else {
            MigrationPhase::PreparingTarget
        };
        if next != phase {
            plan.phase = Some(next);
        }
        return plan;
    }
    // Not (or no longer) this migration's VMI state.
    if matches!(
        phase,
        MigrationPhase::PreparingTarget | MigrationPhase::TargetReady | MigrationPhase::Running
    ) {
        fail(
            &mut plan,
            "the VMI's migration state was taken by another migration".into(),
        );
        return plan;
    }
    if deleting {
        // Cancelled before the hand-off: the target pod goes, the migration fails.
        fail(
            &mut plan,
            "Migration was cancelled before it started".into(),
        );
        return plan;
    }
    match phase {
        MigrationPhase::Unset => plan.phase = Some(MigrationPhase::Pending),
        MigrationPhase::Pending => {
            if facts.older_unfinished {
                plan.requeue_after = Some(Duration::from_secs(5));
            } else if state.as_ref().is_some_and(|s| !s.is_done()) {
                fail(&mut plan, "the VMI is migrating already".into());
            } else if vmi.phase() != Phase::Running {
                // Only a running VMI moves; look again.
                plan.requeue_after = Some(Duration::from_secs(5));
            } else if facts.target_pod.is_some() || facts.target_pod_expected {
                plan.phase = Some(MigrationPhase::Scheduling);
            } else {
                plan.create_target_pod = true;
                plan.phase = Some(MigrationPhase::Scheduling);
            }
        }
        MigrationPhase::Scheduling | MigrationPhase::Scheduled => match facts.target_pod {
            None if facts.target_pod_expected => {}
            None => fail(&mut plan, "target pod disappeared".into()),
            Some(pod) if pod.is_down_or_going_down() => fail(
                &mut plan,
                format!(
                    "target pod {} is down: {}",
                    pod.name,
                    pod.failure.clone().unwrap_or_else(|| pod.phase.clone())
                ),
            ),
            Some(pod) => {
                let node = pod.node_name.clone().filter(|n| !n.is_empty());
                match (pod.ready, node) {
                    (true, Some(target_node)) => {
                        if phase == MigrationPhase::Scheduling {
                            plan.phase = Some(MigrationPhase::Scheduled);
                        }
                        let source_node = vmi
                            .status
                            .as_ref()
                            .and_then(|s| s.node_name.clone())
                            .unwrap_or_default();
                        if source_node.is_empty() || source_node == target_node {
                            fail(
                                &mut plan,
                                format!("the target pod runs on the source node {target_node}"),
                            );
                        } else {
                            plan.hand_off = Some(HandOff {
                                target_node,
                                target_pod: pod.name.clone(),
                                source_node,
                                source_pod: facts
                                    .source_pod
                                    .map(|p| p.name.clone())
                                    .unwrap_or_default(),
                            });
                        }
                    }
                    _ => {
                        if let Some((reason, message)) = &pod.unschedulable {
                            tracing::debug!(pod = %pod.name, %reason, %message, "target pod not scheduled yet");
                        }
                        pending_timeout(facts, pod, &mut plan);
                    }
                }
            }
        },
        _ => {}
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const UID: &str = "vmim-uid";

    fn migration(phase: &str, deleting: bool) -> VirtualMachineInstanceMigration {
        let mut m: VirtualMachineInstanceMigration = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": "m", "namespace": "n", "uid": UID, "finalizers": [FINALIZER]},
            "spec": {"vmiName": "v"},
            "status": {"phase": phase},
        }))
        .unwrap();
        if deleting {
            m.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        m
    }

    fn vmi(phase: &str, state: Option<serde_json::Value>) -> VirtualMachineInstance {
        let mut status = json!({"phase": phase, "nodeName": "node-a"});
        if let Some(state) = state {
            status["migrationState"] = state;
        }
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "n", "uid": "vmi-uid"},
            "spec": {"domain": {"devices": {}}},
            "status": status,
        }))
        .unwrap()
    }

    fn pod(name: &str, phase: &str, ready: bool, node: Option<&str>) -> PodView {
        PodView {
            name: name.into(),
            phase: phase.into(),
            ready,
            node_name: node.map(str::to_string),
            ..Default::default()
        }
    }

    fn decide_with(
        m: &VirtualMachineInstanceMigration,
        v: Option<&VirtualMachineInstance>,
        target: Option<&PodView>,
    ) -> Plan {
        let source = pod("source", "Running", true, Some("node-a"));
        decide(&Facts {
            migration: m,
            vmi: v,
            target_pod: target,
            source_pod: Some(&source),
            older_unfinished: false,
            target_pod_expected: false,
            now: k8s_openapi::jiff::Timestamp::now(),
        })
    }

    fn ours(extra: serde_json::Value) -> serde_json::Value {
        let mut state =
            json!({"migrationUid": UID, "sourceNode": "node-a", "targetNode": "node-b"});
        state
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        state
    }

    #[test]
    fn a_new_migration_creates_its_target_pod_and_hands_off_once_it_runs() {
        let running = vmi("Running", None);
        assert_eq!(
            decide_with(&migration("", false), Some(&running), None).phase,
            Some(MigrationPhase::Pending)
        );
        let plan = decide_with(&migration("Pending", false), Some(&running), None);
        assert!(plan.create_target_pod);
        assert_eq!(plan.phase, Some(MigrationPhase::Scheduling));
        // A VMI that does not run yet: the migration waits.
        let plan = decide_with(
            &migration("Pending", false),
            Some(&vmi("Scheduled", None)),
            None,
        );
        assert!(!plan.create_target_pod && plan.phase.is_none() && plan.requeue_after.is_some());
        // Scheduling: the pod is not ready yet, then it is.
        let starting = pod("target", "Pending", false, Some("node-b"));
        assert_eq!(
            decide_with(
                &migration("Scheduling", false),
                Some(&running),
                Some(&starting)
            ),
            Plan::default()
        );
        let ready = pod("target", "Running", true, Some("node-b"));
        let plan = decide_with(
            &migration("Scheduling", false),
            Some(&running),
            Some(&ready),
        );
        assert_eq!(plan.phase, Some(MigrationPhase::Scheduled));
        assert_eq!(
            plan.hand_off,
            Some(HandOff {
                target_node: "node-b".into(),
                target_pod: "target".into(),
                source_node: "node-a".into(),
                source_pod: "source".into(),
            })
        );
        // A target pod on the source node (no anti-affinity honoured) never gets the VMI.
        let same = pod("target", "Running", true, Some("node-a"));
        let plan = decide_with(&migration("Scheduled", false), Some(&running), Some(&same));
        assert_eq!(plan.phase, Some(MigrationPhase::Failed));
        assert_eq!(plan.delete_target_pod.as_deref(), Some("target"));
    }

    #[test]
    fn after_the_hand_off_the_phases_follow_the_vmis_migration_state() {
        let target = pod("target", "Running", true, Some("node-b"));
        let step = |state: serde_json::Value| {
            decide_with(
                &migration("Scheduled", false),
                Some(&vmi("Running", Some(ours(state)))),
                Some(&target),
            )
            .phase
        };
        assert_eq!(step(json!({})), Some(MigrationPhase::PreparingTarget));
        assert_eq!(
            step(json!({"targetNodeAddress": "10.0.0.2"})),
            Some(MigrationPhase::TargetReady)
        );
        assert_eq!(
            step(
                json!({"targetNodeAddress": "10.0.0.2", "startTimestamp": "2026-12-05T10:00:00Z"})
            ),
            Some(MigrationPhase::Running)
        );
        assert_eq!(
            step(
                json!({"completed": true, "endTimestamp": "2026-12-05T10:00:01Z", "startTimestamp": "2026-12-05T10:00:00Z"})
            ),
            Some(MigrationPhase::Succeeded)
        );
        let failed = decide_with(
            &migration("Running", false),
            Some(&vmi(
                "Running",
                Some(ours(
                    json!({"failed": true, "completed": true, "startTimestamp": "2026-12-05T10:00:00Z"}),
                )),
            )),
            Some(&target),
        );
        assert_eq!(failed.phase, Some(MigrationPhase::Failed));
        assert_eq!(failed.delete_target_pod.as_deref(), Some("target"));
    }

    #[test]
    fn a_lost_hand_off_label_is_written_again() {
        let target = pod("target", "Running", true, Some("node-b"));
        let plan = decide_with(
            &migration("PreparingTarget", false),
            Some(&vmi("Running", Some(ours(json!({}))))),
            Some(&target),
        );
        assert_eq!(plan.relabel.as_deref(), Some("node-b"));
        let mut labelled = vmi("Running", Some(ours(json!({}))));
        labelled.metadata.labels = Some(
            [(
                "kubevirt.io/migrationTargetNodeName".to_string(),
                "node-b".to_string(),
            )]
            .into(),
        );
        assert_eq!(
            decide_with(
                &migration("PreparingTarget", false),
                Some(&labelled),
                Some(&target)
            )
            .relabel,
            None
        );
    }

    #[test]
    fn a_target_pod_that_dies_before_the_start_fails_the_vmis_migration() {
        let dead = pod("target", "Failed", false, Some("node-b"));
        let plan = decide_with(
            &migration("PreparingTarget", false),
            Some(&vmi("Running", Some(ours(json!({}))))),
            Some(&dead),
        );
        assert_eq!(plan.phase, Some(MigrationPhase::Failed));
        assert_eq!(
            plan.fail_vmi_migration.as_deref(),
            Some("Target pod is down")
        );
        // Once the guest moves, the source reports the outcome itself.
        let plan = decide_with(
            &migration("Running", false),
            Some(&vmi(
                "Running",
                Some(ours(json!({"startTimestamp": "2026-12-05T10:00:00Z"}))),
            )),
            Some(&dead),
        );
        assert_eq!(plan.fail_vmi_migration, None);
        assert_eq!(plan.phase, None);
    }

    #[test]
    fn deleting_a_migration_cancels_it() {
        let target = pod("target", "Running", true, Some("node-b"));
        // Before the hand-off: the target pod goes, the migration fails.
        let plan = decide_with(
            &migration("Scheduling", true),
            Some(&vmi("Running", None)),
            Some(&target),
        );
        assert_eq!(plan.phase, Some(MigrationPhase::Failed));
        assert_eq!(plan.delete_target_pod.as_deref(), Some("target"));
        assert!(plan.abort_condition);
        // After it, before the start: the VMI's migration ends as cancelled.
        let handed = vmi("Running", Some(ours(json!({"targetNodeAddress": "x"}))));
        let plan = decide_with(
            &migration("TargetReady", true),
            Some(&handed),
            Some(&target),
        );
        assert_eq!(
            plan.fail_vmi_migration.as_deref(),
            Some("Migration was cancelled before it started")
        );
        assert_eq!(plan.phase, Some(MigrationPhase::Failed));
        assert_eq!(plan.delete_target_pod.as_deref(), Some("target"));
        // After the start: the source is asked to abort, once.
        let running = vmi(
            "Running",
            Some(ours(
                json!({"startTimestamp": "2026-12-05T10:00:00Z", "targetNodeAddress": "x"}),
            )),
        );
        let plan = decide_with(&migration("Running", true), Some(&running), Some(&target));
        assert!(plan.request_abort && plan.abort_condition && plan.phase.is_none());
        let asked = vmi(
            "Running",
            Some(ours(
                json!({"startTimestamp": "2026-12-05T10:00:00Z", "abortRequested": true}),
            )),
        );
        assert!(
            !decide_with(&migration("Running", true), Some(&asked), Some(&target)).request_abort
        );
    }

    #[test]
    fn a_final_migration_keeps_the_vmis_state_and_lets_go() {
        let state = ours(json!({"completed": true, "endTimestamp": "2026-12-05T10:00:01Z"}));
        let plan = decide_with(
            &migration("Succeeded", false),
            Some(&vmi("Running", Some(state.clone()))),
            None,
        );
        assert_eq!(
            plan.copy_state,
            Some(serde_json::from_value(state).unwrap())
        );
        assert!(plan.remove_finalizer);
        // Gone VMI or a finished one: failed.
        assert_eq!(
            decide_with(&migration("Pending", false), None, None).phase,
            Some(MigrationPhase::Failed)
        );
        assert_eq!(
            decide_with(
                &migration("Pending", false),
                Some(&vmi("Succeeded", None)),
                None
            )
            .phase,
            Some(MigrationPhase::Failed)
        );
        // Another migration's state on the VMI: this one fails rather than mixing in.
        let other = vmi(
            "Running",
            Some(json!({"migrationUid": "other", "sourceNode": "node-a"})),
        );
        assert_eq!(
            decide_with(&migration("Pending", false), Some(&other), None).phase,
            Some(MigrationPhase::Failed)
        );
        assert_eq!(
            decide_with(&migration("Running", false), Some(&other), None).phase,
            Some(MigrationPhase::Failed)
        );
    }

    #[test]
    fn a_target_pod_pending_too_long_is_deleted_and_the_migration_fails() {
        let running = vmi("Running", None);
        let now = k8s_openapi::jiff::Timestamp::now();
        let pending = |age_secs: i64, unschedulable: bool| {
            let mut p = pod("target", "Pending", false, None);
            p.created = Some(now - k8s_openapi::jiff::SignedDuration::from_secs(age_secs));
            if unschedulable {
                p.unschedulable = Some(("Unschedulable".into(), "0/2 nodes are available".into()));
            }
            p
        };
        let decide_at = |m: &VirtualMachineInstanceMigration, target: &PodView| {
            decide(&Facts {
                migration: m,
                vmi: Some(&running),
                target_pod: Some(target),
                source_pod: None,
                older_unfinished: false,
                target_pod_expected: false,
                now,
            })
        };
        let scheduling = migration("Scheduling", false);
        // Unschedulable for 4 minutes: looked at again when the 5 are up.
        let plan = decide_at(&scheduling, &pending(240, true));
        assert_eq!(plan.delete_target_pod, None);
        assert_eq!(plan.requeue_after, Some(Duration::from_secs(60)));
        // Past 5 minutes: deleted, with v1.9.0's reason.
        let plan = decide_at(&scheduling, &pending(300, true));
        assert_eq!(plan.delete_target_pod.as_deref(), Some("target"));
        assert_eq!(
            plan.target_pod_timed_out.as_deref(),
            Some("unschedulable pod n/target timeout period exceeded")
        );
        // Scheduled but Pending (pulling, say): only the catch-all 15 minutes count.
        assert_eq!(
            decide_at(&scheduling, &pending(600, false)).delete_target_pod,
            None
        );
        let plan = decide_at(&scheduling, &pending(900, false));
        assert_eq!(
            plan.target_pod_timed_out.as_deref(),
            Some("pending pod n/target timeout period exceeded")
        );
        // The migration's annotations set the limits; a value that does not parse is ignored.
        let with_timeouts = |unschedulable: &str, pending: &str| {
            let mut m = scheduling.clone();
            m.metadata.annotations = Some(
                [
                    (UNSCHEDULABLE_TIMEOUT_ANNOTATION, unschedulable),
                    (PENDING_TIMEOUT_ANNOTATION, pending),
                ]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
            );
            m
        };
        let custom = with_timeouts("30", "soon");
        assert!(
            decide_at(&custom, &pending(30, true))
                .delete_target_pod
                .is_some()
        );
        assert!(
            decide_at(&custom, &pending(600, false))
                .delete_target_pod
                .is_none()
        );
        // A negative timeout is up at once; equal limits name the pod unschedulable.
        let now_please = with_timeouts("-1", "-1");
        assert_eq!(
            decide_at(&now_please, &pending(0, true))
                .target_pod_timed_out
                .as_deref(),
            Some("unschedulable pod n/target timeout period exceeded")
        );
        // The deleted pod is down: the migration fails on the next look.
        let mut deleted = pending(900, true);
        deleted.deleting = true;
        assert_eq!(
            decide_at(&scheduling, &deleted).phase,
            Some(MigrationPhase::Failed)
        );
    }
}
