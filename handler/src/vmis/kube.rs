//! Kubernetes mode: this node's VMIs through kube-runtime watchers + reflectors (label
//! selectors `kubevirt.io/nodeName=<node>`, and `kubevirt.io/migrationTargetNodeName=<node>`
//! for VMIs migrating here, as v1.9.0's handler watches them), status written as a JSON merge patch of the
//! handler's fields (to the status subresource, or to the VMI where the CRD has none, as
//! KubeVirt v1.9.0's), events through the Events API.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use proto::kubevirt::{VirtualMachineInstance, VirtualMachineInstanceStatus, well_known};
use tokio::sync::mpsc;

use super::status::status_merge_patch;
use super::{BoxFuture, EventKind, StatusWriteError, StatusWriter, VmiStore, key_of};

/// The VMIs of one node, kept current by a reflector.
#[derive(Clone)]
pub struct KubeVmis {
    client: Client,
    reader: Store<VirtualMachineInstance>,
    /// VMIs migrating to this node (not yet, or no longer only, this node's).
    incoming: Store<VirtualMachineInstance>,
    recorder: Arc<Recorder>,
}

/// The label selector of this node's VMIs.
pub fn node_selector(node: &str) -> String {
    format!("{}={}", well_known::NODE_NAME_LABEL, node)
}

/// The label selector of the VMIs migrating to this node.
pub fn migration_target_selector(node: &str) -> String {
    format!("{}={}", well_known::MIGRATION_TARGET_NODE_NAME_LABEL, node)
}

/// Watches the VMIs `selector` picks into a store; each changed key goes to `tx`.
fn watch(
    client: &Client,
    selector: &str,
    tx: mpsc::UnboundedSender<String>,
) -> (Store<VirtualMachineInstance>, tokio::task::JoinHandle<()>) {
    let api: Api<VirtualMachineInstance> = Api::all(client.clone());
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(selector);
    let stream = watcher(api, config).default_backoff().reflect(writer);
    let task = tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            let key = match event {
                Ok(watcher::Event::Apply(vmi) | watcher::Event::InitApply(vmi)) => key_of(&vmi),
                Ok(watcher::Event::Delete(vmi)) => key_of(&vmi),
                Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "VMI watch error (retrying with back-off)");
                    continue;
                }
            };
            if tx.send(key).is_err() {
                break;
            }
        }
    });
    (reader, task)
}

impl KubeVmis {
    /// Starts the watch; every added, changed or deleted VMI's key goes to the returned
    /// channel. The task ends when the receiver is dropped.
    pub fn start(
        client: Client,
        node: &str,
    ) -> (
        Self,
        mpsc::UnboundedReceiver<String>,
        tokio::task::JoinHandle<()>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (reader, own) = watch(&client, &node_selector(node), tx.clone());
        let (incoming, migrating) = watch(&client, &migration_target_selector(node), tx);
        let task = tokio::spawn(async move {
            let _ = tokio::join!(own, migrating);
        });
        let recorder = Arc::new(Recorder::new(
            client.clone(),
            Reporter {
                controller: "virt-handler".into(),
                instance: Some(node.to_string()),
            },
        ));
        (
            KubeVmis {
                client,
                reader,
                incoming,
                recorder,
            },
            rx,
            task,
        )
    }

    /// Waits until the first list is in the store.
    pub async fn wait_until_ready(&self) {
        // The writers are only dropped with the watches; an error here means no store.
        let _ = self.reader.wait_until_ready().await;
        let _ = self.incoming.wait_until_ready().await;
    }

    fn reference(vmi: &VirtualMachineInstance) -> ObjectReference {
        vmi.object_ref(&())
    }
}

impl VmiStore for KubeVmis {
    fn get(&self, key: &str) -> Option<VirtualMachineInstance> {
        let (namespace, name) = key.split_once('/')?;
        let object = ObjectRef::new(name).within(namespace);
        // A VMI in both stores (handed over, label not yet removed): the newer copy.
        let own = self.reader.get(&object);
        let incoming = self.incoming.get(&object);
        let version = |v: &VirtualMachineInstance| {
            v.metadata
                .resource_version
                .as_deref()
                .and_then(|r| r.parse::<u64>().ok())
                .unwrap_or(0)
        };
        match (own, incoming) {
            (Some(a), Some(b)) => Some(if version(&b) > version(&a) {
                (*b).clone()
            } else {
                (*a).clone()
            }),
            (a, b) => a.or(b).map(|v| (*v).clone()),
        }
    }

    fn keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .reader
            .state()
            .iter()
            .chain(self.incoming.state().iter())
            .map(|v| key_of(v))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

impl StatusWriter for KubeVmis {
    fn write_status<'a>(
        &'a self,
        vmi: &'a VirtualMachineInstance,
        status: &'a VirtualMachineInstanceStatus,
    ) -> BoxFuture<'a, Result<(), StatusWriteError>> {
        Box::pin(async move {
            let namespace = vmi.metadata.namespace.as_deref().unwrap_or("default");
            let name = vmi.metadata.name.as_deref().unwrap_or_default();
            let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), namespace);
            let patch = status_merge_patch(vmi.metadata.resource_version.as_deref(), status);
            match proto::kubevirt::status_write::patch_vmi_status(&api, name, &patch).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(e)) if e.code == 409 => Err(StatusWriteError::Conflict),
                Err(kube::Error::Api(e)) if e.code == 404 => Err(StatusWriteError::Gone),
                Err(e) => Err(StatusWriteError::Other(e.to_string())),
            }
        })
    }

    fn patch_vmi<'a>(
        &'a self,
        vmi: &'a VirtualMachineInstance,
        patch: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<(), StatusWriteError>> {
        Box::pin(async move {
            let namespace = vmi.metadata.namespace.as_deref().unwrap_or("default");
            let name = vmi.metadata.name.as_deref().unwrap_or_default();
            let api: Api<VirtualMachineInstance> = Api::namespaced(self.client.clone(), namespace);
            let classify = |e: kube::Error| match e {
                kube::Error::Api(e) if e.code == 409 => StatusWriteError::Conflict,
                kube::Error::Api(e) if e.code == 404 => StatusWriteError::Gone,
                e => StatusWriteError::Other(e.to_string()),
            };
            // Metadata and status are two writes where the CRD has a status subresource
            // (ours); the first carries the resource version read, the second the one the
            // first produced, so neither lands on a VMI changed by someone else. Metadata
            // first: a hand-over's label moves the VMI to the target node while its
            // migration still reads unfinished, so no node judges it in between as its own
            // with its VM gone.
            let mut rv = vmi.metadata.resource_version.clone();
            if let Some(metadata) = patch.get("metadata") {
                let mut metadata = metadata.clone();
                metadata["resourceVersion"] = serde_json::json!(rv);
                let body = serde_json::json!({ "metadata": metadata });
                let written = api
                    .patch(
                        name,
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&body),
                    )
                    .await
                    .map_err(classify)?;
                rv = written.metadata.resource_version;
            }
            if let Some(status) = patch.get("status") {
                let body =
                    serde_json::json!({"metadata": {"resourceVersion": rv}, "status": status});
                proto::kubevirt::status_write::patch_vmi_status(&api, name, &body)
                    .await
                    .map_err(classify)?;
            }
            Ok(())
        })
    }

    fn record_event(
        &self,
        vmi: &VirtualMachineInstance,
        kind: EventKind,
        reason: &str,
        message: &str,
    ) {
        let recorder = Arc::clone(&self.recorder);
        let reference = Self::reference(vmi);
        let event = Event {
            type_: match kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: reason.to_string(),
            note: Some(message.to_string()),
            action: reason.to_string(),
            secondary: None,
        };
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&event, &reference).await {
                tracing::debug!(error = %e, "cannot record event");
            }
        });
    }
}
