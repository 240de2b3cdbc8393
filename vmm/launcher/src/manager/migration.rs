//! Live migration, the launcher's side of KubeVirt v1.9.0's five RPCs
//! (`docs/migration-contract.md` §1–3), on the VMM's `VmHandle::migrate` and
//! `Vm::receive`.
//!
//! - **Source** (`MigrateVirtualMachine`): records the migration in the domain's metadata
//!   (`Spec.Metadata.KubeVirt.Migration`), answers at once, and moves the VM on a thread
//!   of its own over `<share dir>/migrationproxy/<VMI UID>-49152-source.sock`, the unix
//!   socket its handler proxies to the target pod. The end — success, failure, abort — is
//!   reported through the metadata only, as KubeVirt's launcher does.
//! - **Target** (`SyncMigrationTarget`): prepares the same VM as a sync would (its own
//!   disks, network), listens on the same path in its own pod, and receives the VM from
//!   the first connection; the domain appears `Paused/Migration` when the stream starts
//!   and runs once the VM does, with the metadata's end time (the handler's signal that
//!   the VMI can be handed over).
//! - `CancelVirtualMachineMigration` aborts a running source; `SignalTargetPodCleanup`
//!   lets a waiting target go; `FinalizeVirtualMachineMigration` has nothing to do (no
//!   interface binding asks for a link refresh, no guest agent sets the clock).

use std::io::ErrorKind;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use proto::domain::{Domain, LifeCycle, MigrationMetadata, StateChangeReason};
use proto::grpc::cmd::v1::VirtualMachineOptions;
use proto::kubevirt::VirtualMachineInstance;
use serde::Deserialize;
use vmm::{MigrationError, MigrationProgress, Vm, VmHandle, VmState};

use super::{Failure, Manager, Prepared, Result, Stage, State, fail};

/// KubeVirt's migration port whose stream the VMM's rides (QEMU's in KubeVirt).
const DIRECT_MIGRATION_PORT: u16 = 49152;
/// The mode of every migration here (no post-copy, no pausing by a monitor).
const PRE_COPY: &str = "PreCopy";
/// The failure reason KubeVirt reports for a cancelled or timed-out migration.
const ABORTED: &str = "Live migration has been aborted";
/// How often the progress watchdog looks (KubeVirt's monitor: 400 ms).
const PROGRESS_POLL: Duration = Duration::from_millis(400);
/// How often a waiting target looks whether it was let go.
const ACCEPT_POLL: Duration = Duration::from_millis(50);
/// How long the source waits for the stream to take a write, or for the target's
/// answer: a target node gone silent (the proxies' connections stay up) ends the
/// migration instead of blocking it, paused in its stop-and-copy, for ever.
const STREAM_TIMEOUT: Duration = Duration::from_secs(60);

/// The last migration this launcher ran or prepared.
pub(super) struct Migration {
    pub(super) metadata: MigrationMetadata,
    role: Role,
}

enum Role {
    Source {
        progress: Arc<MigrationProgress>,
        /// Cancelled by `CancelVirtualMachineMigration` or the progress watchdog.
        aborting: Arc<AtomicBool>,
        /// The migration's thread has returned (nothing left to cancel).
        done: Arc<AtomicBool>,
    },
    Target {
        /// Set by `SignalTargetPodCleanup`: stop waiting, cut the stream.
        released: Arc<AtomicBool>,
        /// The accepted connection, to cut it.
        stream: Arc<std::sync::Mutex<Option<UnixStream>>>,
    },
}

/// `cmdclient.MigrationOptions` as the handler sends them: Go field names, no tags.
/// What the VMM has no counterpart for (post-copy, auto-converge, parallel
/// connections, compression, the stall detector) is read and not used.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct KubevirtOptions {
    #[serde(default)]
    bandwidth: Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
    #[serde(default)]
    progress_timeout: i64,
    #[serde(rename = "CompletionTimeoutPerGiB", default)]
    completion_timeout_per_gib: i64,
}

/// `<share dir>/migrationproxy/<VMI UID>-49152-source.sock`
/// (`migrationproxy.SourceUnixFile`): where the source connects and the target listens,
/// each in its own pod.
pub(super) fn socket_path(share_dir: &Path, vmi_uid: &str) -> PathBuf {
    share_dir
        .join("migrationproxy")
        .join(format!("{vmi_uid}-{DIRECT_MIGRATION_PORT}-source.sock"))
}

/// `status.migrationState.<key>` of the request's VMI.
fn migration_state<'a>(vmi: &'a VirtualMachineInstance, key: &str) -> Option<&'a str> {
    vmi.status
        .as_ref()?
        .migration_state
        .as_ref()?
        .get(key)?
        .as_str()
}

/// The VMM's options from KubeVirt's: the bandwidth in whole MiB/s as KubeVirt rounds it
/// (`QuantityToMebiByte`: 0 = unlimited, less than 1 MiB = 1), the completion timeout per
/// started 10^9 bytes of `data` (0 = none), QEMU's 300 ms downtime.
fn vmm_options(
    options: &KubevirtOptions,
    data: u64,
    shared_disks: Vec<usize>,
) -> std::result::Result<vmm::MigrationOptions, String> {
    const MIB: u64 = 1 << 20;
    let bandwidth = match &options.bandwidth {
        None => None,
        Some(q) => {
            match proto::kubevirt::quantity::to_bytes(q).map_err(|e| format!("Bandwidth: {e}"))? {
                0 => None,
                b if b < MIB => Some(MIB),
                b => Some((b + MIB / 2) / MIB * MIB),
            }
        }
    };
    let per = u64::try_from(options.completion_timeout_per_gib).unwrap_or(0);
    let completion_timeout = if per == 0 {
        // No deadline (a century is as good as none).
        Duration::from_secs(100 * 365 * 24 * 3600)
    } else {
        Duration::from_secs(per.saturating_mul(data.div_ceil(1_000_000_000).max(1)))
    };
    Ok(vmm::MigrationOptions {
        bandwidth,
        completion_timeout,
        max_downtime: vmm::DEFAULT_MAX_DOWNTIME,
        shared_disks,
    })
}

impl Manager {
    /// Publishes the migration's metadata: in the domain (a MODIFIED event) when there
    /// is one, else kept until the domain appears.
    fn set_migration_metadata(&self, state: &mut State, metadata: MigrationMetadata) {
        if let Some(m) = state.migration.as_mut() {
            m.metadata = metadata.clone();
        }
        if let Some(domain) = state.domain.as_mut() {
            domain.spec.metadata.kubevirt.migration = Some(metadata);
            let domain = domain.clone();
            self.emit("MODIFIED", &domain);
        }
    }

    /// Refuses a migration UID that already ran here; `Ok(true)`: it is running now.
    fn known_migration(state: &State, uid: &str) -> Result<bool> {
        match state.migration.as_ref().map(|m| &m.metadata) {
            Some(m) if m.uid == uid => match &m.end_timestamp {
                None => Ok(true),
                Some(end) => fail(format!(
                    "migration job {uid} already executed, finished at {}, failed: {}, abortStatus: {}",
                    end.0, m.failed, m.abort_status
                )),
            },
            _ => Ok(false),
        }
    }

    /// `MigrateVirtualMachine`: starts moving the VM to the target and answers at once.
    pub(crate) fn migrate(
        self: &Arc<Self>,
        vmi: &VirtualMachineInstance,
        options: &[u8],
    ) -> Result<()> {
        if options.is_empty() {
            return fail("migration options object not present in command server request");
        }
        let options: KubevirtOptions = serde_json::from_slice(options).map_err(|e| {
            Failure::Refused(format!(
                "no valid migration options object present in command server request: {e}"
            ))
        })?;
        let Some(migration_uid) = migration_state(vmi, "migrationUid") else {
            return fail("cannot migrate VMI until migrationState is ready");
        };
        let mut state = self.lock();
        if Self::known_migration(&state, migration_uid)? {
            // The handler sends again before it saw the start: nothing to do.
            return Ok(());
        }
        if let Some(running) = state
            .migration
            .as_ref()
            .filter(|m| m.metadata.end_timestamp.is_none())
        {
            return fail(format!(
                "migration job {} has not finished: one migration at a time",
                running.metadata.uid
            ));
        }
        let vm = Self::running_vm(&state)?;
        let config = state
            .config
            .clone()
            .ok_or_else(|| Failure::Refused("no VM configuration".into()))?;
        // What the completion timeout is counted from: the memory and the disks copied
        // (KubeVirt counts the ephemeral disks' files).
        let disks: u64 = config
            .disks
            .iter()
            .filter(|d| !d.read_only)
            .filter_map(|d| std::fs::metadata(&d.path).ok())
            .map(|m| m.len())
            .sum();
        let vmm_options = vmm_options(
            &options,
            (config.memory_mib << 20) + disks,
            state.shared_disks.clone(),
        )
        .map_err(|e| Failure::Refused(format!("migration options: {e}")))?;
        let progress = Arc::new(MigrationProgress::default());
        let aborting = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicBool::new(false));
        state.migration = Some(Migration {
            metadata: MigrationMetadata::default(),
            role: Role::Source {
                progress: progress.clone(),
                aborting: aborting.clone(),
                done: done.clone(),
            },
        });
        self.set_migration_metadata(
            &mut state,
            MigrationMetadata {
                uid: migration_uid.to_string(),
                start_timestamp: Some(crate::now()),
                mode: PRE_COPY.into(),
                ..Default::default()
            },
        );
        drop(state);
        let socket = socket_path(
            &self.options.paths.share_dir,
            vmi.metadata.uid.as_deref().unwrap_or_default(),
        );
        let progress_timeout = u64::try_from(options.progress_timeout).unwrap_or(0);
        let manager = Arc::downgrade(self);
        let uid = migration_uid.to_string();
        std::thread::Builder::new()
            .name("migration-source".into())
            .spawn(move || {
                let watchdog = (progress_timeout > 0).then(|| {
                    watch_progress(
                        progress.clone(),
                        aborting.clone(),
                        Duration::from_secs(progress_timeout),
                    )
                });
                let result = UnixStream::connect(&socket)
                    .and_then(|stream| {
                        stream.set_write_timeout(Some(STREAM_TIMEOUT))?;
                        stream.set_read_timeout(Some(STREAM_TIMEOUT))?;
                        Ok(stream)
                    })
                    .map_err(|e| format!("connecting to {}: {e}", socket.display()))
                    .and_then(|mut stream| {
                        vm.migrate(&mut stream, &vmm_options, &progress)
                            .map_err(|e| match e {
                                MigrationError::Cancelled | MigrationError::Timeout { .. } => {
                                    ABORTED.to_string()
                                }
                                MigrationError::OutcomeUnknown(_) => format!("unknown:{e}"),
                                other => other.to_string(),
                            })
                            .map(|report| {
                                tracing::info!(?report, "migrated");
                            })
                    });
                progress.cancel(); // ends the watchdog
                if let Some(w) = watchdog {
                    let _ = w.join();
                }
                if let Some(manager) = manager.upgrade() {
                    manager.source_done(&uid, result, &aborting);
                }
                done.store(true, Ordering::SeqCst);
            })
            .map_err(|e| Failure::Refused(format!("cannot start the migration: {e}")))?;
        Ok(())
    }

    /// Records how the source's migration ended.
    fn source_done(
        &self,
        uid: &str,
        result: std::result::Result<(), String>,
        aborting: &AtomicBool,
    ) {
        let mut state = self.lock();
        let Some(mut metadata) = state
            .migration
            .as_ref()
            .map(|m| m.metadata.clone())
            .filter(|m| m.uid == uid)
        else {
            return;
        };
        let aborted = aborting.load(Ordering::SeqCst);
        match result {
            Ok(()) => {
                if aborted {
                    // Too late: the VM runs on the target.
                    metadata.abort_status = "Failed".into();
                }
            }
            Err(why) if why.starts_with("unknown:") => {
                // The state went out and the answer was lost: the target may run the VM.
                // It stays paused here for good (the VMM refuses to resume it), the
                // migration open: the target's handler hands the VMI over if the VM runs
                // there; if it does not, the VMI has no running copy and only a delete
                // of this domain ends it. Never two copies.
                tracing::error!("{}", &why["unknown:".len()..]);
                self.set_status(&mut state, LifeCycle::Paused, StateChangeReason::Migration);
                return;
            }
            Err(why) => {
                tracing::warn!("migration failed: {why}");
                metadata.failed = true;
                if aborted || why == ABORTED {
                    metadata.failure_reason = ABORTED.into();
                    metadata.abort_status = "Succeeded".into();
                } else {
                    metadata.failure_reason = why;
                }
            }
        }
        metadata.end_timestamp = Some(crate::now());
        self.set_migration_metadata(&mut state, metadata);
    }

    /// `CancelVirtualMachineMigration`: aborts a running source migration (always
    /// answered true; ignored when none runs or it is being aborted already).
    pub(crate) fn cancel_migration(&self) -> Result<()> {
        let mut state = self.lock();
        let Some(Migration {
            metadata,
            role:
                Role::Source {
                    progress,
                    aborting,
                    done,
                },
        }) = state.migration.as_ref()
        else {
            return Ok(());
        };
        if done.load(Ordering::SeqCst)
            || metadata.start_timestamp.is_none()
            || metadata.end_timestamp.is_some()
            || matches!(metadata.abort_status.as_str(), "Aborting" | "Succeeded")
        {
            return Ok(());
        }
        let mut metadata = metadata.clone();
        aborting.store(true, Ordering::SeqCst);
        progress.cancel();
        metadata.abort_status = "Aborting".into();
        self.set_migration_metadata(&mut state, metadata);
        Ok(())
    }

    /// `SyncMigrationTarget`: prepares the VM the source sends and waits for it.
    pub(crate) fn prepare_migration_target(
        self: &Arc<Self>,
        vmi: &VirtualMachineInstance,
        options: Option<&VirtualMachineOptions>,
    ) -> Result<()> {
        let Some(migration_uid) = migration_state(vmi, "migrationUid") else {
            return fail("cannot prepare the migration target until migrationState is ready");
        };
        let mut state = self.lock();
        if Self::known_migration(&state, migration_uid)? {
            return Ok(()); // prepared already, waiting or receiving
        }
        if state.domain.is_some() {
            return fail(
                "a domain is defined here already: this launcher cannot be a migration target",
            );
        }
        let Prepared {
            domain,
            config,
            dhcp,
            shared_disks,
        } = self.prepare(vmi, options, super::Arrival::Migration)?;
        let socket = socket_path(
            &self.options.paths.share_dir,
            vmi.metadata.uid.as_deref().unwrap_or_default(),
        );
        let listener = listen(&socket)
            .map_err(|e| Failure::Refused(format!("listening on {}: {e}", socket.display())))?;
        let released = Arc::new(AtomicBool::new(false));
        let stream = Arc::new(std::sync::Mutex::new(None));
        state.dhcp = dhcp;
        state.shared_disks = shared_disks;
        state.migration = Some(Migration {
            metadata: MigrationMetadata {
                uid: migration_uid.to_string(),
                start_timestamp: Some(crate::now()),
                mode: PRE_COPY.into(),
                ..Default::default()
            },
            role: Role::Target {
                released: released.clone(),
                stream: stream.clone(),
            },
        });
        drop(state);
        let manager = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("migration-target".into())
            .spawn(move || {
                let accepted = accept(&listener, &released);
                drop(listener);
                let _ = std::fs::remove_file(&socket);
                let Some(mut incoming) = accepted else {
                    return; // let go before the source came
                };
                if let Ok(clone) = incoming.try_clone() {
                    *stream.lock().unwrap_or_else(|e| e.into_inner()) = Some(clone);
                }
                let Some(m) = manager.upgrade() else { return };
                m.incoming_started(domain);
                drop(m);
                // Once the whole state is here, the VM runs only if the target was not
                // let go meanwhile (a delete, SignalTargetPodCleanup): then the source,
                // told so, keeps it.
                let gate = || match manager.upgrade() {
                    Some(m) if m.lock().domain.is_some() && !released.load(Ordering::SeqCst) => {
                        Ok(())
                    }
                    _ => Err("the migration's target was let go".to_string()),
                };
                let received = Vm::receive_gated(config.clone(), &mut incoming, &gate);
                *stream.lock().unwrap_or_else(|e| e.into_inner()) = None;
                if let Some(m) = manager.upgrade() {
                    m.incoming_done(received, config);
                }
            })
            .map_err(|e| Failure::Refused(format!("cannot wait for the migration: {e}")))?;
        self.stage.send_replace(Stage::Incoming);
        Ok(())
    }

    /// The stream started: the domain exists now, paused for the migration (libvirt's
    /// first events on a target: an ADDED domain).
    fn incoming_started(&self, mut domain: Domain) {
        let mut state = self.lock();
        domain.status.status = LifeCycle::Paused;
        domain.status.reason = StateChangeReason::Migration;
        domain.spec.metadata.kubevirt.migration =
            state.migration.as_ref().map(|m| m.metadata.clone());
        self.emit("ADDED", &domain);
        state.domain = Some(domain);
    }

    /// The VM arrived (it runs, or stays paused as its owner had it), or did not (the
    /// domain goes; the launcher waits to be let go).
    fn incoming_done(self: &Arc<Self>, received: vmm::Result<VmHandle>, config: vmm::VmConfig) {
        let mut state = self.lock();
        match received {
            Ok(vm) if state.domain.is_none() => {
                // Deleted between the gate and here: the delete stands.
                tracing::warn!("the migrated VM arrived after its domain was deleted");
                vm.kill();
            }
            Ok(vm) => {
                let vm = Arc::new(vm);
                let paused = vm.state() == VmState::Paused;
                state.generation += 1;
                state.paused_by_user = paused;
                state.shutdown_requested = false;
                state.killed = false;
                state.config = Some(config);
                state.vm = Some(vm.clone());
                if let Some(domain) = &state.domain {
                    state.console_log = super::start_console_log(domain);
                }
                self.watch_exit(vm, state.generation);
                if paused {
                    self.set_status(&mut state, LifeCycle::Paused, StateChangeReason::User);
                } else {
                    self.set_status(&mut state, LifeCycle::Running, StateChangeReason::Unknown);
                }
                if let Some(mut metadata) = state.migration.as_ref().map(|m| m.metadata.clone()) {
                    metadata.end_timestamp = Some(crate::now());
                    self.set_migration_metadata(&mut state, metadata);
                }
                drop(state);
                self.stage.send_replace(Stage::Defined);
            }
            Err(e) => {
                tracing::warn!("the migration's VM did not arrive: {e}");
                if let Some(domain) = state.domain.take() {
                    let gone = Domain::gone(
                        &domain.object_meta.namespace,
                        &domain.object_meta.name,
                        &domain.spec.metadata.kubevirt.uid,
                        crate::now(),
                    );
                    self.emit("MODIFIED", &gone);
                }
                state.dhcp = None;
            }
        }
    }

    /// `SignalTargetPodCleanup`: a target whose migration failed lets go (waiting or
    /// receiving) and the launcher exits, when the request names this pod
    /// (`status.migrationState.targetPod` = env `POD_NAME`).
    pub(crate) fn release_migration_target(&self, vmi: &VirtualMachineInstance) -> Result<()> {
        let this_pod = std::env::var("POD_NAME").unwrap_or_default();
        if this_pod.is_empty() || migration_state(vmi, "targetPod") != Some(this_pod.as_str()) {
            return Ok(());
        }
        let state = self.lock();
        if state.vm.is_some() {
            return Ok(()); // the VM runs here: nothing to let go
        }
        let waiting = match state.migration.as_ref() {
            Some(Migration {
                role: Role::Target { .. },
                ..
            }) => true,
            // No target prepared yet: a launcher still waiting for a domain exits.
            None => state.domain.is_none(),
            Some(_) => false,
        };
        if waiting {
            Self::let_go_of_incoming(&state);
            drop(state);
            self.stage.send_replace(Stage::Deleted);
        }
        Ok(())
    }

    /// A target stops waiting for its VM: no connection is taken any more, a stream in
    /// progress is cut, and a VM fully received is not started (the gate in
    /// `prepare_migration_target`).
    pub(super) fn let_go_of_incoming(state: &State) {
        if let Some(Migration {
            role: Role::Target { released, stream },
            ..
        }) = state.migration.as_ref()
        {
            released.store(true, Ordering::SeqCst);
            if let Some(s) = stream.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// Binds the target's socket (a stale file from an earlier try is replaced).
fn listen(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}

/// The first connection, or `None` once `released`.
fn accept(listener: &UnixListener, released: &AtomicBool) -> Option<UnixStream> {
    while !released.load(Ordering::SeqCst) {
        match listener.accept() {
            Ok((stream, _)) => {
                let _ = stream.set_nonblocking(false);
                return Some(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(ACCEPT_POLL),
            Err(e) => {
                tracing::warn!("migration socket: {e}");
                std::thread::sleep(ACCEPT_POLL);
            }
        }
    }
    None
}

/// KubeVirt's progress timeout: a migration whose remaining data has not reached a new
/// low (or, in its first round, whose stream has not moved) for `timeout` is cancelled,
/// and reported as an abort.
fn watch_progress(
    progress: Arc<MigrationProgress>,
    aborting: Arc<AtomicBool>,
    timeout: Duration,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let (mut low, mut bytes, mut last_progress) = (u64::MAX, 0, Instant::now());
        while !progress.is_cancelled() {
            std::thread::sleep(PROGRESS_POLL);
            let remaining = progress.remaining_pages() * 4096 + progress.remaining_disk_bytes();
            let moved = if progress.rounds() == 0 {
                progress.bytes() > bytes
            } else {
                remaining < low
            };
            bytes = progress.bytes();
            if progress.rounds() > 0 {
                low = low.min(remaining);
            }
            if moved {
                last_progress = Instant::now();
            } else if last_progress.elapsed() > timeout {
                tracing::warn!("no progress for {timeout:?}: aborting the migration");
                aborting.store(true, Ordering::SeqCst);
                progress.cancel();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(json: &str) -> KubevirtOptions {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn kubevirts_options_become_the_vmms() {
        let typical = options(
            r#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,
            "MaxDowntimeMs":900,"UnsafeMigration":false,"AllowAutoConverge":false,
            "AllowPostCopy":false,"ParallelMigrationThreads":8,"AllowWorkloadDisruption":false,
            "StallDetectorOptions":null,"Compression":null}"#,
        );
        let o = vmm_options(&typical, 2 << 30, vec![1]).unwrap();
        assert_eq!(o.shared_disks, vec![1]);
        assert_eq!(o.bandwidth, None);
        // 2 GiB is 2.15 GB: three started units.
        assert_eq!(o.completion_timeout, Duration::from_secs(450));
        assert_eq!(o.max_downtime, Duration::from_millis(300));
        let mib = |q: &str| {
            vmm_options(
                &options(&format!(r#"{{"Bandwidth":"{q}"}}"#)),
                1,
                Vec::new(),
            )
            .unwrap()
            .bandwidth
        };
        assert_eq!(mib("64Mi"), Some(64 << 20));
        assert_eq!(mib("100k"), Some(1 << 20), "less than a MiB is one");
        assert_eq!(mib("1500Ki"), Some(1 << 20), "rounded to whole MiB");
        assert!(vmm_options(&options(r#"{"Bandwidth":"lots"}"#), 1, Vec::new()).is_err());
        let unlimited =
            vmm_options(&options(r#"{"CompletionTimeoutPerGiB":0}"#), 1, Vec::new()).unwrap();
        assert!(unlimited.completion_timeout > Duration::from_secs(1 << 30));
    }

    #[test]
    fn the_socket_is_kubevirts() {
        assert_eq!(
            socket_path(Path::new("/var/run/kubevirt"), "abc"),
            Path::new("/var/run/kubevirt/migrationproxy/abc-49152-source.sock")
        );
    }
}
