//! The monitor passes `NET_BIND_SERVICE` on to the launcher as an ambient capability, as
//! KubeVirt's does: in a pod the compute container runs as user 107 with only that
//! capability (on the monitor binary as a file capability), and the launcher's DHCP server
//! needs it to bind port 67. Needs root (setcap, switching to user 107) and `setcap` from
//! libcap2-bin; fails, never skips, without them.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const CAP_NET_BIND_SERVICE_BIT: u64 = 1 << 10;
const LAUNCHER_UID: u32 = 107;

/// The capability sets a "launcher" (a script) saw, from its /proc/self/status.
struct Seen {
    ambient: u64,
    effective: u64,
}

/// Runs a copy of the monitor as user 107, with `file_cap` set on it, starting a fake
/// launcher that records its capabilities.
fn run_monitor(file_cap: bool) -> Seen {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test sets file capabilities and switches users: run it as root"
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let monitor = dir.path().join("virt-launcher-monitor");
    install_executable(
        Path::new(env!("CARGO_BIN_EXE_virt-launcher-monitor")),
        &monitor,
    );
    if file_cap {
        // Root's PATH usually has /usr/sbin; look there too.
        let setcap = ["/usr/sbin/setcap", "/sbin/setcap"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("setcap");
        let out = Command::new(setcap)
            .arg("cap_net_bind_service=+ep")
            .arg(&monitor)
            .output()
            .expect("setcap is required (Debian package libcap2-bin)");
        assert!(out.status.success(), "setcap: {out:?}");
    }
    let record = dir.path().join("caps.txt");
    // Written here, executed only as the copy `install_executable` makes.
    let script = dir.path().join("fake-launcher.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ngrep -E '^Cap(Amb|Eff):' /proc/self/status > {}\n",
            record.display()
        ),
    )
    .unwrap();
    let launcher = dir.path().join("fake-launcher");
    install_executable(&script, &launcher);
    let status = Command::new(&monitor)
        .args(["--container-disk-dir", dir.path().to_str().unwrap()])
        .env("VIRT_LAUNCHER_BINARY", &launcher)
        .uid(LAUNCHER_UID)
        .gid(LAUNCHER_UID)
        .status()
        .expect("run the monitor");
    assert!(status.success(), "monitor: {status:?}");
    parse(&std::fs::read_to_string(&record).expect("the fake launcher ran"))
}

/// Copies `src` to a new executable (mode 0755) `dst` in a child process (coreutils'
/// `install`), so that this process never has `dst` open for writing.
///
/// The tests of this binary run in parallel and fork (every `Command`). A child forked
/// while a thread here has `dst` open for writing keeps a copy of that descriptor until it
/// execs (`O_CLOEXEC` closes it only then), and executing `dst` meanwhile fails with
/// ETXTBSY ("Text file busy"); seen as `run the monitor` failing in about 1 run in 12.
/// Retrying the spawn would not cover the fake launcher, which the monitor (the code
/// under test) executes.
fn install_executable(src: &Path, dst: &Path) {
    let out = Command::new("install")
        .args(["-m", "0755"])
        .arg(src)
        .arg(dst)
        .output()
        .expect("run install (coreutils)");
    assert!(out.status.success(), "install {}: {out:?}", dst.display());
}

fn parse(text: &str) -> Seen {
    let field = |name: &str| {
        let line = text
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {text:?}"));
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    Seen {
        ambient: field("CapAmb:"),
        effective: field("CapEff:"),
    }
}

#[test]
fn the_launcher_keeps_net_bind_service_across_the_exec() {
    let seen = run_monitor(true);
    assert_eq!(
        seen.ambient, CAP_NET_BIND_SERVICE_BIT,
        "ambient set of the launcher"
    );
    assert_eq!(
        seen.effective, CAP_NET_BIND_SERVICE_BIT,
        "effective set of the launcher"
    );
}

#[test]
fn without_the_capability_the_launcher_still_starts_with_none() {
    let seen = run_monitor(false);
    assert_eq!((seen.ambient, seen.effective), (0, 0));
}

#[test]
fn the_fake_launcher_reads_real_status_lines() {
    // The parser against this process's own status, so a format change fails loudly.
    let own = std::fs::read_to_string("/proc/self/status").unwrap();
    let seen = parse(&own);
    assert_ne!(seen.effective, 0, "the test runs as root");
}
