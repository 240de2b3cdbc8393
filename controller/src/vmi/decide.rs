//! What the VMI controller does for one VMI, as a pure function of the VMI and its pods
//! (KubeVirt v1.9.0 `pkg/virt-controller/watch/vmi/lifecycle.go` `sync` + `updateStatus`,
//! the parts before the hand-off to a node).

use k8s_openapi::api::core::v1::Pod;
use proto::kubevirt::Phase;
use proto::kubevirt::VirtualMachineInstance;
use proto::kubevirt::well_known::{FOREGROUND_DELETE_FINALIZER, VM_CONTROLLER_FINALIZER};

/// The deprecated spelling of the foreground finalizer, migrated to the qualified one.
pub(crate) const DEPRECATED_FOREGROUND_FINALIZER: &str = "foregroundDeleteVirtualMachine";

/// On a launcher pod that replaces one the kubelet rejected at admission: which attempt it
/// is (2, 3, ...), so that the replacements stay bounded without any other state.
pub const ADMISSION_ATTEMPT_ANNOTATION: &str = "kubevirt-rs.io/admission-attempt";

/// How many launcher pods a VMI gets when the kubelet rejects them at admission for
/// virt-handler's state; the VMI fails after the last, as KubeVirt's does after the first.
pub const MAX_ADMISSION_ATTEMPTS: u32 = 5;

/// How long after the `attempt`-th launcher pod was created its replacement may be, when
/// the kubelet rejected it: 2 s, 4 s, 8 s, 16 s (the attempts span half a minute, longer than
/// virt-handler takes to come back and register its device plugins).
fn admission_backoff(attempt: u32) -> std::time::Duration {
    std::time::Duration::from_secs(1 << attempt.clamp(1, MAX_ADMISSION_ATTEMPTS))
}

/// Whether the kubelet's admission `reason` (`status.reason` of a pod it rejected) is one
/// that virt-handler's own restart causes for a moment: it labels its node
/// `kubevirt.io/schedulable=false` while it is away (`NodeAffinity`), and its device plugins
/// go away with it, so the kubelet has no healthy `devices.kubevirt.io/*` to allocate
/// (`UnexpectedAdmissionError`: "Allocate failed due to no healthy devices present") or none
/// at all (`OutOfdevices.kubevirt.io/kvm`). The scheduler placed the pod before the node's
/// labels or allocatable changed. Other rejections (`OutOfcpu`, `OutOfmemory`, ...) are real
/// and fail the VMI, as in KubeVirt.
fn rejected_for_handler_state(reason: &str) -> bool {
    reason == "NodeAffinity"
        || reason == "UnexpectedAdmissionError"
        || reason
            .strip_prefix("OutOf")
            .is_some_and(|resource| resource.starts_with("devices.kubevirt.io/"))
}

/// The facts about a launcher pod the decisions depend on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PodView {
    pub name: String,
    pub uid: String,
    pub node_name: Option<String>,
    /// `Pending`, `Running`, `Succeeded`, `Failed`, `Unknown`.
    pub phase: String,
    pub deleting: bool,
    /// KubeVirt's `IsPodReady`: running, `compute` running, every other container ready.
    pub ready: bool,
    /// The `compute` container has terminated.
    pub compute_terminated: bool,
    /// Reason and message of a `PodScheduled=False` condition.
    pub unschedulable: Option<(String, String)>,
    /// Why the pod failed, from its status.
    pub failure: Option<String>,
    /// The kubelet refused the pod at admission for what virt-handler's restart flips for a
    /// moment (see [`rejected_for_handler_state`]), and none of its containers ever ran.
    pub rejected_at_admission: bool,
    /// Which launcher pod of its VMI this is, counting those the kubelet rejected at
    /// admission ([`ADMISSION_ATTEMPT_ANNOTATION`]; 1 without it).
    pub admission_attempt: u32,
    /// Status (`True`/`False`) of the pod condition behind the readiness gate.
    pub unpaused_condition: Option<String>,
    /// The pod's `Ready` condition: status, reason, message.
    pub ready_condition: Option<(String, String, String)>,
    /// `status.qosClass` of the pod.
    pub qos_class: Option<String>,
    /// Image of the `compute` container.
    pub compute_image: Option<String>,
    /// `runAsUser` of the `compute` container: the user the launcher really runs as.
    pub runtime_user: Option<u64>,
    /// The pod's `kubevirt.io/memory-overhead-bytes` annotation, when it parses.
    pub memory_overhead: Option<u64>,
    pub created: Option<k8s_openapi::jiff::Timestamp>,
}

impl PodView {
    pub fn from_pod(pod: &Pod) -> Self {
        let status = pod.status.clone().unwrap_or_default();
        let phase = status.phase.clone().unwrap_or_default();
        let statuses = status.container_statuses.clone().unwrap_or_default();
        let compute = statuses
            .iter()
            .find(|c| c.name == crate::template::COMPUTE_CONTAINER);
        let compute_running = compute
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.running.is_some());
        let compute_terminated = compute
            .and_then(|c| c.state.as_ref())
            .is_some_and(|s| s.terminated.is_some());
        let others_ready = statuses
            .iter()
            .filter(|c| c.name != crate::template::COMPUTE_CONTAINER)
            .all(|c| c.ready);
        let unschedulable = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
            .map(|c| {
                (
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )
            });
        let never_ran = statuses.iter().all(|c| {
            c.state
                .as_ref()
                .is_none_or(|s| s.running.is_none() && s.terminated.is_none())
                && c.last_state
                    .as_ref()
                    .is_none_or(|s| s.running.is_none() && s.terminated.is_none())
        });
        let rejected_at_admission = phase == "Failed"
            && status
                .reason
                .as_deref()
                .is_some_and(rejected_for_handler_state)
            && never_ran;
        let admission_attempt = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ADMISSION_ATTEMPT_ANNOTATION))
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        let failure = match (&status.reason, &status.message) {
            (Some(r), Some(m)) => Some(format!("{r}: {m}")),
            (Some(r), None) => Some(r.clone()),
            (None, Some(m)) => Some(m.clone()),
            (None, None) => None,
        };
        let unpaused_condition = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == crate::template::UNPAUSED_READINESS_GATE)
            .map(|c| c.status.clone());
        let ready_condition = status
            .conditions
            .iter()
            .flatten()
            .find(|c| c.type_ == "Ready")
            .map(|c| {
                (
                    c.status.clone(),
                    c.reason.clone().unwrap_or_default(),
                    c.message.clone().unwrap_or_default(),
                )
            });
        let compute = pod.spec.as_ref().and_then(|s| {
            s.containers
                .iter()
                .find(|c| c.name == crate::template::COMPUTE_CONTAINER)
        });
        let compute_image = compute.and_then(|c| c.image.clone());
        let runtime_user = compute
            .and_then(|c| c.security_context.as_ref())
            .and_then(|c| c.run_as_user)
            .and_then(|uid| u64::try_from(uid).ok());
        let memory_overhead = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::template::MEMORY_OVERHEAD_ANNOTATION))
            .and_then(|bytes| bytes.parse().ok());
        PodView {
            runtime_user,
            memory_overhead,
            qos_class: status.qos_class.clone(),
            compute_image,
            ready_condition,
            unpaused_condition,
            name: pod.metadata.name.clone().unwrap_or_default(),
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            ready: phase == "Running" && compute_running && others_ready,
            phase,
            deleting: pod.metadata.deletion_timestamp.is_some(),
            compute_terminated,
            unschedulable,
            failure,
            rejected_at_admission,
            admission_attempt,
            created: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        }
    }

    /// Time since the pod was created (zero without a creation time or in the future).
    pub(crate) fn age(&self, now: k8s_openapi::jiff::Timestamp) -> std::time::Duration {
        self.created
            .and_then(|created| std::time::Duration::try_from(now.duration_since(created)).ok())
            .unwrap_or_default()
    }

    pub(crate) fn is_final(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }

    /// `IsPodDownOrGoingDown`.
    pub(crate) fn is_down_or_going_down(&self) -> bool {
        self.is_final() || self.deleting || self.compute_terminated
    }
}

/// The writes one reconcile makes, in the order the controller performs them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct VmiPlan {
    /// Add `kubevirt.io/foregroundDeleteVirtualMachine` (the webhook's job in KubeVirt; this
    /// deployment has no webhook) before any pod exists.
    pub add_foreground_finalizer: bool,
    /// Create the launcher pod.
    pub create_pod: bool,
    /// The pod to create replaces one the kubelet rejected: this attempt (2, 3, ...).
    pub admission_attempt: Option<u32>,
    /// Look again this soon (a rejected pod's replacement waits for its back-off).
    pub requeue_after: Option<std::time::Duration>,
    /// Delete these pods (by name).
    pub delete_pods: Vec<String>,
    /// New phase, if it changes.
    pub phase: Option<Phase>,
    /// The node the VMI is handed to: `status.nodeName` and label `kubevirt.io/nodeName`.
    pub node_name: Option<String>,
    /// Finalizers to remove.
    pub remove_finalizers: Vec<String>,
    /// Why the VMI failed, for its `Ready` condition and an event.
    pub failure: Option<Failure>,
    /// The VMI's `Ready` condition: status, reason, message (`syncReadyConditionFromPod`).
    pub ready: (String, String, String),
    /// `PodScheduled=False` copied from the pod.
    pub unschedulable: Option<(String, String)>,
    /// Set the readiness-gate condition of this pod: `true` = `NotPaused`, `false` = `Paused`.
    /// Without it the kubelet never reports the pod Ready.
    pub set_unpaused: Option<(String, bool)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: String,
    pub message: String,
}

/// The VMI's `Ready` condition, from its pod (v1.9.0 `syncReadyConditionFromPod`): false
/// until the guest runs, then the pod's own `Ready` condition.
pub fn ready_condition(phase: Phase, pod: Option<&PodView>) -> (String, String, String) {
    let not = |reason: &str, message: &str| {
        ("False".to_string(), reason.to_string(), message.to_string())
    };
    match pod {
        None => not(
            "PodNotExists",
            "virt-launcher pod has not yet been scheduled",
        ),
        Some(pod) if pod.is_down_or_going_down() => {
            not("PodTerminating", "virt-launcher pod is terminating")
        }
        Some(_) if phase != Phase::Running => {
            not("GuestNotRunning", "Guest VM is not reported as running")
        }
        Some(pod) => match &pod.ready_condition {
            Some(condition) => condition.clone(),
            None => not(
                "PodConditionMissing",
                "virt-launcher pod is missing the Ready condition",
            ),
        },
    }
}

/// The pod that counts: the newest one controlled by the VMI, but never a pod the kubelet
/// rejected while another exists (its replacement may be as old, to the second). Once the
/// VMI has a node, the pods there come first: during a migration the target pod (newer,
/// on another node) is not the one running the VM.
pub(crate) fn current_pod<'a>(
    vmi: &VirtualMachineInstance,
    pods: &'a [PodView],
) -> Option<&'a PodView> {
    let node = vmi.status.as_ref().and_then(|s| s.node_name.as_deref());
    pods.iter().max_by_key(|p| {
        (
            node.is_some() && p.node_name.as_deref() == node,
            !p.rejected_at_admission,
            p.created,
        )
    })
}

/// Decides one reconcile. `pods` are the pods controlled by the VMI (including one created but
/// not cached yet); `owner_vm_exists` says whether the VM that owns the VMI is still there.
pub fn decide(vmi: &VirtualMachineInstance, pods: &[PodView], owner_vm_exists: bool) -> VmiPlan {
    decide_at(
        vmi,
        pods,
        owner_vm_exists,
        k8s_openapi::jiff::Timestamp::now(),
    )
}

/// [`decide`] at time `now` (the back-off between launcher pods the kubelet rejected).
pub fn decide_at(
    vmi: &VirtualMachineInstance,
    pods: &[PodView],
    owner_vm_exists: bool,
    now: k8s_openapi::jiff::Timestamp,
) -> VmiPlan {
    let mut plan = VmiPlan::default();
    let deleting = vmi.metadata.deletion_timestamp.is_some();
    let finalizers = vmi.metadata.finalizers.clone().unwrap_or_default();
    let has = |f: &str| finalizers.iter().any(|x| x == f);
    let phase = vmi.phase();
    let pod = current_pod(vmi, pods);

    // A pod the kubelet rejected stays only until its replacement exists (a failed write after
    // the replacement's creation must not leave it behind).
    if let Some(current) = pod
        && !current.rejected_at_admission
    {
        plan.delete_pods.extend(
            pods.iter()
                .filter(|p| p.rejected_at_admission && !p.deleting && p.name != current.name)
                .map(|p| p.name.clone()),
        );
    }

    if deleting || phase.is_final() {
        // A deleted VMI loses its pods; a finished one too, so that its finalizer can go
        // (a pod that has not finished yet is being deleted already or is deleted now).
        plan.delete_pods = pods
            .iter()
            .filter(|p| !p.deleting || p.is_final())
            .map(|p| p.name.clone())
            .collect();
    }

    if let Some(pod) = pod
        && !pod.deleting
        && !pod.is_final()
        && !phase.is_final()
    {
        let paused = vmi.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.condition_type == "Paused" && c.status == "True")
        });
        let wanted = if paused { "False" } else { "True" };
        if pod.unpaused_condition.as_deref() != Some(wanted) {
            plan.set_unpaused = Some((pod.name.clone(), !paused));
        }
    }

    plan.ready = ready_condition(phase, pod);

    match phase {
        Phase::Unset | Phase::Pending => {
            if pod.is_some() {
                plan.phase = Some(Phase::Scheduling);
            } else if deleting {
                plan.phase = Some(Phase::Failed);
                plan.failure = Some(Failure {
                    reason: "PodNotExists".into(),
                    message: "the VMI was deleted before its launcher pod was created".into(),
                });
            } else {
                if !has(FOREGROUND_DELETE_FINALIZER) {
                    plan.add_foreground_finalizer = true;
                }
                plan.create_pod = true;
                // KubeVirt sees the pod it just created and moves on in the same reconcile.
                plan.phase = Some(Phase::Scheduling);
                plan.ready = ready_condition(phase, Some(&PodView::default()));
            }
        }
        Phase::Scheduling => match pod {
            None => {
                plan.phase = Some(Phase::Failed);
                plan.failure = Some(Failure {
                    reason: "PodNotExists".into(),
                    message: "the launcher pod disappeared before the VMI was scheduled".into(),
                });
            }
            Some(pod) => {
                plan.unschedulable = pod.unschedulable.clone();
                if pod.ready && !deleting {
                    if let Some(node) = pod.node_name.clone().filter(|n| !n.is_empty()) {
                        plan.phase = Some(Phase::Scheduled);
                        plan.node_name = Some(node);
                    }
                } else if pod.rejected_at_admission
                    && pod.admission_attempt < MAX_ADMISSION_ATTEMPTS
                    && !deleting
                {
                    // The kubelet refused the pod for what virt-handler's restart flips for a
                    // moment (its node's labels, its device plugins), after the scheduler had
                    // placed it: nothing ran, so a new pod is scheduled again. KubeVirt v1.9.0
                    // fails the VMI here; a handler restart during a burst would fail VMIs
                    // that were never started. The scheduler places the new pod only where the
                    // labels and devices are back; the attempts are bounded all the same.
                    let wait =
                        admission_backoff(pod.admission_attempt).saturating_sub(pod.age(now));
                    if wait.is_zero() {
                        plan.create_pod = true;
                        plan.admission_attempt = Some(pod.admission_attempt + 1);
                        plan.delete_pods.push(pod.name.clone());
                    } else {
                        plan.requeue_after = Some(wait);
                    }
                } else if pod.is_down_or_going_down() {
                    plan.phase = Some(Phase::Failed);
                    let detail = pod.failure.clone().unwrap_or_else(|| {
                        if pod.deleting {
                            "it is being deleted".into()
                        } else {
                            format!("its phase is {}", pod.phase)
                        }
                    });
                    plan.failure = Some(Failure {
                        reason: "PodTerminating".into(),
                        message: format!(
                            "launcher pod {} went down before the VMI was handed to a node: {detail}",
                            pod.name
                        ),
                    });
                }
            }
        },
        Phase::Scheduled | Phase::Running => {
            if pod.is_none() {
                plan.phase = Some(Phase::Failed);
                plan.failure = Some(Failure {
                    reason: "PodNotExists".into(),
                    message: format!("the launcher pod disappeared while the VMI was {phase}"),
                });
            } else if phase == Phase::Scheduled && !deleting {
                // Repair a hand-off whose label write was lost.
                let label = vmi
                    .metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(proto::kubevirt::well_known::NODE_NAME_LABEL));
                let node = vmi.status.as_ref().and_then(|s| s.node_name.clone());
                if let Some(node) = node
                    && label != Some(&node)
                {
                    plan.node_name = Some(node);
                }
            }
        }
        Phase::Succeeded | Phase::Failed => {
            if pods.is_empty() {
                for finalizer in [FOREGROUND_DELETE_FINALIZER, DEPRECATED_FOREGROUND_FINALIZER] {
                    if has(finalizer) {
                        plan.remove_finalizers.push(finalizer.to_string());
                    }
                }
            }
            if !owner_vm_exists && has(VM_CONTROLLER_FINALIZER) {
                plan.remove_finalizers
                    .push(VM_CONTROLLER_FINALIZER.to_string());
            }
        }
        Phase::WaitingForSync | Phase::Unknown => {}
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn vmi(phase: &str, deleting: bool, finalizers: &[&str]) -> VirtualMachineInstance {
        let mut v: VirtualMachineInstance = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v", "namespace": "n", "uid": "u", "finalizers": finalizers},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": phase},
        }))
        .expect("valid VMI");
        if deleting {
            v.metadata.deletion_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ));
        }
        v
    }

    fn pod(phase: &str, ready: bool, node: Option<&str>) -> PodView {
        PodView {
            name: "virt-launcher-v-abcde".into(),
            uid: "p".into(),
            node_name: node.map(str::to_string),
            phase: phase.into(),
            ready,
            ..Default::default()
        }
    }

    const FG: &str = FOREGROUND_DELETE_FINALIZER;

    #[test]
    fn phase_transitions() {
        struct Row {
            name: &'static str,
            phase: &'static str,
            deleting: bool,
            pods: Vec<PodView>,
            want_phase: Option<Phase>,
            want_create: bool,
            want_node: Option<&'static str>,
        }
        let rows = vec![
            Row {
                name: "new VMI gets a pod",
                phase: "",
                deleting: false,
                pods: vec![],
                want_phase: Some(Phase::Scheduling),
                want_create: true,
                want_node: None,
            },
            Row {
                name: "pending VMI gets a pod",
                phase: "Pending",
                deleting: false,
                pods: vec![],
                want_phase: Some(Phase::Scheduling),
                want_create: true,
                want_node: None,
            },
            Row {
                name: "pending VMI with a pod is scheduling",
                phase: "Pending",
                deleting: false,
                pods: vec![pod("Pending", false, None)],
                want_phase: Some(Phase::Scheduling),
                want_create: false,
                want_node: None,
            },
            Row {
                name: "deleted before a pod",
                phase: "Pending",
                deleting: true,
                pods: vec![],
                want_phase: Some(Phase::Failed),
                want_create: false,
                want_node: None,
            },
            Row {
                name: "pod not ready yet",
                phase: "Scheduling",
                deleting: false,
                pods: vec![pod("Pending", false, Some("n1"))],
                want_phase: None,
                want_create: false,
                want_node: None,
            },
            Row {
                name: "ready pod hands off",
                phase: "Scheduling",
                deleting: false,
                pods: vec![pod("Running", true, Some("n1"))],
                want_phase: Some(Phase::Scheduled),
                want_create: false,
                want_node: Some("n1"),
            },
            Row {
                name: "no hand-off while deleting",
                phase: "Scheduling",
                deleting: true,
                pods: vec![pod("Running", true, Some("n1"))],
                want_phase: None,
                want_create: false,
                want_node: None,
            },
            Row {
                name: "failed pod fails the VMI",
                phase: "Scheduling",
                deleting: false,
                pods: vec![pod("Failed", false, Some("n1"))],
                want_phase: Some(Phase::Failed),
                want_create: false,
                want_node: None,
            },
            Row {
                name: "vanished pod fails the VMI",
                phase: "Scheduling",
                deleting: false,
                pods: vec![],
                want_phase: Some(Phase::Failed),
                want_create: false,
                want_node: None,
            },
            Row {
                name: "scheduled keeps going",
                phase: "Scheduled",
                deleting: false,
                pods: vec![pod("Running", true, Some("n1"))],
                want_phase: None,
                want_create: false,
                want_node: None,
            },
            Row {
                name: "scheduled without pod fails",
                phase: "Scheduled",
                deleting: false,
                pods: vec![],
                want_phase: Some(Phase::Failed),
                want_create: false,
                want_node: None,
            },
            Row {
                name: "running without pod fails",
                phase: "Running",
                deleting: false,
                pods: vec![],
                want_phase: Some(Phase::Failed),
                want_create: false,
                want_node: None,
            },
            Row {
                name: "final stays final",
                phase: "Succeeded",
                deleting: false,
                pods: vec![],
                want_phase: None,
                want_create: false,
                want_node: None,
            },
        ];
        for row in rows {
            let plan = decide(&vmi(row.phase, row.deleting, &[FG]), &row.pods, true);
            assert_eq!(plan.phase, row.want_phase, "{}", row.name);
            assert_eq!(plan.create_pod, row.want_create, "{}", row.name);
            assert_eq!(plan.node_name.as_deref(), row.want_node, "{}", row.name);
            assert_eq!(
                plan.failure.is_some(),
                row.want_phase == Some(Phase::Failed),
                "{}",
                row.name
            );
        }
    }

    #[test]
    fn finalizer_added_before_the_pod() {
        let plan = decide(&vmi("", false, &[]), &[], true);
        assert!(plan.add_foreground_finalizer && plan.create_pod);
        let plan = decide(&vmi("", false, &[FG]), &[], true);
        assert!(!plan.add_foreground_finalizer);
    }

    #[test]
    fn deleted_vmi_deletes_its_pods_then_loses_the_finalizer() {
        let plan = decide(
            &vmi("Running", true, &[FG]),
            &[pod("Running", true, Some("n1"))],
            true,
        );
        assert_eq!(plan.delete_pods, vec!["virt-launcher-v-abcde".to_string()]);
        assert!(plan.remove_finalizers.is_empty());
        // A pod already being deleted is not deleted again.
        let mut going = pod("Running", true, Some("n1"));
        going.deleting = true;
        let plan = decide(&vmi("Running", true, &[FG]), &[going], true);
        assert!(plan.delete_pods.is_empty());
        // Final and no pods: the finalizers go.
        let plan = decide(
            &vmi(
                "Failed",
                true,
                &[FG, DEPRECATED_FOREGROUND_FINALIZER, VM_CONTROLLER_FINALIZER],
            ),
            &[],
            true,
        );
        assert_eq!(
            plan.remove_finalizers,
            vec![FG.to_string(), DEPRECATED_FOREGROUND_FINALIZER.to_string()]
        );
        let plan = decide(
            &vmi("Failed", true, &[FG, VM_CONTROLLER_FINALIZER]),
            &[],
            false,
        );
        assert_eq!(
            plan.remove_finalizers,
            vec![FG.to_string(), VM_CONTROLLER_FINALIZER.to_string()]
        );
    }

    #[test]
    fn finished_vmi_deletes_its_pod() {
        let plan = decide(
            &vmi("Succeeded", false, &[FG]),
            &[pod("Succeeded", false, Some("n1"))],
            true,
        );
        assert_eq!(plan.delete_pods.len(), 1);
        assert!(plan.remove_finalizers.is_empty());
    }

    #[test]
    fn failure_reason_names_the_pod() {
        let mut failed = pod("Failed", false, Some("n1"));
        failed.failure = Some("Evicted: out of memory".into());
        let plan = decide(&vmi("Scheduling", false, &[FG]), &[failed], true);
        let failure = plan.failure.expect("a failure");
        assert_eq!(failure.reason, "PodTerminating");
        assert!(
            failure.message.contains("virt-launcher-v-abcde")
                && failure.message.contains("Evicted"),
            "{}",
            failure.message
        );
    }

    /// A pod as the kubelet leaves it when it rejects it at admission (`reason`; as seen
    /// when the node's labels changed after scheduling), the `attempt`-th of its VMI.
    fn rejected_by_kubelet_attempt(reason: &str, ran: bool, attempt: Option<u32>) -> PodView {
        let annotations = match attempt {
            Some(n) => serde_json::json!({ADMISSION_ATTEMPT_ANNOTATION: n.to_string()}),
            None => serde_json::json!({}),
        };
        let mut pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "virt-launcher-v-rejct", "uid": "r",
                         "annotations": annotations,
                         "creationTimestamp": "2026-12-05T06:47:29Z"},
            "spec": {"nodeName": "n1", "containers": [{"name": "compute"}]},
            "status": {"phase": "Failed", "reason": reason,
                       "message": "Pod was rejected: Predicate NodeAffinity failed: node(s) didn't match Pod's node affinity/selector"}
        }))
        .unwrap();
        if ran {
            pod.status.as_mut().unwrap().container_statuses = Some(vec![
                serde_json::from_value(serde_json::json!({
                    "name": "compute", "ready": false, "restartCount": 0, "image": "i",
                    "imageID": "", "state": {"terminated": {"exitCode": 0}}
                }))
                .unwrap(),
            ]);
        }
        PodView::from_pod(&pod)
    }

    fn rejected_by_kubelet(reason: &str, ran: bool) -> PodView {
        rejected_by_kubelet_attempt(reason, ran, None)
    }

    #[test]
    fn a_pod_the_kubelet_rejected_for_the_handlers_state_is_replaced_not_failed() {
        // The node's labels; the device plugins unhealthy (seen in the burst scenario while
        // virt-handler restarted) or gone.
        for reason in [
            "NodeAffinity",
            "UnexpectedAdmissionError",
            "OutOfdevices.kubevirt.io/kvm",
        ] {
            let rejected = rejected_by_kubelet(reason, false);
            assert!(rejected.rejected_at_admission, "{reason}");
            let plan = decide(
                &vmi("Scheduling", false, &[FG]),
                std::slice::from_ref(&rejected),
                true,
            );
            assert!(plan.create_pod, "{reason}: {plan:?}");
            assert_eq!(plan.admission_attempt, Some(2), "{reason}");
            assert_eq!(plan.delete_pods, vec!["virt-launcher-v-rejct".to_string()]);
            assert_eq!((plan.phase, plan.failure), (None, None), "{reason}");
        }
        let rejected = rejected_by_kubelet("NodeAffinity", false);

        // Not at once: the replacement waits 2 s after the first pod was created, then 4 s ...
        let created = rejected.created.unwrap();
        let at = |seconds: i64| created + k8s_openapi::jiff::SignedDuration::from_secs(seconds);
        let plan = decide_at(
            &vmi("Scheduling", false, &[FG]),
            std::slice::from_ref(&rejected),
            true,
            at(1),
        );
        assert!(!plan.create_pod && plan.delete_pods.is_empty(), "{plan:?}");
        assert_eq!(plan.requeue_after, Some(std::time::Duration::from_secs(1)));
        assert_eq!((plan.phase, plan.failure), (None, None));
        let third = rejected_by_kubelet_attempt("NodeAffinity", false, Some(3));
        let plan = decide_at(
            &vmi("Scheduling", false, &[FG]),
            std::slice::from_ref(&third),
            true,
            at(7),
        );
        assert!(!plan.create_pod, "{plan:?}");
        let plan = decide_at(&vmi("Scheduling", false, &[FG]), &[third], true, at(8));
        assert!(plan.create_pod, "{plan:?}");

        // The attempts are bounded: the last rejected pod fails the VMI.
        let next = rejected_by_kubelet_attempt("UnexpectedAdmissionError", false, Some(3));
        let plan = decide(&vmi("Scheduling", false, &[FG]), &[next], true);
        assert_eq!(plan.admission_attempt, Some(4), "{plan:?}");
        let last = rejected_by_kubelet_attempt(
            "UnexpectedAdmissionError",
            false,
            Some(MAX_ADMISSION_ATTEMPTS),
        );
        let plan = decide(&vmi("Scheduling", false, &[FG]), &[last], true);
        assert!(!plan.create_pod, "{plan:?}");
        assert_eq!(plan.phase, Some(Phase::Failed), "{plan:?}");

        // Its replacement, created in the same second, is the pod that counts.
        let mut replacement = pod("Pending", false, None);
        replacement.created = rejected.created;
        for pods in [
            vec![rejected.clone(), replacement.clone()],
            vec![replacement.clone(), rejected.clone()],
        ] {
            assert_eq!(
                current_pod(&vmi("Scheduling", false, &[FG]), &pods)
                    .unwrap()
                    .name,
                replacement.name
            );
            let plan = decide(&vmi("Scheduling", false, &[FG]), &pods, true);
            assert!(!plan.create_pod && plan.failure.is_none(), "{plan:?}");
            // The rejected pod goes, even if the write after the replacement's creation
            // failed before.
            assert_eq!(plan.delete_pods, vec![rejected.name.clone()], "{plan:?}");
        }

        // Any other failure, a pod whose containers ran, or a VMI being deleted: Failed.
        for (pod, deleting) in [
            (rejected_by_kubelet("OutOfcpu", false), false),
            (
                rejected_by_kubelet("OutOfdevices.example.com/gpu", false),
                false,
            ),
            (rejected_by_kubelet("NodeAffinity", true), false),
            (rejected.clone(), true),
        ] {
            let plan = decide(&vmi("Scheduling", deleting, &[FG]), &[pod], true);
            assert!(!plan.create_pod, "{plan:?}");
            assert_eq!(plan.phase, Some(Phase::Failed), "{plan:?}");
        }
    }

    #[test]
    fn readiness_gate_follows_pause() {
        let plan = decide(
            &vmi("Scheduling", false, &[FG]),
            &[pod("Pending", false, Some("n1"))],
            true,
        );
        assert_eq!(
            plan.set_unpaused,
            Some(("virt-launcher-v-abcde".into(), true))
        );
        let mut set = pod("Running", true, Some("n1"));
        set.unpaused_condition = Some("True".into());
        let plan = decide(&vmi("Running", false, &[FG]), &[set.clone()], true);
        assert_eq!(plan.set_unpaused, None);
        let mut paused = vmi("Running", false, &[FG]);
        paused
            .status
            .as_mut()
            .unwrap()
            .conditions
            .push(proto::kubevirt::Condition {
                condition_type: "Paused".into(),
                status: "True".into(),
                ..Default::default()
            });
        let plan = decide(&paused, &[set], true);
        assert_eq!(
            plan.set_unpaused,
            Some(("virt-launcher-v-abcde".into(), false))
        );
        let plan = decide(
            &vmi("Failed", false, &[FG]),
            &[pod("Failed", false, Some("n1"))],
            true,
        );
        assert_eq!(plan.set_unpaused, None);
    }

    #[test]
    fn ready_follows_the_pod_once_the_guest_runs() {
        let mut ready_pod = pod("Running", true, Some("n1"));
        assert_eq!(ready_condition(Phase::Running, None).1, "PodNotExists");
        assert_eq!(
            ready_condition(Phase::Scheduled, Some(&ready_pod)).1,
            "GuestNotRunning"
        );
        assert_eq!(
            ready_condition(Phase::Running, Some(&ready_pod)).1,
            "PodConditionMissing"
        );
        ready_pod.ready_condition = Some(("True".into(), String::new(), String::new()));
        assert_eq!(ready_condition(Phase::Running, Some(&ready_pod)).0, "True");
        ready_pod.deleting = true;
        assert_eq!(
            ready_condition(Phase::Running, Some(&ready_pod)),
            (
                "False".into(),
                "PodTerminating".into(),
                "virt-launcher pod is terminating".into()
            )
        );
    }

    /// The fuzz target's entry point (`fuzz/fuzz_targets/vmi_decide.rs`) on random VMIs and
    /// pods: every plan is consistent, nothing panics.
    #[test]
    fn random_vmis_and_pods() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let phases = [
            "",
            "Pending",
            "Scheduling",
            "Scheduled",
            "Running",
            "Succeeded",
            "Failed",
            "WaitingForSync",
            "Unknown",
        ];
        let pod_phases = [
            "",
            "Pending",
            "Running",
            "Succeeded",
            "Failed",
            "Unknown",
            "bogus",
        ];
        for _ in 0..2000 {
            let finalizers: &[&str] = if rng.random_bool(0.5) { &[FG] } else { &[] };
            let v = vmi(
                phases[rng.random_range(0..phases.len())],
                rng.random_bool(0.3),
                finalizers,
            );
            let pods: Vec<PodView> = (0..rng.random_range(0..3))
                .map(|i| PodView {
                    name: format!("p{i}"),
                    phase: pod_phases[rng.random_range(0..pod_phases.len())].into(),
                    ready: rng.random_bool(0.5),
                    deleting: rng.random_bool(0.2),
                    node_name: rng.random_bool(0.7).then(|| "n1".to_string()),
                    ..Default::default()
                })
                .collect();
            let plan = decide(&v, &pods, rng.random_bool(0.5));
            assert!(
                !plan.create_pod || pods.is_empty(),
                "a second pod: {plan:?}"
            );
            assert!(
                !(plan.create_pod && v.metadata.deletion_timestamp.is_some()),
                "a pod for a deleted VMI"
            );
            if plan.phase == Some(Phase::Scheduled) {
                assert!(plan.node_name.is_some());
            }
            assert_eq!(
                plan.failure.is_some(),
                plan.phase == Some(Phase::Failed),
                "{plan:?}"
            );
        }
        // Raw bytes through the same parse as the fuzz target.
        for _ in 0..500 {
            let len = rng.random_range(0..64);
            let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
            if let Ok(v) = serde_json::from_slice::<VirtualMachineInstance>(&bytes) {
                let _ = decide(&v, &[], true);
            }
        }
    }

    #[test]
    fn lost_label_is_repaired() {
        let mut v = vmi("Scheduled", false, &[FG]);
        v.status.as_mut().unwrap().node_name = Some("n1".into());
        let plan = decide(&v, &[pod("Running", true, Some("n1"))], true);
        assert_eq!(plan.node_name.as_deref(), Some("n1"));
    }

    #[test]
    fn during_a_migration_the_pod_on_the_vmis_node_counts() {
        let mut running = vmi("Running", false, &[FG]);
        running.status.as_mut().unwrap().node_name = Some("n1".into());
        let mut source = pod("Running", true, Some("n1"));
        source.name = "source".into();
        source.created = Some(k8s_openapi::jiff::Timestamp::from_second(100).unwrap());
        let mut target = pod("Running", false, Some("n2"));
        target.name = "target".into();
        target.created = Some(k8s_openapi::jiff::Timestamp::from_second(200).unwrap());
        let pods = [source.clone(), target.clone()];
        assert_eq!(current_pod(&running, &pods).unwrap().name, "source");
        // The readiness gate goes on the pod running the VM, and nothing fails.
        let plan = decide(&running, &pods, true);
        assert_eq!(plan.set_unpaused, Some(("source".into(), true)), "{plan:?}");
        assert!(plan.failure.is_none() && plan.phase.is_none(), "{plan:?}");
        // Handed over: the target's node is the VMI's now.
        running.status.as_mut().unwrap().node_name = Some("n2".into());
        assert_eq!(current_pod(&running, &pods).unwrap().name, "target");
    }

    #[test]
    fn newest_pod_counts() {
        let mut old = pod("Failed", false, Some("n1"));
        old.created = Some(
            k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
        );
        old.name = "old".into();
        let mut new = pod("Running", true, Some("n2"));
        new.created = Some(k8s_openapi::jiff::Timestamp::now());
        let plan = decide(&vmi("Scheduling", false, &[FG]), &[old, new], true);
        assert_eq!(plan.node_name.as_deref(), Some("n2"));
    }
}
