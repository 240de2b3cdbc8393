//! The VirtualMachine controller: keeps a VMI running (or not) as the run strategy says.

pub mod controller;
pub mod decide;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use proto::kubevirt::well_known::{VM_CONTROLLER_FINALIZER, VM_GENERATION_ANNOTATION};
use proto::kubevirt::{Disk, Firmware, VirtualMachine, VirtualMachineInstance};
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Namespace of KubeVirt's legacy firmware UUIDs (`pkg/virt-controller/watch/vm/firmware.go`).
const FIRMWARE_UUID_NAMESPACE: uuid::Uuid = uuid::uuid!("6a1a24a1-4061-4607-8bf4-a3963d0c5895");

/// The firmware UUID a VM gets when its template has none: a UUIDv5 of the VM name, so it
/// stays the same across restarts.
pub fn legacy_firmware_uuid(vm_name: &str) -> String {
    uuid::Uuid::new_v5(&FIRMWARE_UUID_NAMESPACE, vm_name.as_bytes()).to_string()
}

/// `revision-start-vm-<VM UID>-<generation>`.
pub(crate) fn revision_name(vm_uid: &str, generation: i64) -> String {
    format!("revision-start-vm-{vm_uid}-{generation}")
}

pub(crate) fn vm_owner_reference(vm: &VirtualMachine) -> Option<OwnerReference> {
    Some(OwnerReference {
        api_version: "kubevirt.io/v1".into(),
        kind: "VirtualMachine".into(),
        name: vm.metadata.name.clone()?,
        uid: vm.metadata.uid.clone()?,
        controller: Some(true),
        block_owner_deletion: Some(true),
    })
}

/// `SetupVMIFromVM` plus what `startVMI` adds: the template's metadata and spec, the VM's name
/// and namespace, the owner reference, a stable firmware UUID, a disk for every volume
/// without one, the generation annotation and the VM controller's finalizer.
pub(crate) fn vmi_from_vm(vm: &VirtualMachine) -> Result<VirtualMachineInstance, String> {
    let name = vm.metadata.name.clone().ok_or("VM without a name")?;
    let template = &vm.spec.template;
    let spec = template
        .spec
        .clone()
        .ok_or("VM without spec.template.spec")?;
    let template_meta = template.metadata.clone().unwrap_or_default();
    let mut vmi = VirtualMachineInstance::new(&name, spec);
    vmi.metadata = ObjectMeta {
        name: Some(name.clone()),
        namespace: vm.metadata.namespace.clone(),
        labels: template_meta.labels.clone(),
        annotations: template_meta.annotations.clone(),
        finalizers: template_meta.finalizers.clone(),
        owner_references: vm_owner_reference(vm).map(|r| vec![r]),
        ..Default::default()
    };
    let firmware = vmi
        .spec
        .domain
        .firmware
        .get_or_insert_with(Firmware::default);
    if firmware.uuid.as_deref().is_none_or(str::is_empty) {
        firmware.uuid = Some(legacy_firmware_uuid(&name));
    }
    // `util.SetDefaultVolumeDisk`: a volume without a disk becomes a plain disk.
    let missing: Vec<String> = vmi
        .spec
        .volumes
        .iter()
        .filter(|v| {
            !vmi.spec
                .domain
                .devices
                .disks
                .iter()
                .any(|d| d.name == v.name)
        })
        .map(|v| v.name.clone())
        .collect();
    for volume in missing {
        vmi.spec.domain.devices.disks.push(Disk {
            name: volume,
            disk: Some(Default::default()),
            ..Default::default()
        });
    }
    vmi.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(
            VM_GENERATION_ANNOTATION.into(),
            vm.metadata.generation.unwrap_or(0).to_string(),
        );
    vmi.metadata
        .finalizers
        .get_or_insert_with(Vec::new)
        .push(VM_CONTROLLER_FINALIZER.into());
    Ok(vmi)
}

/// What a VM waits to see in the VMI cache before it decides again (KubeVirt's
/// `ControllerExpectations`): without it, a slow cache would make it create a second VMI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expectation {
    /// A VMI with this name was created.
    Creation(String),
    /// The VMI with this UID was deleted.
    Deletion(String),
}

/// Expectations by VM key, forgotten after [`Expectations::TTL`] like KubeVirt's.
#[derive(Debug, Default)]
pub struct Expectations {
    pending: Mutex<HashMap<String, (Expectation, Instant)>>,
}

impl Expectations {
    pub(crate) const TTL: Duration = Duration::from_secs(300);

    pub fn expect(&self, key: &str, expectation: Expectation) {
        self.lock()
            .insert(key.to_string(), (expectation, Instant::now()));
    }

    pub fn forget(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Whether the cache has caught up. `cached` is the VMI in the cache: (name, uid, deleting).
    pub(crate) fn satisfied(&self, key: &str, cached: Option<(&str, &str, bool)>) -> bool {
        let mut pending = self.lock();
        let Some((expectation, since)) = pending.get(key) else {
            return true;
        };
        let met = since.elapsed() > Self::TTL
            || match (expectation, cached) {
                (Expectation::Creation(name), Some((cached_name, _, _))) => cached_name == name,
                (Expectation::Creation(_), None) => false,
                (Expectation::Deletion(uid), Some((_, cached_uid, deleting))) => {
                    cached_uid != uid || deleting
                }
                (Expectation::Deletion(_), None) => true,
            };
        if met {
            pending.remove(key);
        }
        met
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Expectation, Instant)>> {
        // A panic while holding the lock leaves plain data behind; keep using it.
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn legacy_uuid_is_a_stable_v5_of_the_name() {
        let a = legacy_firmware_uuid("testvm");
        assert_eq!(a, legacy_firmware_uuid("testvm"));
        assert_ne!(a, legacy_firmware_uuid("testvm2"));
        let parsed = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(parsed.get_version_num(), 5);
        // Computed independently: SHA-1 over the namespace bytes and the name.
        let mut sha = sha1_smol::Sha1::new();
        sha.update(FIRMWARE_UUID_NAMESPACE.as_bytes());
        sha.update(b"testvm");
        let digest = sha.digest().bytes();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        bytes[6] = (bytes[6] & 0x0f) | 0x50;
        bytes[8] = (bytes[8] & 0x3f) | 0x80;
        assert_eq!(uuid::Uuid::from_bytes(bytes).to_string(), a);
    }

    fn vm() -> VirtualMachine {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
            "metadata": {"name": "testvm", "namespace": "ns", "uid": "vm-uid", "generation": 3},
            "spec": {"runStrategy": "Always", "template": {
                "metadata": {"labels": {"kubevirt.io/vm": "testvm"}, "annotations": {"a": "b"}},
                "spec": {"domain": {"devices": {"disks": [{"name": "root", "disk": {"bus": "virtio"}}]}},
                         "volumes": [{"name": "root", "containerDisk": {"image": "img"}},
                                     {"name": "cloudinit", "cloudInitNoCloud": {"userData": "#cloud-config"}}]}}}
        }))
        .unwrap()
    }

    #[test]
    fn vmi_from_vm_copies_and_adds() {
        let vmi = vmi_from_vm(&vm()).unwrap();
        assert_eq!(vmi.metadata.name.as_deref(), Some("testvm"));
        assert_eq!(vmi.metadata.namespace.as_deref(), Some("ns"));
        let owner = &vmi.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("VirtualMachine", "vm-uid", Some(true))
        );
        assert_eq!(
            vmi.metadata.labels.as_ref().unwrap()["kubevirt.io/vm"],
            "testvm"
        );
        let annotations = vmi.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations["a"], "b");
        assert_eq!(annotations[VM_GENERATION_ANNOTATION], "3");
        assert_eq!(
            vmi.metadata.finalizers.as_deref(),
            Some(&[VM_CONTROLLER_FINALIZER.to_string()][..])
        );
        assert_eq!(
            vmi.spec.domain.firmware.as_ref().unwrap().uuid.as_deref(),
            Some(legacy_firmware_uuid("testvm").as_str())
        );
        let disks: Vec<_> = vmi
            .spec
            .domain
            .devices
            .disks
            .iter()
            .map(|d| d.name.as_str())
            .collect();
        assert_eq!(disks, ["root", "cloudinit"]);
    }

    #[test]
    fn template_uuid_wins() {
        let mut vm = vm();
        vm.spec.template.spec.as_mut().unwrap().domain.firmware = Some(Firmware {
            uuid: Some("given".into()),
            ..Default::default()
        });
        assert_eq!(
            vmi_from_vm(&vm)
                .unwrap()
                .spec
                .domain
                .firmware
                .unwrap()
                .uuid
                .as_deref(),
            Some("given")
        );
    }

    #[test]
    fn revision_names() {
        assert_eq!(revision_name("abc", 2), "revision-start-vm-abc-2");
    }

    #[test]
    fn expectations_wait_for_the_cache() {
        let e = Expectations::default();
        assert!(e.satisfied("ns/vm", None));
        e.expect("ns/vm", Expectation::Creation("vm".into()));
        assert!(!e.satisfied("ns/vm", None));
        assert!(e.satisfied("ns/vm", Some(("vm", "u1", false))));
        assert!(e.satisfied("ns/vm", None), "met expectations are dropped");
        e.expect("ns/vm", Expectation::Deletion("u1".into()));
        assert!(!e.satisfied("ns/vm", Some(("vm", "u1", false))));
        assert!(e.satisfied("ns/vm", Some(("vm", "u1", true))));
        e.expect("ns/vm", Expectation::Deletion("u1".into()));
        e.forget("ns/vm");
        assert!(e.satisfied("ns/vm", Some(("vm", "u1", false))));
    }
}
