//! The five webhooks, as pure functions of the request and the configuration in force:
//! KubeVirt v1.9.0's `vmi-create-admitter.go`, `vmi-update-admitter.go`, `vms-admitter.go`,
//! `vmi-mutator.go` and `vm-mutator.go`, for what this project serves.
//!
//! Validating: what the configuration's feature gates forbid (KubeVirt's rules and messages,
//! `proto::contract::feature_gates`), what this project's launcher cannot run
//! (`proto::contract::runnable`: a cause naming the field; KubeVirt would admit such a VMI
//! and fail later), KubeVirt's reserved labels, its VMI update rule (the spec of a VMI
//! changes only through KubeVirt's own service accounts) and its VM run-strategy rules.
//! Mutating: the defaults KubeVirt stores (`proto::contract::defaults`) as one JSON patch
//! setting `/spec`, `/metadata` and `/status` (`replace`, as KubeVirt writes it; `add` for
//! a key the object lacks).

use crate::review::{Cause, FIELD_VALUE_INVALID, FIELD_VALUE_NOT_SUPPORTED, Request, Response};
use controller::admission;
use controller::template::TemplateConfig;
use proto::contract::defaults;
use proto::contract::feature_gates::FeatureGates;
use proto::kubevirt::{
    RunStrategy, Time, VirtualMachine, VirtualMachineInstance, VirtualMachineInstanceSpec,
    well_known,
};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// `kubevirt.io`.
pub const GROUP: &str = "kubevirt.io";
/// `v1.ApiSupportedWebhookVersions`.
pub const VERSIONS: &[&str] = &["v1alpha3", "v1"];
pub const VMIS: &str = "virtualmachineinstances";
pub const VMS: &str = "virtualmachines";

/// Labels only KubeVirt's service accounts may set on a VMI (`restrictedVmiLabels`).
pub const RESTRICTED_LABELS: &[&str] = &[
    well_known::CREATED_BY_LABEL,
    "kubevirt.io/migrationJobUID",
    well_known::NODE_NAME_LABEL,
    "kubevirt.io/migrationTargetNodeName",
    well_known::SCHEDULABLE_LABEL,
    "kubevirt.io/install-strategy",
];

/// The feature gate `WaitAsReceiver` needs.
const DECENTRALIZED_LIVE_MIGRATION: &str = "DecentralizedLiveMigration";

/// What a webhook judges by besides the request.
pub struct Context<'a> {
    /// The cluster configuration in force (the `KubeVirt` CR).
    pub config: &'a TemplateConfig,
    /// KubeVirt's service accounts as user names (`webhooks.KubeVirtServiceAccounts`):
    /// `system:serviceaccount:<namespace>:<name>`.
    pub service_accounts: &'a BTreeSet<String>,
    pub now: Time,
    /// A new random UUID (a VM's firmware UUID and serial).
    pub new_uuid: &'a (dyn Fn() -> String + Sync),
}

impl Context<'_> {
    pub(crate) fn is_kubevirt(&self, request: &Request) -> bool {
        self.service_accounts.contains(&request.user_info.username)
    }
}

/// KubeVirt's service accounts in `namespace` as API user names: v1.9.0's
/// (`kubevirt-apiserver`, `kubevirt-controller`, `kubevirt-handler`,
/// `kubevirt-synchronization-controller`) and this project's controller (`virt-controller`).
pub fn service_accounts(namespace: &str) -> BTreeSet<String> {
    [
        "kubevirt-apiserver",
        "kubevirt-controller",
        "kubevirt-handler",
        "kubevirt-synchronization-controller",
        "virt-controller",
    ]
    .iter()
    .map(|name| format!("system:serviceaccount:{namespace}:{name}"))
    .collect()
}

/// `ValidateRequestResource`: the request is about `resource` of kubevirt.io, a version
/// KubeVirt serves webhooks for.
fn check_resource(request: &Request, resource: &str) -> Result<(), String> {
    let r = &request.resource;
    if r.group == GROUP && r.resource == resource && VERSIONS.contains(&r.version.as_str()) {
        Ok(())
    } else {
        Err(format!("expect resource to be '{resource}'"))
    }
}

fn decode<T: serde::de::DeserializeOwned>(object: Option<&Value>) -> Result<T, String> {
    let object = object.ok_or("the request has no object")?;
    serde_json::from_value(object.clone()).map_err(|e| e.to_string())
}

/// The request's object and, for an update, the old one; the error is the message of the
/// 400 answer (`ToAdmissionResponseError`).
fn objects<T: serde::de::DeserializeOwned>(
    request: &Request,
    resource: &str,
) -> Result<(T, Option<T>), String> {
    check_resource(request, resource)?;
    let new = decode(request.object.as_ref())?;
    let old = if request.operation == "UPDATE" {
        Some(decode(request.old_object.as_ref())?)
    } else {
        None
    };
    Ok((new, old))
}

fn deleting(object: Option<&Value>) -> bool {
    object
        .and_then(|o| o.pointer("/metadata/deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}

/// The reserved labels among `labels`.
fn restricted(labels: Option<&BTreeMap<String, String>>) -> BTreeMap<&str, &str> {
    labels
        .into_iter()
        .flatten()
        .filter(|(k, _)| RESTRICTED_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The causes admission holds against a VMI (gates with KubeVirt's messages, then the
/// first thing the launcher cannot run, its message naming the field), with every field
/// path passed through `path` (a VM's template is `spec.template.…`).
fn vmi_causes(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    runnable: bool,
    path: impl Fn(&str) -> String,
) -> Vec<Cause> {
    let refusals = admission::refusals(vmi, config);
    let mut causes: Vec<Cause> = refusals
        .gates
        .iter()
        .map(|r| Cause::new(FIELD_VALUE_INVALID, path(&r.reason), path(&r.field)))
        .collect();
    if runnable && let Some(r) = refusals.runnable {
        causes.push(Cause::new(
            FIELD_VALUE_NOT_SUPPORTED,
            path(&r.to_string()),
            path(&r.field),
        ));
    }
    causes
}

fn reserved_labels_cause(field: &str) -> Cause {
    Cause::new(
        FIELD_VALUE_NOT_SUPPORTED,
        "creation of the following reserved kubevirt.io/ labels on a VMI object is prohibited",
        field,
    )
}

/// `/virtualmachineinstances-validate-create`
/// (`virtualmachineinstances-create-validator.kubevirt.io`).
pub fn validate_vmi_create(request: &Request, ctx: &Context) -> Response {
    let (vmi, _) = match objects::<VirtualMachineInstance>(request, VMIS) {
        Ok(objects) => objects,
        Err(message) => return Response::error(message),
    };
    let mut causes = vmi_causes(&vmi, ctx.config, true, str::to_string);
    if !ctx.is_kubevirt(request) && !restricted(vmi.metadata.labels.as_ref()).is_empty() {
        causes.push(reserved_labels_cause("metadata.labels"));
    }
    Response::refused(causes)
}

/// A spec with what Go's decoding cannot tell apart made equal: no nulls, no empty lists
/// (`equality.Semantic.DeepEqual` takes a nil slice for an empty one).
fn comparable(value: Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.into_iter()
                .filter(|(_, v)| !v.is_null() && v.as_array().is_none_or(|a| !a.is_empty()))
                .map(|(k, v)| (k, comparable(v)))
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.into_iter().map(comparable).collect()),
        other => other,
    }
}

fn spec_value(spec: &VirtualMachineInstanceSpec) -> Value {
    comparable(serde_json::to_value(spec).unwrap_or_default())
}

/// `/virtualmachineinstances-validate-update`
/// (`virtualmachineinstances-update-validator.kubevirt.io`): the spec changes only through
/// KubeVirt's service accounts (which keep `maxSockets` and `maxGuest`), and only they
/// change its reserved labels.
pub fn validate_vmi_update(request: &Request, ctx: &Context) -> Response {
    let (new, old) = match objects::<VirtualMachineInstance>(request, VMIS) {
        Ok((new, Some(old))) => (new, old),
        Ok((_, None)) => return Response::error("the request has no old object"),
        Err(message) => return Response::error(message),
    };
    let kubevirt = ctx.is_kubevirt(request);
    if spec_value(&new.spec) != spec_value(&old.spec) {
        if !kubevirt {
            return Response::refused(vec![Cause::new(
                FIELD_VALUE_NOT_SUPPORTED,
                "update of VMI object is restricted",
                "",
            )]);
        }
        let max_sockets = |vmi: &VirtualMachineInstance| {
            vmi.spec
                .domain
                .cpu
                .as_ref()
                .and_then(|c| c.extra.get("maxSockets").cloned())
                .filter(|v| !v.is_null())
                .unwrap_or(json!(0))
        };
        if max_sockets(&new) != max_sockets(&old) {
            return Response::refused(vec![Cause::new(
                FIELD_VALUE_INVALID,
                "CPU topology maxSockets changed",
                "",
            )]);
        }
        let max_guest = |vmi: &VirtualMachineInstance| {
            vmi.spec
                .domain
                .memory
                .as_ref()
                .and_then(|m| m.extra.get("maxGuest").cloned())
                .filter(|v| !v.is_null())
        };
        if let (Some(new_max), Some(old_max)) = (max_guest(&new), max_guest(&old))
            && new_max != old_max
        {
            return Response::refused(vec![Cause::new(
                FIELD_VALUE_INVALID,
                "Memory maxGuest changed",
                "",
            )]);
        }
    }
    if !kubevirt
        && restricted(new.metadata.labels.as_ref()) != restricted(old.metadata.labels.as_ref())
    {
        return Response::refused(vec![Cause::new(
            FIELD_VALUE_NOT_SUPPORTED,
            "modification of the following reserved kubevirt.io/ labels on a VMI object is prohibited",
            "",
        )]);
    }
    Response::allowed()
}

/// A VMI's field path or message as the same thing in a VM's template: `spec.` →
/// `spec.template.spec.`, `metadata.` → `spec.template.metadata.` wherever a path starts.
pub fn in_template(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    let mut previous: Option<char> = None;
    while let Some(c) = rest.chars().next() {
        let starts_path = previous.is_none_or(|p| !(p.is_alphanumeric() || p == '.' || p == '_'));
        if starts_path && rest.starts_with("spec.") {
            out.push_str("spec.template.spec.");
            rest = &rest["spec.".len()..];
            previous = Some('.');
            continue;
        }
        if starts_path && rest.starts_with("metadata.") {
            out.push_str("spec.template.metadata.");
            rest = &rest["metadata.".len()..];
            previous = Some('.');
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
        previous = Some(c);
    }
    out
}

/// The VMI the VM controller would create from `vm`'s template (its name and namespace).
fn template_vmi(vm: &VirtualMachine) -> VirtualMachineInstance {
    let mut metadata = vm.spec.template.metadata.clone().unwrap_or_default();
    metadata.name = vm.metadata.name.clone();
    metadata.namespace = vm.metadata.namespace.clone();
    VirtualMachineInstance {
        metadata,
        spec: vm.spec.template.spec.clone().unwrap_or_default(),
        status: None,
    }
}

/// `validateRunStrategy`.
fn run_strategy_causes(vm: &VirtualMachine, gates: &FeatureGates) -> Vec<Cause> {
    let mut causes = Vec::new();
    match (vm.spec.running, vm.spec.run_strategy) {
        (Some(_), Some(_)) => causes.push(Cause::new(
            FIELD_VALUE_INVALID,
            "Running and RunStrategy are mutually exclusive. Note that Running is deprecated, please use RunStrategy instead",
            "spec.running",
        )),
        (None, None) => causes.push(Cause::new(
            FIELD_VALUE_INVALID,
            "RunStrategy must be specified",
            "spec.running",
        )),
        _ => {}
    }
    match vm.spec.run_strategy {
        Some(RunStrategy::WaitAsReceiver) if !gates.enabled(DECENTRALIZED_LIVE_MIGRATION) => {
            causes.push(Cause::new(
                FIELD_VALUE_INVALID,
                format!(
                    "Invalid RunStrategy (WaitAsReceiver), {DECENTRALIZED_LIVE_MIGRATION} feature gate is not enabled in kubevirt resource"
                ),
                "spec.runStrategy",
            ));
        }
        Some(RunStrategy::Unknown) => causes.push(Cause::new(
            FIELD_VALUE_INVALID,
            "Invalid RunStrategy ()",
            "spec.runStrategy",
        )),
        _ => {}
    }
    causes
}

/// `/virtualmachines-validate` (`virtualmachine-validator.kubevirt.io`), on create and
/// update: the run strategy, the template's reserved labels, and its VMI as the VM
/// controller would create it, judged as a new VMI (paths under `spec.template`). What the
/// launcher cannot run is judged when the template is new or changed, so that a VM stored
/// before (while virt-api was absent) can still be stopped and edited otherwise.
pub fn validate_vm(request: &Request, ctx: &Context) -> Response {
    if deleting(request.object.as_ref()) {
        return Response::allowed();
    }
    let (vm, old) = match objects::<VirtualMachine>(request, VMS) {
        Ok(objects) => objects,
        Err(message) => return Response::error(message),
    };
    let mut causes = run_strategy_causes(&vm, &ctx.config.feature_gates);
    let template = template_vmi(&vm);
    if !ctx.is_kubevirt(request) && !restricted(template.metadata.labels.as_ref()).is_empty() {
        causes.push(reserved_labels_cause("spec.template.metadata.labels"));
    }
    let changed = old.is_none_or(|old| old.spec.template != vm.spec.template);
    causes.extend(vmi_causes(&template, ctx.config, changed, in_template));
    let mut response = Response::refused(causes);
    if response.allowed && vm.spec.running.is_some() {
        response
            .warnings
            .push("spec.running is deprecated, please use spec.runStrategy instead.".into());
    }
    response
}

/// The operation setting the top-level `key` of `object` (the request's object): `replace`
/// as KubeVirt writes it where the key is there, `add` where it is not (RFC 6902's
/// `replace` needs its target; a new VMI has no `status`).
pub(crate) fn set(object: Option<&Value>, key: &str, value: impl serde::Serialize) -> Value {
    let op = if object.and_then(|o| o.get(key)).is_some() {
        "replace"
    } else {
        "add"
    };
    json!({"op": op, "path": format!("/{key}"), "value": serde_json::to_value(value).unwrap_or_default()})
}

/// `/virtualmachineinstances-mutate` (`virtualmachineinstances-mutator.kubevirt.io`).
/// Create: the defaults (spec, the PCI topology annotation), the foreground-delete
/// finalizer and the status KubeVirt starts from (phase `Pending`, runtime user, guest
/// memory, CPU topology), as one patch setting `/spec`, `/metadata` and `/status`.
/// Update: a status change by anyone but KubeVirt's service accounts is undone (only
/// visible on a CRD without the status subresource; ours has one).
pub fn mutate_vmi(request: &Request, ctx: &Context) -> Response {
    let (mut vmi, old) = match objects::<VirtualMachineInstance>(request, VMIS) {
        Ok(objects) => objects,
        Err(message) => return Response::error(message),
    };
    match request.operation.as_str() {
        "CREATE" => {
            let config = ctx.config.defaults();
            defaults::apply_vmi(&mut vmi, &config);
            let finalizers = vmi.metadata.finalizers.get_or_insert_with(Vec::new);
            if !finalizers
                .iter()
                .any(|f| f == well_known::FOREGROUND_DELETE_FINALIZER)
            {
                finalizers.push(well_known::FOREGROUND_DELETE_FINALIZER.into());
            }
            defaults::apply_vmi_status(&mut vmi, &config, &ctx.now);
            let object = request.object.as_ref();
            Response::patched(vec![
                set(object, "spec", &vmi.spec),
                set(object, "metadata", &vmi.metadata),
                set(object, "status", &vmi.status),
            ])
        }
        "UPDATE" => {
            let Some(old) = old else {
                return Response::error("the request has no old object");
            };
            let status = |v: &VirtualMachineInstance| {
                comparable(serde_json::to_value(&v.status).unwrap_or_default())
            };
            if status(&vmi) != status(&old) && !ctx.is_kubevirt(request) {
                let old_status = old
                    .status
                    .map_or(json!({}), |s| serde_json::to_value(s).unwrap_or_default());
                Response::patched(vec![set(request.object.as_ref(), "status", old_status)])
            } else {
                Response::allowed()
            }
        }
        _ => Response::allowed(),
    }
}

/// `/virtualmachines-mutate` (`virtualmachines-mutator.kubevirt.io`): the template's
/// architecture and machine type at every write; at creation a random firmware UUID and
/// serial and the PCI topology annotation (`proto::contract::defaults::apply_vm`), as one
/// patch setting `/spec` and `/metadata`.
pub fn mutate_vm(request: &Request, ctx: &Context) -> Response {
    if deleting(request.object.as_ref()) {
        return Response::allowed();
    }
    let (mut vm, _) = match objects::<VirtualMachine>(request, VMS) {
        Ok(objects) => objects,
        Err(message) => return Response::error(message),
    };
    let create = request.operation == "CREATE";
    defaults::apply_vm(&mut vm, &ctx.config.defaults(), create, || {
        ((ctx.new_uuid)(), (ctx.new_uuid)())
    });
    let object = request.object.as_ref();
    Response::patched(vec![
        set(object, "spec", &vm.spec),
        set(object, "metadata", &vm.metadata),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::review::{FIELD_VALUE_NOT_SUPPORTED, Status};
    use pretty_assertions::assert_eq;
    use proto::contract::feature_gates::FeatureGates;

    const USER: &str = "alice";

    /// A VMI this project's launcher runs (kernel boot of KubeVirt's demo images).
    fn vmi_spec() -> Value {
        json!({
            "domain": {
                "devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}}]},
                "memory": {"guest": "128Mi"},
                "firmware": {"kernelBoot": {"kernelArgs": "console=ttyS0", "container": {
                    "image": "quay.io/kubevirt/alpine-ext-kernel-boot-demo:v1.9.0",
                    "kernelPath": "/boot/vmlinuz-virt", "initrdPath": "/boot/initramfs-virt"}}},
            },
            "volumes": [{"name": "containerdisk", "containerDisk": {"image": "quay.io/kubevirt/alpine-container-disk-demo:v1.9.0"}}],
        })
    }

    fn vmi(spec: Value) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstance",
               "metadata": {"name": "v", "namespace": "ns"}, "spec": spec})
    }

    fn with_host_disk(mut spec: Value) -> Value {
        spec["domain"]["devices"]["disks"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "host", "disk": {"bus": "virtio"}}));
        spec["volumes"].as_array_mut().unwrap().push(
            json!({"name": "host", "hostDisk": {"path": "/var/lib/d/disk.img", "type": "DiskOrCreate", "capacity": "64Mi"}}),
        );
        spec
    }

    fn vm(template_spec: Value) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachine",
               "metadata": {"name": "m", "namespace": "ns"},
               "spec": {"runStrategy": "Always", "template": {"spec": template_spec}}})
    }

    fn request(operation: &str, resource: &str, object: Value, old: Option<Value>) -> Request {
        serde_json::from_value(json!({
            "uid": "u", "operation": operation,
            "resource": {"group": "kubevirt.io", "version": "v1", "resource": resource},
            "userInfo": {"username": USER},
            "object": object, "oldObject": old,
        }))
        .unwrap()
    }

    /// Runs `webhook` with the feature gates `gates` as a user (`as_user`) or as
    /// KubeVirt's controller.
    fn judge(
        webhook: fn(&Request, &Context) -> Response,
        mut request: Request,
        gates: &str,
        as_user: bool,
    ) -> Response {
        let config = TemplateConfig {
            feature_gates: FeatureGates::parse(gates),
            ..TemplateConfig::default()
        };
        let accounts = service_accounts("kubevirt");
        if !as_user {
            request.user_info.username = "system:serviceaccount:kubevirt:virt-controller".into();
        }
        let now: Time = serde_json::from_value(json!("2026-01-02T03:04:05Z")).unwrap();
        let uuid = || "00000000-0000-4000-8000-000000000001".to_string();
        webhook(
            &request,
            &Context {
                config: &config,
                service_accounts: &accounts,
                now,
                new_uuid: &uuid,
            },
        )
    }

    fn causes(response: &Response) -> Vec<(String, String, String)> {
        response
            .result
            .iter()
            .flat_map(|s| s.details.iter().flat_map(|d| d.causes.iter()))
            .map(|c| (c.kind.clone(), c.field.clone(), c.message.clone()))
            .collect()
    }

    #[test]
    fn host_disk_is_refused_without_the_gate_with_kubevirts_message() {
        let create = request("CREATE", VMIS, vmi(with_host_disk(vmi_spec())), None);
        let refused = judge(validate_vmi_create, create.clone(), "", true);
        assert!(!refused.allowed);
        let Some(Status {
            code,
            reason,
            message,
            ..
        }) = refused.result.clone()
        else {
            panic!("no status: {refused:?}")
        };
        assert_eq!((code, reason.as_str()), (422, "Invalid"));
        assert_eq!(message, "HostDisk feature gate is not enabled");
        assert_eq!(
            causes(&refused),
            [(
                FIELD_VALUE_INVALID.to_string(),
                "spec.volumes[1]".to_string(),
                "HostDisk feature gate is not enabled".to_string()
            )]
        );
        assert_eq!(
            judge(validate_vmi_create, create, "HostDisk", true),
            Response::allowed()
        );
        let plain = request("CREATE", VMIS, vmi(vmi_spec()), None);
        assert_eq!(
            judge(validate_vmi_create, plain, "", true),
            Response::allowed()
        );
    }

    #[test]
    fn what_the_launcher_cannot_run_is_refused_naming_the_field() {
        let mut spec = vmi_spec();
        spec["domain"]["machine"] = json!({"type": "pc-i440fx"});
        let refused = judge(
            validate_vmi_create,
            request("CREATE", VMIS, vmi(spec.clone()), None),
            "",
            true,
        );
        let found = causes(&refused);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(found[0].0, FIELD_VALUE_NOT_SUPPORTED);
        assert_eq!(found[0].1, "spec.domain.machine.type");
        assert!(
            found[0].2.starts_with("spec.domain.machine.type: "),
            "{found:?}"
        );
        // Gates and runnability together: every cause is listed.
        let both = judge(
            validate_vmi_create,
            request("CREATE", VMIS, vmi(with_host_disk(spec)), None),
            "",
            true,
        );
        let fields: Vec<String> = causes(&both).into_iter().map(|c| c.1).collect();
        assert_eq!(fields, ["spec.volumes[1]", "spec.domain.machine.type"]);
    }

    #[test]
    fn reserved_labels_only_from_kubevirt() {
        let mut object = vmi(vmi_spec());
        object["metadata"]["labels"] = json!({"kubevirt.io/nodeName": "n1"});
        let create = request("CREATE", VMIS, object, None);
        let refused = judge(validate_vmi_create, create.clone(), "", true);
        assert_eq!(causes(&refused)[0].1, "metadata.labels");
        assert!(judge(validate_vmi_create, create, "", false).allowed);
    }

    #[test]
    fn a_vmis_spec_changes_only_through_kubevirt() {
        let old = vmi(vmi_spec());
        let mut new = old.clone();
        new["spec"]["domain"]["memory"]["guest"] = json!("256Mi");
        let update = request("UPDATE", VMIS, new, Some(old.clone()));
        let refused = judge(validate_vmi_update, update.clone(), "", true);
        assert_eq!(
            refused.result.unwrap().message,
            "update of VMI object is restricted"
        );
        assert!(judge(validate_vmi_update, update, "", false).allowed);
        // Metadata and status changes pass; null and empty lists are the same spec.
        let mut relabelled = old.clone();
        relabelled["metadata"]["labels"] = json!({"app": "x"});
        relabelled["spec"]["networks"] = json!([]);
        let update = request("UPDATE", VMIS, relabelled, Some(old.clone()));
        assert!(judge(validate_vmi_update, update, "", true).allowed);
        // A reserved label changed by a user.
        let mut reserved = old.clone();
        reserved["metadata"]["labels"] = json!({"kubevirt.io/schedulable": "true"});
        let update = request("UPDATE", VMIS, reserved, Some(old));
        assert!(!judge(validate_vmi_update, update, "", true).allowed);
    }

    #[test]
    fn a_vms_template_is_judged_as_a_new_vmi_with_template_paths() {
        let create = request("CREATE", VMS, vm(with_host_disk(vmi_spec())), None);
        let refused = judge(validate_vm, create.clone(), "", true);
        assert_eq!(
            causes(&refused),
            [(
                FIELD_VALUE_INVALID.to_string(),
                "spec.template.spec.volumes[1]".to_string(),
                "HostDisk feature gate is not enabled".to_string()
            )]
        );
        assert!(judge(validate_vm, create, "HostDisk", true).allowed);

        let mut unrunnable = vmi_spec();
        unrunnable["domain"]["machine"] = json!({"type": "pc-i440fx"});
        let object = vm(unrunnable);
        let refused = judge(
            validate_vm,
            request("CREATE", VMS, object.clone(), None),
            "",
            true,
        );
        let found = causes(&refused);
        assert_eq!(found[0].1, "spec.template.spec.domain.machine.type");
        assert!(
            found[0]
                .2
                .starts_with("spec.template.spec.domain.machine.type: "),
            "{found:?}"
        );
        // Stored before virt-api: an update that leaves the template alone passes.
        let mut stopped = object.clone();
        stopped["spec"]["runStrategy"] = json!("Halted");
        let update = request("UPDATE", VMS, stopped, Some(object));
        assert!(judge(validate_vm, update, "", true).allowed);
    }

    #[test]
    fn a_vms_run_strategy() {
        let mut both = vm(vmi_spec());
        both["spec"]["running"] = json!(true);
        let refused = judge(validate_vm, request("CREATE", VMS, both, None), "", true);
        assert_eq!(causes(&refused)[0].1, "spec.running");
        let mut neither = vm(vmi_spec());
        neither["spec"]
            .as_object_mut()
            .unwrap()
            .remove("runStrategy");
        let refused = judge(validate_vm, request("CREATE", VMS, neither, None), "", true);
        assert_eq!(causes(&refused)[0].2, "RunStrategy must be specified");
        let mut running = vm(vmi_spec());
        running["spec"]
            .as_object_mut()
            .unwrap()
            .remove("runStrategy");
        running["spec"]["running"] = json!(false);
        let allowed = judge(validate_vm, request("CREATE", VMS, running, None), "", true);
        assert!(allowed.allowed);
        assert_eq!(allowed.warnings.len(), 1);
    }

    #[test]
    fn a_new_vmi_gets_the_stored_defaults_as_one_patch() {
        let created = judge(
            mutate_vmi,
            request("CREATE", VMIS, vmi(vmi_spec()), None),
            "",
            true,
        );
        assert!(created.allowed);
        let ops = created.patch_operations().expect("a JSON patch");
        let paths: Vec<&str> = ops.iter().map(|o| o["path"].as_str().unwrap()).collect();
        assert_eq!(paths, ["/spec", "/metadata", "/status"]);
        let kinds: Vec<&str> = ops.iter().map(|o| o["op"].as_str().unwrap()).collect();
        assert_eq!(kinds, ["replace", "replace", "add"]);
        let (spec, metadata, status) = (&ops[0]["value"], &ops[1]["value"], &ops[2]["value"]);
        assert_eq!(spec["architecture"], "amd64");
        assert_eq!(spec["domain"]["machine"]["type"], "q35");
        assert_eq!(spec["domain"]["cpu"]["model"], "host-model");
        assert_eq!(spec["evictionStrategy"], "None");
        assert_eq!(
            metadata["annotations"]["kubevirt.io/pci-topology-version"],
            "v3"
        );
        assert_eq!(
            metadata["finalizers"],
            json!([well_known::FOREGROUND_DELETE_FINALIZER])
        );
        assert_eq!(status["phase"], "Pending");
        // The patch applies to the object the API server holds.
        let mut object = vmi(vmi_spec());
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
        // Applying the defaults again changes nothing.
        let again = judge(
            mutate_vmi,
            request("CREATE", VMIS, object.clone(), None),
            "",
            true,
        );
        let ops = again.patch_operations().unwrap();
        assert_eq!(ops[0]["value"], object["spec"]);
    }

    #[test]
    fn a_users_status_change_is_undone() {
        let mut old = vmi(vmi_spec());
        old["status"] = json!({"phase": "Running"});
        let mut new = old.clone();
        new["status"]["phase"] = json!("Failed");
        let update = request("UPDATE", VMIS, new, Some(old));
        let undone = judge(mutate_vmi, update.clone(), "", true);
        assert_eq!(
            undone.patch_operations().unwrap(),
            [json!({"op": "replace", "path": "/status", "value": {"phase": "Running"}})]
        );
        assert_eq!(judge(mutate_vmi, update, "", false), Response::allowed());
    }

    #[test]
    fn a_new_vm_gets_its_templates_defaults() {
        let created = judge(
            mutate_vm,
            request("CREATE", VMS, vm(vmi_spec()), None),
            "",
            true,
        );
        let ops = created.patch_operations().unwrap();
        let template = &ops[0]["value"]["template"]["spec"];
        assert_eq!(template["architecture"], "amd64");
        assert_eq!(template["domain"]["machine"]["type"], "q35");
    }

    /// What the webhooks cannot read is answered 400 with the reason, never a panic.
    #[test]
    fn malformed_requests_are_errors() {
        let error = |response: Response| {
            assert!(!response.allowed);
            let status = response.result.expect("a status");
            assert_eq!(status.code, 400);
            status.message
        };
        let wrong = request("CREATE", "pods", vmi(vmi_spec()), None);
        assert_eq!(
            error(judge(validate_vmi_create, wrong, "", true)),
            "expect resource to be 'virtualmachineinstances'"
        );
        let mut no_object = request("CREATE", VMIS, json!(null), None);
        no_object.object = None;
        assert_eq!(
            error(judge(validate_vmi_create, no_object, "", true)),
            "the request has no object"
        );
        let bad = request("CREATE", VMIS, json!({"spec": "not an object"}), None);
        assert!(!error(judge(mutate_vmi, bad, "", true)).is_empty());
        let no_old = request("UPDATE", VMIS, vmi(vmi_spec()), None);
        assert_eq!(
            error(judge(validate_vmi_update, no_old, "", true)),
            "the request has no object"
        );
        let bad_vm = request("CREATE", VMS, json!([1, 2]), None);
        assert!(!error(judge(validate_vm, bad_vm.clone(), "", true)).is_empty());
        assert!(!error(judge(mutate_vm, bad_vm, "", true)).is_empty());
    }

    #[test]
    fn paths_in_a_template() {
        assert_eq!(
            in_template("spec.volumes[0]: spec.volumes[0].x is bad"),
            "spec.template.spec.volumes[0]: spec.template.spec.volumes[0].x is bad"
        );
        assert_eq!(
            in_template("metadata.annotations"),
            "spec.template.metadata.annotations"
        );
        assert_eq!(in_template("nospec.x, a.spec.y"), "nospec.x, a.spec.y");
        assert_eq!(
            in_template("ünïcode spec.x"),
            "ünïcode spec.template.spec.x"
        );
    }
}
