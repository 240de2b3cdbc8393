//! The `KubeVirt` CR (kubevirt.io/v1 `kubevirts`) as the one configuration source, as in
//! KubeVirt v1.9.0: every reconcile reads the configuration in force from the CRs of the
//! controller's namespace ([`config::ClusterConfig`]), and the leader writes the CR's status
//! as virt-operator would ([`status`]), `Deployed` once virt-handler's pods are ready.

pub mod config;
pub mod status;

pub use config::{ClusterConfig, Refusal};

use crate::writes::{Write, Writes};
use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Patch, PatchParams};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Client, ResourceExt};
use proto::kubevirt::KubeVirt;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// virt-handler's DaemonSet, whose readiness makes the install `Deployed`.
pub const HANDLER_DAEMONSET: &str = "virt-handler";

/// This machine's architecture as Go names it (`runtime.GOARCH`, what virt-operator records).
fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// What the status writer needs.
pub(crate) struct StatusWriter {
    pub client: Client,
    pub namespace: String,
    pub config: Arc<ClusterConfig>,
    pub kubevirts: Store<KubeVirt>,
    pub daemonsets: Store<DaemonSet>,
    /// The launcher image: the install's registry and version.
    pub launcher_image: String,
    pub writes: Arc<Writes>,
}

impl StatusWriter {
    /// Brings every CR's status to what [`status::desired`] says, each time `wake` is
    /// notified (a CR or the DaemonSet changed), until the future is dropped. Only the leader
    /// runs it.
    pub(crate) async fn run(self, wake: Arc<Notify>) {
        if self.kubevirts.wait_until_ready().await.is_err()
            || self.daemonsets.wait_until_ready().await.is_err()
        {
            return; // the watch ended before its first list; the caller reports it
        }
        let (registry, version) = status::registry_and_version(&self.launcher_image);
        let api: Api<KubeVirt> = Api::namespaced(self.client.clone(), &self.namespace);
        let mut several = false;
        // Resource versions written, by UID: a cache older than our write waits for its
        // event instead of computing (and conflicting) again.
        let mut written: HashMap<String, u64> = HashMap::new();
        loop {
            let all = self.kubevirts.state();
            if all.len() > 1 && !several {
                tracing::error!(
                    namespace = %self.namespace,
                    count = all.len(),
                    "More than one KubeVirt CR detected, ensure that KubeVirt is only installed once."
                );
            }
            several = all.len() > 1;
            // Asked here too so that a CR change is logged (and refused) at once.
            self.config.current();
            let refused = self.config.refusal();
            let handler = self
                .daemonsets
                .get(&ObjectRef::new(HANDLER_DAEMONSET).within(&self.namespace));
            let mut retry = false;
            written.retain(|uid, _| all.iter().any(|kv| kv.metadata.uid.as_ref() == Some(uid)));
            for kv in &all {
                let uid = kv.metadata.uid.clone().unwrap_or_default();
                // Resource versions are opaque, but the API server's are etcd revisions.
                let cached = kv.resource_version().and_then(|v| v.parse::<u64>().ok());
                if let (Some(cached), Some(wrote)) = (cached, written.get(&uid))
                    && cached < *wrote
                {
                    continue;
                }
                let refusal = refused
                    .as_ref()
                    .filter(|(selected, _)| selected.metadata.uid == kv.metadata.uid)
                    .map(|(_, refusal)| refusal.to_string());
                let inputs = status::Inputs {
                    kubevirts_in_namespace: all.len(),
                    handler: handler.as_deref(),
                    registry: &registry,
                    version: &version,
                    architecture: go_arch(),
                    refusal,
                    now: proto::kubevirt::Time(k8s_openapi::jiff::Timestamp::now()),
                };
                let Some(new) = status::desired(kv, &inputs) else {
                    continue;
                };
                let patch = serde_json::json!({
                    "metadata": {"resourceVersion": kv.resource_version()},
                    "status": new,
                });
                match api
                    .patch_status(
                        &kv.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await
                {
                    Ok(stored) => {
                        if let Some(version) = stored
                            .resource_version()
                            .and_then(|v| v.parse::<u64>().ok())
                        {
                            written.insert(uid, version);
                        }
                        self.writes.record(Write::KubeVirtStatusPatch);
                        tracing::info!(
                            kubevirt = %kv.name_any(),
                            phase = %new.phase,
                            "KubeVirt status written"
                        );
                    }
                    Err(e) => {
                        // A conflict only means the cache was behind: its event wakes us.
                        tracing::warn!(kubevirt = %kv.name_any(), error = %e, "writing the KubeVirt status failed");
                        retry = true;
                    }
                }
            }
            if retry {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
            wake.notified().await;
        }
    }
}
