//! Shared by the tests that run real launchers: root/KVM checks, the launcher and vmm
//! binaries (built from the workspace; the handler never links them), the test guest and
//! a base disk.

#![allow(dead_code)]

#[macro_use]
mod fake_cmd;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub fn require_root_and_kvm() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "these tests create network namespaces and mounts: run them as root"
    );
    assert!(
        Path::new("/dev/kvm").exists(),
        "/dev/kvm is missing: these tests boot real VMs"
    );
}

/// The workspace's root: the nearest folder above this crate holding `Cargo.lock`.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .find(|d| d.join("Cargo.lock").exists())
        .expect("the crate lives inside the workspace")
        .to_path_buf()
}

/// `<target>/<profile>`, where cargo puts the workspace's binaries: the test binary runs
/// from `<target>/<profile>/deps/`.
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.parent()
        .and_then(Path::parent)
        .expect("the test binary lives in <target>/<profile>/deps")
        .to_path_buf()
}

/// Builds the launcher and the vmm CLI (for the test guest) once per test binary.
/// The handler never links them: it only runs them, as it would in a cluster.
pub fn helper_binaries() -> &'static (PathBuf, PathBuf) {
    static BINS: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    BINS.get_or_init(|| {
        let dir = bin_dir();
        let monitor = dir.join("virt-launcher-monitor");
        let vmm = dir.join("vmm");
        let launcher = dir.join("virt-launcher");
        if !(monitor.exists() && vmm.exists() && launcher.exists()) {
            let target = dir.parent().expect("target dir");
            let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
            let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            cargo
                .args(["build", "-p", "virt-launcher", "-p", "vmm-cli", "--bins"])
                .env("CARGO_TARGET_DIR", target)
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if profile == "release" {
                cargo.arg("--release");
            }
            let status = cargo.status().expect("running cargo to build the launcher");
            assert!(
                status.success(),
                "cannot build the launcher binaries (cargo build -p virt-launcher -p vmm-cli --bins): {status}"
            );
        }
        for b in [&monitor, &launcher, &vmm] {
            assert!(b.exists(), "{} is missing after the build", b.display());
        }
        (monitor, vmm)
    })
}

/// The images and the manifest of one test.
pub struct Demo {
    pub dir: tempfile::TempDir,
    pub manifest: PathBuf,
    pub guest: PathBuf,
    pub disk: PathBuf,
}

/// The images and the manifest of a test: the test guest by kernel boot
/// (`vmi-testguest-kernel-boot.yaml`) with an empty data disk.
pub fn demo(name: &str, grace: u32) -> Demo {
    make_demo(name, grace, DemoDisk::Data)
}

/// What the demo's container disk holds.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum DemoDisk {
    /// 16 MiB of zeros, a data disk beside a kernel boot.
    Data,
    /// The test guest behind GRUB's configuration on a Debian-style disk, booted by
    /// `vmi-testguest.yaml` (no kernel named).
    Bootable,
    /// 16 MiB of zeros as the boot disk of `vmi-testguest.yaml`: nothing to boot.
    Unbootable,
}

/// A demo that boots its disk (`vmi-testguest.yaml`), or tries to.
pub fn disk_demo(name: &str, grace: u32, disk: DemoDisk) -> Demo {
    make_demo(name, grace, disk)
}

fn make_demo(name: &str, grace: u32, kind: DemoDisk) -> Demo {
    let (_, vmm) = helper_binaries();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let guest = dir.path().join("guest.elf");
    let out = Command::new(vmm)
        .args(["test-guest", "--output"])
        .arg(&guest)
        .output()
        .expect("vmm test-guest");
    assert!(out.status.success(), "vmm test-guest: {out:?}");
    let disk = dir.path().join("base.raw");
    if kind == DemoDisk::Bootable {
        let out = Command::new(vmm)
            .args([
                "test-guest",
                "--layout",
                "debian",
                "--cmdline",
                "console=ttyS0 checks=serial,bootparams,idt,mem,virtio-blk,virtio-rng exit=halt wait=600",
                "--disk",
            ])
            .arg(&disk)
            .output()
            .expect("vmm test-guest --disk");
        assert!(out.status.success(), "vmm test-guest --disk: {out:?}");
    } else {
        let f = std::fs::File::create(&disk).expect("disk");
        f.set_len(16 << 20).expect("size");
    }
    for p in [&guest, &disk] {
        std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .expect("chmod");
    }
    let (file, example_name) = match kind {
        DemoDisk::Data => ("vmi-testguest-kernel-boot.yaml", "testguest-kernel-boot"),
        DemoDisk::Bootable | DemoDisk::Unbootable => ("vmi-testguest.yaml", "testguest"),
    };
    let text = std::fs::read_to_string(workspace_root().join("images/examples").join(file))
        .expect("example manifest")
        .replace(
            &format!("name: {example_name}\n"),
            &format!("name: {name}\n"),
        )
        .replace(
            "terminationGracePeriodSeconds: 30",
            &format!("terminationGracePeriodSeconds: {grace}"),
        );
    let manifest = dir.path().join(format!("{name}.yaml"));
    std::fs::write(&manifest, text).expect("manifest");
    Demo {
        dir,
        manifest,
        guest,
        disk,
    }
}
