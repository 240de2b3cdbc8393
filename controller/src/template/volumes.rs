//! The pod's volumes and the compute container's mounts (`rendervolumes.go`).

use super::VIRT_PRIVATE_DIR;
use super::{LAUNCHER_VOLUME, RenderContext, TemplateConfig, TemplateError};
use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, ImageVolumeSource,
    PersistentVolumeClaimVolumeSource, SecretVolumeSource, Volume, VolumeDevice, VolumeMount,
};
use proto::contract::pod_paths::image_volume_disk_dir;
use proto::kubevirt::VirtualMachineInstance;

/// What the controller knows about a PVC the VMI uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PvcInfo {
    /// `volumeMode: Block`: the disk appears as a device, not a file.
    pub block: bool,
}

pub(super) struct RenderedVolumes {
    pub volumes: Vec<Volume>,
    pub mounts: Vec<VolumeMount>,
    pub devices: Vec<VolumeDevice>,
    pub has_container_disks: bool,
}

const SECRET_SOURCE_DIR: &str = "/var/run/kubevirt-private/secret";

fn empty_dir(name: &str) -> Volume {
    Volume {
        name: name.into(),
        empty_dir: Some(EmptyDirVolumeSource::default()),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        ..Default::default()
    }
}

fn host_to_container(name: &str, path: &str) -> VolumeMount {
    VolumeMount {
        mount_propagation: Some("HostToContainer".into()),
        ..mount(name, path)
    }
}

/// Where a file-system PVC or host disk is mounted (`hostdisk.GetMountedHostDiskDir`).
pub fn mounted_disk_dir(volume: &str) -> String {
    format!("{VIRT_PRIVATE_DIR}/vmi-disks/{volume}")
}

pub(super) fn render(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    context: &RenderContext,
) -> Result<RenderedVolumes, TemplateError> {
    let mut volumes = vec![
        empty_dir("private"),
        empty_dir("public"),
        empty_dir("sockets"),
        empty_dir("virt-bin-share-dir"),
        empty_dir("libvirt-runtime"),
        empty_dir("ephemeral-disks"),
    ];
    let mut mounts = vec![
        mount("private", VIRT_PRIVATE_DIR),
        mount("public", &config.virt_share_dir),
        mount("ephemeral-disks", &config.ephemeral_disk_dir),
        mount("libvirt-runtime", "/var/run/libvirt"),
        mount("sockets", &format!("{}/sockets", config.virt_share_dir)),
    ];
    if !config.image_volume {
        volumes.push(empty_dir("container-disks"));
        mounts.push(host_to_container(
            "container-disks",
            &config.container_disk_dir,
        ));
    }
    let mut devices = Vec::new();

    for volume in &vmi.spec.volumes {
        if volume.secret.is_some() || volume.config_map.is_some() || volume.downward_api.is_some() {
            return Err(TemplateError::Unsupported(format!(
                "volume {}: secret, configMap and downwardAPI volumes",
                volume.name
            )));
        }
        if volume.data_volume.is_some() || volume.extra.contains_key("sysprep") {
            return Err(TemplateError::Unsupported(format!(
                "volume {}: dataVolume and sysprep volumes",
                volume.name
            )));
        }
    }

    // `withVMIVolumes`, in the order of the VMI's volumes.
    for volume in &vmi.spec.volumes {
        let claim = volume
            .persistent_volume_claim
            .as_ref()
            .map(|pvc| (pvc.claim_name.clone(), pvc.read_only))
            .or_else(|| {
                volume
                    .ephemeral
                    .as_ref()
                    .and_then(|e| e.persistent_volume_claim.as_ref())
                    .map(|pvc| (pvc.claim_name.clone(), pvc.read_only))
            });
        if let Some((claim_name, read_only)) = claim {
            let info = context
                .pvcs
                .get(&claim_name)
                .ok_or_else(|| TemplateError::PvcNotFound(claim_name.clone()))?;
            if info.block {
                devices.push(VolumeDevice {
                    name: volume.name.clone(),
                    device_path: format!("/dev/{}", volume.name),
                });
            } else {
                mounts.push(mount(&volume.name, &mounted_disk_dir(&volume.name)));
            }
            volumes.push(Volume {
                name: volume.name.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name,
                    read_only: read_only.filter(|r| *r),
                }),
                ..Default::default()
            });
        }
        if let Some(host_disk) = &volume.host_disk {
            let path_type = match host_disk.disk_type.as_str() {
                "Disk" => "Directory",
                "DiskOrCreate" => "DirectoryOrCreate",
                other => {
                    return Err(TemplateError::Invalid(format!(
                        "volume {}: hostDisk type {other:?}",
                        volume.name
                    )));
                }
            };
            let dir = std::path::Path::new(&host_disk.path)
                .parent()
                .and_then(|p| p.to_str())
                .filter(|p| !p.is_empty())
                .unwrap_or("/");
            mounts.push(mount(&volume.name, &mounted_disk_dir(&volume.name)));
            volumes.push(Volume {
                name: volume.name.clone(),
                host_path: Some(HostPathVolumeSource {
                    path: dir.into(),
                    type_: Some(path_type.into()),
                }),
                ..Default::default()
            });
        }
        if volume.extra.contains_key("downwardMetrics") {
            return Err(TemplateError::Unsupported("downwardMetrics volumes".into()));
        }
        for source in [&volume.cloud_init_no_cloud, &volume.cloud_init_config_drive]
            .into_iter()
            .flatten()
        {
            for (secret_ref, suffix, files) in [
                (&source.secret_ref, "udata", ["userdata", "userData"]),
                (
                    &source.network_data_secret_ref,
                    "ndata",
                    ["networkdata", "networkData"],
                ),
            ] {
                let Some(secret_ref) = secret_ref else {
                    continue;
                };
                let secret_name =
                    secret_ref
                        .get("name")
                        .and_then(|n| n.as_str())
                        .ok_or_else(|| {
                            TemplateError::Invalid(format!(
                                "volume {}: secretRef without a name",
                                volume.name
                            ))
                        })?;
                let volume_name = format!("{}-{suffix}", volume.name);
                volumes.push(Volume {
                    name: volume_name.clone(),
                    secret: Some(SecretVolumeSource {
                        secret_name: Some(secret_name.into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                for file in files {
                    mounts.push(VolumeMount {
                        name: volume_name.clone(),
                        mount_path: format!("{SECRET_SOURCE_DIR}/{}/{file}", volume.name),
                        sub_path: Some(file.into()),
                        read_only: Some(true),
                        ..Default::default()
                    });
                }
            }
        }
    }

    // `withImageVolumes`: every containerDisk is an image volume at `disk_<index>`, where the
    // index counts all volumes, not only container disks.
    let mut has_container_disks = false;
    let mut needs_launcher_volume = false;
    for (index, volume) in vmi.spec.volumes.iter().enumerate() {
        let Some(disk) = &volume.container_disk else {
            continue;
        };
        has_container_disks = true;
        if !config.image_volume {
            continue;
        }
        volumes.push(Volume {
            name: volume.name.clone(),
            image: Some(ImageVolumeSource {
                reference: Some(disk.image.clone()),
                pull_policy: disk.image_pull_policy.clone(),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount(&volume.name, &image_volume_disk_dir(index))
        });
        needs_launcher_volume |= !disk.image.contains("@sha256:");
    }
    let kernel_boot = proto::contract::kernel_boot::container(vmi);
    if kernel_boot.is_some() {
        return Err(TemplateError::Unsupported("kernel boot containers".into()));
    }
    if config.image_volume && needs_launcher_volume {
        volumes.push(Volume {
            name: LAUNCHER_VOLUME.into(),
            image: Some(ImageVolumeSource {
                reference: Some(config.launcher_image.clone()),
                pull_policy: Some(config.image_pull_policy.clone()),
            }),
            ..Default::default()
        });
    }
    if vmi.spec.domain.devices.disable_hotplug != Some(true) {
        mounts.push(host_to_container("hotplug-disks", &config.hotplug_disk_dir));
        volumes.push(empty_dir("hotplug-disks"));
    }

    Ok(RenderedVolumes {
        volumes,
        mounts,
        devices,
        has_container_disks,
    })
}
