//! A launcher "pod" without a kubelet: the kubelet-style directory tree, the network
//! namespace, and the launcher process started inside them as the non-root user 107.
//!
//! The launcher runs in the pod's network namespace and in its own mount namespace where
//! the pod's directories are bind-mounted at the paths a launcher container has
//! (`/var/run/kubevirt`, `/var/run/kubevirt-private`, ...), container-disk images at
//! `/var/run/kubevirt-image-volume/disk_<i>` and the kernel-boot image at
//! `/var/run/kubevirt-kernel-boot`. So the handler reaches everything through
//! `/proc/<pid>/root/...` exactly as in a cluster. Those mounts exist only in the
//! launcher's namespace (on a private tmpfs over `/run`) and vanish with it.

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use proto::kubevirt::{VirtualMachineInstance, well_known};
use serde::{Deserialize, Serialize};

use crate::netpod::PodNetwork;
use handler::launchers::PodPaths;

/// The emptyDir volumes of a launcher pod and where the compute container mounts them.
pub const EMPTY_DIRS: &[(&str, &str)] = &[
    ("public", "/var/run/kubevirt"),
    ("sockets", "/var/run/kubevirt/sockets"),
    ("private", "/var/run/kubevirt-private"),
    ("ephemeral-disks", "/var/run/kubevirt-ephemeral-disks"),
    ("libvirt-runtime", "/var/run/libvirt"),
];
/// Device nodes a launcher pod gets (kvm and tun device plugins): node file in the pod
/// directory, path in the container, mode. `/dev/kvm` is given to the launcher's user by
/// the handler; `/dev/net/tun` is usable by anyone, as in a container.
pub const POD_DEVICES: &[(&str, &str, u32)] = &[
    ("dev-kvm", "/dev/kvm", 0o660),
    ("dev-net-tun", "/dev/net/tun", 0o666),
];
use proto::contract::pod_paths::{KERNEL_BOOT_DIR, image_volume_disk_dir};

/// What is persisted about a pod so a restarted handler can adopt it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PodRecord {
    pub pod_uid: String,
    pub vmi_key: String,
    pub vmi_uid: String,
    pub pid: u32,
    /// `/proc/<pid>/stat` start time, to tell our launcher from a reused PID.
    pub start_time: u64,
    pub host_veth: String,
    pub subnet: u8,
}

#[derive(Debug, thiserror::Error)]
pub enum PodError {
    #[error("pod directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("image {image:?} of volume {volume}: no --image mapping for it")]
    UnmappedImage { image: String, volume: String },
    #[error("image file {0}: {1}")]
    Image(PathBuf, std::io::Error),
    #[error("invalid path {0:?} in the VMI (must be absolute, without '..')")]
    BadPath(String),
    #[error("cannot start the launcher {0} in its pod (or set up the pod's mounts): {1}")]
    Spawn(PathBuf, std::io::Error),
    #[error("cannot mount {0} into the launcher's pod: {1}")]
    BindSource(PathBuf, std::io::Error),
    #[error("path contains a NUL byte: {0:?}")]
    Nul(PathBuf),
}

/// One bind mount the launcher's namespace gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
    /// The source is a file (the target is created as an empty file).
    pub file: bool,
}

/// Everything needed to start one launcher.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub launcher: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub binds: Vec<BindMount>,
    pub hostname: String,
    pub uid: u32,
    pub log: PathBuf,
}

/// Rejects paths from the VMI that could leave the image (`kernelPath`, `containerDisk.path`).
fn image_relative(path: &str) -> Result<PathBuf, PodError> {
    let p = Path::new(path);
    if !p.is_absolute()
        || p.components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(PodError::BadPath(path.to_string()));
    }
    Ok(p.strip_prefix("/").unwrap_or(p).to_path_buf())
}

/// Resolves an image name through the `--image NAME=PATH` map.
fn image_path<'a>(
    images: &'a [(String, PathBuf)],
    image: &str,
    volume: &str,
) -> Result<&'a Path, PodError> {
    images
        .iter()
        .rev()
        .find(|(name, _)| name == image)
        .map(|(_, p)| p.as_path())
        .ok_or_else(|| PodError::UnmappedImage {
            image: image.to_string(),
            volume: volume.to_string(),
        })
}

/// The image volumes (container disks, kernel boot) as bind mounts. An image given as a
/// directory is the image's root; a file is placed where the VMI expects it (for a
/// container disk `disk/<file>`, for kernel boot at `kernelPath`).
pub fn image_binds(
    vmi: &VirtualMachineInstance,
    images: &[(String, PathBuf)],
) -> Result<Vec<BindMount>, PodError> {
    let mut binds = Vec::new();
    for (index, volume) in vmi.spec.volumes.iter().enumerate() {
        let Some(cd) = &volume.container_disk else {
            continue;
        };
        let source = image_path(images, &cd.image, &volume.name)?;
        let meta = std::fs::metadata(source).map_err(|e| PodError::Image(source.into(), e))?;
        let root = PathBuf::from(image_volume_disk_dir(index));
        if meta.is_dir() {
            binds.push(BindMount {
                source: source.to_path_buf(),
                target: root,
                read_only: true,
                file: false,
            });
        } else {
            let inside = match &cd.path {
                Some(p) => image_relative(p)?,
                None => Path::new("disk").join(source.file_name().unwrap_or_default()),
            };
            binds.push(BindMount {
                source: source.to_path_buf(),
                target: root.join(inside),
                read_only: true,
                file: true,
            });
        }
    }
    let kernel_boot = proto::contract::kernel_boot::container(vmi);
    if let Some(container) = kernel_boot {
        let source = image_path(images, &container.image, "kernel-boot")?;
        let meta = std::fs::metadata(source).map_err(|e| PodError::Image(source.into(), e))?;
        if meta.is_dir() {
            binds.push(BindMount {
                source: source.to_path_buf(),
                target: KERNEL_BOOT_DIR.into(),
                read_only: true,
                file: false,
            });
        } else {
            let kernel = container
                .kernel_path
                .as_deref()
                .ok_or_else(|| PodError::BadPath("kernelPath missing".into()))?;
            binds.push(BindMount {
                source: source.to_path_buf(),
                target: Path::new(KERNEL_BOOT_DIR).join(image_relative(kernel)?),
                read_only: true,
                file: true,
            });
        }
    }
    Ok(binds)
}

/// KubeVirt's compute command line (proto/CONTRACT.md §4.1, with the v1.9.0 beta gates on).
pub fn launcher_args(vmi: &VirtualMachineInstance) -> Vec<String> {
    let grace = vmi.grace_period_seconds() + 15;
    let mut args = vec![
        "--qemu-timeout".to_string(),
        "240s".to_string(),
        "--name".to_string(),
        vmi.metadata.name.clone().unwrap_or_default(),
        "--uid".to_string(),
        vmi.metadata.uid.clone().unwrap_or_default(),
        "--namespace".to_string(),
        vmi.metadata.namespace.clone().unwrap_or_default(),
        "--kubevirt-share-dir".to_string(),
        "/var/run/kubevirt".to_string(),
        "--ephemeral-disk-dir".to_string(),
        "/var/run/kubevirt-ephemeral-disks".to_string(),
        "--container-disk-dir".to_string(),
        "/var/run/kubevirt/container-disks".to_string(),
        "--grace-period-seconds".to_string(),
        grace.to_string(),
        "--hook-sidecars".to_string(),
        "0".to_string(),
        "--ovmf-path".to_string(),
        "/usr/share/OVMF".to_string(),
        "--disk-memory-limit".to_string(),
        "2097152000".to_string(),
    ];
    if vmi
        .status
        .as_ref()
        .and_then(|s| s.runtime_user)
        .unwrap_or(u64::from(well_known::NON_ROOT_UID))
        != 0
    {
        args.push("--run-as-nonroot".to_string());
    }
    args.push("--image-volume".to_string());
    args
}

/// Creates the pod's directories, owned by `uid`, and the pod's own `/dev/kvm` node (the
/// handler gives it to the launcher's user; the host's node is never changed).
pub fn create_dirs(paths: &PodPaths, uid: u32) -> Result<(), PodError> {
    let dir_err = |p: &Path| {
        let p = p.to_path_buf();
        move |e| PodError::Dir(p, e)
    };
    std::fs::create_dir_all(&paths.pod_dir).map_err(dir_err(&paths.pod_dir))?;
    for (volume, _) in EMPTY_DIRS {
        let d = paths.empty_dir(volume);
        std::fs::create_dir_all(&d).map_err(dir_err(&d))?;
        std::os::unix::fs::chown(&d, Some(uid), Some(uid)).map_err(dir_err(&d))?;
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
            .map_err(dir_err(&d))?;
    }
    // The mount point of the sockets volume inside the public volume.
    let mount_point = paths.empty_dir("public").join("sockets");
    std::fs::create_dir_all(&mount_point).map_err(dir_err(&mount_point))?;
    // Device nodes as the device plugins hand them to a pod: the pod's own nodes, so
    // changing their owner never touches the host's.
    for (name, host, mode) in POD_DEVICES {
        let node = paths.pod_dir.join(name);
        if node.exists() {
            continue;
        }
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(host).map_err(dir_err(Path::new(host)))?;
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::empty(),
            meta.rdev(),
        )
        .map_err(|e| PodError::Dir(node.clone(), e.into()))?;
        // mknod's mode is filtered by the umask; set it exactly.
        std::fs::set_permissions(&node, std::fs::Permissions::from_mode(*mode))
            .map_err(dir_err(&node))?;
    }
    Ok(())
}

/// The bind mounts of the pod's volumes and device node.
pub fn volume_binds(paths: &PodPaths) -> Vec<BindMount> {
    let mut binds: Vec<BindMount> = EMPTY_DIRS
        .iter()
        .map(|(volume, target)| BindMount {
            source: paths.empty_dir(volume),
            target: target.into(),
            read_only: false,
            file: false,
        })
        .collect();
    for (name, target, _) in POD_DEVICES {
        binds.push(BindMount {
            source: paths.pod_dir.join(name),
            target: target.into(),
            read_only: false,
            file: true,
        });
    }
    binds
}

fn cstring(p: &Path) -> Result<CString, PodError> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| PodError::Nul(p.to_path_buf()))
}

/// Prepared, allocation-free inputs for the child between fork and exec.
struct ChildSetup {
    netns_fd: i32,
    run_dir: CString,
    tmpfs: CString,
    tmpfs_opts: CString,
    root: CString,
    sysfs: CString,
    sys_dir: CString,
    mkdirs: Vec<CString>,
    touch: Vec<CString>,
    binds: Vec<(CString, CString, bool)>,
    /// One detached copy (`open_tree`) of each bind source, taken before the child mounts
    /// its tmpfs over `/run`: a source under `/run` (the default state directory is there)
    /// is hidden once that tmpfs is mounted, so the copies are attached afterwards with
    /// `move_mount`. Allocated here, filled in the child.
    trees: Vec<libc::c_int>,
    hostname: Vec<u8>,
    uid: u32,
}

/// `/var/run` as it resolves on this host (`/run` on Debian).
fn run_dir() -> PathBuf {
    std::fs::canonicalize("/var/run").unwrap_or_else(|_| PathBuf::from("/var/run"))
}

/// A `/var/run/...` target re-rooted on the resolved run directory.
fn resolve_target(target: &Path, run: &Path) -> PathBuf {
    match target.strip_prefix("/var/run") {
        Ok(rest) => run.join(rest),
        Err(_) => target.to_path_buf(),
    }
}

impl ChildSetup {
    fn new(plan: &LaunchPlan, netns_fd: i32) -> Result<Self, PodError> {
        let run = run_dir();
        let mut mkdirs: Vec<PathBuf> = Vec::new();
        let mut touch = Vec::new();
        let mut binds = Vec::new();
        for b in &plan.binds {
            let target = resolve_target(&b.target, &run);
            // Parents (and the directory itself) are created on the private tmpfs,
            // outermost first; targets outside /run (the /dev/kvm node) exist already.
            if target.starts_with(&run) {
                let dir = if b.file {
                    target.parent().map(Path::to_path_buf)
                } else {
                    Some(target.clone())
                };
                if let Some(dir) = dir {
                    let mut acc = PathBuf::new();
                    for c in dir.components() {
                        acc.push(c);
                        if acc.starts_with(&run) && acc != run && !mkdirs.contains(&acc) {
                            mkdirs.push(acc.clone());
                        }
                    }
                }
                if b.file {
                    touch.push(cstring(&target)?);
                }
            }
            // Checked here so a missing source is named, not an errno from the child.
            std::fs::symlink_metadata(&b.source)
                .map_err(|e| PodError::BindSource(b.source.clone(), e))?;
            binds.push((cstring(&b.source)?, cstring(&target)?, b.read_only));
        }
        let trees = vec![-1; binds.len()];
        Ok(ChildSetup {
            netns_fd,
            run_dir: cstring(&run)?,
            tmpfs: CString::new("tmpfs").expect("no NUL"),
            tmpfs_opts: CString::new("mode=755").expect("no NUL"),
            root: CString::new("/").expect("no NUL"),
            sysfs: CString::new("sysfs").expect("no NUL"),
            sys_dir: CString::new("/sys").expect("no NUL"),
            mkdirs: mkdirs
                .iter()
                .map(|p| cstring(p))
                .collect::<Result<_, _>>()?,
            touch,
            binds,
            trees,
            hostname: plan.hostname.as_bytes().to_vec(),
            uid: plan.uid,
        })
    }

    /// Runs in the forked child: only async-signal-safe calls, no allocation.
    fn apply(&mut self) -> std::io::Result<()> {
        // <linux/mount.h>; the libc crate does not define them for glibc targets.
        const OPEN_TREE_CLONE: libc::c_uint = 1;
        const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x0000_0004;
        fn check(r: libc::c_int) -> std::io::Result<()> {
            if r < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(())
            }
        }
        let null = std::ptr::null();
        // SAFETY: plain syscalls on pointers to NUL-terminated strings owned by `self`,
        // which outlives this call; nothing here allocates or takes locks.
        unsafe {
            // Own session: a terminal's Ctrl-C reaches the handler, which stops VMs gracefully.
            libc::setsid();
            check(libc::setns(self.netns_fd, libc::CLONE_NEWNET))?;
            check(libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWUTS))?;
            check(libc::sethostname(
                self.hostname.as_ptr().cast(),
                self.hostname.len(),
            ))?;
            check(libc::mount(
                null,
                self.root.as_ptr(),
                null,
                libc::MS_REC | libc::MS_PRIVATE,
                null.cast(),
            ))?;
            // A sysfs of the pod's network namespace (the launcher reads eth0/tap0 there).
            check(libc::mount(
                self.sysfs.as_ptr(),
                self.sys_dir.as_ptr(),
                self.sysfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                null.cast(),
            ))?;
            for ((source, _, _), tree) in self.binds.iter().zip(self.trees.iter_mut()) {
                let fd = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    source.as_ptr(),
                    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
                );
                check(fd as libc::c_int)?;
                *tree = fd as libc::c_int;
            }
            check(libc::mount(
                self.tmpfs.as_ptr(),
                self.run_dir.as_ptr(),
                self.tmpfs.as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                self.tmpfs_opts.as_ptr().cast(),
            ))?;
            for dir in &self.mkdirs {
                let r = libc::mkdir(dir.as_ptr(), 0o755);
                if r < 0 && *libc::__errno_location() != libc::EEXIST {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for file in &self.touch {
                let fd = libc::open(file.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o644);
                check(fd)?;
                libc::close(fd);
            }
            for ((_, target, read_only), tree) in self.binds.iter().zip(&self.trees) {
                check(libc::syscall(
                    libc::SYS_move_mount,
                    *tree,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    MOVE_MOUNT_F_EMPTY_PATH,
                ) as libc::c_int)?;
                if *read_only {
                    check(libc::mount(
                        null,
                        target.as_ptr(),
                        null,
                        libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY,
                        null.cast(),
                    ))?;
                }
            }
            if self.uid != 0 {
                drop_to_user(self.uid)?;
            }
        }
        Ok(())
    }
}

/// Becomes `uid` (group the same) keeping only `CAP_NET_BIND_SERVICE`, raised as an
/// ambient capability so it survives the exec of the monitor and of the launcher (the
/// DHCP server binds port 67), as the launcher pod's security context grants it.
///
/// # Safety
/// Called between fork and exec only.
unsafe fn drop_to_user(uid: u32) -> std::io::Result<()> {
    const CAP_NET_BIND_SERVICE: u32 = 10;
    const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
    #[repr(C)]
    struct CapHeader {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct CapData {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    fn check(r: libc::c_long) -> std::io::Result<()> {
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    }
    // SAFETY: raw syscalls with valid pointers to stack values.
    unsafe {
        let groups = [uid as libc::gid_t];
        check(libc::setgroups(1, groups.as_ptr()).into())?;
        check(libc::setresgid(uid, uid, uid).into())?;
        check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0).into())?;
        check(libc::setresuid(uid, uid, uid).into())?;
        let bit = 1u32 << CAP_NET_BIND_SERVICE;
        let header = CapHeader {
            version: LINUX_CAPABILITY_VERSION_3,
            pid: 0,
        };
        let data = [
            CapData {
                effective: bit,
                permitted: bit,
                inheritable: bit,
            },
            CapData {
                effective: 0,
                permitted: 0,
                inheritable: 0,
            },
        ];
        check(libc::syscall(
            libc::SYS_capset,
            &header as *const CapHeader,
            data.as_ptr(),
        ))?;
        check(
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE,
                CAP_NET_BIND_SERVICE as libc::c_ulong,
                0,
                0,
            )
            .into(),
        )?;
    }
    Ok(())
}

/// Starts the launcher per `plan` inside `network`'s namespace. Returns its PID.
pub fn spawn_launcher(plan: &LaunchPlan, network: &PodNetwork) -> Result<u32, PodError> {
    let mut setup = ChildSetup::new(plan, network.netns.as_raw_fd())?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&plan.log)
        .map_err(|e| PodError::Spawn(plan.log.clone(), e))?;
    let log_err = log
        .try_clone()
        .map_err(|e| PodError::Spawn(plan.log.clone(), e))?;
    let mut command = Command::new(&plan.launcher);
    command
        .args(&plan.args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log_err);
    // SAFETY: `apply` only makes async-signal-safe syscalls on data prepared before fork.
    unsafe {
        command.pre_exec(move || setup.apply());
    }
    let child = command
        .spawn()
        .map_err(|e| PodError::Spawn(plan.launcher.clone(), e))?;
    // The launcher may outlive this handler (a restarted handler adopts it); while this
    // handler runs, the supervisor reaps it with waitpid. Dropping `Child` neither waits
    // nor kills.
    let pid = child.id();
    drop(child);
    Ok(pid)
}

/// The start time of a process (field 22 of `/proc/<pid>/stat`), `None` if it is gone.
pub fn process_start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: fields start after the last ')'.
    let rest = stat.get(stat.rfind(')')? + 2..)?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state); field 22 is index 19.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19)?.parse().ok()
}

/// Whether the pod's launcher is still the process we started.
pub fn launcher_alive(record: &PodRecord) -> bool {
    process_start_time(record.pid) == Some(record.start_time)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vmi(json: &str) -> VirtualMachineInstance {
        proto::kubevirt::parse_vmi(json).expect("vmi")
    }

    #[test]
    fn images_map_to_image_volume_and_kernel_boot_paths() {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = dir.path().join("base.img");
        let kernel = dir.path().join("guest.elf");
        std::fs::write(&disk, b"x").expect("write");
        std::fs::write(&kernel, b"x").expect("write");
        let v = vmi(r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{},
                "firmware":{"kernelBoot":{"kernelArgs":"x","container":{"image":"guest","kernelPath":"/boot/guest.elf"}}}},
                "volumes":[{"name":"cloud","cloudInitNoCloud":{"userData":"x"}},
                           {"name":"root","containerDisk":{"image":"base"}}]}}"#);
        let images = vec![
            ("base".to_string(), disk.clone()),
            ("guest".to_string(), kernel.clone()),
        ];
        let binds = image_binds(&v, &images).expect("binds");
        assert_eq!(binds.len(), 2);
        assert_eq!(
            binds[0].target,
            Path::new("/var/run/kubevirt-image-volume/disk_1/disk/base.img")
        );
        assert!(binds[0].read_only && binds[0].file);
        assert_eq!(
            binds[1].target,
            Path::new("/var/run/kubevirt-kernel-boot/boot/guest.elf")
        );
        assert!(matches!(
            image_binds(&v, &images[..1]),
            Err(PodError::UnmappedImage { .. })
        ));
    }

    #[test]
    fn escaping_paths_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let kernel = dir.path().join("k");
        std::fs::write(&kernel, b"x").expect("write");
        let v = vmi(r#"{"metadata":{"name":"v"},"spec":{"domain":{"devices":{},
                "firmware":{"kernelBoot":{"container":{"image":"g","kernelPath":"/../../etc/shadow"}}}}}}"#);
        assert!(matches!(
            image_binds(&v, &[("g".into(), kernel)]),
            Err(PodError::BadPath(_))
        ));
    }

    #[test]
    fn launcher_args_follow_kubevirt() {
        let mut v = vmi(
            r#"{"metadata":{"name":"v","namespace":"ns","uid":"u1"},"spec":{"terminationGracePeriodSeconds":5,"domain":{"devices":{}}}}"#,
        );
        let args = launcher_args(&v);
        let joined = args.join(" ");
        assert!(
            joined.contains("--name v --uid u1 --namespace ns"),
            "{joined}"
        );
        assert!(joined.contains("--grace-period-seconds 20"), "{joined}");
        assert!(joined.contains("--run-as-nonroot"));
        assert!(joined.ends_with("--image-volume"));
        v.status = Some(proto::kubevirt::VirtualMachineInstanceStatus {
            runtime_user: Some(0),
            ..Default::default()
        });
        assert!(!launcher_args(&v).join(" ").contains("--run-as-nonroot"));
    }

    #[test]
    fn process_start_time_reads_own_process() {
        let me = process_start_time(std::process::id()).expect("own stat");
        assert!(me > 0);
        assert_eq!(process_start_time(u32::MAX), None);
    }
}
