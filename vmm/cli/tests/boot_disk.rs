//! `vmm run` without `--kernel`: the test guest booted from disks laid out as Debian,
//! Ubuntu, Fedora, Alpine and systemd-boot images are (made by `test_guest::disks` with
//! sgdisk, sfdisk, mkfs.ext4, mkfs.vfat and mtools), through the boot loader
//! configuration on them; as a bzImage; from a qcow2 overlay over a compressed qcow2
//! base; from the disk marked `boot=on`. Bad disks end the VMM with the reason.

mod common;

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use common::{run_with_timeout, tempdir, vmm};
use test_guest::disks::{self, Kernel, Layout, write_boot_disk};

/// What the guest checks once booted: its boot parameters, the initrd the entry named
/// (its byte sum), and the disk it was booted from.
const CHECKS: &str = "console=ttyS0 checks=serial,bootparams,initrd,virtio-blk exit=poweroff";

fn initrd() -> Vec<u8> {
    (0..20_001u32).map(|i| (i * 7).to_le_bytes()[0]).collect()
}

/// The byte sum the guest's `initrd` check prints: the initrd as loaded (padded to 4).
fn initrd_sum(initrd: &[u8]) -> String {
    let mut padded = initrd.to_vec();
    padded.resize(padded.len().next_multiple_of(4), 0);
    let sum = padded
        .iter()
        .fold(0u32, |s, &b| s.wrapping_add(u32::from(b)));
    format!("sum={sum:#x}")
}

fn run(args: &[&str]) -> Output {
    let mut cmd = vmm();
    cmd.arg("run").args(args);
    run_with_timeout(cmd, Duration::from_secs(120))
}

fn disk_arg(path: &Path) -> String {
    format!("path={},format=raw", path.display())
}

fn assert_passed(out: &Output, what: &str) -> (String, String) {
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let results = test_guest::parse_results(&stdout);
    assert!(
        out.status.success() && !results.is_empty() && results.iter().all(|r| r.pass),
        "{what}: status {:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    (stdout, stderr)
}

#[test]
fn the_test_guest_boots_from_each_layout_through_its_boot_loader_configuration() {
    let dir = tempdir();
    let initrd = initrd();
    for (layout, firmware) in [
        (Layout::Debian, "bios"),
        (Layout::Ubuntu, "efi"),
        (Layout::Fedora, "efi"),
        (Layout::Alpine, "bios"),
        (Layout::SystemdBoot, "efi"),
    ] {
        let path = disks::path_in(dir.path(), layout);
        let built = write_boot_disk(
            &path,
            layout,
            &Kernel {
                image: test_guest::ELF,
                initrd: Some(&initrd),
                cmdline: CHECKS,
            },
        )
        .unwrap();
        let out = run(&["--firmware", firmware, "--disk", &disk_arg(&path)]);
        let (stdout, stderr) = assert_passed(&out, layout.name());
        // The entry is named, with its files, and its command line reached the guest.
        assert!(
            stderr.contains(&format!(
                "vmm: booting disk 0 ({})",
                firmware.to_uppercase()
            )) && stderr.contains(&format!("kernel {}", built.kernel_path)),
            "{layout:?}: {stderr}"
        );
        assert!(
            stderr.contains(&format!("vmm: command line: {}", built.cmdline)),
            "{layout:?}: {stderr}"
        );
        let initrd_line = stdout
            .lines()
            .find(|l| l.starts_with("TEST initrd PASS"))
            .unwrap_or_default();
        assert!(
            initrd_line.contains(&initrd_sum(&initrd)) && initrd_line.contains("size=20004"),
            "{layout:?}: {initrd_line}"
        );
    }
}

#[test]
fn the_guest_as_a_bzimage_is_decompressed_from_its_disk() {
    let dir = tempdir();
    let path = disks::path_in(dir.path(), Layout::Debian);
    let image = disks::guest_bzimage();
    write_boot_disk(
        &path,
        Layout::Debian,
        &Kernel {
            image: &image,
            initrd: None,
            cmdline: "console=ttyS0 checks=serial,bootparams exit=poweroff",
        },
    )
    .unwrap();
    assert_passed(&run(&["--disk", &disk_arg(&path)]), "bzImage");
}

#[test]
fn a_qcow2_overlay_over_a_compressed_base_boots_and_stays_consistent() {
    let dir = tempdir();
    let raw = disks::path_in(dir.path(), Layout::Alpine);
    write_boot_disk(
        &raw,
        Layout::Alpine,
        &Kernel {
            image: test_guest::ELF,
            initrd: Some(&initrd()),
            cmdline: CHECKS,
        },
    )
    .unwrap();
    let bases = dir.path().join("bases");
    std::fs::create_dir(&bases).unwrap();
    let base = bases.join("base.qcow2");
    let overlay = dir.path().join("overlay.qcow2");
    let qemu_img = |args: &[&str]| {
        let out = std::process::Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img (Debian package qemu-utils)");
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    qemu_img(&[
        "convert",
        "-c",
        "-O",
        "qcow2",
        raw.to_str().unwrap(),
        base.to_str().unwrap(),
    ]);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        "-F",
        "qcow2",
        overlay.to_str().unwrap(),
    ]);
    let out = run(&[
        "--disk",
        &format!(
            "path={},format=qcow2,backing-dir={},backing-format=qcow2",
            overlay.display(),
            bases.display()
        ),
    ]);
    let (_, stderr) = assert_passed(&out, "qcow2 over a compressed base");
    assert!(stderr.contains("extlinux entry \"lts\""), "{stderr}");
    // The guest wrote to the overlay only; both images are consistent.
    qemu_img(&["check", "-q", overlay.to_str().unwrap()]);
    qemu_img(&["check", "-q", base.to_str().unwrap()]);
}

#[test]
fn the_disk_marked_boot_on_is_booted() {
    let dir = tempdir();
    let data = dir.path().join("data.raw");
    std::fs::File::create(&data)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let path = disks::path_in(dir.path(), Layout::Debian);
    write_boot_disk(
        &path,
        Layout::Debian,
        &Kernel {
            image: test_guest::ELF,
            initrd: None,
            cmdline: "console=ttyS0 checks=serial exit=poweroff",
        },
    )
    .unwrap();
    let out = run(&[
        "--disk",
        &disk_arg(&data),
        "--disk",
        &format!("{},boot=on", disk_arg(&path)),
    ]);
    let (_, stderr) = assert_passed(&out, "boot=on");
    assert!(stderr.contains("vmm: booting disk 1 (BIOS)"), "{stderr}");
}

#[test]
fn a_disk_with_nothing_to_boot_ends_the_vmm_with_the_reason() {
    let dir = tempdir();
    let empty = dir.path().join("empty.raw");
    std::fs::File::create(&empty)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let xfs = dir.path().join("xfs.raw");
    disks::gpt_disk(
        &xfs,
        &[disks::GptPartition {
            code: "8300",
            name: "boot",
            size_mib: 300,
            legacy_bootable: false,
            content: Some(disks::Filesystem::new(
                disks::FsKind::Xfs,
                "boot",
                "12345678-1234-1234-1234-123456789abc",
                300,
            )),
        }],
    )
    .unwrap();
    let gone = dir.path().join("gone.raw");
    disks::gpt_disk(
        &gone,
        &[disks::GptPartition {
            code: "8300",
            name: "root",
            size_mib: 16,
            legacy_bootable: false,
            content: Some(
                disks::Filesystem::new(
                    disks::FsKind::Ext4,
                    "root",
                    "11111111-2222-3333-4444-555555555555",
                    16,
                )
                .file(
                    "/boot/grub/grub.cfg",
                    "menuentry 'Debian' { linux /boot/vmlinuz-gone }",
                ),
            ),
        }],
    )
    .unwrap();
    for (path, expected) in [
        (&empty, "no boot loader configuration found for BIOS boot"),
        (&xfs, "partition 1 (hd0,gpt1) holds xfs, which is not read"),
        (
            &gone,
            "kernel /boot/vmlinuz-gone on partition 1 (hd0,gpt1) not found",
        ),
    ] {
        let out = run(&["--disk", &disk_arg(path)]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(126), "{stderr}");
        assert!(
            stderr.contains("cannot boot from disk 0") && stderr.contains(expected),
            "{expected}: {stderr}"
        );
    }
}

#[test]
fn vmm_test_guest_writes_a_bootable_disk() {
    let dir = tempdir();
    let path = dir.path().join("guest.raw");
    let out = vmm()
        .args([
            "test-guest",
            "--layout",
            "fedora",
            "--cmdline",
            "console=ttyS0 checks=serial exit=poweroff",
            "--disk",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_passed(
        &run(&["--firmware", "efi", "--disk", &disk_arg(&path)]),
        "vmm test-guest --disk",
    );
}
