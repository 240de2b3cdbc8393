//! virt-launcher's command line: KubeVirt v1.9.0's flags (proto/CONTRACT.md §4.1)
//! with its defaults, plus path flags so everything can be moved.

use crate::paths::Paths;
use clap::Parser;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "virt-launcher",
    about = "Runs one VMI's VM in this process (KVM, no QEMU or libvirt) and serves KubeVirt's cmd API on the pod's launcher socket; started by virt-launcher-monitor",
    // As with Go flags, a repeated flag takes its last value.
    args_override_self = true
)]
pub struct Flags {
    /// Exit if no domain is defined within this time (Go duration: 240s, 3m).
    #[arg(long, default_value = "3m", value_parser = proto::contract::go_duration::parse)]
    pub(crate) qemu_timeout: Duration,
    #[arg(long, default_value = "")]
    pub name: String,
    #[arg(long, default_value = "")]
    pub uid: String,
    #[arg(long, default_value = "")]
    pub namespace: String,
    /// Seconds between a stop signal and killing the VM.
    #[arg(long, default_value_t = 30)]
    pub(crate) grace_period_seconds: i64,
    #[arg(long, default_value = "/var/run/kubevirt")]
    pub(crate) kubevirt_share_dir: PathBuf,
    #[arg(long, default_value = "/var/run/kubevirt-ephemeral-disks")]
    pub ephemeral_disk_dir: PathBuf,
    #[arg(long, default_value = "/var/run/kubevirt/container-disks")]
    pub container_disk_dir: PathBuf,
    #[arg(long, default_value = "/var/run/kubevirt/hotplug-disks/")]
    pub(crate) hotplug_disk_dir: PathBuf,
    #[arg(long, default_value = "/var/run/kubevirt-private")]
    pub private_dir: PathBuf,
    #[arg(long, default_value = "/var/run/kubevirt-image-volume")]
    pub image_volume_dir: PathBuf,
    #[arg(long, default_value = "/var/run/kubevirt-kernel-boot")]
    pub kernel_boot_dir: PathBuf,
    #[arg(long, default_value = "/var/run/libvirt")]
    pub libvirt_runtime_dir: PathBuf,
    #[arg(long, default_value = "/etc/resolv.conf")]
    pub resolv_conf: PathBuf,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) run_as_nonroot: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub image_volume: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) allow_emulation: bool,
    // Flags KubeVirt's controller passes that this launcher accepts and has
    // no use for (they configure libvirt, QEMU or hook sidecars).
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) allow_cross_arch_emulation: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) libvirt_hook_server_and_client: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) upgrade_ordinal_ifaces: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) vgpu_dedicated_hook: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) vm_stats_collector: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) firmware_auto_selection: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) simulate_crash: bool,
    #[arg(long, num_args = 0..=1, default_missing_value = "true", default_value = "false")]
    pub(crate) keep_after_failure: bool,
    #[arg(long, default_value_t = 0)]
    pub(crate) hook_sidecars: u32,
    #[arg(long, default_value_t = 2_097_152_000)]
    pub(crate) disk_memory_limit: u64,
    #[arg(long, default_value = "/usr/share/edk2/ovmf")]
    pub(crate) ovmf_path: PathBuf,
    #[arg(long, default_value = "kvm")]
    pub(crate) hypervisor: String,
    #[arg(long, default_value = "")]
    pub(crate) libvirt_log_filters: String,
    #[arg(long, value_parser = proto::contract::go_duration::parse)]
    pub(crate) qemu_agent_sys_interval: Option<Duration>,
    #[arg(long, value_parser = proto::contract::go_duration::parse)]
    pub(crate) qemu_agent_file_interval: Option<Duration>,
    #[arg(long, value_parser = proto::contract::go_duration::parse)]
    pub(crate) qemu_agent_user_interval: Option<Duration>,
    #[arg(long, value_parser = proto::contract::go_duration::parse)]
    pub(crate) qemu_agent_version_interval: Option<Duration>,
    #[arg(long, value_parser = proto::contract::go_duration::parse)]
    pub(crate) qemu_fsfreeze_status_interval: Option<Duration>,
    /// glog verbosity, as KubeVirt's `-v`.
    #[arg(short = 'v', long = "v", default_value_t = 2)]
    pub verbosity: u32,
}

impl Flags {
    pub fn paths(&self) -> Paths {
        Paths {
            share_dir: self.kubevirt_share_dir.clone(),
            ephemeral_disk_dir: self.ephemeral_disk_dir.clone(),
            container_disk_dir: self.container_disk_dir.clone(),
            private_dir: self.private_dir.clone(),
            image_volume_dir: self.image_volume_dir.clone(),
            kernel_boot_dir: self.kernel_boot_dir.clone(),
            libvirt_runtime_dir: self.libvirt_runtime_dir.clone(),
            resolv_conf: self.resolv_conf.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_flags_kubevirt_renders() {
        let flags = Flags::try_parse_from([
            "virt-launcher",
            "--qemu-timeout",
            "287s",
            "--name",
            "vmi-a",
            "--uid",
            "u-1",
            "--namespace",
            "default",
            "--kubevirt-share-dir",
            "/var/run/kubevirt",
            "--ephemeral-disk-dir",
            "/var/run/kubevirt-ephemeral-disks",
            "--container-disk-dir",
            "/var/run/kubevirt/container-disks",
            "--grace-period-seconds",
            "45",
            "--hook-sidecars",
            "0",
            "--ovmf-path",
            "/usr/share/OVMF",
            "--disk-memory-limit",
            "2097152000",
            "--run-as-nonroot",
            "--image-volume",
            "--libvirt-hook-server-and-client",
            "--upgrade-ordinal-ifaces",
        ])
        .unwrap();
        assert_eq!(flags.qemu_timeout, Duration::from_secs(287));
        assert_eq!(flags.grace_period_seconds, 45);
        assert!(flags.run_as_nonroot && flags.image_volume);
        let flags = Flags::try_parse_from(["virt-launcher", "--run-as-nonroot=false"]).unwrap();
        assert!(!flags.run_as_nonroot);
    }
}
