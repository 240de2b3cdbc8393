//! `virtualmachines/{start,stop,restart}`: v1.9.0's `pkg/virt-api/rest/lifecycle.go`. virt-api
//! only writes what the user asked for (the run strategy, a state-change request, the VMI's
//! grace period); virt-controller's VM controller starts and stops the VMI.
//!
//! Each action is planned by a pure function of the VM, its VMI and the options ([`start`],
//! [`stop`], [`restart`]): the JSON patches in order, or the refusal.

use super::status::{ApiError, Kind};
use proto::kubevirt::{Condition, Phase, RunStrategy, VirtualMachine, VirtualMachineInstance};
use serde::Deserialize;
use serde_json::{Value, json};

/// `StartOptions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartOptions {
    #[serde(default)]
    pub paused: bool,
    #[serde(default)]
    pub dry_run: Vec<String>,
}

/// `StopOptions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StopOptions {
    pub grace_period: Option<i64>,
    #[serde(default)]
    pub dry_run: Vec<String>,
}

/// `RestartOptions`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestartOptions {
    pub grace_period_seconds: Option<i64>,
    #[serde(default)]
    pub dry_run: Vec<String>,
}

/// One write, in the order made.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// JSON patch of the VM's `status` subresource.
    VmStatus(Value),
    /// JSON patch of the VM.
    Vm(Value),
    /// JSON patch of the VMI (its grace period).
    Vmi(Value),
}

/// What an action does: the writes; for a forced restart the VMI patch that undoes the grace
/// period if the state-change request cannot be written; a refusal that comes only after a
/// write (a stop's grace period is written before the stop is judged, as in v1.9.0).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Plan {
    pub writes: Vec<Write>,
    pub rollback: Option<Value>,
    pub then_refuse: Option<ApiError>,
}

/// The message of `VMRecoveryRequired`/`VolumesChange` refusals.
const RECOVERY_REQUIRED: &str = "VM recovery required: Volume migration failed, leaving some volumes pointing to non-consistent targets; manual intervention is needed to reassign them to their original volumes.";

fn strategy_name(strategy: RunStrategy) -> &'static str {
    match strategy {
        RunStrategy::Always => "Always",
        RunStrategy::RerunOnFailure => "RerunOnFailure",
        RunStrategy::Halted => "Halted",
        RunStrategy::Manual => "Manual",
        RunStrategy::Once => "Once",
        RunStrategy::WaitAsReceiver => "WaitAsReceiver",
        RunStrategy::Unknown => "",
    }
}

fn run_strategy(vm: &VirtualMachine) -> Result<RunStrategy, ApiError> {
    controller::vm::decide::run_strategy(vm).map_err(ApiError::internal)
}

fn name(vm: &VirtualMachine) -> String {
    vm.metadata.name.clone().unwrap_or_default()
}

fn vmi_uid(vmi: &VirtualMachineInstance) -> String {
    vmi.metadata.uid.clone().unwrap_or_default()
}

/// A state-change request: `Start` (with `paused` as its data) or `Stop` of a VMI.
fn start_request(paused: bool) -> Value {
    if paused {
        json!({"action": "Start", "data": {"paused": "true"}})
    } else {
        json!({"action": "Start"})
    }
}

fn stop_request(uid: &str) -> Value {
    json!({"action": "Stop", "uid": uid})
}

/// `getChangeRequestJson`: the status patch adding `changes`, guarded by a test of the
/// current list; a list already holding requests may only be replaced by a lone stop.
pub fn change_request_patch(vm: &VirtualMachine, changes: Vec<Value>) -> Result<Value, ApiError> {
    let status = vm.status.clone().unwrap_or_default();
    let empty = serde_json::to_value(&status)
        .map(|v| v.as_object().is_none_or(|o| o.is_empty()))
        .unwrap_or(true);
    if empty {
        return Ok(
            json!([{"op": "add", "path": "/status", "value": {"stateChangeRequests": changes}}]),
        );
    }
    let current = if status.state_change_requests.is_empty() {
        Value::Null
    } else {
        Value::Array(status.state_change_requests.clone())
    };
    let mut ops =
        vec![json!({"op": "test", "path": "/status/stateChangeRequests", "value": current})];
    let lone_stop = changes.len() == 1 && changes[0]["action"] == "Stop";
    if status.state_change_requests.is_empty() {
        ops.push(json!({"op": "add", "path": "/status/stateChangeRequests", "value": changes}));
    } else if lone_stop {
        ops.push(json!({"op": "replace", "path": "/status/stateChangeRequests", "value": changes}));
    } else {
        return Err(ApiError::internal(
            "unable to complete request: stop/start already underway",
        ));
    }
    if status.start_failure.is_some() {
        ops.push(json!({"op": "remove", "path": "/status/startFailure"}));
    }
    Ok(Value::Array(ops))
}

/// `getRunningPatch`: the run strategy to `Always`/`Halted` (or the old `running` field).
pub fn running_patch(vm: &VirtualMachine, running: bool) -> Value {
    match vm.spec.run_strategy {
        Some(current) => {
            let wanted = if running { "Always" } else { "Halted" };
            json!([
                {"op": "test", "path": "/spec/runStrategy", "value": strategy_name(current)},
                {"op": "replace", "path": "/spec/runStrategy", "value": wanted},
            ])
        }
        None => json!([
            {"op": "test", "path": "/spec/running", "value": vm.spec.running},
            {"op": "replace", "path": "/spec/running", "value": running},
        ]),
    }
}

/// `patchVMITerminationGracePeriod`: the VMI's grace period to `seconds`, guarded by a test
/// of the old one (null when unset).
fn grace_patch(vmi: &VirtualMachineInstance, seconds: i64) -> Value {
    json!([
        {"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": vmi.spec.termination_grace_period_seconds},
        {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": seconds},
    ])
}

fn is_final(vmi: &VirtualMachineInstance) -> bool {
    vmi.phase().is_final()
}

/// `StartVMRequestHandler`, after the VM and VMI were read.
pub fn start(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    options: &StartOptions,
) -> Result<Plan, ApiError> {
    let name = name(vm);
    if let Some(vmi) = vmi
        && !is_final(vmi)
        && !matches!(vmi.phase(), Phase::Unknown | Phase::Unset)
    {
        return Err(ApiError::conflict(
            Kind::VirtualMachine,
            &name,
            "VM is already running",
        ));
    }
    if vm
        .condition("ManualRecoveryRequired")
        .is_some_and(Condition::is_true)
    {
        return Err(ApiError::conflict(
            Kind::VirtualMachine,
            &name,
            RECOVERY_REQUIRED,
        ));
    }
    let start = start_request(options.paused);
    let status = |changes| {
        Ok(Plan {
            writes: vec![Write::VmStatus(change_request_patch(vm, changes)?)],
            ..Default::default()
        })
    };
    match run_strategy(vm)? {
        // v1.9.0 compares the template's start strategy by pointer, so a paused start always
        // goes through a request.
        RunStrategy::Halted if options.paused => status(vec![start]),
        RunStrategy::Halted => Ok(Plan {
            writes: vec![Write::Vm(running_patch(vm, true))],
            ..Default::default()
        }),
        RunStrategy::Manual => match vmi {
            Some(vmi) if is_final(vmi) => status(vec![stop_request(&vmi_uid(vmi)), start]),
            _ => status(vec![start]),
        },
        RunStrategy::RerunOnFailure => match vmi.map(|v| (v, v.phase())) {
            Some((vmi, Phase::Succeeded)) => status(vec![stop_request(&vmi_uid(vmi)), start]),
            Some((_, Phase::Failed)) => Err(ApiError::conflict(
                Kind::VirtualMachine,
                &name,
                "RerunOnFailure does not support starting VM from failed state",
            )),
            _ => status(vec![start]),
        },
        strategy @ (RunStrategy::Always | RunStrategy::Once) => Err(ApiError::conflict(
            Kind::VirtualMachine,
            &name,
            &format!(
                "{} does not support manual start requests",
                strategy_name(strategy)
            ),
        )),
        RunStrategy::WaitAsReceiver | RunStrategy::Unknown => Ok(Plan::default()),
    }
}

/// `StopVMRequestHandler`, after the VM and VMI were read. A grace period for a running VMI is
/// written first, whatever follows (as v1.9.0).
pub fn stop(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    options: &StopOptions,
) -> Result<Plan, ApiError> {
    let name = name(vm);
    let strategy = run_strategy(vm)?;
    let running = vmi.filter(|v| !is_final(v));
    let mut plan = Plan::default();
    if let (Some(vmi), Some(grace)) = (running, options.grace_period) {
        plan.writes.push(Write::Vmi(grace_patch(vmi, grace)));
    }
    let not_running = || ApiError::conflict(Kind::VirtualMachine, &name, "VM is not running");
    let refuse = |mut plan: Plan, refusal: ApiError| {
        plan.then_refuse = Some(refusal);
        Ok(plan)
    };
    match strategy {
        RunStrategy::Halted => {
            let Some(vmi) = running else {
                return refuse(plan, not_running());
            };
            let old = vmi.spec.termination_grace_period_seconds;
            let shorter = match (options.grace_period, old) {
                (None, _) => false,
                (Some(grace), Some(old)) => grace < old,
                (Some(_), None) => true,
            };
            if !shorter {
                return refuse(
                    plan,
                    ApiError::conflict(
                        Kind::VirtualMachine,
                        &name,
                        "Halted only supports manual stop requests with a shorter graceperiod",
                    ),
                );
            }
            plan.writes.push(Write::VmStatus(change_request_patch(
                vm,
                vec![stop_request(&vmi_uid(vmi))],
            )?));
        }
        RunStrategy::Manual | RunStrategy::RerunOnFailure => {
            let Some(vmi) = running else {
                return refuse(plan, not_running());
            };
            plan.writes.push(Write::VmStatus(change_request_patch(
                vm,
                vec![stop_request(&vmi_uid(vmi))],
            )?));
        }
        RunStrategy::Always | RunStrategy::Once => {
            plan.writes.push(Write::Vm(running_patch(vm, false)));
        }
        RunStrategy::WaitAsReceiver | RunStrategy::Unknown => {}
    }
    Ok(plan)
}

/// The options' checks of `RestartVMRequestHandler`, before the VM is read.
pub fn check_restart_options(options: &RestartOptions) -> Result<(), ApiError> {
    match options.grace_period_seconds {
        Some(g) if g > 0 => Err(ApiError::bad_request(
            "For force restart, only gracePeriod=0 is supported for now",
        )),
        Some(g) if g < 0 => Err(ApiError::bad_request(
            "gracePeriod has to be greater or equal to 0",
        )),
        _ => Ok(()),
    }
}

/// `RestartVMRequestHandler`, after the VM and VMI were read: a stop of this VMI and a start,
/// for a forced restart the VMI's grace period set to 1 s first (undone if the request
/// cannot be written).
pub fn restart(
    vm: &VirtualMachine,
    vmi: Option<&VirtualMachineInstance>,
    options: &RestartOptions,
) -> Result<Plan, ApiError> {
    let name = name(vm);
    if vm
        .condition("VolumesChange")
        .is_some_and(Condition::is_true)
    {
        return Err(ApiError::conflict(
            Kind::VirtualMachine,
            &name,
            RECOVERY_REQUIRED,
        ));
    }
    let strategy = run_strategy(vm)?;
    if matches!(strategy, RunStrategy::Halted | RunStrategy::Once) {
        return Err(ApiError::conflict(
            Kind::VirtualMachine,
            &name,
            &format!(
                "RunStategy {} does not support manual restart requests",
                strategy_name(strategy)
            ),
        ));
    }
    let vmi = vmi.ok_or_else(|| {
        ApiError::conflict(Kind::VirtualMachine, &name, "VM is not running: Halted")
    })?;
    let mut plan = Plan::default();
    if options.grace_period_seconds == Some(0) {
        plan.writes.push(Write::Vmi(grace_patch(vmi, 1)));
        let old = vmi.spec.termination_grace_period_seconds.unwrap_or(0);
        plan.rollback = Some(json!([
            {"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": 1},
            {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": old},
        ]));
    }
    plan.writes.push(Write::VmStatus(change_request_patch(
        vm,
        vec![stop_request(&vmi_uid(vmi)), start_request(false)],
    )?));
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn vm(spec: Value, status: Value) -> VirtualMachine {
        let mut object = json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "vm1", "namespace": "ns"},
            "spec": spec,
        });
        if !status.is_null() {
            object["status"] = status;
        }
        serde_json::from_value(object).unwrap()
    }

    fn with_strategy(strategy: &str) -> VirtualMachine {
        vm(
            json!({"runStrategy": strategy, "template": {}}),
            json!({"printableStatus": "Stopped"}),
        )
    }

    fn vmi(phase: &str, grace: Option<i64>) -> VirtualMachineInstance {
        let mut spec = json!({"domain": {"devices": {}}});
        if let Some(g) = grace {
            spec["terminationGracePeriodSeconds"] = json!(g);
        }
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "vm1", "namespace": "ns", "uid": "u-1"},
            "spec": spec, "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn message(result: Result<Plan, ApiError>) -> (u16, String) {
        let e = result.unwrap_err();
        (e.code, e.message)
    }

    const CONFLICT: &str = "Operation cannot be fulfilled on virtualmachine.kubevirt.io \"vm1\": ";

    #[test]
    fn start_writes_what_v1_9_0_writes_per_run_strategy() {
        let none = StartOptions::default();
        let paused = StartOptions {
            paused: true,
            ..Default::default()
        };
        // Halted: the strategy to Always; paused: a start request.
        assert_eq!(
            start(&with_strategy("Halted"), None, &none).unwrap().writes,
            vec![Write::Vm(json!([
                {"op": "test", "path": "/spec/runStrategy", "value": "Halted"},
                {"op": "replace", "path": "/spec/runStrategy", "value": "Always"},
            ]))]
        );
        // The old `running` field, and a VM without status.
        let old = vm(json!({"running": false, "template": {}}), Value::Null);
        assert_eq!(
            start(&old, None, &none).unwrap().writes,
            vec![Write::Vm(json!([
                {"op": "test", "path": "/spec/running", "value": false},
                {"op": "replace", "path": "/spec/running", "value": true},
            ]))]
        );
        assert_eq!(
            start(&old, None, &paused).unwrap().writes,
            vec![Write::VmStatus(json!([
                {"op": "add", "path": "/status", "value": {"stateChangeRequests": [{"action": "Start", "data": {"paused": "true"}}]}},
            ]))]
        );
        // Manual with a finished VMI: stop it, then start.
        assert_eq!(
            start(
                &with_strategy("Manual"),
                Some(&vmi("Succeeded", None)),
                &none
            )
            .unwrap()
            .writes,
            vec![Write::VmStatus(json!([
                {"op": "test", "path": "/status/stateChangeRequests", "value": null},
                {"op": "add", "path": "/status/stateChangeRequests", "value": [{"action": "Stop", "uid": "u-1"}, {"action": "Start"}]},
            ]))]
        );
        // Refusals.
        assert_eq!(
            message(start(
                &with_strategy("Manual"),
                Some(&vmi("Running", None)),
                &none
            )),
            (409, format!("{CONFLICT}VM is already running"))
        );
        assert_eq!(
            message(start(&with_strategy("Always"), None, &none)),
            (
                409,
                format!("{CONFLICT}Always does not support manual start requests")
            )
        );
        assert_eq!(
            message(start(
                &with_strategy("RerunOnFailure"),
                Some(&vmi("Failed", None)),
                &none
            )),
            (
                409,
                format!("{CONFLICT}RerunOnFailure does not support starting VM from failed state")
            )
        );
        // A start already requested: no second one.
        let mut pending = with_strategy("Manual");
        pending.status.as_mut().unwrap().state_change_requests = vec![json!({"action": "Start"})];
        assert_eq!(
            message(start(&pending, None, &none)),
            (
                500,
                "Internal error occurred: unable to complete request: stop/start already underway"
                    .into()
            )
        );
        // WaitAsReceiver: nothing.
        assert_eq!(
            start(&with_strategy("WaitAsReceiver"), None, &none).unwrap(),
            Plan::default()
        );
    }

    #[test]
    fn stop_writes_what_v1_9_0_writes_per_run_strategy() {
        let none = StopOptions::default();
        let force = StopOptions {
            grace_period: Some(0),
            ..Default::default()
        };
        let running = vmi("Running", Some(30));
        assert_eq!(
            stop(&with_strategy("Always"), Some(&running), &none)
                .unwrap()
                .writes,
            vec![Write::Vm(json!([
                {"op": "test", "path": "/spec/runStrategy", "value": "Always"},
                {"op": "replace", "path": "/spec/runStrategy", "value": "Halted"},
            ]))]
        );
        // A grace period goes to the VMI first.
        assert_eq!(
            stop(&with_strategy("Manual"), Some(&running), &force)
                .unwrap()
                .writes,
            vec![
                Write::Vmi(json!([
                    {"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": 30},
                    {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": 0},
                ])),
                Write::VmStatus(json!([
                    {"op": "test", "path": "/status/stateChangeRequests", "value": null},
                    {"op": "add", "path": "/status/stateChangeRequests", "value": [{"action": "Stop", "uid": "u-1"}]},
                ])),
            ]
        );
        // Halted, the VMI still stopping: only a shorter grace period (a longer one is
        // written, then refused).
        let longer = StopOptions {
            grace_period: Some(60),
            ..Default::default()
        };
        let refused = stop(&with_strategy("Halted"), Some(&running), &longer).unwrap();
        assert_eq!(refused.writes.len(), 1);
        assert!(matches!(refused.writes[0], Write::Vmi(_)));
        assert_eq!(
            refused.then_refuse.map(|e| (e.code, e.message)),
            Some((
                409,
                format!(
                    "{CONFLICT}Halted only supports manual stop requests with a shorter graceperiod"
                )
            ))
        );
        let shorter = stop(&with_strategy("Halted"), Some(&running), &force).unwrap();
        assert_eq!((shorter.writes.len(), shorter.then_refuse), (2, None));
        let finished = stop(&with_strategy("Manual"), Some(&vmi("Failed", None)), &none).unwrap();
        assert_eq!(
            finished.then_refuse.map(|e| (e.code, e.message)),
            Some((409, format!("{CONFLICT}VM is not running")))
        );
        assert!(finished.writes.is_empty());
        // A pending start is replaced by the lone stop.
        let mut pending = with_strategy("Manual");
        pending.status.as_mut().unwrap().state_change_requests = vec![json!({"action": "Start"})];
        pending.status.as_mut().unwrap().start_failure = Some(json!({"retries": 1}));
        assert_eq!(
            stop(&pending, Some(&running), &none).unwrap().writes,
            vec![Write::VmStatus(json!([
                {"op": "test", "path": "/status/stateChangeRequests", "value": [{"action": "Start"}]},
                {"op": "replace", "path": "/status/stateChangeRequests", "value": [{"action": "Stop", "uid": "u-1"}]},
                {"op": "remove", "path": "/status/startFailure"},
            ]))]
        );
    }

    #[test]
    fn restart_stops_this_vmi_and_starts_again() {
        let none = RestartOptions::default();
        let running = vmi("Running", None);
        assert_eq!(
            restart(&with_strategy("Always"), Some(&running), &none).unwrap(),
            Plan {
                writes: vec![Write::VmStatus(json!([
                    {"op": "test", "path": "/status/stateChangeRequests", "value": null},
                    {"op": "add", "path": "/status/stateChangeRequests", "value": [{"action": "Stop", "uid": "u-1"}, {"action": "Start"}]},
                ]))],
                ..Default::default()
            }
        );
        let forced = restart(
            &with_strategy("Always"),
            Some(&running),
            &RestartOptions {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(
            forced.writes[0],
            Write::Vmi(json!([
                {"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": null},
                {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": 1},
            ]))
        );
        assert_eq!(
            forced.rollback,
            Some(json!([
                {"op": "test", "path": "/spec/terminationGracePeriodSeconds", "value": 1},
                {"op": "replace", "path": "/spec/terminationGracePeriodSeconds", "value": 0},
            ]))
        );
        assert_eq!(
            message(restart(&with_strategy("Halted"), None, &none)),
            (
                409,
                format!("{CONFLICT}RunStategy Halted does not support manual restart requests")
            )
        );
        assert_eq!(
            message(restart(&with_strategy("Manual"), None, &none)),
            (409, format!("{CONFLICT}VM is not running: Halted"))
        );
        for (grace, want) in [
            (
                5,
                "For force restart, only gracePeriod=0 is supported for now",
            ),
            (-1, "gracePeriod has to be greater or equal to 0"),
        ] {
            let e = check_restart_options(&RestartOptions {
                grace_period_seconds: Some(grace),
                ..Default::default()
            })
            .unwrap_err();
            assert_eq!((e.code, e.message.as_str()), (400, want));
        }
        let both = vm(
            json!({"running": true, "runStrategy": "Always", "template": {}}),
            Value::Null,
        );
        assert_eq!(
            message(restart(&both, Some(&running), &none)),
            (
                500,
                "Internal error occurred: running and runstrategy are mutually exclusive".into()
            )
        );
    }
}
