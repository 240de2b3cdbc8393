//! The `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo` services on the
//! launcher's unix socket.
//!
//! Replies are the Go launcher's (`pkg/virt-launcher/virtwrap/cmd-server/`):
//! success is `Response{success: true}`; a failed command is
//! `success: false` with a message. The guest has no agent, and the answers
//! of the RPCs that need one are those of KubeVirt's launcher for a guest
//! whose agent is not connected ([`no_agent`]). The RPCs of features this
//! launcher does not have at all (hot-plug, SEV, ...) answer gRPC `UNIMPLEMENTED`. The
//! five live-migration RPCs are in `manager::migration`.
//!
//! A launcher runs one VMI: every command that acts on it (sync, pause,
//! unpause, shutdown, kill, delete, soft reboot, reset) is refused with
//! `success: false` unless the request's VMI has this launcher's UID
//! ([`CmdService::own_vmi`]), so a request meant for another VMI never
//! touches this one.

use crate::manager::{Failure, Manager};
use crate::no_agent;
use proto::grpc::cmd::info::{CmdInfoRequest, CmdInfoResponse, cmd_info_server::CmdInfo};
use proto::grpc::cmd::v1::{self as cmd, cmd_server::Cmd};
use proto::kubevirt::VirtualMachineInstance;
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// Server settings from the launcher's flags.
#[derive(Clone, Debug, Default)]
pub(crate) struct ServerOptions {
    /// `--vm-stats-collector` (the VMStatsCollector feature gate): serve
    /// `GetVMStats`.
    pub(crate) vm_stats_collector: bool,
    /// `--uid`: the VMI this launcher was started for (`None`: the one its
    /// first accepted `SyncVirtualMachine` defined).
    pub(crate) vmi_uid: Option<String>,
}

pub(crate) struct CmdService {
    manager: Arc<Manager>,
    options: ServerOptions,
    /// Held from the UID check to the end of the command, so that no Sync
    /// defines another VMI in between.
    commands: tokio::sync::Mutex<()>,
}

impl CmdService {
    pub(crate) fn new(manager: Arc<Manager>, options: ServerOptions) -> Self {
        CmdService {
            manager,
            options,
            commands: tokio::sync::Mutex::new(()),
        }
    }

    /// Runs `command` (off the async runtime) when the request's VMI (its
    /// UID: [`request_uid`]) is this launcher's own; otherwise answers
    /// `success: false` and leaves the VM as it is.
    async fn own_vmi(
        &self,
        uid: Result<String, Failure>,
        name: &'static str,
        command: impl FnOnce(&Arc<Manager>) -> Result<(), Failure> + Send + 'static,
    ) -> Result<Response<cmd::Response>, Status> {
        let _one_at_a_time = self.commands.lock().await;
        let manager = self.manager.clone();
        let started_for = self.options.vmi_uid.clone();
        let result = blocking(move || {
            let uid = uid?;
            let own =
                started_for.or_else(|| manager.domain().map(|d| d.spec.metadata.kubevirt.uid));
            match own {
                Some(own) if own != uid => Err(Failure::Refused(format!(
                    "refused: this launcher runs VMI UID {own}, not {}",
                    if uid.is_empty() {
                        "a VMI without UID"
                    } else {
                        &uid
                    }
                ))),
                _ => command(&manager),
            }
        })
        .await?;
        reply(result, name)
    }

    /// `GetDomainStats`, off the async runtime: the manager's lock is
    /// held for as long as a VM takes to start.
    async fn domain_stats(&self) -> Result<cmd::DomainStatsResponse, Status> {
        let manager = self.manager.clone();
        blocking(move || cmd::DomainStatsResponse {
            response: Some(ok()),
            domain_stats: manager.stats_json().unwrap_or_default(),
        })
        .await
    }
}

fn failed(message: impl Into<String>) -> cmd::Response {
    cmd::Response {
        success: false,
        message: message.into(),
    }
}

/// The Go launcher's answer to a request whose VMI JSON does not parse.
const NO_VALID_VMI: &str = "No valid vmi object present in command server request";

/// The request's VMI as generic JSON (`None`: missing or not an object).
fn vmi_value(vmi: Option<&cmd::Vmi>) -> Option<serde_json::Value> {
    serde_json::from_slice::<serde_json::Value>(&vmi?.vmi_json)
        .ok()
        .filter(|v| v.is_object())
}

/// The UID of the request's VMI (`""` when it has none), or why there is
/// no VMI to read it from.
fn request_uid(request: &cmd::VmiRequest) -> Result<String, Failure> {
    let invalid = |why: String| Failure::Refused(format!("{NO_VALID_VMI}: {why}"));
    let json = request
        .vmi
        .as_ref()
        .map(|v| v.vmi_json.as_slice())
        .ok_or_else(|| invalid("the request carries no VMI".into()))?;
    let vmi = serde_json::from_slice::<serde_json::Value>(json)
        .map_err(|e| invalid(format!("cannot parse the VMI JSON: {e}")))?;
    if !vmi.is_object() {
        return Err(invalid("cannot parse the VMI JSON: not an object".into()));
    }
    Ok(vmi
        .pointer("/metadata/uid")
        .and_then(|u| u.as_str())
        .unwrap_or_default()
        .to_string())
}

/// `storage.IsChangedBlockTrackingEnabled`: `status.changedBlockTracking.state`.
fn changed_block_tracking_enabled(vmi: &serde_json::Value) -> bool {
    vmi.pointer("/status/changedBlockTracking/state")
        .and_then(|s| s.as_str())
        == Some("Enabled")
}

fn ok() -> cmd::Response {
    cmd::Response {
        success: true,
        message: String::new(),
    }
}

fn reply(result: Result<(), Failure>, command: &str) -> Result<Response<cmd::Response>, Status> {
    Ok(Response::new(match result {
        Ok(()) => ok(),
        Err(failure) => {
            let message = failure.to_string();
            tracing::warn!("{command} failed: {message}");
            cmd::Response {
                success: false,
                message,
            }
        }
    }))
}

/// The VMI carried by a request, as JSON (Kubernetes casing).
fn vmi_of(request: &cmd::VmiRequest) -> Result<VirtualMachineInstance, Failure> {
    let json = request
        .vmi
        .as_ref()
        .map(|v| v.vmi_json.as_slice())
        .ok_or_else(|| Failure::Refused("the request carries no VMI".into()))?;
    serde_json::from_slice(json)
        .map_err(|e| Failure::Refused(format!("cannot parse the VMI JSON: {e}")))
}

/// Runs blocking manager work off the async runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("command task failed: {e}")))
}

/// The answer to an RPC this launcher does not implement.
fn unsupported<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!(
        "{what} is not supported by this launcher (no QEMU, libvirt or guest agent)"
    )))
}

#[tonic::async_trait]
impl Cmd for CmdService {
    async fn sync_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let request = request.into_inner();
        self.own_vmi(
            request_uid(&request),
            "SyncVirtualMachine",
            move |manager| {
                let vmi = vmi_of(&request)?;
                manager.sync(&vmi, request.options.as_ref())
            },
        )
        .await
    }

    async fn pause_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "PauseVirtualMachine",
            |m| m.pause(),
        )
        .await
    }

    async fn unpause_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "UnpauseVirtualMachine",
            |m| m.unpause(),
        )
        .await
    }

    async fn shutdown_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "ShutdownVirtualMachine",
            |m| m.shutdown(),
        )
        .await
    }

    async fn kill_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "KillVirtualMachine",
            |m| m.kill(),
        )
        .await
    }

    async fn delete_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "DeleteVirtualMachine",
            |m| m.delete(),
        )
        .await
    }

    async fn soft_reboot_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "SoftRebootVirtualMachine",
            |m| m.soft_reboot(),
        )
        .await
    }

    async fn reset_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "ResetVirtualMachine",
            |m| m.reset(),
        )
        .await
    }

    async fn ping(&self, _: Request<cmd::EmptyRequest>) -> Result<Response<cmd::Response>, Status> {
        Ok(Response::new(ok()))
    }

    async fn get_domain(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::DomainResponse>, Status> {
        // Off the async runtime: the manager's lock is held for as long as
        // a VM takes to start, and the launcher's runtime has one thread.
        let manager = self.manager.clone();
        let domain = blocking(move || manager.domain()).await?;
        Ok(Response::new(cmd::DomainResponse {
            response: Some(ok()),
            domain: domain.map(|d| d.to_json()).unwrap_or_default(),
        }))
    }

    async fn get_domain_stats(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::DomainStatsResponse>, Status> {
        Ok(Response::new(self.domain_stats().await?))
    }

    async fn get_guest_info(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::GuestInfoResponse>, Status> {
        Ok(Response::new(cmd::GuestInfoResponse {
            response: Some(ok()),
            guest_info_response: no_agent::GUEST_INFO.into(),
        }))
    }

    async fn freeze_virtual_machine(
        &self,
        request: Request<cmd::FreezeRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        // The freeze asks the agent for the file systems' state first.
        let answer = match vmi_value(request.into_inner().vmi.as_ref()) {
            None => failed(NO_VALID_VMI),
            Some(_) => failed(no_agent::formatted_error()),
        };
        Ok(Response::new(answer))
    }

    async fn unfreeze_virtual_machine(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let answer = match vmi_value(request.into_inner().vmi.as_ref()) {
            None => failed(NO_VALID_VMI),
            Some(_) => failed(no_agent::formatted_error()),
        };
        Ok(Response::new(answer))
    }

    async fn migrate_virtual_machine(
        &self,
        request: Request<cmd::MigrationRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let request = request.into_inner();
        let as_vmi_request = cmd::VmiRequest {
            vmi: request.vmi.clone(),
            options: None,
        };
        self.own_vmi(
            request_uid(&as_vmi_request),
            "MigrateVirtualMachine",
            move |manager| manager.migrate(&vmi_of(&as_vmi_request)?, &request.options),
        )
        .await
    }

    async fn sync_migration_target(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let request = request.into_inner();
        self.own_vmi(
            request_uid(&request),
            "SyncMigrationTarget",
            move |manager| {
                let vmi = vmi_of(&request)?;
                manager.prepare_migration_target(&vmi, request.options.as_ref())
            },
        )
        .await
    }

    async fn cancel_virtual_machine_migration(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        self.own_vmi(
            request_uid(&request.into_inner()),
            "CancelVirtualMachineMigration",
            |m| m.cancel_migration(),
        )
        .await
    }

    async fn signal_target_pod_cleanup(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let request = request.into_inner();
        self.own_vmi(
            request_uid(&request),
            "SignalTargetPodCleanup",
            move |manager| manager.release_migration_target(&vmi_of(&request)?),
        )
        .await
    }

    async fn finalize_virtual_machine_migration(
        &self,
        request: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        // No interface binding here asks for a link refresh, and no guest agent sets
        // the clock: nothing to do, as often as it is asked.
        self.own_vmi(
            request_uid(&request.into_inner()),
            "FinalizeVirtualMachineMigration",
            |_| Ok(()),
        )
        .await
    }

    async fn hotplug_host_devices(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("HotplugHostDevices")
    }

    async fn get_users(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::GuestUserListResponse>, Status> {
        // The handler's metrics and `virtctl userlist` read this: an empty
        // list, as KubeVirt's launcher answers for a guest without agent.
        Ok(Response::new(cmd::GuestUserListResponse {
            response: Some(ok()),
            guest_user_list_response: no_agent::EMPTY_LIST.into(),
        }))
    }

    async fn get_filesystems(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::GuestFilesystemsResponse>, Status> {
        // The handler's domain-stats scraper calls this after
        // GetDomainStats; a failure here drops the VMI's metrics.
        Ok(Response::new(cmd::GuestFilesystemsResponse {
            response: Some(ok()),
            guest_filesystems_response: no_agent::EMPTY_LIST.into(),
        }))
    }

    async fn exec(
        &self,
        _: Request<cmd::ExecRequest>,
    ) -> Result<Response<cmd::ExecResponse>, Status> {
        // virt-probe's exec probes: the Go launcher returns libvirt's error,
        // which gRPC carries as UNKNOWN.
        Err(Status::unknown(no_agent::libvirt_error()))
    }

    async fn guest_ping(
        &self,
        _: Request<cmd::GuestPingRequest>,
    ) -> Result<Response<cmd::GuestPingResponse>, Status> {
        // virt-probe's guest-agent ping probe fails, as with the Go launcher.
        Err(Status::unknown(no_agent::libvirt_error()))
    }

    async fn virtual_machine_memory_dump(
        &self,
        _: Request<cmd::MemoryDumpRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("VirtualMachineMemoryDump")
    }

    async fn get_qemu_version(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::QemuVersionResponse>, Status> {
        unsupported("GetQemuVersion")
    }

    async fn sync_virtual_machine_cp_us(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("SyncVirtualMachineCPUs (CPU hotplug)")
    }

    async fn sync_virtual_machine_memory(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("SyncVirtualMachineMemory (memory hotplug)")
    }

    async fn get_sev_info(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::SevInfoResponse>, Status> {
        unsupported("GetSEVInfo (SEV)")
    }

    async fn get_launch_measurement(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::LaunchMeasurementResponse>, Status> {
        unsupported("GetLaunchMeasurement (SEV)")
    }

    async fn inject_launch_secret(
        &self,
        _: Request<cmd::InjectLaunchSecretRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("InjectLaunchSecret (SEV)")
    }

    async fn get_domain_dirty_rate_stats(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::DirtyRateStatsResponse>, Status> {
        Ok(Response::new(dirty_rate_stats()))
    }

    async fn get_screenshot(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::ScreenshotResponse>, Status> {
        unsupported("GetScreenshot (no display device)")
    }

    async fn backup_virtual_machine(
        &self,
        request: Request<cmd::BackupRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        // This launcher never enables changed block tracking, so the Go
        // launcher's answer for a VMI without it is the only one.
        let answer = match vmi_value(request.into_inner().vmi.as_ref()) {
            None => failed(NO_VALID_VMI),
            Some(vmi) if !changed_block_tracking_enabled(&vmi) => {
                failed("Backup failed ChangedBlockTracking is not enabled")
            }
            Some(_) => failed("Backup failed: this launcher has no changed block tracking"),
        };
        Ok(Response::new(answer))
    }

    async fn redefine_checkpoint(
        &self,
        request: Request<cmd::RedefineCheckpointRequest>,
    ) -> Result<Response<cmd::RedefineCheckpointResponse>, Status> {
        // As the Go launcher: a failure in the response (the handler answers
        // 503, or 422 when `checkpoint_invalid`), never a gRPC error.
        let response = match vmi_value(request.into_inner().vmi.as_ref()) {
            None => failed(NO_VALID_VMI),
            Some(vmi) if !changed_block_tracking_enabled(&vmi) => {
                failed("Redefine checkpoint failed: ChangedBlockTracking is not enabled")
            }
            Some(_) => {
                failed("Redefine checkpoint failed: this launcher has no changed block tracking")
            }
        };
        Ok(Response::new(cmd::RedefineCheckpointResponse {
            response: Some(response),
            checkpoint_invalid: false,
        }))
    }

    async fn get_vm_stats(
        &self,
        request: Request<cmd::VmStatsRequest>,
    ) -> Result<Response<cmd::VmStatsResponse>, Status> {
        if !self.options.vm_stats_collector {
            // The Go launcher returns a plain error: gRPC UNKNOWN.
            return Err(Status::unknown(
                "VMStatsCollector feature gate is not enabled",
            ));
        }
        let request = request.into_inner();
        let domain_stats = match request.domain_stats {
            Some(_) => Some(self.domain_stats().await?),
            None => None,
        };
        Ok(Response::new(vm_stats(&request, || {
            domain_stats.unwrap_or_default()
        })))
    }
}

/// `GetDomainDirtyRateStats`: the VMM does not measure how fast the guest
/// dirties its memory (libvirt's `calc-dirty-rate`); a failed response, as
/// the Go launcher's when libvirt has no rate.
fn dirty_rate_stats() -> cmd::DirtyRateStatsResponse {
    cmd::DirtyRateStatsResponse {
        response: Some(failed(
            "the dirty page rate is not measured by this launcher",
        )),
        dirty_rate_mbs: 0,
    }
}

/// One agent command of `GetVMStats`: its name, whether it was asked for,
/// and its place in the response.
type AgentField = (
    &'static str,
    bool,
    fn(&mut cmd::VmStatsResponse) -> &mut Option<cmd::Response>,
);

/// `GetVMStats` (KubeVirt's `cmd-server/vmstats.go`): each category asked
/// for, answered as its own RPC would be; the agent commands as without a
/// connected agent. The response fails, listing every failed part, when
/// one does.
fn vm_stats(
    request: &cmd::VmStatsRequest,
    domain_stats: impl FnOnce() -> cmd::DomainStatsResponse,
) -> cmd::VmStatsResponse {
    let mut response = cmd::VmStatsResponse {
        response: Some(ok()),
        ..Default::default()
    };
    let mut errors = Vec::new();
    let mut note = |what: String, r: Option<&cmd::Response>| {
        if let Some(r) = r.filter(|r| !r.success) {
            errors.push(format!("{what}: {}", r.message));
        }
    };
    if request.domain_stats.is_some() {
        let stats = domain_stats();
        note("domain stats".into(), stats.response.as_ref());
        response.domain_stats = Some(stats);
    }
    if request.dirty_rate.is_some() {
        let rate = dirty_rate_stats();
        note("dirty rate stats".into(), rate.response.as_ref());
        response.dirty_rate_stats = Some(rate);
    }
    let agent: [AgentField; 14] = [
        ("guest-get-load", request.guest_get_load.is_some(), |r| {
            &mut r.guest_get_load
        }),
        (
            "guest-get-cpustats",
            request.guest_get_cpu_stats.is_some(),
            |r| &mut r.guest_get_cpu_stats,
        ),
        (
            "guest-get-diskstats",
            request.guest_get_disk_stats.is_some(),
            |r| &mut r.guest_get_disk_stats,
        ),
        ("guest-get-time", request.guest_get_time.is_some(), |r| {
            &mut r.guest_get_time
        }),
        ("guest-get-vcpus", request.guest_get_vcpus.is_some(), |r| {
            &mut r.guest_get_vcpus
        }),
        (
            "guest-get-memory-block-info",
            request.guest_get_memory_block_info.is_some(),
            |r| &mut r.guest_get_memory_block_info,
        ),
        ("guest-get-users", request.guest_get_users.is_some(), |r| {
            &mut r.guest_get_users
        }),
        (
            "guest-get-osinfo",
            request.guest_get_os_info.is_some(),
            |r| &mut r.guest_get_os_info,
        ),
        ("guest-get-disks", request.guest_get_disks.is_some(), |r| {
            &mut r.guest_get_disks
        }),
        (
            "guest-get-host-name",
            request.guest_get_host_name.is_some(),
            |r| &mut r.guest_get_host_name,
        ),
        (
            "guest-get-timezone",
            request.guest_get_timezone.is_some(),
            |r| &mut r.guest_get_timezone,
        ),
        (
            "guest-network-get-route",
            request.guest_network_get_route.is_some(),
            |r| &mut r.guest_network_get_route,
        ),
        (
            "guest-network-get-interfaces",
            request.guest_network_get_interfaces.is_some(),
            |r| &mut r.guest_network_get_interfaces,
        ),
        (
            "guest-get-memory-blocks",
            request.guest_get_memory_blocks.is_some(),
            |r| &mut r.guest_get_memory_blocks,
        ),
    ];
    if agent.iter().any(|(_, asked, _)| *asked) {
        // No agent: no version to report.
        response.guest_agent_version = Some(ok());
    }
    for (command, asked, field) in agent {
        if asked {
            let answer = failed(no_agent::agent_data_error(command));
            note(format!("agent data {command}"), Some(&answer));
            *field(&mut response) = Some(answer);
        }
    }
    if !errors.is_empty() {
        response.response = Some(failed(errors.join("; ")));
    }
    response
}

/// `CmdInfo`: the launcher speaks version 1 of the cmd protocol.
pub(crate) struct InfoService;

#[tonic::async_trait]
impl CmdInfo for InfoService {
    async fn info(&self, _: Request<CmdInfoRequest>) -> Result<Response<CmdInfoResponse>, Status> {
        Ok(Response::new(CmdInfoResponse {
            supported_cmd_versions: vec![cmd::CMD_VERSION],
        }))
    }
}

/// Serves both services on `listener` until `shutdown` resolves.
pub(crate) async fn serve(
    manager: Arc<Manager>,
    options: ServerOptions,
    listener: tokio::net::UnixListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(proto::grpc::cmd::v1::cmd_server::CmdServer::new(
            CmdService::new(manager, options),
        ))
        .add_service(proto::grpc::cmd::info::cmd_info_server::CmdInfoServer::new(
            InfoService,
        ))
        .serve_with_incoming_shutdown(
            tokio_stream::wrappers::UnixListenerStream::new(listener),
            shutdown,
        )
        .await
}

/// A client for the cmd service over a unix socket (self-check, tests).
pub async fn connect(
    socket: &std::path::Path,
) -> std::io::Result<cmd::cmd_client::CmdClient<tonic::transport::Channel>> {
    let channel = unix_channel(socket).await?;
    Ok(cmd::cmd_client::CmdClient::new(channel))
}

/// A gRPC channel to a unix socket (any path length; see [`proto::unix`]).
pub async fn unix_channel(socket: &std::path::Path) -> std::io::Result<tonic::transport::Channel> {
    proto::unix::channel(socket, std::time::Duration::from_secs(2)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::ManagerOptions;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    /// The launcher's runtime has one thread, and `SyncVirtualMachine` holds
    /// the manager's lock while a VM starts: an RPC that waits for the lock
    /// must leave the runtime free (timers, `Ping`, the notifier).
    #[test]
    fn reading_the_domain_while_a_vm_starts_leaves_the_runtime_free() {
        let root = tempfile::tempdir().unwrap();
        let (manager, _events, _stage) = Manager::new(ManagerOptions {
            paths: crate::paths::Paths::under(root.path()),
            sys_class_net: root.path().join("net"),
            serve_dhcp: false,
            sandbox: vmm::SandboxConfig::default(),
        });
        let service = Arc::new(CmdService::new(manager.clone(), ServerOptions::default()));
        let released = Arc::new(AtomicBool::new(false));
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn({
            let (manager, released) = (manager.clone(), released.clone());
            move || {
                let guard = manager.hold_lock();
                held_tx.send(()).unwrap();
                // Long against the 100 ms below, so that a loaded machine
                // cannot make a runtime stalled by the lock look free.
                std::thread::sleep(Duration::from_secs(5));
                released.store(true, Ordering::SeqCst);
                drop(guard);
            }
        });
        held_rx.recv().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let reads = [
                tokio::spawn({
                    let service = service.clone();
                    async move {
                        service
                            .get_domain(Request::new(cmd::EmptyRequest {}))
                            .await
                            .map(|_| ())
                    }
                }),
                tokio::spawn({
                    let service = service.clone();
                    async move {
                        service
                            .get_domain_stats(Request::new(cmd::EmptyRequest {}))
                            .await
                            .map(|_| ())
                    }
                }),
            ];
            tokio::time::sleep(Duration::from_millis(100)).await;
            let ping = service.ping(Request::new(cmd::EmptyRequest {})).await;
            assert!(ping.is_ok());
            assert!(
                !released.load(Ordering::SeqCst),
                "the runtime stalled until the manager's lock was released"
            );
            for read in reads {
                read.await.unwrap().unwrap();
            }
        });
        holder.join().unwrap();
    }
}
