//! The `kubevirt.cmd.v1.Cmd` and `kubevirt.cmd.info.CmdInfo` services on the
//! launcher's unix socket.
//!
//! Replies follow the contract (§1.4): success is `Response{success: true}`;
//! a failed command is `success: false` with a message (what the Go launcher
//! does); an RPC this launcher does not implement is gRPC `UNIMPLEMENTED`.

use crate::manager::{Failure, Manager};
use proto::grpc::cmd::info::{CmdInfoRequest, CmdInfoResponse, cmd_info_server::CmdInfo};
use proto::grpc::cmd::v1::{self as cmd, cmd_server::Cmd};
use proto::kubevirt::VirtualMachineInstance;
use std::sync::Arc;
use tonic::{Request, Response, Status};

pub struct CmdService {
    manager: Arc<Manager>,
}

impl CmdService {
    pub fn new(manager: Arc<Manager>) -> Self {
        CmdService { manager }
    }
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
        Err(Failure(message)) => {
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
        .ok_or_else(|| Failure("the request carries no VMI".into()))?;
    serde_json::from_slice(json).map_err(|e| Failure(format!("cannot parse the VMI JSON: {e}")))
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
        let manager = self.manager.clone();
        let result = blocking(move || {
            let vmi = vmi_of(&request)?;
            manager.sync(&vmi, request.options.as_ref())
        })
        .await?;
        reply(result, "SyncVirtualMachine")
    }

    async fn pause_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.pause()).await?,
            "PauseVirtualMachine",
        )
    }

    async fn unpause_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.unpause()).await?,
            "UnpauseVirtualMachine",
        )
    }

    async fn shutdown_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.shutdown()).await?,
            "ShutdownVirtualMachine",
        )
    }

    async fn kill_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.kill()).await?,
            "KillVirtualMachine",
        )
    }

    async fn delete_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.delete()).await?,
            "DeleteVirtualMachine",
        )
    }

    async fn soft_reboot_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.soft_reboot()).await?,
            "SoftRebootVirtualMachine",
        )
    }

    async fn reset_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        let manager = self.manager.clone();
        reply(
            blocking(move || manager.reset()).await?,
            "ResetVirtualMachine",
        )
    }

    async fn ping(&self, _: Request<cmd::EmptyRequest>) -> Result<Response<cmd::Response>, Status> {
        Ok(Response::new(ok()))
    }

    async fn get_domain(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::DomainResponse>, Status> {
        let domain = self.manager.domain();
        Ok(Response::new(cmd::DomainResponse {
            response: Some(ok()),
            domain: domain.map(|d| d.to_json()).unwrap_or_default(),
        }))
    }

    async fn get_domain_stats(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::DomainStatsResponse>, Status> {
        Ok(Response::new(cmd::DomainStatsResponse {
            response: Some(ok()),
            domain_stats: self.manager.stats_json().unwrap_or_default(),
        }))
    }

    async fn get_guest_info(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::GuestInfoResponse>, Status> {
        // Without a guest agent nothing about the guest's inside is known;
        // the handler only asks when an agent is connected.
        Ok(Response::new(cmd::GuestInfoResponse {
            response: Some(ok()),
            guest_info_response: "{}".into(),
        }))
    }

    async fn freeze_virtual_machine(
        &self,
        _: Request<cmd::FreezeRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("FreezeVirtualMachine (filesystem freeze needs a guest agent)")
    }

    async fn unfreeze_virtual_machine(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("UnfreezeVirtualMachine (filesystem freeze needs a guest agent)")
    }

    async fn migrate_virtual_machine(
        &self,
        _: Request<cmd::MigrationRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("MigrateVirtualMachine (live migration)")
    }

    async fn sync_migration_target(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("SyncMigrationTarget (live migration)")
    }

    async fn cancel_virtual_machine_migration(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("CancelVirtualMachineMigration (live migration)")
    }

    async fn signal_target_pod_cleanup(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("SignalTargetPodCleanup (live migration)")
    }

    async fn finalize_virtual_machine_migration(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("FinalizeVirtualMachineMigration (live migration)")
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
        unsupported("GetUsers (needs a guest agent)")
    }

    async fn get_filesystems(
        &self,
        _: Request<cmd::EmptyRequest>,
    ) -> Result<Response<cmd::GuestFilesystemsResponse>, Status> {
        unsupported("GetFilesystems (needs a guest agent)")
    }

    async fn exec(
        &self,
        _: Request<cmd::ExecRequest>,
    ) -> Result<Response<cmd::ExecResponse>, Status> {
        unsupported("Exec (needs a guest agent)")
    }

    async fn guest_ping(
        &self,
        _: Request<cmd::GuestPingRequest>,
    ) -> Result<Response<cmd::GuestPingResponse>, Status> {
        unsupported("GuestPing (needs a guest agent)")
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
        unsupported("GetDomainDirtyRateStats")
    }

    async fn get_screenshot(
        &self,
        _: Request<cmd::VmiRequest>,
    ) -> Result<Response<cmd::ScreenshotResponse>, Status> {
        unsupported("GetScreenshot (no display device)")
    }

    async fn backup_virtual_machine(
        &self,
        _: Request<cmd::BackupRequest>,
    ) -> Result<Response<cmd::Response>, Status> {
        unsupported("BackupVirtualMachine")
    }

    async fn redefine_checkpoint(
        &self,
        _: Request<cmd::RedefineCheckpointRequest>,
    ) -> Result<Response<cmd::RedefineCheckpointResponse>, Status> {
        unsupported("RedefineCheckpoint")
    }

    async fn get_vm_stats(
        &self,
        _: Request<cmd::VmStatsRequest>,
    ) -> Result<Response<cmd::VmStatsResponse>, Status> {
        unsupported("GetVMStats")
    }
}

/// `CmdInfo`: the launcher speaks version 1 of the cmd protocol.
pub struct InfoService;

#[tonic::async_trait]
impl CmdInfo for InfoService {
    async fn info(&self, _: Request<CmdInfoRequest>) -> Result<Response<CmdInfoResponse>, Status> {
        Ok(Response::new(CmdInfoResponse {
            supported_cmd_versions: vec![cmd::CMD_VERSION],
        }))
    }
}

/// Serves both services on `listener` until `shutdown` resolves.
pub async fn serve(
    manager: Arc<Manager>,
    listener: tokio::net::UnixListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    tonic::transport::Server::builder()
        .add_service(proto::grpc::cmd::v1::cmd_server::CmdServer::new(
            CmdService::new(manager),
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
