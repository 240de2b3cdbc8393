//! Helpers of the `vmm img` tests: the block crate's test helpers (qemu-img,
//! qemu-io, image checks, test data), shared by path rather than copied, and
//! the `vmm img` command built for this test run.

#![allow(dead_code)] // each test binary uses a different subset

#[path = "../../../block/tests/common/mod.rs"]
mod block_common;
pub use block_common::*;

use std::process::Command;

/// `vmm img`, the command under test.
pub fn vmm_img() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vmm"));
    cmd.arg("img");
    cmd
}
