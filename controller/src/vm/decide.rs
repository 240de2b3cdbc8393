//! The VM controller's decisions as pure functions (KubeVirt v1.9.0
//! `pkg/virt-controller/watch/vm/vm.go`: `syncRunStrategy`, `setPrintableStatus`,
//! `calculateStartBackoffTime`, `isTrimFirstChangeRequestNeeded`).

use proto::kubevirt::{Phase, RunStrategy, VirtualMachine, VirtualMachineInstance};

/// `defaultMaxCrashLoopBackoffDelaySeconds`.
pub(crate) const MAX_START_BACKOFF_SECONDS: u64 = 300;

/// The run strategy of a VM (`vm.RunStrategy()`): `running` and `runStrategy` are exclusive;
/// neither means `Halted`.
pub fn run_strategy(vm: &VirtualMachine) -> Result<RunStrategy, String> {
    match (vm.spec.running, vm.spec.run_strategy) {
        (Some(_), Some(_)) => Err("running and runstrategy are mutually exclusive".into()),
        (Some(true), None) => Ok(RunStrategy::Always),
        (Some(false), None) | (None, None) => Ok(RunStrategy::Halted),
        (None, Some(strategy)) => Ok(strategy),
    }
}

/// The first state-change request of the VM (`status.stateChangeRequests[0]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ChangeRequest {
    Start,
    /// A stop for the VMI with this UID.
    Stop(Option<String>),
}

pub(crate) fn first_change_request(vm: &VirtualMachine) -> Option<ChangeRequest> {
    let status = vm.status.as_ref()?;
    let first = status.state_change_requests.first()?;
    match first.get("action").and_then(|a| a.as_str()) {
        Some("Start") => Some(ChangeRequest::Start),
        Some("Stop") => Some(ChangeRequest::Stop(
            first
                .get("uid")
                .and_then(|u| u.as_str())
                .map(str::to_string),
        )),
        _ => None,
    }
}

/// What the VMI looks like to the VM controller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VmiFacts {
    pub uid: String,
    pub phase: Phase,
    pub deleting: bool,
}

impl VmiFacts {
    pub fn of(vmi: &VirtualMachineInstance) -> Self {
        VmiFacts {
            uid: vmi.metadata.uid.clone().unwrap_or_default(),
            phase: vmi.phase(),
            deleting: vmi.metadata.deletion_timestamp.is_some(),
        }
    }
}

/// What `syncRunStrategy` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RunAction {
    Nothing,
    /// Create a VMI.
    Start,
    /// Delete the VMI; with `request_start`, append a start request so that a later
    /// reconcile starts a new one (RerunOnFailure after a failure).
    Stop {
        request_start: bool,
    },
    /// Starting is due but backing off after start failures: look again in this many seconds.
    WaitBackoff(u64),
}

/// `syncRunStrategy` for one VM. `backoff_left` is the time left of a start-failure back-off;
/// `status_run_strategy` is the strategy recorded in the VM status.
pub(crate) fn decide_run(
    strategy: RunStrategy,
    vmi: Option<&VmiFacts>,
    request: Option<&ChangeRequest>,
    status_run_strategy: Option<RunStrategy>,
    backoff_left: u64,
) -> Result<RunAction, String> {
    let stop_for_vmi =
        |vmi: &VmiFacts| matches!(request, Some(ChangeRequest::Stop(Some(uid))) if *uid == vmi.uid);
    let start_or_wait = || {
        if backoff_left > 0 {
            RunAction::WaitBackoff(backoff_left)
        } else {
            RunAction::Start
        }
    };
    // Deleting a VMI that is already being deleted does nothing (`stopVMI`).
    let stop = |vmi: &VmiFacts, request_start: bool| {
        if vmi.deleting {
            RunAction::Nothing
        } else {
            RunAction::Stop { request_start }
        }
    };
    Ok(match strategy {
        RunStrategy::Always => match vmi {
            Some(vmi) if stop_for_vmi(vmi) || vmi.phase.is_final() => stop(vmi, false),
            Some(_) => RunAction::Nothing,
            None => start_or_wait(),
        },
        RunStrategy::RerunOnFailure => match vmi {
            Some(vmi) => {
                let failed = vmi.phase == Phase::Failed;
                if !vmi.deleting && (stop_for_vmi(vmi) || failed || vmi.phase == Phase::Succeeded) {
                    RunAction::Stop {
                        request_start: failed,
                    }
                } else {
                    RunAction::Nothing
                }
            }
            None => {
                let start_requested = request == Some(&ChangeRequest::Start);
                if !start_requested && status_run_strategy == Some(RunStrategy::RerunOnFailure) {
                    RunAction::Nothing
                } else {
                    start_or_wait()
                }
            }
        },
        RunStrategy::Manual => match vmi {
            Some(vmi) if stop_for_vmi(vmi) => stop(vmi, false),
            Some(_) => RunAction::Nothing,
            None if request == Some(&ChangeRequest::Start) => RunAction::Start,
            None => RunAction::Nothing,
        },
        RunStrategy::Halted => match vmi {
            Some(vmi) => stop(vmi, false),
            None => RunAction::Nothing,
        },
        RunStrategy::Once => match vmi {
            Some(_) => RunAction::Nothing,
            None => RunAction::Start,
        },
        RunStrategy::WaitAsReceiver | RunStrategy::Unknown => {
            return Err(format!("unsupported run strategy {strategy:?}"));
        }
    })
}

/// Whether the first state-change request has been served and can be dropped.
pub(crate) fn change_request_done(request: Option<&ChangeRequest>, vmi: Option<&VmiFacts>) -> bool {
    match (request, vmi) {
        (Some(ChangeRequest::Start), Some(vmi)) => !vmi.deleting && !vmi.phase.is_final(),
        (Some(ChangeRequest::Stop(uid)), vmi) => match vmi {
            None => true,
            Some(vmi) => vmi.deleting || uid.as_deref() != Some(vmi.uid.as_str()),
        },
        _ => false,
    }
}

/// `status.printableStatus`, first match wins (a subset of v1.9.0's list: no migrations,
/// volumes or image pull states).
pub fn printable_status(
    vm_deleting: bool,
    vmi: Option<&VirtualMachineInstance>,
    start_expected: bool,
    stop_expected: bool,
    in_backoff: bool,
) -> &'static str {
    if vm_deleting {
        return "Terminating";
    }
    let condition = |vmi: &VirtualMachineInstance, kind: &str, status: &str| {
        vmi.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.condition_type == kind && c.status == status)
        })
    };
    if let Some(vmi) = vmi {
        let phase = vmi.phase();
        if !phase.is_final() && (vmi.metadata.deletion_timestamp.is_some() || stop_expected) {
            return "Stopping";
        }
        if phase == Phase::Running {
            return if condition(vmi, "Paused", "True") {
                "Paused"
            } else {
                "Running"
            };
        }
        let unschedulable = vmi.status.as_ref().is_some_and(|s| {
            s.conditions.iter().any(|c| {
                c.condition_type == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
        });
        if unschedulable {
            return "ErrorUnschedulable";
        }
        if matches!(
            phase,
            Phase::Unset | Phase::Pending | Phase::Scheduling | Phase::Scheduled
        ) {
            return "Starting";
        }
        if phase.is_final() {
            return if in_backoff {
                "CrashLoopBackOff"
            } else {
                "Stopped"
            };
        }
        return "Unknown";
    }
    if start_expected {
        "Starting"
    } else if in_backoff {
        "CrashLoopBackOff"
    } else {
        "Stopped"
    }
}

/// `calculateStartBackoffTime` without its random part: `max(maxDelay/30, 10) × failures²`,
/// capped; the caller adds up to half of it at random.
pub(crate) fn start_backoff_base(failures: u32, max_delay: u64) -> u64 {
    let failures = u64::from(failures.max(1));
    let interval = (max_delay / 30).max(10);
    (interval.saturating_mul(failures.saturating_mul(failures))).min(max_delay)
}

/// Whether a VMI ended without ever running (counts as a start failure).
pub(crate) fn failed_early(vmi: &VirtualMachineInstance) -> bool {
    vmi.phase().is_final()
        && !vmi.status.as_ref().is_some_and(|s| {
            s.phase_transition_timestamps
                .iter()
                .any(|t| t.phase == Phase::Running)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(phase: Phase, deleting: bool) -> VmiFacts {
        VmiFacts {
            uid: "u1".into(),
            phase,
            deleting,
        }
    }

    #[test]
    fn run_strategies_by_vmi_state() {
        use Phase::*;
        use RunAction::*;
        use RunStrategy::*;
        let stop = Stop {
            request_start: false,
        };
        let rows: Vec<(RunStrategy, Option<VmiFacts>, RunAction)> = vec![
            (Always, None, Start),
            (Always, Some(facts(Running, false)), Nothing),
            (Always, Some(facts(Scheduling, false)), Nothing),
            (Always, Some(facts(Failed, false)), stop.clone()),
            (Always, Some(facts(Succeeded, false)), stop.clone()),
            (Always, Some(facts(Failed, true)), Nothing),
            (RerunOnFailure, None, Start),
            (RerunOnFailure, Some(facts(Running, false)), Nothing),
            (
                RerunOnFailure,
                Some(facts(Failed, false)),
                Stop {
                    request_start: true,
                },
            ),
            (RerunOnFailure, Some(facts(Succeeded, false)), stop.clone()),
            (RerunOnFailure, Some(facts(Failed, true)), Nothing),
            (Halted, None, Nothing),
            (Halted, Some(facts(Running, false)), stop.clone()),
            (Halted, Some(facts(Pending, false)), stop.clone()),
            (Halted, Some(facts(Running, true)), Nothing),
            (Manual, None, Nothing),
            (Manual, Some(facts(Running, false)), Nothing),
            (Manual, Some(facts(Failed, false)), Nothing),
            (Once, None, Start),
            (Once, Some(facts(Succeeded, false)), Nothing),
            (Once, Some(facts(Failed, false)), Nothing),
        ];
        for (strategy, vmi, want) in rows {
            let got = decide_run(strategy, vmi.as_ref(), None, None, 0).unwrap();
            assert_eq!(got, want, "{strategy:?} with {vmi:?}");
        }
    }

    #[test]
    fn rerun_on_failure_restarts_only_after_failure() {
        // After the VMI that succeeded is gone, the recorded strategy stops a restart...
        let got = decide_run(
            RunStrategy::RerunOnFailure,
            None,
            None,
            Some(RunStrategy::RerunOnFailure),
            0,
        );
        assert_eq!(got, Ok(RunAction::Nothing));
        // ...unless the failure left a start request behind.
        let got = decide_run(
            RunStrategy::RerunOnFailure,
            None,
            Some(&ChangeRequest::Start),
            Some(RunStrategy::RerunOnFailure),
            0,
        );
        assert_eq!(got, Ok(RunAction::Start));
    }

    #[test]
    fn requests_and_backoff() {
        let running = facts(Phase::Running, false);
        let stop = ChangeRequest::Stop(Some("u1".into()));
        let other = ChangeRequest::Stop(Some("u2".into()));
        assert_eq!(
            decide_run(RunStrategy::Manual, Some(&running), Some(&stop), None, 0),
            Ok(RunAction::Stop {
                request_start: false
            })
        );
        assert_eq!(
            decide_run(RunStrategy::Manual, Some(&running), Some(&other), None, 0),
            Ok(RunAction::Nothing)
        );
        assert_eq!(
            decide_run(
                RunStrategy::Manual,
                None,
                Some(&ChangeRequest::Start),
                None,
                0
            ),
            Ok(RunAction::Start)
        );
        assert_eq!(
            decide_run(RunStrategy::Always, Some(&running), Some(&stop), None, 0),
            Ok(RunAction::Stop {
                request_start: false
            })
        );
        assert_eq!(
            decide_run(RunStrategy::Always, None, None, None, 12),
            Ok(RunAction::WaitBackoff(12))
        );
        assert!(decide_run(RunStrategy::WaitAsReceiver, None, None, None, 0).is_err());
    }

    #[test]
    fn change_requests_are_dropped_once_served() {
        let running = facts(Phase::Running, false);
        assert!(change_request_done(
            Some(&ChangeRequest::Start),
            Some(&running)
        ));
        assert!(!change_request_done(Some(&ChangeRequest::Start), None));
        assert!(change_request_done(
            Some(&ChangeRequest::Stop(Some("u1".into()))),
            None
        ));
        assert!(!change_request_done(
            Some(&ChangeRequest::Stop(Some("u1".into()))),
            Some(&running)
        ));
        assert!(change_request_done(
            Some(&ChangeRequest::Stop(Some("u1".into()))),
            Some(&facts(Phase::Running, true))
        ));
    }

    #[test]
    fn backoff_grows_quadratically_and_is_capped() {
        assert_eq!(start_backoff_base(1, 300), 10);
        assert_eq!(start_backoff_base(2, 300), 40);
        assert_eq!(start_backoff_base(3, 300), 90);
        assert_eq!(start_backoff_base(10, 300), 300);
        assert_eq!(start_backoff_base(0, 300), 10);
    }

    #[test]
    fn run_strategy_of_the_spec() {
        let mut vm = VirtualMachine::new("v", Default::default());
        assert_eq!(run_strategy(&vm), Ok(RunStrategy::Halted));
        vm.spec.running = Some(true);
        assert_eq!(run_strategy(&vm), Ok(RunStrategy::Always));
        vm.spec.run_strategy = Some(RunStrategy::Manual);
        assert!(run_strategy(&vm).is_err());
        vm.spec.running = None;
        assert_eq!(run_strategy(&vm), Ok(RunStrategy::Manual));
    }

    #[test]
    fn printable_statuses() {
        assert_eq!(
            printable_status(true, None, false, false, false),
            "Terminating"
        );
        assert_eq!(
            printable_status(false, None, false, false, false),
            "Stopped"
        );
        assert_eq!(
            printable_status(false, None, true, false, false),
            "Starting"
        );
        assert_eq!(
            printable_status(false, None, false, false, true),
            "CrashLoopBackOff"
        );
        let vmi = |phase: &str| -> VirtualMachineInstance {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}},
                "status": {"phase": phase}}))
            .unwrap()
        };
        assert_eq!(
            printable_status(false, Some(&vmi("Scheduling")), false, false, false),
            "Starting"
        );
        assert_eq!(
            printable_status(false, Some(&vmi("Running")), false, false, false),
            "Running"
        );
        assert_eq!(
            printable_status(false, Some(&vmi("Running")), false, true, false),
            "Stopping"
        );
        assert_eq!(
            printable_status(false, Some(&vmi("Succeeded")), false, false, false),
            "Stopped"
        );
    }
}
