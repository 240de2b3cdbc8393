//! A fake launcher cmd server for the handler's tests: a test writes the
//! RPCs it cares about and every other one answers UNIMPLEMENTED, as our
//! launcher does for the RPCs it does not serve.

/// `impl_fake_cmd!(Type { async fn ping(..) {..} ... })` implements `Cmd`
/// for `Type` with the given methods plus UNIMPLEMENTED stubs for the rest
/// (the given ones must be six: sync, shutdown, kill, delete, ping and
/// get_domain).
#[allow(unused_macros)]
macro_rules! impl_fake_cmd {
    ($ty:ty { $($custom:tt)* }) => {
        impl_fake_cmd!(@with $ty { $($custom)* }
            pause_virtual_machine(VmiRequest) -> Response;
            unpause_virtual_machine(VmiRequest) -> Response;
            freeze_virtual_machine(FreezeRequest) -> Response;
            unfreeze_virtual_machine(VmiRequest) -> Response;
            reset_virtual_machine(VmiRequest) -> Response;
            soft_reboot_virtual_machine(VmiRequest) -> Response;
            migrate_virtual_machine(MigrationRequest) -> Response;
            sync_migration_target(VmiRequest) -> Response;
            cancel_virtual_machine_migration(VmiRequest) -> Response;
            signal_target_pod_cleanup(VmiRequest) -> Response;
            finalize_virtual_machine_migration(VmiRequest) -> Response;
            hotplug_host_devices(VmiRequest) -> Response;
            get_domain_stats(EmptyRequest) -> DomainStatsResponse;
            get_guest_info(EmptyRequest) -> GuestInfoResponse;
            get_users(EmptyRequest) -> GuestUserListResponse;
            get_filesystems(EmptyRequest) -> GuestFilesystemsResponse;
            exec(ExecRequest) -> ExecResponse;
            guest_ping(GuestPingRequest) -> GuestPingResponse;
            virtual_machine_memory_dump(MemoryDumpRequest) -> Response;
            get_qemu_version(EmptyRequest) -> QemuVersionResponse;
            sync_virtual_machine_cp_us(VmiRequest) -> Response;
            sync_virtual_machine_memory(VmiRequest) -> Response;
            get_sev_info(EmptyRequest) -> SevInfoResponse;
            get_launch_measurement(VmiRequest) -> LaunchMeasurementResponse;
            inject_launch_secret(InjectLaunchSecretRequest) -> Response;
            get_domain_dirty_rate_stats(EmptyRequest) -> DirtyRateStatsResponse;
            get_screenshot(VmiRequest) -> ScreenshotResponse;
            backup_virtual_machine(BackupRequest) -> Response;
            redefine_checkpoint(RedefineCheckpointRequest) -> RedefineCheckpointResponse;
            get_vm_stats(VmStatsRequest) -> VmStatsResponse;
        );
    };
    (@with $ty:ty { $($custom:tt)* } $($stub:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl proto::grpc::cmd::v1::cmd_server::Cmd for $ty {
            $($custom)*
            $(
                async fn $stub(
                    &self,
                    _r: tonic::Request<proto::grpc::cmd::v1::$req>,
                ) -> Result<tonic::Response<proto::grpc::cmd::v1::$resp>, tonic::Status> {
                    Err(tonic::Status::unimplemented(stringify!($stub)))
                }
            )*
        }
    };
}
