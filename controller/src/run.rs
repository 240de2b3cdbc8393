//! Wiring: one watch per resource kind, the two controllers on top, until shutdown.

pub use crate::context::Options;
use crate::context::{Context, error_policy};
use crate::kubevirt_cr::{ClusterConfig, HANDLER_DAEMONSET, StatusWriter};
use crate::vm::Expectations;
use crate::writes::Writes;
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource, ResourceExt};
use proto::kubevirt::{
    KubeVirt, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
};
use std::sync::{Arc, Mutex};

/// The controllers (of kind `kind`) of `object`, as references for a reconcile trigger.
fn owners_of_kind<K, O>(object: &K, kind: &str) -> Vec<ObjectRef<O>>
where
    K: Resource,
    O: Resource<DynamicType = ()>,
{
    let namespace = object.meta().namespace.clone().unwrap_or_default();
    object
        .meta()
        .owner_references
        .iter()
        .flatten()
        .filter(|r| r.controller == Some(true) && r.kind == kind)
        .map(|r| ObjectRef::new(&r.name).within(&namespace))
        .collect()
}

fn api_all<K>(client: &Client, namespace: &Option<String>) -> Api<K>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The failure reason a metric names: the API's reason (`Conflict`, `NotFound`, ...) for an
/// API error, else the error's kind.
fn kube_reason(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => status.reason.clone(),
        other => format!("{other:?}")
            .split(['(', ' ', '{'])
            .next()
            .unwrap_or("Other")
            .to_string(),
    }
}

/// Runs the VM and VMI controllers until `shutdown` resolves.
///
/// One watch per kind fills a store; its events are turned into reconcile triggers here
/// (the object itself, and the owners of kind VM/VMI), sent through unbounded channels. Not
/// kube-runtime's shared-store subscribers: in kube-runtime 5.0 a subscriber whose next
/// object was deleted from the store before it was polled answers `Pending` without asking
/// to be woken (`ReflectHandle::poll_next`), and the controller never hears from that kind
/// again (seen on a real cluster: after a launcher pod came and went within one read, no
/// pod change reached the VMI controller, so no VMI was ever handed to its node again).
///
/// No reconcile runs before every store has its first full list, as KubeVirt waits for
/// its informers' caches: a VMI reconciled against an empty pod cache would look as if its
/// pod had vanished and be failed (seen: a restarted controller failing every running VMI),
/// and one admitted before the `KubeVirt` CR is known would be judged by the defaults.
///
/// With `kubevirt_namespace`, the CRs there are the configuration (read at each reconcile)
/// and their status is written here: this runs on the leader only.
pub async fn run(
    client: Client,
    options: Options,
    writes: Arc<Writes>,
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) {
    let watch_config = watcher::Config::default().any_semantic();
    let (vmi_reader, vmi_writer) = reflector::store::<VirtualMachineInstance>();
    let (pod_reader, pod_writer) = reflector::store::<Pod>();
    let (vm_reader, vm_writer) = reflector::store::<VirtualMachine>();
    let (migration_reader, migration_writer) =
        reflector::store::<VirtualMachineInstanceMigration>();
    // Reconcile triggers, queued until the controllers run.
    let (vmi_tx, vmi_rx) = futures::channel::mpsc::unbounded::<VirtualMachineInstance>();
    let (vmi_ref_tx, vmi_ref_rx) =
        futures::channel::mpsc::unbounded::<ObjectRef<VirtualMachineInstance>>();
    let (vm_tx, vm_rx) = futures::channel::mpsc::unbounded::<VirtualMachine>();
    let (vm_ref_tx, vm_ref_rx) = futures::channel::mpsc::unbounded::<ObjectRef<VirtualMachine>>();
    let (migration_tx, migration_rx) =
        futures::channel::mpsc::unbounded::<VirtualMachineInstanceMigration>();
    let (migration_ref_tx, migration_ref_rx) =
        futures::channel::mpsc::unbounded::<ObjectRef<VirtualMachineInstanceMigration>>();

    let vmi_watch = reflector(
        vmi_writer,
        watcher(
            api_all::<VirtualMachineInstance>(&client, &options.namespace),
            watch_config.clone(),
        )
        .default_backoff(),
    )
    .for_each({
        let vm_ref_tx = vm_ref_tx.clone();
        let migration_ref_tx = migration_ref_tx.clone();
        let migrations = migration_reader.clone();
        move |event| {
            // Every change of a VMI wakes its migrations (the handlers report through it).
            let wake_migrations = |vmi: &VirtualMachineInstance| {
                let namespace = vmi.namespace().unwrap_or_default();
                for m in crate::migration::controller::migrations_of(
                    &migrations,
                    &namespace,
                    &vmi.name_any(),
                ) {
                    let _ = migration_ref_tx.unbounded_send(m);
                }
            };
            match event {
                Ok(watcher::Event::Apply(vmi) | watcher::Event::InitApply(vmi)) => {
                    for owner in owners_of_kind(&vmi, "VirtualMachine") {
                        let _ = vm_ref_tx.unbounded_send(owner);
                    }
                    wake_migrations(&vmi);
                    let _ = vmi_tx.unbounded_send(vmi);
                }
                // A deleted VMI wakes its VM (which may start the next one).
                Ok(watcher::Event::Delete(vmi)) => {
                    for owner in owners_of_kind(&vmi, "VirtualMachine") {
                        let _ = vm_ref_tx.unbounded_send(owner);
                    }
                    wake_migrations(&vmi);
                }
                _ => {}
            }
            async {}
        }
    });
    let pod_watch = reflector(
        pod_writer,
        watcher(
            api_all::<Pod>(&client, &options.namespace),
            watch_config.clone().labels("kubevirt.io=virt-launcher"),
        )
        .default_backoff(),
    )
    .for_each({
        let migrations = migration_reader.clone();
        let migration_ref_tx = migration_ref_tx.clone();
        move |event| {
            // Every change of a launcher pod, its deletion included, wakes its VMI (and the
            // migration a target pod is for).
            if let Ok(
                watcher::Event::Apply(pod)
                | watcher::Event::InitApply(pod)
                | watcher::Event::Delete(pod),
            ) = &event
            {
                for owner in owners_of_kind(pod, "VirtualMachineInstance") {
                    let _ = vmi_ref_tx.unbounded_send(owner);
                }
                if let Some(m) = crate::migration::controller::migration_of_pod(&migrations, pod) {
                    let _ = migration_ref_tx.unbounded_send(m);
                }
            }
            async {}
        }
    });
    let migration_watch = reflector(
        migration_writer,
        watcher(
            api_all::<VirtualMachineInstanceMigration>(&client, &options.namespace),
            watch_config.clone(),
        )
        .default_backoff(),
    )
    .for_each(move |event| {
        match event {
            Ok(watcher::Event::Apply(m) | watcher::Event::InitApply(m)) => {
                let _ = migration_tx.unbounded_send(m);
            }
            Err(e) => tracing::warn!(
                error = %e,
                "watching VirtualMachineInstanceMigrations (is their CRD installed?)"
            ),
            _ => {}
        }
        async {}
    });
    let vm_watch = reflector(
        vm_writer,
        watcher(
            api_all::<VirtualMachine>(&client, &options.namespace),
            watch_config.clone(),
        )
        .default_backoff(),
    )
    .for_each(move |event| {
        if let Ok(watcher::Event::Apply(vm) | watcher::Event::InitApply(vm)) = event {
            let _ = vm_tx.unbounded_send(vm);
        }
        async {}
    });

    // The KubeVirt CRs and virt-handler's DaemonSet; each change wakes the status writer.
    let wake = Arc::new(tokio::sync::Notify::new());
    let (kubevirt_reader, kubevirt_writer) = reflector::store::<KubeVirt>();
    let (daemonset_reader, daemonset_writer) = reflector::store::<DaemonSet>();
    let (cluster_config, install_watches): (Arc<ClusterConfig>, BoxFuture<'static, ()>) =
        match &options.kubevirt_namespace {
            None => (
                Arc::new(ClusterConfig::fixed(options.template.clone())),
                futures::future::pending().boxed(),
            ),
            Some(namespace) => {
                let kubevirt_watch = reflector(
                    kubevirt_writer,
                    watcher(
                        Api::<KubeVirt>::namespaced(client.clone(), namespace),
                        watch_config.clone(),
                    )
                    .default_backoff(),
                )
                .for_each({
                    let wake = wake.clone();
                    let namespace = namespace.clone();
                    move |event| {
                        match event {
                            Ok(_) => wake.notify_one(),
                            Err(e) => tracing::warn!(
                                %namespace, error = %e,
                                "watching KubeVirt CRs (is the kubevirts.kubevirt.io CRD installed?)"
                            ),
                        }
                        async {}
                    }
                });
                let daemonset_watch = reflector(
                    daemonset_writer,
                    watcher(
                        Api::<DaemonSet>::namespaced(client.clone(), namespace),
                        watch_config
                            .clone()
                            .fields(&format!("metadata.name={HANDLER_DAEMONSET}")),
                    )
                    .default_backoff(),
                )
                .for_each({
                    let wake = wake.clone();
                    move |event| {
                        match event {
                            Ok(_) => wake.notify_one(),
                            Err(e) => {
                                tracing::warn!(error = %e, "watching virt-handler's DaemonSet")
                            }
                        }
                        async {}
                    }
                });
                (
                    Arc::new(ClusterConfig::new(
                        options.template.clone(),
                        namespace,
                        kubevirt_reader.clone(),
                    )),
                    async move {
                        futures::join!(kubevirt_watch, daemonset_watch);
                    }
                    .boxed(),
                )
            }
        };
    let status_writer = options
        .kubevirt_namespace
        .clone()
        .map(|namespace| StatusWriter {
            client: client.clone(),
            namespace,
            config: cluster_config.clone(),
            kubevirts: kubevirt_reader.clone(),
            daemonsets: daemonset_reader,
            launcher_image: options.template.launcher_image.clone(),
            writes: writes.clone(),
        });
    let reads_kubevirt = options.kubevirt_namespace.is_some();

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "virt-controller".into(),
            instance: Some(options.identity.clone()),
        },
    );
    let context = Arc::new(Context {
        client,
        options,
        cluster_config,
        writes,
        vmis: vmi_reader.clone(),
        pods: pod_reader.clone(),
        vms: vm_reader.clone(),
        vm_expectations: Expectations::default(),
        metrics,
        created_pods: Mutex::default(),
        vmi_versions: Mutex::default(),
        pod_gates: Mutex::default(),
        migrations: migration_reader.clone(),
        created_target_pods: Mutex::default(),
        evacuations: Mutex::default(),
        recorder,
    });

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stop_rx_status = stop_rx.clone();
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let controllers = async move {
        let kubevirts = async {
            if reads_kubevirt {
                kubevirt_reader.wait_until_ready().await
            } else {
                Ok(())
            }
        };
        let (vmis, pods, vms, kubevirts, migrations) = futures::join!(
            vmi_reader.wait_until_ready(),
            pod_reader.wait_until_ready(),
            vm_reader.wait_until_ready(),
            kubevirts,
            migration_reader.wait_until_ready(),
        );
        if vmis.is_err()
            || pods.is_err()
            || vms.is_err()
            || kubevirts.is_err()
            || migrations.is_err()
        {
            return; // a watch ended before its first list; `watches` reports it
        }
        tracing::info!("caches synced: starting the VM and VMI controllers");
        let vmi_controller =
            crate::vmi::controller::controller(vmi_rx.map(Ok), vmi_reader, vmi_ref_rx)
                .graceful_shutdown_on(stopped(stop_rx.clone()))
                .run(
                    |vmi, ctx: Arc<Context>| async move {
                        let key =
                            format!("{}/{}", vmi.namespace().unwrap_or_default(), vmi.name_any());
                        let metrics = Arc::clone(&ctx.metrics);
                        metrics
                            .reconcile(
                                "vmi",
                                &key,
                                crate::vmi::controller::reconcile(vmi, ctx),
                                |e| match e {
                                    crate::vmi::controller::Error::Kube(e) => kube_reason(e),
                                    crate::vmi::controller::Error::Render(_) => "Render".into(),
                                    crate::vmi::controller::Error::Json(_) => "Json".into(),
                                },
                            )
                            .await
                    },
                    error_policy,
                    context.clone(),
                );
        let migration_controller = crate::migration::controller::controller(
            migration_rx.map(Ok),
            migration_reader,
            migration_ref_rx,
        )
        .graceful_shutdown_on(stopped(stop_rx.clone()))
        .run(
            |m, ctx: Arc<Context>| async move {
                let key = format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any());
                let metrics = Arc::clone(&ctx.metrics);
                metrics
                    .reconcile(
                        "migration",
                        &key,
                        crate::migration::controller::reconcile(m, ctx),
                        |e| match e {
                            crate::migration::controller::Error::Kube(e) => kube_reason(e),
                            crate::migration::controller::Error::Render(_) => "Render".into(),
                        },
                    )
                    .await
            },
            error_policy,
            context.clone(),
        );
        let vm_controller = crate::vm::controller::controller(vm_rx.map(Ok), vm_reader, vm_ref_rx)
            .graceful_shutdown_on(stopped(stop_rx))
            .run(
                |vm, ctx: Arc<Context>| async move {
                    let key = format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any());
                    let metrics = Arc::clone(&ctx.metrics);
                    metrics
                        .reconcile("vm", &key, crate::vm::controller::reconcile(vm, ctx), |e| {
                            match e {
                                crate::vm::controller::Error::Kube(e) => kube_reason(e),
                                crate::vm::controller::Error::Sync(_) => "Sync".into(),
                            }
                        })
                        .await
                },
                error_policy,
                context.clone(),
            );
        let status = async {
            if let Some(writer) = status_writer {
                tokio::select! {
                    _ = writer.run(wake) => {}
                    _ = stopped(stop_rx_status) => {}
                }
            }
        };
        futures::join!(
            vmi_controller.for_each(|_| async {}),
            vm_controller.for_each(|_| async {}),
            migration_controller.for_each(|_| async {}),
            status,
        );
    };
    let watches = async {
        futures::join!(
            vmi_watch,
            pod_watch,
            vm_watch,
            migration_watch,
            install_watches
        );
    };
    let shutdown = async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    };
    tokio::select! {
        _ = watches => tracing::error!("a watch ended"),
        _ = async { futures::join!(controllers, shutdown) } => {}
    }
}
