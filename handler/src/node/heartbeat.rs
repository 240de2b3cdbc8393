//! The node heartbeat, as KubeVirt v1.9.0's (`pkg/virt-handler/heartbeat/heartbeat.go`).
//!
//! Each beat is one strategic merge patch of the Node: `kubevirt.io/schedulable` is
//! `"true"` exactly when every device plugin is registered with the kubelet (v1.9.0's
//! rule: `DeviceController.Initialized`; a plugin whose device node is missing still
//! registers, with no healthy device, so its resource has no allocatable and pods needing
//! it stay Pending), the `cpumanager` labels are `"false"` (KubeVirt's CPUManager feature
//! gate is alpha and off by default; this handler has no CPU pinning), and
//! `kubevirt.io/heartbeat` is the time (RFC 3339, seconds).
//!
//! Timing: one beat at start, a wait of up to 10 s (polled every second) for the device
//! plugins, then a beat every minute with a jitter factor of 1.2 (every 60 to 132 s).
//! When it stops, the node is labelled unschedulable (retried 4 times, 10 ms apart,
//! growing fivefold). The handler also marks the node unschedulable once at start, before
//! anything else ([`mark_unschedulable`]).

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use proto::kubevirt::well_known::{
    CPU_MANAGER_LABEL, DEPRECATED_CPU_MANAGER_LABEL, HEARTBEAT_ANNOTATION, SCHEDULABLE_LABEL,
};
use serde_json::{Value, json};
use tokio::sync::watch;

/// Whether the device plugins are ready (all registered).
pub type PluginsReady = Arc<dyn Fn() -> bool + Send + Sync>;

/// The heartbeat's timing (KubeVirt's numbers by default).
#[derive(Debug, Clone)]
pub struct HeartbeatConfig {
    /// Between beats, before jitter (`heartBeatInterval`: 1 min).
    pub interval: Duration,
    /// Jitter factor (1.2: the pause is 1 to 2.2 intervals).
    pub jitter: f64,
    /// How often the start-up wait asks the device plugins (`devicePluginPollIntervall`).
    pub plugin_poll: Duration,
    /// How long the start-up wait lasts at most (`devicePluginWaitTimeout`).
    pub plugin_wait: Duration,
}

impl Default for HeartbeatConfig {
    fn default() -> Self {
        HeartbeatConfig {
            interval: Duration::from_secs(60),
            jitter: 1.2,
            plugin_poll: Duration::from_secs(1),
            plugin_wait: Duration::from_secs(10),
        }
    }
}

/// `metav1.Time` in JSON: RFC 3339 in UTC, whole seconds.
pub(crate) fn heartbeat_time(now: Timestamp) -> String {
    Timestamp::from_second(now.as_second())
        .unwrap_or(now)
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The strategic merge patch of one beat (KubeVirt's `do` and, with `schedulable`
/// false, `labelNodeUnschedulable`).
pub(crate) fn heartbeat_patch(schedulable: bool, now: Timestamp) -> Value {
    json!({"metadata": {
        "labels": {
            SCHEDULABLE_LABEL: schedulable.to_string(),
            DEPRECATED_CPU_MANAGER_LABEL: "false",
            CPU_MANAGER_LABEL: "false",
        },
        "annotations": {HEARTBEAT_ANNOTATION: heartbeat_time(now)},
    }})
}

/// The start-up patch (`markNodeAsUnschedulable`): the label alone.
pub(crate) fn unschedulable_patch() -> Value {
    json!({"metadata": {"labels": {SCHEDULABLE_LABEL: "false"}}})
}

/// Marks `node` unschedulable once, at start and on shutdown (a failure is only logged:
/// the heartbeat writes the real state soon after).
pub async fn mark_unschedulable(nodes: &Api<Node>, node: &str) {
    if let Err(e) = nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Strategic(unschedulable_patch()),
        )
        .await
    {
        tracing::error!(%node, error = %e, "Unable to mark node as unschedulable");
    }
}

pub struct Heartbeat {
    nodes: Api<Node>,
    node: String,
    plugins_ready: PluginsReady,
    config: HeartbeatConfig,
}

impl Heartbeat {
    pub fn new(
        nodes: Api<Node>,
        node: &str,
        plugins_ready: PluginsReady,
        config: HeartbeatConfig,
    ) -> Self {
        Heartbeat {
            nodes,
            node: node.to_string(),
            plugins_ready,
            config,
        }
    }

    /// One beat: the label from the device plugins' state, the time.
    pub async fn beat(&self) -> Result<bool, kube::Error> {
        let schedulable = (self.plugins_ready)();
        let patch = heartbeat_patch(schedulable, Timestamp::now());
        self.nodes
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Strategic(patch),
            )
            .await?;
        tracing::debug!(node = %self.node, schedulable, "heartbeat sent");
        Ok(schedulable)
    }

    async fn beat_logged(&self) {
        if let Err(e) = self.beat().await {
            tracing::error!(node = %self.node, error = %e, "Can't patch node");
        }
    }

    /// Runs until `stop` turns true, then labels the node unschedulable.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        // The node must show the real state at once: above all "false" while the device
        // plugins are not registered yet, or pods land here and the kubelet rejects them.
        self.beat_logged().await;
        self.wait_for_device_plugins(&mut stop).await;
        while !*stop.borrow() {
            self.beat_logged().await;
            let pause = super::jittered(self.config.interval, self.config.jitter, rand::random());
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = super::stopped(&mut stop) => break,
            }
        }
        self.label_unschedulable().await;
    }

    /// Gives the device plugins up to `plugin_wait` to register, so a healthy node is
    /// marked schedulable right away instead of after the first interval.
    async fn wait_for_device_plugins(&self, stop: &mut watch::Receiver<bool>) {
        let deadline = tokio::time::Instant::now() + self.config.plugin_wait;
        loop {
            if *stop.borrow() || (self.plugins_ready)() {
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(self.config.plugin_poll) => {}
                _ = super::stopped(stop) => return,
            }
        }
    }

    /// `labelNodeUnschedulable`, with client-go's `retry.DefaultBackoff` (4 tries).
    pub async fn label_unschedulable(&self) {
        let mut pause = Duration::from_millis(10);
        for attempt in 1..=4 {
            let patch = heartbeat_patch(false, Timestamp::now());
            match self
                .nodes
                .patch(
                    &self.node,
                    &PatchParams::default(),
                    &Patch::Strategic(patch),
                )
                .await
            {
                Ok(_) => {
                    tracing::info!(node = %self.node, "node marked unschedulable");
                    return;
                }
                Err(e) => {
                    tracing::error!(node = %self.node, attempt, error = %e, "Can't patch node");
                }
            }
            if attempt < 4 {
                tokio::time::sleep(pause).await;
                pause *= 5;
            }
        }
        tracing::warn!(node = %self.node, "Failed to set node unschedulable");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_patch_carries_kubevirt_keys_and_a_seconds_timestamp() {
        let now: Timestamp = "2026-05-04T03:02:01.987654Z".parse().expect("time");
        assert_eq!(
            heartbeat_patch(true, now),
            json!({"metadata": {
                "labels": {
                    "kubevirt.io/schedulable": "true",
                    "cpumanager": "false",
                    "kubevirt.io/cpumanager": "false",
                },
                "annotations": {"kubevirt.io/heartbeat": "2026-05-04T03:02:01Z"},
            }})
        );
        assert_eq!(
            heartbeat_patch(false, now)["metadata"]["labels"]["kubevirt.io/schedulable"],
            "false"
        );
        assert_eq!(
            unschedulable_patch(),
            json!({"metadata": {"labels": {"kubevirt.io/schedulable": "false"}}})
        );
    }

    #[test]
    fn defaults_are_kubevirts() {
        let c = HeartbeatConfig::default();
        assert_eq!(c.interval, Duration::from_secs(60));
        assert_eq!(c.jitter, 1.2);
        assert_eq!(c.plugin_poll, Duration::from_secs(1));
        assert_eq!(c.plugin_wait, Duration::from_secs(10));
    }
}
