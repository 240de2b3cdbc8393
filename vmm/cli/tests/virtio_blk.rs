//! virtio-blk end to end: the test guest writes, flushes, reads back and
//! probes the bounds of disks attached with `vmm run --disk`; the test then
//! checks the bytes in the disk files themselves.

mod common;

use common::*;
use std::path::Path;
use std::process::Output;

/// The sector the guest writes and its pattern, the sector it clears with
/// write-zeroes and the one it discards (images/guest/src/virtio/blk.rs).
const TEST_SECTOR: usize = 1;
const ZEROES_SECTOR: usize = 2;
const DISCARD_SECTOR: usize = 3;
const SECTOR: usize = 512;

fn pattern(i: usize) -> u8 {
    const MAGIC: &[u8; 16] = b"virtio-blk-test\n";
    if i < MAGIC.len() {
        MAGIC[i]
    } else {
        i.to_le_bytes()[0].wrapping_mul(31) ^ 0x5a
    }
}

fn expected_sector() -> Vec<u8> {
    (0..SECTOR).map(pattern).collect()
}

fn raw_disk(dir: &tempfile::TempDir, name: &str, size: usize, fill: u8) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, vec![fill; size]).expect("write disk image");
    path
}

fn run_blk(kernel: &Path, disks: &[String]) -> Output {
    let mut args = vec!["--cmdline", "checks=virtio-blk exit=poweroff"];
    for d in disks {
        args.push("--disk");
        args.push(d);
    }
    let out = run_kernel(kernel, &args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    out
}

#[test]
fn the_guest_writes_its_pattern_into_a_raw_disk_file() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let disk = raw_disk(&dir, "disk.raw", 1 << 20, 0x11);
    let out = run_blk(
        &kernel,
        &[format!("path={},format=raw,serial=D1SK-7", disk.display())],
    );
    for check in [
        "virtio-blk-write",
        "virtio-blk-irq",
        "virtio-blk-flush",
        "virtio-blk-zeroes",
        "virtio-blk-discard",
        "virtio-blk-read",
        "virtio-blk-id",
        "virtio-blk-batch",
        "virtio-blk-bounds",
    ] {
        assert_pass(&out, check);
    }
    assert!(stdout(&out).contains("capacity=2048"), "{}", stdout(&out));
    let id = stdout(&out)
        .lines()
        .find(|l| l.starts_with("TEST virtio-blk-id"))
        .map(|l| l.split("id=").nth(1).unwrap_or("").to_string())
        .unwrap();
    assert_eq!(id, "D1SK-7", "GET_ID answers the configured serial");
    let bytes = std::fs::read(&disk).unwrap();
    assert_eq!(bytes.len(), 1 << 20, "the disk file keeps its size");
    assert_guest_changes(&bytes, 0x11);
}

#[test]
fn discard_ignore_and_no_serial_are_what_the_guest_sees() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let disk = raw_disk(&dir, "disk.raw", 1 << 20, 0x55);
    let out = run_blk(
        &kernel,
        &[format!("path={},format=raw,discard=ignore", disk.display())],
    );
    // No DISCARD offered: the guest does not try (write-zeroes stays).
    assert!(
        !stdout(&out).contains("TEST virtio-blk-discard"),
        "{}",
        stdout(&out)
    );
    assert_pass(&out, "virtio-blk-zeroes");
    // No serial: GET_ID answers an all-zero ID, as QEMU without a serial.
    assert_pass(&out, "virtio-blk-id");
    let id_line = stdout(&out)
        .lines()
        .find(|l| l.starts_with("TEST virtio-blk-id"))
        .unwrap()
        .to_string();
    assert!(id_line.trim_end().ends_with("id="), "{id_line}");
    let bytes = std::fs::read(&disk).unwrap();
    let discard_sector = &bytes[DISCARD_SECTOR * SECTOR..(DISCARD_SECTOR + 1) * SECTOR];
    assert!(
        discard_sector.iter().all(|&b| b == 0x55),
        "nothing discarded"
    );
}

/// The guest's pattern in its sector, zeroes in the write-zeroes sector, the
/// discarded sector either old or zero, everything else still `fill`.
fn assert_guest_changes(bytes: &[u8], fill: u8) {
    let sector = |n: usize| &bytes[n * SECTOR..(n + 1) * SECTOR];
    assert!(sector(0).iter().all(|&b| b == fill), "sector 0 untouched");
    assert_eq!(sector(TEST_SECTOR), &expected_sector()[..]);
    assert!(
        sector(ZEROES_SECTOR).iter().all(|&b| b == 0),
        "write-zeroes"
    );
    let discarded = sector(DISCARD_SECTOR);
    assert!(
        discarded.iter().all(|&b| b == 0) || discarded.iter().all(|&b| b == fill),
        "a discarded sector reads as zeroes or its old contents"
    );
    assert!(
        bytes[(DISCARD_SECTOR + 1) * SECTOR..]
            .iter()
            .all(|&b| b == fill),
        "the rest untouched"
    );
}

#[test]
fn a_read_only_disk_refuses_the_write_and_keeps_its_bytes() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let disk = raw_disk(&dir, "ro.raw", 64 * 1024, 0x22);
    let out = run_blk(
        &kernel,
        &[format!("path={},format=raw,readonly=on", disk.display())],
    );
    for check in [
        "virtio-blk-ro",
        "virtio-blk-flush",
        "virtio-blk-read",
        "virtio-blk-batch",
        "virtio-blk-bounds",
    ] {
        assert_pass(&out, check);
    }
    assert!(
        !stdout(&out).contains("TEST virtio-blk-write"),
        "{}",
        stdout(&out)
    );
    assert_eq!(std::fs::read(&disk).unwrap(), vec![0x22; 64 * 1024]);
}

#[test]
fn two_disks_are_driven_separately() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let rw = raw_disk(&dir, "rw.raw", 128 * 1024, 0);
    let ro = raw_disk(&dir, "ro.raw", 128 * 1024, 0x33);
    let out = run_blk(
        &kernel,
        &[
            format!("path={},format=raw", rw.display()),
            format!("path={},format=raw,readonly=on", ro.display()),
        ],
    );
    assert_pass(&out, "virtio-blk-write");
    assert_pass(&out, "virtio-blk1-ro");
    assert_pass(&out, "virtio-blk1-irq");
    assert_pass(&out, "virtio-blk1-batch");
    assert!(
        stdout(&out).contains("DONE passed=16 failed=0"),
        "{}",
        stdout(&out)
    );
    assert_guest_changes(&std::fs::read(&rw).unwrap(), 0);
    assert_eq!(std::fs::read(&ro).unwrap(), vec![0x33; 128 * 1024]);
}

#[test]
fn the_guest_writes_its_pattern_into_a_qcow2_image_that_qemu_img_accepts() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let image = dir.path().join("disk.qcow2");
    let qemu_img = |args: &[&str]| {
        let out = std::process::Command::new("qemu-img")
            .args(args)
            .output()
            .expect("qemu-img is required for this test (Debian package qemu-utils)");
        assert!(
            out.status.success(),
            "qemu-img {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    };
    let image_s = image.to_str().unwrap();
    qemu_img(&["create", "-q", "-f", "qcow2", image_s, "1M"]);
    let out = run_blk(&kernel, &[format!("path={image_s},format=qcow2")]);
    assert_pass(&out, "virtio-blk-write");
    assert_pass(&out, "virtio-blk-zeroes");
    assert_pass(&out, "virtio-blk-discard");
    assert_pass(&out, "virtio-blk-read");
    assert_pass(&out, "virtio-blk-batch");
    qemu_img(&["check", "-q", image_s]);
    let raw = dir.path().join("converted.raw");
    let raw_s = raw.to_str().unwrap();
    qemu_img(&["convert", "-f", "qcow2", "-O", "raw", image_s, raw_s]);
    assert_guest_changes(&std::fs::read(&raw).unwrap(), 0);
}

#[test]
fn a_misbehaving_driver_gets_its_requests_back_and_the_device_keeps_working() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let disk = raw_disk(&dir, "disk.raw", 64 * 1024, 0x44);
    let disk_arg = format!("path={},format=raw", disk.display());
    // What the guest did wrong is logged at INFO under the target `guest_error` (a host
    // operator's WARN is for the host): turn it on for this run.
    let mut cmd = vmm();
    cmd.env("RUST_LOG", "warn,guest_error=info")
        .args(["run", "--kernel"])
        .arg(&kernel)
        .args([
            "--disk",
            &disk_arg,
            "--cmdline",
            "checks=virtio-blk,virtio-evil exit=poweroff",
        ]);
    let out = run_with_timeout(cmd, std::time::Duration::from_secs(120));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    assert_pass(&out, "virtio-blk-evil");
    let log = stderr(&out);
    assert!(log.contains("INFO guest_error:"), "{log}");
    assert!(
        !log.contains("WARN"),
        "the guest's doing is not a host warning: {log}"
    );
    assert!(log.contains("not inside guest memory"), "{log}");
    assert!(
        log.contains("device-readable but follows a device-writable"),
        "{log}"
    );
    assert!(log.contains("queue register written outside"), "{log}");
    assert!(log.contains("queue the device does not have"), "{log}");
    // Only the guest's own well-formed requests reached the disk.
    assert_guest_changes(&std::fs::read(&disk).unwrap(), 0x44);
}

#[test]
fn every_cache_mode_gives_the_guest_the_same_disk() {
    // cache=none reads and writes with O_DIRECT (a qcow2 overlay over a
    // raw base: metadata, data and the backing file all direct);
    // writethrough flushes every write. The guest must see no difference.
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    for cache in ["none", "writethrough", "writeback"] {
        let raw = raw_disk(&dir, &format!("{cache}.raw"), 1 << 20, 0x55);
        let base = raw_disk(&dir, &format!("{cache}-base.raw"), 1 << 20, 0x66);
        let overlay = dir.path().join(format!("{cache}.qcow2"));
        block::qcow2::create(
            &overlay,
            &block::qcow2::CreateOptions {
                backing_file: Some(base.to_str().unwrap().to_string()),
                backing_format: Some(block::Format::Raw),
                ..Default::default()
            },
        )
        .unwrap();
        let out = run_blk(
            &kernel,
            &[
                format!("path={},format=raw,cache={cache}", raw.display()),
                // The overlay may open its base, in the test's directory.
                format!(
                    "path={},format=qcow2,cache={cache},backing-dir={},backing-format=raw",
                    overlay.display(),
                    dir.path().display()
                ),
            ],
        );
        for check in [
            "virtio-blk-read",
            "virtio-blk-batch",
            "virtio-blk1-read",
            "virtio-blk1-batch",
        ] {
            assert_pass(&out, check);
        }
        assert_guest_changes(&std::fs::read(&raw).unwrap(), 0x55);
        let flat = dir.path().join(format!("{cache}-flat.raw"));
        let converted = std::process::Command::new("qemu-img")
            .args(["convert", "-f", "qcow2", "-O", "raw"])
            .args([&overlay, &flat])
            .output()
            .expect("qemu-img is required for this test (Debian package qemu-utils)");
        assert!(converted.status.success(), "cache={cache}: {converted:?}");
        assert_guest_changes(&std::fs::read(&flat).unwrap(), 0x66);
        assert_eq!(
            std::fs::read(&base).unwrap(),
            vec![0x66; 1 << 20],
            "base untouched"
        );
    }
}

/// The guest benchmark's random pattern (images/guest/src/virtio/blkbench.rs):
/// xorshift64 from this seed, one slot of the request size per request.
fn benchmark_random_slots(requests: usize, slots: u64) -> std::collections::BTreeSet<u64> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..requests)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % slots
        })
        .collect()
}

/// The slots of `size` bytes that are no longer all `fill`.
fn changed_slots(bytes: &[u8], size: usize, fill: u8) -> std::collections::BTreeSet<u64> {
    bytes
        .chunks(size)
        .enumerate()
        .filter(|(_, c)| c.iter().any(|&b| b != fill))
        .map(|(i, _)| i as u64)
        .collect()
}

/// Runs the guest's `virtio-blk-bench` with `VMM_STATS=1` and returns
/// (the guest's result line, the VMM's stats line for disk 0).
fn run_benchmark(kernel: &Path, disk: &Path, transport: &str, options: &str) -> (String, String) {
    let mut cmd = vmm();
    cmd.arg("run")
        .arg("--kernel")
        .arg(kernel)
        .args(["--transport", transport])
        .args([
            "--cmdline",
            &format!("checks=virtio-blk-bench {options} exit=poweroff"),
        ])
        .arg("--disk")
        .arg(format!("path={},format=raw", disk.display()))
        .env("VMM_STATS", "1");
    let out = run_with_timeout(cmd, std::time::Duration::from_secs(300));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}\n{}",
        stdout(&out),
        stderr(&out)
    );
    let result = stdout(&out)
        .lines()
        .find(|l| l.starts_with("TEST virtio-blk-bench PASS"))
        .unwrap_or_else(|| panic!("no result: {}", stdout(&out)))
        .to_string();
    let stats = stderr(&out)
        .lines()
        .find(|l| l.starts_with("VMM_STATS disk=0 "))
        .unwrap_or_else(|| panic!("no VMM_STATS line: {}", stderr(&out)))
        .to_string();
    (result, stats)
}

#[test]
fn the_benchmark_writes_its_random_slots_over_mmio_and_the_vmm_counts_them() {
    // Over virtio-mmio the guest finds the disk on the command line's
    // `virtio_mmio.device=` entry, as on Firecracker.
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let disk = raw_disk(&dir, "bench.raw", 1 << 20, 0x11);
    let (result, stats) = run_benchmark(
        &kernel,
        &disk,
        "mmio",
        "blkbench.op=write blkbench.pattern=rand blkbench.kb=4 blkbench.n=24",
    );
    assert!(
        result.contains("requests=24 ") && result.contains("pattern=rand"),
        "{result}"
    );
    assert!(stats.contains(" wr_reqs=24 wr_bytes=98304 "), "{stats}");
    assert!(
        stats.contains(" rd_reqs=0 ") && stats.contains(" errors=0 "),
        "{stats}"
    );
    // The guest writes its (zeroed) data buffer: exactly the pattern's
    // slots changed, not a run from the start of the disk.
    let expected = benchmark_random_slots(24, 256);
    assert!(expected.len() > 12, "the pattern spreads: {expected:?}");
    let changed = changed_slots(&std::fs::read(&disk).unwrap(), 4096, 0x11);
    assert_eq!(changed, expected);
}

#[test]
fn the_benchmark_reads_sequentially_over_pci_and_the_vmm_counts_them() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let disk = raw_disk(&dir, "bench.raw", 1 << 20, 0x22);
    let (result, stats) = run_benchmark(
        &kernel,
        &disk,
        "pci",
        "blkbench.op=read blkbench.kb=64 blkbench.n=20",
    );
    assert!(
        result.contains("requests=20 ") && result.contains("pattern=seq"),
        "{result}"
    );
    assert!(stats.contains(" rd_reqs=20 rd_bytes=1310720 "), "{stats}");
    assert!(
        stats.contains(" wr_reqs=0 ") && stats.contains(" errors=0 "),
        "{stats}"
    );
    assert_eq!(
        std::fs::read(&disk).unwrap(),
        vec![0x22; 1 << 20],
        "reads only"
    );
}

/// `qemu-img create -f qcow2 <dir>/<name> <size>`.
fn qcow2_image(dir: &tempfile::TempDir, name: &str, size: &str) -> std::path::PathBuf {
    let path = dir.path().join(name);
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&path)
        .arg(size)
        .output()
        .expect("qemu-img is required for this test (Debian package qemu-utils)");
    assert!(out.status.success(), "{out:?}");
    path
}

#[test]
fn a_guest_reset_ends_vmm_run_with_the_unflushed_writes_in_the_image() {
    // `vmm run` exits at a guest reset: the disks are flushed and closed before it
    // does, or the qcow2 metadata of writes the guest never flushed is lost with the
    // process. A second run (the guest's next generation) must find them.
    use test_guest::blkfill::{Fill, Reset};
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let image = qcow2_image(&dir, "disk.qcow2", "64M");
    let fill = Fill::TWO_GENERATIONS;
    let cmdline = format!("{} exit=poweroff", fill.cmdline(Reset::Guest));
    let disk = format!("path={},format=qcow2,cache=none", image.display());
    let run = || run_kernel(&kernel, &["--cmdline", &cmdline, "--disk", &disk]);
    let first = run();
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    assert!(
        stderr(&first).contains("VM ended: guest reset"),
        "{}",
        stderr(&first)
    );
    assert!(
        stdout(&first).contains("BLKFILL gen=1 written"),
        "{}",
        stdout(&first)
    );
    let second = run();
    assert_eq!(second.status.code(), Some(0), "{}", stdout(&second));
    assert_pass(&second, "virtio-blk-fill");
    assert!(
        stdout(&second).contains("PASS gen=2 "),
        "the second run did not find the first one's writes:\n{}",
        stdout(&second)
    );
    fill.verify_qcow2(&image)
        .unwrap_or_else(|e| panic!("{}: {e}", image.display()));
}

#[test]
fn a_second_vmm_run_on_a_disk_in_use_is_refused_naming_it() {
    use std::io::{BufRead, BufReader};
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let image = qcow2_image(&dir, "disk.qcow2", "1M");
    let disk = format!("path={},format=qcow2", image.display());
    let mut first = spawn_run(
        &kernel,
        &[
            "--cmdline",
            "checks=serial exit=halt wait=120",
            "--disk",
            &disk,
        ],
    );
    let mut lines = BufReader::new(first.stdout.take().unwrap()).lines();
    assert!(
        lines.any(|l| l.is_ok_and(|l| l.starts_with("WAITING"))),
        "the first VM did not come up"
    );
    for disk in [disk.clone(), format!("{disk},readonly=on")] {
        let second = run_kernel(&kernel, &["--cmdline", "checks=serial", "--disk", &disk]);
        let err = stderr(&second);
        assert_ne!(second.status.code(), Some(0), "{err}");
        assert!(
            err.contains(&format!("image {} is in use", image.display())),
            "{err}"
        );
        assert!(err.contains("\"write\" lock"), "{err}");
    }
    let _ = first.kill();
    let _ = first.wait();
}
