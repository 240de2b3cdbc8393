//! The node labeller, as KubeVirt v1.9.0's (`pkg/virt-handler/node-labeller`): it owns
//! every node label under KubeVirt's labeller prefixes, removes those it cannot vouch for
//! and writes the ones true for this handler's VMM.
//!
//! KubeVirt derives its labels from libvirt's capabilities (machine types, CPU models
//! and features, Hyper-V enlightenments, TSC, SEV/TDX...). Our launcher runs the VMM in
//! `vmm/` on /dev/kvm: it accepts the `q35` machine type and its `pc-q35-*` versions
//! (`vmm/launcher/src/converter/os.rs`), no named CPU models, no Hyper-V, no confidential
//! computing. So the only label is `machine-type.node.kubevirt.io/q35`; the versioned
//! aliases have no fixed list to label. Labels of another labeller run (a KubeVirt that
//! ran here before) under the same prefixes are removed, so pods asking for what this
//! node cannot do stay Pending instead of failing here.
//!
//! Each run reads the Node and writes a JSON patch that first tests the labels it read:
//! a concurrent change makes the patch fail and the run is retried with back-off
//! (client-go's controller rate limiter: 5 ms doubling to 1000 s). Runs happen at start
//! and every 3 minutes with a jitter factor of 1.2. A node annotated
//! `node-labeller.kubevirt.io/skip-node` is left alone.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use proto::kubevirt::well_known::{LABELLER_SKIP_NODE_ANNOTATION, MACHINE_TYPE_LABEL_PREFIX};
use serde_json::json;
use tokio::sync::watch;

/// The prefixes (and whole keys) the labeller owns (`nodeLabellerLabels`).
pub(crate) const OWNED_LABEL_PREFIXES: &[&str] = &[
    "cpu-feature.node.kubevirt.io/",
    "cpu-model.node.kubevirt.io/",
    "cpu-model-migration.node.kubevirt.io/",
    "cpu-timer.node.kubevirt.io/",
    "hyperv.node.kubevirt.io/",
    "kubevirt.io/realtime",
    "kubevirt.io/sev",
    "kubevirt.io/sev-es",
    "kubevirt.io/sev-snp",
    "kubevirt.io/tdx",
    "host-model-cpu.node.kubevirt.io/",
    "host-model-required-features.node.kubevirt.io/",
    "node-labeller.kubevirt.io/obsolete-host-model",
    MACHINE_TYPE_LABEL_PREFIX,
    "kubevirt.io/vm-arch-",
];

/// The machine types the launcher runs (see the module docs).
pub(crate) const SUPPORTED_MACHINE_TYPES: &[&str] = &["q35"];

/// Between runs, before jitter.
pub(crate) const INTERVAL: Duration = Duration::from_secs(180);
/// Jitter factor of the period.
pub(crate) const JITTER: f64 = 1.2;

fn owned(label: &str) -> bool {
    OWNED_LABEL_PREFIXES.iter().any(|p| label.starts_with(p))
}

/// The labels the node should carry: `current` without the labeller's old labels, plus
/// this handler's.
pub(crate) fn desired_labels(current: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> = current
        .iter()
        .filter(|(k, _)| !owned(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for machine in SUPPORTED_MACHINE_TYPES {
        labels.insert(
            format!("{MACHINE_TYPE_LABEL_PREFIX}{machine}"),
            "true".into(),
        );
    }
    labels
}

/// The JSON patch from `observed` to `desired` labels: a test of what was read, then the
/// replacement (`None` when nothing changes).
pub(crate) fn labels_patch(
    observed: Option<&BTreeMap<String, String>>,
    desired: &BTreeMap<String, String>,
) -> Option<json_patch::Patch> {
    let value = match observed {
        Some(observed) if observed == desired => return None,
        Some(observed) => json!([
            {"op": "test", "path": "/metadata/labels", "value": observed},
            {"op": "replace", "path": "/metadata/labels", "value": desired},
        ]),
        None => json!([{"op": "add", "path": "/metadata/labels", "value": desired}]),
    };
    Some(serde_json::from_value(value).expect("a well-formed JSON patch"))
}

/// `DefaultTypedControllerRateLimiter`'s per-item back-off after `failures` failures.
pub fn retry_after(failures: u32) -> Duration {
    use crate::backoff::{CONTROLLER_BASE, CONTROLLER_MAX, doubling};
    doubling(CONTROLLER_BASE, failures.saturating_sub(1), CONTROLLER_MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum LabelError {
    #[error("node {0} does not exist")]
    NotFound(String),
    #[error("node {0} changed while being labelled")]
    Conflict(String),
    #[error("node {0}: {1}")]
    Api(String, kube::Error),
}

/// What one run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Labelled {
    Patched,
    Unchanged,
    Skipped,
}

pub struct NodeLabeller {
    nodes: Api<Node>,
    node: String,
    /// Between runs (KubeVirt: 3 minutes).
    pub interval: Duration,
}

impl NodeLabeller {
    pub fn new(nodes: Api<Node>, node: &str) -> Self {
        NodeLabeller {
            nodes,
            node: node.to_string(),
            interval: INTERVAL,
        }
    }

    fn classify(&self, e: kube::Error) -> LabelError {
        match &e {
            kube::Error::Api(s) if s.code == 404 => LabelError::NotFound(self.node.clone()),
            // A failed `test` operation is 422 (Invalid); a stale write 409.
            kube::Error::Api(s) if s.code == 409 || s.code == 422 => {
                LabelError::Conflict(self.node.clone())
            }
            _ => LabelError::Api(self.node.clone(), e),
        }
    }

    /// One run: read the Node, patch its labels.
    pub async fn label_once(&self) -> Result<Labelled, LabelError> {
        let node = self
            .nodes
            .get(&self.node)
            .await
            .map_err(|e| self.classify(e))?;
        self.label(&node).await
    }

    /// Patches the labels of `observed` (the Node as last read).
    pub async fn label(&self, observed: &Node) -> Result<Labelled, LabelError> {
        let skip = observed
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(LABELLER_SKIP_NODE_ANNOTATION));
        if skip {
            return Ok(Labelled::Skipped);
        }
        let current = observed.metadata.labels.clone().unwrap_or_default();
        let desired = desired_labels(&current);
        let Some(patch) = labels_patch(observed.metadata.labels.as_ref(), &desired) else {
            return Ok(Labelled::Unchanged);
        };
        self.nodes
            .patch(
                &self.node,
                &PatchParams::default(),
                &Patch::Json::<()>(patch),
            )
            .await
            .map_err(|e| self.classify(e))?;
        tracing::info!(node = %self.node, "node labels updated");
        Ok(Labelled::Patched)
    }

    /// Runs until `stop` turns true.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut failures = 0u32;
        while !*stop.borrow() {
            let period = super::jittered(self.interval, JITTER, rand::random());
            let pause = match self.label_once().await {
                Ok(_) => {
                    failures = 0;
                    period
                }
                Err(e) => {
                    failures += 1;
                    tracing::error!(error = %e, "node-labeller sync error encountered");
                    retry_after(failures).min(period)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = super::stopped(&mut stop) => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn owned_labels_are_replaced_and_the_rest_kept() {
        let current = labels(&[
            ("kubernetes.io/hostname", "n1"),
            ("kubernetes.io/arch", "amd64"),
            ("kubevirt.io/schedulable", "true"),
            ("cpu-model.node.kubevirt.io/Haswell", "true"),
            ("cpu-vendor.node.kubevirt.io/Intel", "true"),
            ("machine-type.node.kubevirt.io/pc-q35-rhel9.6.0", "true"),
            ("kubevirt.io/sev-snp", "true"),
            ("kubevirt.io/realtime", "true"),
            ("node-labeller.kubevirt.io/obsolete-host-model", "true"),
            ("hyperv.node.kubevirt.io/vapic", "true"),
        ]);
        assert_eq!(
            desired_labels(&current),
            labels(&[
                ("kubernetes.io/hostname", "n1"),
                ("kubernetes.io/arch", "amd64"),
                ("kubevirt.io/schedulable", "true"),
                // Not in KubeVirt's list of labeller labels: left alone, as KubeVirt does.
                ("cpu-vendor.node.kubevirt.io/Intel", "true"),
                ("machine-type.node.kubevirt.io/q35", "true"),
            ])
        );
    }

    #[test]
    fn the_patch_tests_what_was_read() {
        let observed = labels(&[("a", "1"), ("cpu-model.node.kubevirt.io/X", "true")]);
        let desired = desired_labels(&observed);
        let patch = serde_json::to_value(labels_patch(Some(&observed), &desired).expect("patch"))
            .expect("json");
        assert_eq!(
            patch,
            json!([
                {"op": "test", "path": "/metadata/labels", "value": {"a": "1", "cpu-model.node.kubevirt.io/X": "true"}},
                {"op": "replace", "path": "/metadata/labels", "value": {"a": "1", "machine-type.node.kubevirt.io/q35": "true"}},
            ])
        );
        assert!(labels_patch(Some(&desired), &desired).is_none());
        let added =
            serde_json::to_value(labels_patch(None, &desired).expect("patch")).expect("json");
        assert_eq!(added[0]["op"], "add");
    }

    #[test]
    fn retries_back_off_like_client_go() {
        assert_eq!(retry_after(1), Duration::from_millis(5));
        assert_eq!(retry_after(2), Duration::from_millis(10));
        assert_eq!(retry_after(11), Duration::from_millis(5120));
        assert_eq!(retry_after(40), Duration::from_secs(1000));
    }
}
