//! `kubectl apply -f images/deploy/` works on a cluster that has nothing of ours yet: every
//! object of every manifest there, in kubectl's order, is first checked by the API server
//! (server-side dry run, strict field validation) and then applied, on a fresh control plane
//! without the kubevirt.io CRDs. Applying them for real is what shows the order works: each
//! object is dry-run only once the namespace and the CRDs before it exist. Then the second
//! step, `kubectl apply -f images/deploy/cr/`: the KubeVirt CR, which kubectl can only map
//! once its CRD is served (in the same `apply` it fails with "ensure CRDs are installed
//! first", so it is not in images/deploy/ itself). The example VMs are then dry-run without
//! virt-api's webhook configurations (no virt-api runs here: they would refuse them).

use integration::controlplane::{ControlPlane, Options};
use integration::manifests;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::Api;
use std::path::Path;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_deploy_manifest_is_accepted_in_kubectl_order() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/deploy");
    let manifests = manifests::read_dir(&dir).expect("images/deploy");
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane (integration/controlplane/build.sh builds it)");
    let client = cp.client().unwrap();
    let mut applied = Vec::new();
    for manifest in &manifests {
        let file = manifest.path.file_name().unwrap().to_string_lossy();
        assert!(!manifest.objects.is_empty(), "{file} holds no object");
        for object in &manifest.objects {
            for dry_run in [true, false] {
                manifests::apply(&client, object, None, dry_run)
                    .await
                    .unwrap_or_else(|e| panic!("{file}: {e:#}"));
            }
            applied.push(manifests::describe(object));
        }
    }
    assert_eq!(
        applied[0], "Namespace/kubevirt",
        "the namespace comes first"
    );
    for ours in [
        "CustomResourceDefinition/kubevirts.kubevirt.io",
        "CustomResourceDefinition/virtualmachineinstances.kubevirt.io",
        "CustomResourceDefinition/virtualmachines.kubevirt.io",
        "CustomResourceDefinition/virtualmachineinstancemigrations.kubevirt.io",
        "ServiceAccount/kubevirt/virt-controller",
        "ClusterRole/kubevirt-rs-virt-controller",
        "ClusterRoleBinding/kubevirt-rs-virt-controller",
        "Role/kubevirt/virt-controller-leader-election",
        "RoleBinding/kubevirt/virt-controller-leader-election",
        "Role/kubevirt/virt-controller-install",
        "RoleBinding/kubevirt/virt-controller-install",
        "Deployment/kubevirt/virt-controller",
        "ServiceAccount/kubevirt/kubevirt-apiserver",
        "Role/kubevirt/kubevirt-apiserver",
        "RoleBinding/kubevirt/kubevirt-apiserver",
        "ClusterRole/kubevirt-apiserver",
        "ClusterRoleBinding/kubevirt-apiserver",
        "Service/kubevirt/virt-api",
        "Deployment/kubevirt/virt-api",
        "ValidatingWebhookConfiguration/virt-api-validator",
        "MutatingWebhookConfiguration/virt-api-mutator",
    ] {
        assert!(applied.iter().any(|a| a == ours), "{ours} in {applied:?}");
    }
    assert!(
        !applied.iter().any(|a| a.starts_with("KubeVirt/")),
        "the KubeVirt CR cannot be applied with its CRD: {applied:?}"
    );
    let install = manifests::read_dir(&dir.join("cr")).expect("images/deploy/cr");
    let mut installed = Vec::new();
    for manifest in &install {
        let file = manifest.path.file_name().unwrap().to_string_lossy();
        for object in &manifest.objects {
            apply_when_served(&client, object, &file, false).await;
            installed.push(manifests::describe(object));
        }
    }
    assert_eq!(installed, ["KubeVirt/kubevirt/kubevirt"], "one KubeVirt CR");

    // No virt-api runs on this control plane (no kubelet), and its webhooks' failurePolicy is
    // Fail: every VM and VMI would be refused. The examples are checked without them.
    Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .delete("virt-api-validator", &Default::default())
        .await
        .expect("deleting virt-api-validator");
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .delete("virt-api-mutator", &Default::default())
        .await
        .expect("deleting virt-api-mutator");
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../images/examples");
    let examples = manifests::read_dir(&examples).expect("images/examples");
    let mut kinds = Vec::new();
    for manifest in &examples {
        let file = manifest.path.file_name().unwrap().to_string_lossy();
        for object in &manifest.objects {
            apply_when_served(&client, object, &file, true).await;
            kinds.push(manifests::describe(object));
        }
    }
    for example in [
        "VirtualMachine/default/testguest",
        "VirtualMachineInstance/default/testguest",
    ] {
        assert!(kinds.iter().any(|k| k == example), "{example} in {kinds:?}");
    }
}

/// Applies `object` (a dry run if `dry_run`) once its kind is served: CRDs just created
/// appear in discovery once Established.
async fn apply_when_served(
    client: &kube::Client,
    object: &kube::api::DynamicObject,
    file: &str,
    dry_run: bool,
) {
    let start = std::time::Instant::now();
    loop {
        match manifests::apply(client, object, None, dry_run).await {
            Ok(_) => return,
            Err(e) if start.elapsed() < std::time::Duration::from_secs(60) => {
                eprintln!("{file}: {e:#}; retrying");
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Err(e) => panic!("{file}: {e:#}"),
        }
    }
}

/// An example VM, read through the project's own types (the CRDs keep unknown fields, so a
/// misspelt field would pass the API server), as a VMI of its template.
fn example_vm(file: &str) -> proto::kubevirt::VirtualMachineInstance {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../images/examples")
        .join(file);
    let vm: proto::kubevirt::VirtualMachine =
        serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    proto::kubevirt::VirtualMachineInstance {
        spec: vm.spec.template.spec.clone().expect("a template"),
        ..serde_json::from_str(
            r#"{"metadata": {"name": "x"}, "spec": {"domain": {"devices": {}}}}"#,
        )
        .unwrap()
    }
}

/// The example VM the cluster demo applies boots the test disk as KubeVirt users' VMs boot:
/// no kernel named, BIOS, its first disk.
#[test]
fn the_example_vm_boots_the_test_disk_without_a_kernel() {
    let vmi = example_vm("vm-testguest.yaml");
    assert!(proto::contract::kernel_boot::kernel_boot(&vmi).is_none());
    assert_eq!(
        proto::contract::boot_disk::firmware(&vmi),
        Ok(proto::contract::boot_disk::Firmware::Bios { use_serial: false })
    );
    let boot = proto::contract::boot_disk::choose(&vmi).unwrap().unwrap();
    assert_eq!(boot.name, "rootdisk");
    let disk = vmi.spec.volumes[0]
        .container_disk
        .as_ref()
        .expect("a containerDisk");
    assert_eq!(disk.image, "localhost/kubevirt-rs/test-disk:devel");
    assert_eq!(proto::contract::runnable::check(&vmi), Ok(()));
}

/// The kernel-boot example names the project's kernel-boot image.
#[test]
fn the_kernel_boot_example_vm_boots_the_test_guest_from_the_projects_images() {
    let vmi = example_vm("vm-testguest-kernel-boot.yaml");
    let spec = vmi.spec.clone();
    let kernel = proto::contract::kernel_boot::container(&vmi).expect("kernelBoot.container");
    assert_eq!(
        kernel.image,
        "localhost/kubevirt-rs/test-guest-kernel:devel"
    );
    assert_eq!(kernel.kernel_path.as_deref(), Some("/boot/guest.elf"));
    assert!(
        kernel.extra.is_empty(),
        "unknown fields: {:?}",
        kernel.extra
    );
    let disk = spec.volumes[0]
        .container_disk
        .as_ref()
        .expect("a containerDisk");
    assert_eq!(disk.image, "localhost/kubevirt-rs/test-disk:devel");
    let interface = &spec.domain.devices.interfaces[0];
    assert!(interface.masquerade.is_some(), "masquerade binding");
    assert!(spec.domain.devices.rng.is_some());
}
