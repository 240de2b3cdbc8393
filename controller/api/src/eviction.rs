//! The pod-eviction webhook (`/pod-eviction-validate`): KubeVirt v1.9.0's
//! `pod-eviction-admitter.go`, its order and messages.
//!
//! An Eviction of a virt-launcher pod that is not completed, whose VMI has an eviction
//! strategy (the VMI's `spec.evictionStrategy`, else the `KubeVirt` CR's), is turned into an
//! evacuation: the VMI is marked (`status.evacuationNodeName` = the pod's node, and
//! `kubevirt.io/eviction-source: descheduler` when the descheduler asks) and the eviction
//! is denied with code 429, which `kubectl drain` retries until the migration has moved the
//! VMI and the pod is gone. By strategy:
//!
//! | strategy | migratable (`LiveMigratable=True`) | not migratable |
//! |---|---|---|
//! | `LiveMigrate` | marked, denied | denied: `VMI <name> is configured with an eviction strategy but is not live-migratable` |
//! | `LiveMigrateIfPossible` | marked, denied | allowed |
//! | `External` | marked, denied | marked, denied |
//! | `None`, none, other | allowed | allowed |
//!
//! Before marking: a VMI already marked is denied `Evacuation in progress: Eviction triggered
//! evacuation of VMI "<ns>/<name>"`, and a pod on another node than the VMI's (a migration's
//! target pod) `Eviction request for target Pod`. A marked VMI is denied `Eviction triggered
//! evacuation of VMI "<ns>/<name>"` (the descheduler reads this text). A dry-run eviction
//! marks in a dry run. A hotplug-volume pod of a launcher whose VMI exists is never evicted.
//! A pod that cannot be read is let go (v1.9.0: the pod disruption budget still guards it).

use crate::admit::Context;
use crate::cluster::{Cluster, not_found};
use crate::migration::LIVE_MIGRATABLE;
use crate::review::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::policy::v1::Eviction;
use proto::kubevirt::VirtualMachineInstance;
use proto::kubevirt::well_known::{APP_LABEL, APP_LABEL_LAUNCHER, DOMAIN_ANNOTATION};

/// The label value of hotplug-volume attachment pods.
const HOTPLUG_DISK: &str = "hotplug-disk";
/// The annotation the descheduler sets on its Eviction requests, and its value.
const REQUESTED_BY: &str = "requested-by";
const DESCHEDULER: &str = "sigs.k8s.io/descheduler";
/// `errors.NewNotFound`'s resource name of VMIs.
const VMI_RESOURCE: &str = "virtualmachineinstances.kubevirt.io";

fn label<'a>(pod: &'a Pod, key: &str) -> Option<&'a str> {
    pod.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

fn is_launcher(pod: &Pod) -> bool {
    label(pod, APP_LABEL) == Some(APP_LABEL_LAUNCHER)
}

/// `isHotplugPod`: labelled `kubevirt.io=hotplug-disk`, with exactly one owner.
fn is_hotplug(pod: &Pod) -> bool {
    label(pod, APP_LABEL) == Some(HOTPLUG_DISK)
        && pod.metadata.owner_references.as_ref().map(Vec::len) == Some(1)
}

/// `isCompleted`: the pod has `Succeeded` or `Failed`.
fn is_completed(pod: &Pod) -> bool {
    matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

fn domain(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()?
        .get(DOMAIN_ANNOTATION)
        .map(String::as_str)
}

fn node_name(pod: &Pod) -> &str {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default()
}

/// `IsMigratable`: `LiveMigratable=True`.
fn is_migratable(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .iter()
        .flat_map(|s| &s.conditions)
        .any(|c| c.condition_type == LIVE_MIGRATABLE && c.status == "True")
}

/// `IsMarkedForEviction`: `status.evacuationNodeName` set.
fn is_marked(vmi: &VirtualMachineInstance) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.extra.get("evacuationNodeName"))
        .and_then(|v| v.as_str())
        .is_some_and(|node| !node.is_empty())
}

/// `/pod-eviction-validate` (`virt-launcher-eviction-interceptor.kubevirt.io`,
/// `hotplug-pod-eviction-interceptor.kubevirt.io`).
pub async fn validate(request: &Request, ctx: &Context<'_>, cluster: &impl Cluster) -> Response {
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let name = request.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        // v1.9.0's GET of no name fails: allowed.
        return Response::allowed();
    }
    let Ok(Some(pod)) = cluster.pod(namespace, name).await else {
        return Response::allowed();
    };
    if is_hotplug(&pod) {
        hotplug(&pod, cluster).await
    } else if is_launcher(&pod) && !is_completed(&pod) {
        launcher(request, ctx, cluster, &pod).await
    } else {
        Response::allowed()
    }
}

/// `admitHotplugPod`: never evicted while its launcher's VMI exists.
async fn hotplug(pod: &Pod, cluster: &impl Cluster) -> Response {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or_default();
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    let owner = pod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .next()
        .map(|o| o.name.as_str())
        .unwrap_or_default();
    let owner = match cluster.pod(namespace, owner).await {
        Ok(Some(owner)) => owner,
        Ok(None) => return Response::allowed(),
        Err(e) => {
            return Response::denied(format!("failed getting owner for hotplug pod: {e}"));
        }
    };
    if !is_launcher(&owner) || is_completed(&owner) {
        return Response::allowed();
    }
    let Some(vmi_name) = domain(&owner) else {
        return Response::allowed();
    };
    match cluster.vmi(namespace, vmi_name).await {
        Ok(Some(_)) => Response::denied(format!(
            "cannot evict hotplug pod: {pod_name} associated with running vmi: {vmi_name} in namespace {namespace}"
        )),
        Ok(None) => Response::allowed(),
        Err(e) => Response::denied(format!("kubevirt failed getting the vmi: {e}")),
    }
}

/// `admitLauncherPod`.
async fn launcher(
    request: &Request,
    ctx: &Context<'_>,
    cluster: &impl Cluster,
    pod: &Pod,
) -> Response {
    let Some(vmi_name) = domain(pod) else {
        return Response::allowed();
    };
    let namespace = request.namespace.as_deref().unwrap_or_default();
    let vmi = match cluster.vmi(namespace, vmi_name).await {
        Ok(Some(vmi)) => vmi,
        Ok(None) => {
            return Response::denied(format!(
                "kubevirt failed getting the vmi: {}",
                not_found(VMI_RESOURCE, vmi_name)
            ));
        }
        Err(e) => return Response::denied(format!("kubevirt failed getting the vmi: {e}")),
    };
    // `VMIEvictionStrategy`: the VMI's, else the cluster's.
    let strategy = vmi
        .spec
        .eviction_strategy
        .as_deref()
        .or(ctx.config.eviction_strategy.as_deref());
    let vmi_label = vmi.metadata.name.as_deref().unwrap_or(vmi_name);
    let mark = match strategy {
        Some("LiveMigrate") => {
            if !is_migratable(&vmi) {
                return Response::denied(format!(
                    "VMI {vmi_label} is configured with an eviction strategy but is not live-migratable"
                ));
            }
            true
        }
        Some("LiveMigrateIfPossible") => is_migratable(&vmi),
        Some("External") => true,
        _ => false,
    };
    if !mark {
        return Response::allowed();
    }
    let vmi_namespace = vmi.metadata.namespace.as_deref().unwrap_or(namespace);
    let evacuation =
        format!("Eviction triggered evacuation of VMI \"{vmi_namespace}/{vmi_label}\"");
    if is_marked(&vmi) {
        return Response::denied(format!("Evacuation in progress: {evacuation}"));
    }
    let vmi_node = vmi
        .status
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .unwrap_or_default();
    if vmi_node != node_name(pod) {
        return Response::denied("Eviction request for target Pod");
    }
    let eviction: Eviction = match request
        .object
        .as_ref()
        .ok_or_else(|| "the request has no object".to_string())
        .and_then(|o| serde_json::from_value(o.clone()).map_err(|e| e.to_string()))
    {
        Ok(eviction) => eviction,
        Err(e) => return Response::denied(format!("failed to parse the eviction object: {e}")),
    };
    let descheduler = eviction
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(REQUESTED_BY))
        .is_some_and(|v| v == DESCHEDULER);
    // `isDryRun`: the request's, else the eviction's delete options.
    let dry_run = request.dry_run == Some(true)
        || eviction
            .delete_options
            .as_ref()
            .and_then(|o| o.dry_run.as_ref())
            .and_then(|d| d.first())
            .is_some_and(|d| d == "All");
    if let Err(e) = cluster
        .mark_for_evacuation(&vmi, node_name(pod), descheduler, dry_run)
        .await
    {
        return Response::denied(format!("kubevirt failed marking the vmi for eviction: {e}"));
    }
    Response::denied(evacuation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admit::service_accounts;
    use crate::cluster::fake::{Fake, Mark};
    use controller::template::TemplateConfig;
    use futures::executor::block_on;
    use pretty_assertions::assert_eq;
    use serde_json::{Value, json};

    const POD: &str = "virt-launcher-v-abcde";

    /// The VMI `ns/v` on `node-a`, `strategy` as its eviction strategy, `migratable` as its
    /// `LiveMigratable` condition's status (none if `None`).
    fn vmi(strategy: Option<&str>, migratable: Option<&str>) -> VirtualMachineInstance {
        let mut vmi = json!({
            "metadata": {"name": "v", "namespace": "ns"},
            "spec": {"domain": {"devices": {}}},
            "status": {"phase": "Running", "nodeName": "node-a"},
        });
        if let Some(strategy) = strategy {
            vmi["spec"]["evictionStrategy"] = json!(strategy);
        }
        if let Some(status) = migratable {
            vmi["status"]["conditions"] = json!([{"type": "LiveMigratable", "status": status}]);
        }
        serde_json::from_value(vmi).unwrap()
    }

    /// A running launcher pod of `v` on `node`.
    fn launcher(name: &str, node: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns",
                         "labels": {"kubevirt.io": "virt-launcher", "kubevirt.io/created-by": "uid-v"},
                         "annotations": {"kubevirt.io/domain": "v"}},
            "spec": {"nodeName": node, "containers": [{"name": "compute"}]},
            "status": {"phase": "Running"},
        }))
        .unwrap()
    }

    fn eviction_request(pod: &str, eviction: Value) -> Request {
        serde_json::from_value(json!({
            "uid": "u", "operation": "CREATE", "namespace": "ns", "name": pod,
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "userInfo": {"username": "system:serviceaccount:kube-system:disruption-controller"},
            "object": eviction,
        }))
        .unwrap()
    }

    fn eviction(pod: &str) -> Value {
        json!({"apiVersion": "policy/v1", "kind": "Eviction",
               "metadata": {"name": pod, "namespace": "ns"}})
    }

    /// Runs the webhook with the cluster's eviction strategy `cluster_strategy`.
    fn judge(request: &Request, cluster_strategy: Option<&str>, cluster: &Fake) -> Response {
        let config = TemplateConfig {
            eviction_strategy: cluster_strategy.map(String::from),
            ..TemplateConfig::default()
        };
        let accounts = service_accounts("kubevirt");
        let uuid = || "u".to_string();
        let ctx = Context {
            config: &config,
            service_accounts: &accounts,
            now: serde_json::from_value(json!("2026-01-02T03:04:05Z")).unwrap(),
            new_uuid: &uuid,
        };
        block_on(validate(request, &ctx, cluster))
    }

    fn mark(descheduler: bool, dry_run: bool) -> Mark {
        Mark {
            vmi: "ns/v".into(),
            node: "node-a".into(),
            descheduler,
            dry_run,
        }
    }

    const EVACUATION: &str = "Eviction triggered evacuation of VMI \"ns/v\"";

    /// Every strategy against a migratable and a non-migratable VMI, and every refusal
    /// before the mark, with v1.9.0's messages (code 429) and the marks made.
    #[test]
    fn launcher_pod_rules_and_messages() {
        let not_migratable =
            "VMI v is configured with an eviction strategy but is not live-migratable";
        let in_progress = "Evacuation in progress: Eviction triggered evacuation of VMI \"ns/v\"";
        struct Row {
            what: &'static str,
            vmi: VirtualMachineInstance,
            cluster_strategy: Option<&'static str>,
            pod_node: &'static str,
            /// None: allowed.
            denied: Option<&'static str>,
            marked: bool,
        }
        let row = |what, vmi| Row {
            what,
            vmi,
            cluster_strategy: Some("None"),
            pod_node: "node-a",
            denied: None,
            marked: false,
        };
        let marked_with = |mut vmi: VirtualMachineInstance| {
            vmi.status
                .as_mut()
                .unwrap()
                .extra
                .insert("evacuationNodeName".into(), json!("node-a"));
            vmi
        };
        let rows = vec![
            Row {
                denied: Some(EVACUATION),
                marked: true,
                ..row(
                    "LiveMigrate, migratable",
                    vmi(Some("LiveMigrate"), Some("True")),
                )
            },
            Row {
                denied: Some(not_migratable),
                ..row("LiveMigrate, no condition", vmi(Some("LiveMigrate"), None))
            },
            Row {
                denied: Some(not_migratable),
                ..row(
                    "LiveMigrate, not migratable",
                    vmi(Some("LiveMigrate"), Some("False")),
                )
            },
            Row {
                denied: Some(EVACUATION),
                marked: true,
                ..row(
                    "LiveMigrateIfPossible, migratable",
                    vmi(Some("LiveMigrateIfPossible"), Some("True")),
                )
            },
            row(
                "LiveMigrateIfPossible, not migratable",
                vmi(Some("LiveMigrateIfPossible"), Some("False")),
            ),
            Row {
                denied: Some(EVACUATION),
                marked: true,
                ..row(
                    "External, not migratable",
                    vmi(Some("External"), Some("False")),
                )
            },
            Row {
                denied: Some(EVACUATION),
                marked: true,
                ..row("External, no condition", vmi(Some("External"), None))
            },
            row("None", vmi(Some("None"), Some("True"))),
            row("an unknown strategy", vmi(Some("Sometimes"), Some("True"))),
            Row {
                cluster_strategy: None,
                ..row("no strategy anywhere", vmi(None, Some("True")))
            },
            Row {
                cluster_strategy: Some("LiveMigrate"),
                denied: Some(EVACUATION),
                marked: true,
                ..row("the cluster's LiveMigrate", vmi(None, Some("True")))
            },
            Row {
                cluster_strategy: Some("LiveMigrate"),
                ..row(
                    "the VMI's None over the cluster's",
                    vmi(Some("None"), Some("True")),
                )
            },
            Row {
                denied: Some(in_progress),
                ..row(
                    "already marked",
                    marked_with(vmi(Some("LiveMigrate"), Some("True"))),
                )
            },
            Row {
                denied: Some(in_progress),
                ..row(
                    "already marked, External",
                    marked_with(vmi(Some("External"), Some("False"))),
                )
            },
            Row {
                denied: Some(not_migratable),
                ..row(
                    "marked but no longer migratable",
                    marked_with(vmi(Some("LiveMigrate"), Some("False"))),
                )
            },
            Row {
                pod_node: "node-b",
                denied: Some("Eviction request for target Pod"),
                ..row("the target pod", vmi(Some("LiveMigrate"), Some("True")))
            },
            Row {
                pod_node: "node-b",
                ..row(
                    "the target pod, nothing to do",
                    vmi(Some("None"), Some("True")),
                )
            },
        ];
        for row in rows {
            let cluster = Fake {
                vmis: vec![row.vmi],
                pods: vec![launcher(POD, row.pod_node)],
                ..Default::default()
            };
            let response = judge(
                &eviction_request(POD, eviction(POD)),
                row.cluster_strategy,
                &cluster,
            );
            match row.denied {
                None => assert_eq!(response, Response::allowed(), "{}", row.what),
                Some(message) => assert_eq!(
                    response,
                    Response::denied(message),
                    "{}: {response:?}",
                    row.what
                ),
            }
            let marks = if row.marked {
                vec![mark(false, false)]
            } else {
                vec![]
            };
            assert_eq!(cluster.marks(), marks, "{}", row.what);
        }
    }

    #[test]
    fn the_descheduler_and_dry_runs() {
        let cluster = || Fake {
            vmis: vec![vmi(Some("LiveMigrate"), Some("True"))],
            pods: vec![launcher(POD, "node-a")],
            ..Default::default()
        };
        let mut descheduler = eviction(POD);
        descheduler["metadata"]["annotations"] = json!({"requested-by": "sigs.k8s.io/descheduler"});
        let mut other = eviction(POD);
        other["metadata"]["annotations"] = json!({"requested-by": "someone-else"});
        let mut delete_options = eviction(POD);
        delete_options["deleteOptions"] = json!({"dryRun": ["All"]});
        let mut not_dry = eviction(POD);
        not_dry["deleteOptions"] = json!({"dryRun": [], "gracePeriodSeconds": 0});
        let mut dry_request = eviction_request(POD, eviction(POD));
        dry_request.dry_run = Some(true);
        for (what, request, expected) in [
            (
                "descheduler",
                eviction_request(POD, descheduler),
                mark(true, false),
            ),
            (
                "another requester",
                eviction_request(POD, other),
                mark(false, false),
            ),
            (
                "dry run in the delete options",
                eviction_request(POD, delete_options),
                mark(false, true),
            ),
            (
                "no dry run",
                eviction_request(POD, not_dry),
                mark(false, false),
            ),
            ("dry-run request", dry_request, mark(false, true)),
        ] {
            let cluster = cluster();
            let response = judge(&request, None, &cluster);
            assert_eq!(response, Response::denied(EVACUATION), "{what}");
            assert_eq!(response.result.as_ref().unwrap().code, 429);
            assert_eq!(cluster.marks(), [expected], "{what}");
        }
    }

    #[test]
    fn failures_and_pods_that_are_not_vms() {
        let vmi = || vmi(Some("LiveMigrate"), Some("True"));
        let request = || eviction_request(POD, eviction(POD));
        // Reading the VMI fails, or it is gone: denied (KubeVirt keeps the pod).
        let failing = Fake {
            vmis: vec![vmi()],
            pods: vec![launcher(POD, "node-a")],
            errors: [("vmi", "connection refused".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            judge(&request(), None, &failing),
            Response::denied("kubevirt failed getting the vmi: connection refused")
        );
        let gone = Fake {
            pods: vec![launcher(POD, "node-a")],
            ..Default::default()
        };
        assert_eq!(
            judge(&request(), None, &gone),
            Response::denied(
                "kubevirt failed getting the vmi: virtualmachineinstances.kubevirt.io \"v\" not found"
            )
        );
        // The mark fails: denied, the user retries.
        let unmarked = Fake {
            vmis: vec![vmi()],
            pods: vec![launcher(POD, "node-a")],
            errors: [("mark", "Operation cannot be fulfilled".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            judge(&request(), None, &unmarked),
            Response::denied(
                "kubevirt failed marking the vmi for eviction: Operation cannot be fulfilled"
            )
        );
        // An eviction object that is not one, where it is read (before the mark).
        let cluster = Fake {
            vmis: vec![vmi()],
            pods: vec![launcher(POD, "node-a")],
            ..Default::default()
        };
        for bad in [json!("x"), json!({"deleteOptions": {"dryRun": "All"}})] {
            let response = judge(&eviction_request(POD, bad.clone()), None, &cluster);
            let message = response.result.as_ref().unwrap().message.clone();
            assert!(
                !response.allowed && message.starts_with("failed to parse the eviction object: "),
                "{bad}: {message}"
            );
        }
        let mut no_object = request();
        no_object.object = None;
        assert_eq!(
            judge(&no_object, None, &cluster),
            Response::denied("failed to parse the eviction object: the request has no object")
        );
        assert!(cluster.marks().is_empty());

        // Pods the webhook lets go: unreadable, missing, not a launcher, completed, no domain.
        let allowed = |what: &str, cluster: Fake, request: Request| {
            assert_eq!(
                judge(&request, None, &cluster),
                Response::allowed(),
                "{what}"
            );
            assert!(cluster.marks().is_empty(), "{what}");
        };
        allowed(
            "the pod cannot be read",
            Fake {
                vmis: vec![vmi()],
                pods: vec![launcher(POD, "node-a")],
                errors: [("pod", "forbidden".to_string())].into(),
                ..Default::default()
            },
            request(),
        );
        allowed(
            "no such pod",
            Fake {
                vmis: vec![vmi()],
                ..Default::default()
            },
            request(),
        );
        let mut unnamed = request();
        unnamed.name = None;
        allowed("no pod named", Fake::default(), unnamed);
        let mut other_app = launcher(POD, "node-a");
        other_app
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("kubevirt.io".into(), "virt-handler".into());
        allowed(
            "not a launcher",
            Fake {
                vmis: vec![vmi()],
                pods: vec![other_app],
                ..Default::default()
            },
            request(),
        );
        for phase in ["Succeeded", "Failed"] {
            let mut done = launcher(POD, "node-a");
            done.status.as_mut().unwrap().phase = Some(phase.into());
            allowed(
                phase,
                Fake {
                    vmis: vec![vmi()],
                    pods: vec![done],
                    ..Default::default()
                },
                request(),
            );
        }
        let mut anonymous = launcher(POD, "node-a");
        anonymous.metadata.annotations = None;
        allowed(
            "no domain annotation",
            Fake {
                vmis: vec![vmi()],
                pods: vec![anonymous],
                ..Default::default()
            },
            request(),
        );
    }

    #[test]
    fn hotplug_pods_stay_while_their_vmi_exists() {
        let hotplug: Pod = serde_json::from_value(json!({
            "metadata": {"name": "hp-volume-xyz", "namespace": "ns",
                         "labels": {"kubevirt.io": "hotplug-disk"},
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": POD, "uid": "p"}]},
            "spec": {"containers": [{"name": "hotplug-disk"}]},
        }))
        .unwrap();
        let request = || eviction_request("hp-volume-xyz", eviction("hp-volume-xyz"));
        let cluster = |pods: Vec<Pod>, vmis: Vec<VirtualMachineInstance>| Fake {
            pods,
            vmis,
            ..Default::default()
        };
        let owner = launcher(POD, "node-a");
        let vmi = || vmi(Some("None"), None);
        assert_eq!(
            judge(
                &request(),
                None,
                &cluster(vec![hotplug.clone(), owner.clone()], vec![vmi()])
            ),
            Response::denied(
                "cannot evict hotplug pod: hp-volume-xyz associated with running vmi: v in namespace ns"
            )
        );
        assert_eq!(
            judge(
                &request(),
                None,
                &cluster(vec![hotplug.clone(), owner.clone()], vec![])
            ),
            Response::allowed()
        );
        assert_eq!(
            judge(
                &request(),
                None,
                &cluster(vec![hotplug.clone()], vec![vmi()])
            ),
            Response::allowed(),
            "no owner"
        );
        let mut done = owner.clone();
        done.status.as_mut().unwrap().phase = Some("Succeeded".into());
        assert_eq!(
            judge(
                &request(),
                None,
                &cluster(vec![hotplug.clone(), done], vec![vmi()])
            ),
            Response::allowed(),
            "a completed owner"
        );
        // Two owners: not a hotplug pod as v1.9.0 knows them.
        let mut two = hotplug.clone();
        let reference = two.metadata.owner_references.as_ref().unwrap()[0].clone();
        two.metadata
            .owner_references
            .as_mut()
            .unwrap()
            .push(reference);
        assert_eq!(
            judge(
                &request(),
                None,
                &cluster(vec![two, owner.clone()], vec![vmi()])
            ),
            Response::allowed()
        );
        // The owner cannot be read.
        let failing = Fake {
            pods: vec![hotplug.clone(), owner.clone()],
            vmis: vec![vmi()],
            errors: [("pod ns/virt-launcher-v-abcde", "forbidden".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            judge(&request(), None, &failing),
            Response::denied("failed getting owner for hotplug pod: forbidden")
        );
        assert_eq!(
            failing.calls(),
            ["pod ns/hp-volume-xyz", "pod ns/virt-launcher-v-abcde"]
        );
        // The VMI cannot be read.
        let failing = Fake {
            pods: vec![hotplug.clone(), owner],
            errors: [("vmi", "timeout".to_string())].into(),
            ..Default::default()
        };
        assert_eq!(
            judge(&request(), None, &failing),
            Response::denied("kubevirt failed getting the vmi: timeout")
        );
    }
}
