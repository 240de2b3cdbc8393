//! The KubeVirt example manifests parse into our types and serialize back
//! without loss, and fields we do not model survive a read-modify-write.

use proto::kubevirt::{self, Phase, RunStrategy, VirtualMachineInstance};
use serde_json::{Value, json};

fn testdata(name: &str) -> String {
    let path = format!("{}/tests/testdata/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn yaml_value(text: &str) -> Value {
    serde_yaml::from_str(text).expect("test data is valid YAML")
}

/// Parses a VMI manifest, serializes it again and compares the two as JSON
/// values (order-insensitive, exact otherwise).
fn vmi_round_trip(name: &str) -> VirtualMachineInstance {
    let text = testdata(name);
    let vmi = kubevirt::parse_vmi(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
    let back = serde_json::to_value(&vmi).unwrap();
    pretty_assertions::assert_eq!(back, yaml_value(&text), "{name} lost or changed data");
    vmi
}

/// True when no struct in the value needed its `extra` map, i.e. our types
/// model every field of the manifest (so the converter sees typed data).
fn fully_typed(vmi: &VirtualMachineInstance) -> bool {
    let spec = &vmi.spec;
    spec.extra.is_empty()
        && spec.domain.extra.is_empty()
        && spec.domain.devices.extra.is_empty()
        && spec.domain.devices.disks.iter().all(|d| d.extra.is_empty())
        && spec
            .domain
            .devices
            .interfaces
            .iter()
            .all(|i| i.extra.is_empty())
        && spec.volumes.iter().all(|v| v.extra.is_empty())
        && spec.networks.iter().all(|n| n.extra.is_empty())
}

#[test]
fn vmi_ephemeral_round_trips() {
    let vmi = vmi_round_trip("vmi-ephemeral.yaml");
    assert!(fully_typed(&vmi));
    assert_eq!(vmi.spec.termination_grace_period_seconds, Some(0));
    let disk = &vmi.spec.domain.devices.disks[0];
    assert_eq!(disk.disk.as_ref().unwrap().bus.as_deref(), Some("virtio"));
    assert_eq!(
        vmi.spec.volumes[0].container_disk.as_ref().unwrap().image,
        "registry.example/guests/tiny-container-disk:v1"
    );
    assert_eq!(
        vmi.spec
            .domain
            .memory
            .as_ref()
            .unwrap()
            .guest
            .as_ref()
            .unwrap()
            .0,
        "128Mi"
    );
}

#[test]
fn vmi_migratable_round_trips() {
    let vmi = vmi_round_trip("vmi-migratable.yaml");
    assert!(fully_typed(&vmi));
    let iface = &vmi.spec.domain.devices.interfaces[0];
    assert_eq!(iface.binding_name(), Some("masquerade"));
    assert!(vmi.spec.networks[0].pod.is_some());
}

#[test]
fn vmi_masquerade_round_trips() {
    let vmi = vmi_round_trip("vmi-masquerade.yaml");
    assert!(fully_typed(&vmi));
    let iface = &vmi.spec.domain.devices.interfaces[0];
    assert_eq!(iface.ports[0].port, 80);
    assert_eq!(iface.ports[0].protocol.as_deref(), Some("TCP"));
    assert!(vmi.spec.domain.devices.rng.is_some());
    let cloud_init = vmi.spec.volumes[1].cloud_init_no_cloud.as_ref().unwrap();
    assert!(
        cloud_init
            .network_data
            .as_ref()
            .unwrap()
            .contains("fd10:0:2::2/120")
    );
    assert!(
        cloud_init
            .user_data
            .as_ref()
            .unwrap()
            .starts_with("#cloud-config")
    );
}

#[test]
fn vmi_nocloud_round_trips() {
    let vmi = vmi_round_trip("vmi-nocloud.yaml");
    assert!(fully_typed(&vmi));
    assert_eq!(
        vmi.spec.volumes[2].empty_disk.as_ref().unwrap().capacity.0,
        "2Gi"
    );
}

#[test]
fn vmi_kernel_boot_round_trips() {
    let vmi = vmi_round_trip("vmi-kernel-boot.yaml");
    assert!(fully_typed(&vmi));
    let kb = vmi
        .spec
        .domain
        .firmware
        .as_ref()
        .unwrap()
        .kernel_boot
        .as_ref()
        .unwrap();
    assert_eq!(kb.kernel_args.as_deref(), Some("console=ttyS0"));
    let c = kb.container.as_ref().unwrap();
    assert_eq!(c.kernel_path.as_deref(), Some("/boot/vmlinuz"));
    assert_eq!(c.initrd_path.as_deref(), Some("/boot/initrd.img"));
}

#[test]
fn vm_cirros_round_trips() {
    let text = testdata("vm-cirros.yaml");
    let vm = kubevirt::parse_vm(&text).unwrap();
    pretty_assertions::assert_eq!(serde_json::to_value(&vm).unwrap(), yaml_value(&text));
    assert_eq!(vm.spec.run_strategy, Some(RunStrategy::Halted));
    let template = vm.spec.template.spec.as_ref().unwrap();
    assert_eq!(template.volumes.len(), 2);
    assert!(vm.spec.extra.is_empty() && template.extra.is_empty());
}

#[test]
fn unknown_fields_survive_a_status_update() {
    // A VMI as a newer KubeVirt might write it: fields we do not model at
    // several depths, in spec and status.
    let original = json!({
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": "v", "namespace": "ns", "uid": "u-1",
                     "annotations": {"x": "y"}},
        "spec": {
            "domain": {
                "devices": {
                    "disks": [{"name": "d", "disk": {"bus": "virtio", "futureDiskOption": 3}}],
                    "futureDevices": [{"a": 1}]
                },
                "memory": {"guest": "64Mi", "futureMemoryKnob": true},
                "futureDomainField": "keep me"
            },
            "futureSpecField": {"nested": [1, 2, 3]}
        },
        "status": {
            "phase": "Scheduled",
            "nodeName": "node-1",
            "futureStatusField": {"owner": "someone else"},
            "conditions": [{"type": "Ready", "status": "True", "futureConditionField": 1}]
        }
    });
    let mut vmi: VirtualMachineInstance = serde_json::from_value(original.clone()).unwrap();
    assert_eq!(vmi.phase(), Phase::Scheduled);

    // The handler's change: phase to Running.
    vmi.status.as_mut().unwrap().phase = Some(Phase::Running);
    let written = serde_json::to_value(&vmi).unwrap();

    let mut expected = original;
    expected["status"]["phase"] = json!("Running");
    pretty_assertions::assert_eq!(written, expected);
}

#[test]
fn bad_manifests_are_clear_errors() {
    let wrong_kind = "apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata: {name: x}\nspec: {template: {}}\n";
    let err = kubevirt::parse_vmi(wrong_kind).unwrap_err();
    assert!(
        err.to_string()
            .contains("expected kind VirtualMachineInstance"),
        "{err}"
    );

    let not_yaml = "spec: [unclosed";
    assert!(
        kubevirt::parse_vmi(not_yaml)
            .unwrap_err()
            .to_string()
            .contains("YAML")
    );

    let bad_port = r#"{"metadata":{"name":"x"},"spec":{"domain":{"devices":{"interfaces":[{"name":"a","ports":[{"port":"eighty"}]}]}}}}"#;
    let err = kubevirt::parse_vmi(bad_port).unwrap_err();
    assert!(err.to_string().contains("invalid type"), "{err}");

    let bad_phase =
        r#"{"metadata":{"name":"x"},"spec":{"domain":{}},"status":{"phase":"Exploded"}}"#;
    assert!(kubevirt::parse_vmi(bad_phase).is_err());

    let no_spec = r#"{"metadata":{"name":"x"}}"#;
    assert!(
        kubevirt::parse_vmi(no_spec)
            .unwrap_err()
            .to_string()
            .contains("spec")
    );
}

#[test]
fn parser_never_panics_on_garbage() {
    // Deterministic pseudo-random inputs built from JSON/YAML fragments.
    let pieces = [
        "{",
        "}",
        "[",
        "]",
        ":",
        ",",
        "\"spec\"",
        "\"domain\"",
        "devices",
        "null",
        "-",
        "\n",
        "  ",
        "1e999",
        "\"\\u0000\"",
        "&a",
        "*a",
        "!!binary",
        "---",
        "kind",
        "~",
        "'",
    ];
    let mut state = 0x9e3779b97f4a7c15u64;
    for _ in 0..5000 {
        let mut text = String::new();
        for _ in 0..(state % 24) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let i = usize::try_from(state % pieces.len() as u64).expect("below pieces.len()");
            text.push_str(pieces[i]);
        }
        let _ = kubevirt::parse_vmi(&text);
        let _ = kubevirt::parse_vm(&text);
        let _ = proto::domain::Domain::from_json(&text);
    }
}

#[test]
fn crds_have_status_subresource_and_keep_unknown_fields() {
    for (file, crd) in proto::crd::all() {
        let version = &crd.spec.versions[0];
        assert_eq!(version.name, "v1", "{file}");
        assert!(
            version.subresources.as_ref().unwrap().status.is_some(),
            "{file}"
        );
        let schema = serde_json::to_value(version.schema.as_ref().unwrap()).unwrap();
        let props = &schema["openAPIV3Schema"]["properties"];
        assert_eq!(
            props["spec"]["x-kubernetes-preserve-unknown-fields"],
            json!(true),
            "{file}"
        );
        assert_eq!(
            props["status"]["x-kubernetes-preserve-unknown-fields"],
            json!(true),
            "{file}"
        );
        // The shipped manifests are the generated ones.
        let shipped = format!(
            "{}/../images/deploy/crds/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        let shipped = std::fs::read_to_string(&shipped).unwrap_or_else(|e| {
            panic!("{shipped}: {e} (run: cargo run -p proto --bin crdgen -- images/deploy/crds)")
        });
        assert_eq!(
            shipped,
            proto::crd::to_yaml(&crd).unwrap(),
            "{file} is stale: rerun crdgen"
        );
    }
}
