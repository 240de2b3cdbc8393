//! What every reconcile of the two controllers uses ([`Context`]: the caches, the writes,
//! the configuration in force), how a failed reconcile is retried, and the status patch
//! both write. Below `vm` and `vmi`, which `run` wires together.

use crate::kubevirt_cr::ClusterConfig;
use crate::template::TemplateConfig;
use crate::vm::Expectations;
use crate::writes::Writes;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::Store;
use kube::{Api, Client, Resource};
use proto::kubevirt::{VirtualMachine, VirtualMachineInstance};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Settings of one controller process.
#[derive(Debug, Clone)]
pub struct Options {
    /// The configuration without a `KubeVirt` CR (the command-line flags); a CR's fields
    /// replace these.
    pub template: TemplateConfig,
    /// Only this namespace (tests), or all namespaces.
    pub namespace: Option<String>,
    /// Name for events (`reportingInstance`).
    pub identity: String,
    /// The namespace of the `KubeVirt` CR and virt-handler's DaemonSet (KubeVirt's install
    /// namespace); `None`: no CR is read and `template` is the configuration.
    pub kubevirt_namespace: Option<String>,
}

/// What every reconcile can use.
pub struct Context {
    pub client: Client,
    pub options: Options,
    /// The cluster configuration in force (the `KubeVirt` CR over `options.template`).
    pub cluster_config: Arc<ClusterConfig>,
    pub writes: Arc<Writes>,
    pub vmis: Store<VirtualMachineInstance>,
    pub pods: Store<Pod>,
    pub vms: Store<VirtualMachine>,
    pub vm_expectations: Expectations,
    /// Reconcile counts, durations and failures (`/metrics`).
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Pods created but not yet in the cache, by VMI UID.
    pub created_pods: Mutex<HashMap<String, (Pod, Instant)>>,
    /// VMI resource versions written but not yet in the cache, by VMI UID.
    pub vmi_versions: Mutex<HashMap<String, (String, Instant)>>,
    /// Readiness-gate values written to pods but maybe not yet in the cache, by pod UID.
    pub pod_gates: Mutex<HashMap<String, (bool, Instant)>>,
    pub migrations: Store<proto::kubevirt::VirtualMachineInstanceMigration>,
    /// Migrations whose target pod was created but may not be cached yet, by migration UID.
    pub created_target_pods: Mutex<HashMap<String, Instant>>,
    /// VMIs whose evacuation migration was created but may not be cached yet, by VMI UID.
    pub evacuations: Mutex<HashMap<String, Instant>>,
    pub(crate) recorder: Recorder,
}

/// How long a write may take to show up in the cache before the controller stops waiting.
pub(crate) const CACHE_WAIT: Duration = Duration::from_secs(30);

/// A reconcile error that may come from the API server.
pub trait ReconcileError: std::fmt::Display {
    /// The API server's answer, if that is what failed.
    fn kube(&self) -> Option<&kube::Error>;
}

/// What both controllers do after a failed reconcile: retry in 5 s, or in 200 ms after a
/// conflict (the cache was only behind).
pub(crate) fn error_policy<K, E>(
    object: Arc<K>,
    error: &E,
    _: Arc<Context>,
) -> kube::runtime::controller::Action
where
    K: Resource<DynamicType = ()> + kube::ResourceExt,
    E: ReconcileError,
{
    let kind = K::kind(&());
    let name = object.name_any();
    tracing::warn!(%kind, %name, %error, "re-enqueuing");
    kube::runtime::controller::Action::requeue(requeue_after(error.kube()))
}

/// The delay [`error_policy`] waits after `api_error`.
fn requeue_after(api_error: Option<&kube::Error>) -> Duration {
    match api_error {
        Some(kube::Error::Api(status)) if status.code == 409 => Duration::from_millis(200),
        _ => Duration::from_secs(5),
    }
}

impl Context {
    /// The configuration to render and admit with, now; one reconcile uses one.
    pub fn config(&self) -> Arc<TemplateConfig> {
        self.cluster_config.current()
    }

    pub fn api<K>(&self, namespace: &str) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
    {
        Api::namespaced(self.client.clone(), namespace)
    }

    /// Publishes an event on `object`, counting the write; failures are logged only (an
    /// event is information, not state).
    pub async fn event<K: Resource<DynamicType = ()>>(
        &self,
        object: &K,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.writes.record(crate::writes::Write::Event);
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.into(),
            note: Some(note),
            action: reason.into(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(reason, error = %e, "publishing an event failed");
        }
    }

    /// Whether the cache shows the VMI as of our last write (see `vmi_versions`).
    pub(crate) fn vmi_cache_current(&self, vmi: &VirtualMachineInstance) -> bool {
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let mut versions = self.vmi_versions.lock().unwrap_or_else(|p| p.into_inner());
        let Some((expected, since)) = versions.get(&uid) else {
            return true;
        };
        let cached = vmi.metadata.resource_version.clone().unwrap_or_default();
        // Resource versions are opaque, but the apiserver's are etcd revisions: a larger one
        // is newer. Fall back to equality when they do not parse.
        let current = match (cached.parse::<u64>(), expected.parse::<u64>()) {
            (Ok(c), Ok(e)) => c >= e,
            _ => cached == *expected,
        };
        if current || since.elapsed() > CACHE_WAIT {
            versions.remove(&uid);
            return true;
        }
        false
    }

    pub(crate) fn wrote_vmi(&self, written: &VirtualMachineInstance) {
        if let (Some(uid), Some(rv)) = (&written.metadata.uid, &written.metadata.resource_version) {
            self.vmi_versions
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(uid.clone(), (rv.clone(), Instant::now()));
        }
    }
}

/// The first metadata write of a VM or VMI (a merge patch of `metadata`): `finalizer` added
/// when missing, and v1.9.0's API-version annotations when not there yet (v1.9.0 writes them
/// first thing, in a write of their own; here they share the finalizer's). `None` when both
/// are there already.
pub(crate) fn first_metadata_patch(
    meta: &kube::api::ObjectMeta,
    finalizer: Option<&str>,
) -> Option<serde_json::Value> {
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let add = finalizer.filter(|f| !finalizers.iter().any(|x| x == f));
    let observed = proto::kubevirt::well_known::api_version_observed(meta.annotations.as_ref());
    if add.is_none() && observed {
        return None;
    }
    let mut metadata = serde_json::json!({});
    if let Some(finalizer) = add {
        let mut finalizers = finalizers;
        finalizers.push(finalizer.to_string());
        metadata["finalizers"] = serde_json::json!(finalizers);
    }
    if !observed {
        metadata["annotations"] = proto::kubevirt::well_known::api_version_annotations();
    }
    Some(metadata)
}

/// A JSON merge patch turning the object `old` into `new`: changed keys get their new
/// value, vanished keys `null`, objects in both are diffed key by key (a merge patch
/// merges objects, so a key gone from a map such as `activePods` must be named `null`;
/// lists are replaced wholesale).
pub(crate) fn merge_diff(old: &serde_json::Value, new: &serde_json::Value) -> serde_json::Value {
    let empty = serde_json::Map::new();
    let old = old.as_object().unwrap_or(&empty);
    let new = new.as_object().unwrap_or(&empty);
    let mut patch = serde_json::Map::new();
    for (key, value) in new {
        match old.get(key) {
            Some(before) if before == value => {}
            Some(before) if before.is_object() && value.is_object() => {
                patch.insert(key.clone(), merge_diff(before, value));
            }
            _ => {
                patch.insert(key.clone(), value.clone());
            }
        }
    }
    for key in old.keys() {
        if !new.contains_key(key) {
            patch.insert(key.clone(), serde_json::Value::Null);
        }
    }
    serde_json::Value::Object(patch)
}

#[cfg(test)]
mod tests {
    use super::{first_metadata_patch, merge_diff, requeue_after};
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn the_first_metadata_write_adds_what_is_missing_once() {
        let fresh = kube::api::ObjectMeta::default();
        assert_eq!(
            first_metadata_patch(&fresh, Some("f")),
            Some(json!({
                "finalizers": ["f"],
                "annotations": {
                    "kubevirt.io/latest-observed-api-version": "v1",
                    "kubevirt.io/storage-observed-api-version": "v1",
                },
            }))
        );
        let annotated: kube::api::ObjectMeta = serde_json::from_value(json!({
            "annotations": {"kubevirt.io/latest-observed-api-version": "v1"},
            "finalizers": ["other"],
        }))
        .unwrap();
        assert_eq!(
            first_metadata_patch(&annotated, Some("f")),
            Some(json!({"finalizers": ["other", "f"]}))
        );
        assert_eq!(first_metadata_patch(&annotated, None), None);
        let done: kube::api::ObjectMeta = serde_json::from_value(json!({
            "annotations": {"kubevirt.io/latest-observed-api-version": "v1"},
            "finalizers": ["f"],
        }))
        .unwrap();
        assert_eq!(first_metadata_patch(&done, Some("f")), None);
        // An older API version seen: written again.
        let old: kube::api::ObjectMeta = serde_json::from_value(json!({
            "annotations": {"kubevirt.io/latest-observed-api-version": "v1alpha3"},
        }))
        .unwrap();
        assert!(first_metadata_patch(&old, None).is_some());
    }

    #[test]
    fn conflicts_retry_soon_other_errors_later() {
        let api = |code| {
            kube::Error::Api(
                kube::core::Status::failure("x", "Conflict")
                    .with_code(code)
                    .boxed(),
            )
        };
        assert_eq!(requeue_after(Some(&api(409))), Duration::from_millis(200));
        assert_eq!(requeue_after(Some(&api(500))), Duration::from_secs(5));
        assert_eq!(requeue_after(None), Duration::from_secs(5));
    }

    #[test]
    fn merge_diff_sets_changes_and_nulls_removals() {
        let old = json!({"a": 1, "b": [1, 2], "c": "x"});
        let new = json!({"a": 1, "b": [1], "d": true});
        assert_eq!(
            merge_diff(&old, &new),
            json!({"b": [1], "c": null, "d": true})
        );
        assert_eq!(merge_diff(&new, &new), json!({}));
        // Maps are diffed key by key: a pod gone from `activePods` is removed.
        let old = json!({"activePods": {"p1": "n1", "p2": "n2"}, "m": {"x": {"y": 1, "z": 2}}});
        let new = json!({"activePods": {"p2": "n2"}, "m": {"x": {"y": 1}}});
        let patch = merge_diff(&old, &new);
        assert_eq!(
            patch,
            json!({"activePods": {"p1": null}, "m": {"x": {"z": null}}})
        );
        let mut applied = old.clone();
        json_patch::merge(&mut applied, &patch);
        assert_eq!(applied, new);
    }
}
