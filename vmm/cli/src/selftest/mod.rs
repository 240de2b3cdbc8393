//! `vmm selftest`: a host's first check that it can run VMs. Boots the
//! embedded test guest with one of each device (a temporary raw disk, a tap
//! in a private network namespace when running as root, an rng) and prints
//! one `PASS|FAIL <check> <detail>` line per guest check plus host-side
//! checks (the bytes the guest wrote are in the disk file, the guest's frame
//! reached the host).

mod net;

use std::time::Duration;

use int_cast::u64_to_usize;
use test_guest::CheckResult;
use vmm::{
    DiskCache, DiskConfig, DiskFormat, KernelSource, NetConfig, SerialCapture, SerialTarget, Vm,
    VmConfig,
};

pub(crate) struct Options {
    pub(crate) vcpus: u8,
    pub(crate) verbose: bool,
    pub(crate) seccomp: vmm::SeccompMode,
}

/// Longest a selftest boot may take (guest code is emulated, ~1 µs per instruction).
const BOOT_TIMEOUT: Duration = Duration::from_secs(120);
const DISK_BYTES: u64 = 1 << 20;
const TAP_NAME: &str = "vmmselftest0";
/// Where and what the guest's block check writes (images/guest/src/virtio/blk.rs).
const TEST_SECTOR_OFFSET: u64 = 512;
const PATTERN_MAGIC: &[u8; 16] = b"virtio-blk-test\n";

/// Byte `i` of the sector the guest writes.
fn pattern(i: usize) -> u8 {
    match PATTERN_MAGIC.get(i) {
        Some(&b) => b,
        None => i.to_le_bytes()[0].wrapping_mul(31) ^ 0x5a,
    }
}

#[derive(Default)]
struct Report {
    results: Vec<CheckResult>,
}

impl Report {
    fn record(&mut self, name: &str, pass: bool, detail: impl Into<String>) {
        let detail = detail.into();
        println!("{} {name} {detail}", if pass { "PASS" } else { "FAIL" });
        self.results.push(CheckResult {
            name: name.into(),
            pass,
            detail,
        });
    }

    fn skip(&self, name: &str, why: &str) {
        println!("SKIP {name} {why}");
    }
}

/// Runs the self test, prints one line per check, returns the exit status
/// (0 only if every check passed).
pub(crate) fn run(options: &Options) -> i32 {
    let mut report = Report::default();
    let Ok(dir) = tempfile::Builder::new().prefix("vmm-selftest-").tempdir() else {
        report.record("tempdir", false, "cannot create a temporary directory");
        return 1;
    };
    let disk = dir.path().join("disk.raw");
    if let Err(e) = std::fs::File::create(&disk).and_then(|f| f.set_len(DISK_BYTES)) {
        report.record("disk-create", false, e.to_string());
        return 1;
    }

    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let net = if !root {
        report.skip(
            "virtio-net",
            "(needs root for a private network namespace and a tap)",
        );
        false
    } else if let Err(e) = net::enter_private_netns() {
        report.skip(
            "virtio-net",
            &format!("(cannot create a private network namespace: {e})"),
        );
        false
    } else {
        true
    };

    // The tap is ready and watched before the guest can send anything.
    let peer = if net {
        let ready = netsetup::tap::create_persistent_tap(TAP_NAME, 0, 0, true)
            .map_err(|e| e.to_string())
            .and_then(|()| net::prepare_link(TAP_NAME).map_err(|e| e.to_string()))
            .and_then(|()| net::Peer::start(TAP_NAME).map_err(|e| e.to_string()));
        match ready {
            Ok(peer) => Some(peer),
            Err(e) => {
                report.record("host-net-setup", false, e);
                return 1;
            }
        }
    } else {
        None
    };

    let capture = SerialCapture::new();
    let mut config = VmConfig::new(KernelSource::Bytes(std::sync::Arc::from(test_guest::ELF)));
    config.vcpus = options.vcpus;
    config.serial = SerialTarget::Capture(capture.clone());
    config.cmdline = "exit=poweroff net.rx_ms=10000".into();
    config.disks.push(DiskConfig {
        cache: DiskCache::default(),
        ..DiskConfig::new(disk.clone(), DiskFormat::Raw)
    });
    if net {
        config.nets.push(NetConfig::new(TAP_NAME));
    }
    config.rng = true;
    config.sandbox.seccomp = options.seccomp;

    let handle = match Vm::start(config) {
        Ok(handle) => handle,
        Err(e) => {
            report.record("vm-start", false, e.to_string());
            return 1;
        }
    };

    let exit = handle.wait_timeout(BOOT_TIMEOUT);
    if exit.is_none() {
        handle.kill();
        handle.wait();
    }
    let guest_frame_seen = peer.map(net::Peer::finish);
    for r in test_guest::parse_results(&capture.text()) {
        report.record(&r.name, r.pass, r.detail);
    }
    match std::fs::read(&disk) {
        Ok(bytes) => {
            let sector =
                bytes.get(u64_to_usize(TEST_SECTOR_OFFSET)..u64_to_usize(TEST_SECTOR_OFFSET) + 512);
            let ok = sector.is_some_and(|s| s.iter().enumerate().all(|(i, &b)| b == pattern(i)));
            report.record(
                "host-disk-contents",
                ok,
                if ok {
                    "sector 1 holds the guest's pattern"
                } else {
                    "sector 1 differs"
                },
            );
        }
        Err(e) => report.record("host-disk-contents", false, e.to_string()),
    }
    if let Some(seen) = guest_frame_seen {
        report.record(
            "host-net-rx",
            seen,
            if seen {
                "the guest's frame reached the tap"
            } else {
                "no frame from the guest"
            },
        );
    }
    match exit {
        Some(exit) => report.record("vm-exit", exit.exit_status() == 0, exit.to_string()),
        None => report.record("vm-exit", false, format!("no exit within {BOOT_TIMEOUT:?}")),
    }

    if options.verbose {
        print!("{}", capture.text());
    }
    let failed = report.results.iter().filter(|r| !r.pass).count();
    println!("selftest: {} checks, {failed} failed", report.results.len());
    // A guest that printed nothing is a failure, not a pass.
    let guest_checks = report
        .results
        .iter()
        .filter(|r| r.name.starts_with("virtio-") || r.name == "smp")
        .count();
    if failed == 0 && guest_checks > 0 {
        0
    } else {
        1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_pattern_starts_with_its_magic() {
        let bytes: Vec<u8> = (0..16).map(pattern).collect();
        assert_eq!(&bytes, PATTERN_MAGIC);
        assert_eq!(pattern(16), 16u8.wrapping_mul(31) ^ 0x5a);
    }
}
