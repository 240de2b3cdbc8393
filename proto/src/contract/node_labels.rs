//! Node labels a launcher pod can select on, and so the labels the handler's node labeller
//! must write for the pod to be scheduled (KubeVirt v1.9.0 `staging/src/kubevirt.io/api/core/v1/types.go`,
//! `pkg/virt-controller/services/nodeselectorrenderer.go`). Prefixed keys end in a name:
//! `machine-type.node.kubevirt.io/q35`, `cpu-feature.node.kubevirt.io/vmx`.
//!
//! For a VMI this project's launcher runs ([`super::runnable`]), a pod selects on
//! [`SCHEDULABLE`], `kubernetes.io/arch` = `amd64`, [`MACHINE_TYPE_PREFIX`]`q35` (or the
//! `pc-q35-*` type the VMI names), [`CPU_FEATURE_PREFIX`]`<name>` for each feature the VMI
//! requires, and avoids nodes with [`HOST_MODEL_IS_OBSOLETE`] (host-model VMIs) or
//! [`CPU_FEATURE_PREFIX`]`<name>` for each feature it forbids; plus whatever selectors the
//! VMI and the cluster configuration add themselves.

/// `kubevirt.io/schedulable`: the node's handler is up and takes VMIs.
pub const SCHEDULABLE: &str = "kubevirt.io/schedulable";
/// `machine-type.node.kubevirt.io/<type>`: the node runs this machine type.
pub const MACHINE_TYPE_PREFIX: &str = "machine-type.node.kubevirt.io/";
/// `cpu-model.node.kubevirt.io/<model>`: the node runs this named CPU model.
pub const CPU_MODEL_PREFIX: &str = "cpu-model.node.kubevirt.io/";
/// `cpu-feature.node.kubevirt.io/<feature>`: the node's CPU has this feature.
pub const CPU_FEATURE_PREFIX: &str = "cpu-feature.node.kubevirt.io/";
/// `cpu-vendor.node.kubevirt.io/<vendor>`.
pub const CPU_VENDOR_PREFIX: &str = "cpu-vendor.node.kubevirt.io/";
/// `hyperv.node.kubevirt.io/<feature>`.
pub const HYPERV_PREFIX: &str = "hyperv.node.kubevirt.io/";
/// Set on a node whose host-model CPU is obsolete; host-model VMIs avoid it.
pub const HOST_MODEL_IS_OBSOLETE: &str = "node-labeller.kubevirt.io/obsolete-host-model";
/// `kubevirt.io/cpumanager`: the kubelet's static CPU manager is on (dedicated CPUs).
pub const CPU_MANAGER: &str = "kubevirt.io/cpumanager";
/// `kubevirt.io/realtime`.
pub const REALTIME: &str = "kubevirt.io/realtime";
/// `kubevirt.io/sev`, `kubevirt.io/sev-es`, `kubevirt.io/sev-snp`, `kubevirt.io/tdx`:
/// memory-encryption capable nodes.
pub const SEV: &str = "kubevirt.io/sev";
pub const SEV_ES: &str = "kubevirt.io/sev-es";
pub const SEV_SNP: &str = "kubevirt.io/sev-snp";
pub const TDX: &str = "kubevirt.io/tdx";
/// The kubelet's architecture label (`k8sv1.LabelArchStable`).
pub const ARCH: &str = "kubernetes.io/arch";
