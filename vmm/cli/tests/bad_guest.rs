//! Kernels and configurations the VMM must refuse with a clear error, never
//! a panic or a hang.

mod common;

use common::*;

const ERROR_STATUS: i32 = 126;

fn assert_refused(out: &std::process::Output, message: &str) {
    assert_eq!(
        out.status.code(),
        Some(ERROR_STATUS),
        "stdout:\n{}\nstderr:\n{}",
        stdout(out),
        stderr(out)
    );
    let err = stderr(out);
    assert!(
        err.contains("cannot start the VM") && err.contains(message),
        "expected {message:?} in:\n{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// The guest ELF with one edit applied.
fn patched_guest(dir: &tempfile::TempDir, edit: impl FnOnce(&mut Vec<u8>)) -> std::path::PathBuf {
    let mut elf = std::fs::read(guest_elf(dir)).unwrap();
    edit(&mut elf);
    let path = dir.path().join("patched.elf");
    std::fs::write(&path, elf).unwrap();
    path
}

fn u64_at(elf: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(elf[at..at + 8].try_into().unwrap())
}

fn put_u64(elf: &mut [u8], at: usize, value: u64) {
    elf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

/// Offset of the first PT_LOAD program header.
fn first_load_header(elf: &[u8]) -> usize {
    let phoff = int_cast::u64_to_usize(u64_at(elf, 0x20));
    let phentsize = u16::from_le_bytes([elf[0x36], elf[0x37]]) as usize;
    let phnum = u16::from_le_bytes([elf[0x38], elf[0x39]]) as usize;
    (0..phnum)
        .map(|i| phoff + i * phentsize)
        .find(|&h| u32::from_le_bytes(elf[h..h + 4].try_into().unwrap()) == 1)
        .expect("a PT_LOAD header")
}

#[test]
fn a_missing_kernel_file_is_refused() {
    let out = run_kernel(std::path::Path::new("/nonexistent/vmlinux"), &[]);
    assert_refused(&out, "cannot open kernel /nonexistent/vmlinux");
}

#[test]
fn a_file_that_is_not_a_kernel_is_refused() {
    let dir = tempdir();
    let path = dir.path().join("garbage");
    std::fs::write(&path, vec![0x5au8; 8192]).unwrap();
    let out = run_kernel(&path, &[]);
    assert_refused(&out, "cannot load the kernel");
}

/// Shorter than the ELF magic, or cut inside it: the kernel file's first bytes
/// decide how it is read (ELF segments straight from the file, else the whole
/// image), and neither path may panic on them.
#[test]
fn an_empty_or_cut_magic_kernel_file_is_refused() {
    let dir = tempdir();
    for (name, bytes) in [("empty", &b""[..]), ("cut", &b"\x7fEL"[..])] {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let out = run_kernel(&path, &[]);
        assert_refused(&out, "cannot load the kernel");
    }
}

/// A directory opens but cannot be read.
#[test]
fn a_directory_as_kernel_is_refused() {
    let dir = tempdir();
    let out = run_kernel(dir.path(), &[]);
    assert_refused(&out, "cannot open kernel");
}

#[test]
fn a_segment_outside_guest_memory_is_refused() {
    let dir = tempdir();
    let path = patched_guest(&dir, |elf| {
        let h = first_load_header(elf);
        put_u64(elf, h + 0x18, 0x4000_0000); // p_paddr: 1 GiB, past 128 MiB of RAM
    });
    let out = run_kernel(&path, &["--memory", "128"]);
    assert_refused(&out, "cannot load the kernel");
}

#[test]
fn a_kernel_that_does_not_fit_in_memory_is_refused() {
    let dir = tempdir();
    let path = patched_guest(&dir, |elf| {
        let h = first_load_header(elf);
        put_u64(elf, h + 0x28, 64 << 20); // p_memsz: 64 MiB of bss
    });
    let out = run_kernel(&path, &["--memory", "16"]);
    assert_refused(&out, "past the end of guest memory");
}

#[test]
fn an_entry_point_below_1_mib_is_refused() {
    let dir = tempdir();
    let path = patched_guest(&dir, |elf| put_u64(elf, 0x18, 0x7000));
    let out = run_kernel(&path, &[]);
    assert_refused(&out, "cannot load the kernel");
}

#[test]
fn a_truncated_elf_is_refused() {
    let dir = tempdir();
    let path = patched_guest(&dir, |elf| elf.truncate(0x48));
    let out = run_kernel(&path, &[]);
    assert_refused(&out, "cannot load the kernel");
}

#[test]
fn impossible_sizes_are_refused() {
    let out = run_guest(&["--vcpus", "0"]);
    assert_refused(&out, "vCPU count must be");
    let out = run_guest(&["--memory", "1"]);
    assert_refused(&out, "memory must be at least");
    let out = run_guest(&["--memory", "18446744073709551615"]);
    assert_refused(&out, "too large");
}

#[test]
fn a_command_line_longer_than_the_boot_protocol_allows_is_refused() {
    let long = "x".repeat(3000);
    let out = run_guest(&["--cmdline", &long]);
    assert_refused(&out, "command line");
}

#[test]
fn a_missing_initrd_is_refused() {
    let out = run_guest(&["--initrd", "/nonexistent/initrd"]);
    assert_refused(&out, "cannot open initrd");
}
