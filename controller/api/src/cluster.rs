//! What the migration and pod-eviction webhooks read and write in the cluster besides the
//! request: KubeVirt v1.9.0's admitters call the API server directly (`virtClient` and
//! `kubeClient` GETs, a LIST, a PATCH), not informers, so that a migration created a moment
//! ago is seen by the next one. [`Cluster`] is that interface; [`Kube`] does it over the API
//! server, the tests of [`crate::migration`] and [`crate::eviction`] do it in memory.
//!
//! Errors are the text Go's `err.Error()` would give: the API server's `Status` message
//! (`virtualmachineinstances.kubevirt.io "x" not found`), else the client's error.

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use proto::kubevirt::well_known::EVICTION_SOURCE_ANNOTATION;
use proto::kubevirt::{VirtualMachineInstance, VirtualMachineInstanceMigration};
use serde_json::json;
use std::future::Future;

/// `v1.MigrationSelectorLabel`: the VMI a migration is for, set by the mutating webhook.
pub const MIGRATION_SELECTOR_LABEL: &str = "kubevirt.io/vmi-name";

/// Another migration of the namespace, as far as admission reads it (leniently: a phase
/// this project does not know is still a phase, and is not final).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListedMigration {
    pub uid: String,
    /// Its `spec.vmiName`.
    pub vmi_name: String,
    /// Its `status.phase`, `""` when it has none.
    pub phase: String,
}

/// The cluster reads and writes of the webhooks. `Ok(None)`: not found.
pub trait Cluster: Sync {
    /// GET the VMI `namespace/name`.
    fn vmi(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<VirtualMachineInstance>, String>> + Send;

    /// LIST the migrations of `namespace` labelled `kubevirt.io/vmi-name` = `vmi_name`.
    fn migrations_of(
        &self,
        namespace: &str,
        vmi_name: &str,
    ) -> impl Future<Output = Result<Vec<ListedMigration>, String>> + Send;

    /// GET the pod `namespace/name`.
    fn pod(
        &self,
        namespace: &str,
        name: &str,
    ) -> impl Future<Output = Result<Option<Pod>, String>> + Send;

    /// Marks `vmi` for evacuation from `node` (`status.evacuationNodeName`), with the
    /// annotation `kubevirt.io/eviction-source: descheduler` if `descheduler`; a dry run
    /// (nothing stored) if `dry_run`.
    fn mark_for_evacuation(
        &self,
        vmi: &VirtualMachineInstance,
        node: &str,
        descheduler: bool,
        dry_run: bool,
    ) -> impl Future<Output = Result<(), String>> + Send;
}

/// The API server's message for `resource` `name` not found (`errors.NewNotFound`).
pub fn not_found(resource: &str, name: &str) -> String {
    format!("{resource} \"{name}\" not found")
}

/// Go's `err.Error()` of a client call: the API server's message, or the client's error.
fn message(error: kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// The cluster over the API server, as virt-api's ServiceAccount (`20-virt-api.yaml`:
/// `virtualmachineinstances` get and patch, `virtualmachineinstances/status` patch,
/// `virtualmachineinstancemigrations` list, `pods` get).
#[derive(Clone)]
pub struct Kube(pub kube::Client);

impl Kube {
    fn vmis(&self, namespace: &str) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.0.clone(),
            namespace,
            &ApiResource::erase::<VirtualMachineInstance>(&()),
        )
    }
}

impl Cluster for Kube {
    async fn vmi(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<VirtualMachineInstance>, String> {
        Api::<VirtualMachineInstance>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(message)
    }

    async fn migrations_of(
        &self,
        namespace: &str,
        vmi_name: &str,
    ) -> Result<Vec<ListedMigration>, String> {
        let api: Api<DynamicObject> = Api::namespaced_with(
            self.0.clone(),
            namespace,
            &ApiResource::erase::<VirtualMachineInstanceMigration>(&()),
        );
        // v1.9.0's selector, `kubevirt.io/vmi-name in (<name>)`.
        let params =
            ListParams::default().labels(&format!("{MIGRATION_SELECTOR_LABEL} in ({vmi_name})"));
        let list = api.list(&params).await.map_err(message)?;
        let text = |object: &DynamicObject, pointer: &str| {
            object
                .data
                .pointer(pointer)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        Ok(list
            .items
            .iter()
            .map(|m| ListedMigration {
                uid: m.metadata.uid.clone().unwrap_or_default(),
                vmi_name: text(m, "/spec/vmiName"),
                phase: text(m, "/status/phase"),
            })
            .collect())
    }

    async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, String> {
        Api::<Pod>::namespaced(self.0.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(message)
    }

    /// v1.9.0 sends one JSON patch to the object (its VMI CRD has no status subresource).
    /// Here the annotation goes to the object first (so the evacuation sees who asked), then
    /// `evacuationNodeName` to `/status`, or to the object where `/status` answers 404
    /// (KubeVirt's own CRD): on a CRD with the subresource the object path drops the status.
    async fn mark_for_evacuation(
        &self,
        vmi: &VirtualMachineInstance,
        node: &str,
        descheduler: bool,
        dry_run: bool,
    ) -> Result<(), String> {
        let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let name = vmi.metadata.name.as_deref().unwrap_or_default();
        let api = self.vmis(namespace);
        let params = PatchParams {
            dry_run,
            ..Default::default()
        };
        if descheduler {
            let annotation = json!({"metadata": {"annotations": {
                EVICTION_SOURCE_ANNOTATION: "descheduler"}}});
            api.patch(name, &params, &Patch::Merge(&annotation))
                .await
                .map_err(message)?;
        }
        let status = json!({"status": {"evacuationNodeName": node}});
        match api
            .patch_status(name, &params, &Patch::Merge(&status))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => api
                .patch(name, &params, &Patch::Merge(&status))
                .await
                .map(drop)
                .map_err(message),
            other => other.map(drop).map_err(message),
        }
    }
}

/// An in-memory cluster for the webhooks' tests: what it holds, the errors it answers with,
/// and the marks it was asked for.
#[cfg(test)]
pub(crate) mod fake {
    use super::*;
    use std::sync::Mutex;

    /// One `mark_for_evacuation` call.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Mark {
        pub vmi: String,
        pub node: String,
        pub descheduler: bool,
        pub dry_run: bool,
    }

    #[derive(Default)]
    pub struct Fake {
        pub vmis: Vec<VirtualMachineInstance>,
        pub pods: Vec<Pod>,
        /// (namespace, `kubevirt.io/vmi-name` label, the migration).
        pub migrations: Vec<(String, String, ListedMigration)>,
        /// Every call of this kind (`vmi`, `migrations`, `pod`, `mark`), or this one call
        /// (`pod ns/name`), fails with this.
        pub errors: std::collections::BTreeMap<&'static str, String>,
        pub marks: Mutex<Vec<Mark>>,
        /// Every call, in order: `vmi ns/name`, `migrations ns/vmi`, `pod ns/name`, `mark ns/name`.
        pub calls: Mutex<Vec<String>>,
    }

    impl Fake {
        fn call(&self, kind: &'static str, namespace: &str, name: &str) -> Result<(), String> {
            let call = format!("{kind} {namespace}/{name}");
            let error = self
                .errors
                .get(call.as_str())
                .or_else(|| self.errors.get(kind));
            self.calls.lock().unwrap().push(call);
            match error {
                Some(e) => Err(e.clone()),
                None => Ok(()),
            }
        }

        pub fn marks(&self) -> Vec<Mark> {
            self.marks.lock().unwrap().clone()
        }

        pub fn calls(&self) -> Vec<String> {
            self.calls.lock().unwrap().clone()
        }
    }

    /// The object `namespace/name` among `objects`.
    fn named<K: kube::Resource + Clone>(objects: &[K], namespace: &str, name: &str) -> Option<K> {
        objects
            .iter()
            .find(|o| {
                o.meta().namespace.as_deref() == Some(namespace)
                    && o.meta().name.as_deref() == Some(name)
            })
            .cloned()
    }

    impl Cluster for Fake {
        async fn vmi(
            &self,
            namespace: &str,
            name: &str,
        ) -> Result<Option<VirtualMachineInstance>, String> {
            self.call("vmi", namespace, name)?;
            Ok(named(&self.vmis, namespace, name))
        }

        async fn migrations_of(
            &self,
            namespace: &str,
            vmi_name: &str,
        ) -> Result<Vec<ListedMigration>, String> {
            self.call("migrations", namespace, vmi_name)?;
            Ok(self
                .migrations
                .iter()
                .filter(|(ns, label, _)| ns == namespace && label == vmi_name)
                .map(|(_, _, m)| m.clone())
                .collect())
        }

        async fn pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, String> {
            self.call("pod", namespace, name)?;
            Ok(named(&self.pods, namespace, name))
        }

        async fn mark_for_evacuation(
            &self,
            vmi: &VirtualMachineInstance,
            node: &str,
            descheduler: bool,
            dry_run: bool,
        ) -> Result<(), String> {
            let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
            let name = vmi.metadata.name.as_deref().unwrap_or_default();
            self.call("mark", namespace, name)?;
            self.marks.lock().unwrap().push(Mark {
                vmi: format!("{namespace}/{name}"),
                node: node.into(),
                descheduler,
                dry_run,
            });
            Ok(())
        }
    }
}
