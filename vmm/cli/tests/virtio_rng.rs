//! virtio-rng end to end: the guest reads 64 bytes through `vmm run --rng`.

mod common;

use common::*;

fn first_bytes(out: &std::process::Output) -> String {
    let text = stdout(out);
    let line = text
        .lines()
        .find(|l| l.starts_with("TEST virtio-rng-read PASS"))
        .unwrap_or_else(|| panic!("no passing rng check:\n{text}\n{}", stderr(out)));
    line.split("first=").nth(1).unwrap().to_string()
}

#[test]
fn the_guest_gets_random_bytes_that_differ_between_runs() {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    let args = ["--rng", "--cmdline", "checks=virtio-rng exit=poweroff"];
    let a = run_kernel(&kernel, &args);
    let b = run_kernel(&kernel, &args);
    assert_eq!(a.status.code(), Some(0), "{}", stderr(&a));
    assert_eq!(b.status.code(), Some(0), "{}", stderr(&b));
    assert!(stdout(&a).contains("bytes=64"), "{}", stdout(&a));
    // 64 bits from a CSPRNG collide with probability 2^-64.
    assert_ne!(first_bytes(&a), first_bytes(&b));
}
