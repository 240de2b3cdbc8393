//! The VMI's readiness and liveness probes on the compute container
//! (`rendercontainer.go` `WithReadinessProbe`/`WithLivelinessProbe`, `template.go` `copyProbe`):
//! KubeVirt's probe defaults, exec and guest-agent probes wrapped in `virt-probe`, and the
//! libvirt start-up delay added to the initial delay.

use super::TemplateError;
use k8s_openapi::api::core::v1::{ExecAction, Probe};
use proto::kubevirt::VirtualMachineInstance;
use serde::Deserialize;
use serde_json::Value;

/// Seconds added to a probe's initial delay: libvirt takes about that long to start
/// (`LibvirtStartupDelay`).
const LIBVIRT_STARTUP_DELAY_SECONDS: i32 = 10;

/// `v1.Probe`: a Kubernetes probe handler, KubeVirt's `guestAgentPing`, and the timings.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct VmiProbe {
    exec: Option<ExecAction>,
    http_get: Option<k8s_openapi::api::core::v1::HTTPGetAction>,
    tcp_socket: Option<k8s_openapi::api::core::v1::TCPSocketAction>,
    guest_agent_ping: Option<Value>,
    #[serde(default)]
    initial_delay_seconds: i32,
    #[serde(default)]
    timeout_seconds: i32,
    #[serde(default)]
    period_seconds: i32,
    #[serde(default)]
    success_threshold: i32,
    #[serde(default)]
    failure_threshold: i32,
}

/// The compute container's probe for `spec.readinessProbe` or `spec.livenessProbe`.
pub(super) fn render(
    vmi: &VirtualMachineInstance,
    probe: &Option<Value>,
    field: &str,
) -> Result<Option<Probe>, TemplateError> {
    let Some(value) = probe.as_ref().filter(|p| !p.is_null()) else {
        return Ok(None);
    };
    let mut probe: VmiProbe = serde_json::from_value(value.clone())
        .map_err(|e| TemplateError::Invalid(format!("{field}: {e}")))?;
    // `v1.SetDefaults_Probe`.
    if probe.timeout_seconds < 1 {
        probe.timeout_seconds = 1;
    }
    if probe.period_seconds < 1 {
        probe.period_seconds = 10;
    }
    if probe.success_threshold < 1 {
        probe.success_threshold = 1;
    }
    if probe.failure_threshold < 1 {
        probe.failure_threshold = 3;
    }
    let domain = format!(
        "{}_{}",
        vmi.metadata.namespace.as_deref().unwrap_or_default(),
        vmi.metadata.name.as_deref().unwrap_or_default()
    );
    let mut timeout = probe.timeout_seconds;
    let mut exec = probe.exec.clone();
    if probe
        .guest_agent_ping
        .as_ref()
        .is_some_and(|p| !p.is_null())
    {
        exec = Some(ExecAction {
            command: Some(vec![
                "virt-probe".into(),
                "--domainName".into(),
                domain,
                "--timeoutSeconds".into(),
                timeout.to_string(),
                "--guestAgentPing".into(),
            ]),
        });
        // One more second for the steps around the ping.
        timeout += 1;
    } else if let Some(command) = exec.as_mut().and_then(|e| e.command.as_mut())
        && command.first().is_some_and(|c| c != "virt-probe")
    {
        let mut wrapped = vec![
            "virt-probe".to_string(),
            "--domainName".into(),
            domain,
            "--timeoutSeconds".into(),
            timeout.to_string(),
            "--command".into(),
            command[0].clone(),
            "--".into(),
        ];
        wrapped.extend(command.iter().skip(1).cloned());
        *command = wrapped;
        timeout += 1;
    }
    // Go's `omitempty` drops zero-valued integers.
    let set = |n: i32| (n != 0).then_some(n);
    Ok(Some(Probe {
        exec,
        http_get: probe.http_get,
        tcp_socket: probe.tcp_socket,
        initial_delay_seconds: set(probe.initial_delay_seconds + LIBVIRT_STARTUP_DELAY_SECONDS),
        timeout_seconds: set(timeout),
        period_seconds: set(probe.period_seconds),
        success_threshold: set(probe.success_threshold),
        failure_threshold: set(probe.failure_threshold),
        ..Default::default()
    }))
}
