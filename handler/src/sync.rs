//! The decision table of KubeVirt v1.9.0's handler (proto/CONTRACT.md §3.3–§3.6), as pure functions.
//!
//! Nothing here does I/O: the agent gathers the VMI, the cached domain and what it knows
//! about the launcher, asks [`decide`] what to do and [`calculate_phase`] what the VMI's
//! phase is, and carries both out. Every row of the contract's tables is a test below.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use proto::kubevirt::{Phase, VirtualMachineInstance, well_known};

/// What the agent knows about the launcher of a VMI (proto/CONTRACT.md §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LauncherState {
    /// Connected and answering (the `launcher-sock` exists and CmdInfo negotiated).
    Ready,
    /// No socket yet, but the pod may still be starting (under 3 min, pod dir present).
    NotReady,
    /// Socket gone, marked unresponsive, pod dir gone, or never appeared in time.
    Unresponsive,
}

/// One step of the graceful-shutdown state machine (proto/CONTRACT.md §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShutdownStep {
    /// Send `ShutdownVirtualMachine` and look again after `recheck`.
    Shutdown { recheck: Duration },
    /// Already `ShuttingDown`: just look again after `recheck`.
    Wait { recheck: Duration },
    /// Grace period 0 or expired: `KillVirtualMachine`.
    Kill,
}

/// What the reconcile of one VMI should do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// `execute` returns before `sync`: the VMI is not this handler's business right now
    /// (another node's, migrating, launcher state unknown). Neither the VM nor the
    /// status is touched.
    Ignore(&'static str),
    /// `sync` ran and found nothing to do (with why, for the decision log); the status
    /// is still brought up to date.
    Nothing(&'static str),
    /// The launcher socket is not there or not answering yet: look again soon. KubeVirt
    /// looks again after a fixed second; the agent polls from a few milliseconds up to
    /// that second, so a launcher that comes up fast is taken over at once.
    WaitForLauncher,
    /// The domain belongs to an older VMI with the same name: clean its launcher up once it
    /// is unresponsive (proto/CONTRACT.md §3.3 step 3).
    CleanupStale { old_uid: String },
    /// Stop the VM gracefully, or kill it.
    Shutdown(ShutdownStep),
    /// The domain can never recover (`Paused/PostcopyFailed`): kill it, the VMI fails.
    ForceDestroy,
    /// `DeleteVirtualMachine` (domain present but dead) then local clean-up.
    Delete,
    /// No domain and nothing more will happen to the VMI: local clean-up only
    /// (ghost record, client, notify pipe).
    Cleanup,
    /// The VMI migrated to another node and its old launcher here is gone: local clean-up
    /// only, and no status (the VMI is the other node's).
    CleanupMigratedAway,
    /// `SyncVirtualMachine` (starts the VM the first time, idempotent afterwards).
    Update,
}

/// The facts one decision is made from.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    /// `None` when the VMI object is gone.
    pub vmi: Option<&'a VirtualMachineInstance>,
    /// `None` when there is no domain in the cache; a deletion-marked domain is passed
    /// as is (the functions here treat it as absent, like `getDomainFromCache`).
    pub domain: Option<&'a Domain>,
    pub launcher: LauncherState,
    /// This node's name (`--hostname-override`).
    pub node: &'a str,
    pub now: Timestamp,
}

impl Action {
    /// Whether the reconcile goes on to write the status (`updateVMIStatus`): not after
    /// an early return of `execute` (ignored VMI, stale domain of an older VMI, whose
    /// state says nothing about this VMI).
    pub(crate) fn updates_status(&self) -> bool {
        !matches!(
            self,
            Action::Ignore(_) | Action::CleanupStale { .. } | Action::CleanupMigratedAway
        )
    }
}

impl Facts<'_> {
    /// The domain, unless it is absent or marked deleted.
    fn live_domain(&self) -> Option<&Domain> {
        self.domain.filter(|d| !d.is_gone())
    }
}

/// `domainAlive`: exists and not `Shutoff`, `Crashed` or the empty state.
pub(crate) fn domain_alive(domain: Option<&Domain>) -> bool {
    domain.is_some_and(|d| {
        !d.is_gone()
            && !matches!(
                d.status.status,
                LifeCycle::Shutoff | LifeCycle::Crashed | LifeCycle::Empty
            )
    })
}

/// Migration in progress (`isMigrationInProgress`): a migration started and not ended in
/// the domain metadata, or a domain paused for a migration.
pub(crate) fn migration_in_progress(domain: &Domain) -> bool {
    let paused_for_migration = domain.status.status == LifeCycle::Paused
        && matches!(
            domain.status.reason,
            StateChangeReason::Migration
                | StateChangeReason::StartingUp
                | StateChangeReason::Postcopy
        );
    let metadata_says_migrating = domain
        .spec
        .metadata
        .kubevirt
        .migration
        .as_ref()
        .is_some_and(|m| m.start_timestamp.is_some() && m.end_timestamp.is_none());
    paused_for_migration || metadata_says_migrating
}

/// Whether this node owns the VMI: the `kubevirt.io/nodeName` label, else `status.nodeName`.
pub(crate) fn owned_by_node(vmi: &VirtualMachineInstance, node: &str) -> bool {
    let label = vmi
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(well_known::NODE_NAME_LABEL));
    match label {
        Some(owner) => owner == node,
        None => vmi
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .is_some_and(|owner| owner == node),
    }
}

fn vmi_uid(vmi: &VirtualMachineInstance) -> &str {
    vmi.metadata.uid.as_deref().unwrap_or("")
}

/// The reconcile decision (proto/CONTRACT.md §3.3 `execute` then §3.4 `sync`).
pub fn decide(facts: &Facts<'_>) -> Action {
    // §3.3 step 3: a domain of an older VMI with the same name. Its UID is kept even when
    // the domain is marked deleted.
    if let (Some(vmi), Some(domain)) = (facts.vmi, facts.domain) {
        let domain_uid = domain.spec.metadata.kubevirt.uid.as_str();
        if !domain_uid.is_empty() && domain_uid != vmi_uid(vmi) {
            return Action::CleanupStale {
                old_uid: domain_uid.to_string(),
            };
        }
    }
    let domain = facts.live_domain();
    if let Some(d) = domain {
        // §3.4: the launcher could not be asked; nothing is known.
        if d.status.status == LifeCycle::Unknown {
            return Action::Ignore("domain state Unknown (launcher unreachable)");
        }
        // §3.3 step 4: the domain migrated away.
        if d.status.status == LifeCycle::Shutoff && d.status.reason == StateChangeReason::Migrated {
            return Action::Delete;
        }
        // §3.3 step 5 (not for a VMI being deleted: it is shut down).
        if migration_in_progress(d)
            && facts
                .vmi
                .is_none_or(|v| v.metadata.deletion_timestamp.is_none())
        {
            return Action::Ignore("migration in progress");
        }
    }
    // A migration the VMI reports started and not ended (`isMigrationInProgress` reads the
    // VMI too): between the source's success and the target's hand-over the source's domain
    // is gone while the VMI still names this node; it must not look crashed.
    if let Some(vmi) = facts.vmi
        && vmi.metadata.deletion_timestamp.is_none()
        && vmi
            .migration_state()
            .ok()
            .flatten()
            .is_some_and(|s| s.start_timestamp.is_some() && s.end_timestamp.is_none())
    {
        return Action::Ignore("migration in progress (VMI)");
    }
    // A migration from this node that ended well: the VMI is the target node's now, even
    // where this node's copy still names this one (the hand-over's writes in flight).
    if let Some(vmi) = facts.vmi
        && vmi.migration_state().ok().flatten().is_some_and(|s| {
            s.source_node.as_deref() == Some(facts.node)
                && s.target_node.as_deref().is_some_and(|t| t != facts.node)
                && s.end_timestamp.is_some()
                && !s.is_failed()
        })
        && facts.domain.is_none_or(|d| d.is_gone())
    {
        // A domain marked gone here (the watchdog found the old launcher's socket dead, a
        // client the handler reopened while that launcher exited): its local records go,
        // as v1.9.0 deletes a deleted domain before it asks who owns the VMI.
        if facts.domain.is_some() {
            return Action::CleanupMigratedAway;
        }
        return Action::Ignore("the VMI migrated to another node");
    }
    // §3.3 step 6: VMIs of other nodes are never touched.
    if let Some(vmi) = facts.vmi
        && !owned_by_node(vmi, facts.node)
    {
        return Action::Ignore("VMI is not owned by this node");
    }

    let alive = domain_alive(domain);
    let exists = domain.is_some();
    let mut should_shutdown = false;
    let mut should_delete = false;
    let mut should_update = false;
    let mut force_destroy = false;

    let stop = |shutdown: &mut bool, delete: &mut bool| {
        if alive {
            *shutdown = true
        } else {
            *delete = true
        }
    };

    match facts.vmi {
        None => stop(&mut should_shutdown, &mut should_delete),
        Some(vmi) => {
            let phase = vmi.phase();
            let graceful_requested = domain
                .and_then(|d| d.spec.metadata.kubevirt.grace_period.as_ref())
                .and_then(|g| g.marked_for_graceful_shutdown)
                .unwrap_or(false);
            if graceful_requested && phase == Phase::Running {
                stop(&mut should_shutdown, &mut should_delete);
            }
            if vmi.metadata.deletion_timestamp.is_some() {
                stop(&mut should_shutdown, &mut should_delete);
            }
            if phase.is_final() {
                should_delete = true;
            }
            if exists && !alive && !phase.is_final() {
                should_delete = true;
            }
            if !phase.is_final() && calculate_phase(facts) == phase {
                should_update = true;
            }
            if let Some(d) = domain
                && d.status.status == LifeCycle::Paused
                && d.status.reason == StateChangeReason::PostcopyFailed
            {
                force_destroy = true;
            }
        }
    }

    if should_shutdown {
        return Action::Shutdown(shutdown_step(facts));
    }
    if force_destroy {
        return Action::ForceDestroy;
    }
    if should_delete {
        return if exists {
            Action::Delete
        } else {
            Action::Cleanup
        };
    }
    if should_update {
        return match facts.launcher {
            LauncherState::Ready => Action::Update,
            // "client not initialized": look again soon (§3.6).
            LauncherState::NotReady => Action::WaitForLauncher,
            LauncherState::Unresponsive => Action::Nothing("launcher unresponsive"),
        };
    }
    Action::Nothing("VMI and domain agree")
}

/// The grace period in force (proto/CONTRACT.md §3.5): the domain's `DeletionGracePeriodSeconds`
/// decides whether there is one at all; if so the VMI's own value wins.
pub fn grace_period_seconds(vmi: Option<&VirtualMachineInstance>, domain: &Domain) -> i64 {
    let domain_grace = domain
        .spec
        .metadata
        .kubevirt
        .grace_period
        .as_ref()
        .map(|g| g.deletion_grace_period_seconds)
        .unwrap_or(0);
    if domain_grace == 0 {
        return 0;
    }
    vmi.and_then(|v| v.spec.termination_grace_period_seconds)
        .unwrap_or(domain_grace)
}

/// The next step of a graceful shutdown (`helperVmShutdown`, `hasGracePeriodExpired`).
pub(crate) fn shutdown_step(facts: &Facts<'_>) -> ShutdownStep {
    let Some(domain) = facts.live_domain() else {
        return ShutdownStep::Kill;
    };
    let grace = grace_period_seconds(facts.vmi, domain);
    if grace <= 0 {
        return ShutdownStep::Kill;
    }
    let recheck_cap = Duration::from_secs(5);
    let started = domain
        .spec
        .metadata
        .kubevirt
        .grace_period
        .as_ref()
        .and_then(|g| g.deletion_timestamp.as_ref())
        .map(|t| t.0);
    let Some(started) = started else {
        return ShutdownStep::Shutdown {
            recheck: recheck_cap.min(Duration::from_secs(grace.unsigned_abs())),
        };
    };
    let elapsed = (facts.now.as_millisecond() - started.as_millisecond()).max(0);
    let grace_ms = grace.saturating_mul(1000);
    if elapsed >= grace_ms {
        return ShutdownStep::Kill;
    }
    let remaining = Duration::from_millis((grace_ms - elapsed).unsigned_abs());
    let recheck = recheck_cap.min(remaining);
    if domain.status.status == LifeCycle::ShuttingDown {
        ShutdownStep::Wait { recheck }
    } else {
        ShutdownStep::Shutdown { recheck }
    }
}

/// Whether a `Shutoff/Destroyed` domain means the VM was killed while it should have shut
/// down on ACPI (then the VMI failed): ACPI present and a non-zero grace period.
fn destroyed_means_failed(vmi: &VirtualMachineInstance, domain: &Domain) -> bool {
    let acpi = domain
        .spec
        .features
        .as_ref()
        .is_some_and(|f| f.acpi.is_some());
    if !acpi {
        return false;
    }
    match vmi.spec.termination_grace_period_seconds {
        Some(grace) => grace != 0,
        None => domain
            .spec
            .metadata
            .kubevirt
            .grace_period
            .as_ref()
            .is_some_and(|g| g.deletion_grace_period_seconds != 0),
    }
}

/// The VMI phase the domain implies (`calculateVmPhaseForStatusReason`, proto/CONTRACT.md §3.6).
/// Without a VMI there is no phase: returns `Unset`.
pub(crate) fn calculate_phase(facts: &Facts<'_>) -> Phase {
    let Some(vmi) = facts.vmi else {
        return Phase::Unset;
    };
    let current = vmi.phase();
    let Some(domain) = facts.live_domain() else {
        return match current {
            Phase::Scheduled => match facts.launcher {
                LauncherState::Unresponsive => Phase::Failed,
                LauncherState::Ready | LauncherState::NotReady => Phase::Scheduled,
            },
            Phase::Running => Phase::Failed,
            p if p.is_final() => p,
            _ => Phase::Scheduled,
        };
    };
    use LifeCycle as L;
    use StateChangeReason as R;
    match (domain.status.status, domain.status.reason) {
        (L::Shutoff | L::Crashed, R::Crashed | R::Panicked) => Phase::Failed,
        (L::Shutoff | L::Crashed, R::Destroyed) => {
            if destroyed_means_failed(vmi, domain) {
                Phase::Failed
            } else {
                Phase::Succeeded
            }
        }
        (L::Shutoff | L::Crashed, R::Shutdown | R::Saved | R::FromSnapshot) => Phase::Succeeded,
        (L::Shutoff | L::Crashed, _) => current,
        (L::Paused, R::PostcopyFailed) => Phase::Failed,
        (L::Paused, _) => Phase::Running,
        (L::Running | L::Blocked | L::PMSuspended, _) => Phase::Running,
        (L::NoState | L::ShuttingDown | L::Unknown | L::Empty, _) => current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::{Empty, Features, GracePeriodMetadata};
    use proto::kubevirt::{Time, VirtualMachineInstanceStatus};

    const NODE: &str = "node01";
    const UID: &str = "8a4e0c3e-6b0c-4d1e-9a52-2b8f0b3c1d11";

    fn now() -> Timestamp {
        "2026-08-22T10:00:00Z".parse().expect("valid time")
    }

    fn ago(seconds: i64) -> Time {
        Time(Timestamp::from_second(now().as_second() - seconds).expect("valid time"))
    }

    fn vmi(phase: Phase) -> VirtualMachineInstance {
        let mut vmi = proto::kubevirt::parse_vmi(
            r#"{"apiVersion":"kubevirt.io/v1","kind":"VirtualMachineInstance",
                "metadata":{"name":"vmi","namespace":"default",
                            "uid":"8a4e0c3e-6b0c-4d1e-9a52-2b8f0b3c1d11",
                            "labels":{"kubevirt.io/nodeName":"node01"}},
                "spec":{"domain":{"devices":{}}}}"#,
        )
        .expect("valid VMI");
        vmi.status = Some(VirtualMachineInstanceStatus {
            phase: Some(phase),
            ..Default::default()
        });
        vmi
    }

    fn domain(status: LifeCycle, reason: StateChangeReason) -> Domain {
        let mut d = Domain::new("default", "vmi", UID);
        d.status.status = status;
        d.status.reason = reason;
        d.spec.features = Some(Features {
            acpi: Some(Empty {}),
            ..Default::default()
        });
        d.spec.metadata.kubevirt.grace_period = Some(GracePeriodMetadata {
            deletion_grace_period_seconds: 30,
            ..Default::default()
        });
        d
    }

    fn facts<'a>(
        vmi: Option<&'a VirtualMachineInstance>,
        domain: Option<&'a Domain>,
        launcher: LauncherState,
    ) -> Facts<'a> {
        Facts {
            vmi,
            domain,
            launcher,
            node: NODE,
            now: now(),
        }
    }

    fn running() -> Domain {
        domain(LifeCycle::Running, StateChangeReason::Unknown)
    }

    fn deleting(mut vmi: VirtualMachineInstance) -> VirtualMachineInstance {
        vmi.metadata.deletion_timestamp = Some(Time(now()));
        vmi
    }

    // ---- §3.4 rows

    #[test]
    fn unknown_domain_state_skips_the_vmi() {
        let v = vmi(Phase::Running);
        let d = domain(LifeCycle::Unknown, StateChangeReason::Unknown);
        assert!(matches!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Ignore(_)
        ));
    }

    #[test]
    fn marked_for_graceful_shutdown_on_running_vmi_shuts_down_alive_domain() {
        let v = vmi(Phase::Running);
        let mut d = running();
        if let Some(g) = d.spec.metadata.kubevirt.grace_period.as_mut() {
            g.marked_for_graceful_shutdown = Some(true);
        }
        assert!(matches!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Shutdown(ShutdownStep::Shutdown { .. })
        ));
    }

    #[test]
    fn marked_for_graceful_shutdown_on_dead_domain_deletes() {
        let v = vmi(Phase::Running);
        let mut d = domain(LifeCycle::Shutoff, StateChangeReason::Shutdown);
        if let Some(g) = d.spec.metadata.kubevirt.grace_period.as_mut() {
            g.marked_for_graceful_shutdown = Some(true);
        }
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Delete
        );
    }

    #[test]
    fn vmi_gone_with_alive_domain_shuts_down() {
        let d = running();
        assert!(matches!(
            decide(&facts(None, Some(&d), LauncherState::Ready)),
            Action::Shutdown(_)
        ));
    }

    #[test]
    fn vmi_gone_with_dead_domain_deletes() {
        let d = domain(LifeCycle::Shutoff, StateChangeReason::Destroyed);
        assert_eq!(
            decide(&facts(None, Some(&d), LauncherState::Ready)),
            Action::Delete
        );
    }

    #[test]
    fn vmi_gone_without_domain_cleans_up() {
        assert_eq!(
            decide(&facts(None, None, LauncherState::Unresponsive)),
            Action::Cleanup
        );
    }

    #[test]
    fn deleted_vmi_with_alive_domain_shuts_down() {
        let v = deleting(vmi(Phase::Running));
        let d = running();
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Shutdown(ShutdownStep::Shutdown {
                recheck: Duration::from_secs(5)
            })
        );
    }

    #[test]
    fn deleted_vmi_with_dead_domain_deletes() {
        let v = deleting(vmi(Phase::Running));
        let d = domain(LifeCycle::Shutoff, StateChangeReason::Shutdown);
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Delete
        );
    }

    #[test]
    fn final_vmi_deletes_its_domain() {
        for phase in [Phase::Succeeded, Phase::Failed] {
            let v = vmi(phase);
            let d = domain(LifeCycle::Shutoff, StateChangeReason::Shutdown);
            assert_eq!(
                decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
                Action::Delete
            );
            assert_eq!(
                decide(&facts(Some(&v), None, LauncherState::Unresponsive)),
                Action::Cleanup
            );
        }
    }

    #[test]
    fn final_vmi_with_still_running_domain_deletes_without_shutdown() {
        // The row "VMI final → shouldDelete" does not check aliveness.
        let v = vmi(Phase::Failed);
        let d = running();
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Delete
        );
    }

    #[test]
    fn dead_domain_of_non_final_vmi_is_deleted_even_while_scheduled() {
        for reason in [
            StateChangeReason::Unknown,
            StateChangeReason::Empty,
            StateChangeReason::Shutdown,
        ] {
            let v = vmi(Phase::Scheduled);
            let d = domain(LifeCycle::Shutoff, reason);
            assert_eq!(
                decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
                Action::Delete,
                "reason {reason:?}"
            );
        }
        // The empty state counts as dead too.
        let v = vmi(Phase::Running);
        let d = domain(LifeCycle::Empty, StateChangeReason::Empty);
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Delete
        );
    }

    #[test]
    fn scheduled_vmi_without_domain_is_started_when_launcher_ready() {
        let v = vmi(Phase::Scheduled);
        assert_eq!(
            decide(&facts(Some(&v), None, LauncherState::Ready)),
            Action::Update
        );
        assert!(matches!(
            decide(&facts(Some(&v), None, LauncherState::NotReady)),
            Action::WaitForLauncher
        ));
    }

    #[test]
    fn running_vmi_with_running_domain_is_synced_again() {
        let v = vmi(Phase::Running);
        let d = running();
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Update
        );
    }

    #[test]
    fn no_update_when_phase_is_about_to_change() {
        // Scheduled VMI whose domain runs: status goes Running first, sync on the next pass.
        let v = vmi(Phase::Scheduled);
        let d = running();
        assert!(matches!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Nothing(_)
        ));
        // Running VMI without domain: it fails, it is never restarted.
        let v = vmi(Phase::Running);
        assert!(matches!(
            decide(&facts(Some(&v), None, LauncherState::Ready)),
            Action::Nothing(_)
        ));
    }

    #[test]
    fn postcopy_failed_pause_forces_destroy() {
        let v = vmi(Phase::Running);
        let d = domain(LifeCycle::Paused, StateChangeReason::PostcopyFailed);
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::ForceDestroy
        );
    }

    #[test]
    fn priority_is_shutdown_then_destroy_then_delete_then_update() {
        // Deleted VMI with a postcopy-failed (alive) domain: shutdown wins over destroy.
        let v = deleting(vmi(Phase::Running));
        let d = domain(LifeCycle::Paused, StateChangeReason::PostcopyFailed);
        assert!(matches!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Shutdown(_)
        ));
        // Final VMI: delete wins over update.
        let v = vmi(Phase::Succeeded);
        assert_eq!(
            decide(&facts(
                Some(&v),
                Some(&domain(LifeCycle::Shutoff, StateChangeReason::Shutdown)),
                LauncherState::Ready
            )),
            Action::Delete
        );
    }

    // ---- §3.3 execute

    #[test]
    fn domain_of_older_vmi_is_cleaned_up_as_stale() {
        let v = vmi(Phase::Scheduled);
        let mut d = running();
        d.spec.metadata.kubevirt.uid = "old-uid".into();
        let action = decide(&facts(Some(&v), Some(&d), LauncherState::Ready));
        assert_eq!(
            action,
            Action::CleanupStale {
                old_uid: "old-uid".into()
            }
        );
        assert!(
            !action.updates_status(),
            "the old domain says nothing about this VMI"
        );
        // Also when the stale domain is already marked deleted: the cached UID is kept.
        d.object_meta.deletion_timestamp = Some(Time(now()));
        assert!(matches!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::CleanupStale { .. }
        ));
    }

    #[test]
    fn migrated_domain_is_deleted() {
        let v = vmi(Phase::Running);
        let d = domain(LifeCycle::Shutoff, StateChangeReason::Migrated);
        assert_eq!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Delete
        );
    }

    #[test]
    fn migration_in_progress_is_ignored() {
        let v = vmi(Phase::Running);
        for reason in [
            StateChangeReason::Migration,
            StateChangeReason::StartingUp,
            StateChangeReason::Postcopy,
        ] {
            let d = domain(LifeCycle::Paused, reason);
            assert!(matches!(
                decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
                Action::Ignore("migration in progress")
            ));
        }
        let mut d = running();
        d.spec.metadata.kubevirt.migration = Some(
            serde_json::from_value(
                serde_json::json!({"UID": "m1", "StartTimestamp": "2026-08-22T09:00:00Z"}),
            )
            .unwrap(),
        );
        assert!(matches!(
            decide(&facts(Some(&v), Some(&d), LauncherState::Ready)),
            Action::Ignore("migration in progress")
        ));
        // The source's domain is gone after a success, the target has not handed over yet:
        // the VMI's started migration keeps it from looking crashed.
        let mut migrating = vmi(Phase::Running);
        migrating.status.as_mut().unwrap().migration_state = Some(serde_json::json!({
            "migrationUid": "m1", "startTimestamp": "2026-08-22T09:00:00Z"
        }));
        assert_eq!(
            decide(&facts(Some(&migrating), None, LauncherState::Unresponsive)),
            Action::Ignore("migration in progress (VMI)")
        );
        assert_eq!(
            calculate_phase(&facts(Some(&v), None, LauncherState::Unresponsive)),
            Phase::Failed
        );
        // Ended well, to another node: not this node's to judge any more.
        migrating.status.as_mut().unwrap().migration_state = Some(serde_json::json!({
            "migrationUid": "m1", "sourceNode": NODE, "targetNode": "other",
            "startTimestamp": "2026-08-22T09:00:00Z", "endTimestamp": "2026-08-22T09:00:01Z"
        }));
        assert_eq!(
            decide(&facts(Some(&migrating), None, LauncherState::Unresponsive)),
            Action::Ignore("the VMI migrated to another node")
        );
        // What the old launcher left here (a domain marked gone) is cleaned up.
        let uid = migrating.metadata.uid.clone().unwrap();
        let gone = Domain::gone("default", "vmi", &uid, Time(now()));
        assert_eq!(
            decide(&facts(
                Some(&migrating),
                Some(&gone),
                LauncherState::Unresponsive
            )),
            Action::CleanupMigratedAway
        );
        assert!(!Action::CleanupMigratedAway.updates_status());
        // Ended: the VMI is judged again.
        migrating.status.as_mut().unwrap().migration_state = Some(serde_json::json!({
            "migrationUid": "m1", "startTimestamp": "2026-08-22T09:00:00Z", "endTimestamp": "2026-08-22T09:00:01Z"
        }));
        assert_ne!(
            decide(&facts(Some(&migrating), None, LauncherState::Unresponsive)),
            Action::Ignore("migration in progress (VMI)")
        );
    }

    #[test]
    fn vmi_of_another_node_is_never_touched() {
        let mut v = vmi(Phase::Scheduled);
        if let Some(labels) = v.metadata.labels.as_mut() {
            labels.insert(well_known::NODE_NAME_LABEL.into(), "other".into());
        }
        assert!(matches!(
            decide(&facts(Some(&v), None, LauncherState::Ready)),
            Action::Ignore("VMI is not owned by this node")
        ));
        let v = deleting(v);
        let action = decide(&facts(Some(&v), Some(&running()), LauncherState::Ready));
        assert!(matches!(action, Action::Ignore(_)));
        assert!(!action.updates_status());
    }

    #[test]
    fn node_from_status_when_label_missing() {
        let mut v = vmi(Phase::Scheduled);
        v.metadata.labels = None;
        assert!(!owned_by_node(&v, NODE));
        if let Some(s) = v.status.as_mut() {
            s.node_name = Some(NODE.into());
        }
        assert!(owned_by_node(&v, NODE));
    }

    // ---- §3.5 shutdown

    fn shutdown_facts<'a>(v: &'a VirtualMachineInstance, d: &'a Domain) -> Facts<'a> {
        facts(Some(v), Some(d), LauncherState::Ready)
    }

    #[test]
    fn zero_domain_grace_kills_without_acpi() {
        let v = deleting(vmi(Phase::Running));
        let mut d = running();
        d.spec.metadata.kubevirt.grace_period = Some(GracePeriodMetadata::default());
        assert_eq!(shutdown_step(&shutdown_facts(&v, &d)), ShutdownStep::Kill);
    }

    #[test]
    fn zero_vmi_grace_kills() {
        let mut v = deleting(vmi(Phase::Running));
        v.spec.termination_grace_period_seconds = Some(0);
        let d = running();
        assert_eq!(shutdown_step(&shutdown_facts(&v, &d)), ShutdownStep::Kill);
    }

    #[test]
    fn first_shutdown_rechecks_after_min_of_5s_and_grace() {
        let mut v = deleting(vmi(Phase::Running));
        let d = running();
        assert_eq!(
            shutdown_step(&shutdown_facts(&v, &d)),
            ShutdownStep::Shutdown {
                recheck: Duration::from_secs(5)
            }
        );
        v.spec.termination_grace_period_seconds = Some(2);
        assert_eq!(
            shutdown_step(&shutdown_facts(&v, &d)),
            ShutdownStep::Shutdown {
                recheck: Duration::from_secs(2)
            }
        );
    }

    #[test]
    fn shutdown_is_resent_within_grace_unless_shutting_down() {
        let v = deleting(vmi(Phase::Running));
        let mut d = running();
        if let Some(g) = d.spec.metadata.kubevirt.grace_period.as_mut() {
            g.deletion_timestamp = Some(ago(10));
        }
        assert_eq!(
            shutdown_step(&shutdown_facts(&v, &d)),
            ShutdownStep::Shutdown {
                recheck: Duration::from_secs(5)
            }
        );
        d.status.status = LifeCycle::ShuttingDown;
        assert_eq!(
            shutdown_step(&shutdown_facts(&v, &d)),
            ShutdownStep::Wait {
                recheck: Duration::from_secs(5)
            }
        );
        // 28 s in: the recheck is the 2 s left.
        if let Some(g) = d.spec.metadata.kubevirt.grace_period.as_mut() {
            g.deletion_timestamp = Some(ago(28));
        }
        assert_eq!(
            shutdown_step(&shutdown_facts(&v, &d)),
            ShutdownStep::Wait {
                recheck: Duration::from_secs(2)
            }
        );
    }

    #[test]
    fn expired_grace_kills() {
        let v = deleting(vmi(Phase::Running));
        let mut d = domain(LifeCycle::ShuttingDown, StateChangeReason::User);
        if let Some(g) = d.spec.metadata.kubevirt.grace_period.as_mut() {
            g.deletion_timestamp = Some(ago(30));
        }
        assert_eq!(shutdown_step(&shutdown_facts(&v, &d)), ShutdownStep::Kill);
    }

    #[test]
    fn vmi_grace_wins_over_domain_grace() {
        let mut v = vmi(Phase::Running);
        v.spec.termination_grace_period_seconds = Some(3);
        assert_eq!(grace_period_seconds(Some(&v), &running()), 3);
        assert_eq!(grace_period_seconds(None, &running()), 30);
    }

    // ---- §3.6 phase rows

    fn phase_of(v: &VirtualMachineInstance, d: Option<&Domain>, l: LauncherState) -> Phase {
        calculate_phase(&facts(Some(v), d, l))
    }

    #[test]
    fn phase_without_domain() {
        let scheduled = vmi(Phase::Scheduled);
        assert_eq!(
            phase_of(&scheduled, None, LauncherState::NotReady),
            Phase::Scheduled
        );
        assert_eq!(
            phase_of(&scheduled, None, LauncherState::Ready),
            Phase::Scheduled
        );
        assert_eq!(
            phase_of(&scheduled, None, LauncherState::Unresponsive),
            Phase::Failed
        );
        // Running without domain fails at once, whatever the launcher says.
        assert_eq!(
            phase_of(&vmi(Phase::Running), None, LauncherState::Ready),
            Phase::Failed
        );
        for p in [Phase::Pending, Phase::Scheduling, Phase::Unset] {
            assert_eq!(
                phase_of(&vmi(p), None, LauncherState::Ready),
                Phase::Scheduled
            );
        }
        // A deletion-marked domain is no domain.
        let mut gone = running();
        gone.object_meta.deletion_timestamp = Some(Time(now()));
        assert_eq!(
            phase_of(&vmi(Phase::Running), Some(&gone), LauncherState::Ready),
            Phase::Failed
        );
    }

    #[test]
    fn phase_of_stopped_domains() {
        use LifeCycle as L;
        use StateChangeReason as R;
        let v = vmi(Phase::Running);
        let cases = [
            (L::Shutoff, R::Crashed, Phase::Failed),
            (L::Crashed, R::Panicked, Phase::Failed),
            (L::Crashed, R::Crashed, Phase::Failed),
            (L::Shutoff, R::Shutdown, Phase::Succeeded),
            (L::Shutoff, R::Saved, Phase::Succeeded),
            (L::Shutoff, R::FromSnapshot, Phase::Succeeded),
            (L::Crashed, R::Shutdown, Phase::Succeeded),
            (L::Shutoff, R::Migrated, Phase::Running),
            (L::Shutoff, R::Unknown, Phase::Running),
            (L::Shutoff, R::Failed, Phase::Running),
            (L::Paused, R::PostcopyFailed, Phase::Failed),
            (L::Paused, R::User, Phase::Running),
            (L::Paused, R::IOError, Phase::Running),
            (L::Running, R::Unknown, Phase::Running),
            (L::Blocked, R::Unknown, Phase::Running),
            (L::PMSuspended, R::Unknown, Phase::Running),
            (L::NoState, R::Unknown, Phase::Running),
            (L::ShuttingDown, R::User, Phase::Running),
        ];
        for (status, reason, want) in cases {
            let d = domain(status, reason);
            assert_eq!(
                phase_of(&v, Some(&d), LauncherState::Ready),
                want,
                "{status:?}/{reason:?}"
            );
        }
        // "unchanged" keeps a Scheduled VMI Scheduled.
        let s = vmi(Phase::Scheduled);
        let d = domain(L::ShuttingDown, R::User);
        assert_eq!(
            phase_of(&s, Some(&d), LauncherState::Ready),
            Phase::Scheduled
        );
    }

    #[test]
    fn destroyed_phase_depends_on_acpi_and_grace() {
        let d = domain(LifeCycle::Shutoff, StateChangeReason::Destroyed);
        // ACPI present, VMI grace unset, domain grace 30: killed => Failed.
        assert_eq!(
            phase_of(&vmi(Phase::Running), Some(&d), LauncherState::Ready),
            Phase::Failed
        );
        // VMI grace 0: Succeeded.
        let mut v = vmi(Phase::Running);
        v.spec.termination_grace_period_seconds = Some(0);
        assert_eq!(
            phase_of(&v, Some(&d), LauncherState::Ready),
            Phase::Succeeded
        );
        // No ACPI: Succeeded.
        let mut no_acpi = d.clone();
        no_acpi.spec.features = None;
        assert_eq!(
            phase_of(&vmi(Phase::Running), Some(&no_acpi), LauncherState::Ready),
            Phase::Succeeded
        );
        // VMI grace unset and domain grace 0: Succeeded.
        let mut zero = d.clone();
        zero.spec.metadata.kubevirt.grace_period = Some(GracePeriodMetadata::default());
        assert_eq!(
            phase_of(&vmi(Phase::Running), Some(&zero), LauncherState::Ready),
            Phase::Succeeded
        );
    }
}
