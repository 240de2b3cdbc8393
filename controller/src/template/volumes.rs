//! The pod's volumes and the compute container's mounts (`rendervolumes.go`), in v1.9.0's
//! order: config volumes (secrets, config maps, downward API), the VMI's other volumes,
//! access credentials, image volumes (container disks, the kernel-boot image, the launcher
//! binary), hugepages, hotplug.

use super::VIRT_PRIVATE_DIR;
use super::{LAUNCHER_VOLUME, RenderContext, TemplateConfig, TemplateError};
use k8s_openapi::api::core::v1::{
    ConfigMapVolumeSource, DownwardAPIVolumeFile, DownwardAPIVolumeSource, EmptyDirVolumeSource,
    HostPathVolumeSource, ImageVolumeSource, PersistentVolumeClaimVolumeSource, SecretVolumeSource,
    Volume, VolumeDevice, VolumeMount,
};
use proto::contract::pod_paths::{KERNEL_BOOT_DIR, KERNEL_BOOT_VOLUME, image_volume_disk_dir};
use proto::kubevirt::VirtualMachineInstance;
use serde_json::Value;

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

/// Where the launcher finds what the pod mounts for it (`pkg/config/config.go`).
const SECRET_SOURCE_DIR: &str = "/var/run/kubevirt-private/secret";
const CONFIG_MAP_SOURCE_DIR: &str = "/var/run/kubevirt-private/config-map";
const DOWNWARD_API_SOURCE_DIR: &str = "/var/run/kubevirt-private/downwardapi";
const SYSPREP_SOURCE_DIR: &str = "/var/run/kubevirt-private/sysprep";
const DOWNWARD_METRICS_DIR: &str = "/var/run/kubevirt-private/downwardmetric-disk";
const HUGEPAGES_DIR: &str = "/dev/hugepages";

/// The claim a volume's disk lives on: a PVC's, an ephemeral volume's, or the PVC a
/// DataVolume populated (named like it).
pub(crate) fn claim_name(volume: &proto::kubevirt::Volume) -> Option<String> {
    volume
        .persistent_volume_claim
        .as_ref()
        .map(|pvc| pvc.claim_name.clone())
        .or_else(|| {
            volume
                .ephemeral
                .as_ref()
                .and_then(|e| e.persistent_volume_claim.as_ref())
                .map(|pvc| pvc.claim_name.clone())
        })
        .or_else(|| {
            volume
                .data_volume
                .as_ref()
                .and_then(|dv| dv.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
}

/// A volume hotplugged into the running VM: not part of the launcher pod (`hotplugVolumes`).
fn is_hotplug(vmi: &VirtualMachineInstance, volume: &proto::kubevirt::Volume) -> bool {
    let hotpluggable = volume
        .persistent_volume_claim
        .as_ref()
        .is_some_and(|p| p.hotpluggable == Some(true))
        || volume
            .data_volume
            .as_ref()
            .and_then(|dv| dv.get("hotpluggable"))
            .and_then(Value::as_bool)
            == Some(true);
    hotpluggable
        || vmi.status.as_ref().is_some_and(|s| {
            s.volume_status.iter().any(|v| {
                v.name == volume.name && v.extra.get("hotplugVolume").is_some_and(|h| !h.is_null())
            })
        })
}

/// A `secretName`/`name` string field of a volume source, or an error naming it.
fn name_field(source: &Value, key: &str, field: &str) -> Result<String, TemplateError> {
    source
        .get(key)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| TemplateError::Invalid(format!("{field}.{key}")))
}

fn optional(source: &Value) -> Option<bool> {
    source.get("optional").and_then(Value::as_bool)
}

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
pub(crate) fn mounted_disk_dir(volume: &str) -> String {
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

    // `withVMIConfigVolumes`: a pod volume for every secret, config map and downward API
    // volume; a mount for those a disk uses.
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        let field = format!("spec.volumes[{i}]");
        if let Some(secret) = &volume.secret {
            volumes.push(Volume {
                name: volume.name.clone(),
                secret: Some(SecretVolumeSource {
                    secret_name: Some(name_field(
                        secret,
                        "secretName",
                        &format!("{field}.secret"),
                    )?),
                    optional: optional(secret),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        if let Some(config_map) = &volume.config_map {
            volumes.push(Volume {
                name: volume.name.clone(),
                config_map: Some(ConfigMapVolumeSource {
                    name: name_field(config_map, "name", &format!("{field}.configMap"))?,
                    optional: optional(config_map),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        if let Some(downward) = &volume.downward_api {
            let items: Option<Vec<DownwardAPIVolumeFile>> = downward
                .get("fields")
                .filter(|f| !f.is_null())
                .map(|f| serde_json::from_value(f.clone()))
                .transpose()
                .map_err(|e| TemplateError::Invalid(format!("{field}.downwardAPI.fields: {e}")))?;
            volumes.push(Volume {
                name: volume.name.clone(),
                downward_api: Some(DownwardAPIVolumeSource {
                    items,
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
    }
    for disk in &vmi.spec.domain.devices.disks {
        let Some(volume) = vmi.spec.volumes.iter().find(|v| v.name == disk.name) else {
            continue;
        };
        for (present, dir) in [
            (volume.secret.is_some(), SECRET_SOURCE_DIR),
            (volume.config_map.is_some(), CONFIG_MAP_SOURCE_DIR),
            (volume.downward_api.is_some(), DOWNWARD_API_SOURCE_DIR),
        ] {
            if present {
                mounts.push(VolumeMount {
                    read_only: Some(true),
                    ..mount(&volume.name, &format!("{dir}/{}", volume.name))
                });
            }
        }
    }

    // `withVMIVolumes`, in the order of the VMI's volumes; hotplugged ones are not the pod's.
    for (i, volume) in vmi.spec.volumes.iter().enumerate() {
        if is_hotplug(vmi, volume) {
            continue;
        }
        let ephemeral_claim = volume
            .ephemeral
            .as_ref()
            .and_then(|e| e.persistent_volume_claim.as_ref());
        let claim = volume
            .persistent_volume_claim
            .as_ref()
            .or(ephemeral_claim)
            .map(|pvc| (pvc.claim_name.clone(), pvc.read_only.filter(|r| *r)))
            .or_else(|| {
                volume
                    .data_volume
                    .is_some()
                    .then(|| claim_name(volume))
                    .flatten()
                    .map(|name| (name, None))
            });
        if volume.data_volume.is_some() && claim.is_none() {
            return Err(TemplateError::Invalid(format!(
                "spec.volumes[{i}].dataVolume.name"
            )));
        }
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
                    read_only,
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
        if volume
            .extra
            .get("downwardMetrics")
            .is_some_and(|d| !d.is_null())
        {
            volumes.push(Volume {
                name: volume.name.clone(),
                empty_dir: Some(EmptyDirVolumeSource {
                    medium: Some("Memory".into()),
                    size_limit: Some(proto::kubevirt::Quantity("1Mi".into())),
                    ..Default::default()
                }),
                ..Default::default()
            });
            mounts.push(mount(&volume.name, DOWNWARD_METRICS_DIR));
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
        if let Some(sysprep) = volume.extra.get("sysprep").filter(|s| !s.is_null()) {
            let field = format!("spec.volumes[{i}].sysprep");
            let mut pod_volume = Volume {
                name: volume.name.clone(),
                ..Default::default()
            };
            if let Some(secret) = sysprep.get("secret").filter(|s| !s.is_null()) {
                pod_volume.secret = Some(SecretVolumeSource {
                    secret_name: Some(name_field(secret, "name", &format!("{field}.secret"))?),
                    ..Default::default()
                });
            } else if let Some(config_map) = sysprep.get("configMap").filter(|c| !c.is_null()) {
                pod_volume.config_map = Some(ConfigMapVolumeSource {
                    name: name_field(config_map, "name", &format!("{field}.configMap"))?,
                    ..Default::default()
                });
            } else {
                return Err(TemplateError::Invalid(format!(
                    "{field}: needs a secret or a configMap"
                )));
            }
            volumes.push(pod_volume);
            mounts.push(VolumeMount {
                read_only: Some(true),
                ..mount(
                    &volume.name,
                    &format!("{SYSPREP_SOURCE_DIR}/{}", volume.name),
                )
            });
        }
    }

    // `withAccessCredentials`: each credential's secret at `<secret>-access-cred`, where the
    // launcher reads SSH keys for the cloud-init disk.
    for credential in access_credentials(vmi)? {
        let volume_name = format!("{credential}-access-cred");
        volumes.push(Volume {
            name: volume_name.clone(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(credential),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount(&volume_name, &format!("{SECRET_SOURCE_DIR}/{volume_name}"))
        });
    }

    // `withImageVolumes`: every containerDisk is an image volume at `disk_<index>`, where the
    // index counts all volumes, not only container disks; then the kernel-boot image; then
    // the launcher image, whose binary the digest-resolving init containers run (a new pod
    // has no digests to reuse, so it is always needed with an image volume).
    let mut has_container_disks = false;
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
    }
    let kernel_boot = proto::contract::kernel_boot::container(vmi);
    if let Some(container) = kernel_boot
        && config.image_volume
    {
        volumes.push(Volume {
            name: KERNEL_BOOT_VOLUME.into(),
            image: Some(ImageVolumeSource {
                reference: Some(container.image.clone()),
                pull_policy: container.image_pull_policy.clone(),
            }),
            ..Default::default()
        });
        mounts.push(VolumeMount {
            read_only: Some(true),
            ..mount(KERNEL_BOOT_VOLUME, KERNEL_BOOT_DIR)
        });
    }
    if config.image_volume && (has_container_disks || kernel_boot.is_some()) {
        volumes.push(Volume {
            name: LAUNCHER_VOLUME.into(),
            image: Some(ImageVolumeSource {
                reference: Some(config.launcher_image.clone()),
                pull_policy: Some(config.image_pull_policy.clone()),
            }),
            ..Default::default()
        });
    }
    // `withHugepages`: the hugetlbfs the guest memory is mapped from, and libvirt's directory
    // in it.
    if vmi
        .spec
        .domain
        .memory
        .as_ref()
        .is_some_and(|m| m.hugepages.as_ref().is_some_and(|h| !h.is_null()))
    {
        volumes.push(Volume {
            name: "hugepages".into(),
            empty_dir: Some(EmptyDirVolumeSource {
                medium: Some("HugePages".into()),
                ..Default::default()
            }),
            ..Default::default()
        });
        mounts.push(mount("hugepages", HUGEPAGES_DIR));
        volumes.push(empty_dir("hugetblfs-dir"));
        mounts.push(mount(
            "hugetblfs-dir",
            &format!("{HUGEPAGES_DIR}/libvirt/qemu"),
        ));
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

/// The secrets of `spec.accessCredentials` (SSH keys, else passwords), in order; entries
/// without a secret are skipped.
fn access_credentials(vmi: &VirtualMachineInstance) -> Result<Vec<String>, TemplateError> {
    let credentials = match vmi.spec.extra.get("accessCredentials") {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(TemplateError::Invalid(
                "spec.accessCredentials: not a list".into(),
            ));
        }
    };
    // The secret of the SSH key, else of the password (`withAccessCredentials`).
    fn secret<'a>(credential: &'a Value, kind: &str) -> Option<&'a str> {
        credential
            .get(kind)
            .filter(|c| !c.is_null())
            .and_then(|c| c.pointer("/source/secret"))
            .filter(|s| !s.is_null())
            .map(|s| s.get("secretName").and_then(Value::as_str).unwrap_or(""))
    }
    Ok(credentials
        .iter()
        .filter_map(|c| secret(c, "sshPublicKey").or_else(|| secret(c, "userPassword")))
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect())
}
