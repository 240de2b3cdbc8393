//! Builds the freestanding test guest (images/guest) with a nested cargo and
//! leaves it in OUT_DIR for `include_bytes!` (`test_guest::ELF`, src/lib.rs).
//!
//! The guest has its own workspace, lock file and flags. The nested cargo
//! gets its own target dir, runs inside the guest folder, and gets the guest
//! flags through CARGO_ENCODED_RUSTFLAGS: a build script's environment
//! carries an (empty) CARGO_ENCODED_RUSTFLAGS that would otherwise override
//! the guest's .cargo/config.toml. An explicit --target keeps the flags away
//! from the guest's own build script.

use std::env;
use std::path::PathBuf;
use std::process::Command;

const GUEST_TARGET: &str = "x86_64-unknown-linux-gnu";
const GUEST_RUSTFLAGS: &[&str] = &[
    "-C",
    "relocation-model=static",
    "-C",
    "target-feature=+crt-static",
    "-C",
    "no-redzone=yes",
    "-C",
    "force-unwind-tables=no",
    "-C",
    "target-feature=-sse,-sse2",
];

fn main() {
    let manifest_dir =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let guest_dir = manifest_dir
        .join("../../images/guest")
        .canonicalize()
        .expect("images/guest exists two levels above vmm/test-guest");
    let out_dir = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let target_dir = out_dir.join("guest-target");

    for path in [
        "src",
        "Cargo.toml",
        "Cargo.lock",
        "build.rs",
        "linker.ld",
        ".cargo/config.toml",
    ] {
        println!("cargo:rerun-if-changed={}", guest_dir.join(path).display());
    }

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&guest_dir)
        .args([
            "build",
            "--release",
            "--target",
            GUEST_TARGET,
            "--target-dir",
        ])
        .arg(&target_dir)
        .env("CARGO_ENCODED_RUSTFLAGS", GUEST_RUSTFLAGS.join("\u{1f}"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        // clippy/coverage wrappers of the outer build must not apply to the guest.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .status()
        .expect("cannot run cargo to build the test guest");
    assert!(
        status.success(),
        "building the test guest in {} failed",
        guest_dir.display()
    );

    let built = target_dir
        .join(GUEST_TARGET)
        .join("release")
        .join("test-guest");
    let embedded = out_dir.join("test-guest.elf");
    std::fs::copy(&built, &embedded)
        .unwrap_or_else(|e| panic!("cannot copy {}: {e}", built.display()));
}
