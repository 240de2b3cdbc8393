//! The VMI status the handler derives from the domain (`updateVMIStatus`, proto/CONTRACT.md §3.4,
//! §3.7), as a pure function, and the JSON merge patch that writes only what it owns.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use proto::kubevirt::{
    Condition, InterfaceStatus, Machine, Phase, PhaseTransitionTimestamp, Time,
    VirtualMachineInstance, VirtualMachineInstanceStatus,
};
use serde::{Deserialize, Serialize};

use super::migratable;

/// The status fields the handler writes; everything else belongs to other writers
/// (`nodeName`, `activePods`, `Ready` is a condition the controller owns, ...).
/// `conditions` is shared: the handler writes the list with its own conditions
/// ([`HANDLER_CONDITIONS`]) changed and the others' kept. `migrationMethod` and
/// `selinuxContext` only v1.9.0's handler writes (its synchronization controller too, for
/// decentralized migrations, which this project does not have).
pub const HANDLER_OWNED_FIELDS: &[&str] = &[
    "phase",
    "phaseTransitionTimestamps",
    "interfaces",
    "conditions",
    "machine",
    "reason",
    "migrationMethod",
    "selinuxContext",
];

/// Condition types the handler sets and removes; others' conditions are kept as they are.
pub(crate) const HANDLER_CONDITIONS: &[&str] = &[
    migratable::LIVE_MIGRATABLE,
    migratable::STORAGE_LIVE_MIGRATABLE,
    "Paused",
    "Synchronized",
    "AgentConnected",
];

/// `status.selinuxContext` where SELinux is off: v1.9.0's handler writes `"none"` when
/// `virt-chroot selinux getenforce` finds no `/sys/fs/selinux/enforce`, else the launcher's
/// SELinux context. This project's launchers run without an SELinux context of their own
/// (the controller's pod template sets none, the handler relabels nothing), so the handler
/// always says `"none"`; v1.9.0's migration controller then matches no SELinux level for the
/// target pod.
pub(crate) const SELINUX_CONTEXT_NONE: &str = "none";

/// What the pod side knows about a pod interface (KubeVirt's pod-interface cache entry).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct PodInterface {
    pub iface: String,
    #[serde(rename = "podIP", default)]
    pub pod_ip: String,
    #[serde(rename = "podIPs", default)]
    pub pod_ips: Vec<String>,
}

/// Inputs besides the VMI and the domain.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatusInputs {
    /// The phase [`crate::sync::calculate_phase`] computed.
    pub phase: Phase,
    /// The error of this reconcile, for the `Synchronized` condition.
    pub sync_error: Option<String>,
    /// Pod interfaces by VMI interface (network) name.
    pub pod_interfaces: BTreeMap<String, PodInterface>,
}

fn condition(kind: &str, status: &str, reason: &str, message: &str, now: Timestamp) -> Condition {
    Condition {
        condition_type: kind.to_string(),
        status: status.to_string(),
        last_probe_time: None,
        last_transition_time: Some(Time(now)),
        reason: Some(reason.to_string()),
        message: Some(message.to_string()),
        extra: Default::default(),
    }
}

/// Replaces the handler's conditions with `wanted`: one the VMI has keeps its place in the
/// list (and its transition time when its status, reason and message did not change), one it
/// no longer wants goes, a new one is appended; the others' conditions stay where they are.
/// Keeping places matters: the controller appends its own conditions after the handler's,
/// and moving the handler's behind them would be a write that changes nothing.
fn merge_conditions(current: &[Condition], wanted: Vec<Condition>) -> Vec<Condition> {
    let mut wanted: Vec<Option<Condition>> = wanted.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(current.len() + wanted.len());
    for old in current {
        if !HANDLER_CONDITIONS.contains(&old.condition_type.as_str()) {
            out.push(old.clone());
            continue;
        }
        let Some(mut w) = wanted
            .iter_mut()
            .find(|w| {
                w.as_ref()
                    .is_some_and(|w| w.condition_type == old.condition_type)
            })
            .and_then(Option::take)
        else {
            continue;
        };
        if old.status == w.status && old.reason == w.reason && old.message == w.message {
            w.last_transition_time = old.last_transition_time.clone();
        }
        out.push(w);
    }
    out.extend(wanted.into_iter().flatten());
    out
}

/// `StorageLiveMigratable` as v1.9.0's `UpdateCondition` writes it: the VMI's own stays
/// (message included) while its status and reason are the same.
fn storage_condition(current: &[Condition], computed: Condition) -> Condition {
    match Condition::find(current, migratable::STORAGE_LIVE_MIGRATABLE) {
        Some(old) if old.status == computed.status && old.reason == computed.reason => old.clone(),
        _ => computed,
    }
}

fn domain_interfaces(
    domain: &Domain,
    pod_interfaces: &BTreeMap<String, PodInterface>,
    vmi: &VirtualMachineInstance,
) -> Vec<InterfaceStatus> {
    let Some(devices) = domain.spec.devices.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for iface in &devices.interfaces {
        // KubeVirt dereferences Alias and MAC: interfaces without them are not reported.
        let (Some(alias), Some(mac)) = (iface.alias.as_ref(), iface.mac.as_ref()) else {
            continue;
        };
        let pod = pod_interfaces.get(&alias.name);
        // Without a cache entry (pod gone, handler restarted) the address already
        // reported stays: it is still the VM's until the VMI is over.
        let reported = vmi.status.as_ref().and_then(|s| {
            s.interfaces
                .iter()
                .find(|i| i.name.as_deref() == Some(&alias.name))
        });
        let (ip, ips) = match (pod, reported) {
            (Some(p), _) if !p.pod_ip.is_empty() => (Some(p.pod_ip.clone()), p.pod_ips.clone()),
            (_, Some(r)) => (r.ip_address.clone(), r.ip_addresses.clone()),
            _ => (None, Vec::new()),
        };
        let is_pod_network = vmi
            .spec
            .networks
            .iter()
            .any(|n| n.name == alias.name && n.pod.is_some());
        out.push(InterfaceStatus {
            ip_address: ip,
            ip_addresses: ips,
            mac: Some(mac.mac.clone()),
            name: Some(alias.name.clone()),
            pod_interface_name: pod.map(|p| p.iface.clone()).filter(|s| !s.is_empty()),
            interface_name: None,
            info_source: Some("domain".into()),
            queue_count: Some(
                iface
                    .driver
                    .as_ref()
                    .and_then(|d| d.queues)
                    .and_then(|q| i32::try_from(q).ok())
                    .unwrap_or(1),
            ),
            link_state: Some(
                iface
                    .link_state
                    .as_ref()
                    .map(|l| l.state.clone())
                    .filter(|s| !s.is_empty())
                    .unwrap_or_else(|| "up".into()),
            ),
            extra: Default::default(),
        });
        // The primary pod network comes first (netstat.go).
        if is_pod_network && out.len() > 1 {
            let last = out.pop().expect("just pushed");
            out.insert(0, last);
        }
    }
    out
}

/// The status after this reconcile, or `None` when the handler leaves it alone (final VMI).
pub(crate) fn compute_status(
    vmi: &VirtualMachineInstance,
    domain: Option<&Domain>,
    inputs: &StatusInputs,
    now: Timestamp,
) -> Option<VirtualMachineInstanceStatus> {
    if vmi.phase().is_final() {
        return None;
    }
    let current = vmi.status.clone().unwrap_or_default();
    let mut status = current.clone();
    let domain = domain.filter(|d| !d.is_gone());

    if inputs.phase != Phase::Unset && inputs.phase != vmi.phase() {
        status.phase = Some(inputs.phase);
        if !status
            .phase_transition_timestamps
            .iter()
            .any(|t| t.phase == inputs.phase)
        {
            status
                .phase_transition_timestamps
                .push(PhaseTransitionTimestamp {
                    phase: inputs.phase,
                    phase_transition_timestamp: Time(now),
                    extra: Default::default(),
                });
        }
    }

    if let Some(d) = domain {
        let ifaces = domain_interfaces(d, &inputs.pod_interfaces, vmi);
        if !ifaces.is_empty() {
            status.interfaces = ifaces;
        }
        if let Some(machine) = d
            .spec
            .os
            .as_ref()
            .map(|os| os.r#type.machine.clone())
            .filter(|m| !m.is_empty())
        {
            status.machine = Some(Machine {
                machine_type: machine,
                extra: Default::default(),
            });
        }
    }

    let mut wanted = Vec::new();
    // The VMI-wide migration facts (`updateLiveMigrationConditions`, `updateSELinuxContext`),
    // once the VMI has a domain (or carries them already): v1.9.0 writes them from the first
    // sync on, but a VMI still waiting for its launcher or domain cannot migrate anyway, and
    // leaving them for the write that says `Running` keeps that write the only one of the
    // start (`handler/docs/migration.md`).
    if domain.is_some()
        || Condition::find(&current.conditions, migratable::LIVE_MIGRATABLE).is_some()
    {
        let m = migratable::migratability(vmi, migratable::NODE_HOST_CPU_MODEL);
        wanted.push(m.live);
        wanted.push(storage_condition(&current.conditions, m.storage));
        status.migration_method = Some(m.method.to_string());
        status.selinux_context = Some(SELINUX_CONTEXT_NONE.to_string());
    }
    if let Some(d) = domain
        && d.status.status == LifeCycle::Paused
    {
        let (reason, message) = match d.status.reason {
            StateChangeReason::IOError => (
                "PausedIOError",
                "VMI was paused, low-level IO error detected",
            ),
            _ => ("PausedByUser", "VMI was paused by user"),
        };
        wanted.push(condition("Paused", "True", reason, message, now));
    }
    if let Some(d) = domain
        && d.spec.devices.as_ref().is_some_and(|dev| {
            dev.channels.iter().any(|c| {
                c.target
                    .as_ref()
                    .is_some_and(|t| t.name == "org.qemu.guest_agent.0" && t.state == "connected")
            })
        })
    {
        wanted.push(condition("AgentConnected", "True", "", "", now));
    }
    if let Some(err) = &inputs.sync_error {
        wanted.push(condition(
            "Synchronized",
            "False",
            "Synchronizing with the Domain failed.",
            err,
            now,
        ));
    } else if inputs.phase == Phase::Failed
        && let Some(why) = current
            .conditions
            .iter()
            .find(|c| c.condition_type == "Synchronized" && c.status == "False")
    {
        // A VMI that failed keeps the last error that explains it (the launcher's "cannot
        // boot disk ..."), instead of losing it on the write that makes it Failed.
        wanted.push(why.clone());
    }
    status.conditions = merge_conditions(&current.conditions, wanted);
    Some(status)
}

/// A JSON merge patch (RFC 7386) setting the handler's fields of `status`, guarded by the
/// resource version the change was computed from (so a concurrent writer causes a
/// conflict instead of being overwritten). Fields the handler cleared become `null`.
pub(crate) fn status_merge_patch(
    resource_version: Option<&str>,
    status: &VirtualMachineInstanceStatus,
) -> serde_json::Value {
    let full = serde_json::to_value(status).unwrap_or_default();
    let mut owned = serde_json::Map::new();
    for field in HANDLER_OWNED_FIELDS {
        owned.insert(
            field.to_string(),
            full.get(*field).cloned().unwrap_or(serde_json::Value::Null),
        );
    }
    let mut patch = serde_json::json!({ "status": owned });
    if let Some(rv) = resource_version {
        patch["metadata"] = serde_json::json!({ "resourceVersion": rv });
    }
    patch
}

/// Whether two statuses differ in what the handler owns (one write per real change).
pub(crate) fn owned_fields_differ(
    a: &VirtualMachineInstanceStatus,
    b: &VirtualMachineInstanceStatus,
) -> bool {
    status_merge_patch(None, a) != status_merge_patch(None, b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::{Alias, Devices, Interface, Mac, Os, OsType};

    fn now() -> Timestamp {
        "2026-08-22T10:00:00Z".parse().expect("time")
    }

    fn vmi(phase: Phase) -> VirtualMachineInstance {
        let mut v = proto::kubevirt::parse_vmi(
            r#"{"metadata":{"name":"v","namespace":"d","uid":"u","resourceVersion":"7"},
                "spec":{"domain":{"devices":{"interfaces":[{"name":"default","masquerade":{}}]}},
                        "networks":[{"name":"default","pod":{}}]},
                "status":{"nodeName":"n1","activePods":{"p":"n1"},
                          "conditions":[{"type":"Ready","status":"True"}]}}"#,
        )
        .expect("vmi");
        if let Some(s) = v.status.as_mut() {
            s.phase = Some(phase);
        }
        v
    }

    fn running_domain() -> Domain {
        let mut d = Domain::new("d", "v", "u");
        d.status.status = LifeCycle::Running;
        d.spec.os = Some(Os {
            r#type: OsType {
                machine: "q35".into(),
                ..Default::default()
            },
            ..Default::default()
        });
        d.spec.devices = Some(Devices {
            interfaces: vec![Interface {
                mac: Some(Mac {
                    mac: "02:00:00:aa:bb:cc".into(),
                }),
                alias: Some(Alias {
                    name: "default".into(),
                    user_defined: true,
                }),
                ..Default::default()
            }],
            ..Default::default()
        });
        d
    }

    #[test]
    fn running_status_has_phase_timestamp_interfaces_and_keeps_others_fields() {
        let v = vmi(Phase::Scheduled);
        let mut inputs = StatusInputs {
            phase: Phase::Running,
            ..Default::default()
        };
        inputs.pod_interfaces.insert(
            "default".into(),
            PodInterface {
                iface: "eth0".into(),
                pod_ip: "10.244.0.5".into(),
                pod_ips: vec!["10.244.0.5".into()],
            },
        );
        let s = compute_status(&v, Some(&running_domain()), &inputs, now()).expect("status");
        assert_eq!(s.phase, Some(Phase::Running));
        assert_eq!(s.phase_transition_timestamps.len(), 1);
        assert_eq!(s.node_name.as_deref(), Some("n1"));
        assert!(s.active_pods.is_some());
        let types: Vec<&str> = s
            .conditions
            .iter()
            .map(|c| c.condition_type.as_str())
            .collect();
        assert_eq!(
            types,
            ["Ready", "LiveMigratable", "StorageLiveMigratable"],
            "Ready kept, the migration conditions added"
        );
        assert_eq!(s.migration_method.as_deref(), Some("LiveMigration"));
        assert_eq!(s.selinux_context.as_deref(), Some("none"));
        let i = &s.interfaces[0];
        assert_eq!(i.ip_address.as_deref(), Some("10.244.0.5"));
        assert_eq!(i.mac.as_deref(), Some("02:00:00:aa:bb:cc"));
        assert_eq!(i.info_source.as_deref(), Some("domain"));
        assert_eq!(i.queue_count, Some(1));
        assert_eq!(i.link_state.as_deref(), Some("up"));
        assert_eq!(
            s.machine.as_ref().map(|m| m.machine_type.as_str()),
            Some("q35")
        );

        // Recomputing from the written status changes nothing: no second write.
        let mut written = v.clone();
        written.status = Some(s.clone());
        let again =
            compute_status(&written, Some(&running_domain()), &inputs, now()).expect("status");
        assert!(!owned_fields_differ(&s, &again));
    }

    #[test]
    fn final_vmi_status_is_left_alone() {
        assert!(
            compute_status(&vmi(Phase::Failed), None, &StatusInputs::default(), now()).is_none()
        );
    }

    #[test]
    fn a_vmi_that_fails_keeps_the_error_that_explains_it() {
        let v = vmi(Phase::Scheduled);
        let failing = StatusInputs {
            phase: Phase::Scheduled,
            sync_error: Some(
                "cannot boot disk \"root\": no boot loader configuration found".into(),
            ),
            ..Default::default()
        };
        let s = compute_status(&v, None, &failing, now()).expect("status");
        let mut scheduled = v.clone();
        scheduled.status = Some(s);
        let mut crashed = running_domain();
        crashed.status.status = LifeCycle::Shutoff;
        crashed.status.reason = StateChangeReason::Crashed;
        let failed = StatusInputs {
            phase: Phase::Failed,
            ..Default::default()
        };
        let s = compute_status(&scheduled, Some(&crashed), &failed, now()).expect("status");
        let sync = s
            .conditions
            .iter()
            .find(|c| c.condition_type == "Synchronized")
            .expect("the error stays on the failed VMI");
        assert!(
            sync.message
                .as_deref()
                .unwrap_or("")
                .contains("cannot boot disk")
        );
        // A VMI that does not fail loses it once synchronised.
        let running = StatusInputs {
            phase: Phase::Running,
            ..Default::default()
        };
        let s =
            compute_status(&scheduled, Some(&running_domain()), &running, now()).expect("status");
        assert!(
            !s.conditions
                .iter()
                .any(|c| c.condition_type == "Synchronized")
        );
    }

    #[test]
    fn paused_and_sync_error_conditions_come_and_go() {
        let v = vmi(Phase::Running);
        let mut d = running_domain();
        d.status.status = LifeCycle::Paused;
        d.status.reason = StateChangeReason::User;
        let inputs = StatusInputs {
            phase: Phase::Running,
            sync_error: Some("boom".into()),
            ..Default::default()
        };
        let s = compute_status(&v, Some(&d), &inputs, now()).expect("status");
        let types: Vec<&str> = s
            .conditions
            .iter()
            .map(|c| c.condition_type.as_str())
            .collect();
        assert_eq!(
            types,
            vec![
                "Ready",
                "LiveMigratable",
                "StorageLiveMigratable",
                "Paused",
                "Synchronized"
            ]
        );
        let sync = &s.conditions[4];
        assert_eq!(sync.status, "False");
        assert_eq!(sync.message.as_deref(), Some("boom"));
        let mut paused = v.clone();
        paused.status = Some(s);
        let s2 = compute_status(
            &paused,
            Some(&running_domain()),
            &StatusInputs {
                phase: Phase::Running,
                ..Default::default()
            },
            now(),
        )
        .expect("status");
        let types: Vec<&str> = s2
            .conditions
            .iter()
            .map(|c| c.condition_type.as_str())
            .collect();
        assert_eq!(
            types,
            vec!["Ready", "LiveMigratable", "StorageLiveMigratable"]
        );
    }

    #[test]
    fn merge_patch_carries_only_owned_fields_and_the_resource_version() {
        let v = vmi(Phase::Scheduled);
        let s = compute_status(
            &v,
            Some(&running_domain()),
            &StatusInputs {
                phase: Phase::Running,
                ..Default::default()
            },
            now(),
        )
        .expect("status");
        let patch = status_merge_patch(Some("7"), &s);
        assert_eq!(patch["metadata"]["resourceVersion"], "7");
        assert_eq!(patch["status"]["phase"], "Running");
        assert!(patch["status"].get("nodeName").is_none());
        assert!(patch["status"].get("activePods").is_none());
        assert!(patch["status"]["reason"].is_null());
        assert_eq!(patch["status"]["migrationMethod"], "LiveMigration");
        assert_eq!(patch["status"]["selinuxContext"], "none");
    }

    fn condition_of<'a>(s: &'a VirtualMachineInstanceStatus, kind: &str) -> Option<&'a Condition> {
        Condition::find(&s.conditions, kind)
    }

    /// The golden files' VMI (`images/examples/vm-testguest.yaml` as virt-api stores it):
    /// host-model CPU, masquerade, a container disk.
    fn testguest(phase: Phase) -> VirtualMachineInstance {
        let mut v = proto::kubevirt::parse_vmi(
            r#"{"metadata":{"name":"testguest","namespace":"d","uid":"u","resourceVersion":"7"},
                "spec":{"domain":{"cpu":{"cores":1,"model":"host-model"},
                                  "devices":{"disks":[{"name":"rootdisk","disk":{"bus":"virtio"}}],
                                             "interfaces":[{"name":"default","masquerade":{}}]}},
                        "networks":[{"name":"default","pod":{}}],
                        "volumes":[{"name":"rootdisk","containerDisk":{"image":"test-disk"}}]},
                "status":{"nodeName":"kubevirt-rs-node","volumeStatus":[{"name":"rootdisk","target":""}],
                          "conditions":[{"type":"Ready","status":"False"}]}}"#,
        )
        .expect("vmi");
        if let Some(s) = v.status.as_mut() {
            s.phase = Some(phase);
        }
        v
    }

    #[test]
    fn the_migration_facts_come_with_the_domain_and_are_kept_true() {
        let running = StatusInputs {
            phase: Phase::Running,
            ..Default::default()
        };
        let scheduled = StatusInputs {
            phase: Phase::Scheduled,
            ..Default::default()
        };
        // Waiting for the launcher: nothing to write yet (the start's one write is Running's).
        let v = testguest(Phase::Scheduled);
        let s = compute_status(&v, None, &scheduled, now()).expect("status");
        assert!(!owned_fields_differ(v.status.as_ref().expect("status"), &s));
        assert!(condition_of(&s, "LiveMigratable").is_none());
        assert_eq!(s.migration_method, None);

        // The domain is there: one write with the phase and the migration facts.
        let s = compute_status(&v, Some(&running_domain()), &running, now()).expect("status");
        let live = condition_of(&s, "LiveMigratable").expect("LiveMigratable");
        assert_eq!(
            serde_json::to_value(live).expect("json"),
            serde_json::json!({"type": "LiveMigratable", "status": "False",
                "reason": "CPUModeLiveMigratable",
                "message": "the node \"kubevirt-rs-node\" does not allow migration with host-model"})
        );
        let storage = condition_of(&s, "StorageLiveMigratable").expect("StorageLiveMigratable");
        assert_eq!(
            serde_json::to_value(storage).expect("json"),
            serde_json::json!({"type": "StorageLiveMigratable", "status": "False",
                "reason": "NotMigratable",
                "message": "CPUModeLiveMigratable: the node \"kubevirt-rs-node\" does not allow migration with host-model"})
        );
        assert_eq!(s.migration_method.as_deref(), Some("BlockMigration"));
        assert_eq!(s.selinux_context.as_deref(), Some("none"));

        // Written once: recomputing changes nothing, with or without the domain.
        let mut written = v.clone();
        written.status = Some(s.clone());
        for domain in [Some(running_domain()), None] {
            let again = compute_status(&written, domain.as_ref(), &running, now()).expect("status");
            assert!(!owned_fields_differ(&s, &again), "{domain:?}");
        }

        // Every computation checks again: the same VMI with host-passthrough migrates.
        if let Some(cpu) = written.spec.domain.cpu.as_mut() {
            cpu.model = Some("host-passthrough".into());
        }
        let s2 = compute_status(&written, None, &running, now()).expect("status");
        assert_eq!(
            condition_of(&s2, "LiveMigratable").map(|c| c.status.as_str()),
            Some("True")
        );
        assert_eq!(
            condition_of(&s2, "StorageLiveMigratable").map(|c| c.status.as_str()),
            Some("True")
        );
        assert!(owned_fields_differ(&s, &s2));
    }

    #[test]
    fn conditions_keep_their_places_and_storage_keeps_its_message_while_its_reason_holds() {
        let mut v = testguest(Phase::Running);
        let first = compute_status(
            &v,
            Some(&running_domain()),
            &StatusInputs {
                phase: Phase::Running,
                ..Default::default()
            },
            now(),
        )
        .expect("status");
        // The controller appends a condition after the handler's.
        let mut status = first.clone();
        status.conditions.push(Condition {
            condition_type: "PodScheduled".into(),
            status: "True".into(),
            ..Default::default()
        });
        v.status = Some(status.clone());
        let inputs = StatusInputs {
            phase: Phase::Running,
            ..Default::default()
        };
        let again = compute_status(&v, Some(&running_domain()), &inputs, now()).expect("status");
        assert!(!owned_fields_differ(&status, &again), "no write to reorder");

        // A bridge on the pod network: LiveMigratable now fails on the interface (its
        // message changes with it), StorageLiveMigratable is still False/NotMigratable and
        // keeps its message, as v1.9.0's UpdateCondition does.
        v.spec.domain.devices.interfaces[0].masquerade = None;
        v.spec.domain.devices.interfaces[0].bridge = Some(Default::default());
        let changed = compute_status(&v, Some(&running_domain()), &inputs, now()).expect("status");
        let live = condition_of(&changed, "LiveMigratable").expect("LiveMigratable");
        assert_eq!(live.reason.as_deref(), Some("InterfaceNotLiveMigratable"));
        assert_eq!(
            condition_of(&changed, "StorageLiveMigratable"),
            condition_of(&status, "StorageLiveMigratable")
        );
        let types: Vec<&str> = changed
            .conditions
            .iter()
            .map(|c| c.condition_type.as_str())
            .collect();
        assert_eq!(
            types,
            [
                "Ready",
                "LiveMigratable",
                "StorageLiveMigratable",
                "PodScheduled"
            ]
        );
    }
}
