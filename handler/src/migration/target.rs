//! The target node's role in a migration (KubeVirt v1.9.0's
//! `pkg/virt-handler/migration-target.go`, `vmm/launcher/docs/migration-contract.md` §4.2),
//! as a pure decision: prepare the target pod and listen, report what the target sees,
//! take the VMI over once the VM runs here, finalize, and clean up.

use k8s_openapi::jiff::Timestamp;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use proto::kubevirt::{MigrationState, Time, well_known};
use serde_json::{Map, Value, json};

/// What the target node knows about one migrating VMI.
#[derive(Debug, Clone, Copy)]
pub struct TargetFacts<'a> {
    pub state: &'a MigrationState,
    /// The target launcher's domain (none before the stream starts).
    pub domain: Option<&'a Domain>,
    /// The port of this node's listener for the VMI, once it listens.
    pub listening: Option<u16>,
    /// This node.
    pub node: &'a str,
    /// The address the listener is reached at (published as `targetNodeAddress`).
    pub address: &'a str,
    pub now: Timestamp,
}

/// What the target handler does next.
#[derive(Debug, Clone, PartialEq)]
pub enum TargetStep {
    /// Set up the target pod's network, `SyncMigrationTarget`, start the listener.
    Prepare,
    /// Write what the target sees (a JSON merge patch of the VMI).
    Report(Value),
    /// The VM runs here: write the hand-over (the VMI is this node's from now on).
    HandOver(Value),
    /// `FinalizeVirtualMachineMigration`, then `completed`.
    Finalize,
    /// The migration is over: on failure tell the target launcher to go; on success
    /// finalize again (idempotent); then drop the label and stop listening.
    Cleanup { failed: bool },
    /// Nothing to do until something changes.
    Nothing(&'static str),
    /// Look again after this long (the source's head start before the target reports a
    /// broken stream).
    LookAgain(std::time::Duration),
}

/// How long the target leaves the source to report a broken stream itself (with its
/// launcher's reason and abort status) before it ends the migration failed on its own.
pub const SOURCE_REPORT_GRACE: std::time::Duration = std::time::Duration::from_secs(20);

fn time(t: Timestamp) -> Value {
    serde_json::to_value(Time(t)).unwrap_or(Value::Null)
}

/// A domain that counts as running here (`Running`, or paused by the user).
fn domain_ready(domain: &Domain) -> bool {
    domain.status.status == LifeCycle::Running
        || (domain.status.status == LifeCycle::Paused
            && domain.status.reason == StateChangeReason::User)
}

/// Whether the domain is active (`domain.IsActive`-ish: exists and not shut off or
/// crashed).
fn domain_active(domain: &Domain) -> bool {
    !domain.is_gone()
        && !matches!(
            domain.status.status,
            LifeCycle::Shutoff | LifeCycle::Crashed | LifeCycle::Empty | LifeCycle::NoState
        )
}

/// The target's decision for one reconcile.
pub fn decide(facts: &TargetFacts<'_>) -> TargetStep {
    let state = facts.state;
    if state.is_done() {
        return TargetStep::Cleanup {
            failed: state.is_failed(),
        };
    }
    if state.is_failed() {
        return TargetStep::Nothing("migration failed: waiting for its end");
    }
    let handed_over = state.end_timestamp.is_some();
    if handed_over {
        return TargetStep::Finalize;
    }
    // The incoming domain was seen here and is gone before the VM arrived: the stream broke
    // (the source launcher died, or this launcher's receive failed, a cancel included) and
    // nothing will come. A living source reports its failure itself, with its launcher's
    // reason and abort status, and gets a head start; a dead one cannot, and without this the
    // VMI would stay "migrating" for good, which the source node's main loop leaves alone.
    let gone_since = facts
        .domain
        .filter(|d| d.is_gone())
        .and_then(|d| d.object_meta.deletion_timestamp.as_ref())
        .map(|t| t.0);
    if state.target_node_domain_detected == Some(true)
        && let Some(since) = gone_since
    {
        let waited =
            std::time::Duration::try_from(facts.now.duration_since(since)).unwrap_or_default();
        if let Some(left) = SOURCE_REPORT_GRACE
            .checked_sub(waited)
            .filter(|l| !l.is_zero())
        {
            return TargetStep::LookAgain(left);
        }
        let mut failed = json!({
            "failed": true,
            "completed": true,
            "endTimestamp": time(facts.now),
            "failureReason": "the target's domain went away before the VM arrived",
        });
        if state.start_timestamp.is_none() {
            failed["startTimestamp"] = time(facts.now);
        }
        return TargetStep::Report(json!({"status": {"migrationState": failed}}));
    }
    let uid = state.migration_uid.as_deref().unwrap_or_default();
    let domain = facts.domain.filter(|d| !d.is_gone());
    // A domain of this migration is here already: the preparation is done, even if this
    // handler restarted since and lost its listener (preparing again would be refused by
    // the launcher, and the hand-over would never come).
    let arrived = domain
        .and_then(|d| d.spec.metadata.kubevirt.migration.as_ref())
        .is_some_and(|m| !uid.is_empty() && m.uid == uid);
    if facts.listening.is_none() && !arrived {
        return TargetStep::Prepare;
    }
    let mut migration_state = Map::new();
    if domain.is_some() && state.target_node_domain_detected != Some(true) {
        migration_state.insert("targetNodeDomainDetected".into(), json!(true));
    }
    if domain.is_some_and(domain_ready) && state.target_node_domain_ready_timestamp.is_none() {
        migration_state.insert("targetNodeDomainReadyTimestamp".into(), time(facts.now));
    }
    if let Some(port) = facts.listening {
        let ports = std::collections::BTreeMap::from([(
            port.to_string(),
            i32::from(well_known::DIRECT_MIGRATION_PORT),
        )]);
        if state.target_node_address.as_deref() != Some(facts.address)
            || state.target_direct_migration_node_ports.as_ref() != Some(&ports)
        {
            migration_state.insert("targetNodeAddress".into(), json!(facts.address));
            migration_state.insert("targetDirectMigrationNodePorts".into(), json!(ports));
        }
    }
    // The target launcher's metadata says the VM runs here: the success signal.
    let ended_here = domain
        .and_then(|d| d.spec.metadata.kubevirt.migration.as_ref())
        .filter(|m| m.uid == uid && m.end_timestamp.is_some());
    if let Some(metadata) = ended_here {
        let domain = domain.expect("metadata comes from the domain");
        let end = metadata
            .end_timestamp
            .clone()
            .map(|t| t.0)
            .unwrap_or(facts.now);
        migration_state.insert("endTimestamp".into(), time(end));
        if state.start_timestamp.is_none() {
            let start = metadata.start_timestamp.clone().map(|t| t.0).unwrap_or(end);
            migration_state.insert("startTimestamp".into(), time(start));
        }
        if !domain_active(domain) {
            migration_state.insert("failed".into(), json!(true));
            migration_state.insert("completed".into(), json!(true));
            return TargetStep::Report(json!({"status": {"migrationState": migration_state}}));
        }
        return TargetStep::HandOver(json!({
            "metadata": {
                "labels": {
                    well_known::NODE_NAME_LABEL: facts.node,
                    well_known::OUTDATED_LAUNCHER_IMAGE_LABEL: null,
                },
                "annotations": { well_known::EVICTION_SOURCE_ANNOTATION: null },
            },
            "status": {
                "nodeName": facts.node,
                "migrationState": migration_state,
                "launcherContainerImageVersion": null,
                "evacuationNodeName": null,
                "migrationTransport": "Unix",
            }
        }));
    }
    if migration_state.is_empty() {
        return TargetStep::Nothing("waiting for the migration");
    }
    TargetStep::Report(json!({"status": {"migrationState": migration_state}}))
}

/// `completed`, written once FinalizeVirtualMachineMigration answered.
pub fn completed_patch() -> Value {
    json!({"status": {"migrationState": {"completed": true}}})
}

/// The end of the target's part: the label that made this node look goes (and, after a
/// success, the annotation that asked for a target).
pub fn cleanup_patch(failed: bool) -> Value {
    let mut patch =
        json!({"metadata": {"labels": {well_known::MIGRATION_TARGET_NODE_NAME_LABEL: null}}});
    if !failed {
        patch["metadata"]["annotations"] =
            json!({well_known::CREATE_MIGRATION_TARGET_ANNOTATION: null});
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::MigrationMetadata;

    const NODE: &str = "node-b";
    const ADDRESS: &str = "10.0.0.2";

    fn state(extra: Value) -> MigrationState {
        let mut base = json!({"migrationUid": "m1", "sourceNode": "node-a", "targetNode": NODE});
        base.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        serde_json::from_value(base).unwrap()
    }

    /// The state once the target published its port and the source started.
    fn published() -> Value {
        json!({
            "targetNodeAddress": ADDRESS,
            "targetDirectMigrationNodePorts": {"41000": 49152},
            "startTimestamp": "2026-12-05T10:00:00Z",
        })
    }

    fn domain(status: LifeCycle, reason: StateChangeReason, end: bool) -> Domain {
        let mut d = Domain::new("default", "v", "vmi-uid");
        d.status.status = status;
        d.status.reason = reason;
        d.spec.metadata.kubevirt.migration = Some(MigrationMetadata {
            uid: "m1".into(),
            start_timestamp: Some(Time(Timestamp::from_second(100).unwrap())),
            end_timestamp: end.then(|| Time(Timestamp::from_second(105).unwrap())),
            mode: "PreCopy".into(),
            ..Default::default()
        });
        d
    }

    fn decide_with(
        state: &MigrationState,
        domain: Option<&Domain>,
        port: Option<u16>,
    ) -> TargetStep {
        decide(&TargetFacts {
            state,
            domain,
            listening: port,
            node: NODE,
            address: ADDRESS,
            now: Timestamp::from_second(110).unwrap(),
        })
    }

    #[test]
    fn a_fresh_hand_off_prepares_then_publishes_the_listener() {
        let fresh = state(json!({}));
        assert_eq!(decide_with(&fresh, None, None), TargetStep::Prepare);
        let TargetStep::Report(patch) = decide_with(&fresh, None, Some(41000)) else {
            panic!("expected a report")
        };
        assert_eq!(
            patch,
            json!({"status": {"migrationState": {
                "targetNodeAddress": ADDRESS,
                "targetDirectMigrationNodePorts": {"41000": 49152}
            }}})
        );
        let published = state(json!({
            "targetNodeAddress": ADDRESS,
            "targetDirectMigrationNodePorts": {"41000": 49152}
        }));
        assert!(matches!(
            decide_with(&published, None, Some(41000)),
            TargetStep::Nothing(_)
        ));
        // Another port (a restarted listener) is published again.
        assert!(matches!(
            decide_with(&published, None, Some(41001)),
            TargetStep::Report(_)
        ));
    }

    #[test]
    fn the_incoming_domain_is_reported_and_its_end_hands_the_vmi_over() {
        let published = state(published());
        let incoming = domain(LifeCycle::Paused, StateChangeReason::Migration, false);
        assert_eq!(
            decide_with(&published, Some(&incoming), Some(41000)),
            TargetStep::Report(
                json!({"status": {"migrationState": {"targetNodeDomainDetected": true}}})
            )
        );
        let running = domain(LifeCycle::Running, StateChangeReason::Unknown, true);
        let TargetStep::HandOver(patch) = decide_with(&published, Some(&running), Some(41000))
        else {
            panic!("expected the hand-over")
        };
        assert_eq!(
            patch["metadata"]["labels"][well_known::NODE_NAME_LABEL],
            NODE
        );
        assert_eq!(patch["status"]["nodeName"], NODE);
        let ms = &patch["status"]["migrationState"];
        assert_eq!(ms["endTimestamp"], "1970-01-01T00:01:45Z");
        assert_eq!(ms["targetNodeDomainDetected"], true);
        assert_eq!(ms["targetNodeDomainReadyTimestamp"], "1970-01-01T00:01:50Z");
        assert!(
            ms.get("startTimestamp").is_none(),
            "the source's start is kept"
        );
        // A running domain whose metadata is of another migration hands nothing over.
        let mut other = running.clone();
        other.spec.metadata.kubevirt.migration.as_mut().unwrap().uid = "m0".into();
        assert!(matches!(
            decide_with(&published, Some(&other), Some(41000)),
            TargetStep::Report(_)
        ));
        // The end with a domain that died: failed, not handed over.
        let dead = domain(LifeCycle::Shutoff, StateChangeReason::Crashed, true);
        let TargetStep::Report(patch) = decide_with(&published, Some(&dead), Some(41000)) else {
            panic!("expected a failure report")
        };
        assert_eq!(patch["status"]["migrationState"]["failed"], true);
        assert!(patch.get("metadata").is_none());
    }

    #[test]
    fn an_incoming_domain_that_goes_away_before_the_vm_arrived_ends_the_migration_failed() {
        let started = published();
        let gone = Domain::gone(
            "default",
            "v",
            "vmi-uid",
            Time(Timestamp::from_second(100).unwrap()),
        );
        // Not seen here yet: a gone domain (a stale one) says nothing about this migration.
        assert!(!matches!(
            decide_with(&state(started.clone()), Some(&gone), Some(41000)),
            TargetStep::Report(ref p) if p["status"]["migrationState"]["failed"] == true
        ));
        // Seen, then gone: first the source's head start (a living source reports itself)...
        let mut detected = started;
        detected["targetNodeDomainDetected"] = json!(true);
        let detected = state(detected);
        assert_eq!(
            decide_with(&detected, Some(&gone), Some(41000)),
            TargetStep::LookAgain(SOURCE_REPORT_GRACE - std::time::Duration::from_secs(10))
        );
        // ...then the migration ends failed (the source may be dead and cannot say).
        let TargetStep::Report(patch) = decide(&TargetFacts {
            state: &detected,
            domain: Some(&gone),
            listening: Some(41000),
            node: NODE,
            address: ADDRESS,
            now: Timestamp::from_second(130).unwrap(),
        }) else {
            panic!("expected a failure report")
        };
        let ms = &patch["status"]["migrationState"];
        assert_eq!(ms["failed"], true);
        assert_eq!(ms["completed"], true);
        assert_eq!(ms["endTimestamp"], "1970-01-01T00:02:10Z");
        assert!(
            ms.get("startTimestamp").is_none(),
            "the source's start is kept"
        );
        assert!(patch.get("metadata").is_none(), "nothing handed over");
    }

    #[test]
    fn a_handler_restarted_after_the_vm_arrived_hands_over_without_preparing_again() {
        let published = state(published());
        let running = domain(LifeCycle::Running, StateChangeReason::Unknown, true);
        assert!(matches!(
            decide_with(&published, Some(&running), None),
            TargetStep::HandOver(_)
        ));
        let incoming = domain(LifeCycle::Paused, StateChangeReason::Migration, false);
        assert!(matches!(
            decide_with(&published, Some(&incoming), None),
            TargetStep::Report(_) | TargetStep::Nothing(_)
        ));
        // Another migration's domain does not count.
        let mut other = running.clone();
        other.spec.metadata.kubevirt.migration.as_mut().unwrap().uid = "m0".into();
        assert_eq!(
            decide_with(&published, Some(&other), None),
            TargetStep::Prepare
        );
    }

    #[test]
    fn after_the_hand_over_it_finalizes_then_cleans_up() {
        let handed = state(
            json!({"startTimestamp": "2026-12-05T10:00:00Z", "endTimestamp": "2026-12-05T10:00:01Z"}),
        );
        let running = domain(LifeCycle::Running, StateChangeReason::Unknown, true);
        assert_eq!(
            decide_with(&handed, Some(&running), Some(41000)),
            TargetStep::Finalize
        );
        // After a handler restart (no listener) too: nothing is prepared again.
        assert_eq!(
            decide_with(&handed, Some(&running), None),
            TargetStep::Finalize
        );
        let done = state(json!({"endTimestamp": "2026-12-05T10:00:01Z", "completed": true}));
        assert_eq!(
            decide_with(&done, Some(&running), None),
            TargetStep::Cleanup { failed: false }
        );
        let failed = state(
            json!({"endTimestamp": "2026-12-05T10:00:01Z", "failed": true, "completed": true}),
        );
        assert_eq!(
            decide_with(&failed, None, Some(41000)),
            TargetStep::Cleanup { failed: true }
        );
        let failing = state(json!({"failed": true}));
        assert!(matches!(
            decide_with(&failing, None, Some(41000)),
            TargetStep::Nothing(_)
        ));
        assert_eq!(
            cleanup_patch(true),
            json!({"metadata": {"labels": {"kubevirt.io/migrationTargetNodeName": null}}})
        );
        assert_eq!(
            cleanup_patch(false)["metadata"]["annotations"],
            json!({"kubevirt.io/create-migration-target": null})
        );
    }
}
