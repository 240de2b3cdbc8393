//! Running a Firecracker binary (`FIRECRACKER=/path/to/firecracker`) on the
//! same guest as `vmm run`, for side-by-side benchmarks. Nothing of
//! Firecracker is built here; see benches/README.md for how to build one.
//!
//! Firecracker is started the way that costs it least: `--no-api
//! --config-file` (no API socket, no HTTP round trips), its log in a file
//! (so that stdout carries the serial console alone), its default seccomp
//! filters unless [`Config::seccomp`] is false (`--no-seccomp`). A
//! Firecracker built for the `-gnu` target has no real filters: its build
//! falls back to `resources/seccomp/unimplemented.json`, which allows every
//! system call.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread::JoinHandle;

use super::monotonic_ns;

/// The Firecracker binary named by `FIRECRACKER`, if any.
pub fn binary_from_env() -> Option<String> {
    std::env::var("FIRECRACKER").ok().filter(|p| !p.is_empty())
}

/// A virtio-blk disk for the guest (Firecracker's `drives` entry).
pub struct Drive {
    pub path: PathBuf,
    pub read_only: bool,
    /// Firecracker's `cache_type`: false = `Unsafe` (the default: flushes
    /// are not passed to the host), true = `Writeback` (flushes are).
    pub honour_flush: bool,
}

/// What one Firecracker microVM gets.
pub struct Config {
    pub kernel: PathBuf,
    /// The guest's command line (Firecracker adds its
    /// `virtio_mmio.device=` entries for the drives).
    pub boot_args: String,
    pub memory_mib: u64,
    pub vcpus: u8,
    pub drives: Vec<Drive>,
    /// Install Firecracker's seccomp filters (its default).
    pub seccomp: bool,
    /// Where Firecracker writes its metrics (an existing file; one JSON
    /// object per line, counters as deltas since the previous line; the
    /// last one at exit).
    pub metrics: Option<PathBuf>,
}

impl Config {
    /// The guest on `kernel`, one vCPU, no drives, seccomp as Firecracker's default.
    pub fn new(kernel: impl Into<PathBuf>, boot_args: &str, memory_mib: u64) -> Self {
        Self {
            kernel: kernel.into(),
            boot_args: boot_args.into(),
            memory_mib,
            vcpus: 1,
            drives: Vec::new(),
            seccomp: true,
            metrics: None,
        }
    }

    /// Firecracker's `--config-file` JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let drives: Vec<_> = self
            .drives
            .iter()
            .enumerate()
            .map(|(i, d)| {
                serde_json::json!({
                    "drive_id": format!("disk{i}"),
                    "path_on_host": d.path,
                    "is_root_device": false,
                    "is_read_only": d.read_only,
                    "cache_type": if d.honour_flush { "Writeback" } else { "Unsafe" },
                })
            })
            .collect();
        let mut json = serde_json::json!({
            "boot-source": {
                "kernel_image_path": self.kernel,
                "boot_args": self.boot_args,
            },
            "drives": drives,
            "machine-config": {
                "vcpu_count": self.vcpus,
                "mem_size_mib": self.memory_mib,
                "smt": false,
            },
        });
        if let Some(path) = &self.metrics {
            json["metrics"] = serde_json::json!({ "metrics_path": path });
        }
        json
    }
}

/// A started Firecracker. `child.stdout` is the guest's serial console
/// (piped; take it, or use [`Firecracker::capture_serial`]); stderr is
/// piped too. Killed on drop if still running.
pub struct Firecracker {
    pub child: Child,
    pub pid: u32,
    /// CLOCK_MONOTONIC (ns) read just before the spawn.
    pub spawned_ns: u64,
    /// Holds the config file and the log.
    dir: tempfile::TempDir,
}

/// Starts `binary` on `config`.
pub fn spawn(binary: &str, config: &Config) -> io::Result<Firecracker> {
    let dir = tempfile::tempdir()?;
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config.to_json().to_string())?;
    // Firecracker opens its log for appending; it must exist.
    let log_path = dir.path().join("firecracker.log");
    std::fs::write(&log_path, "")?;
    let mut cmd = Command::new(binary);
    cmd.arg("--no-api")
        .arg("--config-file")
        .arg(&config_path)
        .arg("--log-path")
        .arg(&log_path);
    if !config.seccomp {
        cmd.arg("--no-seccomp");
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let spawned_ns = monotonic_ns();
    let child = cmd.spawn()?;
    Ok(Firecracker {
        pid: child.id(),
        child,
        spawned_ns,
        dir,
    })
}

impl Firecracker {
    /// Firecracker's own log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("firecracker.log")
    }

    /// Reads the serial console in a thread (see [`SerialCapture`]).
    pub fn capture_serial(&mut self) -> SerialCapture {
        let stdout = self.child.stdout.take().expect("stdout taken once");
        SerialCapture::start(stdout, |_, _| {})
    }

    /// Firecracker's stderr (panics and argument errors), once it has exited.
    pub fn stderr(&mut self) -> String {
        let mut s = String::new();
        if let Some(mut e) = self.child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for Firecracker {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The serial console, read in a thread: the whole text and when its first
/// byte arrived (CLOCK_MONOTONIC, ns). `on_line` sees each line as it comes,
/// with its arrival time. Works for any VMM whose serial goes to a pipe.
pub struct SerialCapture {
    thread: JoinHandle<(String, Option<u64>)>,
}

impl SerialCapture {
    pub fn start(stdout: ChildStdout, mut on_line: impl FnMut(&str, u64) + Send + 'static) -> Self {
        let thread = std::thread::spawn(move || {
            let mut stdout = stdout;
            let mut text = String::new();
            let mut first_byte = None;
            let mut line = Vec::new();
            let mut buf = [0u8; 4096];
            // Raw reads (no BufReader): a read returns as soon as one byte
            // is there, so the first one dates the first byte.
            while let Ok(n @ 1..) = stdout.read(&mut buf) {
                let now = monotonic_ns();
                first_byte.get_or_insert(now);
                for &b in &buf[..n] {
                    line.push(b);
                    if b == b'\n' {
                        let s = String::from_utf8_lossy(&line);
                        on_line(&s, now);
                        text.push_str(&s);
                        line.clear();
                    }
                }
            }
            text.push_str(&String::from_utf8_lossy(&line));
            (text, first_byte)
        });
        Self { thread }
    }

    /// Waits for end of file: (text, first byte time).
    pub fn finish(self) -> (String, Option<u64>) {
        self.thread.join().unwrap_or_default()
    }
}

/// Whether `path` looks like a Firecracker binary (it answers `--version`).
pub fn check_binary(path: &Path) -> io::Result<String> {
    let out = Command::new(path).arg("--version").output()?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("")
        .to_string())
}
