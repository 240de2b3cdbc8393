//! The `VirtualMachineInstanceMigration` webhooks: KubeVirt v1.9.0's
//! `migration-create-mutator.go`, `migration-create-admitter.go` and
//! `migration-update-admitter.go`, with their rules, order and messages.
//!
//! - [`mutate_create`] (`/migration-mutate-create`): the label `kubevirt.io/vmi-name` (how the
//!   controller and the admitter find a VMI's migrations) and the finalizer
//!   `kubevirt.io/migrationJobFinalize`, as one JSON patch replacing `/metadata`.
//! - [`validate_create`] (`/migration-validate-create`): `spec.vmiName` required, `spec.priority`
//!   only from KubeVirt's controller, the VMI must exist, not be final nor `LiveMigratable=False`,
//!   and have no other migration in flight; the decentralized kind needs its feature gate.
//!   It reads the cluster ([`Cluster`]): one GET of the VMI, one LIST of the namespace's
//!   migrations of that VMI, as v1.9.0 does (no cache: a migration created a moment ago counts).
//! - [`validate_update`] (`/migration-validate-update`): the spec never changes, and the
//!   selector label stays while the migration is in flight.
//!
//! v1.9.0 also checks the object against its OpenAPI schema (`ValidateSchema`: unknown fields
//! refused, "… in body is a forbidden property"); here unknown fields are ignored, as for VMIs.

use crate::admit::{Context, GROUP, VERSIONS, set};
use crate::cluster::{Cluster, MIGRATION_SELECTOR_LABEL};
use crate::review::{
    Cause, FIELD_VALUE_FORBIDDEN, FIELD_VALUE_INVALID, FIELD_VALUE_NOT_SUPPORTED,
    FIELD_VALUE_REQUIRED, Request, Response,
};
use kube::api::ObjectMeta;
use proto::kubevirt::VirtualMachineInstanceMigrationSpec;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use std::collections::BTreeMap;

/// The resource (`webhooks.MigrationGroupVersionResource`).
pub const MIGRATIONS: &str = "virtualmachineinstancemigrations";
/// `v1.VirtualMachineInstanceMigrationFinalizer`.
pub const FINALIZER: &str = "kubevirt.io/migrationJobFinalize";
/// `v1.VirtualMachineInstanceIsMigratable`.
pub const LIVE_MIGRATABLE: &str = "LiveMigratable";
/// `v1.VirtualMachineInstanceReasonDisksNotMigratable`.
const DISKS_NOT_LIVE_MIGRATABLE: &str = "DisksNotLiveMigratable";
/// The feature gate of `spec.sendTo` and `spec.receive`.
const DECENTRALIZED_LIVE_MIGRATION: &str = "DecentralizedLiveMigration";
/// `components.ControllerServiceAccountName`, and this project's controller's account.
const CONTROLLER_ACCOUNTS: &[&str] = &["kubevirt-controller", "virt-controller"];

/// `spec.sendTo` (`VirtualMachineInstanceMigrationSource`).
#[derive(Deserialize, Debug, Default, Clone, PartialEq, Eq)]
struct SendTo {
    #[serde(default, rename = "migrationID")]
    migration_id: Option<String>,
    #[serde(default, rename = "connectURL")]
    connect_url: Option<String>,
}

/// `spec.receive` (`VirtualMachineInstanceMigrationTarget`).
#[derive(Deserialize, Debug, Default, Clone, PartialEq, Eq)]
struct Receive {
    #[serde(default, rename = "migrationID")]
    migration_id: Option<String>,
}

/// A migration as the webhooks read it (Go's decoding: what the type does not know is
/// dropped, a missing or null value is the zero value).
#[derive(Debug, Default, Clone)]
struct Migration {
    metadata: ObjectMeta,
    spec: VirtualMachineInstanceMigrationSpec,
    send_to: Option<SendTo>,
    receive: Option<Receive>,
    /// `status.phase`, `""` without one.
    phase: String,
}

/// The spec as Go's `equality.Semantic.DeepEqual` compares it: the fields of the Go type,
/// a missing string the empty one, an empty map a missing one.
#[derive(Debug, PartialEq)]
struct ComparableSpec<'a> {
    vmi_name: &'a str,
    added_node_selector: Option<&'a BTreeMap<String, String>>,
    send_to: Option<(&'a str, &'a str)>,
    receive: Option<&'a str>,
    priority: Option<&'a str>,
}

impl Migration {
    fn vmi_name(&self) -> &str {
        self.spec.vmi_name.as_deref().unwrap_or_default()
    }

    fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }

    /// `IsDecentralized`: one of `sendTo` and `receive`, not both.
    fn is_decentralized(&self) -> bool {
        self.send_to.is_some() != self.receive.is_some()
    }

    fn comparable(&self) -> ComparableSpec<'_> {
        ComparableSpec {
            vmi_name: self.vmi_name(),
            added_node_selector: self
                .spec
                .added_node_selector
                .as_ref()
                .filter(|m| !m.is_empty()),
            send_to: self.send_to.as_ref().map(|s| {
                (
                    s.migration_id.as_deref().unwrap_or_default(),
                    s.connect_url.as_deref().unwrap_or_default(),
                )
            }),
            receive: self
                .receive
                .as_ref()
                .map(|r| r.migration_id.as_deref().unwrap_or_default()),
            priority: self.spec.priority.as_deref(),
        }
    }

    fn selector_label(labels: Option<&BTreeMap<String, String>>) -> Option<&str> {
        labels?.get(MIGRATION_SELECTOR_LABEL).map(String::as_str)
    }
}

/// The migration of `object` (the error is the 400 answer's message).
fn decode(object: Option<&Value>) -> Result<Migration, String> {
    #[derive(Deserialize)]
    struct Raw {
        #[serde(default)]
        metadata: Option<ObjectMeta>,
        #[serde(default)]
        spec: Option<VirtualMachineInstanceMigrationSpec>,
        #[serde(default)]
        status: Option<Value>,
    }
    let object = object.ok_or("the request has no object")?;
    let raw: Raw = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let spec = raw.spec.unwrap_or_default();
    fn part<T: DeserializeOwned>(
        spec: &VirtualMachineInstanceMigrationSpec,
        key: &str,
    ) -> Result<Option<T>, String> {
        match spec.extra.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(value) => serde_json::from_value(value.clone())
                .map(Some)
                .map_err(|e| format!("spec.{key}: {e}")),
        }
    }
    let send_to = part(&spec, "sendTo")?;
    let receive = part(&spec, "receive")?;
    let phase = match raw.status.as_ref().and_then(|s| s.get("phase")) {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(phase)) => phase.clone(),
        Some(other) => return Err(format!("status.phase: not a string: {other}")),
    };
    Ok(Migration {
        metadata: raw.metadata.unwrap_or_default(),
        spec,
        send_to,
        receive,
        phase,
    })
}

/// `ValidateRequestResource` for migrations.
fn is_migrations(request: &Request) -> bool {
    let r = &request.resource;
    r.group == GROUP && r.resource == MIGRATIONS && VERSIONS.contains(&r.version.as_str())
}

/// `getAdmissionReviewMigration`: the new migration and, for an update, the old one.
fn objects(request: &Request) -> Result<(Migration, Option<Migration>), String> {
    if !is_migrations(request) {
        // v1.9.0 prints the GroupVersionResource struct here.
        return Err(format!(
            "expect resource to be '{{{GROUP} v1 {MIGRATIONS}}}'"
        ));
    }
    let new = decode(request.object.as_ref())?;
    let old = if request.operation == "UPDATE" {
        Some(decode(request.old_object.as_ref())?)
    } else {
        None
    };
    Ok((new, old))
}

fn is_final(phase: &str) -> bool {
    phase == "Succeeded" || phase == "Failed"
}

/// `/migration-mutate-create` (`migrations-mutator.kubevirt.io`, CREATE): the label
/// `kubevirt.io/vmi-name=<spec.vmiName>` and the finalizer `kubevirt.io/migrationJobFinalize`
/// (appended, as v1.9.0 does), as one patch replacing `/metadata`.
pub fn mutate_create(request: &Request, _ctx: &Context) -> Response {
    if !is_migrations(request) {
        return Response::error(format!("expect resource to be '{MIGRATIONS}'"));
    }
    let mut migration = match decode(request.object.as_ref()) {
        Ok(migration) => migration,
        Err(message) => return Response::error(message),
    };
    let vmi_name = migration.vmi_name().to_string();
    let metadata = &mut migration.metadata;
    metadata
        .labels
        .get_or_insert_default()
        .insert(MIGRATION_SELECTOR_LABEL.into(), vmi_name);
    metadata
        .finalizers
        .get_or_insert_default()
        .push(FINALIZER.into());
    Response::patched(vec![set(
        request.object.as_ref(),
        "metadata",
        &migration.metadata,
    )])
}

/// `hasRequestOriginatedFromVirtController`: one of KubeVirt's service accounts, the
/// controller's.
fn from_controller(request: &Request, ctx: &Context) -> bool {
    let user = &request.user_info.username;
    ctx.is_kubevirt(request)
        && CONTROLLER_ACCOUNTS
            .iter()
            .any(|account| user.rsplit(':').next() == Some(*account))
}

/// `isMigratable`: a `LiveMigratable` condition with status `False` refuses (unless only
/// the disks are and the migration is decentralized); no condition passes.
fn not_migratable(
    vmi: &proto::kubevirt::VirtualMachineInstance,
    migration: &Migration,
) -> Option<String> {
    let conditions = vmi.status.as_ref().map(|s| s.conditions.as_slice());
    conditions
        .into_iter()
        .flatten()
        .filter(|c| c.condition_type == LIVE_MIGRATABLE && c.status == "False")
        .find(|c| {
            !(c.reason.as_deref() == Some(DISKS_NOT_LIVE_MIGRATABLE)
                && migration.is_decentralized())
        })
        .map(|c| {
            format!(
                "Cannot migrate VMI, Reason: {}, Message: {}",
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default()
            )
        })
}

/// `/migration-validate-create` (`migration-create-validator.kubevirt.io`, CREATE).
pub async fn validate_create(
    request: &Request,
    ctx: &Context<'_>,
    cluster: &impl Cluster,
) -> Response {
    let migration = match objects(request) {
        Ok((migration, _)) => migration,
        Err(message) => return Response::error(message),
    };
    if migration.vmi_name().is_empty() {
        return Response::refused(vec![Cause::new(
            FIELD_VALUE_REQUIRED,
            "vmiName is missing",
            "spec.vmiName",
        )]);
    }
    if migration.spec.priority.is_some() && !from_controller(request, ctx) {
        return Response::refused(vec![Cause::new(
            FIELD_VALUE_FORBIDDEN,
            "Migration priority queue, only virt-controller is allowed to set priority field",
            "spec.migrationPriority",
        )]);
    }
    // The API server puts the request's namespace into the object before admission.
    let namespace = match migration.namespace() {
        "" => request.namespace.as_deref().unwrap_or_default(),
        namespace => namespace,
    };
    let vmi_name = migration.vmi_name();
    let vmi = match cluster.vmi(namespace, vmi_name).await {
        Ok(Some(vmi)) => vmi,
        Ok(None) => {
            return Response::error(format!("the VMI \"{namespace}/{vmi_name}\" does not exist"));
        }
        Err(message) => return Response::error(message),
    };
    if vmi.phase().is_final() {
        return Response::error("Cannot migrate VMI in finalized state.");
    }
    if let Some(message) = not_migratable(&vmi, &migration) {
        return Response::error(message);
    }
    // `ensureNoMigrationConflict`: another migration of the VMI not yet final.
    match cluster.migrations_of(namespace, vmi_name).await {
        Err(message) => return Response::error(message),
        Ok(others) => {
            if let Some(active) = others.iter().find(|m| !is_final(&m.phase)) {
                return Response::error(format!(
                    "in-flight migration detected. Active migration job ({}) is currently already in progress for VMI {}.",
                    active.uid, active.vmi_name
                ));
            }
        }
    }
    if migration.send_to.is_some() || migration.receive.is_some() {
        if !ctx
            .config
            .feature_gates
            .enabled(DECENTRALIZED_LIVE_MIGRATION)
        {
            return Response::refused(vec![Cause::new(
                FIELD_VALUE_NOT_SUPPORTED,
                format!(
                    "{DECENTRALIZED_LIVE_MIGRATION} feature gate is not enabled in kubevirt resource"
                ),
                "",
            )]);
        }
        if let (Some(send_to), Some(receive)) = (&migration.send_to, &migration.receive)
            && send_to.migration_id != receive.migration_id
        {
            return Response::refused(vec![Cause::new(
                FIELD_VALUE_INVALID,
                format!(
                    "sendTo migrationID {} does not match receive migrationID {}",
                    send_to.migration_id.as_deref().unwrap_or_default(),
                    receive.migration_id.as_deref().unwrap_or_default()
                ),
                "",
            )]);
        }
    }
    Response::allowed()
}

/// `/migration-validate-update` (`migration-update-validator.kubevirt.io`, UPDATE): the spec
/// never changes (by anyone), and an in-flight migration keeps its selector label.
pub fn validate_update(request: &Request, _ctx: &Context) -> Response {
    let (new, old) = match objects(request) {
        Ok((new, Some(old))) => (new, old),
        Ok((_, None)) => return Response::error("the request has no old object"),
        Err(message) => return Response::error(message),
    };
    if new.comparable() != old.comparable() {
        return Response::refused(vec![Cause::new(
            FIELD_VALUE_NOT_SUPPORTED,
            "update of Migration object's spec is restricted",
            "",
        )]);
    }
    // `ensureSelectorLabelSafe`.
    if !is_final(&new.phase)
        && let Some(old_label) = Migration::selector_label(old.metadata.labels.as_ref())
    {
        let message = match &new.metadata.labels {
            None => Some("selector label can't be removed from an in-flight migration"),
            Some(labels) if Migration::selector_label(Some(labels)) != Some(old_label) => {
                Some("selector label can't be modified on an in-flight migration")
            }
            Some(_) => None,
        };
        if let Some(message) = message {
            return Response::refused(vec![Cause::new(FIELD_VALUE_NOT_SUPPORTED, message, "")]);
        }
    }
    Response::allowed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::service_accounts;
    use crate::cluster::ListedMigration;
    use crate::cluster::fake::Fake;
    use controller::template::TemplateConfig;
    use futures::executor::block_on;
    use pretty_assertions::assert_eq;
    use proto::contract::feature_gates::FeatureGates;
    use proto::kubevirt::VirtualMachineInstance;
    use serde_json::json;

    const USER: &str = "alice";
    const CONTROLLER: &str = "system:serviceaccount:kubevirt:kubevirt-controller";
    const OUR_CONTROLLER: &str = "system:serviceaccount:kubevirt:virt-controller";
    const HANDLER: &str = "system:serviceaccount:kubevirt:kubevirt-handler";

    fn vmim(spec: Value) -> Value {
        json!({"apiVersion": "kubevirt.io/v1", "kind": "VirtualMachineInstanceMigration",
               "metadata": {"name": "m", "namespace": "ns"}, "spec": spec})
    }

    fn request(operation: &str, object: Value, old: Option<Value>, user: &str) -> Request {
        serde_json::from_value(json!({
            "uid": "u", "operation": operation, "namespace": "ns", "name": "m",
            "resource": {"group": "kubevirt.io", "version": "v1", "resource": MIGRATIONS},
            "userInfo": {"username": user},
            "object": object, "oldObject": old,
        }))
        .unwrap()
    }

    /// A VMI `ns/v` in `phase` with `conditions`.
    fn vmi(phase: &str, conditions: Value) -> VirtualMachineInstance {
        serde_json::from_value(json!({
            "metadata": {"name": "v", "namespace": "ns"},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": phase, "conditions": conditions},
        }))
        .unwrap()
    }

    fn live_migratable(status: &str, reason: &str) -> Value {
        json!([{"type": "LiveMigratable", "status": status, "reason": reason,
                "message": "cannot migrate VMI which does not use masquerade"}])
    }

    fn other(uid: &str, phase: &str) -> (String, String, ListedMigration) {
        (
            "ns".into(),
            "v".into(),
            ListedMigration {
                uid: uid.into(),
                vmi_name: "v".into(),
                phase: phase.into(),
            },
        )
    }

    /// Runs `webhook` with the feature gates `gates`.
    fn with_context<T>(gates: &str, webhook: impl FnOnce(&Context) -> T) -> T {
        let config = TemplateConfig {
            feature_gates: FeatureGates::parse(gates),
            ..TemplateConfig::default()
        };
        let accounts = service_accounts("kubevirt");
        let uuid = || "00000000-0000-4000-8000-000000000001".to_string();
        webhook(&Context {
            config: &config,
            service_accounts: &accounts,
            now: serde_json::from_value(json!("2026-01-02T03:04:05Z")).unwrap(),
            new_uuid: &uuid,
        })
    }

    fn create(request: &Request, gates: &str, cluster: &Fake) -> Response {
        with_context(gates, |ctx| {
            block_on(validate_create(request, ctx, cluster))
        })
    }

    /// (code, message, causes as (type, field, message)).
    fn outcome(response: &Response) -> (u16, String, Vec<(String, String, String)>) {
        let status = response.result.clone().unwrap_or_default();
        let causes = status
            .details
            .iter()
            .flat_map(|d| d.causes.iter())
            .map(|c| (c.kind.clone(), c.field.clone(), c.message.clone()))
            .collect();
        (status.code, status.message, causes)
    }

    fn cause(kind: &str, field: &str, message: &str) -> (String, String, String) {
        (kind.into(), field.into(), message.into())
    }

    #[test]
    fn the_mutator_adds_the_selector_label_and_the_finalizer() {
        let mut object = vmim(json!({"vmiName": "v"}));
        object["metadata"]["labels"] = json!({"app": "x"});
        object["metadata"]["finalizers"] = json!(["example.com/keep"]);
        let response = with_context("", |ctx| {
            mutate_create(&request("CREATE", object.clone(), None, USER), ctx)
        });
        assert!(response.allowed);
        let ops = response.patch_operations().expect("a JSON patch");
        assert_eq!(
            ops,
            [json!({"op": "replace", "path": "/metadata", "value": {
                "name": "m", "namespace": "ns",
                "labels": {"app": "x", "kubevirt.io/vmi-name": "v"},
                "finalizers": ["example.com/keep", "kubevirt.io/migrationJobFinalize"],
            }})]
        );
        // The patch applies to the object the API server holds.
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
        json_patch::patch(&mut object, &patch).unwrap();
        assert_eq!(object["metadata"]["labels"]["kubevirt.io/vmi-name"], "v");

        // A bare migration: both added; v1.9.0 appends the finalizer even when it is there.
        let mut bare = vmim(json!({"vmiName": "v"}));
        bare["metadata"]["finalizers"] = json!([FINALIZER]);
        let response = with_context("", |ctx| {
            mutate_create(&request("CREATE", bare, None, USER), ctx)
        });
        let ops = response.patch_operations().unwrap();
        assert_eq!(
            ops[0]["value"]["labels"],
            json!({"kubevirt.io/vmi-name": "v"})
        );
        assert_eq!(ops[0]["value"]["finalizers"], json!([FINALIZER, FINALIZER]));

        // No vmiName: the label is empty (the validator refuses the migration).
        let response = with_context("", |ctx| {
            mutate_create(&request("CREATE", vmim(json!({})), None, USER), ctx)
        });
        let ops = response.patch_operations().unwrap();
        assert_eq!(
            ops[0]["value"]["labels"],
            json!({"kubevirt.io/vmi-name": ""})
        );
    }

    #[test]
    fn the_mutator_refuses_what_it_cannot_read() {
        let mut wrong = request("CREATE", vmim(json!({"vmiName": "v"})), None, USER);
        wrong.resource.resource = "pods".into();
        let response = with_context("", |ctx| mutate_create(&wrong, ctx));
        assert_eq!(
            outcome(&response).1,
            "expect resource to be 'virtualmachineinstancemigrations'"
        );
        for bad in [
            json!([1, 2]),
            json!({"spec": {"vmiName": 5}}),
            json!({"metadata": "x", "spec": {}}),
            json!({"spec": {"vmiName": "v", "sendTo": "x"}}),
        ] {
            let response = with_context("", |ctx| {
                mutate_create(&request("CREATE", bad.clone(), None, USER), ctx)
            });
            let (code, message, _) = outcome(&response);
            assert!(
                !response.allowed && code == 400 && !message.is_empty(),
                "{bad}: {response:?}"
            );
        }
        let mut none = request("CREATE", json!(null), None, USER);
        none.object = None;
        let response = with_context("", |ctx| mutate_create(&none, ctx));
        assert_eq!(outcome(&response).1, "the request has no object");
    }

    /// Every rule of the create admitter, in v1.9.0's order, with its answer.
    #[test]
    fn create_rules_and_messages() {
        let running = || vmi("Running", json!([]));
        let not_found = "the VMI \"ns/v\" does not exist";
        let finalized = "Cannot migrate VMI in finalized state.";
        let in_flight = "in-flight migration detected. Active migration job (uid-1) is currently already in progress for VMI v.";
        let not_migratable = "Cannot migrate VMI, Reason: InterfaceNotLiveMigratable, Message: cannot migrate VMI which does not use masquerade";
        let gate = "DecentralizedLiveMigration feature gate is not enabled in kubevirt resource";
        let send_to = json!({"migrationID": "id-1", "connectURL": "10.0.0.1:9185"});
        struct Row {
            what: &'static str,
            spec: Value,
            user: &'static str,
            gates: &'static str,
            vmis: Vec<VirtualMachineInstance>,
            others: Vec<(String, String, ListedMigration)>,
            errors: Vec<(&'static str, &'static str)>,
            /// (code, message, causes); code 0: allowed.
            expect: (u16, &'static str, Vec<(String, String, String)>),
        }
        let row = |what, spec: Value| Row {
            what,
            spec,
            user: USER,
            gates: "",
            vmis: vec![running()],
            others: vec![],
            errors: vec![],
            expect: (0, "", vec![]),
        };
        let refused =
            |message: &'static str, cause: (String, String, String)| (422, message, vec![cause]);
        let error = |message: &'static str| (400, message, vec![]);
        let rows = vec![
            row("a running VMI without conditions", json!({"vmiName": "v"})),
            Row {
                expect: refused(
                    "vmiName is missing",
                    cause(FIELD_VALUE_REQUIRED, "spec.vmiName", "vmiName is missing"),
                ),
                ..row(
                    "no vmiName (checked first)",
                    json!({"priority": "system-critical"}),
                )
            },
            Row {
                expect: refused(
                    "vmiName is missing",
                    cause(FIELD_VALUE_REQUIRED, "spec.vmiName", "vmiName is missing"),
                ),
                ..row("an empty vmiName", json!({"vmiName": ""}))
            },
            Row {
                vmis: vec![],
                expect: refused(
                    "Migration priority queue, only virt-controller is allowed to set priority field",
                    cause(
                        FIELD_VALUE_FORBIDDEN,
                        "spec.migrationPriority",
                        "Migration priority queue, only virt-controller is allowed to set priority field",
                    ),
                ),
                ..row(
                    "a user's priority (before the VMI is read)",
                    json!({"vmiName": "v", "priority": "user-triggered"}),
                )
            },
            Row {
                user: HANDLER,
                expect: refused(
                    "Migration priority queue, only virt-controller is allowed to set priority field",
                    cause(
                        FIELD_VALUE_FORBIDDEN,
                        "spec.migrationPriority",
                        "Migration priority queue, only virt-controller is allowed to set priority field",
                    ),
                ),
                ..row(
                    "another KubeVirt account's priority",
                    json!({"vmiName": "v", "priority": "system-critical"}),
                )
            },
            Row {
                user: CONTROLLER,
                ..row(
                    "KubeVirt's controller's priority",
                    json!({"vmiName": "v", "priority": "system-critical"}),
                )
            },
            Row {
                user: OUR_CONTROLLER,
                ..row(
                    "this project's controller's priority",
                    json!({"vmiName": "v", "priority": "system-maintenance"}),
                )
            },
            Row {
                vmis: vec![],
                expect: error(not_found),
                ..row("no such VMI", json!({"vmiName": "v"}))
            },
            Row {
                errors: vec![("vmi", "etcdserver: request timed out")],
                expect: error("etcdserver: request timed out"),
                ..row("the VMI cannot be read", json!({"vmiName": "v"}))
            },
            Row {
                vmis: vec![vmi("Succeeded", json!([]))],
                expect: error(finalized),
                ..row("a Succeeded VMI", json!({"vmiName": "v"}))
            },
            Row {
                vmis: vec![vmi(
                    "Failed",
                    live_migratable("False", "InterfaceNotLiveMigratable"),
                )],
                expect: error(finalized),
                ..row(
                    "a Failed VMI (before its conditions)",
                    json!({"vmiName": "v"}),
                )
            },
            row("a Pending VMI", json!({"vmiName": "v"})),
            Row {
                vmis: vec![vmi(
                    "Running",
                    live_migratable("False", "InterfaceNotLiveMigratable"),
                )],
                expect: error(not_migratable),
                ..row("LiveMigratable=False", json!({"vmiName": "v"}))
            },
            Row {
                vmis: vec![vmi("Running", live_migratable("True", ""))],
                ..row("LiveMigratable=True", json!({"vmiName": "v"}))
            },
            Row {
                vmis: vec![vmi("Running", live_migratable("Unknown", "x"))],
                ..row("LiveMigratable=Unknown", json!({"vmiName": "v"}))
            },
            Row {
                vmis: vec![vmi(
                    "Running",
                    live_migratable("False", "DisksNotLiveMigratable"),
                )],
                expect: error(
                    "Cannot migrate VMI, Reason: DisksNotLiveMigratable, Message: cannot migrate VMI which does not use masquerade",
                ),
                ..row("disks not migratable", json!({"vmiName": "v"}))
            },
            Row {
                vmis: vec![vmi(
                    "Running",
                    live_migratable("False", "DisksNotLiveMigratable"),
                )],
                gates: "DecentralizedLiveMigration",
                ..row(
                    "disks not migratable, decentralized",
                    json!({"vmiName": "v", "sendTo": send_to}),
                )
            },
            Row {
                others: vec![other("uid-0", "Succeeded"), other("uid-1", "Running")],
                expect: error(in_flight),
                ..row("another migration running", json!({"vmiName": "v"}))
            },
            Row {
                others: vec![other("uid-1", "")],
                expect: error(in_flight),
                ..row(
                    "another migration without a phase yet",
                    json!({"vmiName": "v"}),
                )
            },
            Row {
                others: vec![other("uid-1", "SomethingNew")],
                expect: error(in_flight),
                ..row(
                    "another migration in an unknown phase",
                    json!({"vmiName": "v"}),
                )
            },
            Row {
                others: vec![other("uid-0", "Succeeded"), other("uid-2", "Failed")],
                ..row("only finished migrations", json!({"vmiName": "v"}))
            },
            Row {
                others: vec![(
                    "elsewhere".into(),
                    "v".into(),
                    ListedMigration {
                        uid: "uid-9".into(),
                        vmi_name: "v".into(),
                        phase: "Running".into(),
                    },
                )],
                ..row("a migration of another namespace", json!({"vmiName": "v"}))
            },
            Row {
                errors: vec![(
                    "migrations",
                    "the server is currently unable to handle the request",
                )],
                expect: error("the server is currently unable to handle the request"),
                ..row("the migrations cannot be listed", json!({"vmiName": "v"}))
            },
            Row {
                expect: refused(gate, cause(FIELD_VALUE_NOT_SUPPORTED, "", gate)),
                ..row(
                    "sendTo without the gate",
                    json!({"vmiName": "v", "sendTo": send_to}),
                )
            },
            Row {
                expect: refused(gate, cause(FIELD_VALUE_NOT_SUPPORTED, "", gate)),
                ..row(
                    "receive without the gate",
                    json!({"vmiName": "v", "receive": {"migrationID": "id-1"}}),
                )
            },
            Row {
                gates: "DecentralizedLiveMigration",
                ..row(
                    "sendTo and receive of one migration, with the gate",
                    json!({"vmiName": "v", "sendTo": send_to, "receive": {"migrationID": "id-1"}}),
                )
            },
            Row {
                gates: "DecentralizedLiveMigration",
                expect: refused(
                    "sendTo migrationID id-1 does not match receive migrationID id-2",
                    cause(
                        FIELD_VALUE_INVALID,
                        "",
                        "sendTo migrationID id-1 does not match receive migrationID id-2",
                    ),
                ),
                ..row(
                    "sendTo and receive of two migrations",
                    json!({"vmiName": "v", "sendTo": send_to, "receive": {"migrationID": "id-2"}}),
                )
            },
            Row {
                spec: json!({"vmiName": "v", "sendTo": null, "receive": null}),
                ..row("null sendTo and receive", json!({}))
            },
        ];
        for row in rows {
            let cluster = Fake {
                vmis: row.vmis,
                migrations: row.others,
                errors: row
                    .errors
                    .iter()
                    .map(|(k, v)| (*k, v.to_string()))
                    .collect(),
                ..Default::default()
            };
            let response = create(
                &request("CREATE", vmim(row.spec), None, row.user),
                row.gates,
                &cluster,
            );
            let (code, message, causes) = row.expect;
            if code == 0 {
                assert_eq!(response, Response::allowed(), "{}", row.what);
            } else {
                assert!(!response.allowed, "{}", row.what);
                assert_eq!(
                    outcome(&response),
                    (code, message.to_string(), causes),
                    "{}",
                    row.what
                );
            }
        }
    }

    /// The VMI is read only once the request's own fields pass, the migrations only once the
    /// VMI does; both in the migration's namespace.
    #[test]
    fn create_reads_the_cluster_in_v190s_order() {
        let cluster = Fake {
            vmis: vec![vmi("Running", json!([]))],
            ..Default::default()
        };
        create(
            &request("CREATE", vmim(json!({})), None, USER),
            "",
            &cluster,
        );
        assert_eq!(cluster.calls(), Vec::<String>::new());
        create(
            &request("CREATE", vmim(json!({"vmiName": "v"})), None, USER),
            "",
            &cluster,
        );
        assert_eq!(cluster.calls(), ["vmi ns/v", "migrations ns/v"]);
        let finished = Fake {
            vmis: vec![vmi("Failed", json!([]))],
            ..Default::default()
        };
        create(
            &request("CREATE", vmim(json!({"vmiName": "v"})), None, USER),
            "",
            &finished,
        );
        assert_eq!(finished.calls(), ["vmi ns/v"]);
        // An object without a namespace: the request's.
        let mut bare = vmim(json!({"vmiName": "v"}));
        bare["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("namespace");
        let cluster = Fake::default();
        let response = create(&request("CREATE", bare, None, USER), "", &cluster);
        assert_eq!(outcome(&response).1, "the VMI \"ns/v\" does not exist");
    }

    #[test]
    fn create_refuses_what_it_cannot_read() {
        let cluster = Fake::default();
        let mut wrong = request("CREATE", vmim(json!({"vmiName": "v"})), None, USER);
        wrong.resource.group = "".into();
        assert_eq!(
            outcome(&create(&wrong, "", &cluster)),
            (
                400,
                "expect resource to be '{kubevirt.io v1 virtualmachineinstancemigrations}'".into(),
                vec![]
            )
        );
        for bad in [
            json!("a string"),
            json!({"spec": {"vmiName": ["v"]}}),
            json!({"spec": {"vmiName": "v", "priority": 1}}),
            json!({"spec": {"vmiName": "v", "receive": [1]}}),
            json!({"spec": {"vmiName": "v"}, "status": {"phase": 3}}),
        ] {
            let response = create(&request("CREATE", bad.clone(), None, USER), "", &cluster);
            let (code, message, _) = outcome(&response);
            assert!(
                !response.allowed && code == 400 && !message.is_empty(),
                "{bad}: {response:?}"
            );
        }
        assert!(cluster.calls().is_empty(), "{:?}", cluster.calls());
    }

    fn update(new: Value, old: Value, user: &str) -> Response {
        with_context("", |ctx| {
            validate_update(&request("UPDATE", new, Some(old), user), ctx)
        })
    }

    #[test]
    fn update_rules_and_messages() {
        let spec_restricted = (
            422,
            "update of Migration object's spec is restricted".to_string(),
            vec![cause(
                FIELD_VALUE_NOT_SUPPORTED,
                "",
                "update of Migration object's spec is restricted",
            )],
        );
        let removed = "selector label can't be removed from an in-flight migration";
        let modified = "selector label can't be modified on an in-flight migration";
        let label_refused = |message: &str| {
            (
                422,
                message.to_string(),
                vec![cause(FIELD_VALUE_NOT_SUPPORTED, "", message)],
            )
        };
        let mut old = vmim(json!({"vmiName": "v", "addedNodeSelector": {"zone": "a"}}));
        old["metadata"]["labels"] = json!({"kubevirt.io/vmi-name": "v", "app": "x"});
        old["metadata"]["finalizers"] = json!([FINALIZER]);
        old["status"] = json!({"phase": "Running"});
        let changed = |change: &dyn Fn(&mut Value)| {
            let mut new = old.clone();
            change(&mut new);
            new
        };

        // Unchanged, or only metadata and status: allowed.
        assert!(update(old.clone(), old.clone(), USER).allowed);
        let finalized = changed(&|m| {
            m["metadata"]["finalizers"] = json!([]);
            m["status"]["phase"] = json!("Succeeded");
        });
        assert!(update(finalized, old.clone(), USER).allowed);
        // What Go's decoding cannot tell apart.
        let same = changed(&|m| {
            m["spec"]["extra"] = json!("unknown to v1.9.0's type");
            m["spec"]["priority"] = json!(null);
        });
        assert!(update(same, old.clone(), USER).allowed);
        let mut no_selector = old.clone();
        no_selector["spec"]
            .as_object_mut()
            .unwrap()
            .remove("addedNodeSelector");
        let empty_selector = changed(&|m| m["spec"]["addedNodeSelector"] = json!({}));
        assert!(update(empty_selector, no_selector, USER).allowed);

        // The spec: by nobody, KubeVirt's controller included.
        for (what, change) in [
            (
                "vmiName",
                &(|m: &mut Value| m["spec"]["vmiName"] = json!("w")) as &dyn Fn(&mut Value),
            ),
            ("priority added", &|m| {
                m["spec"]["priority"] = json!("system-critical")
            }),
            ("empty priority added", &|m| {
                m["spec"]["priority"] = json!("")
            }),
            ("selector", &|m| {
                m["spec"]["addedNodeSelector"]["zone"] = json!("b")
            }),
            ("sendTo", &|m| {
                m["spec"]["sendTo"] = json!({"migrationID": "x"})
            }),
            ("receive", &|m| m["spec"]["receive"] = json!({})),
        ] {
            for user in [USER, CONTROLLER] {
                assert_eq!(
                    outcome(&update(changed(change), old.clone(), user)),
                    spec_restricted,
                    "{what} by {user}"
                );
            }
        }

        // The selector label of a migration in flight.
        let no_labels = changed(&|m| {
            m["metadata"].as_object_mut().unwrap().remove("labels");
        });
        assert_eq!(
            outcome(&update(no_labels.clone(), old.clone(), CONTROLLER)),
            label_refused(removed)
        );
        let without = changed(&|m| m["metadata"]["labels"] = json!({"app": "x"}));
        assert_eq!(
            outcome(&update(without, old.clone(), USER)),
            label_refused(modified)
        );
        let emptied = changed(&|m| m["metadata"]["labels"] = json!({}));
        assert_eq!(
            outcome(&update(emptied, old.clone(), USER)),
            label_refused(modified)
        );
        let relabelled = changed(&|m| m["metadata"]["labels"]["kubevirt.io/vmi-name"] = json!("w"));
        assert_eq!(
            outcome(&update(relabelled.clone(), old.clone(), USER)),
            label_refused(modified)
        );
        // Other labels change freely; once final, the selector label too.
        let other_label = changed(&|m| m["metadata"]["labels"]["app"] = json!("y"));
        assert!(update(other_label, old.clone(), USER).allowed);
        let mut done = no_labels.clone();
        done["status"]["phase"] = json!("Failed");
        assert!(update(done, old.clone(), USER).allowed);
        // The old migration had no selector label: nothing to keep.
        let mut unlabelled = old.clone();
        unlabelled["metadata"]["labels"] = json!({"app": "x"});
        assert!(update(relabelled, unlabelled, USER).allowed);
    }

    #[test]
    fn update_refuses_what_it_cannot_read() {
        let object = vmim(json!({"vmiName": "v"}));
        let mut no_old = request("UPDATE", object.clone(), None, USER);
        no_old.old_object = None;
        let response = with_context("", |ctx| validate_update(&no_old, ctx));
        assert_eq!(outcome(&response).1, "the request has no object");
        let as_create = request("CREATE", object.clone(), Some(object.clone()), USER);
        let response = with_context("", |ctx| validate_update(&as_create, ctx));
        assert_eq!(outcome(&response).1, "the request has no old object");
        let response = update(object.clone(), json!({"spec": 7}), USER);
        assert_eq!(outcome(&response).0, 400);
        let mut wrong = request("UPDATE", object.clone(), Some(object), USER);
        wrong.resource.version = "v2".into();
        let response = with_context("", |ctx| validate_update(&wrong, ctx));
        assert_eq!(
            outcome(&response).1,
            "expect resource to be '{kubevirt.io v1 virtualmachineinstancemigrations}'"
        );
    }
}
