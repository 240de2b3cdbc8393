//! Where things live inside the compute container. KubeVirt's handler finds
//! them at these paths (through `/proc/<pid>/root`), so the defaults are
//! KubeVirt v1.9.0's; every one can be moved with a flag for tests and for
//! running outside a pod.
//!
//! Names from the VMI (volume names, the VMI's UID, namespace and name, secret names) become
//! file names here. None is trusted (the launcher does not rely on the controller's checks):
//! each path built from a name takes a [`PathName`], which only [`PathName::volume`] and
//! [`PathName::component`] make, so a name like `../x` or `/etc` never leaves its directory.

use std::path::{Path, PathBuf};

/// A name checked to be one plain path component: joined to a directory, it names an entry
/// of that directory and nothing else.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PathName(String);

/// Why a name cannot become a file name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} {name:?} cannot name a file: {reason}")]
pub struct BadName {
    pub what: &'static str,
    pub name: String,
    pub reason: String,
}

impl PathName {
    /// A volume name: a DNS-1123 label, KubeVirt's admission rule
    /// ([`proto::contract::runnable::volume_name`]).
    pub fn volume(name: &str) -> Result<Self, BadName> {
        proto::contract::runnable::volume_name(name).map_err(|reason| BadName {
            what: "volume",
            name: name.to_string(),
            reason,
        })?;
        Ok(PathName(name.to_string()))
    }

    /// Any other name (`what` says which): not empty, not `.` or `..`, without `/` or NUL.
    pub fn component(what: &'static str, name: &str) -> Result<Self, BadName> {
        let reason = if name.is_empty() {
            "it is empty"
        } else if name == "." || name == ".." {
            "it names a directory itself"
        } else if name.contains(['/', '\0']) {
            "it contains '/' or NUL"
        } else {
            return Ok(PathName(name.to_string()));
        };
        Err(BadName {
            what,
            name: name.to_string(),
            reason: reason.to_string(),
        })
    }

    /// The VMI's UID (`metadata.uid`, or `--uid`), which names its private directory.
    pub fn vmi_uid(uid: &str) -> Result<Self, BadName> {
        Self::component("VMI UID", uid)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl AsRef<Path> for PathName {
    fn as_ref(&self) -> &Path {
        Path::new(&self.0)
    }
}

impl std::fmt::Display for PathName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Debug)]
pub struct Paths {
    /// `--kubevirt-share-dir` (`/var/run/kubevirt`): sockets and the notify pipe.
    pub share_dir: PathBuf,
    /// `--ephemeral-disk-dir` (`/var/run/kubevirt-ephemeral-disks`): overlays, cloud-init.
    pub ephemeral_disk_dir: PathBuf,
    /// `--container-disk-dir` (`/var/run/kubevirt/container-disks`).
    pub container_disk_dir: PathBuf,
    /// `--private-dir` (`/var/run/kubevirt-private`): per-VMI console sockets, disks.
    pub private_dir: PathBuf,
    /// `--image-volume-dir` (`/var/run/kubevirt-image-volume`): container disks
    /// mounted as image volumes (`disk_<i>`).
    pub image_volume_dir: PathBuf,
    /// `--kernel-boot-dir` (`/var/run/kubevirt-kernel-boot`): the kernel-boot image.
    pub kernel_boot_dir: PathBuf,
    /// `--libvirt-runtime-dir` (`/var/run/libvirt`): empty disks live under it.
    pub libvirt_runtime_dir: PathBuf,
    /// `--resolv-conf` (`/etc/resolv.conf`): DNS for the guest's DHCP answer.
    pub resolv_conf: PathBuf,
}

impl Default for Paths {
    fn default() -> Self {
        Paths {
            share_dir: "/var/run/kubevirt".into(),
            ephemeral_disk_dir: "/var/run/kubevirt-ephemeral-disks".into(),
            container_disk_dir: "/var/run/kubevirt/container-disks".into(),
            private_dir: "/var/run/kubevirt-private".into(),
            image_volume_dir: "/var/run/kubevirt-image-volume".into(),
            kernel_boot_dir: "/var/run/kubevirt-kernel-boot".into(),
            libvirt_runtime_dir: "/var/run/libvirt".into(),
            resolv_conf: "/etc/resolv.conf".into(),
        }
    }
}

impl Paths {
    /// Every path of `Paths::default()` moved under `root` (tests, standalone).
    pub fn under(root: &Path) -> Self {
        let d = Paths::default();
        let re = |p: PathBuf| root.join(p.strip_prefix("/").unwrap_or(&p));
        Paths {
            share_dir: re(d.share_dir),
            ephemeral_disk_dir: re(d.ephemeral_disk_dir),
            container_disk_dir: re(d.container_disk_dir),
            private_dir: re(d.private_dir),
            image_volume_dir: re(d.image_volume_dir),
            kernel_boot_dir: re(d.kernel_boot_dir),
            libvirt_runtime_dir: re(d.libvirt_runtime_dir),
            resolv_conf: re(d.resolv_conf),
        }
    }

    pub(crate) fn sockets_dir(&self) -> PathBuf {
        self.share_dir.join("sockets")
    }
    /// The cmd socket while the server starts (`launcher-init-sock`).
    pub(crate) fn init_socket(&self) -> PathBuf {
        self.sockets_dir().join("launcher-init-sock")
    }
    /// The cmd socket once ready: the rename is the readiness signal.
    pub fn launcher_socket(&self) -> PathBuf {
        self.sockets_dir().join("launcher-sock")
    }
    /// Where the handler injects its notify pipe.
    pub fn notify_socket(&self) -> PathBuf {
        self.share_dir.join("domain-notify-pipe.sock")
    }
    /// `/var/run/kubevirt-private/<vmi uid>`.
    pub(crate) fn vmi_private_dir(&self, uid: &PathName) -> PathBuf {
        self.private_dir.join(uid)
    }
    pub fn serial_socket(&self, uid: &PathName) -> PathBuf {
        self.vmi_private_dir(uid)
            .join(proto::contract::pod_paths::SERIAL_CONSOLE_SOCKET)
    }
    /// The console log; its rotated backups are `<log>.0` (newest) and up
    /// (`crate::console_log`).
    pub fn serial_log(&self, uid: &PathName) -> PathBuf {
        self.vmi_private_dir(uid)
            .join(proto::contract::pod_paths::SERIAL_CONSOLE_LOG)
    }
    /// `disk-data/<volume>/disk.qcow2`: the overlay of a container disk or ephemeral volume.
    pub fn overlay(&self, volume: &PathName) -> PathBuf {
        self.ephemeral_disk_dir
            .join("disk-data")
            .join(volume)
            .join("disk.qcow2")
    }
    /// `container-disks/disk_<i>.img`: the read-only base of container disk *i*.
    pub fn container_disk_base(&self, index: usize) -> PathBuf {
        self.container_disk_dir.join(format!("disk_{index}.img"))
    }
    /// `kubevirt-image-volume/disk_<i>`: where the pod mounts container disk *i*.
    pub fn image_volume(&self, index: usize) -> PathBuf {
        self.image_volume_dir.join(format!("disk_{index}"))
    }
    /// `vmi-disks/<volume>/`: PVC and host-disk mounts.
    pub fn vmi_disks_dir(&self, volume: &PathName) -> PathBuf {
        self.private_dir.join("vmi-disks").join(volume)
    }
    /// `/dev/<volume>`: where a block-mode PVC appears in the container.
    pub(crate) fn block_device(&self, volume: &PathName) -> PathBuf {
        Path::new("/dev").join(volume)
    }
    pub fn empty_disk(&self, volume: &PathName) -> PathBuf {
        self.libvirt_runtime_dir
            .join("empty-disks")
            .join(format!("{}.qcow2", volume.as_str()))
    }
    /// `cloud-init-data/<ns>/<vmi>/`: where the cloud-init ISO is made (KubeVirt's
    /// launcher: `filepath.Join(ephemeralDiskDir, "cloud-init-data")`,
    /// cmd/virt-launcher/virt-launcher.go).
    pub(crate) fn cloud_init_dir(&self, namespace: &PathName, name: &PathName) -> PathBuf {
        self.ephemeral_disk_dir
            .join("cloud-init-data")
            .join(namespace)
            .join(name)
    }
    /// `cloud-init-data/<ns>/<vmi>/noCloud.iso`.
    pub fn nocloud_iso(&self, namespace: &PathName, name: &PathName) -> PathBuf {
        self.cloud_init_dir(namespace, name).join("noCloud.iso")
    }
    /// `cloud-init-data/<ns>/<vmi>/configdrive.iso`.
    pub fn config_drive_iso(&self, namespace: &PathName, name: &PathName) -> PathBuf {
        self.cloud_init_dir(namespace, name).join("configdrive.iso")
    }
    /// Secrets referenced by cloud-init volumes and access credentials, under
    /// the private dir (KubeVirt's `config.SecretSourceDir`, pkg/config/config.go:
    /// `/var/run/kubevirt-private/secret`).
    pub(crate) fn secrets_dir(&self) -> PathBuf {
        self.private_dir.join("secret")
    }
    /// `container-disks/kernel-boot/`: links to the kernel-boot artifacts.
    pub(crate) fn kernel_boot_links(&self) -> PathBuf {
        self.container_disk_dir.join("kernel-boot")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_leave_a_directory_are_refused() {
        for bad in ["", ".", "..", "../x", "/etc", "a/b", "a\0b"] {
            assert!(PathName::component("test", bad).is_err(), "{bad:?}");
            assert!(PathName::volume(bad).is_err(), "{bad:?}");
        }
        // A volume name is a DNS-1123 label: stricter than one component.
        assert!(PathName::component("test", "Disk_0").is_ok());
        assert!(PathName::volume("Disk_0").is_err());
        let paths = Paths::under(Path::new("/root"));
        let volume = PathName::volume("disk-0").expect("a label");
        assert_eq!(
            paths.overlay(&volume),
            Path::new("/root/var/run/kubevirt-ephemeral-disks/disk-data/disk-0/disk.qcow2")
        );
        assert_eq!(
            paths.empty_disk(&volume),
            Path::new("/root/var/run/libvirt/empty-disks/disk-0.qcow2")
        );
        let err = PathName::volume("../x").unwrap_err();
        assert_eq!(err.what, "volume");
        assert!(
            err.to_string()
                .starts_with("volume \"../x\" cannot name a file")
        );
    }
}
