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

/// These images carry the flat guest, no compressed payload: their own
/// "decompressor" (the guest itself) runs in the guest.
fn run(kernel: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--decompress", "guest"];
    all.extend_from_slice(args);
    run_kernel(kernel, &all)
}

/// A bzImage whose payload is the guest ELF compressed by the tool and
/// flags Linux's build uses (arch/x86/boot/compressed/Makefile,
/// scripts/Makefile.lib), the uncompressed size appended for all but gzip.
fn compressed_bzimage(dir: &tempfile::TempDir, tool: &[&str], with_size: bool) -> PathBuf {
    use std::io::Write;
    let elf = std::fs::read(guest_elf(dir)).unwrap();
    let mut child = std::process::Command::new(tool[0])
        .args(&tool[1..])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{} is needed for this test: {e}", tool[0]));
    child.stdin.take().unwrap().write_all(&elf).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{tool:?} failed");
    let mut payload = out.stdout;
    if with_size {
        payload.extend_from_slice(
            &u32::try_from(elf.len())
                .expect("the test kernel is small")
                .to_le_bytes(),
        );
    }
    // Setup sectors, then a protected-mode part that is only the payload.
    let mut image = vec![0u8; (usize::from(SETUP_SECTS) + 1) * 512];
    image[0x1f1] = SETUP_SECTS;
    image[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    image[0x202..0x206].copy_from_slice(b"HdrS");
    image[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    image[0x211] = 0x01;
    image[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
    image[0x248..0x24c].copy_from_slice(&0u32.to_le_bytes());
    image[0x24c..0x250].copy_from_slice(
        &u32::try_from(payload.len())
            .expect("the test payload is small")
            .to_le_bytes(),
    );
    image.extend_from_slice(&payload);
    let path = dir.path().join(format!("bzImage-{}", tool[0]));
    std::fs::write(&path, image).unwrap();
    path
}

#[test]
fn every_kernel_compression_is_decompressed_on_the_host_and_entered_directly() {
    let dir = tempdir();
    for (tool, with_size) in [
        (&["gzip", "-n", "-9", "-c"][..], false),
        (&["bzip2", "-9", "-c"][..], true),
        (&["lzma", "-9", "-c"][..], true),
        (
            &["xz", "--check=crc32", "--x86", "--lzma2=,dict=32MiB", "-c"][..],
            true,
        ),
        (&["lzop", "-9", "-c"][..], true),
        (&["lz4", "-l", "-9", "-c"][..], true),
        (&["zstd", "-22", "--ultra", "-c"][..], true),
    ] {
        let kernel = compressed_bzimage(&dir, tool, with_size);
        let out = run_kernel(
            &kernel,
            &["--cmdline", "checks=serial,bootparams exit=poweroff"],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{tool:?}\nstdout:\n{}\nstderr:\n{}",
            stdout(&out),
            stderr(&out)
        );
        assert_pass(&out, "serial");
        assert_pass(&out, "bootparams");
    }
    // The same image without host decompression would run its payload as
    // code: the flag decides, and a truncated payload is refused.
    let kernel = compressed_bzimage(&dir, &["gzip", "-n", "-9", "-c"], false);
    let mut bytes = std::fs::read(&kernel).unwrap();
    // 16 bytes cut before the size the build appends (the payload's last
    // 4), which stays valid: what fails is the gzip stream itself.
    let size: [u8; 4] = bytes[bytes.len() - 4..].try_into().unwrap();
    bytes.truncate(bytes.len() - 20);
    bytes.extend_from_slice(&size);
    let len = u32::from_le_bytes(bytes[0x24c..0x250].try_into().unwrap()) - 16;
    bytes[0x24c..0x250].copy_from_slice(&len.to_le_bytes());
    std::fs::write(&kernel, bytes).unwrap();
    let out = run_kernel(&kernel, &[]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot load the kernel: bzImage payload: gzip payload"),
        "{}",
        stderr(&out)
    );
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
