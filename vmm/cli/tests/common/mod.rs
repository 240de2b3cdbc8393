//! Helpers shared by the integration tests. Every test here runs real KVM:
//! a machine without a usable /dev/kvm fails them, loudly.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;
use std::process::{Command, Output};

/// Fails the test unless /dev/kvm can be opened read-write.
pub fn require_kvm() {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!("these tests need a usable /dev/kvm (they never skip): {e}");
    }
}

/// The `vmm` binary built for this test run.
pub fn vmm() -> Command {
    require_kvm();
    Command::new(env!("CARGO_BIN_EXE_vmm"))
}

/// A private temporary directory for one test.
pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("vmm-test-")
        .tempdir()
        .expect("cannot create a temp dir")
}

/// Writes the embedded test guest into `dir` and returns its path.
pub fn guest_elf(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("test-guest.elf");
    let out = vmm()
        .args(["test-guest", "--output"])
        .arg(&path)
        .output()
        .expect("run vmm test-guest");
    assert!(
        out.status.success(),
        "vmm test-guest failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    path
}

/// Runs `vmm run --kernel <guest> <args>` with a timeout and returns its output.
pub fn run_guest(args: &[&str]) -> Output {
    let dir = tempdir();
    let kernel = guest_elf(&dir);
    run_kernel(&kernel, args)
}

/// Starts `vmm run --kernel <kernel> <args>` with stdout and stderr piped,
/// for a test that talks to the running VM.
pub fn spawn_run(kernel: &std::path::Path, args: &[&str]) -> std::process::Child {
    vmm()
        .arg("run")
        .arg("--kernel")
        .arg(kernel)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn vmm run")
}

/// Runs `vmm run --kernel <kernel> <args>`, killed after 120 s.
pub fn run_kernel(kernel: &std::path::Path, args: &[&str]) -> Output {
    let mut cmd = vmm();
    cmd.arg("run").arg("--kernel").arg(kernel).args(args);
    run_with_timeout(cmd, std::time::Duration::from_secs(120))
}

/// Runs a command, killing it if it outlives `timeout` (the guest is
/// emulated at ~1 µs per instruction: be generous, but never hang CI).
pub fn run_with_timeout(mut cmd: Command, timeout: std::time::Duration) -> Output {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut out_pipe = child.stdout.take().expect("piped stdout");
    let mut err_pipe = child.stderr.take().expect("piped stderr");
    let out_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = out_pipe.read_to_end(&mut buf);
        buf
    });
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err_pipe.read_to_end(&mut buf);
        buf
    });
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let status = child.wait().expect("wait after kill");
            let stdout = out_reader.join().unwrap_or_default();
            panic!(
                "{cmd:?} did not finish within {timeout:?} ({status}); stdout:\n{}",
                String::from_utf8_lossy(&stdout)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    }
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts the guest printed `TEST <name> PASS`.
pub fn assert_pass(out: &Output, name: &str) {
    let text = stdout(out);
    let line = format!("TEST {name} PASS");
    assert!(
        text.lines().any(|l| l.starts_with(&line)),
        "no {line:?} in output:\n{text}\nstderr:\n{}",
        stderr(out)
    );
}
