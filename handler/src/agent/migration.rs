//! The agent's migration roles: what [`crate::migration::target`] and
//! [`crate::migration::source`] decide, carried out (launcher RPCs, proxies, the pod
//! network of a target pod, patches of the VMI).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use nix::fcntl::OFlag;
use proto::domain::Domain;
use proto::kubevirt::{MigrationState, VirtualMachineInstance, well_known};

use super::{After, Agent, Once, ReconcileError, prepare_pod};
use crate::launchers::{LauncherClient, LauncherProcess, MigrationCommand, runtime_user};
use crate::migration::proxy::{PodSocket, SourceListener, TargetListener};
use crate::migration::source::{self, SourceFacts, SourceStep};
use crate::migration::target::{self, TargetFacts, TargetStep};
use crate::migration::{Role, role};
use crate::podside;
use crate::vmis::EventKind;

/// The launcher's share directory inside its pod.
const SHARE_DIR_IN_POD: &str = "var/run/kubevirt";
/// The proxies' directory below it (`migrationproxy.SourceUnixFile`).
const PROXY_DIR: &str = "migrationproxy";

/// A failed step of a migration's pod side, as the reconcile's error: `what` failed with `e`.
fn preparation<E: std::fmt::Display>(key: &str, what: &str) -> impl FnOnce(E) -> ReconcileError {
    let (key, what) = (key.to_string(), what.to_string());
    move |e| ReconcileError::PodPreparation {
        key,
        reason: if what.is_empty() {
            e.to_string()
        } else {
            format!("{what}: {e}")
        },
    }
}

/// `<VMI UID>-49152-source.sock`: where the launchers' stream meets the proxies.
fn stream_socket_name(vmi_uid: &str) -> String {
    format!(
        "{vmi_uid}-{}-source.sock",
        well_known::DIRECT_MIGRATION_PORT
    )
}

impl Agent {
    /// This node's migration role for `vmi`, run before the main decision. `Some` when a
    /// step acted or must be looked at again: the reconcile ends there (a patch changed
    /// the VMI, and the next reconcile reads it afresh).
    pub(super) async fn migration_step(
        &self,
        key: &str,
        vmi: &VirtualMachineInstance,
        domain: Option<&Domain>,
        client: Option<&LauncherClient>,
        process: Option<&std::sync::Arc<LauncherProcess>>,
    ) -> Result<Option<After>, ReconcileError> {
        // A VMI being deleted or over is not migrated: its proxies go, the main decision
        // shuts it down or cleans up (as v1.9.0, which ignores a migrating VMI only while it
        // is not deleted).
        if vmi.metadata.deletion_timestamp.is_some() || vmi.phase().is_final() {
            // A target whose migration failed still ends its part (the launcher waiting for
            // a VM that will not come is let go, the label goes): the VMI may be final
            // already when the target looks again (its source died with its VM).
            if let Ok(Some(Role::Target(state))) = role(vmi, &self.config.node)
                && state.is_done()
                && state.is_failed()
            {
                return self
                    .target_step(key, vmi, &state, domain, client, process)
                    .await;
            }
            self.proxies
                .forget(key, vmi.metadata.uid.as_deref().unwrap_or_default());
            return Ok(None);
        }
        let role = match role(vmi, &self.config.node) {
            Ok(Some(role)) => role,
            Ok(None) => return Ok(None),
            Err(e) => {
                tracing::warn!(%key, error = %e, "ignoring the VMI's migration state");
                return Ok(None);
            }
        };
        match role {
            Role::Target(state) => {
                self.target_step(key, vmi, &state, domain, client, process)
                    .await
            }
            Role::Source(state) => {
                self.source_step(key, vmi, &state, domain, client, process)
                    .await
            }
        }
    }

    async fn target_step(
        &self,
        key: &str,
        vmi: &VirtualMachineInstance,
        state: &MigrationState,
        domain: Option<&Domain>,
        client: Option<&LauncherClient>,
        process: Option<&std::sync::Arc<LauncherProcess>>,
    ) -> Result<Option<After>, ReconcileError> {
        let Some(settings) = self.config.migration.clone() else {
            tracing::warn!(%key, "a migration targets this node, but it has no migration address");
            return Ok(None);
        };
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let address = settings.address.to_string();
        let step = target::decide(&TargetFacts {
            state,
            domain,
            listening: self.proxies.target_port(&uid),
            node: &self.config.node,
            address: &address,
            now: Timestamp::now(),
        });
        tracing::info!(%key, ?step, "migration target");
        let launcher = client;
        let client = || {
            client
                .cloned()
                .ok_or_else(|| ReconcileError::NoClient(key.to_string()))
        };
        match step {
            TargetStep::Nothing(_) => Ok(Some(After::Done)),
            TargetStep::LookAgain(after) => Ok(Some(After::Requeue(after))),
            TargetStep::Prepare => {
                let Some(process) = process.cloned() else {
                    // The target pod's launcher is not up yet.
                    return Ok(Some(After::Requeue(Duration::from_secs(1))));
                };
                let client = client()?;
                if self.config.prepare_pod && !self.done_once.is_done(&uid, Once::PodPrepared) {
                    let owner = runtime_user(vmi);
                    let (vmi, cache, process) =
                        (vmi.clone(), self.pod_ifaces.clone(), process.clone());
                    prepare_pod(key, move || podside::prepare(&vmi, &process, owner, &cache))
                        .await?;
                    self.done_once.mark(&uid, Once::PodPrepared);
                }
                client
                    .migration_command(MigrationCommand::SyncTarget, vmi)
                    .await?;
                let socket = proxy_socket(&process, &uid, false).map_err(preparation(
                    key,
                    "the target pod's migration socket directory",
                ))?;
                let tls = settings.tls.server().map_err(preparation(key, ""))?;
                let listener =
                    TargetListener::start(SocketAddr::new(settings.address, 0), socket, tls)
                        .await
                        .map_err(preparation(key, "cannot listen for the migration"))?;
                self.proxies.set_target(key, &uid, listener);
                self.writer.record_event(
                    vmi,
                    EventKind::Normal,
                    "PreparingTarget",
                    "VirtualMachineInstance Migration Target Prepared.",
                );
                Ok(Some(After::Requeue(Duration::ZERO)))
            }
            TargetStep::Report(patch) => {
                self.writer.patch_vmi(vmi, &patch).await?;
                if let Some(port) = patch["status"]["migrationState"]["targetNodeAddress"].as_str()
                {
                    self.writer.record_event(
                        vmi,
                        EventKind::Normal,
                        "PreparingTarget",
                        &format!(
                            "Migration Target is listening at {port}, on ports: {}",
                            self.proxies.target_port(&uid).unwrap_or_default()
                        ),
                    );
                }
                Ok(Some(After::Done))
            }
            TargetStep::HandOver(patch) => {
                self.writer.patch_vmi(vmi, &patch).await?;
                self.writer.record_event(
                    vmi,
                    EventKind::Normal,
                    "Migrated",
                    &format!(
                        "The VirtualMachineInstance migrated to node {}.",
                        self.config.node
                    ),
                );
                Ok(Some(After::Done))
            }
            TargetStep::Finalize => {
                client()?
                    .migration_command(MigrationCommand::Finalize, vmi)
                    .await?;
                self.writer
                    .patch_vmi(vmi, &target::completed_patch())
                    .await?;
                Ok(Some(After::Done))
            }
            TargetStep::Cleanup { failed } => {
                if failed {
                    // The target launcher may be gone already: nothing left to tell then.
                    if let Some(c) = launcher
                        && let Err(e) = c
                            .migration_command(MigrationCommand::SignalTargetPodCleanup, vmi)
                            .await
                    {
                        tracing::info!(%key, error = %e, "SignalTargetPodCleanup");
                    }
                } else {
                    client()?
                        .migration_command(MigrationCommand::Finalize, vmi)
                        .await?;
                }
                self.writer
                    .patch_vmi(vmi, &target::cleanup_patch(failed))
                    .await?;
                self.proxies.stop_target(&uid);
                if failed {
                    self.cleanup(key, &uid);
                }
                Ok(Some(After::Done))
            }
        }
    }

    async fn source_step(
        &self,
        key: &str,
        vmi: &VirtualMachineInstance,
        state: &MigrationState,
        domain: Option<&Domain>,
        client: Option<&LauncherClient>,
        process: Option<&std::sync::Arc<LauncherProcess>>,
    ) -> Result<Option<After>, ReconcileError> {
        let uid = vmi.metadata.uid.clone().unwrap_or_default();
        let step = source::decide(&SourceFacts {
            state,
            domain,
            listening: self.proxies.source_target(&uid).is_some(),
        });
        tracing::info!(%key, ?step, "migration source");
        let client = || {
            client
                .cloned()
                .ok_or_else(|| ReconcileError::NoClient(key.to_string()))
        };
        match step {
            // Nothing for the migration: the main decision goes on (it ignores a
            // migrating domain).
            SourceStep::Nothing(_) => Ok(None),
            SourceStep::WaitForTarget => Ok(Some(After::Requeue(Duration::from_secs(1)))),
            SourceStep::StopProxy => {
                self.proxies.stop_source(&uid);
                Ok(None)
            }
            SourceStep::Report(patch) => {
                self.writer.patch_vmi(vmi, &patch).await?;
                let ms = &patch["status"]["migrationState"];
                if ms["failed"] == true {
                    self.writer.record_event(
                        vmi,
                        EventKind::Warning,
                        "Migrated",
                        &format!(
                            "VirtualMachineInstance migration uid {} failed. reason:{}",
                            state.migration_uid.as_deref().unwrap_or_default(),
                            ms["failureReason"].as_str().unwrap_or_default()
                        ),
                    );
                }
                Ok(Some(After::Done))
            }
            SourceStep::Cancel => {
                client()?
                    .migration_command(MigrationCommand::Cancel, vmi)
                    .await?;
                self.writer.record_event(
                    vmi,
                    EventKind::Normal,
                    "Migrating",
                    "VirtualMachineInstance is aborting migration.",
                );
                Ok(Some(After::Done))
            }
            SourceStep::Migrate { address, port } => {
                let client = client()?;
                let Some(settings) = self.config.migration.clone() else {
                    tracing::warn!(%key, "a migration starts from this node, but it takes no part in migrations");
                    return Ok(Some(After::Done));
                };
                let ip: std::net::IpAddr =
                    address
                        .parse()
                        .map_err(|_| ReconcileError::PodPreparation {
                            key: key.to_string(),
                            reason: format!("the target's address {address:?} is no IP address"),
                        })?;
                let target = SocketAddr::new(ip, port);
                if self.proxies.source_target(&uid) != Some(target) {
                    let process = process.ok_or_else(|| ReconcileError::PodPreparation {
                        key: key.to_string(),
                        reason: "the launcher's process is not known".into(),
                    })?;
                    let socket = proxy_socket(process, &uid, true).map_err(preparation(
                        key,
                        "the source pod's migration socket directory",
                    ))?;
                    let owner = runtime_user(vmi);
                    let tls = settings.tls.client().map_err(preparation(key, ""))?;
                    let listener = SourceListener::start(socket, Some((owner, owner)), target, tls)
                        .await
                        .map_err(preparation(
                            key,
                            "cannot open the migration socket in the source pod",
                        ))?;
                    self.proxies.set_source(key, &uid, listener);
                }
                client
                    .migrate(vmi, &source::migration_options(vmi, state))
                    .await?;
                self.writer.record_event(
                    vmi,
                    EventKind::Normal,
                    "Migrating",
                    "VirtualMachineInstance is migrating.",
                );
                Ok(Some(After::Done))
            }
        }
    }
}

/// The stream socket's place in a launcher's pod: `/var/run/kubevirt/migrationproxy` as
/// the pod sees it (links resolved inside its root), the directory created if `create`.
fn proxy_socket(
    process: &LauncherProcess,
    vmi_uid: &str,
    create: bool,
) -> std::io::Result<PodSocket> {
    let root = process.root()?;
    let share = crate::podfs::open_in_root(
        &root.path(),
        Path::new(SHARE_DIR_IN_POD),
        OFlag::O_PATH | OFlag::O_DIRECTORY,
    )?;
    if create {
        match nix::sys::stat::mkdirat(
            &share,
            PROXY_DIR,
            nix::sys::stat::Mode::from_bits_truncate(0o755),
        ) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let dir = crate::podfs::open_beneath(
        &crate::podfs::fd_path(&share),
        Path::new(PROXY_DIR),
        OFlag::O_PATH | OFlag::O_DIRECTORY,
    )?;
    PodSocket::new(dir, &stream_socket_name(vmi_uid))
}
