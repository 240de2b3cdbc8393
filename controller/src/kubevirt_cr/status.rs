//! The `KubeVirt` CR's status as virt-operator writes it (`pkg/virt-operator/kubevirt.go`
//! `syncInstallation`, `pkg/virt-operator/util/client.go` conditions), for an install whose
//! components `kubectl apply` created: phase `Deploying` until virt-handler's DaemonSet has
//! every pod ready, then `Deployed`, with the Available/Progressing/Degraded conditions tools
//! wait on. Pure: the leader writes what [`desired`] returns.

use k8s_openapi::api::apps::v1::DaemonSet;
use proto::kubevirt::kv::{condition, phase};
use proto::kubevirt::{Condition, KubeVirt, KubeVirtStatus, Time};

/// `ConditionReason*` of virt-operator.
pub const REASON_EXISTING: &str = "ExistingDeployment";
pub const REASON_FAILED: &str = "DeploymentFailed";
pub const REASON_CREATED: &str = "AllResourcesCreated";
pub const REASON_READY: &str = "AllComponentsReady";
pub const REASON_DEPLOYING: &str = "DeploymentInProgress";
pub const REASON_UPDATING: &str = "UpdateInProgress";

/// What the status depends on besides the CR.
pub struct Inputs<'a> {
    /// Every KubeVirt CR in the namespace, this one included.
    pub kubevirts_in_namespace: usize,
    /// virt-handler's DaemonSet, if it exists.
    pub handler: Option<&'a DaemonSet>,
    /// Registry and version of the components (from the launcher image).
    pub registry: &'a str,
    pub version: &'a str,
    /// The cluster's architecture when the CR names none.
    pub architecture: &'a str,
    /// Why this CR's configuration is refused, if it is.
    pub refusal: Option<String>,
    pub now: Time,
}

/// The status `kv` should have, or `None` when it has it already. CRs being deleted are left
/// alone (no finalizer here: deleting the CR uninstalls nothing).
pub fn desired(kv: &KubeVirt, inputs: &Inputs) -> Option<KubeVirtStatus> {
    if kv.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let old = kv.status.clone().unwrap_or_default();
    let mut status = old.clone();
    sync(kv, &mut status, inputs);
    set_timestamps(&old, &mut status, &inputs.now);
    (status != old).then_some(status)
}

fn sync(kv: &KubeVirt, status: &mut KubeVirtStatus, inputs: &Inputs) {
    if inputs.kubevirts_in_namespace > 1 {
        // `checkForActiveInstall`: said on every CR, nothing else changes.
        update(
            status,
            condition::SYNCHRONIZED,
            "False",
            REASON_EXISTING,
            "There is an active KubeVirt deployment",
        );
        return;
    }
    status.target_kube_virt_registry = Some(inputs.registry.to_string());
    status.target_kube_virt_version = Some(inputs.version.to_string());
    // `SetDefaultArchitecture`: the CR's, else the first one seen.
    let named = kv
        .spec
        .configuration
        .as_ref()
        .and_then(|c| c.architecture_configuration.as_ref())
        .and_then(|a| a.default_architecture.clone())
        .filter(|a| !a.is_empty());
    if let Some(arch) = named {
        status.default_architecture = Some(arch);
    } else if status
        .default_architecture
        .as_deref()
        .is_none_or(str::is_empty)
    {
        status.default_architecture = Some(inputs.architecture.to_string());
    }
    if status.phase.is_empty() {
        status.phase = phase::DEPLOYING.into();
    }
    let updating = status
        .observed_kube_virt_version
        .as_ref()
        .is_some_and(|observed| {
            Some(observed) != status.target_kube_virt_version.as_ref()
                || status.observed_kube_virt_registry != status.target_kube_virt_registry
        });
    if updating {
        remove(status, condition::CREATED);
        remove(status, condition::SYNCHRONIZED);
        let message = format!(
            "Transitioning from previous version {} with registry {} to target version {} using registry {}",
            status
                .observed_kube_virt_version
                .clone()
                .unwrap_or_default(),
            status
                .observed_kube_virt_registry
                .clone()
                .unwrap_or_default(),
            inputs.version,
            inputs.registry,
        );
        for (kind, value) in [
            (condition::AVAILABLE, "True"),
            (condition::PROGRESSING, "True"),
            (condition::DEGRADED, "True"),
        ] {
            update(status, kind, value, REASON_UPDATING, &message);
        }
    } else {
        remove(status, condition::SYNCHRONIZED);
        let message = format!(
            "Deploying version {} with registry {}",
            inputs.version, inputs.registry
        );
        for (kind, value) in [
            (condition::AVAILABLE, "False"),
            (condition::PROGRESSING, "True"),
            (condition::DEGRADED, "False"),
        ] {
            update(status, kind, value, REASON_DEPLOYING, &message);
        }
    }
    if let Some(refusal) = &inputs.refusal {
        // `UpdateConditionsFailedError`: the configuration could not be deployed.
        let message = format!("An error occurred during deployment: {refusal}");
        for (kind, value) in [
            (condition::SYNCHRONIZED, "False"),
            (condition::AVAILABLE, "False"),
            (condition::PROGRESSING, "False"),
            (condition::DEGRADED, "True"),
        ] {
            update(status, kind, value, REASON_FAILED, &message);
        }
        return;
    }
    let Some(handler) = inputs.handler else {
        return;
    };
    update(
        status,
        condition::CREATED,
        "True",
        REASON_CREATED,
        "All resources were created.",
    );
    if daemonset_ready(handler) {
        status.observed_kube_virt_registry = status.target_kube_virt_registry.clone();
        status.observed_kube_virt_version = status.target_kube_virt_version.clone();
        status.phase = phase::DEPLOYED.into();
        let message = "All components are ready.";
        for (kind, value) in [
            (condition::AVAILABLE, "True"),
            (condition::PROGRESSING, "False"),
            (condition::DEGRADED, "False"),
        ] {
            update(status, kind, value, REASON_READY, message);
        }
        status.observed_generation = kv.metadata.generation;
    }
}

/// `DaemonsetIsReady`: pods are wanted somewhere and every one of them is ready.
pub fn daemonset_ready(daemonset: &DaemonSet) -> bool {
    daemonset.status.as_ref().is_some_and(|s| {
        s.desired_number_scheduled > 0 && s.desired_number_scheduled == s.number_ready
    })
}

/// `updateCondition`: in place when the type is there, appended otherwise.
fn update(status: &mut KubeVirtStatus, kind: &str, value: &str, reason: &str, message: &str) {
    let condition = match status
        .conditions
        .iter_mut()
        .find(|c| c.condition_type == kind)
    {
        Some(condition) => condition,
        None => {
            status.conditions.push(Condition {
                condition_type: kind.to_string(),
                status: String::new(),
                last_probe_time: None,
                last_transition_time: None,
                reason: None,
                message: None,
                extra: Default::default(),
            });
            status.conditions.last_mut().expect("just pushed")
        }
    };
    condition.status = value.to_string();
    condition.reason = Some(reason.to_string());
    condition.message = Some(message.to_string());
}

fn remove(status: &mut KubeVirtStatus, kind: &str) {
    status.conditions.retain(|c| c.condition_type != kind);
}

/// `SetConditionTimestamps`: a changed condition gets both times, a new one its probe time.
/// An unchanged one keeps its times even when it was removed and added again in between
/// (virt-operator's would lose them, and the next pass would write again).
fn set_timestamps(old: &KubeVirtStatus, new: &mut KubeVirtStatus, now: &Time) {
    for condition in &mut new.conditions {
        match old
            .conditions
            .iter()
            .find(|c| c.condition_type == condition.condition_type)
        {
            Some(before) => {
                if before.status != condition.status
                    || before.reason != condition.reason
                    || before.message != condition.message
                {
                    condition.last_probe_time = Some(now.clone());
                    condition.last_transition_time = Some(now.clone());
                } else {
                    condition.last_probe_time = before.last_probe_time.clone();
                    condition.last_transition_time = before.last_transition_time.clone();
                }
            }
            None => condition.last_probe_time = Some(now.clone()),
        }
    }
}

/// The registry and version of an image reference, as virt-operator names its install's:
/// `localhost/kubevirt-rs/virt-launcher:devel` → (`localhost/kubevirt-rs`, `devel`).
pub fn registry_and_version(image: &str) -> (String, String) {
    let (name, version) = match image.split_once('@') {
        Some((name, digest)) => (name, digest.to_string()),
        None => match image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')) {
            Some((name, tag)) => (name, tag.to_string()),
            None => (image, String::new()),
        },
    };
    let registry = name.rsplit_once('/').map_or("", |(registry, _)| registry);
    (registry.to_string(), version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn kv(status: serde_json::Value) -> KubeVirt {
        serde_json::from_value(json!({
            "metadata": {"name": "kubevirt", "namespace": "kubevirt", "generation": 2},
            "spec": {}, "status": status,
        }))
        .unwrap()
    }

    fn handler(desired: i32, ready: i32) -> DaemonSet {
        serde_json::from_value(json!({
            "metadata": {"name": "virt-handler"},
            "status": {"desiredNumberScheduled": desired, "numberReady": ready,
                       "currentNumberScheduled": desired, "numberMisscheduled": 0},
        }))
        .unwrap()
    }

    fn inputs(handler: Option<&DaemonSet>) -> Inputs<'_> {
        Inputs {
            kubevirts_in_namespace: 1,
            handler,
            registry: "localhost/kubevirt-rs",
            version: "devel",
            architecture: "amd64",
            refusal: None,
            now: Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap()),
        }
    }

    fn condition<'a>(status: &'a KubeVirtStatus, kind: &str) -> (&'a str, &'a str) {
        let c = status
            .conditions
            .iter()
            .find(|c| c.condition_type == kind)
            .unwrap_or_else(|| panic!("{kind} in {status:?}"));
        (c.status.as_str(), c.reason.as_deref().unwrap_or_default())
    }

    #[test]
    fn deploying_until_the_handler_is_ready_then_deployed_once() {
        let fresh = kv(json!({}));
        let deploying = desired(&fresh, &inputs(None)).unwrap();
        assert_eq!(deploying.phase, "Deploying");
        assert_eq!(
            condition(&deploying, "Available"),
            ("False", REASON_DEPLOYING)
        );
        assert_eq!(
            condition(&deploying, "Progressing"),
            ("True", REASON_DEPLOYING)
        );
        assert_eq!(
            condition(&deploying, "Degraded"),
            ("False", REASON_DEPLOYING)
        );
        assert_eq!(
            deploying.conditions[0].message.as_deref(),
            Some("Deploying version devel with registry localhost/kubevirt-rs")
        );
        assert_eq!(deploying.default_architecture.as_deref(), Some("amd64"));
        assert_eq!(deploying.observed_generation, None);
        // A written status is not written again.
        let written = kv(serde_json::to_value(&deploying).unwrap());
        assert_eq!(desired(&written, &inputs(None)), None);
        // Pods scheduled but not all ready: still deploying (the DaemonSet exists: Created).
        let starting = handler(1, 0);
        let created = desired(&written, &inputs(Some(&starting))).unwrap();
        assert_eq!(created.phase, "Deploying");
        assert_eq!(condition(&created, "Created"), ("True", REASON_CREATED));
        // No node wants a pod: not ready either.
        assert!(!daemonset_ready(&handler(0, 0)));

        let ready = handler(2, 2);
        let deployed = desired(&written, &inputs(Some(&ready))).unwrap();
        assert_eq!(deployed.phase, "Deployed");
        assert_eq!(deployed.observed_generation, Some(2));
        assert_eq!(condition(&deployed, "Available"), ("True", REASON_READY));
        assert_eq!(condition(&deployed, "Progressing"), ("False", REASON_READY));
        assert_eq!(condition(&deployed, "Degraded"), ("False", REASON_READY));
        assert_eq!(
            deployed.observed_kube_virt_version.as_deref(),
            Some("devel")
        );
        let available = deployed
            .conditions
            .iter()
            .find(|c| c.condition_type == "Available")
            .unwrap();
        assert!(available.last_transition_time.is_some());
        let written = kv(serde_json::to_value(&deployed).unwrap());
        assert_eq!(desired(&written, &inputs(Some(&ready))), None);
        // The handler losing pods: Available goes, the phase stays (as virt-operator's).
        let degraded = desired(&written, &inputs(Some(&starting))).unwrap();
        assert_eq!(degraded.phase, "Deployed");
        assert_eq!(
            condition(&degraded, "Available"),
            ("False", REASON_DEPLOYING)
        );
    }

    #[test]
    fn a_second_cr_is_told_there_is_an_install_and_nothing_else_changes() {
        let second = kv(json!({}));
        let status = desired(
            &second,
            &Inputs {
                kubevirts_in_namespace: 2,
                ..inputs(None)
            },
        )
        .unwrap();
        assert_eq!(status.phase, "");
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(
            condition(&status, "Synchronized"),
            ("False", REASON_EXISTING)
        );
        // Alone again: the condition goes.
        let alone = desired(&kv(serde_json::to_value(&status).unwrap()), &inputs(None)).unwrap();
        assert!(
            alone
                .conditions
                .iter()
                .all(|c| c.condition_type != "Synchronized")
        );
    }

    #[test]
    fn a_refused_configuration_is_a_failed_deployment() {
        let ready = handler(1, 1);
        let status = desired(
            &kv(json!({})),
            &Inputs {
                refusal: Some("spec.configuration.evictionStrategy: invalid".into()),
                ..inputs(Some(&ready))
            },
        )
        .unwrap();
        assert_eq!(status.phase, "Deploying");
        assert_eq!(condition(&status, "Synchronized"), ("False", REASON_FAILED));
        assert_eq!(condition(&status, "Degraded"), ("True", REASON_FAILED));
        assert_eq!(condition(&status, "Available"), ("False", REASON_FAILED));
        assert_eq!(status.observed_generation, None);
        // Written once: the next pass (Synchronized removed and added again) changes nothing.
        let written = kv(serde_json::to_value(&status).unwrap());
        let again = Inputs {
            refusal: Some("spec.configuration.evictionStrategy: invalid".into()),
            ..inputs(Some(&ready))
        };
        assert_eq!(desired(&written, &again), None);
    }

    #[test]
    fn deleting_crs_are_left_alone() {
        let mut deleting = kv(json!({}));
        deleting.metadata.deletion_timestamp = Some(inputs(None).now);
        assert_eq!(desired(&deleting, &inputs(None)), None);
    }

    #[test]
    fn registries_and_versions_of_images() {
        for (image, registry, version) in [
            (
                "localhost/kubevirt-rs/virt-launcher:devel",
                "localhost/kubevirt-rs",
                "devel",
            ),
            (
                "quay.io/kubevirt/virt-launcher:v1.9.0",
                "quay.io/kubevirt",
                "v1.9.0",
            ),
            (
                "registry:5000/kv/virt-launcher@sha256:ab",
                "registry:5000/kv",
                "sha256:ab",
            ),
            ("registry:5000/virt-launcher", "registry:5000", ""),
            ("virt-launcher", "", ""),
        ] {
            assert_eq!(
                registry_and_version(image),
                (registry.to_string(), version.to_string()),
                "{image}"
            );
        }
    }
}
