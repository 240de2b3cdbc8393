//! The plumbing the handler and controller rely on, proven against a real etcd +
//! kube-apiserver + kube-controller-manager: our CRDs, VMIs with watch/status/finalizers,
//! optimistic concurrency (409), Leases for leader election, and owner-reference garbage
//! collection. Fails (never skips) when the control plane cannot be built or started.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use integration::controlplane::{self, ControlPlane, Options};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ObjectMeta, Patch,
    PatchParams, PostParams,
};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::mpsc;

const WAIT: Duration = Duration::from_secs(60);

async fn control_plane() -> &'static ControlPlane {
    match controlplane::shared().await {
        Ok(control_plane) => {
            eprintln!(
                "control plane at {} (started in {:?})",
                control_plane.apiserver_url(),
                control_plane.startup_time()
            );
            control_plane
        }
        Err(e) => panic!(
            "cannot run the test control plane: {e:#}\nbuild it with: {}",
            controlplane::build_script().display()
        ),
    }
}

fn vmi_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubevirt.io", "v1", "VirtualMachineInstance"),
        "virtualmachineinstances",
    )
}

/// A minimal VMI, valid for the generated CRD's schema.
fn vmi(name: &str, labels: &[(&str, &str)], finalizers: &[&str]) -> DynamicObject {
    let mut object = DynamicObject::new(name, &vmi_resource()).data(json!({
        "spec": {
            "domain": {
                "devices": {},
                "resources": {"requests": {"memory": "64Mi"}},
            },
        },
    }));
    object.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    object.metadata.finalizers = Some(finalizers.iter().map(|f| f.to_string()).collect());
    object
}

fn api_error_code(result: Result<impl std::fmt::Debug, kube::Error>) -> u16 {
    match result {
        Err(kube::Error::Api(status)) => status.code,
        other => panic!("expected an API error status, got {other:?}"),
    }
}

/// Polls `get` until it answers 404.
async fn wait_gone<K>(api: &Api<K>, name: &str, timeout: Duration) -> Duration
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let started = Instant::now();
    loop {
        match api.get_opt(name).await {
            Ok(None) => return started.elapsed(),
            Ok(Some(_)) => {}
            Err(e) => panic!("get {name}: {e}"),
        }
        assert!(
            started.elapsed() < timeout,
            "{name} still exists after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Debug, PartialEq)]
enum Seen {
    Applied { name: String, phase: Option<String> },
    Deleted { name: String },
}

/// Next watch event, failing the test after [`WAIT`].
async fn next_seen(events: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("no watch event within the timeout")
        .expect("the watcher stopped")
}

#[tokio::test]
async fn apiserver_reports_the_stamped_release_version() {
    let cp = control_plane().await;
    let info = cp.client().unwrap().apiserver_version().await.unwrap();
    // Unstamped builds report "v0.0.0-master+$Format:%H$" and empty major/minor.
    assert_eq!(info.major, "1", "{info:?}");
    let minor: u32 = info.minor.parse().unwrap_or_else(|_| panic!("{info:?}"));
    assert!(minor >= 33, "{info:?}");
    let prefix = format!("v1.{minor}.");
    let patch = info
        .git_version
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{info:?}"));
    assert!(
        patch.parse::<u32>().is_ok(),
        "a release, not a dev build: {info:?}"
    );
}

#[tokio::test]
async fn our_crds_are_installed_and_established() {
    let cp = control_plane().await;
    let api: Api<CustomResourceDefinition> = Api::all(cp.client().unwrap());
    let wanted = controlplane::kubevirt_crds().unwrap();
    assert!(
        wanted.len() >= 2,
        "VirtualMachineInstance and VirtualMachine at least"
    );
    for crd in wanted {
        let name = crd.metadata.name.unwrap();
        let served = api.get(&name).await.unwrap();
        let established = served
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        assert!(established, "{name} is not Established");
    }
}

#[tokio::test]
async fn vmi_lifecycle_watch_status_and_finalizer() {
    let cp = control_plane().await;
    let ns = cp.create_namespace("vmi-lifecycle").await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(cp.client().unwrap(), &ns, &vmi_resource());

    // Watch only labelled VMIs, and start watching before anything exists.
    let (tx, mut events) = mpsc::unbounded_channel();
    let (init_tx, init_rx) = tokio::sync::oneshot::channel();
    let stream = watcher(
        api.clone(),
        watcher::Config::default().labels("kubevirt-rs.test/watched=yes"),
    );
    let watch_task = tokio::spawn(async move {
        let mut init_tx = Some(init_tx);
        let mut stream = std::pin::pin!(stream);
        while let Some(event) = stream.next().await {
            let seen = match event.expect("watch error") {
                watcher::Event::InitDone => {
                    if let Some(tx) = init_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                watcher::Event::Init | watcher::Event::InitApply(_) => continue,
                watcher::Event::Apply(o) => Seen::Applied {
                    name: o.metadata.name.clone().unwrap_or_default(),
                    phase: o.data["status"]["phase"].as_str().map(str::to_owned),
                },
                watcher::Event::Delete(o) => Seen::Deleted {
                    name: o.metadata.name.clone().unwrap_or_default(),
                },
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    tokio::time::timeout(WAIT, init_rx)
        .await
        .expect("watch did not finish its initial list")
        .unwrap();

    let finalizer = "kubevirt-rs.test/hold";
    let pp = PostParams::default();
    api.create(&pp, &vmi("unwatched", &[], &[])).await.unwrap();
    let created = api
        .create(
            &pp,
            &vmi(
                "watched",
                &[("kubevirt-rs.test/watched", "yes")],
                &[finalizer],
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        next_seen(&mut events).await,
        Seen::Applied {
            name: "watched".into(),
            phase: None
        }
    );

    // Status goes through the status subresource and does not bump the generation ...
    let patched = api
        .patch_status(
            "watched",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Scheduled", "nodeName": "node01"}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data["status"]["phase"], "Scheduled");
    assert_eq!(patched.data["status"]["nodeName"], "node01");
    assert_eq!(patched.metadata.generation, created.metadata.generation);
    assert_eq!(
        next_seen(&mut events).await,
        Seen::Applied {
            name: "watched".into(),
            phase: Some("Scheduled".into())
        }
    );
    // ... and a write to the main resource cannot change it.
    let main_write = api
        .patch(
            "watched",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"phase": "Failed"}, "metadata": {"annotations": {"a": "b"}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(main_write.data["status"]["phase"], "Scheduled");
    assert!(
        matches!(next_seen(&mut events).await, Seen::Applied { ref phase, .. } if phase.as_deref() == Some("Scheduled"))
    );

    // Delete: the finalizer holds the object, with a deletionTimestamp.
    api.delete("watched", &DeleteParams::default())
        .await
        .unwrap();
    let held = api.get("watched").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(
        held.metadata.finalizers.as_deref(),
        Some(&[finalizer.to_owned()][..])
    );
    assert!(
        matches!(next_seen(&mut events).await, Seen::Applied { ref name, .. } if name == "watched")
    );

    // Removing the finalizer lets it go.
    api.patch(
        "watched",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    wait_gone(&api, "watched", WAIT).await;
    assert_eq!(
        next_seen(&mut events).await,
        Seen::Deleted {
            name: "watched".into()
        }
    );

    // The label selector kept the other VMI out of the stream.
    api.delete("unwatched", &DeleteParams::default())
        .await
        .unwrap();
    wait_gone(&api, "unwatched", WAIT).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        events.try_recv().is_err(),
        "unexpected event for an unlabelled VMI"
    );
    watch_task.abort();
}

#[tokio::test]
async fn stale_resource_version_is_a_409_conflict() {
    let cp = control_plane().await;
    let ns = cp.create_namespace("conflict").await.unwrap();
    let api: Api<DynamicObject> = Api::namespaced_with(cp.client().unwrap(), &ns, &vmi_resource());
    let original = api
        .create(&PostParams::default(), &vmi("contended", &[], &[]))
        .await
        .unwrap();

    let mut first = original.clone();
    first.metadata.labels = Some(BTreeMap::from([("writer".into(), "first".into())]));
    let first = api
        .replace("contended", &PostParams::default(), &first)
        .await
        .unwrap();
    assert_ne!(
        first.metadata.resource_version,
        original.metadata.resource_version
    );

    // A writer still holding the original resourceVersion loses.
    let mut second = original.clone();
    second.metadata.labels = Some(BTreeMap::from([("writer".into(), "second".into())]));
    let code = api_error_code(
        api.replace("contended", &PostParams::default(), &second)
            .await,
    );
    assert_eq!(code, 409);
    let stored = api.get("contended").await.unwrap();
    assert_eq!(
        stored
            .metadata
            .labels
            .unwrap()
            .get("writer")
            .map(String::as_str),
        Some("first")
    );

    // The same for the status subresource.
    let mut stale_status = original.clone();
    stale_status.data["status"] = json!({"phase": "Running"});
    let code = api_error_code(
        api.replace_status("contended", &PostParams::default(), &stale_status)
            .await,
    );
    assert_eq!(code, 409);
}

fn lease(holder: &str) -> Lease {
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    Lease {
        metadata: ObjectMeta {
            name: Some("virt-handler-leader".into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(now.clone()),
            renew_time: Some(now),
            ..LeaseSpec::default()
        }),
    }
}

#[tokio::test]
async fn lease_can_be_acquired_and_renewed() {
    let cp = control_plane().await;
    let ns = cp.create_namespace("lease").await.unwrap();
    let leases: Api<Lease> = Api::namespaced(cp.client().unwrap(), &ns);
    let pp = PostParams::default();

    let acquired = leases.create(&pp, &lease("node-a")).await.unwrap();
    // A second candidate cannot create the same lease: it is taken.
    assert_eq!(
        api_error_code(leases.create(&pp, &lease("node-b")).await),
        409
    );

    // The holder renews (optimistic concurrency through resourceVersion).
    tokio::time::sleep(Duration::from_millis(20)).await;
    let mut renewal = acquired.clone();
    renewal.spec.as_mut().unwrap().renew_time =
        Some(MicroTime(k8s_openapi::jiff::Timestamp::now()));
    let renewed = leases
        .replace("virt-handler-leader", &pp, &renewal)
        .await
        .unwrap();
    let renew_time = |l: &Lease| l.spec.as_ref().unwrap().renew_time.clone().unwrap().0;
    assert!(renew_time(&renewed) > renew_time(&acquired));
    assert_ne!(
        renewed.metadata.resource_version,
        acquired.metadata.resource_version
    );
    assert_eq!(
        renewed.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("node-a")
    );

    // A candidate working from the stale copy cannot steal it.
    let mut takeover = acquired.clone();
    takeover.spec.as_mut().unwrap().holder_identity = Some("node-b".into());
    assert_eq!(
        api_error_code(leases.replace("virt-handler-leader", &pp, &takeover).await),
        409
    );
    let stored = leases.get("virt-handler-leader").await.unwrap();
    assert_eq!(
        stored.spec.unwrap().holder_identity.as_deref(),
        Some("node-a")
    );
}

fn owned_config_map(name: &str, owner: Option<OwnerReference>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            owner_references: owner.map(|o| vec![o]),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([("k".into(), "v".into())])),
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn owned_objects_are_garbage_collected_after_their_owner() {
    let cp = control_plane().await;
    let ns = cp.create_namespace("gc").await.unwrap();
    let client = cp.client().unwrap();
    let vmis: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &vmi_resource());
    let config_maps: Api<ConfigMap> = Api::namespaced(client, &ns);
    let pp = PostParams::default();

    // Owners: a VMI (custom resource, like virt-launcher pods owned by a VMI) and a ConfigMap.
    let vmi_owner = vmis.create(&pp, &vmi("owner", &[], &[])).await.unwrap();
    let cm_owner = config_maps
        .create(&pp, &owned_config_map("owner", None))
        .await
        .unwrap();
    let reference = |api_version: &str, kind: &str, meta: &ObjectMeta| OwnerReference {
        api_version: api_version.into(),
        kind: kind.into(),
        name: meta.name.clone().unwrap(),
        uid: meta.uid.clone().unwrap(),
        controller: Some(true),
        ..OwnerReference::default()
    };
    for (name, owner) in [
        (
            "owned-by-vmi",
            reference(
                "kubevirt.io/v1",
                "VirtualMachineInstance",
                &vmi_owner.metadata,
            ),
        ),
        (
            "owned-by-configmap",
            reference("v1", "ConfigMap", &cm_owner.metadata),
        ),
    ] {
        config_maps
            .create(&pp, &owned_config_map(name, Some(owner)))
            .await
            .unwrap();
    }
    // A control: its owner stays, so it must stay too.
    let kept_owner = config_maps
        .create(&pp, &owned_config_map("kept-owner", None))
        .await
        .unwrap();
    config_maps
        .create(
            &pp,
            &owned_config_map(
                "owned-and-kept",
                Some(reference("v1", "ConfigMap", &kept_owner.metadata)),
            ),
        )
        .await
        .unwrap();

    vmis.delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    config_maps
        .delete("owner", &DeleteParams::background())
        .await
        .unwrap();
    let vmi_child = wait_gone(&config_maps, "owned-by-vmi", WAIT).await;
    let cm_child = wait_gone(&config_maps, "owned-by-configmap", WAIT).await;
    eprintln!("garbage collected after {vmi_child:?} (VMI owner), {cm_child:?} (ConfigMap owner)");
    assert!(
        config_maps
            .get_opt("owned-and-kept")
            .await
            .unwrap()
            .is_some()
    );
    cp.check_running().unwrap();
}

/// A control plane of its own (no controller manager): usable, and gone without trace when
/// dropped, also when its owner panics.
#[test]
fn dropped_control_plane_leaves_nothing_behind_even_on_panic() {
    let (tx, rx) = std::sync::mpsc::channel();
    let panicked = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let cp = ControlPlane::start(Options::default())
                .await
                .unwrap_or_else(|e| panic!("cannot start a control plane: {e:#}"));
            eprintln!("private control plane started in {:?}", cp.startup_time());
            let ns = cp.create_namespace("private").await.unwrap();
            assert!(ns.starts_with("private-"));
            tx.send((cp.data_dir().to_owned(), cp.apiserver_url().to_owned()))
                .unwrap();
            panic!("deliberate panic with a running control plane");
        })
    })
    .join();
    assert!(panicked.is_err(), "the thread was meant to panic");
    let (data_dir, url) = rx.recv().expect("the control plane never started");
    assert!(!data_dir.exists(), "{} survived", data_dir.display());
    let port = url.rsplit(':').next().unwrap().parse::<u16>().unwrap();
    let refused = std::net::TcpStream::connect(("127.0.0.1", port)).is_err();
    assert!(
        refused,
        "the apiserver port {port} still accepts connections"
    );
}
