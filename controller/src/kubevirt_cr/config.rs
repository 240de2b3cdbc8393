//! The cluster configuration from the `KubeVirt` CR, as KubeVirt's virt-config reads it
//! (`pkg/virt-config/configuration.go`): the CR's `spec.configuration` laid over the defaults,
//! checked, and kept per generation of the CR; a refused generation leaves the last good
//! configuration in force.
//!
//! The defaults are this controller's command-line flags (KubeVirt has no such flags: v1.9.0's
//! defaults unless a flag says otherwise), so where the CR sets a field, the CR wins.

use crate::template::{
    OVERHEAD_MODEL_ANNOTATION, OverheadModel, TemplateConfig, VmiSeccompProfile,
};
use kube::ResourceExt;
use kube::runtime::reflector::Store;
use proto::contract::feature_gates::{self, FeatureGates};
use proto::kubevirt::{KubeVirt, quantity};
use std::sync::{Arc, Mutex};

/// Why a CR's configuration is not applied: the field and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub field: String,
    pub reason: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}

fn refuse<T>(field: &str, reason: impl Into<String>) -> Result<T, Refusal> {
    Err(Refusal {
        field: field.to_string(),
        reason: reason.into(),
    })
}

/// Gates that would change every launcher pod (or its scheduling) in a way this controller
/// does not render: a CR turning one on is refused rather than half applied.
pub const REFUSED_GATES: &[(&str, &str)] = &[
    (
        "IOMMUFD",
        "every pod would request devices.kubevirt.io/iommufd, which virt-handler here does not serve",
    ),
    (
        "CrossArchitectureVirtualization",
        "cross-architecture scheduling is not rendered",
    ),
    ("Plugins", "the plugin socket volume is not rendered"),
    (
        "HypervStrictCheck",
        "the Hyper-V node selectors are not rendered",
    ),
];

const PULL_POLICIES: &[&str] = &["Always", "Never", "IfNotPresent"];
const EVICTION_STRATEGIES: &[&str] = &["None", "LiveMigrate", "LiveMigrateIfPossible", "External"];

/// The configuration `kv` gives: `base` with every field the CR sets replaced.
///
/// As in KubeVirt, a zero or empty value is the same as no value (the CR goes through Go's
/// `omitempty` before it is laid over the defaults), lists replace and maps add to the
/// defaults.
pub fn build(base: &TemplateConfig, kv: &KubeVirt) -> Result<TemplateConfig, Refusal> {
    let mut config = base.clone();
    if let Some(model) = kv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(OVERHEAD_MODEL_ANNOTATION))
    {
        config.memory_overhead_model = OverheadModel::parse(model).ok_or_else(|| Refusal {
            field: format!("metadata.annotations[{OVERHEAD_MODEL_ANNOTATION}]"),
            reason: format!("invalid value {model:?}: launcher or kubevirt"),
        })?;
    }
    let Some(conf) = kv.spec.configuration.as_ref() else {
        return Ok(config);
    };
    let text = |value: &Option<String>| value.clone().filter(|v| !v.is_empty());

    if let Some(policy) = text(&conf.image_pull_policy) {
        if !PULL_POLICIES.contains(&policy.as_str()) {
            return refuse(
                "spec.configuration.imagePullPolicy",
                format!("invalid value {policy:?}: one of {PULL_POLICIES:?}"),
            );
        }
        config.image_pull_policy = policy;
    }
    if let Some(model) = text(&conf.cpu_model) {
        config.cpu_model = Some(model);
    }
    if let Some(request) = &conf.cpu_request {
        if let Err(e) = quantity::to_milli(request) {
            return refuse("spec.configuration.cpuRequest", e.to_string());
        }
        config.cpu_request = Some(request.clone());
    }

    if let Some(dev) = &conf.developer_configuration {
        let field = |name: &str| format!("spec.configuration.developerConfiguration.{name}");
        if dev.feature_gates.is_some() || dev.disabled_feature_gates.is_some() {
            let enabled = dev
                .feature_gates
                .clone()
                .unwrap_or_else(|| base.feature_gates.listed().map(str::to_string).collect());
            let disabled = dev.disabled_feature_gates.clone().unwrap_or_default();
            let gates = FeatureGates::from_lists(&enabled, &disabled);
            if let Some(both) = gates.contradiction() {
                return refuse(
                    &field("featureGates"),
                    format!(
                        "feature gate \"{both}\" exists on both \"FeatureGates\" and \"DisabledFeatureGates\""
                    ),
                );
            }
            if let Some((gate, why)) = REFUSED_GATES.iter().find(|(g, _)| gates.enabled(g)) {
                return refuse(
                    &field("featureGates"),
                    format!("{gate} is not supported here: {why}"),
                );
            }
            config.root = gates.enabled(feature_gates::ROOT);
            config.image_volume = gates.enabled(feature_gates::IMAGE_VOLUME);
            config.libvirt_hook_server_and_client =
                gates.enabled(feature_gates::LIBVIRT_HOOKS_SERVER_AND_CLIENT);
            config.upgrade_ordinal_ifaces =
                gates.enabled(feature_gates::POD_SECONDARY_INTERFACE_NAMING_UPGRADE);
            config.memory_overhead_report =
                gates.enabled(feature_gates::VMI_MEMORY_OVERHEAD_REPORT);
            config.feature_gates = gates;
        }
        if let Some(percent) = positive(dev.memory_overcommit, &field("memoryOvercommit"))? {
            config.memory_overcommit = percent;
        }
        if let Some(ratio) = positive(dev.cpu_allocation_ratio, &field("cpuAllocationRatio"))? {
            config.cpu_allocation_ratio = ratio;
        }
        if let Some(toleration) = dev.less_pvc_space_toleration
            && !(0..=100).contains(&toleration)
        {
            return refuse(
                &field("pvcTolerateLessSpaceUpToPercent"),
                format!("invalid value {toleration}: 0 to 100"),
            );
        }
        if let Some(selectors) = &dev.node_selectors {
            config.node_selectors.extend(selectors.clone());
        }
        if dev.use_emulation == Some(true) {
            config.allow_emulation = true;
        }
        if let Some(limit) = dev
            .disk_verification
            .as_ref()
            .and_then(|d| d.memory_limit.as_ref())
        {
            let bytes = quantity::to_bytes(limit).map_err(|e| Refusal {
                field: field("diskVerification.memoryLimit"),
                reason: e.to_string(),
            })?;
            if bytes != 0 {
                config.disk_memory_limit_bytes = bytes;
            }
        }
        if let Some(verbosity) = dev
            .log_verbosity
            .as_ref()
            .and_then(|l| l.virt_launcher)
            .filter(|v| *v != 0)
        {
            config.virt_launcher_log_verbosity = verbosity;
        }
    }

    if let Some(network) = &conf.network {
        let field = "spec.configuration.network.defaultNetworkInterface";
        match text(&network.default_network_interface).as_deref() {
            None => {}
            Some(binding @ ("bridge" | "masquerade")) => {
                config.default_network_interface = binding.to_string();
            }
            Some("slirp") => return refuse(field, "slirp interface is deprecated as of v1.3"),
            Some(other) => {
                return refuse(
                    field,
                    format!("invalid default-network-interface in config: {other}"),
                );
            }
        }
        if network.permit_bridge_interface_on_pod_network == Some(false) {
            return refuse(
                "spec.configuration.network.permitBridgeInterfaceOnPodNetwork",
                "false is not enforced by this controller (bridge interfaces on the pod network would still be admitted)",
            );
        }
    }

    if let Some(arch) = &conf.architecture_configuration {
        for (specific, path) in [
            (&arch.amd64, &mut config.ovmf_path),
            (&arch.arm64, &mut config.ovmf_path_arm64),
            (&arch.s390x, &mut config.ovmf_path_s390x),
        ] {
            if let Some(ovmf) = specific.as_ref().and_then(|s| text(&s.ovmf_path)) {
                *path = ovmf;
            }
        }
        if let Some(default) = text(&arch.default_architecture) {
            config.default_architecture = default;
        }
    }
    // The deprecated top-level path wins for every architecture (`GetOVMFPath`).
    if let Some(ovmf) = text(&conf.ovmf_path) {
        config.ovmf_path = ovmf.clone();
        config.ovmf_path_arm64 = ovmf.clone();
        config.ovmf_path_s390x = ovmf;
    }

    // Fields the CR sets win; the handlers read the result (`migrationConfiguration`).
    if let Some(migrations) = conf.extra.get("migrations") {
        let Some(fields) = migrations.as_object() else {
            return refuse("spec.configuration.migrations", "must be an object");
        };
        let merged = config
            .migrations
            .as_object_mut()
            .expect("the defaults are an object");
        for (key, value) in fields.iter().filter(|(_, v)| !v.is_null()) {
            merged.insert(key.clone(), value.clone());
        }
    }
    if let Some(strategy) = text(&conf.eviction_strategy) {
        if !EVICTION_STRATEGIES.contains(&strategy.as_str()) {
            return refuse(
                "spec.configuration.evictionStrategy",
                format!("invalid value {strategy:?}: one of {EVICTION_STRATEGIES:?}"),
            );
        }
        config.eviction_strategy = Some(strategy);
    }
    if let Some(ratio) = &conf.additional_guest_memory_overhead_ratio {
        let field = "spec.configuration.additionalGuestMemoryOverheadRatio";
        let value: f64 = match ratio.trim().parse() {
            Ok(value) => value,
            Err(e) => {
                return refuse(
                    field,
                    format!("ratio provided, {ratio}, cannot be parsed into float: {e}"),
                );
            }
        };
        if !value.is_finite() || value < 1.0 {
            return refuse(
                field,
                format!("ratio provided, {ratio}, cannot be smaller than 1.0"),
            );
        }
        config.additional_guest_memory_overhead_ratio = Some(value);
    }
    if conf
        .virtual_machine_options
        .as_ref()
        .and_then(|o| o.disable_serial_console_log.as_ref())
        .is_some_and(|d| !d.is_null())
    {
        config.serial_console_log_disabled = true;
    }
    if let Some(other) = conf
        .hypervisors
        .iter()
        .flatten()
        .map(|h| h.name.as_str())
        .find(|n| !n.is_empty() && *n != "kvm")
    {
        return refuse(
            "spec.configuration.hypervisors",
            format!("{other:?} is not supported: this launcher runs VMs on KVM only"),
        );
    }
    if let Some(custom) = conf
        .extra
        .get("seccompConfiguration")
        .and_then(|s| s.get("virtualMachineInstanceProfile"))
        .and_then(|p| p.get("customProfile"))
        .filter(|c| !c.is_null())
    {
        config.vmi_seccomp_profile = seccomp_profile(custom)?;
    }
    Ok(config)
}

/// `customProfile`: a node-local profile, else the runtime's default, else none
/// (`template.go`); both at once is refused, as virt-operator's admission does.
fn seccomp_profile(custom: &serde_json::Value) -> Result<Option<VmiSeccompProfile>, Refusal> {
    let field =
        "spec.configuration.seccompConfiguration.virtualMachineInstanceProfile.customProfile";
    let localhost = match custom.get("localhostProfile") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::String(path)) => Some(path.clone()),
        Some(other) => {
            return refuse(
                &format!("{field}.localhostProfile"),
                format!("{other} is not a string"),
            );
        }
    };
    let runtime_default = match custom.get("runtimeDefaultProfile") {
        None | Some(serde_json::Value::Null) => false,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(other) => {
            return refuse(
                &format!("{field}.runtimeDefaultProfile"),
                format!("{other} is not a boolean"),
            );
        }
    };
    match (localhost, runtime_default) {
        (Some(_), true) => refuse(
            &format!("{field}.localhostProfile"),
            format!(
                "{field}.localhostProfile cannot be set when {field}.runtimeDefaultProfile is set"
            ),
        ),
        (Some(path), false) => Ok(Some(VmiSeccompProfile::Localhost(path))),
        (None, true) => Ok(Some(VmiSeccompProfile::RuntimeDefault)),
        (None, false) => Ok(None),
    }
}

/// A count KubeVirt requires to be positive: `None` for zero (no value), refused if negative.
fn positive(value: Option<i64>, field: &str) -> Result<Option<u32>, Refusal> {
    match value {
        None | Some(0) => Ok(None),
        Some(v) if v < 0 => refuse(field, format!("invalid value {v}: must be positive")),
        Some(v) => u32::try_from(v)
            .map(Some)
            .or_else(|_| refuse(field, format!("{v} is too large"))),
    }
}

/// The CR KubeVirt's components take their configuration from, among the namespace's.
///
/// Objects being deleted are left out. One left: that one (KubeVirt waits for its operator to
/// give it a phase; here the leader does that itself, so its configuration counts at once).
/// More than one: the install is the one with a phase (KubeVirt's operator never gives a
/// second CR one); among several, the oldest. None with a phase: none.
pub fn select(kubevirts: &[Arc<KubeVirt>]) -> Option<Arc<KubeVirt>> {
    let mut live: Vec<&Arc<KubeVirt>> = kubevirts
        .iter()
        .filter(|kv| kv.metadata.deletion_timestamp.is_none())
        .collect();
    if live.len() == 1 {
        return live.pop().cloned();
    }
    live.retain(|kv| kv.status.as_ref().is_some_and(|s| !s.phase.is_empty()));
    live.into_iter()
        .min_by_key(|kv| {
            (
                kv.metadata.creation_timestamp.as_ref().map(|t| t.0),
                kv.name_any(),
            )
        })
        .cloned()
}

/// Which CR version the configuration in force came from: its generation, which only a
/// spec change moves (status writes, the leader's own included, do not).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    Defaults,
    Cr { uid: String, generation: i64 },
}

struct State {
    config: Arc<TemplateConfig>,
    source: Source,
    /// The CR version last refused, so it is logged once.
    refused: Option<(Source, Refusal)>,
}

/// The configuration in force, read from the `KubeVirt` CRs of one namespace whenever it is
/// asked for, like KubeVirt's `ClusterConfig.GetConfig`: a CR change takes effect at the next
/// question, without a restart. Without a CR: the defaults.
pub struct ClusterConfig {
    defaults: Arc<TemplateConfig>,
    kubevirts: Option<(String, Store<KubeVirt>)>,
    state: Mutex<State>,
}

impl ClusterConfig {
    /// From the CRs in `store` (the watch of `namespace`) over `defaults`.
    pub fn new(defaults: TemplateConfig, namespace: &str, store: Store<KubeVirt>) -> Self {
        let defaults = Arc::new(defaults);
        ClusterConfig {
            defaults: defaults.clone(),
            kubevirts: Some((namespace.to_string(), store)),
            state: Mutex::new(State {
                config: defaults,
                source: Source::Defaults,
                refused: None,
            }),
        }
    }

    /// Always `config`: no CR is read.
    pub fn fixed(config: TemplateConfig) -> Self {
        let config = Arc::new(config);
        ClusterConfig {
            defaults: config.clone(),
            kubevirts: None,
            state: Mutex::new(State {
                config,
                source: Source::Defaults,
                refused: None,
            }),
        }
    }

    /// The configuration now.
    pub fn current(&self) -> Arc<TemplateConfig> {
        self.refresh().0
    }

    /// Why the CR in use has its current version refused, if it has.
    pub fn refusal(&self) -> Option<(Arc<KubeVirt>, Refusal)> {
        let (_, selected, refusal) = self.refresh();
        Some((selected?, refusal?))
    }

    fn refresh(&self) -> (Arc<TemplateConfig>, Option<Arc<KubeVirt>>, Option<Refusal>) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some((namespace, store)) = &self.kubevirts else {
            return (state.config.clone(), None, None);
        };
        let Some(kv) = select(&store.state()) else {
            if state.source != Source::Defaults {
                tracing::info!(
                    %namespace,
                    "no KubeVirt CR in use: back to the defaults (the command-line flags)"
                );
                state.source = Source::Defaults;
                state.config = self.defaults.clone();
                state.refused = None;
            }
            return (state.config.clone(), None, None);
        };
        let source = Source::Cr {
            uid: kv.metadata.uid.clone().unwrap_or_default(),
            generation: kv.metadata.generation.unwrap_or_default(),
        };
        if state.source == source {
            return (state.config.clone(), Some(kv), None);
        }
        if let Some((refused, refusal)) = &state.refused
            && *refused == source
        {
            let refusal = refusal.clone();
            return (state.config.clone(), Some(kv), Some(refusal));
        }
        let name = format!("{namespace}/{}", kv.name_any());
        let generation = kv.metadata.generation.unwrap_or_default();
        match build(&self.defaults, &kv) {
            Ok(config) => {
                tracing::info!(
                    kubevirt = %name,
                    generation,
                    "cluster configuration taken from the KubeVirt CR"
                );
                state.config = Arc::new(config);
                state.source = source;
                state.refused = None;
                (state.config.clone(), Some(kv), None)
            }
            Err(refusal) => {
                tracing::error!(
                    kubevirt = %name,
                    generation,
                    %refusal,
                    "KubeVirt CR refused: keeping the configuration in force"
                );
                state.refused = Some((source, refusal.clone()));
                (state.config.clone(), Some(kv), Some(refusal))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kv(configuration: serde_json::Value) -> KubeVirt {
        serde_json::from_value(json!({
            "apiVersion": "kubevirt.io/v1", "kind": "KubeVirt",
            "metadata": {"name": "kubevirt", "namespace": "kubevirt"},
            "spec": {"configuration": configuration},
        }))
        .unwrap()
    }

    fn built(configuration: serde_json::Value) -> Result<TemplateConfig, Refusal> {
        build(&TemplateConfig::default(), &kv(configuration))
    }

    #[test]
    fn an_empty_cr_keeps_the_defaults() {
        assert_eq!(built(json!({})), Ok(TemplateConfig::default()));
        let bare: KubeVirt = serde_json::from_value(json!({
            "metadata": {"name": "kubevirt"}, "spec": {}}))
        .unwrap();
        assert_eq!(
            build(&TemplateConfig::default(), &bare),
            Ok(TemplateConfig::default())
        );
    }

    #[test]
    fn the_overhead_model_from_the_annotation() {
        let with = |value: &str| {
            let mut cr = kv(json!({}));
            cr.metadata.annotations =
                Some([(OVERHEAD_MODEL_ANNOTATION.to_string(), value.to_string())].into());
            cr
        };
        let flags = TemplateConfig {
            memory_overhead_model: OverheadModel::Launcher,
            ..TemplateConfig::default()
        };
        assert_eq!(
            build(&flags, &kv(json!({}))).unwrap().memory_overhead_model,
            OverheadModel::Launcher,
            "no annotation: the flag's model"
        );
        assert_eq!(
            build(&flags, &with("kubevirt"))
                .unwrap()
                .memory_overhead_model,
            OverheadModel::KubeVirt
        );
        let refused = build(&flags, &with("qemu")).unwrap_err();
        assert_eq!(
            refused.field,
            "metadata.annotations[kubevirt-rs.io/memory-overhead-model]"
        );
    }

    #[test]
    fn the_cr_wins_over_the_flags() {
        let flags = TemplateConfig {
            feature_gates: FeatureGates::parse("Root"),
            root: true,
            allow_emulation: true,
            ..TemplateConfig::default()
        };
        let config = build(
            &flags,
            &kv(json!({
                "developerConfiguration": {
                    "featureGates": ["HostDisk", "VMStatsCollector"],
                    "disabledFeatureGates": ["ImageVolume"],
                    "cpuAllocationRatio": 4,
                    "memoryOvercommit": 150,
                    "nodeSelectors": {"zone": "a"},
                    "useEmulation": false,
                    "logVerbosity": {"virtLauncher": 6},
                    "diskVerification": {"memoryLimit": "1Gi"},
                },
                "imagePullPolicy": "Always",
                "cpuModel": "Haswell",
                "cpuRequest": "250m",
                "network": {"defaultNetworkInterface": "masquerade"},
                "architectureConfiguration": {"amd64": {"ovmfPath": "/ovmf"}, "defaultArchitecture": "amd64"},
                "evictionStrategy": "LiveMigrate",
                "additionalGuestMemoryOverheadRatio": "1.5",
                "virtualMachineOptions": {"disableSerialConsoleLog": {}},
                "hypervisors": [{"name": "kvm"}],
            })),
        )
        .unwrap();
        let gates = &config.feature_gates;
        assert!(gates.enabled("HostDisk") && gates.enabled("VMStatsCollector"));
        assert!(!config.root, "the CR's gate list replaces the flag's");
        assert!(!config.image_volume && !gates.enabled("ImageVolume"));
        assert!(config.libvirt_hook_server_and_client, "beta, not disabled");
        assert_eq!(config.cpu_allocation_ratio, 4);
        assert_eq!(config.memory_overcommit, 150);
        assert_eq!(
            config.node_selectors.get("zone").map(String::as_str),
            Some("a")
        );
        assert!(config.allow_emulation, "false is no value: the flag stays");
        assert_eq!(config.virt_launcher_log_verbosity, 6);
        assert_eq!(config.disk_memory_limit_bytes, 1 << 30);
        assert_eq!(config.image_pull_policy, "Always");
        assert_eq!(config.cpu_model.as_deref(), Some("Haswell"));
        assert_eq!(
            config.cpu_request.as_ref().map(|q| q.0.as_str()),
            Some("250m")
        );
        assert_eq!(config.default_network_interface, "masquerade");
        assert_eq!(config.ovmf_path, "/ovmf");
        assert_eq!(config.eviction_strategy.as_deref(), Some("LiveMigrate"));
        assert_eq!(config.additional_guest_memory_overhead_ratio, Some(1.5));
        assert!(config.serial_console_log_disabled);
    }

    /// `seccompConfiguration.virtualMachineInstanceProfile.customProfile` replaces the
    /// flags' profile; a CR without it keeps them.
    #[test]
    fn the_seccomp_profile_of_launcher_pods() {
        let profile = |custom: serde_json::Value| {
            built(json!({"seccompConfiguration": {"virtualMachineInstanceProfile": {"customProfile": custom}}}))
                .unwrap()
                .vmi_seccomp_profile
        };
        assert_eq!(
            profile(json!({"runtimeDefaultProfile": true})),
            Some(VmiSeccompProfile::RuntimeDefault)
        );
        assert_eq!(
            profile(json!({"localhostProfile": "kubevirt/kubevirt.json"})),
            Some(VmiSeccompProfile::Localhost(
                "kubevirt/kubevirt.json".into()
            ))
        );
        let flags = TemplateConfig {
            vmi_seccomp_profile: Some(VmiSeccompProfile::RuntimeDefault),
            ..TemplateConfig::default()
        };
        let none = kv(
            json!({"seccompConfiguration": {"virtualMachineInstanceProfile": {"customProfile": {}}}}),
        );
        assert_eq!(build(&flags, &none).unwrap().vmi_seccomp_profile, None);
        assert_eq!(
            build(&flags, &kv(json!({}))).unwrap().vmi_seccomp_profile,
            flags.vmi_seccomp_profile
        );
    }

    #[test]
    fn zero_counts_are_no_value_and_gates_absent_keep_the_flags() {
        let flags = TemplateConfig {
            feature_gates: FeatureGates::parse("HostDisk"),
            ..TemplateConfig::default()
        };
        let config = build(
            &flags,
            &kv(
                json!({"developerConfiguration": {"cpuAllocationRatio": 0, "memoryOvercommit": 0}}),
            ),
        )
        .unwrap();
        assert_eq!(config, flags);
        // Only the disabled list: the flag's enabled gates stay.
        let config = build(
            &flags,
            &kv(json!({"developerConfiguration": {"disabledFeatureGates": ["ImageVolume"]}})),
        )
        .unwrap();
        assert!(config.feature_gates.enabled("HostDisk") && !config.image_volume);
    }

    #[test]
    fn what_kubevirt_or_this_controller_cannot_take_is_refused_naming_the_field() {
        for (configuration, field) in [
            (
                json!({"imagePullPolicy": "Sometimes"}),
                "spec.configuration.imagePullPolicy",
            ),
            (
                json!({"developerConfiguration": {"memoryOvercommit": -1}}),
                "spec.configuration.developerConfiguration.memoryOvercommit",
            ),
            (
                json!({"developerConfiguration": {"cpuAllocationRatio": -10}}),
                "spec.configuration.developerConfiguration.cpuAllocationRatio",
            ),
            (
                json!({"developerConfiguration": {"pvcTolerateLessSpaceUpToPercent": 101}}),
                "spec.configuration.developerConfiguration.pvcTolerateLessSpaceUpToPercent",
            ),
            (
                json!({"developerConfiguration": {"featureGates": ["Root"], "disabledFeatureGates": ["Root"]}}),
                "spec.configuration.developerConfiguration.featureGates",
            ),
            (
                json!({"developerConfiguration": {"featureGates": ["IOMMUFD"]}}),
                "spec.configuration.developerConfiguration.featureGates",
            ),
            (
                json!({"network": {"defaultNetworkInterface": "slirp"}}),
                "spec.configuration.network.defaultNetworkInterface",
            ),
            (
                json!({"network": {"defaultNetworkInterface": "tap"}}),
                "spec.configuration.network.defaultNetworkInterface",
            ),
            (
                json!({"network": {"permitBridgeInterfaceOnPodNetwork": false}}),
                "spec.configuration.network.permitBridgeInterfaceOnPodNetwork",
            ),
            (
                json!({"evictionStrategy": "Never"}),
                "spec.configuration.evictionStrategy",
            ),
            (
                json!({"additionalGuestMemoryOverheadRatio": "0.5"}),
                "spec.configuration.additionalGuestMemoryOverheadRatio",
            ),
            (
                json!({"additionalGuestMemoryOverheadRatio": "lots"}),
                "spec.configuration.additionalGuestMemoryOverheadRatio",
            ),
            (
                json!({"additionalGuestMemoryOverheadRatio": "NaN"}),
                "spec.configuration.additionalGuestMemoryOverheadRatio",
            ),
            (json!({"cpuRequest": "x"}), "spec.configuration.cpuRequest"),
            (
                json!({"hypervisors": [{"name": "hyperv-direct"}]}),
                "spec.configuration.hypervisors",
            ),
            (
                json!({"seccompConfiguration": {"virtualMachineInstanceProfile": {"customProfile": {
                    "runtimeDefaultProfile": true, "localhostProfile": "kubevirt/kubevirt.json"}}}}),
                "spec.configuration.seccompConfiguration.virtualMachineInstanceProfile.customProfile.localhostProfile",
            ),
        ] {
            assert_eq!(
                built(configuration.clone()).map(|_| ()).unwrap_err().field,
                field,
                "{configuration}"
            );
        }
    }

    #[test]
    fn the_install_is_the_one_cr_else_the_oldest_with_a_phase() {
        let cr = |name: &str, created: &str, phase: &str| {
            Arc::new(
                serde_json::from_value::<KubeVirt>(json!({
                    "metadata": {"name": name, "namespace": "kubevirt", "creationTimestamp": created},
                    "spec": {}, "status": {"phase": phase},
                }))
                .unwrap(),
            )
        };
        let name = |kv: Option<Arc<KubeVirt>>| kv.map(|k| k.name_any());
        assert_eq!(name(select(&[])), None);
        let fresh = cr("a", "2026-01-02T00:00:00Z", "");
        assert_eq!(name(select(std::slice::from_ref(&fresh))), Some("a".into()));
        let installed = cr("b", "2026-01-03T00:00:00Z", "Deployed");
        assert_eq!(
            name(select(&[fresh.clone(), installed.clone()])),
            Some("b".into())
        );
        assert_eq!(
            name(select(&[
                fresh.clone(),
                cr("c", "2026-01-04T00:00:00Z", "")
            ])),
            None
        );
        let older = cr("d", "2026-01-01T00:00:00Z", "Deploying");
        assert_eq!(name(select(&[installed, older, fresh])), Some("d".into()));
    }
}
