//! Kubelet device plugins for the devices every launcher pod asks for
//! (`devices.kubevirt.io/kvm`, `.../tun`, `.../vhost-net`), as KubeVirt v1.9.0's handler
//! serves them (`pkg/virt-handler/device-manager/generic_device.go`,
//! `device_controller.go`).
//!
//! One plugin per device node. Each advertises [`MAX_DEVICES`] identical devices (the
//! API has no notion of a shared device, so KubeVirt registers a large count: it bounds
//! the VMIs per node), all healthy or all unhealthy with the node they stand for. A
//! missing or unusable node is still registered, with every device unhealthy: the
//! kubelet then reports the resource's capacity but zero allocatable, so no launcher pod
//! is admitted on this node. `Allocate` hands the container the host node at the same
//! path with the cgroup permissions of [`device_permissions`].
//!
//! Plugins live in the kubelet's device-plugin directory and register on its
//! `kubelet.sock`. A restarting kubelet wipes that directory: a plugin that sees its own
//! socket disappear starts over (new socket, new registration) after KubeVirt's back-off
//! (1 s, then 2, 5, 10 s while registration keeps failing).

mod health;
mod plugin;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use health::{Health, probe};

/// The resource namespace of KubeVirt's devices (`DeviceNamespace`).
pub(crate) const DEVICE_NAMESPACE: &str = "devices.kubevirt.io";
/// `--max-devices` default: devices advertised per plugin (KubeVirt's `maxDevices`).
pub const MAX_DEVICES: usize = 1000;
/// Where the handler sees the host's root, so the host's `/dev` need not be mounted
/// (KubeVirt's `util.HostRootMount`; the handler runs with `hostPID`).
pub const HOST_ROOT: &str = "/proc/1/root";
/// Pause before restarting a plugin, by the number of failed starts in a row
/// (`defaultBackoffTime`).
pub(crate) const BACKOFF: [Duration; 4] = [
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// A device node served by one plugin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenericDevice {
    /// `kvm`, `tun`, `vhost-net`: the resource is `devices.kubevirt.io/<name>`.
    pub name: String,
    /// The node on the host and in the container (`/dev/kvm`).
    pub path: PathBuf,
}

impl GenericDevice {
    pub fn new(name: &str, path: &str) -> Self {
        GenericDevice {
            name: name.to_string(),
            path: PathBuf::from(path),
        }
    }

    /// `devices.kubevirt.io/<name>`.
    pub fn resource_name(&self) -> String {
        format!("{DEVICE_NAMESPACE}/{}", self.name)
    }

    /// The plugin's socket in the device-plugin directory (`kubevirt-<name>.sock`).
    pub(crate) fn socket_name(&self) -> String {
        format!("kubevirt-{}.sock", self.name)
    }

    /// The ID of device `index` (`kvm0` ... `kvm999`).
    pub(crate) fn device_id(&self, index: usize) -> String {
        format!("{}{index}", self.name)
    }
}

/// KubeVirt's permanent plugins (`PermanentHostDevicePlugins` with the `kvm` hypervisor
/// device). The feature-gated ones (`sev`, `vhost-vsock`) are not served: this handler
/// has no feature gates and supports neither.
pub fn permanent_devices() -> Vec<GenericDevice> {
    vec![
        GenericDevice::new("kvm", "/dev/kvm"),
        GenericDevice::new("tun", "/dev/net/tun"),
        GenericDevice::new("vhost-net", "/dev/vhost-net"),
    ]
}

/// The cgroup device permissions of a `DeviceSpec`: `rwm` on cgroup v2, else `rw`.
/// On cgroup v2 runc's eBPF device filter also checks `mknod` for the `access` probe
/// libraries do on the node, hence the `m` (KubeVirt: `pkg/virt-handler/vm.go`).
pub(crate) fn device_permissions() -> &'static str {
    if cgroup2_unified() { "rwm" } else { "rw" }
}

/// `cgroups.IsCgroup2UnifiedMode`: `/sys/fs/cgroup` is a cgroup2 file system.
fn cgroup2_unified() -> bool {
    use nix::sys::statfs::{CGROUP2_SUPER_MAGIC, statfs};
    statfs("/sys/fs/cgroup").is_ok_and(|s| s.filesystem_type() == CGROUP2_SUPER_MAGIC)
}

/// Where the plugins live and what they advertise.
#[derive(Debug, Clone)]
pub struct DevicePluginConfig {
    /// The kubelet's device-plugin directory (`kubelet.sock` and our sockets).
    pub plugin_dir: PathBuf,
    /// Where the devices' host paths are looked up for health ([`HOST_ROOT`]; a directory
    /// of fake nodes in tests). `Allocate` still answers with the host paths.
    pub device_root: PathBuf,
    /// Devices advertised per plugin.
    pub max_devices: usize,
    /// `DeviceSpec.permissions`.
    pub permissions: String,
    /// Pauses between restarts (see [`BACKOFF`]).
    pub backoff: Vec<Duration>,
}

impl DevicePluginConfig {
    pub fn new(plugin_dir: &Path, device_root: &Path) -> Self {
        DevicePluginConfig {
            plugin_dir: plugin_dir.to_path_buf(),
            device_root: device_root.to_path_buf(),
            max_devices: MAX_DEVICES,
            permissions: device_permissions().to_string(),
            backoff: BACKOFF.to_vec(),
        }
    }
}

/// The running plugins.
pub struct DevicePlugins {
    plugins: Arc<[Arc<plugin::Plugin>]>,
    tasks: Vec<JoinHandle<()>>,
    stop: watch::Sender<bool>,
}

/// Whether every plugin is registered with the kubelet (KubeVirt's
/// `DeviceController.Initialized`); cheap to clone and ask.
#[derive(Clone)]
pub struct PluginsReady(Arc<[Arc<plugin::Plugin>]>);

impl PluginsReady {
    pub fn all_registered(&self) -> bool {
        self.0.iter().all(|p| p.registered())
    }
}

impl DevicePlugins {
    /// Starts one plugin per device; each keeps (re)registering until [`Self::stop`].
    pub fn start(config: DevicePluginConfig, devices: Vec<GenericDevice>) -> Self {
        let config = Arc::new(config);
        let (stop, stopped) = watch::channel(false);
        let plugins: Arc<[Arc<plugin::Plugin>]> = devices
            .into_iter()
            .map(|d| Arc::new(plugin::Plugin::new(d, Arc::clone(&config))))
            .collect();
        let tasks = plugins
            .iter()
            .map(|p| {
                tracing::info!(device = %p.device().name, "starting a device plugin");
                tokio::spawn(Arc::clone(p).run(stopped.clone()))
            })
            .collect();
        DevicePlugins {
            plugins,
            tasks,
            stop,
        }
    }

    pub fn readiness(&self) -> PluginsReady {
        PluginsReady(Arc::clone(&self.plugins))
    }

    /// The current health of the plugin of device `name`.
    pub fn health(&self, name: &str) -> Option<Health> {
        self.plugins
            .iter()
            .find(|p| p.device().name == name)
            .map(|p| p.health())
    }

    /// Whether the plugin of device `name` is registered right now.
    pub fn registered(&self, name: &str) -> Option<bool> {
        self.plugins
            .iter()
            .find(|p| p.device().name == name)
            .map(|p| p.registered())
    }

    /// Stops every plugin: open `ListAndWatch` streams get an empty device list (the
    /// API has no unregister; this makes the kubelet drop the devices at once), the
    /// servers stop and the sockets are removed.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_kubevirt() {
        let devices = permanent_devices();
        let names: Vec<_> = devices
            .iter()
            .map(|d| (d.resource_name(), d.socket_name(), d.path.clone()))
            .collect();
        assert_eq!(
            names,
            vec![
                (
                    "devices.kubevirt.io/kvm".to_string(),
                    "kubevirt-kvm.sock".to_string(),
                    PathBuf::from("/dev/kvm")
                ),
                (
                    "devices.kubevirt.io/tun".to_string(),
                    "kubevirt-tun.sock".to_string(),
                    PathBuf::from("/dev/net/tun")
                ),
                (
                    "devices.kubevirt.io/vhost-net".to_string(),
                    "kubevirt-vhost-net.sock".to_string(),
                    PathBuf::from("/dev/vhost-net")
                ),
            ]
        );
        assert_eq!(devices[0].device_id(999), "kvm999");
        let config = DevicePluginConfig::new(Path::new("/p"), Path::new(HOST_ROOT));
        assert_eq!(config.max_devices, 1000);
        assert_eq!(config.backoff, BACKOFF.to_vec());
        assert!(config.permissions == "rw" || config.permissions == "rwm");
    }
}
