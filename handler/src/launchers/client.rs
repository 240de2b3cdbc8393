//! The cmd client: how the handler calls one launcher (proto/CONTRACT.md §1).
//!
//! Dials the launcher's unix socket (2 s connect timeout), negotiates the version with
//! `CmdInfo.Info` on every new connection, then sends commands with KubeVirt's timeouts
//! and turns replies into errors exactly as `cmd-client/errors.go` does.

use std::path::{Path, PathBuf};
use std::time::Duration;

use proto::domain::Domain;
use proto::grpc::cmd::info::CmdInfoRequest;
use proto::grpc::cmd::info::cmd_info_client::CmdInfoClient;
use proto::grpc::cmd::v1::cmd_client::CmdClient;
use proto::grpc::cmd::v1::{
    self as cmdv1, EmptyRequest, Response, VirtualMachineOptions, Vmi, VmiRequest,
};
use proto::kubevirt::VirtualMachineInstance;
use tonic::transport::Channel;
use tonic::{Code, Status};

/// The cmd versions this handler speaks (`supportedCmdVersions`).
pub(crate) const SUPPORTED_CMD_VERSIONS: &[u32] = &[cmdv1::CMD_VERSION];
/// `CONNECT_TIMEOUT_SECONDS`.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// `shortTimeout`: GetDomain, Ping, Info, ...
pub(crate) const SHORT_TIMEOUT: Duration = Duration::from_secs(5);
/// `longTimeout`: every VMIRequest command.
pub(crate) const LONG_TIMEOUT: Duration = Duration::from_secs(20);

/// A failed command, classified as `handleError` does.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    #[error("cannot connect to launcher socket {path}: {reason}")]
    Connect { path: PathBuf, reason: String },
    #[error("no compatible version found, launcher supports {server:?}, handler {client:?}")]
    NoCompatibleVersion { server: Vec<u32>, client: Vec<u32> },
    /// The connection broke (EOF, reset, cancelled): shutdown/kill/delete ignore these.
    #[error("launcher disconnected during {command}: {status}")]
    Disconnected {
        command: &'static str,
        status: Status,
    },
    /// The launcher does not implement the command.
    #[error("{status}")]
    Unimplemented {
        command: &'static str,
        status: Status,
    },
    /// Any other gRPC error.
    #[error("unknown error encountered sending command {command}: {status}")]
    Unknown {
        command: &'static str,
        status: Status,
    },
    /// OK status, `success == false`.
    #[error("server error. command {command} failed: {message:?}")]
    Server {
        command: &'static str,
        message: String,
    },
    #[error("launcher returned an invalid domain: {0}")]
    InvalidDomain(serde_json::Error),
    #[error("cannot encode the VMI: {0}")]
    EncodeVmi(serde_json::Error),
}

impl CmdError {
    /// Whether the launcher went away mid-call (`IsDisconnected`).
    pub fn is_disconnected(&self) -> bool {
        matches!(self, CmdError::Disconnected { .. })
    }
}

/// KubeVirt's `IsDisconnected`: EOF, connection reset, broken pipe, shut down, cancelled.
/// tonic reports a dropped connection as a status whose source chain ends in the io error,
/// or as UNAVAILABLE when the transport is gone.
fn status_is_disconnect(status: &Status) -> bool {
    if matches!(status.code(), Code::Cancelled | Code::Unavailable) {
        return true;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::NotConnected
            )
        {
            return true;
        }
        source = err.source();
    }
    false
}

fn classify(command: &'static str, status: Status) -> CmdError {
    if status.code() == Code::Unimplemented {
        CmdError::Unimplemented { command, status }
    } else if status_is_disconnect(&status) {
        CmdError::Disconnected { command, status }
    } else {
        CmdError::Unknown { command, status }
    }
}

fn check_response(command: &'static str, response: Option<&Response>) -> Result<(), CmdError> {
    match response {
        Some(r) if !r.success => Err(CmdError::Server {
            command,
            message: r.message.clone(),
        }),
        _ => Ok(()),
    }
}

/// The commands that take a VMI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VmiCommand {
    Sync,
    Shutdown,
    Kill,
    Delete,
    Pause,
    Unpause,
    SoftReboot,
    Reset,
    Unfreeze,
}

impl VmiCommand {
    /// The RPC name, as error messages spell it.
    pub fn name(self) -> &'static str {
        match self {
            VmiCommand::Sync => "SyncVirtualMachine",
            VmiCommand::Shutdown => "ShutdownVirtualMachine",
            VmiCommand::Kill => "KillVirtualMachine",
            VmiCommand::Delete => "DeleteVirtualMachine",
            VmiCommand::Pause => "PauseVirtualMachine",
            VmiCommand::Unpause => "UnpauseVirtualMachine",
            VmiCommand::SoftReboot => "SoftRebootVirtualMachine",
            VmiCommand::Reset => "ResetVirtualMachine",
            VmiCommand::Unfreeze => "UnfreezeVirtualMachine",
        }
    }
}

/// The migration commands that take a VMI (`handler/docs/migration.md` says who sends which).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MigrationCommand {
    SyncTarget,
    Cancel,
    Finalize,
    SignalTargetPodCleanup,
}

impl MigrationCommand {
    pub fn name(self) -> &'static str {
        match self {
            MigrationCommand::SyncTarget => "SyncMigrationTarget",
            MigrationCommand::Cancel => "CancelVirtualMachineMigration",
            MigrationCommand::Finalize => "FinalizeVirtualMachineMigration",
            MigrationCommand::SignalTargetPodCleanup => "SignalTargetPodCleanup",
        }
    }
}

/// A connected, version-negotiated client of one launcher.
#[derive(Clone, Debug)]
pub struct LauncherClient {
    socket: PathBuf,
    cmd: CmdClient<Channel>,
    version: u32,
}

/// Opens a tonic channel over a unix socket (see [`proto::unix::channel`]).
pub async fn unix_channel(path: &Path, timeout: Duration) -> Result<Channel, CmdError> {
    proto::unix::channel(path, timeout)
        .await
        .map_err(|e| CmdError::Connect {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
}

fn with_timeout<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// The VMI as the launcher receives it: JSON of the handler's copy.
fn vmi_request(
    vmi: &VirtualMachineInstance,
    options: Option<VirtualMachineOptions>,
) -> Result<VmiRequest, CmdError> {
    Ok(VmiRequest {
        vmi: Some(Vmi {
            vmi_json: serde_json::to_vec(vmi).map_err(CmdError::EncodeVmi)?,
        }),
        options,
    })
}

/// The options the handler sends with `SyncVirtualMachine` (proto/CONTRACT.md §1.5 table).
pub(crate) fn sync_options(vmi: &VirtualMachineInstance) -> VirtualMachineOptions {
    let attachments = vmi
        .spec
        .domain
        .devices
        .interfaces
        .iter()
        .filter(|i| i.masquerade.is_some() || i.bridge.is_some())
        .map(|i| (i.name.clone(), "tap".to_string()))
        .collect();
    VirtualMachineOptions {
        virtual_machine_sm_bios: Some(cmdv1::SmBios {
            manufacturer: "KubeVirt".into(),
            product: "None".into(),
            family: "KubeVirt".into(),
            ..Default::default()
        }),
        mem_balloon_stats_period: 10,
        topology: Some(cmdv1::Topology::default()),
        cluster_config: Some(cmdv1::ClusterConfig {
            bochs_display_for_efi_guests: true,
            ..Default::default()
        }),
        interface_domain_attachment: attachments,
        ..Default::default()
    }
}

impl LauncherClient {
    /// Dials `socket` and negotiates the cmd version (`CmdInfo.Info`, 5 s). For sockets
    /// the handler controls; a launcher's socket in a pod goes through
    /// [`Self::connect_pinned`].
    pub async fn connect(socket: &Path) -> Result<Self, CmdError> {
        let channel = unix_channel(socket, CONNECT_TIMEOUT).await?;
        Self::negotiate(channel, socket).await
    }

    /// [`Self::connect`] through a socket pinned by its descriptor: this connection and
    /// every reconnect of the channel reach the socket that was opened.
    pub(crate) async fn connect_pinned(
        socket: std::sync::Arc<crate::podfs::PinnedSocket>,
    ) -> Result<Self, CmdError> {
        let path = socket.path().to_path_buf();
        let dial = move || {
            let socket = std::sync::Arc::clone(&socket);
            async move { socket.connect_async().await }
        };
        let channel = proto::unix::channel_with(dial, CONNECT_TIMEOUT)
            .await
            .map_err(|e| CmdError::Connect {
                path: path.clone(),
                reason: e.to_string(),
            })?;
        Self::negotiate(channel, &path).await
    }

    async fn negotiate(channel: Channel, socket: &Path) -> Result<Self, CmdError> {
        let mut info = CmdInfoClient::new(channel.clone());
        let reply = info
            .info(with_timeout(CmdInfoRequest {}, SHORT_TIMEOUT))
            .await
            .map_err(|status| classify("Info", status))?
            .into_inner();
        let version = proto::grpc::highest_compatible_version(
            &reply.supported_cmd_versions,
            SUPPORTED_CMD_VERSIONS,
        )
        .ok_or_else(|| CmdError::NoCompatibleVersion {
            server: reply.supported_cmd_versions.clone(),
            client: SUPPORTED_CMD_VERSIONS.to_vec(),
        })?;
        Ok(LauncherClient {
            socket: socket.to_path_buf(),
            cmd: CmdClient::new(channel),
            version,
        })
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    async fn vmi_command(
        &self,
        command: VmiCommand,
        vmi: &VirtualMachineInstance,
        options: VirtualMachineOptions,
    ) -> Result<(), CmdError> {
        let name = command.name();
        let request = with_timeout(vmi_request(vmi, Some(options))?, LONG_TIMEOUT);
        let mut cmd = self.cmd.clone();
        let reply = match command {
            VmiCommand::Sync => cmd.sync_virtual_machine(request).await,
            VmiCommand::Shutdown => cmd.shutdown_virtual_machine(request).await,
            VmiCommand::Kill => cmd.kill_virtual_machine(request).await,
            VmiCommand::Delete => cmd.delete_virtual_machine(request).await,
            VmiCommand::Pause => cmd.pause_virtual_machine(request).await,
            VmiCommand::Unpause => cmd.unpause_virtual_machine(request).await,
            VmiCommand::SoftReboot => cmd.soft_reboot_virtual_machine(request).await,
            VmiCommand::Reset => cmd.reset_virtual_machine(request).await,
            VmiCommand::Unfreeze => cmd.unfreeze_virtual_machine(request).await,
        };
        let reply = reply.map_err(|status| classify(name, status))?.into_inner();
        check_response(name, Some(&reply))
    }

    /// `SyncVirtualMachine` with the options of proto/CONTRACT.md §1.5.
    pub async fn sync_virtual_machine(&self, vmi: &VirtualMachineInstance) -> Result<(), CmdError> {
        self.vmi_command(VmiCommand::Sync, vmi, sync_options(vmi))
            .await
    }

    /// Any other VMI command; these send empty options.
    pub async fn send(
        &self,
        command: VmiCommand,
        vmi: &VirtualMachineInstance,
    ) -> Result<(), CmdError> {
        self.vmi_command(command, vmi, VirtualMachineOptions::default())
            .await
    }

    /// `FreezeVirtualMachine`: the guest's file systems frozen (through its agent), thawed
    /// again after `unfreeze_timeout_seconds` at the latest.
    pub async fn freeze(
        &self,
        vmi: &VirtualMachineInstance,
        unfreeze_timeout_seconds: i32,
    ) -> Result<(), CmdError> {
        let request = vmi_request(vmi, None)?;
        let request = with_timeout(
            cmdv1::FreezeRequest {
                vmi: request.vmi,
                unfreeze_timeout_seconds,
            },
            LONG_TIMEOUT,
        );
        let reply = self
            .cmd
            .clone()
            .freeze_virtual_machine(request)
            .await
            .map_err(|status| classify("FreezeVirtualMachine", status))?
            .into_inner();
        check_response("FreezeVirtualMachine", Some(&reply))
    }

    /// `MigrateVirtualMachine`: starts the migration described by `status.migrationState`
    /// with `options` (KubeVirt's `MigrationOptions` JSON); the launcher answers at once and
    /// reports the rest through its domain's migration metadata.
    pub async fn migrate(
        &self,
        vmi: &VirtualMachineInstance,
        options: &serde_json::Value,
    ) -> Result<(), CmdError> {
        const NAME: &str = "MigrateVirtualMachine";
        let request = vmi_request(vmi, None)?;
        let request = with_timeout(
            cmdv1::MigrationRequest {
                vmi: request.vmi,
                options: serde_json::to_vec(options).map_err(CmdError::EncodeVmi)?,
            },
            LONG_TIMEOUT,
        );
        let reply = self
            .cmd
            .clone()
            .migrate_virtual_machine(request)
            .await
            .map_err(|status| classify(NAME, status))?
            .into_inner();
        check_response(NAME, Some(&reply))
    }

    /// One of the migration RPCs that take a VMI: `SyncMigrationTarget` gets the options a
    /// sync gets; the others none.
    pub async fn migration_command(
        &self,
        command: MigrationCommand,
        vmi: &VirtualMachineInstance,
    ) -> Result<(), CmdError> {
        let name = command.name();
        let options = match command {
            MigrationCommand::SyncTarget => Some(sync_options(vmi)),
            _ => None,
        };
        let request = with_timeout(vmi_request(vmi, options)?, LONG_TIMEOUT);
        let mut cmd = self.cmd.clone();
        let reply = match command {
            MigrationCommand::SyncTarget => cmd.sync_migration_target(request).await,
            MigrationCommand::Cancel => cmd.cancel_virtual_machine_migration(request).await,
            MigrationCommand::Finalize => cmd.finalize_virtual_machine_migration(request).await,
            MigrationCommand::SignalTargetPodCleanup => {
                cmd.signal_target_pod_cleanup(request).await
            }
        };
        let reply = reply.map_err(|status| classify(name, status))?.into_inner();
        check_response(name, Some(&reply))
    }

    pub async fn ping(&self) -> Result<(), CmdError> {
        let reply = self
            .cmd
            .clone()
            .ping(with_timeout(EmptyRequest {}, SHORT_TIMEOUT))
            .await
            .map_err(|status| classify("Ping", status))?
            .into_inner();
        check_response("Ping", Some(&reply))
    }

    /// `GetDomain`: `None` when the launcher has no domain (`domain == ""`).
    pub async fn get_domain(&self) -> Result<Option<Domain>, CmdError> {
        let reply = self
            .cmd
            .clone()
            .get_domain(with_timeout(EmptyRequest {}, SHORT_TIMEOUT))
            .await
            .map_err(|status| classify("GetDomain", status))?
            .into_inner();
        check_response("GetDomain", reply.response.as_ref())?;
        if reply.domain.is_empty() {
            return Ok(None);
        }
        Domain::from_json(&reply.domain)
            .map(Some)
            .map_err(CmdError::InvalidDomain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disconnects_are_recognised_by_code_and_io_source() {
        let broken = Status::from_error(Box::new(std::io::Error::new(
            std::io::ErrorKind::BrokenPipe,
            "stream closed",
        )));
        assert!(classify("DeleteVirtualMachine", broken).is_disconnected());
        assert!(classify("Ping", Status::cancelled("gone")).is_disconnected());
        assert!(classify("Ping", Status::unavailable("gone")).is_disconnected());
        let internal = classify(
            "KillVirtualMachine",
            Status::internal("eof in message text"),
        );
        assert!(!internal.is_disconnected());
        assert!(matches!(
            classify("Pause", Status::unimplemented("x")),
            CmdError::Unimplemented { .. }
        ));
    }
}
