//! The virt-launcher pod for a VMI, as KubeVirt v1.9.0's template service renders it
//! (`pkg/virt-controller/services/{template,rendercontainer,rendervolumes,renderresources}.go`).
//!
//! Pure functions: the VMI, the cluster settings and what the caller looked up (PVCs, a random
//! jitter) go in, a `Pod` comes out. The pod is KubeVirt's even for VMIs this project's
//! launcher will not run (the controller refuses those before it renders, with
//! `proto::contract::runnable`). Parts of the API whose pod this template cannot render
//! (multus networks, GPUs and host devices, hook sidecars, virtiofs, plugin bindings) are
//! refused with [`TemplateError::Unsupported`] rather than rendered wrongly.

mod overhead;
mod probes;
mod resources;
mod scheduling;
mod volumes;

pub(crate) use overhead::memory_overhead;
pub use overhead::{OVERHEAD_MODEL_ANNOTATION, OverheadModel};
pub use volumes::PvcInfo;
pub(crate) use volumes::claim_name;

use crate::quantity::Qty;
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, EnvVarSource, ObjectFieldSelector, Pod,
    PodReadinessGate, PodSecurityContext, PodSpec, SeccompProfile, SecurityContext,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use overhead::Side;
use proto::contract::feature_gates;
use proto::kubevirt::well_known::{
    APP_LABEL, APP_LABEL_LAUNCHER, CREATED_BY_LABEL, DOMAIN_ANNOTATION, NON_ROOT_UID,
    VM_NAME_LABEL, VMI_ID_LABEL,
};
use proto::kubevirt::{ResourceRequirements, VirtualMachineInstance};
use std::collections::BTreeMap;

/// Launcher binary inside the launcher image (ours lives at the same path).
pub(crate) const LAUNCHER_MONITOR: &str = "/usr/bin/virt-launcher-monitor";
/// The compute container's name; KubeVirt keeps it first in the list.
pub(crate) const COMPUTE_CONTAINER: &str = "compute";
/// Readiness gate the controller flips when the VM is paused or unpaused.
pub(crate) const UNPAUSED_READINESS_GATE: &str = "kubevirt.io/virtual-machine-unpaused";
/// `--qemu-timeout` jitter range: the flag is `base + rand[0, 120)` seconds.
pub(crate) const QEMU_TIMEOUT_JITTER_RANGE: u32 = 120;
/// Seconds added to the VMI grace period for the launcher, and again for the pod.
pub(crate) const GRACE_PERIOD_PADDING_SECONDS: i64 = 15;
/// Ephemeral storage added to every launcher pod's request.
pub(crate) const EPHEMERAL_STORAGE_OVERHEAD: &str = "50M";

const VIRT_PRIVATE_DIR: &str = "/var/run/kubevirt-private";
const CONTAINER_BINARY_DIR: &str = "/container-disk-binary";
const LAUNCHER_VOLUME: &str = "launcher-volume";
const SKIP_BACKUP_HOOKS_ANNOTATION: &str = "kubevirt.io/skip-backup-hooks";
/// The launcher pod's memory overhead in bytes (`v1.MemoryOverheadAnnotationBytes`).
pub(crate) const MEMORY_OVERHEAD_ANNOTATION: &str = "kubevirt.io/memory-overhead-bytes";
/// Istio sidecar injection: an annotation on the VMI, copied to a label on the pod.
const ISTIO_INJECT: &str = "sidecar.istio.io/inject";
/// Istio's annotations naming the in-pod bridge whose traffic the sidecar leaves alone
/// (`pkg/network/istio`; the first is deprecated in favour of the second, both are set).
const ISTIO_KUBEVIRT_INTERFACES: &str = "traffic.sidecar.istio.io/kubevirtInterfaces";
const ISTIO_REROUTE_VIRTUAL_INTERFACES: &str = "istio.io/reroute-virtual-interfaces";
const LOG_VERBOSITY_LABEL: &str = "logVerbosity";
const DEBUG_LOGS_LABEL: &str = "debugLogs";
const DEFAULT_LAUNCHER_LOG_VERBOSITY: u32 = 2;
/// Verbosity above which libvirt debug logs are switched on.
const EXT_LOG_VERBOSITY_THRESHOLD: u32 = 5;

/// Why a launcher pod could not be rendered.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TemplateError {
    #[error("VMI has no {0}")]
    Missing(&'static str),
    #[error("invalid VMI field {0}")]
    Invalid(String),
    #[error("{0} is not supported by this controller")]
    Unsupported(String),
    #[error("didn't find PVC {0}")]
    PvcNotFound(String),
}

/// Cluster-wide settings the template depends on (KubeVirt's CR and virt-controller flags),
/// with v1.9.0's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateConfig {
    pub launcher_image: String,
    pub image_pull_policy: String,
    /// `--launcher-qemu-timeout` of virt-controller, in seconds.
    pub launcher_qemu_timeout_seconds: u32,
    pub virt_share_dir: String,
    pub ephemeral_disk_dir: String,
    pub container_disk_dir: String,
    pub hotplug_disk_dir: String,
    /// `--ovmf-path` per architecture (`ArchitectureConfiguration.{amd64,arm64,s390x}.ovmfPath`).
    pub ovmf_path: String,
    pub ovmf_path_arm64: String,
    pub ovmf_path_s390x: String,
    pub disk_memory_limit_bytes: u64,
    pub hypervisor: String,
    pub allow_emulation: bool,
    /// Request `devices.kubevirt.io/vhost-net` for virtio NICs (KubeVirt always does, unless
    /// emulation is allowed). This project's launcher runs virtio-net in userspace on the
    /// tap, as libvirt falls back to without `/dev/vhost-net`, and never opens the device:
    /// off (`virt-controller --no-vhost-net`), pods also schedule on nodes whose kernel has
    /// no vhost-net, where the handler advertises only unhealthy devices.
    pub request_vhost_net: bool,
    /// Beta feature gates, on unless disabled in the KubeVirt CR.
    pub image_volume: bool,
    pub libvirt_hook_server_and_client: bool,
    pub upgrade_ordinal_ifaces: bool,
    /// `VmiMemoryOverheadReport` (beta): the overhead as a pod annotation and in the VMI's
    /// `status.memory.memoryOverhead`.
    pub memory_overhead_report: bool,
    /// The `Root` feature gate (alpha, off): launcher pods run as root.
    pub root: bool,
    /// `cpuModel` of the KubeVirt CR: the model of VMIs that name none (amd64).
    pub cpu_model: Option<String>,
    pub cpu_allocation_ratio: u32,
    /// Percent; 100 means no overcommit.
    pub memory_overcommit: u32,
    pub serial_console_log_disabled: bool,
    pub virt_launcher_log_verbosity: u32,
    /// Feature gates that decide what a VMI may ask for (`proto::contract::feature_gates`).
    pub feature_gates: proto::contract::feature_gates::FeatureGates,
    /// Node selectors from the KubeVirt CR, applied before the VMI's own.
    pub node_selectors: BTreeMap<String, String>,
    /// Architecture of the cluster's nodes when the VMI does not say (`amd64`).
    pub default_architecture: String,
    /// Binding of the default pod interface: `bridge` (KubeVirt's default) or `masquerade`.
    pub default_network_interface: String,
    /// `evictionStrategy`: what the webhook stores in VMIs that name none (`None`).
    pub eviction_strategy: Option<String>,
    /// `additionalGuestMemoryOverheadRatio`: the memory overhead is multiplied by it (≥ 1).
    pub additional_guest_memory_overhead_ratio: Option<f64>,
    /// `cpuRequest`: the CPU request the webhook gives VMIs without one, unless it is
    /// KubeVirt's default (`100m`, which changes nothing).
    pub cpu_request: Option<proto::kubevirt::Quantity>,
    /// `migrations`: KubeVirt's `MigrationConfiguration` (camelCase keys), its defaults
    /// with the CR's fields laid over them; copied into a migrating VMI's
    /// `status.migrationState.migrationConfiguration`.
    pub migrations: serde_json::Value,
    /// Which estimate sizes the compute container's memory overhead and the console
    /// sidecar's request: KubeVirt's (the default here, as in v1.9.0) or this launcher's
    /// (as deployed: virt-controller's `--memory-overhead`, the CR's annotation).
    pub memory_overhead_model: OverheadModel,
    /// The launcher pod's seccomp profile (`seccompConfiguration.virtualMachineInstanceProfile`
    /// of the KubeVirt CR); none unless configured, as in KubeVirt.
    pub vmi_seccomp_profile: Option<VmiSeccompProfile>,
}

/// `seccompConfiguration.virtualMachineInstanceProfile.customProfile` of the KubeVirt CR,
/// which v1.9.0's template service renders as the pod's `securityContext.seccompProfile`
/// (virt-operator's admission refuses a profile with both set).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmiSeccompProfile {
    /// `runtimeDefaultProfile: true`: the container runtime's default profile.
    RuntimeDefault,
    /// `localhostProfile`: a profile file on the node, relative to the kubelet's seccomp
    /// directory (KubeVirt's handler installs `kubevirt/kubevirt.json` there with the
    /// `KubevirtSeccompProfile` gate).
    Localhost(String),
}

impl VmiSeccompProfile {
    fn to_pod(&self) -> SeccompProfile {
        match self {
            VmiSeccompProfile::RuntimeDefault => SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            },
            VmiSeccompProfile::Localhost(path) => SeccompProfile {
                type_: "Localhost".into(),
                localhost_profile: Some(path.clone()),
            },
        }
    }
}

impl Default for TemplateConfig {
    fn default() -> Self {
        Self {
            launcher_image: "virt-launcher".into(),
            image_pull_policy: "IfNotPresent".into(),
            launcher_qemu_timeout_seconds: 240,
            virt_share_dir: "/var/run/kubevirt".into(),
            ephemeral_disk_dir: "/var/run/kubevirt-ephemeral-disks".into(),
            container_disk_dir: "/var/run/kubevirt/container-disks".into(),
            hotplug_disk_dir: "/var/run/kubevirt/hotplug-disks".into(),
            ovmf_path: "/usr/share/edk2/ovmf".into(),
            ovmf_path_arm64: "/usr/share/AAVMF".into(),
            ovmf_path_s390x: String::new(),
            disk_memory_limit_bytes: 2000 * 1024 * 1024,
            hypervisor: "kvm".into(),
            allow_emulation: false,
            request_vhost_net: true,
            image_volume: true,
            libvirt_hook_server_and_client: true,
            upgrade_ordinal_ifaces: true,
            memory_overhead_report: true,
            root: false,
            feature_gates: Default::default(),
            cpu_model: None,
            cpu_allocation_ratio: 10,
            memory_overcommit: 100,
            serial_console_log_disabled: false,
            virt_launcher_log_verbosity: DEFAULT_LAUNCHER_LOG_VERBOSITY,
            node_selectors: BTreeMap::new(),
            default_architecture: "amd64".into(),
            default_network_interface: "bridge".into(),
            eviction_strategy: Some("None".into()),
            additional_guest_memory_overhead_ratio: None,
            cpu_request: None,
            vmi_seccomp_profile: None,
            migrations: default_migrations(),
            memory_overhead_model: OverheadModel::KubeVirt,
        }
    }
}

/// KubeVirt v1.9.0's default `MigrationConfiguration` (`pkg/virt-config/configuration.go`).
pub fn default_migrations() -> serde_json::Value {
    serde_json::json!({
        "parallelMigrationsPerCluster": 5,
        "parallelOutboundMigrationsPerNode": 2,
        "nodeDrainTaintKey": "kubevirt.io/drain",
        "bandwidthPerMigration": "0Mi",
        "progressTimeout": 150,
        "completionTimeoutPerGiB": 150,
        "maxDowntimeMs": 900,
        "utilityVolumesTimeout": 150,
        "unsafeMigrationOverride": false,
        "allowAutoConverge": false,
        "allowPostCopy": false,
    })
}

/// Inputs that are not part of the VMI: what the caller looked up or drew.
#[derive(Debug, Clone, Default)]
pub struct RenderContext {
    /// PVCs of the VMI's namespace by claim name.
    pub pvcs: BTreeMap<String, PvcInfo>,
    /// Added to the base `--qemu-timeout`; KubeVirt draws it from `[0, 120)`.
    pub qemu_timeout_jitter_seconds: u32,
}

impl TemplateConfig {
    /// `GetOVMFPath`: the firmware directory for the VMI's architecture.
    pub(crate) fn ovmf_path_for(&self, arch: &str) -> &str {
        match arch {
            "arm64" => &self.ovmf_path_arm64,
            "s390x" => &self.ovmf_path_s390x,
            _ => &self.ovmf_path,
        }
    }
}

/// The user the launcher runs as, as KubeVirt's admission webhook decides it
/// (`vmi-mutator.go`: `markAsNonroot` unless the Root feature gate is on).
///
/// Never taken from the object alone: on KubeVirt's own CRD (no status subresource) whoever
/// creates a VMI can write its status, `runtimeUser: 0` included. Without the Root gate the
/// webhook overwrites it with 107, and so does this. With the gate, the webhook keeps what the
/// creator wrote (0 when unset), and so does this.
pub fn runtime_user(vmi: &VirtualMachineInstance, config: &TemplateConfig) -> u64 {
    if !config.root {
        return NON_ROOT_UID.into();
    }
    vmi.status
        .as_ref()
        .and_then(|s| s.runtime_user)
        .unwrap_or(0)
}

/// Renders the launcher pod of `vmi`.
pub fn render_launcher_pod(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    context: &RenderContext,
) -> Result<Pod, TemplateError> {
    let name = vmi
        .metadata
        .name
        .as_deref()
        .ok_or(TemplateError::Missing("name"))?;
    let namespace = vmi
        .metadata
        .namespace
        .as_deref()
        .ok_or(TemplateError::Missing("namespace"))?;
    let uid = vmi
        .metadata
        .uid
        .as_deref()
        .ok_or(TemplateError::Missing("uid"))?;
    let user = runtime_user(vmi, config);
    // Render what KubeVirt renders: from the VMI as its API webhook would have stored it.
    let mut defaulted = vmi.clone();
    crate::defaults::apply_vmi(&mut defaulted, config);
    let vmi = &defaulted;
    refuse_unsupported(vmi)?;

    let non_root = user != 0;
    let user_id = i64::try_from(user)
        .map_err(|_| TemplateError::Invalid(format!("status.runtimeUser {user}")))?;
    let launcher_grace = vmi.grace_period_seconds() + GRACE_PERIOD_PADDING_SECONDS;
    let pod_grace = launcher_grace + GRACE_PERIOD_PADDING_SECONDS;

    let arch = vmi
        .spec
        .architecture
        .clone()
        .unwrap_or_else(|| config.default_architecture.clone());
    let overhead = memory_overhead(
        vmi,
        &arch,
        config.memory_overhead_model,
        config.additional_guest_memory_overhead_ratio,
    )?;
    let resources = resources::render(vmi, config, overhead)?;
    let volumes = volumes::render(vmi, config, context)?;

    let command = launcher_command(
        vmi,
        config,
        context,
        &arch,
        non_root,
        [name, uid, namespace],
        launcher_grace,
    );
    let mut env = Vec::new();
    if non_root {
        for (key, value) in [
            ("XDG_CACHE_HOME", VIRT_PRIVATE_DIR),
            ("XDG_CONFIG_HOME", VIRT_PRIVATE_DIR),
            ("XDG_RUNTIME_DIR", "/var/run"),
        ] {
            env.push(env_var(key, value));
        }
    }
    let labels = vmi.metadata.labels.clone().unwrap_or_default();
    let mut verbosity = config.virt_launcher_log_verbosity;
    let label_verbosity = labels.get(LOG_VERBOSITY_LABEL);
    if label_verbosity.is_some() || verbosity != DEFAULT_LAUNCHER_LOG_VERBOSITY {
        let text = match label_verbosity {
            Some(text) => {
                verbosity = text.parse().map_err(|_| {
                    TemplateError::Invalid(format!("label {LOG_VERBOSITY_LABEL}={text:?}"))
                })?;
                text.clone()
            }
            None => verbosity.to_string(),
        };
        env.push(env_var("VIRT_LAUNCHER_LOG_VERBOSITY", &text));
    }
    let debug_label = labels
        .get(DEBUG_LOGS_LABEL)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    if debug_label || verbosity > EXT_LOG_VERBOSITY_THRESHOLD {
        env.push(env_var("LIBVIRT_DEBUG_LOGS", "1"));
    }
    env.push(EnvVar {
        name: "POD_NAME".into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });

    let mut capabilities = Capabilities {
        add: Some(if non_root {
            vec!["NET_BIND_SERVICE".into()]
        } else {
            vec!["NET_BIND_SERVICE".into(), "SYS_NICE".into()]
        }),
        drop: None,
    };
    if non_root {
        capabilities.drop = Some(vec!["ALL".into()]);
    }
    let compute = Container {
        name: COMPUTE_CONTAINER.into(),
        image: Some(config.launcher_image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        security_context: Some(container_security_context(user_id, Some(capabilities))),
        command: Some(command),
        volume_devices: non_empty(volumes.devices),
        volume_mounts: Some(volumes.mounts),
        resources: Some(resources),
        ports: non_empty(container_ports(vmi)),
        env: Some(env),
        liveness_probe: probes::render(vmi, &vmi.spec.liveness_probe, "spec.livenessProbe")?,
        readiness_probe: probes::render(vmi, &vmi.spec.readiness_probe, "spec.readinessProbe")?,
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        ..Default::default()
    };

    let mut init_containers = Vec::new();
    if serial_console_log_enabled(vmi, config) {
        init_containers.push(guest_console_log_container(vmi, config, uid, verbosity)?);
    }
    let kernel_boot = proto::contract::kernel_boot::container(vmi);
    if config.image_volume {
        // One per image volume, to make the kubelet resolve the image's digest (a new pod has
        // no digests to reuse yet, so even a pinned image gets one).
        for volume in &vmi.spec.volumes {
            if let Some(disk) = &volume.container_disk {
                init_containers.push(image_volume_init_container(
                    vmi,
                    &volume.name,
                    &disk.image,
                    disk.image_pull_policy.as_deref(),
                )?);
            }
        }
        if let Some(container) = kernel_boot {
            init_containers.push(image_volume_init_container(
                vmi,
                proto::contract::pod_paths::KERNEL_BOOT_VOLUME,
                &container.image,
                container.image_pull_policy.as_deref(),
            )?);
        }
    } else if volumes.has_container_disks || kernel_boot.is_some() {
        return Err(TemplateError::Unsupported(
            "containerDisks and kernel-boot containers without the ImageVolume feature gate".into(),
        ));
    }

    let host_name = sanitized_hostname(vmi, name);
    let mut pod_labels = labels.clone();
    pod_labels.insert(APP_LABEL.into(), APP_LABEL_LAUNCHER.into());
    pod_labels.insert(CREATED_BY_LABEL.into(), uid.into());
    pod_labels.insert(VM_NAME_LABEL.into(), host_name.clone());
    pod_labels.insert(VMI_ID_LABEL.into(), vmi_id(name));
    let vmi_annotations = vmi.metadata.annotations.clone().unwrap_or_default();
    if let Some(inject) = vmi_annotations.get(ISTIO_INJECT) {
        pod_labels.insert(ISTIO_INJECT.into(), inject.clone());
    }
    let istio_proxy = vmi_annotations
        .get(ISTIO_INJECT)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"));

    let spec = &vmi.spec;
    let affinity = scheduling::affinity(vmi)?;
    let mut annotations = pod_annotations(vmi, name, namespace);
    if config.memory_overhead_report {
        annotations.insert(
            MEMORY_OVERHEAD_ANNOTATION.into(),
            overhead.value().to_string(),
        );
    }

    let service_account_volume = spec
        .volumes
        .iter()
        .find_map(|v| v.service_account.as_ref())
        .and_then(|sa| sa.get("serviceAccountName"))
        .and_then(|n| n.as_str())
        .map(str::to_string);
    let service_account_name = spec
        .extra
        .get("serviceAccountName")
        .and_then(|n| n.as_str())
        .map(str::to_string)
        .or(service_account_volume.clone());

    let pod = Pod {
        metadata: ObjectMeta {
            generate_name: Some(format!("virt-launcher-{name}-")),
            labels: Some(pod_labels),
            annotations: Some(annotations),
            owner_references: Some(vec![vmi_owner_reference(name, uid)]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            hostname: Some(host_name),
            subdomain: spec.subdomain.clone(),
            security_context: Some(pod_security_context(
                non_root,
                config.vmi_seccomp_profile.as_ref(),
            )),
            termination_grace_period_seconds: Some(pod_grace),
            restart_policy: Some("Never".into()),
            containers: vec![compute],
            init_containers: non_empty(init_containers),
            node_selector: Some(scheduling::node_selector(vmi, config)),
            volumes: Some(volumes.volumes),
            image_pull_secrets: non_empty(image_pull_secrets(vmi)),
            dns_config: from_json(&spec.dns_config, "spec.dnsConfig")?,
            dns_policy: spec.dns_policy.clone(),
            readiness_gates: Some(vec![PodReadinessGate {
                condition_type: UNPAUSED_READINESS_GATE.into(),
            }]),
            enable_service_links: Some(false),
            scheduler_name: spec.scheduler_name.clone(),
            tolerations: from_json(&spec.tolerations, "spec.tolerations")?,
            topology_spread_constraints: from_json(
                &spec.extra.get("topologySpreadConstraints").cloned(),
                "spec.topologySpreadConstraints",
            )?,
            priority_class_name: spec.priority_class_name.clone().filter(|p| !p.is_empty()),
            affinity,
            service_account_name,
            automount_service_account_token: Some(service_account_volume.is_some() || istio_proxy),
            ..Default::default()
        }),
        status: None,
    };
    Ok(pod)
}

/// The compute container's command: the monitor and the launcher flags (v1.9.0 puts them all
/// in `command`, with no `args`).
fn launcher_command(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    context: &RenderContext,
    arch: &str,
    non_root: bool,
    [name, uid, namespace]: [&str; 3],
    launcher_grace: i64,
) -> Vec<String> {
    let jitter = context.qemu_timeout_jitter_seconds % QEMU_TIMEOUT_JITTER_RANGE;
    let timeout = config.launcher_qemu_timeout_seconds + jitter;
    let mut command: Vec<String> = [
        LAUNCHER_MONITOR,
        "--qemu-timeout",
        &format!("{timeout}s"),
        "--name",
        name,
        "--uid",
        uid,
        "--namespace",
        namespace,
        "--kubevirt-share-dir",
        &config.virt_share_dir,
        "--ephemeral-disk-dir",
        &config.ephemeral_disk_dir,
        "--container-disk-dir",
        &config.container_disk_dir,
        "--grace-period-seconds",
        &launcher_grace.to_string(),
        "--hook-sidecars",
        "0",
        "--ovmf-path",
        config.ovmf_path_for(arch),
        "--disk-memory-limit",
        &config.disk_memory_limit_bytes.to_string(),
        "--hypervisor",
        &config.hypervisor,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if non_root {
        command.push("--run-as-nonroot".into());
    }
    if config.image_volume {
        command.push("--image-volume".into());
    }
    if config.libvirt_hook_server_and_client {
        command.push("--libvirt-hook-server-and-client".into());
    }
    if config.upgrade_ordinal_ifaces {
        command.push("--upgrade-ordinal-ifaces".into());
    }
    for (gate, flag) in [
        (feature_gates::VGPU_LIVE_MIGRATION, "--vgpu-dedicated-hook"),
        (feature_gates::VM_STATS_COLLECTOR, "--vm-stats-collector"),
        (
            feature_gates::FIRMWARE_AUTO_SELECTION,
            "--firmware-auto-selection",
        ),
    ] {
        if config.feature_gates.enabled(gate) {
            command.push(flag.into());
        }
    }
    let annotations = vmi.metadata.annotations.clone().unwrap_or_default();
    if let Some(filters) = annotations.get("kubevirt.io/libvirt-log-filters") {
        command.push("--libvirt-log-filters".into());
        command.push(filters.clone());
    }
    if config.allow_emulation {
        command.push("--allow-emulation".into());
    }
    // `checkForKeepLauncherAfterFailure`: an empty value or one starting with `true`.
    if annotations.iter().any(|(k, v)| {
        k.starts_with("kubevirt.io/keep-launcher-alive-after-failure")
            && (v.is_empty() || v.starts_with("true"))
    }) {
        command.push("--keep-after-failure".into());
    }
    if annotations.contains_key("kubevirt.io/func-test-virt-launcher-fail-fast") {
        command.push("--simulate-crash".into());
    }
    command
}

fn refuse_unsupported(vmi: &VirtualMachineInstance) -> Result<(), TemplateError> {
    let spec = &vmi.spec;
    let devices = &spec.domain.devices;
    for key in ["gpus", "hostDevices", "filesystems"] {
        if devices.extra.get(key).is_some_and(non_empty_json) {
            return Err(TemplateError::Unsupported(format!(
                "spec.domain.devices.{key}"
            )));
        }
    }
    if spec.networks.iter().any(|n| n.multus.is_some()) {
        return Err(TemplateError::Unsupported("multus networks".into()));
    }
    let annotations = vmi.metadata.annotations.clone().unwrap_or_default();
    if annotations.contains_key("hooks.kubevirt.io/hookSidecars") {
        return Err(TemplateError::Unsupported("hook sidecars".into()));
    }
    for interface in &devices.interfaces {
        if interface.sriov.is_some()
            || interface.binding.is_some()
            || interface.passt_binding.is_some()
        {
            return Err(TemplateError::Unsupported(format!(
                "interface {} binding {}",
                interface.name,
                interface.binding_name().unwrap_or("?")
            )));
        }
    }
    Ok(())
}

fn non_empty_json(value: &serde_json::Value) -> bool {
    match value {
        serde_json::Value::Null => false,
        serde_json::Value::Array(items) => !items.is_empty(),
        _ => true,
    }
}

fn non_empty<T>(items: Vec<T>) -> Option<Vec<T>> {
    (!items.is_empty()).then_some(items)
}

fn from_json<T: serde::de::DeserializeOwned>(
    value: &Option<serde_json::Value>,
    field: &str,
) -> Result<Option<T>, TemplateError> {
    value
        .clone()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| TemplateError::Invalid(format!("{field}: {e}")))
}

fn env_var(name: &str, value: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value: Some(value.into()),
        ..Default::default()
    }
}

/// Container security context (`rendercontainer.go` `securityContext`).
fn container_security_context(user_id: i64, capabilities: Option<Capabilities>) -> SecurityContext {
    let non_root = user_id != 0;
    SecurityContext {
        run_as_user: Some(user_id),
        run_as_non_root: Some(non_root),
        run_as_group: non_root.then_some(user_id),
        allow_privilege_escalation: non_root.then_some(false),
        capabilities,
        ..Default::default()
    }
}

/// Pod security context (`computePodSecurityContext`).
fn pod_security_context(non_root: bool, seccomp: Option<&VmiSeccompProfile>) -> PodSecurityContext {
    let uid = i64::from(NON_ROOT_UID);
    PodSecurityContext {
        fs_group: Some(uid),
        run_as_user: Some(if non_root { uid } else { 0 }),
        run_as_group: non_root.then_some(uid),
        run_as_non_root: non_root.then_some(true),
        seccomp_profile: seccomp.map(VmiSeccompProfile::to_pod),
        ..Default::default()
    }
}

fn support_container_security_context() -> SecurityContext {
    SecurityContext {
        run_as_user: Some(NON_ROOT_UID.into()),
        run_as_non_root: Some(true),
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            add: None,
        }),
        ..Default::default()
    }
}

fn container_ports(vmi: &VirtualMachineInstance) -> Vec<ContainerPort> {
    vmi.spec
        .domain
        .devices
        .interfaces
        .iter()
        .flat_map(|iface| iface.ports.iter())
        .map(|port| ContainerPort {
            container_port: port.port,
            name: port.name.clone().filter(|n| !n.is_empty()),
            protocol: Some(port.protocol.clone().unwrap_or_else(|| "TCP".into())),
            ..Default::default()
        })
        .collect()
}

fn serial_console_log_enabled(vmi: &VirtualMachineInstance, config: &TemplateConfig) -> bool {
    let devices = &vmi.spec.domain.devices;
    if devices.autoattach_serial_console == Some(false) {
        return false;
    }
    devices
        .log_serial_console
        .unwrap_or(!config.serial_console_log_disabled)
}

/// `guest-console-log`: a native sidecar tailing the serial console log.
fn guest_console_log_container(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    uid: &str,
    verbosity: u32,
) -> Result<Container, TemplateError> {
    let guaranteed = is_cpu_dedicated(vmi) || wants_guaranteed_qos(vmi)?;
    let (request_cpu, request_memory) = if guaranteed {
        ("15m", "60M")
    } else if config.memory_overhead_model == OverheadModel::Launcher {
        ("5m", overhead::LAUNCHER_CONSOLE_REQUEST)
    } else {
        ("5m", "35M")
    };
    Ok(Container {
        name: "guest-console-log".into(),
        image: Some(config.launcher_image.clone()),
        image_pull_policy: Some(config.image_pull_policy.clone()),
        command: Some(vec!["/usr/bin/virt-tail".into()]),
        args: Some(vec![
            "--logfile".into(),
            format!("{VIRT_PRIVATE_DIR}/{uid}/virt-serial0-log"),
        ]),
        volume_mounts: Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: "private".into(),
            mount_path: VIRT_PRIVATE_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        resources: Some(resource_requirements(
            &[("cpu", request_cpu), ("memory", request_memory)],
            &[("cpu", "15m"), ("memory", "60M")],
        )),
        security_context: Some(support_container_security_context()),
        restart_policy: Some("Always".into()),
        env: Some(vec![env_var(
            "VIRT_LAUNCHER_LOG_VERBOSITY",
            &verbosity.to_string(),
        )]),
        ..Default::default()
    })
}

/// With the ImageVolume feature gate, a containerDisk is an image volume; this init container
/// only makes the kubelet resolve the image's digest.
fn image_volume_init_container(
    vmi: &VirtualMachineInstance,
    volume: &str,
    image: &str,
    pull_policy: Option<&str>,
) -> Result<Container, TemplateError> {
    let guaranteed = is_cpu_dedicated(vmi) || wants_guaranteed_qos(vmi)?;
    let (request_cpu, request_memory) = if guaranteed {
        ("10m", "40M")
    } else {
        ("1m", "1M")
    };
    Ok(Container {
        name: format!("volume{volume}"),
        image: Some(image.into()),
        image_pull_policy: pull_policy.map(str::to_string),
        command: Some(vec![format!(
            "{CONTAINER_BINARY_DIR}/usr/bin/container-disk"
        )]),
        args: Some(vec!["--no-op".into()]),
        resources: Some(resource_requirements(
            &[
                ("cpu", request_cpu),
                ("memory", request_memory),
                ("ephemeral-storage", EPHEMERAL_STORAGE_OVERHEAD),
            ],
            &[("cpu", "10m"), ("memory", "40M")],
        )),
        security_context: Some(support_container_security_context()),
        volume_mounts: Some(vec![k8s_openapi::api::core::v1::VolumeMount {
            name: LAUNCHER_VOLUME.into(),
            mount_path: CONTAINER_BINARY_DIR.into(),
            read_only: Some(true),
            ..Default::default()
        }]),
        ..Default::default()
    })
}

fn resource_requirements(
    requests: &[(&str, &str)],
    limits: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::ResourceRequirements {
    let map = |items: &[(&str, &str)]| {
        items
            .iter()
            .map(|(k, v)| (k.to_string(), proto::kubevirt::Quantity(v.to_string())))
            .collect::<BTreeMap<_, _>>()
    };
    k8s_openapi::api::core::v1::ResourceRequirements {
        requests: Some(map(requests)),
        limits: Some(map(limits)),
        ..Default::default()
    }
}

/// First DNS label of the VMI name (at most 63 characters), unless `spec.hostname` is set.
pub(crate) fn sanitized_hostname(vmi: &VirtualMachineInstance, name: &str) -> String {
    if let Some(hostname) = vmi.spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        return hostname.to_string();
    }
    let first = name.split('.').next().unwrap_or(name);
    first.chars().take(63).collect()
}

/// `vmi.kubevirt.io/id`: the name, or for names over 63 characters a 54-character prefix,
/// `-` and the first 8 hex digits of the name's SHA-1.
pub(crate) fn vmi_id(name: &str) -> String {
    if name.len() <= 63 {
        return name.to_string();
    }
    let digest = sha1_smol::Sha1::from(name).digest().to_string();
    // Kubernetes names are ASCII, so byte slicing is on character boundaries; fall back to
    // the whole name otherwise rather than panic.
    let prefix = name.get(..54).unwrap_or(name);
    format!("{prefix}-{}", digest.get(..8).unwrap_or(&digest))
}

fn pod_annotations(
    vmi: &VirtualMachineInstance,
    name: &str,
    namespace: &str,
) -> BTreeMap<String, String> {
    let mut annotations = BTreeMap::new();
    annotations.insert(DOMAIN_ANNOTATION.to_string(), name.to_string());
    let vmi_annotations = vmi.metadata.annotations.clone().unwrap_or_default();
    for (key, value) in &vmi_annotations {
        if key.starts_with("kubectl.kubernetes.io")
            || key.starts_with("kubevirt.io/storage-observed-api-version")
            || key.starts_with("kubevirt.io/latest-observed-api-version")
            // The controller's own count of rejected pods is never the VMI's to preset.
            || key == crate::vmi::decide::ADMISSION_ATTEMPT_ANNOTATION
        {
            continue;
        }
        annotations.insert(key.clone(), value.clone());
    }
    annotations.insert(
        "kubectl.kubernetes.io/default-container".into(),
        COMPUTE_CONTAINER.into(),
    );
    annotations.insert("kubevirt.io/migrationTransportUnix".into(), "true".into());
    annotations.insert(
        "descheduler.alpha.kubernetes.io/request-evict-only".into(),
        String::new(),
    );
    // With masquerade the guest sits behind the in-pod bridge: Istio's sidecar must leave
    // its traffic to the guest (`annotations.Generator`, whatever the injection says).
    if vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .any(|i| i.masquerade.is_some())
    {
        let bridge = proto::contract::pod_network::bridge_name(
            proto::contract::pod_network::PRIMARY_POD_IFACE,
        );
        annotations.insert(ISTIO_KUBEVIRT_INTERFACES.into(), bridge.clone());
        annotations.insert(ISTIO_REROUTE_VIRTUAL_INTERFACES.into(), bridge);
    }
    // Velero backup hooks freeze the guest file systems around a backup.
    let skip_hooks = vmi_annotations
        .get(SKIP_BACKUP_HOOKS_ANNOTATION)
        .is_some_and(|v| matches!(v.as_str(), "1" | "t" | "T" | "true" | "TRUE" | "True"));
    if !skip_hooks {
        let freezer = |action: &str| {
            format!(
                "[\"/usr/bin/virt-freezer\", \"--{action}\", \"--name\", {}, \"--namespace\", {}]",
                go_quote(name),
                go_quote(namespace)
            )
        };
        annotations.insert(
            "pre.hook.backup.velero.io/container".into(),
            COMPUTE_CONTAINER.into(),
        );
        annotations.insert(
            "pre.hook.backup.velero.io/command".into(),
            freezer("freeze"),
        );
        annotations.insert("pre.hook.backup.velero.io/timeout".into(), "60s".into());
        annotations.insert(
            "post.hook.backup.velero.io/container".into(),
            COMPUTE_CONTAINER.into(),
        );
        annotations.insert(
            "post.hook.backup.velero.io/command".into(),
            freezer("unfreeze"),
        );
    }
    annotations
}

/// Go's `%q` for the names Kubernetes allows (DNS labels need no escaping beyond quotes).
fn go_quote(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| format!("\"{text}\""))
}

fn vmi_owner_reference(name: &str, uid: &str) -> OwnerReference {
    OwnerReference {
        api_version: "kubevirt.io/v1".into(),
        kind: "VirtualMachineInstance".into(),
        name: name.into(),
        uid: uid.into(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }
}

fn image_pull_secrets(
    vmi: &VirtualMachineInstance,
) -> Vec<k8s_openapi::api::core::v1::LocalObjectReference> {
    let mut names: Vec<String> = Vec::new();
    let mut push = |name: &str| {
        if !name.is_empty() && !names.iter().any(|n| n == name) {
            names.push(name.to_string());
        }
    };
    for volume in &vmi.spec.volumes {
        if let Some(secret) = volume
            .container_disk
            .as_ref()
            .and_then(|d| d.image_pull_secret.as_deref())
        {
            push(secret);
        }
    }
    if let Some(secret) =
        proto::contract::kernel_boot::container(vmi).and_then(|c| c.image_pull_secret.as_deref())
    {
        push(secret);
    }
    names
        .into_iter()
        .map(|name| k8s_openapi::api::core::v1::LocalObjectReference { name })
        .collect()
}

/// vCPUs of the topology: the product of the set fields (`hardware.GetNumberOfVCPUs`).
fn topology_vcpus(cpu: &proto::kubevirt::Cpu) -> u64 {
    let mut vcpus = u64::from(cpu.cores.unwrap_or(0));
    for factor in [cpu.sockets, cpu.threads] {
        let factor = u64::from(factor.unwrap_or(0));
        if factor != 0 {
            vcpus = if vcpus == 0 { factor } else { vcpus * factor };
        }
    }
    vcpus
}

/// vCPUs for the overhead: the topology, else the CPU limit, else the CPU request.
fn vcpus_for_overhead(vmi: &VirtualMachineInstance) -> Result<u64, TemplateError> {
    if let Some(cpu) = &vmi.spec.domain.cpu {
        return Ok(topology_vcpus(cpu));
    }
    let resources = vmi.spec.domain.resources.as_ref();
    let cpu = match resource_qty(resources, Side::Limits, "cpu")? {
        Some(limit) => Some(limit),
        None => resource_qty(resources, Side::Requests, "cpu")?,
    };
    Ok(cpu.map_or(0, |q| u64::try_from(q.value()).unwrap_or(u64::MAX)))
}

/// The guest's memory as the launcher sizes it: `memory.guest`, else the memory request, else
/// the limit; zero if none is set (the launcher refuses such a VMI).
fn guest_memory_bytes(vmi: &VirtualMachineInstance) -> Result<u128, TemplateError> {
    match proto::contract::runnable::guest_memory_source(vmi) {
        Some((field, size)) => Qty::parse(&size)
            .map(|q| q.value())
            .map_err(|e| TemplateError::Invalid(format!("{field}: {e}"))),
        None => Ok(0),
    }
}

/// vCPUs for the CPU request: the topology, 1 without one.
fn vcpus_for_request(vmi: &VirtualMachineInstance) -> u64 {
    vmi.spec.domain.cpu.as_ref().map_or(1, topology_vcpus)
}

fn resource_qty(
    resources: Option<&ResourceRequirements>,
    side: Side,
    name: &str,
) -> Result<Option<Qty>, TemplateError> {
    let map = resources.and_then(|r| match side {
        Side::Requests => r.requests.as_ref(),
        Side::Limits => r.limits.as_ref(),
    });
    map.and_then(|m| m.get(name))
        .map(|q| {
            Qty::parse(q).map_err(|e| {
                TemplateError::Invalid(format!("spec.domain.resources {side:?}.{name}: {e}"))
            })
        })
        .transpose()
}

pub(crate) fn is_cpu_dedicated(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec
        .domain
        .cpu
        .as_ref()
        .is_some_and(|c| c.dedicated_cpu_placement == Some(true))
}

/// `WantsToHaveQOSGuaranteed`: memory request equal to the limit (or only a limit) and a
/// non-zero CPU request equal to the CPU limit.
pub(crate) fn wants_guaranteed_qos(vmi: &VirtualMachineInstance) -> Result<bool, TemplateError> {
    let resources = vmi.spec.domain.resources.as_ref();
    let value = |side, name| -> Result<u128, TemplateError> {
        Ok(resource_qty(resources, side, name)?.map_or(0, |q| q.milli))
    };
    let (request_memory, limit_memory) = (
        value(Side::Requests, "memory")?,
        value(Side::Limits, "memory")?,
    );
    let (request_cpu, limit_cpu) = (value(Side::Requests, "cpu")?, value(Side::Limits, "cpu")?);
    let memory = (request_memory == 0 && limit_memory != 0)
        || (request_memory != 0 && request_memory == limit_memory);
    let cpu = request_cpu != 0 && request_cpu == limit_cpu;
    Ok(memory && cpu)
}

fn has_vfio(vmi: &VirtualMachineInstance) -> bool {
    let devices = &vmi.spec.domain.devices;
    ["gpus", "hostDevices"]
        .iter()
        .any(|key| devices.extra.get(*key).is_some_and(non_empty_json))
}

fn has_sev(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec
        .domain
        .extra
        .get("launchSecurity")
        .and_then(|l| l.as_object())
        .is_some_and(|l| ["sev", "snp"].iter().any(|k| l.contains_key(*k)))
}

fn has_tpm(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec.domain.devices.extra.get("tpm").is_some_and(|tpm| {
        !tpm.is_null() && tpm.get("enabled") != Some(&serde_json::Value::Bool(false))
    })
}

/// Names of the VMI's interfaces that get a virtio NIC (needs `/dev/vhost-net`). With no
/// interface listed and the pod interface auto-attached, the API webhook (absent here) adds
/// the default interface, a virtio one.
fn has_virtio_interface(vmi: &VirtualMachineInstance) -> bool {
    let devices = &vmi.spec.domain.devices;
    if devices.interfaces.is_empty() {
        return devices.autoattach_pod_interface != Some(false);
    }
    devices
        .interfaces
        .iter()
        .any(|i| matches!(i.model.as_deref(), None | Some("") | Some("virtio")))
}

#[cfg(test)]
mod feature_tests;
#[cfg(test)]
mod tests;
