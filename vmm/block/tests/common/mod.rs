//! Helpers for tests that cross-check against qemu-img and qemu-io.
#![allow(dead_code)]

use int_cast::u64_to_usize;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Path of a QEMU tool; fails the test loudly when it is missing.
pub fn qemu_tool(name: &str) -> PathBuf {
    let p = PathBuf::from("/usr/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: these tests cross-check against QEMU; install it with `apt-get install -y qemu-utils`",
        p.display()
    );
    p
}

/// Runs a command. A QEMU tool refused for an image lock is run again for up to 2 s:
/// the engines lock images as QEMU does, and a descriptor this process has closed
/// lives on in a child another test thread is starting (until its `exec`), so QEMU
/// can see a lock for a moment that no one holds any more (see the block design's
/// image locks).
pub fn run(cmd: &mut Command) -> Output {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success()
            || !stderr.contains("Is another process using the image")
            || std::time::Instant::now() > deadline
        {
            return out;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Runs a command and requires exit code 0.
pub fn run_ok(cmd: &mut Command) -> String {
    let out = run(cmd);
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn qemu_img(args: &[&str]) -> String {
    run_ok(Command::new(qemu_tool("qemu-img")).args(args))
}

pub fn qemu_io(args: &[&str]) -> String {
    run_ok(Command::new(qemu_tool("qemu-io")).args(args))
}

/// `qemu-img check` must report no leaks and no corruptions.
pub fn assert_qemu_check_clean(path: &Path) {
    let out = run(Command::new(qemu_tool("qemu-img"))
        .args(["check", "--output=json", "-f", "qcow2"])
        .arg(path));
    assert!(
        out.status.success(),
        "qemu-img check {} failed ({}): {}{}",
        path.display(),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `qemu-img compare` must find the guest-visible contents identical.
pub fn assert_identical(a: &Path, fa: &str, b: &Path, fb: &str) {
    let out = run(Command::new(qemu_tool("qemu-img"))
        .args(["compare", "-f", fa, "-F", fb])
        .arg(a)
        .arg(b));
    assert!(
        out.status.success(),
        "qemu-img compare {} {}: {}{}",
        a.display(),
        b.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

pub fn info_json(path: &Path) -> serde_json::Value {
    let s = qemu_img(&[
        "info",
        "--output=json",
        "-f",
        "qcow2",
        path.to_str().unwrap(),
    ]);
    serde_json::from_str(&s).expect("qemu-img info JSON")
}

/// Bytes from a simple deterministic generator: random, repeated and zero
/// stretches, so that compression has something to do.
pub fn mixed_data(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut v = vec![0u8; len];
    let mut i = 0;
    while i < len {
        let run = (next() % 70000) as usize + 1;
        let end = (i + run).min(len);
        match next() % 3 {
            0 => {} // zeroes
            1 => {
                let [b, ..] = next().to_le_bytes();
                v[i..end].fill(b);
            }
            _ => {
                for byte in &mut v[i..end] {
                    [*byte, ..] = next().to_le_bytes();
                }
            }
        }
        i = end;
    }
    v
}

/// Reads the whole disk through our engine (the tests' own images: the
/// backing chain they name is followed).
pub fn read_all(path: &Path, format: block::Format) -> Vec<u8> {
    let opts = block::OpenOptions {
        read_only: true,
        direct: false,
        backing: block::BackingPolicy::FollowImage,
    };
    let mut d = block::open_disk_with(path, format, opts)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    let mut v = vec![0u8; u64_to_usize(d.size())];
    d.read_at(&mut v, 0).expect("read all");
    v
}
