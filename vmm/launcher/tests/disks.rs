//! Disk preparation against real files, checked with qemu-img and an ISO reader.

use launcher::disks::{self, DiskError};
use launcher::paths::{PathName, Paths};
use proto::kubevirt::parse_vmi;
use std::process::Command;

fn vmi(volumes_yaml: &str) -> proto::kubevirt::VirtualMachineInstance {
    parse_vmi(&format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: v\n  namespace: ns\n  uid: u-1\nspec:\n  domain:\n    firmware:\n      uuid: 6a1c1b9e-0d1f-4d0e-9a0b-0c0d0e0f1011\n  volumes:\n{volumes_yaml}"
    ))
    .unwrap()
}

/// A volume name as the launcher's paths take it.
fn volume(name: &str) -> PathName {
    PathName::volume(name).unwrap()
}

/// Namespace `ns`, name `v`: the test VMI's.
fn ns_v() -> (PathName, PathName) {
    (
        PathName::component("namespace", "ns").unwrap(),
        PathName::component("name", "v").unwrap(),
    )
}

fn qemu_img_info(path: &std::path::Path) -> serde_json::Value {
    let out = Command::new("qemu-img")
        .args(["info", "--output=json"])
        .arg(path)
        .output()
        .expect("qemu-img is installed (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn every_supported_volume_type_becomes_a_real_file() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let image = paths.image_volume(0).join("disk");
    std::fs::create_dir_all(&image).unwrap();
    std::fs::write(image.join("disk.img"), vec![7u8; 2 << 20]).unwrap();
    let v = vmi(
        "  - name: cd\n    containerDisk:\n      image: x\n  - name: scratch\n    emptyDisk:\n      capacity: 10Mi\n  - name: ci\n    cloudInitNoCloud:\n      userData: \"#cloud-config\\npassword: x\\n\"\n  - name: drive\n    cloudInitConfigDrive:\n      userData: \"#!/bin/sh\\necho hi\\n\"\n  - name: host\n    hostDisk:\n      path: /data/host.img\n      type: DiskOrCreate\n      capacity: 3Mi\n",
    );
    for i in 0..v.spec.volumes.len() {
        let plan = disks::plan(&paths, &v, i).unwrap();
        disks::materialize(&plan, &v, &paths, None).unwrap();
        // Idempotent: a second run keeps what exists.
        disks::materialize(&plan, &v, &paths, None).unwrap();
    }
    // Container disk: a qcow2 overlay whose backing is the linked base.
    let info = qemu_img_info(&paths.overlay(&volume("cd")));
    assert_eq!(info["format"], "qcow2");
    assert_eq!(info["virtual-size"], 2 << 20);
    assert_eq!(info["backing-filename-format"], "raw");
    assert!(paths.container_disk_base(0).is_symlink());
    // Empty disk: qcow2 of the capacity.
    let info = qemu_img_info(&paths.empty_disk(&volume("scratch")));
    assert_eq!(info["virtual-size"], 10 << 20);
    // Host disk: a sparse raw file, rounded down to whole MiB.
    let host = paths.vmi_disks_dir(&volume("host")).join("host.img");
    assert_eq!(std::fs::metadata(&host).unwrap().len(), 3 << 20);
    // Cloud-init: ISOs an ISO reader can open, with the right labels.
    let (ns, v_name) = ns_v();
    for (iso, label) in [
        (paths.nocloud_iso(&ns, &v_name), "cidata"),
        (paths.config_drive_iso(&ns, &v_name), "config-2"),
    ] {
        let out = Command::new("isoinfo")
            .args(["-d", "-i"])
            .arg(&iso)
            .output()
            .expect("isoinfo is installed (genisoimage, scripts/setup.sh)");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains(&format!("Volume id: {label}")),
            "{}: {text}",
            iso.display()
        );
    }
    let user = Command::new("isoinfo")
        .args(["-R", "-x", "/user-data", "-i"])
        .arg(paths.nocloud_iso(&ns, &v_name))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&user.stdout),
        "#cloud-config\npassword: x\n"
    );
}

#[test]
fn hostile_or_unsupported_volumes_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    // A container-disk path that climbs out of the image.
    std::fs::create_dir_all(paths.image_volume(0)).unwrap();
    let v = vmi(
        "  - name: cd\n    containerDisk:\n      image: x\n      path: ../../../../etc/passwd\n",
    );
    let plan = disks::plan(&paths, &v, 0).unwrap();
    let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
    assert!(matches!(err, DiskError::ContainerDisk { .. }), "{err}");
    assert!(
        !paths.overlay(&volume("cd")).exists(),
        "nothing is created for a refused disk"
    );
    // An image volume with two candidate files.
    let dir = paths.image_volume(0).join("disk");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.img"), b"a").unwrap();
    std::fs::write(dir.join("b.img"), b"b").unwrap();
    let v = vmi("  - name: cd\n    containerDisk:\n      image: x\n");
    let plan = disks::plan(&paths, &v, 0).unwrap();
    let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
    assert!(err.to_string().contains("exactly one disk image"), "{err}");
    // Volume types this launcher has no use for name the field.
    let v = vmi("  - name: cm\n    configMap:\n      name: x\n");
    let err = disks::plan(&paths, &v, 0).unwrap_err();
    assert_eq!(
        err.to_string(),
        "spec.volumes[0].configMap: this volume type is not supported by this launcher"
    );
    let v = vmi("  - name: e\n    emptyDisk:\n      capacity: huge\n");
    let err = disks::plan(&paths, &v, 0).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.volumes[0].emptyDisk.capacity"),
        "{err}"
    );
    // Cloud-init without any data.
    let v = vmi("  - name: ci\n    cloudInitNoCloud: {}\n");
    let plan = disks::plan(&paths, &v, 0).unwrap();
    assert!(disks::materialize(&plan, &v, &paths, None).is_err());
}

fn kernel_boot_vmi(kernel: &str, initrd: &str) -> proto::kubevirt::VirtualMachineInstance {
    parse_vmi(&format!(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: v\n  namespace: ns\n  uid: u-1\nspec:\n  domain:\n    firmware:\n      kernelBoot:\n        kernelArgs: console=ttyS0\n        container:\n          image: k\n          kernelPath: {kernel}\n          initrdPath: {initrd}\n"
    ))
    .unwrap()
}

#[test]
fn kernel_boot_artifacts_are_linked_where_kubevirt_names_them() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let boot = paths.kernel_boot_dir.join("boot");
    std::fs::create_dir_all(&boot).unwrap();
    std::fs::write(boot.join("vmlinuz-6.1"), b"kernel").unwrap();
    // An image's own symlink that stays inside the image is fine.
    std::fs::write(boot.join("initramfs.img"), b"initrd").unwrap();
    std::os::unix::fs::symlink("initramfs.img", boot.join("initrd")).unwrap();

    let v = kernel_boot_vmi("/boot/vmlinuz-6.1", "/boot/initrd");
    let kb = disks::kernel_boot(&paths, &v).unwrap().unwrap();
    let links = paths.container_disk_dir.join("kernel-boot");
    assert_eq!(kb.kernel_link, links.join("vmlinuz-6.1"));
    assert_eq!(kb.initrd_link, Some(links.join("initrd")));
    for _ in 0..2 {
        // Twice: a restarted launcher finds its links and replaces them.
        disks::link_kernel_boot(&paths, &kb).unwrap();
    }
    assert_eq!(std::fs::read(&kb.kernel_link).unwrap(), b"kernel");
    assert_eq!(
        std::fs::read(kb.initrd_link.as_ref().unwrap()).unwrap(),
        b"initrd"
    );
    assert_eq!(
        std::fs::read_link(&kb.kernel_link).unwrap(),
        boot.join("vmlinuz-6.1").canonicalize().unwrap()
    );
}

#[test]
fn kernel_boot_artifacts_that_leave_the_image_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let boot = paths.kernel_boot_dir.join("boot");
    std::fs::create_dir_all(&boot).unwrap();
    std::fs::write(boot.join("vmlinuz"), b"kernel").unwrap();
    // A file of the launcher's that the image points at.
    let secret = root.path().join("launcher-secret");
    std::fs::write(&secret, b"secret").unwrap();
    std::os::unix::fs::symlink(&secret, boot.join("initrd")).unwrap();
    std::fs::create_dir_all(boot.join("dir")).unwrap();

    let v = kernel_boot_vmi("/boot/vmlinuz", "/boot/initrd");
    let kb = disks::kernel_boot(&paths, &v).unwrap().unwrap();
    let err = disks::link_kernel_boot(&paths, &kb).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("spec.domain.firmware.kernelBoot.container.initrdPath:"),
        "{err}"
    );
    assert!(err.to_string().contains("leads outside"), "{err}");
    assert!(!kb.initrd_link.as_ref().unwrap().exists());

    for (kernel, what) in [("/boot/missing", "kernelPath"), ("/boot/dir", "kernelPath")] {
        let v = kernel_boot_vmi(kernel, "/boot/vmlinuz");
        let kb = disks::kernel_boot(&paths, &v).unwrap().unwrap();
        let err = disks::link_kernel_boot(&paths, &kb).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "spec.domain.firmware.kernelBoot.container.{what}:"
            )),
            "{err}"
        );
    }
    // Lexical escapes never get as far as a link.
    let v = kernel_boot_vmi("/../../etc/passwd", "/boot/initrd");
    assert!(disks::kernel_boot(&paths, &v).is_err());
    // Two artifacts under one name would share one link.
    let v = kernel_boot_vmi("/boot/vmlinuz", "/other/vmlinuz");
    assert!(disks::kernel_boot(&paths, &v).is_err());
}

/// A volume name becomes a file or directory name (overlay, PVC and host-disk mounts, empty
/// disk, block device): one that is no DNS-1123 label (`..`, `/`, upper case) is refused by
/// the plan before any path is made, for every volume kind, and so is a second volume of the
/// same name (it would share the first one's files).
#[test]
fn volume_names_never_leave_their_directories() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(&root.path().join("pod"));
    let sources = [
        "containerDisk:\n      image: x",
        "ephemeral:\n      persistentVolumeClaim:\n        claimName: c",
        "persistentVolumeClaim:\n      claimName: c",
        "hostDisk:\n      path: /data/d.img\n      type: DiskOrCreate\n      capacity: 1Mi",
        "emptyDisk:\n      capacity: 1Mi",
        "cloudInitNoCloud:\n      userData: x",
    ];
    let names = [
        "../../../../../escape",
        "\"/escape\"",
        "..",
        "a/b",
        "\"\"",
        "Escape",
    ];
    for source in sources {
        for name in names {
            let v = vmi(&format!("  - name: {name}\n    {source}\n"));
            let err = disks::plan(&paths, &v, 0)
                .expect_err(&format!("volume {name:?} with {source:?} is refused"));
            assert!(
                err.to_string().starts_with("spec.volumes[0].name: volume "),
                "{name} {source}: {err}"
            );
        }
        let twice = vmi(&format!(
            "  - name: d\n    emptyDisk:\n      capacity: 1Mi\n  - name: d\n    {source}\n"
        ));
        assert!(disks::plan(&paths, &twice, 0).is_ok());
        let err = disks::plan(&paths, &twice, 1).unwrap_err();
        assert_eq!(
            err.to_string(),
            "spec.volumes[1].name: spec.volumes[1] and spec.volumes[0] must not have the same name"
        );
    }
    let created: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(created.is_empty(), "nothing was created: {created:?}");
}

/// A VMI with one container disk, booted from a kernel-boot container.
fn container_disk_vmi() -> proto::kubevirt::VirtualMachineInstance {
    parse_vmi(
        "apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: v\n  namespace: ns\n  uid: u-1\nspec:\n  domain:\n    memory:\n      guest: 128Mi\n    firmware:\n      kernelBoot:\n        container:\n          image: k\n          kernelPath: /boot/vmlinuz\n    devices:\n      disks:\n      - name: cd\n        disk:\n          bus: virtio\n      interfaces:\n      - name: default\n        masquerade: {}\n  networks:\n  - name: default\n    pod: {}\n  volumes:\n  - name: cd\n    containerDisk:\n      image: x\n",
    )
    .unwrap()
}

/// `qemu-img create -u`: a qcow2 image at `path` naming `backing` as raw.
fn qcow2_naming(path: &std::path::Path, backing: &str) {
    let out = Command::new("qemu-img")
        .args([
            "create", "-q", "-u", "-f", "qcow2", "-b", backing, "-F", "raw",
        ])
        .arg(path)
        .arg("1M")
        .output()
        .expect("qemu-img is installed (scripts/setup.sh)");
    assert!(out.status.success(), "{out:?}");
}

/// A container disk is the tenant's image. A qcow2 base that names a
/// backing file (absolute, or climbing out with `..`) would have the VM
/// read that host file through the overlay: the launcher refuses it, as
/// KubeVirt's `VerifyImage` does, before it creates anything.
#[test]
fn container_disks_that_name_a_backing_file_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let secret = root.path().join("launcher-secret.raw");
    std::fs::write(&secret, vec![0x5e; 1 << 20]).unwrap();
    let v = container_disk_vmi();
    for name in [secret.to_str().unwrap(), "../../../../launcher-secret.raw"] {
        let image = paths.image_volume(0).join("disk");
        let _ = std::fs::remove_dir_all(&image);
        std::fs::create_dir_all(&image).unwrap();
        qcow2_naming(&image.join("disk.qcow2"), name);
        let plan = disks::plan(&paths, &v, 0).unwrap();
        let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
        assert!(matches!(err, DiskError::ContainerDisk { .. }), "{err}");
        assert!(
            err.to_string()
                .contains(&format!("expected no backing file, but found {name}")),
            "{err}"
        );
        assert!(
            !paths.overlay(&PathName::volume("cd").unwrap()).exists(),
            "no overlay for a refused base"
        );
    }
}

/// The VMM opens an overlay with the one backing file its domain names,
/// and nothing below it: the launcher's verification is not the only
/// guard. A base swapped for one that names a host file after the overlay
/// was made is refused when the VMM opens the disk.
#[test]
fn the_vmm_opens_only_the_backing_file_the_domain_names() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let secret = root.path().join("launcher-secret.raw");
    std::fs::write(&secret, vec![0x5e; 1 << 20]).unwrap();
    let image = paths.image_volume(0).join("disk");
    std::fs::create_dir_all(&image).unwrap();
    // A qcow2 container disk (its format is the image's, not the plan's
    // assumption) holding 0x11 everywhere.
    let raw = root.path().join("src.raw");
    std::fs::write(&raw, vec![0x11; 1 << 20]).unwrap();
    let out = Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "qcow2"])
        .arg(&raw)
        .arg(image.join("disk.qcow2"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");

    let v = container_disk_vmi();
    let mut ctx = launcher::converter::Context {
        paths: paths.clone(),
        pod_interface: launcher::converter::PodInterface {
            mtu: 1500,
            mac: Some("0a:58:0a:f4:00:1b".into()),
            tap_exists: true,
        },
        ..Default::default()
    };
    let plan = disks::plan(&paths, &v, 0).unwrap();
    ctx.disks.insert(plan.volume.clone(), plan.clone());
    ctx.kernel_boot = disks::kernel_boot(&paths, &v).unwrap();
    let mut domain = launcher::converter::convert(&v, &ctx).unwrap();
    let format = disks::materialize(&plan, &v, &paths, None)
        .unwrap()
        .base_format;
    assert_eq!(format, Some(block::Format::Qcow2));
    let devices = domain.spec.devices.as_mut().unwrap();
    let (base, _) = plan.backing.as_ref().unwrap();
    disks::record_backing_format(&mut devices.disks, base, block::Format::Qcow2);
    let store = devices.disks[0].backing_store.as_ref().unwrap();
    assert_eq!(store.format.as_ref().unwrap().r#type, "qcow2");

    let config = launcher::to_vm::vm_config(&domain).unwrap();
    let disk = &config.disks[0];
    let open = || {
        let opts = block::OpenOptions {
            read_only: disk.read_only,
            direct: false,
            backing: disk.backing.clone(),
        };
        block::ConcurrentDisk::open(&disk.path, disk.format, opts)
    };
    let mut buf = vec![0u8; 4096];
    open().unwrap().read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&b| b == 0x11), "the base shows through");

    // The image's file swapped for one that names the secret.
    std::fs::remove_file(image.join("disk.qcow2")).unwrap();
    qcow2_naming(&image.join("disk.qcow2"), secret.to_str().unwrap());
    let err = open().err().expect("the swapped base is refused");
    assert!(
        err.to_string().contains("may not have a backing file"),
        "{err}"
    );
}

/// A VMI whose volume `name` is `source`; `mode` is the claim's `volumeMode` as KubeVirt's
/// controller records it in the VMI's status (`None`: no record).
fn claim_vmi(
    name: &str,
    source: &str,
    mode: Option<&str>,
) -> proto::kubevirt::VirtualMachineInstance {
    let mut v = vmi(&format!("  - name: \"{name}\"\n    {source}\n"));
    if let Some(mode) = mode {
        let status = serde_json::json!({"volumeStatus": [{"name": name, "target": "",
            "persistentVolumeClaimInfo": {"claimName": "claim", "volumeMode": mode}}]});
        v.status = Some(serde_json::from_value(status).unwrap());
    }
    v
}

const PVC: &str = "persistentVolumeClaim:\n      claimName: claim";
const DATA_VOLUME: &str = "dataVolume:\n      name: claim";
const EPHEMERAL: &str = "ephemeral:\n      persistentVolumeClaim:\n        claimName: claim";

/// A PVC is written by others (the tenant's other pods): its `disk.img` may be a link. One
/// that leads out of the volume (absolute, or climbing with `..`) is refused when the
/// launcher opens it, for every PVC kind, and the file it names is never written; a link
/// that stays inside the volume is followed, and the disk is the file it reaches.
#[test]
fn pvc_disks_that_lead_out_of_their_volume_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let secret = root.path().join("launcher-secret");
    std::fs::write(&secret, vec![0x5e; 1 << 20]).unwrap();
    let dir = paths.vmi_disks_dir(&volume("pvc"));
    let up = "../".repeat(dir.strip_prefix(root.path()).unwrap().components().count());
    for target in [secret.clone(), format!("{up}launcher-secret").into()] {
        for source in [PVC, DATA_VOLUME, EPHEMERAL] {
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            std::os::unix::fs::symlink(&target, dir.join("disk.img")).unwrap();
            assert_eq!(std::fs::read(dir.join("disk.img")).unwrap().len(), 1 << 20);
            let v = claim_vmi("pvc", source, Some("Filesystem"));
            let plan = disks::plan(&paths, &v, 0).unwrap();
            let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
            assert!(matches!(err, DiskError::Volume { .. }), "{err}");
            let text = err.to_string();
            assert!(
                text.starts_with(&format!("volume pvc: {}: ", dir.join("disk.img").display()))
                    && text.ends_with("it leads out of its volume"),
                "{target:?} {source}: {text}"
            );
            assert!(
                !paths.overlay(&volume("pvc")).exists(),
                "no overlay over it"
            );
        }
    }
    assert_eq!(std::fs::read(&secret).unwrap(), vec![0x5e; 1 << 20]);

    // A link inside the volume is the volume's business.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("images")).unwrap();
    std::fs::write(dir.join("images/real.img"), vec![0x11; 1 << 20]).unwrap();
    std::os::unix::fs::symlink("images/real.img", dir.join("disk.img")).unwrap();
    let v = claim_vmi("pvc", PVC, Some("Filesystem"));
    let plan = disks::plan(&paths, &v, 0).unwrap();
    let done = disks::materialize(&plan, &v, &paths, None).unwrap();
    let file = done.file.expect("the PVC's file is opened");
    assert_eq!(file.name(), dir.join("disk.img"));
    assert_eq!(std::fs::read(file.path()).unwrap(), vec![0x11; 1 << 20]);
}

/// A host disk's directory is a node directory: `DiskOrCreate` never creates, truncates or
/// extends a file through a link in it (dangling or not, out of the directory or inside),
/// and `Disk` never opens one that leads out.
#[test]
fn host_disks_are_never_created_or_opened_through_a_link() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let outside = root.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let existing = outside.join("existing.img");
    std::fs::write(&existing, b"not a disk").unwrap();
    let dir = paths.vmi_disks_dir(&volume("host"));
    let up = "../".repeat(dir.strip_prefix(root.path()).unwrap().components().count());
    let host = |kind: &str| {
        claim_vmi(
            "host",
            &format!(
                "hostDisk:\n      path: /data/host.img\n      type: {kind}\n      capacity: 3Mi"
            ),
            None,
        )
    };
    let cases: [(std::path::PathBuf, &str); 5] = [
        (outside.join("created.img"), "DiskOrCreate"),
        (format!("{up}outside/created.img").into(), "DiskOrCreate"),
        ("missing.img".into(), "DiskOrCreate"),
        (existing.clone(), "DiskOrCreate"),
        (existing.clone(), "Disk"),
    ];
    for (target, kind) in cases {
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::os::unix::fs::symlink(&target, dir.join("host.img")).unwrap();
        let v = host(kind);
        let plan = disks::plan(&paths, &v, 0).unwrap();
        let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
        assert!(
            err.to_string().starts_with(&format!(
                "volume host: {}: ",
                dir.join("host.img").display()
            )),
            "{target:?} {kind}: {err}"
        );
        assert!(!outside.join("created.img").exists(), "{target:?}: created");
        assert!(!dir.join("missing.img").exists(), "{target:?}: created");
        assert_eq!(std::fs::read(&existing).unwrap(), b"not a disk");
    }
    // Without a link the file is created, once, and kept.
    std::fs::remove_dir_all(&dir).unwrap();
    let v = host("DiskOrCreate");
    let plan = disks::plan(&paths, &v, 0).unwrap();
    let done = disks::materialize(&plan, &v, &paths, None).unwrap();
    assert_eq!(
        std::fs::metadata(dir.join("host.img")).unwrap().len(),
        3 << 20
    );
    std::fs::write(dir.join("host.img"), b"guest data").unwrap();
    disks::materialize(&plan, &v, &paths, None).unwrap();
    assert_eq!(std::fs::read(dir.join("host.img")).unwrap(), b"guest data");
    assert_eq!(
        std::fs::read(done.file.unwrap().path()).unwrap(),
        b"guest data"
    );
}

/// `/dev/<volume>` is the disk only for a block volume: by the claim's `volumeMode` when
/// the VMI's status records it, else when a block device is there (as KubeVirt's launcher
/// decides). What is opened must be a block device: a volume named `null` never makes
/// `/dev/null` (a character device) the VM's disk.
#[test]
fn dev_volume_is_the_disk_only_for_a_block_claim() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let file = paths.vmi_disks_dir(&volume("null")).join("disk.img");
    for (mode, planned) in [
        (None, file.clone()),
        (Some("Filesystem"), file.clone()),
        (Some("Block"), "/dev/null".into()),
    ] {
        let v = claim_vmi("null", PVC, mode);
        let plan = disks::plan(&paths, &v, 0).unwrap();
        assert_eq!(plan.path, planned, "{mode:?}");
        assert_eq!(
            plan.kind,
            if mode == Some("Block") {
                "block"
            } else {
                "file"
            }
        );
    }
    let v = claim_vmi("null", PVC, Some("Block"));
    let plan = disks::plan(&paths, &v, 0).unwrap();
    let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
    assert_eq!(
        err.to_string(),
        "volume null: /dev/null: it is a character device, not a block device"
    );
    // A filesystem claim's file must be a regular file.
    std::fs::create_dir_all(&file).unwrap();
    let v = claim_vmi("null", PVC, Some("Filesystem"));
    let plan = disks::plan(&paths, &v, 0).unwrap();
    let err = disks::materialize(&plan, &v, &paths, None).unwrap_err();
    assert!(
        err.to_string()
            .ends_with("it is a directory, not a regular file"),
        "{err}"
    );
}

/// An ephemeral PVC's base is opened once, below its volume, and the VMM's overlay may open
/// that file only: a base renamed and replaced by a link to a launcher file after the
/// launcher opened it still reads as the base it opened (the domain, converted after the
/// switch, names the link).
#[test]
fn an_ephemeral_overlay_reads_the_base_the_launcher_opened() {
    let root = tempfile::tempdir().unwrap();
    let paths = Paths::under(root.path());
    let secret = root.path().join("launcher-secret");
    std::fs::write(&secret, vec![0x5e; 1 << 20]).unwrap();
    let dir = paths.vmi_disks_dir(&volume("eph"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("disk.img"), vec![0x11; 1 << 20]).unwrap();
    let mut v = container_disk_vmi();
    v.spec.domain.devices.disks[0].name = "eph".into();
    v.spec.volumes = claim_vmi("eph", EPHEMERAL, None).spec.volumes;
    let mut ctx = launcher::converter::Context {
        paths: paths.clone(),
        pod_interface: launcher::converter::PodInterface {
            mtu: 1500,
            mac: Some("0a:58:0a:f4:00:1b".into()),
            tap_exists: true,
        },
        ..Default::default()
    };
    let plan = disks::plan(&paths, &v, 0).unwrap();
    ctx.disks.insert(plan.volume.clone(), plan.clone());
    ctx.kernel_boot = disks::kernel_boot(&paths, &v).unwrap();
    let domain = launcher::converter::convert(&v, &ctx).unwrap();
    let done = disks::materialize(&plan, &v, &paths, None).unwrap();
    assert!(done.base.is_some(), "the base is opened");

    std::fs::rename(dir.join("disk.img"), dir.join("first.img")).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("disk.img")).unwrap();
    let mut config = launcher::to_vm::vm_config(&domain).unwrap();
    done.hand_to(&mut config.disks);
    let disk = &config.disks[0];
    let opts = block::OpenOptions {
        read_only: true,
        direct: false,
        backing: disk.backing.clone(),
    };
    let image = block::ConcurrentDisk::open(&disk.path, disk.format, opts).unwrap();
    let mut buf = vec![0u8; 4096];
    image.read_at(&mut buf, 0).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0x11),
        "the base opened shows through"
    );
}
