//! A VM's disks across a reset, as a launcher restarts it: the old VM's ending
//! ([`VmHandle::wait`]) leaves its disks flushed and closed before the new VM opens
//! them, even when the guest never flushed and the old handle lives on; and an image a
//! VM holds for writing cannot be opened for writing by another VM.

mod common;

use std::time::Duration;

use test_guest::blkfill::{Fill, Reset};
use vmm::{
    DiskCache, DiskConfig, DiskFormat, SerialCapture, SerialTarget, Vm, VmConfig, VmExit, VmHandle,
};

const RUN: Duration = Duration::from_secs(180);

fn config(kernel: vmm::KernelSource, cmdline: &str, disk: DiskConfig) -> (VmConfig, SerialCapture) {
    let capture = SerialCapture::new();
    let mut config = VmConfig::new(kernel);
    config.cmdline = cmdline.into();
    config.serial = SerialTarget::Capture(capture.clone());
    config.disks.push(disk);
    (config, capture)
}

/// Runs the fill's generations as a launcher restarts a guest that resets: each new VM
/// starts while the handle of the one before is still held, and that handle is dropped
/// only once the new VM runs (the launcher's exit watcher holds it until then).
fn fill_across_resets(kernel: vmm::KernelSource, cmdline: &str, disk: DiskConfig, fill: Fill) {
    let mut previous: Option<VmHandle> = None;
    for generation in 1..=fill.gens {
        let (config, capture) = config(kernel.clone(), cmdline, disk.clone());
        let vm = Vm::start(config)
            .unwrap_or_else(|e| panic!("generation {generation}: the VM does not start: {e}"));
        drop(previous.take());
        let exit = vm.wait_timeout(RUN);
        let text = capture.text();
        if generation < fill.gens {
            assert_eq!(
                exit,
                Some(VmExit::Reset),
                "generation {generation}:\n{text}"
            );
            assert!(
                text.contains(&format!("BLKFILL gen={generation} written")),
                "{text}"
            );
        } else {
            assert_eq!(
                exit,
                Some(VmExit::PowerOff { code: 0 }),
                "generation {generation}:\n{text}"
            );
            assert!(
                text.contains(&format!("TEST virtio-blk-fill PASS gen={generation} ")),
                "{text}"
            );
        }
        // Kept, as the launcher keeps its last VM until the domain is deleted: the
        // image is checked while this handle lives.
        previous = Some(vm);
    }
    fill.verify_qcow2(&disk.path)
        .unwrap_or_else(|e| panic!("{}: {e}", disk.path.display()));
    drop(previous);
}

#[test]
fn writes_before_an_unflushed_guest_reset_survive_the_restart_and_the_image_stays_consistent() {
    common::require_kvm();
    let dir = common::tempdir();
    let image = dir.path().join("disk.qcow2");
    common::qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        image.to_str().unwrap(),
        "64M",
    ]);
    let fill = Fill::TWO_GENERATIONS;
    // cache=none: the requests of a batch run on the device's I/O threads.
    let disk = DiskConfig {
        cache: DiskCache::None,
        ..DiskConfig::new(&image, DiskFormat::Qcow2)
    };
    let cmdline = format!("{} exit=poweroff", fill.cmdline(Reset::Guest));
    fill_across_resets(common::test_guest_kernel(), &cmdline, disk, fill);
}

#[test]
fn a_vm_booting_from_its_disk_after_a_reset_reads_the_old_vms_writes() {
    // The new VM's boot loader thread opens the boot disk (an overlay over a raw base, as
    // a container disk) before its devices do: it must see the old VM's data too.
    common::require_kvm();
    let dir = common::tempdir();
    let base = dir.path().join("base.raw");
    let fill = Fill {
        offset_mib: 0, // set below, past the partitions
        ..Fill::TWO_GENERATIONS
    };
    let cmdline_of = |offset_mib: u64| {
        format!(
            "{} exit=poweroff",
            Fill { offset_mib, ..fill }.cmdline(Reset::Guest)
        )
    };
    // The entry's command line names the offset, which depends on the partitions' size:
    // write once to learn it, then again with the right one (same size).
    fn kernel(cmdline: &str) -> test_guest::disks::Kernel<'_> {
        test_guest::disks::Kernel {
            image: test_guest::ELF,
            initrd: None,
            cmdline,
        }
    }
    let probe = cmdline_of(9999);
    test_guest::disks::write_boot_disk(&base, test_guest::disks::Layout::Alpine, &kernel(&probe))
        .unwrap();
    let offset_mib = std::fs::metadata(&base).unwrap().len().div_ceil(1 << 20);
    let fill = Fill { offset_mib, ..fill };
    let cmdline = cmdline_of(offset_mib);
    test_guest::disks::write_boot_disk(&base, test_guest::disks::Layout::Alpine, &kernel(&cmdline))
        .unwrap();
    // MBR: no backup table at the end, the disk may grow.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(fill.end())
        .unwrap();
    let overlay = common::qcow2_overlay(dir.path(), "overlay.qcow2", &base);
    let disk = DiskConfig {
        cache: DiskCache::None,
        backing: vmm::DiskBacking::Within {
            dir: dir.path().to_path_buf(),
            format: DiskFormat::Raw,
        },
        ..DiskConfig::new(&overlay, DiskFormat::Qcow2)
    };
    let kernel = vmm::KernelSource::Disk(vmm::BootDisk {
        disk: 0,
        firmware: vmm::BootFirmware::Bios,
    });
    fill_across_resets(kernel, "", disk, fill);
}

#[test]
fn a_second_vm_cannot_open_a_disk_another_vm_writes() {
    common::require_kvm();
    let dir = common::tempdir();
    let image = dir.path().join("disk.qcow2");
    common::qemu_img(&["create", "-q", "-f", "qcow2", image.to_str().unwrap(), "1M"]);
    let disk = DiskConfig::new(&image, DiskFormat::Qcow2);
    let (first, capture) = config(
        common::test_guest_kernel(),
        "checks=serial exit=halt wait=120",
        disk.clone(),
    );
    let first = Vm::start(first).expect("the first VM starts");
    assert!(capture.wait_for("WAITING", RUN), "{}", capture.text());
    for read_only in [false, true] {
        let (second, _) = config(
            common::test_guest_kernel(),
            "checks=serial",
            DiskConfig {
                read_only,
                ..disk.clone()
            },
        );
        let err = match Vm::start(second) {
            Ok(_) => panic!(
                "a second VM opened {} (read_only: {read_only})",
                image.display()
            ),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(&image.display().to_string()), "{err}");
        assert!(err.contains("\"write\" lock"), "{err}");
    }
    first.kill();
    first.wait();
    // Once the first VM has ended, its disk is free (its handle still lives).
    let (again, capture) = config(
        common::test_guest_kernel(),
        "checks=serial exit=poweroff",
        disk,
    );
    let again = Vm::start(again).expect("the disk is free once the first VM ended");
    assert_eq!(
        again.wait_timeout(RUN),
        Some(VmExit::PowerOff { code: 0 }),
        "{}",
        capture.text()
    );
    drop(first);
}
