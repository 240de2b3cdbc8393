//! virt-api's webhooks called by a real kube-apiserver (the `integration` crate's control
//! plane; no controller runs, so what is stored is what the API server and virt-api made
//! of a request). The virt-api binary runs on 127.0.0.1; its webhook configurations, as
//! KubeVirt v1.9.0 names them but scoped to the test's namespace, call it by URL, and
//! virt-api writes their `caBundle` itself. One test, one control plane: the configurations
//! are cluster-wide and the control plane is this binary's alone.
//! Fails (never skips) when the control plane cannot be built or started.

use integration::{controlplane, wait_for};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, Patch, PatchParams, PostParams};
use proto::kubevirt::{KubeVirt, VirtualMachine, VirtualMachineInstance};
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

    // The virt-api binary, and the webhook configurations calling it by URL (no caBundle:
    // virt-api writes it), for this namespace only.
    let address = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
        probe.local_addr().unwrap().to_string()
    };
    let logs = tempfile::tempdir().expect("log directory");
    let log = logs.path().join("virt-api.log");
    let mut virt_api = std::process::Command::new(env!("CARGO_BIN_EXE_virt-api"))
        .args(["--namespace", &namespace, "--listen", &address])
        .args(["--extra-name", "127.0.0.1"])
        .env("KUBECONFIG", cp.kubeconfig_path())
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

    // healthz and version over TLS, the certificate verified by the CA in `kubevirt-ca`
    // for 127.0.0.1.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
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
