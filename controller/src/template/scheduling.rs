//! Where the launcher pod may run: its node selector (`nodeselectorrenderer.go`) and the
//! node affinity the template adds (`template.go` `setNodeAffinityForPod`).

use super::{TemplateConfig, TemplateError, is_cpu_dedicated};
use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use proto::contract::node_labels;
use proto::kubevirt::VirtualMachineInstance;
use serde_json::Value;
use std::collections::BTreeMap;

/// Schedulable nodes, the architecture, cluster and VMI selectors, then one label each for
/// dedicated CPUs, a named CPU model, the machine type, the required CPU features, realtime
/// and memory encryption.
pub(super) fn node_selector(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
) -> BTreeMap<String, String> {
    let mut selector = BTreeMap::new();
    let enable = |selector: &mut BTreeMap<String, String>, label: String| {
        selector.insert(label, "true".to_string());
    };
    enable(&mut selector, node_labels::SCHEDULABLE.to_string());
    if let Some(arch) = vmi.spec.architecture.as_deref().filter(|a| !a.is_empty()) {
        selector.insert(node_labels::ARCH.into(), arch.to_lowercase());
    }
    selector.extend(config.node_selectors.clone());
    selector.extend(vmi.spec.node_selector.clone().unwrap_or_default());
    if is_cpu_dedicated(vmi) {
        enable(&mut selector, node_labels::CPU_MANAGER.to_string());
    }
    let cpu = vmi.spec.domain.cpu.as_ref();
    // Feature labels come with the model label, which needs a model (the webhook always
    // sets one); host-model and host-passthrough select no model label.
    if let Some(model) = cpu.and_then(|c| c.model.as_deref())
        && !model.is_empty()
        && model != "host-model"
        && model != "host-passthrough"
    {
        enable(
            &mut selector,
            format!("{}{model}", node_labels::CPU_MODEL_PREFIX),
        );
    }
    let machine = vmi
        .status
        .as_ref()
        .and_then(|s| s.machine.as_ref())
        .map(|m| m.machine_type.clone())
        .filter(|t| !t.is_empty())
        .or_else(|| {
            vmi.spec
                .domain
                .machine
                .as_ref()
                .map(|m| m.machine_type.clone())
                .filter(|t| !t.is_empty())
        });
    if let Some(machine) = machine {
        enable(
            &mut selector,
            format!("{}{machine}", node_labels::MACHINE_TYPE_PREFIX),
        );
    }
    if cpu
        .and_then(|c| c.model.as_deref())
        .is_some_and(|m| !m.is_empty())
    {
        for (name, policy) in cpu_features(vmi) {
            if policy.is_empty() || policy == "require" {
                enable(
                    &mut selector,
                    format!("{}{name}", node_labels::CPU_FEATURE_PREFIX),
                );
            }
        }
    }
    if cpu.is_some_and(|c| c.extra.get("realtime").is_some_and(|r| !r.is_null())) {
        enable(&mut selector, node_labels::REALTIME.to_string());
    }
    let security = launch_security(vmi);
    let has = |kind: &str| security.is_some_and(|s| s.get(kind).is_some_and(|v| !v.is_null()));
    if has("sev") || has("snp") {
        enable(&mut selector, node_labels::SEV.to_string());
    }
    if security
        .and_then(|s| s.pointer("/sev/policy/encryptedState"))
        .and_then(Value::as_bool)
        == Some(true)
    {
        enable(&mut selector, node_labels::SEV_ES.to_string());
    }
    if has("snp") {
        enable(&mut selector, node_labels::SEV_SNP.to_string());
    }
    if has("tdx") {
        enable(&mut selector, node_labels::TDX.to_string());
    }
    selector
}

/// The VMI's own affinity, plus: host-model VMIs avoid nodes whose host model is obsolete,
/// and every forbidden CPU feature keeps the pod off nodes that have it.
pub(super) fn affinity(vmi: &VirtualMachineInstance) -> Result<Option<Affinity>, TemplateError> {
    let mut affinity: Option<Affinity> = vmi
        .spec
        .affinity
        .clone()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| TemplateError::Invalid(format!("spec.affinity: {e}")))?;
    let cpu_model = vmi
        .spec
        .domain
        .cpu
        .as_ref()
        .and_then(|c| c.model.as_deref());
    if matches!(cpu_model, None | Some("") | Some("host-model")) {
        affinity = Some(reject_node_label(
            affinity,
            node_labels::HOST_MODEL_IS_OBSOLETE,
        ));
    }
    for (name, policy) in cpu_features(vmi) {
        if policy == "forbid" {
            affinity = Some(reject_node_label(
                affinity,
                &format!("{}{name}", node_labels::CPU_FEATURE_PREFIX),
            ));
        }
    }
    Ok(affinity)
}

/// `spec.domain.cpu.features[]` as (name, policy); entries without a name are skipped.
fn cpu_features(vmi: &VirtualMachineInstance) -> Vec<(String, String)> {
    vmi.spec
        .domain
        .cpu
        .as_ref()
        .and_then(|c| c.extra.get("features"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| {
            let name = f.get("name")?.as_str()?.to_string();
            let policy = f.get("policy").and_then(Value::as_str).unwrap_or("");
            Some((name, policy.to_string()))
        })
        .collect()
}

/// `spec.domain.launchSecurity`, when set.
pub(super) fn launch_security(vmi: &VirtualMachineInstance) -> Option<&Value> {
    vmi.spec
        .domain
        .extra
        .get("launchSecurity")
        .filter(|v| !v.is_null())
}

/// Adds "`label` must not exist" to every required node-affinity term (the terms are ORed,
/// so each one gets it).
fn reject_node_label(affinity: Option<Affinity>, label: &str) -> Affinity {
    let requirement = NodeSelectorRequirement {
        key: label.into(),
        operator: "DoesNotExist".into(),
        values: None,
    };
    let term = NodeSelectorTerm {
        match_expressions: Some(vec![requirement.clone()]),
        match_fields: None,
    };
    let mut affinity = affinity.unwrap_or_default();
    let node_affinity = affinity
        .node_affinity
        .get_or_insert_with(NodeAffinity::default);
    match node_affinity
        .required_during_scheduling_ignored_during_execution
        .as_mut()
    {
        Some(required) => {
            for term in &mut required.node_selector_terms {
                term.match_expressions
                    .get_or_insert_with(Vec::new)
                    .push(requirement.clone());
            }
        }
        None => {
            node_affinity.required_during_scheduling_ignored_during_execution =
                Some(NodeSelector {
                    node_selector_terms: vec![term],
                });
        }
    }
    affinity
}
