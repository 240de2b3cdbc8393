//! Paths inside the launcher pod (the `compute` container), as KubeVirt v1.9.0 mounts
//! them (`pkg/util/util.go`, `pkg/virt-controller/services/rendervolumes.go`). The
//! handler reaches them through the pod's root; the launcher uses them directly.

/// Container disks mounted as Kubernetes image volumes, one `disk_<i>` per volume index.
pub const IMAGE_VOLUME_DIR: &str = "/var/run/kubevirt-image-volume";

/// The kernel-boot image, mounted as an image volume (`util.VirtKernelBootVolumeDir`).
pub const KERNEL_BOOT_DIR: &str = "/var/run/kubevirt-kernel-boot";

/// The pod volume name of the kernel-boot image.
pub const KERNEL_BOOT_VOLUME: &str = "kernel-boot-volume";

/// The launcher's private directory (`util.VirtPrivateDir`): console sockets, the bridge
/// binding's DHCP cache.
pub const PRIVATE_DIR: &str = "/var/run/kubevirt-private";

/// The serial console's socket in `PRIVATE_DIR/<vmi uid>/` (`converter/compute/console.go`);
/// the handler connects to it for `virtctl console`. Its log beside it.
pub const SERIAL_CONSOLE_SOCKET: &str = "virt-serial0";
pub const SERIAL_CONSOLE_LOG: &str = "virt-serial0-log";

/// The pod volume `PRIVATE_DIR` is (an emptyDir).
pub const PRIVATE_VOLUME: &str = "private";

/// Where the launcher links container disks (`disk_<i>.img`) and kernel-boot artifacts
/// (`kernel-boot/<basename>`).
pub const CONTAINER_DISK_DIR: &str = "/var/run/kubevirt/container-disks";

/// The image-volume directory of the container disk at volume index `index`.
pub fn image_volume_disk_dir(index: usize) -> String {
    format!("{IMAGE_VOLUME_DIR}/disk_{index}")
}

#[cfg(test)]
mod tests {
    #[test]
    fn image_volume_dirs_are_numbered_by_volume_index() {
        assert_eq!(
            super::image_volume_disk_dir(2),
            "/var/run/kubevirt-image-volume/disk_2"
        );
    }
}
