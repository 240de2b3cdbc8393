//! The bzImage path of the loader: the test guest packaged as a bzImage
//! (setup sectors with a Linux setup header, then the flat protected-mode
//! image loaded at 1 MiB and entered 0x200 bytes in, as for a 64-bit Linux
//! kernel).

mod common;

use std::path::{Path, PathBuf};

use common::*;

const SETUP_SECTS: u8 = 4;

struct Header {
    version: u16,
    loadflags: u8,
    code32_start: u32,
    init_size: u32,
}

const GOOD: Header = Header {
    version: 0x020f,
    loadflags: 0x01,
    code32_start: 0x10_0000,
    init_size: 0,
};

/// Builds a bzImage from the guest ELF (flattened with objcopy).
fn bzimage(dir: &tempfile::TempDir, header: Header) -> PathBuf {
    let elf = guest_elf(dir);
    let flat = dir.path().join("guest.bin");
    let out = std::process::Command::new("objcopy")
        .args(["-O", "binary"])
        .arg(&elf)
        .arg(&flat)
        .output()
        .expect("objcopy is needed for this test (Debian package binutils)");
    assert!(
        out.status.success(),
        "objcopy: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let mut image = vec![0u8; (usize::from(SETUP_SECTS) + 1) * 512];
    image[0x1f1] = SETUP_SECTS;
    image[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    image[0x202..0x206].copy_from_slice(b"HdrS");
    image[0x206..0x208].copy_from_slice(&header.version.to_le_bytes());
    image[0x211] = header.loadflags;
    image[0x214..0x218].copy_from_slice(&header.code32_start.to_le_bytes());
    image[0x260..0x264].copy_from_slice(&header.init_size.to_le_bytes());
    image.extend(std::fs::read(&flat).unwrap());
    let path = dir.path().join("bzImage");
    std::fs::write(&path, image).unwrap();
    path
}

fn run(kernel: &Path, args: &[&str]) -> std::process::Output {
    run_kernel(kernel, args)
}

#[test]
fn the_guest_boots_from_a_bzimage() {
    let dir = tempdir();
    let kernel = bzimage(&dir, GOOD);
    let out = run(&kernel, &["--vcpus", "2", "--cmdline", "exit=poweroff"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{}\nstderr:\n{}",
        stdout(&out),
        stderr(&out)
    );
    for check in ["serial", "bootparams", "idt", "mem", "mptable", "smp"] {
        assert_pass(&out, check);
    }
}

#[test]
fn a_bzimage_with_an_old_protocol_version_is_refused() {
    let dir = tempdir();
    let kernel = bzimage(
        &dir,
        Header {
            version: 0x0100,
            ..GOOD
        },
    );
    let out = run(&kernel, &[]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("cannot load the kernel"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bzimage_that_is_not_loaded_high_is_refused() {
    let dir = tempdir();
    let kernel = bzimage(
        &dir,
        Header {
            loadflags: 0,
            ..GOOD
        },
    );
    let out = run(&kernel, &[]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("cannot load the kernel"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bzimage_below_1_mib_is_refused() {
    let dir = tempdir();
    let kernel = bzimage(
        &dir,
        Header {
            code32_start: 0x8000,
            ..GOOD
        },
    );
    let out = run(&kernel, &[]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("cannot load the kernel"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_bzimage_whose_decompression_needs_more_memory_than_the_vm_has_is_refused() {
    let dir = tempdir();
    let kernel = bzimage(
        &dir,
        Header {
            init_size: 64 << 20,
            ..GOOD
        },
    );
    let out = run(&kernel, &["--memory", "16"]);
    assert_eq!(out.status.code(), Some(126));
    assert!(
        stderr(&out).contains("past the end of guest memory"),
        "{}",
        stderr(&out)
    );
}
