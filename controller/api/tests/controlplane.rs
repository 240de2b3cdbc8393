//! virt-api's webhooks called by a real kube-apiserver (the `integration` crate's control
//! plane; no controller runs, so what is stored is what the API server and virt-api made
//! of a request). virt-api runs in-process on 127.0.0.1; its webhook configurations, as
//! KubeVirt v1.9.0 names them but scoped to the test's namespace, call it by URL, and
//! virt-api writes their `caBundle` itself. One test, one control plane: the configurations
//! are cluster-wide and the control plane is this binary's alone.
//! Fails (never skips) when the control plane cannot be built or started.

use integration::controlplane;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proto::kubevirt::{KubeVirt, VirtualMachine, VirtualMachineInstance};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(60);

async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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

    // virt-api, and the webhook configurations calling it by URL (no caBundle: virt-api
    // writes it), for this namespace only.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("listener");
    let address = listener.local_addr().unwrap().to_string();
    let mut options = virt_api::Options::new(&namespace);
    options.extra_names = vec!["127.0.0.1".into()];
    options.ca_bundle_interval = Duration::from_secs(1);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(virt_api::run(client.clone(), listener, options, async {
        let _ = stopped.await;
    }));
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
    let kubevirts: Api<KubeVirt> = Api::namespaced(client.clone(), &namespace);
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

    assert!(
        !served.is_finished(),
        "virt-api stopped: {:?}",
        served.await
    );
    let _ = stop.send(());
    served
        .await
        .expect("virt-api's task")
        .expect("virt-api ends cleanly");
}
