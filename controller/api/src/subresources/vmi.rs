//! VMI subresources that act on the running guest: `pause`, `unpause`, `softreboot`, `reset`,
//! `freeze`, `unfreeze` (v1.9.0 `pkg/virt-api/rest/lifecycle.go`, `subresource.go`). virt-api
//! judges the request from the VMI (pure functions here: [`check`]), then forwards it to the
//! handler of the VMI's node ([`forward`]), which has the launcher do it. The agent queries
//! (`guestosinfo`, `userlist`, `filesystemlist`) answer as v1.9.0 does without a guest agent.

use super::status::{ApiError, Kind};
use proto::kubevirt::{Condition, Phase, VirtualMachine, VirtualMachineInstance};

/// `PauseOptions`, `UnpauseOptions`.
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DryRunOptions {
    #[serde(default)]
    pub dry_run: Vec<String>,
}

fn conflict(vmi: &VirtualMachineInstance, message: &str) -> ApiError {
    ApiError::conflict(
        Kind::VirtualMachineInstance,
        vmi.metadata.name.as_deref().unwrap_or_default(),
        message,
    )
}

/// v1.9.0's checks of `action` on `vmi` before anything is forwarded (`unpause` also looks
/// at the VM of the same name, if there is one).
pub fn check(
    action: handler_api::Action,
    vmi: &VirtualMachineInstance,
    vm: Option<&VirtualMachine>,
) -> Result<(), ApiError> {
    use handler_api::Action;
    let running = vmi.phase() == Phase::Running;
    match action {
        Action::Pause => {
            if !running {
                return Err(conflict(vmi, "VM is not running"));
            }
            let probe = vmi.spec.liveness_probe.as_ref();
            if probe.is_some_and(|p| p.get("guestAgentPing").is_none_or(|g| g.is_null())) {
                return Err(ApiError::forbidden(
                    Kind::VirtualMachineInstance,
                    vmi.metadata.name.as_deref().unwrap_or_default(),
                    "Pausing VMIs with a non-GuestAgentPing LivenessProbe is not supported",
                ));
            }
            if vmi.condition("Paused").is_some() {
                return Err(conflict(vmi, "VMI is already paused"));
            }
        }
        Action::Unpause => {
            if let Some(vm) = vm
                && vm
                    .status
                    .as_ref()
                    .and_then(|s| s.extra.get("snapshotInProgress"))
                    .is_some_and(|s| !s.is_null())
            {
                return Err(ApiError::conflict(
                    Kind::VirtualMachine,
                    vm.metadata.name.as_deref().unwrap_or_default(),
                    "VM snapshot is in progress",
                ));
            }
            if !running {
                return Err(conflict(vmi, "VMI is not running"));
            }
            if vmi.condition("Paused").is_none() {
                return Err(conflict(vmi, "VMI is not paused"));
            }
        }
        Action::SoftReboot => {
            if !running {
                return Err(conflict(vmi, "VM is not running"));
            }
            if vmi.condition("Paused").is_some_and(Condition::is_true) {
                return Err(conflict(vmi, "VMI is paused"));
            }
            let acpi_off = vmi
                .spec
                .domain
                .features
                .as_ref()
                .and_then(|f| f.acpi.as_ref())
                .and_then(|a| a.enabled)
                == Some(false);
            if vmi.condition("AgentConnected").is_none() && acpi_off {
                return Err(conflict(
                    vmi,
                    "VMI neither have the agent connected nor the ACPI feature enabled",
                ));
            }
        }
        // v1.9.0 checks nothing before a reset; its errors name the phase afterwards.
        Action::Reset => {}
        Action::Freeze => {
            if !running {
                return Err(conflict(vmi, "VM is not running"));
            }
        }
        Action::Unfreeze => {
            if !running {
                return Err(conflict(vmi, "VMI is not running"));
            }
        }
    }
    Ok(())
}

/// The console's own checks (v1.9.0 `console.go`): a serial console at all, a VMI that runs.
pub fn check_console(vmi: &VirtualMachineInstance) -> Result<(), ApiError> {
    if vmi.spec.domain.devices.autoattach_serial_console == Some(false) {
        return Err(ApiError::bad_request("No serial consoles are present."));
    }
    match vmi.phase() {
        Phase::Failed => Err(conflict(vmi, "VMI is in failed status")),
        Phase::Running => Ok(()),
        _ => Err(ApiError::bad_request("VMI is not running")),
    }
}

/// `validateVMIForPortForward`: a paused VMI is refused.
pub fn check_port_forward(vmi: &VirtualMachineInstance) -> Result<(), ApiError> {
    if vmi.condition("Paused").is_some() {
        return Err(conflict(vmi, "VMI is paused"));
    }
    Ok(())
}

/// `ValidateVMIForConnection`'s phase check: a handler is asked only for a VMI it runs.
pub fn check_connectable(vmi: &VirtualMachineInstance) -> Result<(), ApiError> {
    let phase = vmi.phase();
    if matches!(phase, Phase::Running | Phase::Scheduled) {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "Unable to connect to VirtualMachineInstance because phase is {} instead of Running or Scheduled",
            phase.as_str()
        )))
    }
}

/// A reset's error names a VMI that was not running (v1.9.0 `ResetVMIRequestHandler`).
pub fn reset_error(vmi: Option<&VirtualMachineInstance>, mut error: ApiError) -> ApiError {
    if let Some(vmi) = vmi
        && vmi.phase() != Phase::Running
    {
        let prefix = format!(
            "Failed to reset non-running VMI with phase {}: ",
            vmi.phase().as_str()
        );
        error.message = match error.message.strip_prefix("Internal error occurred: ") {
            Some(rest) => format!("Internal error occurred: {prefix}{rest}"),
            None => format!("{prefix}{}", error.message),
        };
    }
    error
}

/// The agent queries without an agent: v1.9.0 refuses them with a conflict, written as plain
/// text with 500 (`response.WriteError`).
pub fn agent_query(vmi: Option<&VirtualMachineInstance>, name: &str) -> ApiError {
    let Some(vmi) = vmi else {
        return ApiError::not_found(Kind::VirtualMachineInstance, name).as_plain(500);
    };
    if vmi.phase() != Phase::Running {
        return conflict(vmi, "VMI is not running").as_plain(500);
    }
    // No launcher here reports a guest agent, so a VMI never has `AgentConnected`.
    conflict(vmi, "VMI does not have guest agent connected").as_plain(500)
}

#[cfg(test)]
mod tests {
    use super::*;
    use handler_api::Action;
    use serde_json::{Value, json};

    fn vmi(phase: &str, conditions: Value, spec_extra: Value) -> VirtualMachineInstance {
        let mut spec = json!({"domain": {"devices": {}}});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), spec_extra.as_object()) {
            for (k, v) in extra {
                spec.insert(k.clone(), v.clone());
            }
        }
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
            "metadata": {"name": "v1", "namespace": "ns", "uid": "u"},
            "spec": spec,
            "status": {"phase": phase, "conditions": conditions},
        }))
        .unwrap()
    }

    fn refusal(action: Action, vmi: &VirtualMachineInstance) -> Option<(u16, String)> {
        check(action, vmi, None).err().map(|e| (e.code, e.message))
    }

    const CONFLICT: &str =
        "Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io \"v1\": ";

    #[test]
    fn what_each_action_refuses() {
        let running = vmi("Running", json!([]), json!({}));
        let paused = vmi(
            "Running",
            json!([{"type": "Paused", "status": "True", "reason": "PausedByUser"}]),
            json!({}),
        );
        let scheduled = vmi("Scheduled", json!([]), json!({}));
        for action in [
            Action::Pause,
            Action::SoftReboot,
            Action::Freeze,
            Action::Reset,
        ] {
            assert_eq!(refusal(action, &running), None, "{action:?}");
        }
        assert_eq!(refusal(Action::Unpause, &paused), None);
        assert_eq!(
            refusal(Action::Pause, &paused),
            Some((409, format!("{CONFLICT}VMI is already paused")))
        );
        assert_eq!(
            refusal(Action::Unpause, &running),
            Some((409, format!("{CONFLICT}VMI is not paused")))
        );
        assert_eq!(
            refusal(Action::SoftReboot, &paused),
            Some((409, format!("{CONFLICT}VMI is paused")))
        );
        assert_eq!(
            refusal(Action::Pause, &scheduled),
            Some((409, format!("{CONFLICT}VM is not running")))
        );
        assert_eq!(
            refusal(Action::Unfreeze, &scheduled),
            Some((409, format!("{CONFLICT}VMI is not running")))
        );
        assert_eq!(refusal(Action::Reset, &scheduled), None);
        let probed = vmi(
            "Running",
            json!([]),
            json!({"livenessProbe": {"httpGet": {"port": 80}}}),
        );
        assert_eq!(
            refusal(Action::Pause, &probed),
            Some((
                403,
                "virtualmachineinstance.kubevirt.io \"v1\" is forbidden: Pausing VMIs with a non-GuestAgentPing LivenessProbe is not supported".into()
            ))
        );
        let agent_probe = vmi(
            "Running",
            json!([]),
            json!({"livenessProbe": {"guestAgentPing": {}}}),
        );
        assert_eq!(refusal(Action::Pause, &agent_probe), None);
        let no_acpi = vmi(
            "Running",
            json!([]),
            json!({"domain": {"devices": {}, "features": {"acpi": {"enabled": false}}}}),
        );
        assert_eq!(
            refusal(Action::SoftReboot, &no_acpi),
            Some((
                409,
                format!(
                    "{CONFLICT}VMI neither have the agent connected nor the ACPI feature enabled"
                )
            ))
        );
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "v1"}, "spec": {"template": {}},
            "status": {"snapshotInProgress": "snap-1"},
        }))
        .unwrap();
        assert_eq!(
            check(Action::Unpause, &paused, Some(&vm))
                .unwrap_err()
                .message,
            "Operation cannot be fulfilled on virtualmachine.kubevirt.io \"v1\": VM snapshot is in progress"
        );
    }

    #[test]
    fn a_paused_vmi_forwards_no_port() {
        assert!(check_port_forward(&vmi("Running", json!([]), json!({}))).is_ok());
        let paused = vmi(
            "Running",
            json!([{"type": "Paused", "status": "True", "reason": "PausedByUser"}]),
            json!({}),
        );
        let e = check_port_forward(&paused).unwrap_err();
        assert_eq!(e.code, 409);
        assert!(e.message.ends_with(": VMI is paused"), "{}", e.message);
    }

    #[test]
    fn handlers_are_asked_only_for_vmis_they_run() {
        assert!(check_connectable(&vmi("Running", json!([]), json!({}))).is_ok());
        assert!(check_connectable(&vmi("Scheduled", json!([]), json!({}))).is_ok());
        let e = check_connectable(&vmi("Succeeded", json!([]), json!({}))).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                400,
                "Unable to connect to VirtualMachineInstance because phase is Succeeded instead of Running or Scheduled"
            )
        );
        let wrapped = reset_error(Some(&vmi("Succeeded", json!([]), json!({}))), e);
        assert!(
            wrapped
                .message
                .starts_with("Failed to reset non-running VMI with phase Succeeded: Unable"),
            "{}",
            wrapped.message
        );
    }

    #[test]
    fn agent_queries_without_an_agent() {
        let e = agent_query(Some(&vmi("Running", json!([]), json!({}))), "v1");
        assert_eq!(
            (e.code, e.plain, e.message.as_str()),
            (
                500,
                true,
                "Operation cannot be fulfilled on virtualmachineinstance.kubevirt.io \"v1\": VMI does not have guest agent connected"
            )
        );
        let missing = agent_query(None, "v1");
        assert_eq!(
            (missing.code, missing.message.as_str()),
            (500, "virtualmachineinstance.kubevirt.io \"v1\" not found")
        );
    }
}
