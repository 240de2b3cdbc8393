//! Where each volume's bytes are, and making them exist (proto/CONTRACT.md §4.4).
//!
//! [`plan`] is pure: it maps a VMI volume to the file the VM will use (and
//! its backing file, for overlays). [`materialize`] creates what the plan
//! needs: qcow2 overlays over read-only bases, empty disks, the cloud-init
//! ISO. It never touches a base image: container disks are only read, and
//! verified first (raw, or qcow2 without a backing file: the image is the
//! tenant's, and a backing file it names could be any host file). The files
//! of PVCs and host disks are opened there once, below their volume
//! (`volume_file`), and the VMM gets the descriptors ([`Materialized`]).

pub(crate) mod cache_mode;
pub mod cloudinit;
mod volume_file;

use crate::paths::{BadName, PathName, Paths};
use block::{Format, OpenedFile};
use proto::kubevirt::{VirtualMachineInstance, Volume, quantity};
use std::path::{Path, PathBuf};

/// One volume, resolved to files.
#[derive(Clone, Debug, PartialEq)]
pub struct DiskPlan {
    pub volume: String,
    /// The file (or block device) the VM opens.
    pub path: PathBuf,
    pub format: Format,
    /// `file` or `block` (domain `Disk.Type`).
    pub kind: &'static str,
    /// For overlays: the read-only base and its format.
    pub backing: Option<(PathBuf, Format)>,
    pub action: Action,
}

/// What [`materialize`] has to do for a plan.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// The file exists already (PVC, host disk, block device).
    UseAsIs,
    /// A host disk of type `DiskOrCreate`: create a sparse raw file of this size if missing.
    CreateRawIfMissing(u64),
    /// A qcow2 overlay over `backing`, created if missing (kept across restarts).
    Overlay { base_source: BaseSource },
    /// An empty qcow2 image of this many bytes.
    EmptyQcow2(u64),
    /// The NoCloud ISO for this cloud-init volume.
    NoCloudIso,
    /// The ConfigDrive ISO for this cloud-init volume.
    ConfigDriveIso,
}

/// Where the read-only base of an overlay comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum BaseSource {
    /// A container disk: with image volumes (KubeVirt's default) the pod
    /// mounts the image at `disk_<i>`, and `container-disks/disk_<i>.img` is
    /// made a link to the disk inside it.
    ContainerDisk {
        image_volume: PathBuf,
        path_in_image: Option<String>,
    },
    /// An ephemeral PVC: the base is the PVC's raw image.
    Existing,
}

#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("{field}: {reason}")]
    Unsupported { field: String, reason: String },
    #[error("{field}: {source}")]
    BadQuantity {
        field: String,
        source: quantity::QuantityError,
    },
    #[error("container disk {volume}: {reason}")]
    ContainerDisk { volume: String, reason: String },
    /// A PVC's or host disk's file that cannot be used (outside its volume, the wrong kind).
    #[error("volume {volume}: {path}: {source}")]
    Volume {
        volume: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Image {
        path: PathBuf,
        source: block::DiskError,
    },
    #[error("cloud-init volume {volume}: {source}")]
    CloudInit {
        volume: String,
        source: cloudinit::CloudInitError,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> DiskError + '_ {
    move |source| DiskError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// The name of volume `index` as a file name: a DNS-1123 label, and the only volume of that
/// name (a second one would share the first one's files).
fn volume_name(vmi: &VirtualMachineInstance, index: usize) -> Result<PathName, DiskError> {
    let field = format!("spec.volumes[{index}].name");
    let name = &vmi.spec.volumes[index].name;
    let checked = PathName::volume(name).map_err(|e| DiskError::Unsupported {
        field: field.clone(),
        reason: e.to_string(),
    })?;
    if let Some(first) = vmi.spec.volumes.iter().position(|v| &v.name == name)
        && first != index
    {
        return Err(DiskError::Unsupported {
            field,
            reason: format!(
                "spec.volumes[{index}] and spec.volumes[{first}] must not have the same name"
            ),
        });
    }
    Ok(checked)
}

/// Whether a PVC or DataVolume is a block volume by its claim: the `volumeMode` KubeVirt's
/// controller records in `status.volumeStatus[].persistentVolumeClaimInfo` (unset is
/// `Filesystem`). Without that record (this project's controller writes none) as KubeVirt's
/// launcher decides (`isBlockDeviceVolume`): a block device at `/dev/<volume>`, the link
/// itself not followed. Either way [`materialize`] opens only a file of that kind.
fn claim_is_block(vmi: &VirtualMachineInstance, volume: &str, dev: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    let claim = vmi
        .status
        .as_ref()
        .and_then(|s| s.volume_status.iter().find(|v| v.name == volume))
        .and_then(|v| v.persistent_volume_claim_info.as_ref());
    match claim {
        Some(info) => info.get("volumeMode").and_then(|m| m.as_str()) == Some("Block"),
        None => std::fs::symlink_metadata(dev).is_ok_and(|m| m.file_type().is_block_device()),
    }
}

/// Resolves volume number `index` of the VMI.
pub fn plan(
    paths: &Paths,
    vmi: &VirtualMachineInstance,
    index: usize,
) -> Result<DiskPlan, DiskError> {
    let volume: &Volume = &vmi.spec.volumes[index];
    let field = format!("spec.volumes[{index}]");
    let name = volume_name(vmi, index)?;
    let plan = |path: PathBuf, format: Format, kind, backing, action| DiskPlan {
        volume: name.as_str().to_string(),
        path,
        format,
        kind,
        backing,
        action,
    };
    if let Some(cd) = &volume.container_disk {
        return Ok(plan(
            paths.overlay(&name),
            Format::Qcow2,
            "file",
            // The base's format is read from the image when it is linked in.
            Some((paths.container_disk_base(index), Format::Raw)),
            Action::Overlay {
                base_source: BaseSource::ContainerDisk {
                    image_volume: paths.image_volume(index),
                    path_in_image: cd.path.clone(),
                },
            },
        ));
    }
    if let Some(eph) = &volume.ephemeral {
        if eph.persistent_volume_claim.is_none() {
            return Err(DiskError::Unsupported {
                field: format!("{field}.ephemeral"),
                reason: "needs persistentVolumeClaim".into(),
            });
        }
        return Ok(plan(
            paths.overlay(&name),
            Format::Qcow2,
            "file",
            Some((paths.vmi_disks_dir(&name).join("disk.img"), Format::Raw)),
            Action::Overlay {
                base_source: BaseSource::Existing,
            },
        ));
    }
    if volume.persistent_volume_claim.is_some() || volume.data_volume.is_some() {
        // Filesystem PVCs normally arrive rewritten as hostDisk; a block PVC
        // is a device at /dev/<volume>.
        let dev = paths.block_device(&name);
        let (path, kind) = if claim_is_block(vmi, &volume.name, &dev) {
            (dev, "block")
        } else {
            (paths.vmi_disks_dir(&name).join("disk.img"), "file")
        };
        return Ok(plan(path, Format::Raw, kind, None, Action::UseAsIs));
    }
    if let Some(host) = &volume.host_disk {
        let base = Path::new(&host.path)
            .file_name()
            .map(PathBuf::from)
            .ok_or_else(|| DiskError::Unsupported {
                field: format!("{field}.hostDisk.path"),
                reason: format!("{:?} has no file name", host.path),
            })?;
        let path = paths.vmi_disks_dir(&name).join(base);
        let action = match host.disk_type.as_str() {
            "Disk" => Action::UseAsIs,
            "DiskOrCreate" => {
                let capacity = host
                    .capacity
                    .as_ref()
                    .ok_or_else(|| DiskError::Unsupported {
                        field: format!("{field}.hostDisk.capacity"),
                        reason: "required for type DiskOrCreate".into(),
                    })?;
                let bytes =
                    quantity::to_bytes(capacity).map_err(|source| DiskError::BadQuantity {
                        field: format!("{field}.hostDisk.capacity"),
                        source,
                    })?;
                Action::CreateRawIfMissing(bytes & !((1 << 20) - 1))
            }
            other => {
                return Err(DiskError::Unsupported {
                    field: format!("{field}.hostDisk.type"),
                    reason: format!("{other:?} is not Disk or DiskOrCreate"),
                });
            }
        };
        return Ok(plan(path, Format::Raw, "file", None, action));
    }
    if let Some(empty) = &volume.empty_disk {
        let bytes =
            quantity::to_bytes(&empty.capacity).map_err(|source| DiskError::BadQuantity {
                field: format!("{field}.emptyDisk.capacity"),
                source,
            })?;
        // KubeVirt rounds the capacity down to whole MiB.
        return Ok(plan(
            paths.empty_disk(&name),
            Format::Qcow2,
            "file",
            None,
            Action::EmptyQcow2(bytes & !((1 << 20) - 1)),
        ));
    }
    let cloud_init = if volume.cloud_init_no_cloud.is_some() {
        Some((Action::NoCloudIso, "noCloud.iso"))
    } else if volume.cloud_init_config_drive.is_some() {
        Some((Action::ConfigDriveIso, "configdrive.iso"))
    } else {
        None
    };
    if let Some((action, file)) = cloud_init {
        fn bad_name(field: &'static str) -> impl Fn(BadName) -> DiskError {
            move |e| DiskError::Unsupported {
                field: field.to_string(),
                reason: e.to_string(),
            }
        }
        let ns = vmi.metadata.namespace.as_deref().unwrap_or_default();
        let ns = PathName::component("namespace", ns).map_err(bad_name("metadata.namespace"))?;
        let vmi_name = vmi.metadata.name.as_deref().unwrap_or_default();
        let vmi_name =
            PathName::component("VMI name", vmi_name).map_err(bad_name("metadata.name"))?;
        let path = paths.cloud_init_dir(&ns, &vmi_name).join(file);
        return Ok(plan(path, Format::Raw, "file", None, action));
    }
    let kind = [
        ("configMap", volume.config_map.is_some()),
        ("secret", volume.secret.is_some()),
        ("serviceAccount", volume.service_account.is_some()),
        ("downwardAPI", volume.downward_api.is_some()),
    ]
    .into_iter()
    .find(|(_, present)| *present)
    .map(|(k, _)| k.to_string())
    .or_else(|| volume.extra.keys().next().cloned())
    .unwrap_or_else(|| "(no source)".into());
    Err(DiskError::Unsupported {
        field: format!("{field}.{kind}"),
        reason: "this volume type is not supported by this launcher".into(),
    })
}

/// What [`materialize`] made and opened for one plan.
#[derive(Clone, Debug, Default)]
pub struct Materialized {
    /// The plan's path: the disk the VMM gets.
    pub path: PathBuf,
    /// An overlay's base format (a container disk's is the image's, verified here each
    /// time; the domain names it, see [`record_backing_format`]).
    pub base_format: Option<Format>,
    /// A PVC's or host disk's file, opened once below its volume: the VMM opens it through
    /// this descriptor, never by its name.
    pub file: Option<OpenedFile>,
    /// An ephemeral PVC's base, likewise: the overlay's one backing file.
    pub base: Option<OpenedFile>,
}

impl Materialized {
    /// Gives the VMM the files opened here: the disk at [`Self::path`] uses the opened file,
    /// and an overlay over an opened base may open that base only.
    pub fn hand_to(&self, disks: &mut [vmm::DiskConfig]) {
        for disk in disks.iter_mut().filter(|d| d.path == self.path) {
            if let Some(file) = &self.file {
                disk.file = Some(file.clone());
            }
            if let Some(base) = &self.base {
                disk.backing = vmm::DiskBacking::Opened {
                    file: base.clone(),
                    format: self.base_format.unwrap_or(Format::Raw),
                };
            }
        }
    }

    /// The path that opens `name` if it is one of the files opened here (its
    /// `/proc/self/fd` path), for the direct I/O probe.
    pub(crate) fn opened_path(&self, name: &Path) -> Option<PathBuf> {
        [&self.file, &self.base]
            .into_iter()
            .flatten()
            .find(|f| f.name() == name)
            .map(OpenedFile::path)
    }
}

/// Opens `path`, a file of `volume`, with `open(dir, name)` below its directory.
fn in_volume(
    volume: &str,
    path: &Path,
    open: impl FnOnce(&Path, &Path) -> std::io::Result<OpenedFile>,
) -> Result<OpenedFile, DiskError> {
    let err = |source| DiskError::Volume {
        volume: volume.to_string(),
        path: path.to_path_buf(),
        source,
    };
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) => open(dir, Path::new(name)).map_err(err),
        _ => Err(err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "no file name",
        ))),
    }
}

/// Creates what `plan` needs. Idempotent: an existing overlay, empty disk or
/// ISO is kept (the VM may have written to it before a launcher restart).
/// `owner` is the uid/gid the VM runs as (107 for non-root VMIs). The files of
/// PVCs and host disks are opened here, once, and returned with an overlay's
/// base format.
pub fn materialize(
    plan: &DiskPlan,
    vmi: &VirtualMachineInstance,
    paths: &Paths,
    owner: Option<(u32, u32)>,
) -> Result<Materialized, DiskError> {
    let mut done = Materialized {
        path: plan.path.clone(),
        ..Materialized::default()
    };
    // A PVC's directory (or /dev) is the pod's mount: it is there, or the disk is missing.
    if plan.action != Action::UseAsIs
        && let Some(dir) = plan.path.parent()
    {
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    }
    match &plan.action {
        Action::UseAsIs => {
            let (resolve, kind) = if plan.kind == "block" {
                (volume_file::NO_LINKS, volume_file::Kind::BlockDevice)
            } else {
                (volume_file::IN_VOLUME, volume_file::Kind::File)
            };
            done.file = Some(in_volume(&plan.volume, &plan.path, |dir, name| {
                volume_file::open(dir, name, resolve, kind)
            })?);
        }
        Action::CreateRawIfMissing(size) => {
            done.file = Some(in_volume(&plan.volume, &plan.path, |dir, name| {
                volume_file::open_or_create(dir, name, *size)
            })?);
        }
        Action::Overlay { base_source } => {
            let (base, planned_format) =
                plan.backing.as_ref().expect("overlay plans have a backing");
            let format = match base_source {
                BaseSource::ContainerDisk {
                    image_volume,
                    path_in_image,
                } => {
                    link_container_disk(
                        &plan.volume,
                        image_volume,
                        path_in_image.as_deref(),
                        base,
                    )?;
                    verify_container_disk(&plan.volume, base)?
                }
                BaseSource::Existing => {
                    done.base = Some(in_volume(&plan.volume, base, |dir, name| {
                        volume_file::open(
                            dir,
                            name,
                            volume_file::IN_VOLUME,
                            volume_file::Kind::File,
                        )
                    })?);
                    *planned_format
                }
            };
            done.base_format = Some(format);
            if !plan.path.exists() {
                // The base must name no backing file of its own (the
                // default policy when `create` opens it).
                let opts = block::qcow2::create::CreateOptions {
                    backing_file: Some(base.to_string_lossy().into_owned()),
                    backing_format: Some(format),
                    backing_opened: done.base.clone(),
                    ..Default::default()
                };
                block::qcow2::create::create(&plan.path, &opts).map_err(|source| {
                    DiskError::Image {
                        path: plan.path.clone(),
                        source,
                    }
                })?;
                set_mode(&plan.path, 0o640)?;
            }
        }
        Action::EmptyQcow2(size) => {
            if !plan.path.exists() {
                let opts = block::qcow2::create::CreateOptions {
                    size: Some(*size),
                    ..Default::default()
                };
                block::qcow2::create::create(&plan.path, &opts).map_err(|source| {
                    DiskError::Image {
                        path: plan.path.clone(),
                        source,
                    }
                })?;
            }
        }
        Action::NoCloudIso | Action::ConfigDriveIso => {
            let volume = vmi.spec.volumes.iter().find(|v| v.name == plan.volume);
            let cloud_err = |source| DiskError::CloudInit {
                volume: plan.volume.clone(),
                source,
            };
            // The plan came from this VMI, whose volume names `plan` found unique; a VMI
            // that no longer matches its plan is refused, not trusted.
            let mismatch = || DiskError::Unsupported {
                field: "spec.volumes".into(),
                reason: format!(
                    "volume {:?} is not the cloud-init volume planned",
                    plan.volume
                ),
            };
            let secrets = paths.secrets_dir();
            if plan.action == Action::NoCloudIso {
                let source = volume
                    .and_then(|v| v.cloud_init_no_cloud.as_ref())
                    .ok_or_else(mismatch)?;
                let data = cloudinit::nocloud_data(vmi, &plan.volume, source, &secrets)
                    .map_err(cloud_err)?;
                cloudinit::write_nocloud_iso(&data, &plan.path).map_err(cloud_err)?;
            } else {
                let source = volume
                    .and_then(|v| v.cloud_init_config_drive.as_ref())
                    .ok_or_else(mismatch)?;
                let data = cloudinit::config_drive_data(vmi, &plan.volume, source, &secrets)
                    .map_err(cloud_err)?;
                cloudinit::write_config_drive_iso(&data, &plan.path).map_err(cloud_err)?;
            }
        }
    }
    if let Some((uid, gid)) = owner {
        match &done.file {
            // Through the descriptor: the name may be someone else's link by now.
            Some(file) => nix::unistd::fchownat(
                file,
                "",
                Some(uid.into()),
                Some(gid.into()),
                nix::fcntl::AtFlags::AT_EMPTY_PATH,
            )
            .map_err(|e| DiskError::Io {
                path: plan.path.clone(),
                source: e.into(),
            })?,
            None => std::os::unix::fs::lchown(&plan.path, Some(uid), Some(gid))
                .map_err(io_err(&plan.path))?,
        }
    }
    Ok(done)
}

/// Sets the format of the domain disks whose backing store is `base` to
/// the one [`materialize`] found (the converter, running before any file
/// exists, can only assume one; KubeVirt's names the format `qemu-img
/// info` reported).
pub fn record_backing_format(disks: &mut [proto::domain::Disk], base: &Path, format: Format) {
    for disk in disks {
        if let Some(store) = &mut disk.backing_store
            && store
                .source
                .as_ref()
                .is_some_and(|s| Path::new(&s.file) == base)
        {
            store.format = Some(proto::domain::BackingStoreFormat {
                r#type: format.name().into(),
            });
        }
    }
}

/// The base image's format, read from its first bytes. A container disk's
/// format is a property of the image (KubeVirt asks `qemu-img info`); only
/// raw and qcow2 are accepted. The base is never written (the VM writes to
/// the overlay), so this cannot be a format a guest wrote.
fn detect_base_format(base: &Path) -> Result<Format, DiskError> {
    use std::io::Read;
    let mut magic = [0u8; 4];
    let mut file = std::fs::File::open(base).map_err(io_err(base))?;
    let n = file.read(&mut magic).map_err(io_err(base))?;
    Ok(if n == 4 && &magic == b"QFI\xfb" {
        Format::Qcow2
    } else {
        Format::Raw
    })
}

/// Verifies a container disk's base as KubeVirt's launcher does before it
/// uses one (`VerifyImage`, `pkg/os/disk/validation.go`, called from
/// `pkg/virt-launcher/virtwrap/manager.go`): raw, or qcow2 without a
/// backing file. The image is the tenant's: a backing file it names (an
/// absolute path, `..`) would be a host file the guest could read. A qcow2
/// base must also open in the VMM's engine with no backing file allowed
/// (bounded tables, supported features). Returns the base's format.
fn verify_container_disk(volume: &str, base: &Path) -> Result<Format, DiskError> {
    let invalid = |reason: String| DiskError::ContainerDisk {
        volume: volume.to_string(),
        reason: format!("invalid image: {reason}"),
    };
    let format = detect_base_format(base)?;
    if format == Format::Qcow2 {
        let header = block::qcow2::check::read_image_header(base)
            .map_err(|e| invalid(format!("{}: {e}", base.display())))?;
        if let Some(name) = header.backing_file {
            return Err(invalid(format!(
                "expected no backing file, but found {name}"
            )));
        }
        block::open_disk(base, Format::Qcow2, true)
            .map_err(|e| invalid(format!("{}: {e}", base.display())))?;
    }
    Ok(format)
}

/// Makes `container-disks/disk_<i>.img` point at the disk inside the image
/// volume: `path` if the VMI names one, else the single file under `disk/`.
/// The target must stay inside the image volume.
fn link_container_disk(
    volume: &str,
    image_volume: &Path,
    path_in_image: Option<&str>,
    link: &Path,
) -> Result<(), DiskError> {
    let err = |reason: String| DiskError::ContainerDisk {
        volume: volume.to_string(),
        reason,
    };
    let target = match path_in_image {
        Some(p) => {
            let relative = Path::new(p.trim_start_matches('/'));
            if relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
            {
                return Err(err(format!("path {p:?} must stay inside the image")));
            }
            image_volume.join(relative)
        }
        None => {
            let dir = image_volume.join("disk");
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|e| err(format!("{}: {e}", dir.display())))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.is_file())
                .collect();
            if files.len() != 1 {
                return Err(err(format!(
                    "{} must hold exactly one disk image, found {}",
                    dir.display(),
                    files.len()
                )));
            }
            files.remove(0)
        }
    };
    link_inside(image_volume, &target, link).map_err(|refusal| match refusal {
        LinkRefusal::Rule(reason) => err(reason),
        LinkRefusal::Io(e) => e,
    })
}

/// Why [`link_inside`] made no link.
enum LinkRefusal {
    /// The target breaks a rule (missing, outside the root, not a file).
    Rule(String),
    Io(DiskError),
}

/// Points `link` at `target`, which must be a regular file inside `root`
/// also after following the image's own symlinks (an image must not make
/// the VMM open a file of the launcher's). A link to elsewhere left by an
/// earlier start is replaced; a plain file there (a bind-mounted disk,
/// image volumes off) is kept.
fn link_inside(root: &Path, target: &Path, link: &Path) -> Result<(), LinkRefusal> {
    let rule =
        |what: &Path, e: std::io::Error| LinkRefusal::Rule(format!("{}: {e}", what.display()));
    let canonical = target.canonicalize().map_err(|e| rule(target, e))?;
    let root = root.canonicalize().map_err(|e| rule(root, e))?;
    if !canonical.starts_with(&root) {
        return Err(LinkRefusal::Rule(format!(
            "{} leads outside {}",
            target.display(),
            root.display()
        )));
    }
    if !canonical.is_file() {
        return Err(LinkRefusal::Rule(format!(
            "{} is not a regular file",
            target.display()
        )));
    }
    if let Some(dir) = link.parent() {
        std::fs::create_dir_all(dir)
            .map_err(io_err(dir))
            .map_err(LinkRefusal::Io)?;
    }
    match std::fs::read_link(link) {
        Ok(existing) if existing == canonical => return Ok(()),
        Ok(_) => std::fs::remove_file(link)
            .map_err(io_err(link))
            .map_err(LinkRefusal::Io)?,
        Err(_) if link.exists() => return Ok(()),
        Err(_) => {}
    }
    std::os::unix::fs::symlink(&canonical, link)
        .map_err(io_err(link))
        .map_err(LinkRefusal::Io)
}

fn set_mode(path: &Path, mode: u32) -> Result<(), DiskError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(io_err(path))
}

/// Kernel-boot artifacts resolved inside the kernel-boot image mount.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelBoot {
    /// The kernel inside the kernel-boot mount.
    pub kernel: PathBuf,
    pub initrd: Option<PathBuf>,
    /// What the domain names, as in KubeVirt: links
    /// `<container-disk-dir>/kernel-boot/<file name>` to the two above
    /// ([`link_kernel_boot`]).
    pub kernel_link: PathBuf,
    pub initrd_link: Option<PathBuf>,
    pub args: String,
}

/// Resolves `firmware.kernelBoot.container.{kernelPath,initrdPath}` inside
/// the kernel-boot mount without escaping it. Returns `None` without kernel boot.
pub fn kernel_boot(
    paths: &Paths,
    vmi: &VirtualMachineInstance,
) -> Result<Option<KernelBoot>, DiskError> {
    let Some(kb) = proto::contract::kernel_boot::kernel_boot(vmi) else {
        return Ok(None);
    };
    let field = proto::contract::kernel_boot::FIELD;
    // Without a container the VMI boots its disk (kernel arguments without a kernel are
    // refused by `proto::contract::runnable`, as KubeVirt's admission does).
    let Some(container) = &kb.container else {
        return Ok(None);
    };
    let resolve = |p: &str, what: &str| -> Result<PathBuf, DiskError> {
        let relative = Path::new(p.trim_start_matches('/'));
        if p.is_empty()
            || relative
                .components()
                .any(|c| !matches!(c, std::path::Component::Normal(_)))
        {
            return Err(DiskError::Unsupported {
                field: format!("{field}.container.{what}"),
                reason: format!("{p:?} must be a path inside the image"),
            });
        }
        Ok(paths.kernel_boot_dir.join(relative))
    };
    let kernel = match &container.kernel_path {
        Some(p) => resolve(p, "kernelPath")?,
        None => {
            return Err(DiskError::Unsupported {
                field: format!("{field}.container.kernelPath"),
                reason: "required: an initrd alone is not booted (boot the disk instead)".into(),
            });
        }
    };
    let initrd = container
        .initrd_path
        .as_deref()
        .map(|p| resolve(p, "initrdPath"))
        .transpose()?;
    let link = |p: &Path| {
        paths
            .kernel_boot_links()
            .join(p.file_name().unwrap_or_default())
    };
    let kernel_link = link(&kernel);
    let initrd_link = initrd.as_deref().map(link);
    if initrd_link.as_ref() == Some(&kernel_link) {
        return Err(DiskError::Unsupported {
            field: format!("{field}.container.initrdPath"),
            reason: "kernel and initrd must have different file names".into(),
        });
    }
    Ok(Some(KernelBoot {
        kernel,
        initrd,
        kernel_link,
        initrd_link,
        args: kb.kernel_args.clone().unwrap_or_default(),
    }))
}

/// Makes the links the domain names (KubeVirt's launcher view of the
/// kernel-boot artifacts, `containerdisk.GetKernelBootArtifactPathFromLauncherView`),
/// each to a regular file inside the kernel-boot mount ([`link_inside`]).
pub fn link_kernel_boot(paths: &Paths, kb: &KernelBoot) -> Result<(), DiskError> {
    let field = "spec.domain.firmware.kernelBoot.container";
    let mut pairs = vec![(&kb.kernel, &kb.kernel_link, "kernelPath")];
    if let (Some(initrd), Some(link)) = (&kb.initrd, &kb.initrd_link) {
        pairs.push((initrd, link, "initrdPath"));
    }
    for (artifact, link, what) in pairs {
        link_inside(&paths.kernel_boot_dir, artifact, link).map_err(|refusal| match refusal {
            LinkRefusal::Rule(reason) => DiskError::Unsupported {
                field: format!("{field}.{what}"),
                reason,
            },
            LinkRefusal::Io(e) => e,
        })?;
    }
    Ok(())
}
