//! The source node's role in a migration (KubeVirt v1.9.0's
//! `pkg/virt-handler/migration-source.go`, `vmm/launcher/docs/migration-contract.md` §4.1),
//! as a pure decision: once the target listens, open the proxy in the source pod and ask
//! the launcher to migrate; copy what the launcher reports into the VMI; pass a
//! cancellation on. Success is not the source's to report: the target hands the VMI over.

use proto::domain::Domain;
use proto::kubevirt::{MigrationState, VirtualMachineInstance};
use serde_json::{Map, Value, json};

/// What the source node knows about one migrating VMI.
#[derive(Debug, Clone, Copy)]
pub struct SourceFacts<'a> {
    pub state: &'a MigrationState,
    /// The source launcher's domain.
    pub domain: Option<&'a Domain>,
    /// Whether this node's proxy for the VMI runs.
    pub listening: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum SourceStep {
    /// Copy the launcher's migration metadata into the VMI (a JSON merge patch).
    Report(Value),
    /// `CancelVirtualMachineMigration`.
    Cancel,
    /// Open the proxy to `address:port` and `MigrateVirtualMachine`.
    Migrate {
        address: String,
        port: u16,
    },
    /// The target does not listen yet: look again in a second (as v1.9.0).
    WaitForTarget,
    /// The migration is over: stop the proxy.
    StopProxy,
    Nothing(&'static str),
}

/// The source's decision for one reconcile.
pub fn decide(facts: &SourceFacts<'_>) -> SourceStep {
    let state = facts.state;
    if state.is_done() {
        return if facts.listening {
            SourceStep::StopProxy
        } else {
            SourceStep::Nothing("migration over")
        };
    }
    let uid = state.migration_uid.as_deref().unwrap_or_default();
    // The launcher's report is copied even from a domain that migrated away: a migration
    // that ended before the start was copied must still show it started (until the target
    // hands over, a started migration keeps the main loop off the VMI).
    let metadata = facts
        .domain
        .filter(|d| !d.is_gone())
        .and_then(|d| d.spec.metadata.kubevirt.migration.as_ref())
        .filter(|m| !uid.is_empty() && m.uid == uid);
    if let Some(m) = metadata {
        let mut copy = Map::new();
        let mut set = |key: &str, value: Value, current: Value| {
            if value != current {
                copy.insert(key.to_string(), value);
            }
        };
        let current = serde_json::to_value(state).unwrap_or_default();
        let get = |key: &str| current.get(key).cloned().unwrap_or(Value::Null);
        if let Some(start) = &m.start_timestamp {
            set("startTimestamp", json!(start), get("startTimestamp"));
        }
        if !m.mode.is_empty() {
            set("mode", json!(m.mode), get("mode"));
        }
        if m.failed {
            set("failed", json!(true), get("failed"));
            set("completed", json!(true), get("completed"));
            if let Some(end) = &m.end_timestamp {
                set("endTimestamp", json!(end), get("endTimestamp"));
            }
            if !m.abort_status.is_empty() {
                set("abortStatus", json!(m.abort_status), get("abortStatus"));
            }
            set(
                "failureReason",
                json!(m.failure_reason),
                get("failureReason"),
            );
        }
        if !copy.is_empty() {
            return SourceStep::Report(json!({"status": {"migrationState": copy}}));
        }
    }
    if !crate::sync::domain_alive(facts.domain) {
        return SourceStep::Nothing("no live domain here");
    }
    let domain = facts.domain.expect("alive means present");
    if state.abort_requested == Some(true) {
        let aborting = |s: &str| s == "Aborting" || s == "Succeeded";
        let already = state.abort_status.as_deref().is_some_and(aborting)
            || metadata.is_some_and(|m| aborting(&m.abort_status));
        // Only a migration the launcher runs can be cancelled; one never started is not
        // started now.
        let running =
            metadata.is_some_and(|m| m.start_timestamp.is_some() && m.end_timestamp.is_none());
        if running && !already {
            return SourceStep::Cancel;
        }
        if !running {
            return SourceStep::Nothing("abort requested: not migrating");
        }
    }
    if crate::sync::migration_in_progress(domain) {
        return SourceStep::Nothing("migration in progress");
    }
    if metadata.is_some_and(|m| m.end_timestamp.is_some()) {
        return SourceStep::Nothing("the launcher ended this migration");
    }
    let target = state.target_node_address.as_deref().zip(
        state
            .target_direct_migration_node_ports
            .as_ref()
            .and_then(|ports| {
                ports
                    .iter()
                    .find(|(_, to)| {
                        **to == i32::from(proto::kubevirt::well_known::DIRECT_MIGRATION_PORT)
                    })
                    .and_then(|(port, _)| port.parse::<u16>().ok())
            }),
    );
    match target {
        Some((address, port)) if !address.is_empty() && port != 0 => SourceStep::Migrate {
            address: address.to_string(),
            port,
        },
        _ => SourceStep::WaitForTarget,
    }
}

/// KubeVirt's `MigrationOptions` (Go field names: the struct has no JSON tags) from
/// `status.migrationState.migrationConfiguration` (the controller's resolved
/// configuration), with v1.9.0's defaults for what it leaves out.
pub fn migration_options(vmi: &VirtualMachineInstance, state: &MigrationState) -> Value {
    let config = state.migration_configuration.clone().unwrap_or(Value::Null);
    let int = |key: &str, default: i64| config.get(key).and_then(Value::as_i64).unwrap_or(default);
    let flag = |key: &str| config.get(key).and_then(Value::as_bool);
    let bandwidth = config
        .get("bandwidthPerMigration")
        .and_then(Value::as_str)
        .unwrap_or("0");
    let post_copy = flag("allowPostCopy").unwrap_or(false);
    // `configureParallelMigrationThreads`: none for a VMI with a CPU limit or dedicated CPUs.
    let cpu = vmi.spec.domain.cpu.as_ref();
    let dedicated = cpu.is_some_and(|c| c.dedicated_cpu_placement == Some(true));
    let limited = vmi
        .spec
        .domain
        .resources
        .as_ref()
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| l.contains_key("cpu"));
    let threads = if dedicated || limited {
        Value::Null
    } else {
        json!(8)
    };
    json!({
        "Bandwidth": bandwidth,
        "ProgressTimeout": int("progressTimeout", 150),
        "CompletionTimeoutPerGiB": int("completionTimeoutPerGiB", 150),
        "MaxDowntimeMs": config.get("maxDowntimeMs").and_then(Value::as_u64).unwrap_or(900),
        "UnsafeMigration": flag("unsafeMigrationOverride").unwrap_or(false),
        "AllowAutoConverge": flag("allowAutoConverge").unwrap_or(false),
        "AllowPostCopy": post_copy,
        "ParallelMigrationThreads": threads,
        "AllowWorkloadDisruption": flag("allowWorkloadDisruption").unwrap_or(post_copy),
        "StallDetectorOptions": null,
        "Compression": null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::jiff::Timestamp;
    use proto::domain::{LifeCycle, MigrationMetadata, StateChangeReason};
    use proto::kubevirt::Time;

    fn state(extra: Value) -> MigrationState {
        let mut base =
            json!({"migrationUid": "m1", "sourceNode": "node-a", "targetNode": "node-b"});
        base.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    fn running(metadata: Option<MigrationMetadata>) -> Domain {
        let mut d = Domain::new("default", "v", "vmi-uid");
        d.status.status = LifeCycle::Running;
        d.status.reason = StateChangeReason::Unknown;
        d.spec.metadata.kubevirt.migration = metadata;
        d
    }

    fn at(s: i64) -> Option<Time> {
        Some(Time(Timestamp::from_second(s).unwrap()))
    }

    fn decide_with(state: &MigrationState, domain: Option<&Domain>, listening: bool) -> SourceStep {
        decide(&SourceFacts {
            state,
            domain,
            listening,
        })
    }

    const READY: &str = r#"{"targetNodeAddress": "10.0.0.2", "targetDirectMigrationNodePorts": {"41000": 49152, "41001": 0}}"#;

    #[test]
    fn it_waits_for_the_target_then_migrates_to_its_stream_port() {
        let idle = running(None);
        assert_eq!(
            decide_with(&state(json!({})), Some(&idle), false),
            SourceStep::WaitForTarget
        );
        let ready = state(serde_json::from_str(READY).unwrap());
        assert_eq!(
            decide_with(&ready, Some(&idle), false),
            SourceStep::Migrate {
                address: "10.0.0.2".into(),
                port: 41000
            }
        );
        // No live domain: nothing (the main loop deals with it).
        assert!(matches!(
            decide_with(&ready, None, false),
            SourceStep::Nothing(_)
        ));
    }

    #[test]
    fn the_launchers_report_is_copied_and_only_a_failure_ends_it_here() {
        let ready = state(serde_json::from_str(READY).unwrap());
        let started = MigrationMetadata {
            uid: "m1".into(),
            start_timestamp: at(100),
            mode: "PreCopy".into(),
            ..Default::default()
        };
        let migrating = running(Some(started.clone()));
        assert_eq!(
            decide_with(&ready, Some(&migrating), true),
            SourceStep::Report(json!({"status": {"migrationState": {
                "startTimestamp": "1970-01-01T00:01:40Z", "mode": "PreCopy"
            }}}))
        );
        let copied = state(json!({"startTimestamp": "1970-01-01T00:01:40Z", "mode": "PreCopy"}));
        assert_eq!(
            decide_with(&copied, Some(&migrating), true),
            SourceStep::Nothing("migration in progress")
        );
        // Another migration's metadata is not copied.
        let mut other = started.clone();
        other.uid = "m0".into();
        other.end_timestamp = at(90);
        assert_eq!(
            decide_with(&ready, Some(&running(Some(other))), false),
            SourceStep::Migrate {
                address: "10.0.0.2".into(),
                port: 41000
            }
        );
        let failed = MigrationMetadata {
            end_timestamp: at(120),
            failed: true,
            failure_reason: "Live migration has been aborted".into(),
            abort_status: "Succeeded".into(),
            ..started
        };
        let SourceStep::Report(patch) =
            decide_with(&copied, Some(&running(Some(failed.clone()))), true)
        else {
            panic!("expected the failure copied")
        };
        assert_eq!(
            patch["status"]["migrationState"],
            json!({"failed": true, "completed": true, "endTimestamp": "1970-01-01T00:02:00Z",
                   "abortStatus": "Succeeded", "failureReason": "Live migration has been aborted"})
        );
        let over = state(
            json!({"failed": true, "completed": true, "endTimestamp": "1970-01-01T00:02:00Z"}),
        );
        assert_eq!(
            decide_with(&over, Some(&running(Some(failed))), true),
            SourceStep::StopProxy
        );
        assert!(matches!(
            decide_with(&over, None, false),
            SourceStep::Nothing(_)
        ));
    }

    #[test]
    fn a_migration_that_ended_before_its_start_was_copied_still_reports_the_start() {
        let mut migrated = running(Some(MigrationMetadata {
            uid: "m1".into(),
            start_timestamp: at(100),
            end_timestamp: at(101),
            mode: "PreCopy".into(),
            ..Default::default()
        }));
        migrated.status.status = LifeCycle::Shutoff;
        migrated.status.reason = StateChangeReason::Migrated;
        let ready = state(serde_json::from_str(READY).unwrap());
        let SourceStep::Report(patch) = decide_with(&ready, Some(&migrated), true) else {
            panic!("expected the start copied")
        };
        assert_eq!(
            patch["status"]["migrationState"]["startTimestamp"],
            "1970-01-01T00:01:40Z"
        );
        // Success is not the source's to report: no end, no completed.
        assert!(
            patch["status"]["migrationState"]
                .get("endTimestamp")
                .is_none()
        );
        let copied = state(json!({"startTimestamp": "1970-01-01T00:01:40Z", "mode": "PreCopy"}));
        assert!(matches!(
            decide_with(&copied, Some(&migrated), true),
            SourceStep::Nothing(_)
        ));
    }

    #[test]
    fn an_abort_request_cancels_once() {
        let migrating = running(Some(MigrationMetadata {
            uid: "m1".into(),
            start_timestamp: at(100),
            mode: "PreCopy".into(),
            ..Default::default()
        }));
        let asked = state(
            json!({"abortRequested": true, "startTimestamp": "1970-01-01T00:01:40Z", "mode": "PreCopy"}),
        );
        assert_eq!(
            decide_with(&asked, Some(&migrating), true),
            SourceStep::Cancel
        );
        let mut aborting = migrating.clone();
        aborting
            .spec
            .metadata
            .kubevirt
            .migration
            .as_mut()
            .unwrap()
            .abort_status = "Aborting".into();
        assert_eq!(
            decide_with(&asked, Some(&aborting), true),
            SourceStep::Nothing("migration in progress")
        );
    }

    #[test]
    fn options_follow_the_resolved_configuration_with_kubevirts_defaults() {
        let vmi: VirtualMachineInstance = serde_json::from_value(json!({
            "metadata": {"name": "v"}, "spec": {"domain": {"devices": {}}}
        }))
        .unwrap();
        let defaults = migration_options(&vmi, &state(json!({})));
        assert_eq!(
            defaults,
            serde_json::from_str::<Value>(r#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,"MaxDowntimeMs":900,"UnsafeMigration":false,"AllowAutoConverge":false,"AllowPostCopy":false,"ParallelMigrationThreads":8,"AllowWorkloadDisruption":false,"StallDetectorOptions":null,"Compression":null}"#).unwrap()
        );
        let configured = migration_options(
            &vmi,
            &state(
                json!({"migrationConfiguration": {"bandwidthPerMigration": "64Mi", "completionTimeoutPerGiB": 20, "allowPostCopy": true}}),
            ),
        );
        assert_eq!(configured["Bandwidth"], "64Mi");
        assert_eq!(configured["CompletionTimeoutPerGiB"], 20);
        assert_eq!(configured["AllowWorkloadDisruption"], true);
    }
}
