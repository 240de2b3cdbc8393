//! Labels, annotations, finalizers and defaults with KubeVirt v1.9.0's exact names.

/// VMI label naming the node that owns the VMI (the handler's watch selector).
pub const NODE_NAME_LABEL: &str = "kubevirt.io/nodeName";
/// Pod label holding the VMI UID.
pub const CREATED_BY_LABEL: &str = "kubevirt.io/created-by";
/// Pod label `kubevirt.io: virt-launcher`.
pub const APP_LABEL: &str = "kubevirt.io";
pub const APP_LABEL_LAUNCHER: &str = "virt-launcher";
/// Pod label with the (sanitized) VMI name.
pub const VMI_ID_LABEL: &str = "vmi.kubevirt.io/id";
/// Deprecated pod label with the sanitized hostname.
pub const VM_NAME_LABEL: &str = "vm.kubevirt.io/name";
/// VM/VMI label with the VM name.
pub const VM_LABEL: &str = "kubevirt.io/vm";
/// Pod annotation with the VMI name.
pub const DOMAIN_ANNOTATION: &str = "kubevirt.io/domain";
/// VMI annotation with the VM generation that produced it.
pub const VM_GENERATION_ANNOTATION: &str = "kubevirt.io/vm-generation";
/// Annotations virt-controller writes on the VMs and VMIs it has seen, each naming the API
/// version (`SetLatestApiVersionAnnotation`): the latest one it knows and the stored one.
pub const LATEST_OBSERVED_API_VERSION_ANNOTATION: &str = "kubevirt.io/latest-observed-api-version";
pub const STORAGE_OBSERVED_API_VERSION_ANNOTATION: &str =
    "kubevirt.io/storage-observed-api-version";
/// `v1.ApiLatestVersion` and `v1.ApiStorageVersion`.
pub const API_VERSION: &str = "v1";

/// Whether virt-controller's API-version annotations are on an object (its annotations),
/// as `ObservedLatestApiVersionAnnotation` judges (the latest one only).
pub fn api_version_observed(
    annotations: Option<&std::collections::BTreeMap<String, String>>,
) -> bool {
    annotations
        .and_then(|a| a.get(LATEST_OBSERVED_API_VERSION_ANNOTATION))
        .is_some_and(|v| v == API_VERSION)
}

/// The API-version annotations as a merge patch of `metadata.annotations`.
pub fn api_version_annotations() -> serde_json::Value {
    serde_json::json!({
        LATEST_OBSERVED_API_VERSION_ANNOTATION: API_VERSION,
        STORAGE_OBSERVED_API_VERSION_ANNOTATION: API_VERSION,
    })
}

/// Node label set by the handler heartbeat.
pub const SCHEDULABLE_LABEL: &str = "kubevirt.io/schedulable";
/// Node annotation with the time of the handler's last heartbeat (`VirtHandlerHeartbeat`).
pub const HEARTBEAT_ANNOTATION: &str = "kubevirt.io/heartbeat";
/// Node label: the kubelet runs the static CPU manager (`CPUManager`).
pub const CPU_MANAGER_LABEL: &str = "kubevirt.io/cpumanager";
/// The same, under its old name (`DeprecatedCPUManager`).
pub const DEPRECATED_CPU_MANAGER_LABEL: &str = "cpumanager";
/// Node label prefix of a machine type the node runs (`SupportedMachineTypeLabel`);
/// launcher pods select `<prefix><machine type>: "true"`.
pub const MACHINE_TYPE_LABEL_PREFIX: &str = "machine-type.node.kubevirt.io/";
/// Node annotation that keeps the node labeller away (`LabellerSkipNodeAnnotation`).
pub const LABELLER_SKIP_NODE_ANNOTATION: &str = "node-labeller.kubevirt.io/skip-node";

/// Finalizer the API webhook puts on every VMI; removed once its pods are gone.
pub const FOREGROUND_DELETE_FINALIZER: &str = "kubevirt.io/foregroundDeleteVirtualMachine";
/// Finalizer of the VM controller on VMs and the VMIs it creates.
pub const VM_CONTROLLER_FINALIZER: &str = "kubevirt.io/virtualMachineControllerFinalize";

/// Grace period when `terminationGracePeriodSeconds` is not set.
pub const DEFAULT_GRACE_PERIOD_SECONDS: i64 = 30;
/// The launcher's user for non-root VMIs (`qemu` in KubeVirt images).
pub const NON_ROOT_UID: u32 = 107;

/// VMI label naming the target node of a running migration (set by the controller's
/// hand-off, removed by the target handler at the end); the target handler watches it.
pub const MIGRATION_TARGET_NODE_NAME_LABEL: &str = "kubevirt.io/migrationTargetNodeName";
/// VMI annotation of an eviction that asked for this migration (`EvictionSourceAnnotation`).
pub const EVICTION_SOURCE_ANNOTATION: &str = "kubevirt.io/eviction-source";
/// VMI label of a launcher running an older image (`OutdatedLauncherImageLabel`).
pub const OUTDATED_LAUNCHER_IMAGE_LABEL: &str = "kubevirt.io/outdatedLauncherImage";
/// VMI annotation asking for a migration target (`CreateMigrationTarget`).
pub const CREATE_MIGRATION_TARGET_ANNOTATION: &str = "kubevirt.io/create-migration-target";
/// The port name of the migration stream (`LibvirtDirectMigrationPort`): the key of
/// `targetDirectMigrationNodePorts`' value, and part of the proxy socket's name.
pub const DIRECT_MIGRATION_PORT: u16 = 49152;
