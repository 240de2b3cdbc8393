//! `vmm selftest`: boots the embedded test guest and reports its checks.

use std::time::Duration;

use crate::config::{SerialTarget, VmConfig};
use crate::devices::legacy::serial::SerialCapture;
use crate::test_guest::{self, CheckResult};
use crate::vm::Vm;

pub struct Options {
    pub vcpus: u8,
    pub verbose: bool,
}

/// Longest a selftest boot may take (guest code is emulated, ~1 µs per instruction).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the self test, prints one line per check, returns the exit status.
pub fn run(options: &Options) -> i32 {
    let capture = SerialCapture::new();
    let mut config = VmConfig::new(test_guest::kernel());
    config.vcpus = options.vcpus;
    config.serial = SerialTarget::Capture(capture.clone());
    config.cmdline = String::from("exit=poweroff");
    let mut results = Vec::new();
    let mut record = |name: &str, pass: bool, detail: String| {
        println!("{} {name} {detail}", if pass { "PASS" } else { "FAIL" });
        results.push(CheckResult {
            name: name.into(),
            pass,
            detail,
        });
    };
    match Vm::start(config) {
        Err(e) => record("vm-start", false, e.to_string()),
        Ok(handle) => {
            let exit = handle.wait_timeout(BOOT_TIMEOUT);
            if exit.is_none() {
                handle.kill();
            }
            for r in test_guest::parse_results(&capture.text()) {
                record(&r.name, r.pass, r.detail);
            }
            match exit {
                Some(exit) => record("vm-exit", exit.exit_status() == 0, exit.to_string()),
                None => record("vm-exit", false, format!("no exit within {BOOT_TIMEOUT:?}")),
            }
        }
    }
    if options.verbose {
        print!("{}", capture.text());
    }
    let failed = results.iter().filter(|r| !r.pass).count();
    println!("selftest: {} checks, {failed} failed", results.len());
    if failed == 0 && !results.is_empty() {
        0
    } else {
        1
    }
}
