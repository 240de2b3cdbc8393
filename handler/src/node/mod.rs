//! What the handler says about its node: the heartbeat (`kubevirt.io/schedulable` and
//! `kubevirt.io/heartbeat`, KubeVirt's `pkg/virt-handler/heartbeat`) and the node
//! labels launcher pods select on (KubeVirt's `pkg/virt-handler/node-labeller`).
//!
//! Both patch only the handler's own Node and need `get` and `patch` on nodes.
//! [`NodeServices`] runs them with the device plugins, in KubeVirt's order.

pub mod heartbeat;
pub mod labeller;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::deviceplugins::{DevicePluginConfig, DevicePlugins, GenericDevice};

pub use heartbeat::{Heartbeat, HeartbeatConfig};
pub use labeller::NodeLabeller;

/// The node side of the Kubernetes mode: device plugins, heartbeat, node labeller.
pub struct NodeServices {
    plugins: DevicePlugins,
    stop: watch::Sender<bool>,
    heartbeat: JoinHandle<()>,
    labeller: Option<JoinHandle<()>>,
}

impl NodeServices {
    /// Marks the node unschedulable (KubeVirt does so first thing), then starts the
    /// device plugins, the heartbeat and (when `label_node`) the node labeller.
    pub async fn start(
        nodes: Api<Node>,
        node: &str,
        plugins: DevicePluginConfig,
        devices: Vec<GenericDevice>,
        heartbeat: HeartbeatConfig,
        label_node: bool,
    ) -> Self {
        heartbeat::mark_unschedulable(&nodes, node).await;
        let plugins = DevicePlugins::start(plugins, devices);
        let ready = plugins.readiness();
        let (stop, stopped) = watch::channel(false);
        let beat = Heartbeat::new(
            nodes.clone(),
            node,
            Arc::new(move || ready.all_registered()),
            heartbeat,
        );
        let heartbeat = tokio::spawn(beat.run(stopped.clone()));
        let labeller =
            label_node.then(|| tokio::spawn(NodeLabeller::new(nodes, node).run(stopped)));
        NodeServices {
            plugins,
            stop,
            heartbeat,
            labeller,
        }
    }

    pub fn plugins(&self) -> &DevicePlugins {
        &self.plugins
    }

    /// Graceful stop: the heartbeat labels the node unschedulable, then the device
    /// plugins deregister and remove their sockets. VMs are not touched.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.heartbeat.await;
        self.plugins.stop().await;
        if let Some(labeller) = self.labeller {
            let _ = labeller.await;
        }
    }
}

/// Waits until `stop` turns true (or its sender is gone).
pub(crate) async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// `wait.Jitter`: `base` plus a random share of up to `factor × base`.
pub(crate) fn jittered(base: Duration, factor: f64, random: f64) -> Duration {
    let factor = if factor > 0.0 { factor } else { 0.0 };
    base + base.mul_f64(factor * random.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_within_base_and_base_times_one_plus_factor() {
        let minute = Duration::from_secs(60);
        assert_eq!(jittered(minute, 1.2, 0.0), minute);
        assert_eq!(jittered(minute, 1.2, 1.0), Duration::from_secs(132));
        assert_eq!(jittered(minute, 1.2, 0.5), Duration::from_secs(96));
        assert_eq!(jittered(minute, 0.0, 0.7), minute);
        assert_eq!(jittered(minute, 1.2, 7.0), Duration::from_secs(132));
    }
}
