//! The pod for VMI shapes beyond `vmi-migratable`: kernel boot (the whole pod), hugepages,
//! probes, config volumes, DataVolumes, access credentials, scheduling (CPU features,
//! realtime, SEV, arm64), Istio and the debug knobs. Expected values are written from
//! KubeVirt v1.9.0's `pkg/virt-controller/services/*.go`, not produced by this code.

use super::tests::{IMAGE, UID, assert_fields, config, migratable, render};
use super::*;
use pretty_assertions::assert_eq;
use serde_json::{Value, json};

fn freezer(name: &str, action: &str) -> String {
    format!(
        "[\"/usr/bin/virt-freezer\", \"--{action}\", \"--name\", \"{name}\", \"--namespace\", \"default\"]"
    )
}

/// A VMI from `migratable()` with `changes` merged into its JSON (`null` removes).
fn changed(changes: Value) -> VirtualMachineInstance {
    fn merge(into: &mut Value, from: &Value) {
        match (into, from) {
            (Value::Object(into), Value::Object(from)) => {
                for (key, value) in from {
                    if value.is_null() {
                        into.remove(key);
                    } else {
                        merge(into.entry(key.clone()).or_insert(Value::Null), value);
                    }
                }
            }
            (into, from) => *into = from.clone(),
        }
    }
    let mut value = serde_json::to_value(migratable()).unwrap();
    merge(&mut value, &changes);
    serde_json::from_value(value).expect("a VMI")
}

fn compute(pod: &Value) -> &Value {
    &pod["spec"]["containers"][0]
}

fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

/// KubeVirt's `examples/vmi-kernel-boot.yaml` (with a pull secret and policy): the kernel
/// image is an image volume at `/var/run/kubevirt-kernel-boot`, resolved by its own init
/// container, and its pull secret is the pod's.
#[test]
fn kernel_boot_pod_matches_kubevirt() {
    let text = include_str!("../../../proto/tests/testdata/vmi-kernel-boot.yaml");
    let mut vmi = proto::kubevirt::parse_vmi(text).expect("the example parses");
    vmi.metadata.namespace = Some("default".into());
    vmi.metadata.uid = Some(UID.into());
    let kernel = "registry.example/guests/kernel-boot:v1";
    {
        let container = vmi
            .spec
            .domain
            .firmware
            .as_mut()
            .and_then(|f| f.kernel_boot.as_mut())
            .and_then(|k| k.container.as_mut())
            .unwrap();
        container.image_pull_secret = Some("kernel-pull-secret".into());
        container.image_pull_policy = Some("Always".into());
    }
    let non_root_support = json!({
        "runAsUser": 107, "runAsNonRoot": true, "allowPrivilegeEscalation": false,
        "capabilities": {"drop": ["ALL"]},
    });
    let expected = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "generateName": "virt-launcher-vmi-kernel-boot-",
            "labels": {
                "special": "vmi-kernel-boot",
                "kubevirt.io": "virt-launcher",
                "kubevirt.io/created-by": UID,
                "vm.kubevirt.io/name": "vmi-kernel-boot",
                "vmi.kubevirt.io/id": "vmi-kernel-boot",
            },
            "annotations": {
                "kubevirt.io/domain": "vmi-kernel-boot",
                "kubectl.kubernetes.io/default-container": "compute",
                "kubevirt.io/migrationTransportUnix": "true",
                "descheduler.alpha.kubernetes.io/request-evict-only": "",
                "pre.hook.backup.velero.io/container": "compute",
                "pre.hook.backup.velero.io/command": freezer("vmi-kernel-boot", "freeze"),
                "pre.hook.backup.velero.io/timeout": "60s",
                "post.hook.backup.velero.io/container": "compute",
                "post.hook.backup.velero.io/command": freezer("vmi-kernel-boot", "unfreeze"),
                "kubevirt.io/pci-topology-version": "v3",
                // 220 + 8 (one vCPU) + 8 (IO thread) + 32 (video) MiB; no request, no page tables.
                "kubevirt.io/memory-overhead-bytes": "281018368",
            },
            "ownerReferences": [{
                "apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
                "name": "vmi-kernel-boot", "uid": UID, "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "hostname": "vmi-kernel-boot",
            "securityContext": {"fsGroup": 107, "runAsUser": 107, "runAsGroup": 107, "runAsNonRoot": true},
            "terminationGracePeriodSeconds": 30,
            "restartPolicy": "Never",
            "containers": [{
                "name": "compute",
                "image": IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": [
                    "/usr/bin/virt-launcher-monitor",
                    "--qemu-timeout", "240s",
                    "--name", "vmi-kernel-boot",
                    "--uid", UID,
                    "--namespace", "default",
                    "--kubevirt-share-dir", "/var/run/kubevirt",
                    "--ephemeral-disk-dir", "/var/run/kubevirt-ephemeral-disks",
                    "--container-disk-dir", "/var/run/kubevirt/container-disks",
                    "--grace-period-seconds", "15",
                    "--hook-sidecars", "0",
                    "--ovmf-path", "/usr/share/edk2/ovmf",
                    "--disk-memory-limit", "2097152000",
                    "--hypervisor", "kvm",
                    "--run-as-nonroot",
                    "--image-volume",
                    "--libvirt-hook-server-and-client",
                    "--upgrade-ordinal-ifaces",
                ],
                "securityContext": {
                    "runAsUser": 107, "runAsGroup": 107, "runAsNonRoot": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                },
                "volumeMounts": [
                    {"name": "private", "mountPath": "/var/run/kubevirt-private"},
                    {"name": "public", "mountPath": "/var/run/kubevirt"},
                    {"name": "ephemeral-disks", "mountPath": "/var/run/kubevirt-ephemeral-disks"},
                    {"name": "libvirt-runtime", "mountPath": "/var/run/libvirt"},
                    {"name": "sockets", "mountPath": "/var/run/kubevirt/sockets"},
                    {"name": "kernel-boot-volume", "mountPath": "/var/run/kubevirt-kernel-boot", "readOnly": true},
                    {"name": "hotplug-disks", "mountPath": "/var/run/kubevirt/hotplug-disks", "mountPropagation": "HostToContainer"},
                ],
                "resources": {
                    // The webhook's default interface (bridge, virtio) needs tun and vhost-net.
                    "limits": {
                        "devices.kubevirt.io/kvm": "1",
                        "devices.kubevirt.io/tun": "1",
                        "devices.kubevirt.io/vhost-net": "1",
                    },
                    "requests": {"cpu": "100m", "memory": "1292Mi", "ephemeral-storage": "50M"},
                },
                "env": [
                    {"name": "XDG_CACHE_HOME", "value": "/var/run/kubevirt-private"},
                    {"name": "XDG_CONFIG_HOME", "value": "/var/run/kubevirt-private"},
                    {"name": "XDG_RUNTIME_DIR", "value": "/var/run"},
                    {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                ],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
            "initContainers": [
                {
                    "name": "guest-console-log",
                    "image": IMAGE,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/usr/bin/virt-tail"],
                    "args": ["--logfile", format!("/var/run/kubevirt-private/{UID}/virt-serial0-log")],
                    "volumeMounts": [{"name": "private", "mountPath": "/var/run/kubevirt-private", "readOnly": true}],
                    "resources": {
                        "requests": {"cpu": "5m", "memory": "35M"},
                        "limits": {"cpu": "15m", "memory": "60M"},
                    },
                    "securityContext": non_root_support,
                    "restartPolicy": "Always",
                    "env": [{"name": "VIRT_LAUNCHER_LOG_VERBOSITY", "value": "2"}],
                },
                {
                    "name": "volumekernel-boot-volume",
                    "image": kernel,
                    "imagePullPolicy": "Always",
                    "command": ["/container-disk-binary/usr/bin/container-disk"],
                    "args": ["--no-op"],
                    "resources": {
                        "requests": {"cpu": "1m", "memory": "1M", "ephemeral-storage": "50M"},
                        "limits": {"cpu": "10m", "memory": "40M"},
                    },
                    "securityContext": non_root_support,
                    "volumeMounts": [{"name": "launcher-volume", "mountPath": "/container-disk-binary", "readOnly": true}],
                },
            ],
            "nodeSelector": {
                "kubernetes.io/arch": "amd64",
                "kubevirt.io/schedulable": "true",
                "machine-type.node.kubevirt.io/q35": "true",
            },
            "volumes": [
                {"name": "private", "emptyDir": {}},
                {"name": "public", "emptyDir": {}},
                {"name": "sockets", "emptyDir": {}},
                {"name": "virt-bin-share-dir", "emptyDir": {}},
                {"name": "libvirt-runtime", "emptyDir": {}},
                {"name": "ephemeral-disks", "emptyDir": {}},
                {"name": "kernel-boot-volume", "image": {"reference": kernel, "pullPolicy": "Always"}},
                {"name": "launcher-volume", "image": {"reference": IMAGE, "pullPolicy": "IfNotPresent"}},
                {"name": "hotplug-disks", "emptyDir": {}},
            ],
            "imagePullSecrets": [{"name": "kernel-pull-secret"}],
            "readinessGates": [{"conditionType": "kubevirt.io/virtual-machine-unpaused"}],
            "enableServiceLinks": false,
            "automountServiceAccountToken": false,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "node-labeller.kubevirt.io/obsolete-host-model", "operator": "DoesNotExist"},
                ]}],
            }}},
        },
    });
    assert_fields(&render(&vmi), &expected, "pod");
    // The mount and the volume are where the handler and the launcher look for them.
    assert_eq!(
        proto::contract::pod_paths::KERNEL_BOOT_DIR,
        "/var/run/kubevirt-kernel-boot"
    );
    assert_eq!(
        proto::contract::pod_paths::KERNEL_BOOT_VOLUME,
        "kernel-boot-volume"
    );

    // Without image volumes this template has no container-disk containers to render.
    let legacy = TemplateConfig {
        image_volume: false,
        ..config()
    };
    assert!(matches!(
        render_launcher_pod(&vmi, &legacy, &RenderContext::default()),
        Err(TemplateError::Unsupported(_))
    ));
}

/// `WithHugePages`: the guest memory from `hugepages-<size>`, the request keeps the overhead;
/// the hugetlbfs volumes (`withHugepages`).
#[test]
fn hugepages_pod() {
    let vmi = changed(json!({"spec": {"domain": {
        "memory": {"guest": "1Gi", "hugepages": {"pageSize": "2Mi"}},
        "resources": {"requests": {"memory": "1Gi"}},
    }}}));
    let pod = render(&vmi);
    // Overhead: page tables of the 1Gi request (2097152 bytes, decimal) + 268Mi.
    assert_eq!(
        compute(&pod)["resources"]["requests"],
        json!({"cpu": "100m", "memory": "283115520", "hugepages-2Mi": "1Gi", "ephemeral-storage": "50M"})
    );
    assert_eq!(
        compute(&pod)["resources"]["limits"]["hugepages-2Mi"],
        json!("1Gi")
    );
    let volumes = &pod["spec"]["volumes"];
    assert_eq!(
        names(volumes)[6..],
        [
            "containerdisk",
            "launcher-volume",
            "hugepages",
            "hugetblfs-dir",
            "hotplug-disks"
        ]
    );
    assert_eq!(
        volumes[8],
        json!({"name": "hugepages", "emptyDir": {"medium": "HugePages"}})
    );
    let mounts = compute(&pod)["volumeMounts"].as_array().unwrap().clone();
    assert!(mounts.contains(&json!({"name": "hugepages", "mountPath": "/dev/hugepages"})));
    assert!(
        mounts.contains(
            &json!({"name": "hugetblfs-dir", "mountPath": "/dev/hugepages/libvirt/qemu"})
        )
    );

    // A request above the guest size: the rest stays ordinary memory.
    let vmi = changed(json!({"spec": {"domain": {
        "memory": {"guest": "1Gi", "hugepages": {"pageSize": "1Gi"}},
        "resources": {"requests": {"memory": "1536Mi"}},
    }}}));
    let pod = render(&vmi);
    let requests = &compute(&pod)["resources"]["requests"];
    assert_eq!(requests["hugepages-1Gi"], json!("1Gi"));
    // 512Mi + page tables of 1536Mi (3145728 bytes) + 268Mi.
    assert_eq!(requests["memory"], json!("783Mi"));
}

/// `WithReadinessProbe`/`WithLivelinessProbe`: defaults, the libvirt delay, exec and
/// guest-agent probes through `virt-probe`.
#[test]
fn probes_on_the_compute_container() {
    let vmi = changed(json!({"spec": {
        "readinessProbe": {"tcpSocket": {"port": 1500}, "initialDelaySeconds": 120, "periodSeconds": 20},
        "livenessProbe": {"exec": {"command": ["cat", "/tmp/healthy"]}, "timeoutSeconds": 2},
    }}));
    let pod = render(&vmi);
    assert_eq!(
        compute(&pod)["readinessProbe"],
        json!({"tcpSocket": {"port": 1500}, "initialDelaySeconds": 130, "timeoutSeconds": 1,
               "periodSeconds": 20, "successThreshold": 1, "failureThreshold": 3})
    );
    assert_eq!(
        compute(&pod)["livenessProbe"],
        json!({"exec": {"command": ["virt-probe", "--domainName", "default_vmi-migratable",
                                    "--timeoutSeconds", "2", "--command", "cat", "--", "/tmp/healthy"]},
               "initialDelaySeconds": 10, "timeoutSeconds": 3, "periodSeconds": 10,
               "successThreshold": 1, "failureThreshold": 3})
    );
    let vmi = changed(json!({"spec": {"readinessProbe": {"guestAgentPing": {}, "httpGet": null}}}));
    assert_eq!(
        compute(&render(&vmi))["readinessProbe"],
        json!({"exec": {"command": ["virt-probe", "--domainName", "default_vmi-migratable",
                                    "--timeoutSeconds", "1", "--guestAgentPing"]},
               "initialDelaySeconds": 10, "timeoutSeconds": 2, "periodSeconds": 10,
               "successThreshold": 1, "failureThreshold": 3})
    );
}

/// `withVMIConfigVolumes`: every config map, secret and downward API volume is a pod volume,
/// mounted read-only (in disk order) where KubeVirt's launcher builds their ISOs from.
#[test]
fn config_map_secret_and_downward_api_volumes() {
    let vmi = changed(json!({"spec": {
        "domain": {"devices": {"disks": [
            {"name": "containerdisk", "disk": {"bus": "virtio"}},
            {"name": "app-config", "disk": {}},
            {"name": "labels", "disk": {}},
        ]}},
        "volumes": [
            {"name": "containerdisk", "containerDisk": {"image": "registry:5000/disk:devel"}},
            {"name": "app-config", "configMap": {"name": "app", "optional": true}},
            {"name": "token", "secret": {"secretName": "s"}},
            {"name": "labels", "downwardAPI": {"fields": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
        ],
    }}));
    let pod = render(&vmi);
    let volumes = &pod["spec"]["volumes"];
    assert_eq!(
        names(volumes)[6..10],
        ["app-config", "token", "labels", "containerdisk"]
    );
    assert_eq!(
        volumes[6],
        json!({"name": "app-config", "configMap": {"name": "app", "optional": true}})
    );
    assert_eq!(
        volumes[7],
        json!({"name": "token", "secret": {"secretName": "s"}})
    );
    assert_eq!(
        volumes[8],
        json!({"name": "labels", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}})
    );
    let mounts = &compute(&pod)["volumeMounts"];
    assert_eq!(
        mounts[5],
        json!({"name": "app-config", "mountPath": "/var/run/kubevirt-private/config-map/app-config", "readOnly": true})
    );
    assert_eq!(
        mounts[6],
        json!({"name": "labels", "mountPath": "/var/run/kubevirt-private/downwardapi/labels", "readOnly": true})
    );
    // The webhook gives the secret a disk (every volume gets one), so it is mounted too.
    assert_eq!(
        mounts[7],
        json!({"name": "token", "mountPath": "/var/run/kubevirt-private/secret/token", "readOnly": true})
    );
}

/// `handleDataVolume`: the PVC the DataVolume populated, named like it; hotpluggable
/// volumes are not the pod's.
#[test]
fn data_volumes_are_their_pvcs() {
    let vmi = changed(json!({"spec": {
        "volumes": [
            {"name": "containerdisk", "containerDisk": {"image": "registry:5000/disk:devel"}},
            {"name": "root", "dataVolume": {"name": "fedora-dv"}},
            {"name": "later", "dataVolume": {"name": "hot-dv", "hotpluggable": true}},
        ],
    }}));
    assert_eq!(
        render_launcher_pod(&vmi, &config(), &RenderContext::default()).unwrap_err(),
        TemplateError::PvcNotFound("fedora-dv".into())
    );
    let context = RenderContext {
        pvcs: [("fedora-dv".to_string(), PvcInfo { block: true })].into(),
        ..Default::default()
    };
    let pod =
        serde_json::to_value(render_launcher_pod(&vmi, &config(), &context).unwrap()).unwrap();
    assert!(
        pod["spec"]["volumes"].as_array().unwrap().contains(
            &json!({"name": "root", "persistentVolumeClaim": {"claimName": "fedora-dv"}})
        )
    );
    assert!(!names(&pod["spec"]["volumes"]).contains(&"later".to_string()));
    assert_eq!(
        compute(&pod)["volumeDevices"],
        json!([{"name": "root", "devicePath": "/dev/root"}])
    );
    assert_eq!(
        vmi.spec
            .volumes
            .iter()
            .filter_map(claim_name)
            .collect::<Vec<_>>(),
        ["fedora-dv", "hot-dv"]
    );
}

/// `withAccessCredentials`: the secret at `secret/<name>-access-cred`, where the launcher
/// reads the SSH keys it writes into the cloud-init disk.
#[test]
fn access_credential_secrets_are_mounted() {
    let vmi = changed(json!({"spec": {"accessCredentials": [
        {"sshPublicKey": {"source": {"secret": {"secretName": "my-keys"}},
                          "propagationMethod": {"noCloud": {}}}},
        {"userPassword": {"source": {"secret": {"secretName": "my-password"}},
                          "propagationMethod": {"qemuGuestAgent": {}}}},
    ]}}));
    let pod = render(&vmi);
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    let mounts = compute(&pod)["volumeMounts"].as_array().unwrap();
    for secret in ["my-keys", "my-password"] {
        let name = format!("{secret}-access-cred");
        assert!(volumes.contains(&json!({"name": name, "secret": {"secretName": secret}})));
        assert!(mounts.contains(&json!({"name": name,
            "mountPath": format!("/var/run/kubevirt-private/secret/{name}"), "readOnly": true})));
    }
}

/// `nodeselectorrenderer.go` and `setNodeAffinityForbiddenFeaturePolicy`: required features
/// select nodes that have them, forbidden ones keep the pod off nodes that have them (in every
/// term of the VMI's own affinity); realtime and SEV select their nodes, SEV asks for its
/// device.
#[test]
fn cpu_features_realtime_and_sev_scheduling() {
    let vmi = changed(json!({"spec": {
        "domain": {"cpu": {"features": [
            {"name": "vmx"}, {"name": "pcid", "policy": "require"},
            {"name": "avx", "policy": "optional"}, {"name": "svm", "policy": "forbid"},
        ]}},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
            ]}}},
    }}));
    let pod = render(&vmi);
    assert_eq!(
        pod["spec"]["nodeSelector"],
        json!({
            "kubernetes.io/arch": "amd64",
            "kubevirt.io/schedulable": "true",
            "machine-type.node.kubevirt.io/q35": "true",
            "cpu-feature.node.kubevirt.io/vmx": "true",
            "cpu-feature.node.kubevirt.io/pcid": "true",
        })
    );
    let rejected = |zone: &str| {
        json!({"matchExpressions": [
            {"key": "zone", "operator": "In", "values": [zone]},
            {"key": "node-labeller.kubevirt.io/obsolete-host-model", "operator": "DoesNotExist"},
            {"key": "cpu-feature.node.kubevirt.io/svm", "operator": "DoesNotExist"},
        ]})
    };
    assert_eq!(
        pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"],
        json!([rejected("a"), rejected("b")])
    );

    let vmi = changed(json!({"spec": {"domain": {
        "cpu": {"cores": 2, "dedicatedCpuPlacement": true, "realtime": {}},
        "launchSecurity": {"sev": {"policy": {"encryptedState": true}}},
    }}}));
    let pod = render(&vmi);
    let selector = &pod["spec"]["nodeSelector"];
    for label in [
        "kubevirt.io/cpumanager",
        "kubevirt.io/realtime",
        "kubevirt.io/sev",
        "kubevirt.io/sev-es",
    ] {
        assert_eq!(selector[label], json!("true"), "{label}");
    }
    let resources = &compute(&pod)["resources"];
    assert_eq!(resources["limits"]["devices.kubevirt.io/sev"], json!("1"));
    assert_eq!(resources["requests"]["devices.kubevirt.io/sev"], json!("1"));
}

/// arm64: the AAVMF firmware path, the architecture and `virt` machine selectors, and the
/// webhook's host-passthrough model (so no obsolete-host-model affinity).
#[test]
fn arm64_pod() {
    let vmi = changed(json!({"spec": {"architecture": "arm64"}}));
    let pod = render(&vmi);
    let command = compute(&pod)["command"].as_array().unwrap().clone();
    assert!(
        command
            .windows(2)
            .any(|w| w == [json!("--ovmf-path"), json!("/usr/share/AAVMF")])
    );
    assert_eq!(
        pod["spec"]["nodeSelector"]["kubernetes.io/arch"],
        json!("arm64")
    );
    assert_eq!(
        pod["spec"]["nodeSelector"]["machine-type.node.kubevirt.io/virt"],
        json!("true")
    );
    assert!(
        pod["spec"].get("affinity").is_none(),
        "{}",
        pod["spec"]["affinity"]
    );
    // Two 64 MiB pflash devices: 268 + 128 MiB.
    assert_eq!(
        pod["metadata"]["annotations"]["kubevirt.io/memory-overhead-bytes"],
        json!(((268u64 + 128) << 20).to_string())
    );
}

/// Istio: the injection annotation becomes a label, and a proxy needs the service-account token.
#[test]
fn istio_injection() {
    let vmi = changed(json!({"metadata": {"annotations": {"sidecar.istio.io/inject": "True"}}}));
    let pod = render(&vmi);
    assert_eq!(
        pod["metadata"]["labels"]["sidecar.istio.io/inject"],
        json!("True")
    );
    assert_eq!(pod["spec"]["automountServiceAccountToken"], json!(true));
    let vmi = changed(json!({"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}}));
    let pod = render(&vmi);
    assert_eq!(
        pod["metadata"]["labels"]["sidecar.istio.io/inject"],
        json!("false")
    );
    assert_eq!(pod["spec"]["automountServiceAccountToken"], json!(false));
    // No masquerade, no bridge annotations.
    let vmi = changed(
        json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}}}),
    );
    let annotations = &render(&vmi)["metadata"]["annotations"];
    assert!(
        annotations
            .get("istio.io/reroute-virtual-interfaces")
            .is_none()
    );
    assert!(
        annotations
            .get("traffic.sidecar.istio.io/kubevirtInterfaces")
            .is_none()
    );
}

/// `checkForKeepLauncherAfterFailure`: any key with the prefix, an empty value or one that
/// starts with `true`.
#[test]
fn keep_launcher_alive_after_failure() {
    for (key, value, kept) in [
        ("kubevirt.io/keep-launcher-alive-after-failure", "", true),
        (
            "kubevirt.io/keep-launcher-alive-after-failure",
            "true",
            true,
        ),
        (
            "kubevirt.io/keep-launcher-alive-after-failure-x",
            "trueish",
            true,
        ),
        (
            "kubevirt.io/keep-launcher-alive-after-failure",
            "false",
            false,
        ),
        (
            "kubevirt.io/keep-launcher-alive-after-failure",
            "True",
            false,
        ),
    ] {
        let vmi = changed(json!({"metadata": {"annotations": {key: value}}}));
        let command = compute(&render(&vmi))["command"].clone();
        assert_eq!(
            command
                .as_array()
                .unwrap()
                .contains(&json!("--keep-after-failure")),
            kept,
            "{key}={value:?}"
        );
    }
}

/// `handleDownwardMetrics` and `handleSysprep`.
#[test]
fn downward_metrics_and_sysprep_volumes() {
    let vmi = changed(json!({"spec": {"volumes": [
        {"name": "containerdisk", "containerDisk": {"image": "registry:5000/disk:devel"}},
        {"name": "metrics", "downwardMetrics": {}},
        {"name": "unattend", "sysprep": {"configMap": {"name": "answers"}}},
    ]}}));
    let pod = render(&vmi);
    let volumes = pod["spec"]["volumes"].as_array().unwrap();
    assert!(volumes.contains(
        &json!({"name": "metrics", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}})
    ));
    assert!(volumes.contains(&json!({"name": "unattend", "configMap": {"name": "answers"}})));
    let mounts = compute(&pod)["volumeMounts"].as_array().unwrap();
    assert!(mounts.contains(
        &json!({"name": "metrics", "mountPath": "/var/run/kubevirt-private/downwardmetric-disk"})
    ));
    assert!(mounts.contains(
        &json!({"name": "unattend", "mountPath": "/var/run/kubevirt-private/sysprep/unattend", "readOnly": true})
    ));
}

/// The gates that are launcher flags (`template.go`: in this order, after
/// `--upgrade-ordinal-ifaces`), and the beta ones turned off in the KubeVirt CR.
#[test]
fn launcher_flags_follow_the_feature_gates() {
    let command = |config: &TemplateConfig| -> Vec<String> {
        let pod =
            render_launcher_pod(&migratable(), config, &RenderContext::default()).expect("renders");
        serde_json::from_value(
            serde_json::to_value(pod).unwrap()["spec"]["containers"][0]["command"].clone(),
        )
        .unwrap()
    };
    let flags = [
        "--image-volume",
        "--libvirt-hook-server-and-client",
        "--upgrade-ordinal-ifaces",
        "--vgpu-dedicated-hook",
        "--vm-stats-collector",
        "--firmware-auto-selection",
    ];
    let present = |command: &[String]| -> Vec<&str> {
        flags
            .iter()
            .copied()
            .filter(|f| command.iter().any(|c| c == f))
            .collect()
    };
    assert_eq!(present(&command(&config())), &flags[..3]);
    let all = TemplateConfig {
        feature_gates: proto::contract::feature_gates::FeatureGates::parse(
            "VGPULiveMigration,VMStatsCollector,FirmwareAutoSelection",
        ),
        ..config()
    };
    let rendered = command(&all);
    assert_eq!(present(&rendered), flags);
    let at = |flag: &str| rendered.iter().position(|c| c == flag).unwrap();
    assert!(at("--upgrade-ordinal-ifaces") < at("--vgpu-dedicated-hook"));
    assert!(at("--vgpu-dedicated-hook") < at("--vm-stats-collector"));
    assert!(at("--vm-stats-collector") < at("--firmware-auto-selection"));
}

/// `computePodSecurityContext` with the KubeVirt CR's
/// `seccompConfiguration.virtualMachineInstanceProfile.customProfile`: the pod's profile
/// (the containers' security contexts keep none), for non-root and root pods; without the
/// setting, no profile (the default pods of `tests.rs`).
#[test]
fn seccomp_profile_from_the_kubevirt_cr() {
    let vmi = migratable();
    for (profile, rendered) in [
        (
            VmiSeccompProfile::RuntimeDefault,
            json!({"type": "RuntimeDefault"}),
        ),
        (
            VmiSeccompProfile::Localhost("kubevirt/kubevirt.json".into()),
            json!({"type": "Localhost", "localhostProfile": "kubevirt/kubevirt.json"}),
        ),
    ] {
        for root in [false, true] {
            let with = TemplateConfig {
                vmi_seccomp_profile: Some(profile.clone()),
                root,
                ..config()
            };
            let mut vmi = vmi.clone();
            if root {
                vmi.status.get_or_insert_with(Default::default).runtime_user = Some(0);
            }
            let pod = render_launcher_pod(&vmi, &with, &RenderContext::default()).unwrap();
            let pod = serde_json::to_value(pod).unwrap();
            let expected = if root {
                json!({"fsGroup": 107, "runAsUser": 0, "seccompProfile": rendered})
            } else {
                json!({"fsGroup": 107, "runAsUser": 107, "runAsGroup": 107,
                       "runAsNonRoot": true, "seccompProfile": rendered})
            };
            assert_eq!(
                pod["spec"]["securityContext"], expected,
                "{profile:?}, root {root}"
            );
            for container in pod["spec"]["containers"].as_array().unwrap() {
                assert!(
                    container["securityContext"].get("seccompProfile").is_none(),
                    "{}",
                    container["name"]
                );
            }
        }
    }
    let pod = render(&vmi);
    assert!(
        pod["spec"]["securityContext"]
            .get("seccompProfile")
            .is_none()
    );
}
