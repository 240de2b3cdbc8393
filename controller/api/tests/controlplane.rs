//! virt-api's webhooks called by a real kube-apiserver (the `integration` crate's control
//! plane; no controller runs, so what is stored is what the API server and virt-api made
//! of a request). The virt-api binary runs on 127.0.0.1 as its ServiceAccount
//! `kubevirt/kubevirt-apiserver` with exactly the rights `images/deploy/20-virt-api.yaml`
//! gives it (a right missing there fails the test); its webhook configurations, as KubeVirt
//! v1.9.0 names them but scoped to the test's namespace, call it by URL, and virt-api writes
//! their `caBundle` itself. One test, one control plane: the configurations, the namespace
//! `kubevirt` and the RBAC are cluster-wide and the control plane is this binary's alone.
//! Fails (never skips) when the control plane cannot be built or started.

use integration::{controlplane, wait_for};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proto::kubevirt::{
    KubeVirt, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceMigration,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A VMI this project's launcher runs (kernel boot of KubeVirt's demo images), with
/// `extra_volume` (and its disk) if given, and `machine` as its machine type if given.
fn vmi_spec(extra_volume: Option<Value>, machine: Option<&str>) -> Value {
    let mut spec = json!({
        "domain": {
            "devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}]},
            "memory": {"guest": "128Mi"},
            "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0", "container": {
                "image": "quay.io/kubevirt/alpine-ext-kernel-boot-demo:v1.9.0",
                "kernelPath": "/boot/vmlinuz-virt", "initrdPath": "/boot/initramfs-virt"}}},
        },
        "terminationGracePeriodSeconds": 0,
        "volumes": [{"name": "containerdisk", "containerDisk": {"image": "quay.io/kubevirt/alpine-container-disk-demo:v1.9.0"}}],
    });
    if let Some(volume) = extra_volume {
        let disk = json!({"name": volume["name"], "disk": {"bus": "virtio"}});
        spec["domain"]["devices"]["disks"]
            .as_array_mut()
            .unwrap()
            .push(disk);
        spec["volumes"].as_array_mut().unwrap().push(volume);
    }
    if let Some(machine) = machine {
        spec["domain"]["machine"] = json!({"type": machine});
    }
    spec
}

fn vmi(name: &str, spec: Value) -> VirtualMachineInstance {
    serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
        "metadata": {"name": name}, "spec": spec,
    }))
    .unwrap()
}

fn host_disk() -> Value {
    json!({"name": "host", "hostDisk": {
        "path": "/var/lib/kubevirt-rs-test/disk.img", "type": "DiskOrCreate", "capacity": "64Mi"}})
}

/// The API server's refusal of a write: its code and message.
fn refusal<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected the API server to refuse the write, got {other:?}"),
    }
}

/// virt-api's install namespace, as deployed.
const INSTALL: &str = "kubevirt";
/// virt-api's ServiceAccount there, as an API user.
const ACCOUNT: &str = "system:serviceaccount:kubevirt:kubevirt-apiserver";

/// The namespace `kubevirt` and virt-api's ServiceAccount and RBAC, from `images/deploy/` as
/// they are there; a kubeconfig (in `dir`) of the control plane's acting as that account.
async fn virt_api_identity(
    client: &kube::Client,
    cp: &controlplane::ControlPlane,
    dir: &std::path::Path,
) -> std::path::PathBuf {
    let deploy = concat!(env!("CARGO_MANIFEST_DIR"), "/../../images/deploy");
    let rbac = [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ClusterRole",
        "ClusterRoleBinding",
    ];
    for (file, kinds) in [
        ("00-namespace.yaml", &["Namespace"][..]),
        ("20-virt-api.yaml", &rbac[..]),
    ] {
        let text = std::fs::read_to_string(format!("{deploy}/{file}")).expect("manifest");
        for object in integration::manifests::parse(&text).expect(file) {
            let kind = object.types.as_ref().map(|t| t.kind.as_str());
            if kind.is_some_and(|k| kinds.contains(&k)) {
                integration::manifests::apply(client, &object, None, false)
                    .await
                    .unwrap_or_else(|e| panic!("{file}: {e:#}"));
            }
        }
    }
    let mut kubeconfig: serde_yaml::Value =
        serde_yaml::from_str(&std::fs::read_to_string(cp.kubeconfig_path()).unwrap()).unwrap();
    for user in kubeconfig["users"].as_sequence_mut().expect("users") {
        user["user"]["as"] = ACCOUNT.into();
    }
    let path = dir.join("kubeconfig-virt-api");
    std::fs::write(&path, serde_yaml::to_string(&kubeconfig).unwrap()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_calls_virt_api_for_vmis_and_vms() {
    // Logs with RUST_LOG=virt_api=debug.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let cp = match controlplane::shared().await {
        Ok(cp) => cp,
        Err(e) => panic!(
            "cannot run the test control plane: {e:#}\nbuild it with: {}",
            controlplane::build_script().display()
        ),
    };
    let namespace = cp.create_namespace("virt-api").await.expect("namespace");
    let client = cp.client().expect("client");

    // The virt-api binary as its ServiceAccount, and the webhook configurations calling it by
    // URL (no caBundle: virt-api writes it), for this namespace only.
    let address = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().unwrap().to_string()
    };
    let logs = tempfile::tempdir().expect("log directory");
    let kubeconfig = virt_api_identity(&client, cp, logs.path()).await;
    let log = logs.path().join("virt-api.log");
    let mut virt_api = std::process::Command::new(env!("CARGO_BIN_EXE_virt-api"))
        .args(["--namespace", INSTALL, "--listen", &address])
        .args(["--extra-name", "127.0.0.1"])
        .env("KUBECONFIG", &kubeconfig)
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .map(KillOnDrop)
        .expect("virt-api starts");
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let scope = Some(LabelSelector {
        match_labels: Some(BTreeMap::from([(
            "kubernetes.io/metadata.name".to_string(),
            namespace.clone(),
        )])),
        ..Default::default()
    });
    let mut validating =
        virt_api::configurations::validating(virt_api::configurations::url(&address));
    for webhook in validating.webhooks.iter_mut().flatten() {
        webhook.namespace_selector = scope.clone();
    }
    let mut mutating = virt_api::configurations::mutating(virt_api::configurations::url(&address));
    for webhook in mutating.webhooks.iter_mut().flatten() {
        webhook.namespace_selector = scope.clone();
    }
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &validating)
        .await
        .expect("ValidatingWebhookConfiguration");
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &mutating)
        .await
        .expect("MutatingWebhookConfiguration");

    // The KubeVirt CR, without HostDisk.
    let kubevirts: Api<KubeVirt> = Api::namespaced(client.clone(), INSTALL);
    let cr: KubeVirt = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
        "metadata": {"name": "kubevirt"},
        "spec": {"configuration": {"developerConfiguration": {"featureGates": []}}},
    }))
    .unwrap();
    kubevirts
        .create(&PostParams::default(), &cr)
        .await
        .expect("KubeVirt CR");

    let vmis: Api<VirtualMachineInstance> = Api::namespaced(client.clone(), &namespace);
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &namespace);
    let create = PostParams::default();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };

    // The API server calls virt-api once it has read the configurations and their caBundle:
    // until then a dry run of the hostDisk VMI is stored or fails otherwise (a TLS error).
    let hd = vmi("hd", vmi_spec(Some(host_disk()), None));
    let (code, message) = wait_for("the API server calling virt-api", || async {
        match vmis.create(&dry_run, &hd).await {
            Err(kube::Error::Api(status)) if status.message.contains("HostDisk") => {
                Some((status.code, status.message))
            }
            other => {
                eprintln!("not yet: {other:?}");
                None
            }
        }
    })
    .await;
    // KubeVirt's answer: 422, the cause's message as the webhook's.
    assert_eq!(code, 422, "{message}");
    assert_eq!(
        message,
        "admission webhook \"virtualmachineinstances-create-validator.kubevirt.io\" denied the request: HostDisk feature gate is not enabled"
    );

    // healthz and version over TLS, the certificate verified by the CA in `kubevirt-ca`
    // for 127.0.0.1.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), INSTALL);
    let ca = secrets.get("kubevirt-ca").await.expect("the CA's Secret");
    let ca = ca.data.unwrap()["tls.crt"].0.clone();
    let (code, body) = https_get(&address, &ca, "/healthz").await;
    assert_eq!(code, 200, "{body}\n{}", log_text());
    let body: Value = serde_json::from_str(&body).expect("healthz is JSON");
    assert_eq!(body["apiserver"]["connectivity"], "ok", "{body}");
    let (code, body) = https_get(&address, &ca, "/apis/subresources.kubevirt.io/v1/version").await;
    assert_eq!(code, 200, "{body}");
    let body: Value = serde_json::from_str(&body).expect("version is JSON");
    assert!(
        body["gitVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("v1.9.0")),
        "{body}"
    );
    // Discovery answers anyone; a subresource answers only the API server's front proxy:
    // headers naming an admin, without its certificate, are not believed (v1.9.0's 401).
    let (code, body) = https_get(&address, &ca, "/apis/subresources.kubevirt.io/v1").await;
    assert_eq!(code, 200, "{body}");
    let body: Value = serde_json::from_str(&body).expect("a resource list");
    assert_eq!(body["kind"], "APIResourceList", "{body}");
    let start = format!(
        "/apis/subresources.kubevirt.io/v1/namespaces/{namespace}/virtualmachines/vm1/start"
    );
    let admin = [
        ("X-Remote-User", "kubevirt-rs-admin"),
        ("X-Remote-Group", "system:masters"),
    ];
    let (code, body) = https_request(&address, &ca, "PUT", &start, &admin, None).await;
    assert_eq!(
        (code, body.as_str()),
        (401, "request is not authenticated"),
        "{}",
        log_text()
    );
    // A client certificate the request-header CA did not sign ends the handshake.
    let stranger = virt_api::certs::new_ca().expect("a CA");
    let refused = try_https_request(
        &address,
        &ca,
        "PUT",
        &start,
        &admin,
        Some((&stranger.cert_pem, &stranger.key_pem)),
    )
    .await;
    assert!(refused.is_err(), "a stranger's certificate: {refused:?}");

    // Refused at create, nothing stored.
    let (code, message) = refusal(vmis.create(&create, &hd).await);
    assert_eq!(code, 422);
    assert!(
        message.ends_with("HostDisk feature gate is not enabled"),
        "{message}"
    );
    assert!(
        vmis.get_opt("hd").await.unwrap().is_none(),
        "a refused VMI was stored"
    );

    // A VM whose template the launcher cannot run: refused, naming the field, not stored.
    let unrunnable: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "i440fx"},
        "spec": {"runStrategy": "Always", "template": {"spec": vmi_spec(None, Some("pc-i440fx"))}},
    }))
    .unwrap();
    let (code, message) = refusal(vms.create(&create, &unrunnable).await);
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("virtualmachine-validator.kubevirt.io")
            && message
                .contains("spec.template.spec.domain.machine.type: \"pc-i440fx\" is not supported"),
        "{message}"
    );
    assert!(
        vms.get_opt("i440fx").await.unwrap().is_none(),
        "a refused VM was stored"
    );

    // A VMI created gets KubeVirt's defaults stored (nothing else writes them here).
    let plain = vmis
        .create(&create, &vmi("plain", vmi_spec(None, None)))
        .await
        .expect("a VMI virt-api admits");
    let stored = serde_json::to_value(vmis.get("plain").await.unwrap()).unwrap();
    assert_eq!(
        serde_json::to_value(&plain).unwrap()["spec"],
        stored["spec"]
    );
    assert_eq!(stored["spec"]["architecture"], "amd64");
    assert_eq!(stored["spec"]["domain"]["machine"]["type"], "q35");
    assert_eq!(stored["spec"]["domain"]["cpu"]["model"], "host-model");
    assert_eq!(
        stored["spec"]["domain"]["cpu"]["sockets"],
        json!(1),
        "{stored}"
    );
    assert_eq!(stored["spec"]["evictionStrategy"], "None");
    assert_eq!(
        stored["spec"]["networks"],
        json!([{"name": "default", "pod": {}}])
    );
    assert_eq!(
        stored["metadata"]["annotations"]["kubevirt.io/pci-topology-version"],
        "v3"
    );
    assert_eq!(
        stored["metadata"]["finalizers"],
        json!(["kubevirt.io/foregroundDeleteVirtualMachine"])
    );

    // A VM admitted gets its template's defaults and a firmware UUID.
    let vm: VirtualMachine = serde_json::from_value(json!({
        "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
        "metadata": {"name": "fine"},
        "spec": {"runStrategy": "Halted", "template": {"spec": vmi_spec(None, None)}},
    }))
    .unwrap();
    vms.create(&create, &vm)
        .await
        .expect("a VM virt-api admits");
    let stored = serde_json::to_value(vms.get("fine").await.unwrap()).unwrap();
    let template = &stored["spec"]["template"]["spec"];
    assert_eq!(template["domain"]["machine"]["type"], "q35", "{stored}");
    assert!(
        template["domain"]["firmware"]["uuid"].is_string(),
        "{stored}"
    );

    // Migrations (v1.9.0's messages). A migration of a VMI that does not exist: refused.
    let vmims: Api<VirtualMachineInstanceMigration> = Api::namespaced(client.clone(), &namespace);
    let migration = |name: &str, spec: Value| -> VirtualMachineInstanceMigration {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    };
    let (code, message) = refusal(
        vmims
            .create(&create, &migration("nowhere", json!({"vmiName": "nope"})))
            .await,
    );
    assert_eq!(
        (code, message),
        (
            400,
            format!(
                "admission webhook \"migration-create-validator.kubevirt.io\" denied the request: the VMI \"{namespace}/nope\" does not exist"
            )
        )
    );
    // Of `plain` (no LiveMigratable condition, not final): stored with the selector label and
    // the finalizer the mutating webhook adds.
    let first = vmims
        .create(&create, &migration("first", json!({"vmiName": "plain"})))
        .await
        .expect("a migration virt-api admits");
    let stored = vmims.get("first").await.unwrap();
    assert_eq!(
        stored.metadata.labels.as_ref().unwrap()["kubevirt.io/vmi-name"],
        "plain"
    );
    assert_eq!(
        stored.metadata.finalizers,
        Some(vec!["kubevirt.io/migrationJobFinalize".to_string()])
    );
    // A second one while the first is not final: refused, naming the first.
    let (code, message) = refusal(
        vmims
            .create(&create, &migration("second", json!({"vmiName": "plain"})))
            .await,
    );
    assert_eq!(code, 400, "{message}");
    assert!(
        message.ends_with(&format!(
            "in-flight migration detected. Active migration job ({}) is currently already in progress for VMI plain.",
            first.metadata.uid.as_deref().unwrap()
        )),
        "{message}"
    );
    // Its spec never changes; its selector label stays while it is in flight.
    let (code, message) = refusal(
        vmims
            .patch(
                "first",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"vmiName": "other"}})),
            )
            .await,
    );
    assert_eq!(
        (code, message.as_str()),
        (
            422,
            "admission webhook \"migration-update-validator.kubevirt.io\" denied the request: update of Migration object's spec is restricted"
        )
    );
    let (code, message) = refusal(
        vmims
            .patch(
                "first",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"kubevirt.io/vmi-name": "other"}}})),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.ends_with("selector label can't be modified on an in-flight migration"),
        "{message}"
    );
    // A priority, from anyone but KubeVirt's controller: refused.
    let (code, message) = refusal(
        vmims
            .create(
                &create,
                &migration(
                    "urgent",
                    json!({"vmiName": "plain", "priority": "system-critical"}),
                ),
            )
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.ends_with(
            "Migration priority queue, only virt-controller is allowed to set priority field"
        ),
        "{message}"
    );
    // The first one over, the VMI not migratable: refused with the condition's reason.
    vmims
        .patch_status(
            "first",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Succeeded"}})),
        )
        .await
        .expect("the migration's phase");
    vmis.patch_status(
        "plain",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "conditions": [{
            "type": "LiveMigratable", "status": "False", "reason": "InterfaceNotLiveMigratable",
            "message": "cannot migrate VMI which does not use masquerade to connect to the pod network or bridge with kubevirt.io/allow-pod-bridge-network-live-migration VM annotation"}]}})),
    )
    .await
    .expect("the VMI's condition");
    let (code, message) = refusal(
        vmims
            .create(&create, &migration("third", json!({"vmiName": "plain"})))
            .await,
    );
    assert_eq!(code, 400, "{message}");
    assert!(
        message.ends_with("Cannot migrate VMI, Reason: InterfaceNotLiveMigratable, Message: cannot migrate VMI which does not use masquerade to connect to the pod network or bridge with kubevirt.io/allow-pod-bridge-network-live-migration VM annotation"),
        "{message}"
    );

    // Evictions of launcher pods (no kubelet: the pods stay Pending on a node that does not
    // exist, which the webhook does not look at).
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let launcher_pod = |vmi: &str| -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": format!("virt-launcher-{vmi}-abcde"),
                         "labels": {"kubevirt.io": "virt-launcher"},
                         "annotations": {"kubevirt.io/domain": vmi}},
            "spec": {"nodeName": "node-a", "automountServiceAccountToken": false,
                     "containers": [{"name": "compute", "image": "localhost/kubevirt-rs/virt-launcher:devel"}]},
        }))
        .unwrap()
    };
    // A running VMI on node-a with `strategy`, migratable.
    let evacuee = |name: &str, strategy: &str| {
        let mut spec = vmi_spec(None, None);
        spec["evictionStrategy"] = json!(strategy);
        vmi(name, spec)
    };
    for (name, strategy) in [
        ("evac", "LiveMigrate"),
        ("desched", "External"),
        ("stays", "None"),
    ] {
        vmis.create(&create, &evacuee(name, strategy))
            .await
            .expect("a VMI virt-api admits");
        vmis.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Running", "nodeName": "node-a",
                "conditions": [{"type": "LiveMigratable", "status": "True"}]}})),
        )
        .await
        .expect("the VMI's status");
        let pod = launcher_pod(name);
        wait_for("the launcher pod created", || async {
            match pods.create(&create, &pod).await {
                Ok(_) => Some(()),
                // The namespace's default ServiceAccount may not be there yet.
                Err(e) => {
                    eprintln!("not yet: {e}");
                    None
                }
            }
        })
        .await;
    }
    // Evictions by a client that does not retry a 429 (kube's default client does: each retry
    // would be another eviction, the second finding the evacuation in progress).
    let mut config = cp.config().clone();
    config.default_retry = false;
    let evictions: Api<Pod> =
        Api::namespaced(kube::Client::try_from(config).expect("client"), &namespace);
    let evict = |pod: String, annotations: Value, dry_run: bool| {
        let pods = evictions.clone();
        async move {
            let eviction = json!({"apiVersion": "policy/v1", "kind": "Eviction",
                                  "metadata": {"name": pod, "annotations": annotations}});
            let params = PostParams {
                dry_run,
                ..Default::default()
            };
            pods.create_subresource::<_, Value>("eviction", &pod, &params, &eviction)
                .await
        }
    };
    let evacuation_node = |vmi: VirtualMachineInstance| {
        vmi.status
            .and_then(|s| s.extra.get("evacuationNodeName").cloned())
            .unwrap_or(Value::Null)
    };
    let interceptor =
        "admission webhook \"virt-launcher-eviction-interceptor.kubevirt.io\" denied the request: ";
    let triggered = format!("Eviction triggered evacuation of VMI \"{namespace}/evac\"");
    // A dry run: denied as a real one, nothing marked.
    let (code, message) = refusal(evict("virt-launcher-evac-abcde".into(), json!({}), true).await);
    assert_eq!((code, message), (429, format!("{interceptor}{triggered}")));
    assert_eq!(
        evacuation_node(vmis.get("evac").await.unwrap()),
        Value::Null
    );
    // LiveMigrate: the VMI marked with the pod's node (virt-api's own write, as its account),
    // the eviction denied; a second one finds it in progress.
    let (code, message) = refusal(evict("virt-launcher-evac-abcde".into(), json!({}), false).await);
    assert_eq!((code, message), (429, format!("{interceptor}{triggered}")));
    assert_eq!(
        evacuation_node(vmis.get("evac").await.unwrap()),
        json!("node-a")
    );
    let (code, message) = refusal(evict("virt-launcher-evac-abcde".into(), json!({}), false).await);
    assert_eq!(
        (code, message),
        (
            429,
            format!("{interceptor}Evacuation in progress: {triggered}")
        )
    );
    // The descheduler's eviction: the VMI also gets the eviction source.
    let (code, message) = refusal(
        evict(
            "virt-launcher-desched-abcde".into(),
            json!({"requested-by": "sigs.k8s.io/descheduler"}),
            false,
        )
        .await,
    );
    assert_eq!(code, 429, "{message}");
    let marked = vmis.get("desched").await.unwrap();
    assert_eq!(
        marked.metadata.annotations.as_ref().unwrap()["kubevirt.io/eviction-source"],
        "descheduler"
    );
    assert_eq!(evacuation_node(marked), json!("node-a"));
    // No eviction strategy: the eviction goes through (no disruption budget here).
    evict("virt-launcher-stays-abcde".into(), json!({}), false)
        .await
        .expect("the eviction of a pod whose VMI has no eviction strategy");
    assert_eq!(
        evacuation_node(vmis.get("stays").await.unwrap()),
        Value::Null
    );

    // The CR enables HostDisk: the same VMI is admitted, without a restart of virt-api.
    kubevirts
        .patch(
            "kubevirt",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"configuration": {"developerConfiguration": {
                "featureGates": ["HostDisk"]}}}}),
            ),
        )
        .await
        .expect("CR patch");
    wait_for(
        "the hostDisk VMI admitted once the CR has HostDisk",
        || async {
            match vmis.create(&create, &hd).await {
                Ok(_) => Some(()),
                Err(kube::Error::Api(status)) if status.message.contains("HostDisk") => None,
                Err(e) => panic!("creating the hostDisk VMI: {e}"),
            }
        },
    )
    .await;
    let stored = vmis.get("hd").await.expect("the admitted hostDisk VMI");
    assert!(
        stored.spec.volumes.iter().any(|v| v.host_disk.is_some()),
        "{stored:?}"
    );

    // SIGTERM: virt-api ends cleanly.
    let status = integration::terminate(&mut virt_api.0).await;
    assert!(
        status.success(),
        "virt-api exits cleanly on SIGTERM: {status}\n{}",
        log_text()
    );
}

/// `GET path` from virt-api at `address` over TLS, its certificate verified by `ca` (PEM) for
/// 127.0.0.1: the status code and the body.
async fn https_get(address: &str, ca: &[u8], path: &str) -> (u16, String) {
    https_request(address, ca, "GET", path, &[], None).await
}

async fn https_request(
    address: &str,
    ca: &[u8],
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    client: Option<(&str, &str)>,
) -> (u16, String) {
    try_https_request(address, ca, method, path, headers, client)
        .await
        .expect("an HTTPS answer")
}

/// `method path` with `headers` (no body) over TLS, with `client`'s certificate and key
/// (PEM) if given: the status code and the body, or why there was no answer.
async fn try_https_request(
    address: &str,
    ca: &[u8],
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    client: Option<(&str, &str)>,
) -> Result<(u16, String), String> {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(rustls::pki_types::CertificateDer::from_pem_slice(ca).expect("the CA's PEM"))
        .expect("the CA");
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match client {
        None => config.with_no_client_auth(),
        Some((cert, key)) => config
            .with_client_auth_cert(
                vec![rustls::pki_types::CertificateDer::from_pem_slice(cert.as_bytes()).unwrap()],
                rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .expect("a client certificate"),
    };
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = connector
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS: {e}"))?;
    let mut request =
        format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut response = Vec::new();
    // A peer that closes without close_notify is fine here: the body is complete.
    let _ = tls.read_to_end(&mut response).await;
    let text = String::from_utf8_lossy(&response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP response: {text:?}"))?;
    let code = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status line: {head:?}"))?;
    Ok((code, body.to_string()))
}

/// A child process that is killed (and reaped) when the test ends, even by a panic.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
