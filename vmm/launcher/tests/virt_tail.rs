//! `virt-tail` and `container-disk` as the pod runs them: real files appended, truncated and
//! replaced, a real socket, real signals.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const VIRT_TAIL: &str = env!("CARGO_BIN_EXE_virt-tail");
const CONTAINER_DISK: &str = env!("CARGO_BIN_EXE_container-disk");
/// Generous: the machine is shared with builds.
const LIMIT: Duration = Duration::from_secs(30);

/// A running virt-tail whose stdout lines arrive on a channel.
struct Tail {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Tail {
    fn start(log: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(VIRT_TAIL)
            .arg("--logfile")
            .arg(log)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout: ChildStdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            // Split on `\n` only: a `\r` before it is part of the line as written.
            for line in BufReader::new(stdout).split(b'\n') {
                let Ok(line) = line else { return };
                if tx
                    .send(String::from_utf8_lossy(&line).into_owned())
                    .is_err()
                {
                    return;
                }
            }
        });
        Self { child, lines }
    }

    fn expect_lines(&self, expected: &[&str]) {
        for want in expected {
            let got = self
                .lines
                .recv_timeout(LIMIT)
                .unwrap_or_else(|_| panic!("no line {want:?} within {LIMIT:?}"));
            assert_eq!(&got, want);
        }
    }

    fn expect_silence(&self, how_long: Duration) {
        match self.lines.recv_timeout(how_long) {
            Ok(line) => panic!("unexpected line {line:?}"),
            Err(mpsc::RecvTimeoutError::Disconnected) => panic!("virt-tail closed its output"),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }

    fn wait(mut self) -> (Option<i32>, String, Vec<String>) {
        let start = Instant::now();
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(start.elapsed() < LIMIT, "virt-tail did not exit");
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut stderr = String::new();
        use std::io::Read;
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        // The reader thread ends (and the channel closes) at the end of stdout.
        let mut rest = Vec::new();
        while let Ok(line) = self.lines.recv_timeout(LIMIT) {
            rest.push(line);
        }
        (status.code(), stderr, rest)
    }

    /// Fails if virt-tail has exited.
    fn assert_running(&mut self) {
        let status = self.child.try_wait().unwrap();
        assert!(status.is_none(), "virt-tail exited: {status:?}");
    }

    fn signal(&self, signal: i32) {
        let pid = libc::pid_t::try_from(self.child.id()).expect("a Linux pid fits a pid_t");
        // SAFETY: signalling a child this test started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }
}

impl Drop for Tail {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `<dir>/virt-serial0-log` and its console socket `<dir>/virt-serial0`.
fn paths(dir: &Path) -> (PathBuf, PathBuf) {
    (dir.join("virt-serial0-log"), dir.join("virt-serial0"))
}

fn append(path: &Path, text: &str) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

#[test]
fn follows_appends_truncation_and_rotation_until_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    // The launcher creates the log's directory after the sidecar started: it waits.
    let private = dir.path().join("uid");
    let (log, _) = paths(&private);
    let mut tail = Tail::start(&log, &[]);
    tail.expect_silence(Duration::from_secs(4));
    tail.assert_running();
    std::fs::create_dir(&private).unwrap();
    // The file does not exist yet either.
    tail.expect_silence(Duration::from_millis(300));
    append(&log, "TEST serial PASS\nTEST idt ");
    tail.expect_lines(&["TEST serial PASS"]);
    // The rest of a line comes out once the line is complete.
    tail.expect_silence(Duration::from_millis(300));
    append(&log, "PASS\r\n");
    tail.expect_lines(&["TEST idt PASS\r"]);

    // Truncated (the launcher restarted the log): read again from the start.
    std::fs::write(&log, "").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    append(&log, "after truncation\n");
    tail.expect_lines(&["after truncation"]);

    // Rotated: the old file is finished, then the new one followed.
    let old = private.join("old-log");
    std::fs::rename(&log, &old).unwrap();
    append(&old, "last words of the old file\n");
    append(&log, "first line of the new file\n");
    tail.expect_lines(&["last words of the old file", "first line of the new file"]);

    // No console socket ever appears and the VM is long gone: it keeps following (a sidecar
    // that exits is restarted and prints everything again), until the pod stops it.
    append(&log, "DONE passed=6 failed=0");
    tail.expect_silence(Duration::from_secs(22));
    tail.assert_running();
    tail.signal(libc::SIGTERM);
    let (code, stderr, rest) = tail.wait();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(rest, ["DONE passed=6 failed=0"]);
}

#[test]
fn sigterm_and_sigint_end_it_with_status_zero() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let dir = tempfile::tempdir().unwrap();
        let (log, socket) = paths(dir.path());
        let _listener = UnixListener::bind(&socket).unwrap();
        append(&log, "booting\n");
        let tail = Tail::start(&log, &[]);
        tail.expect_lines(&["booting"]);
        tail.signal(signal);
        let (code, stderr, _) = tail.wait();
        assert_eq!(code, Some(0), "signal {signal}: {stderr}");
    }
}

#[test]
fn the_termination_files_end_it() {
    // `<log>-sigTerm` removed.
    let dir = tempfile::tempdir().unwrap();
    let (log, socket) = paths(dir.path());
    let _listener = UnixListener::bind(&socket).unwrap();
    let term = dir.path().join("virt-serial0-log-sigTerm");
    std::fs::write(&term, "").unwrap();
    let tail = Tail::start(&log, &[]);
    tail.expect_silence(Duration::from_millis(300));
    std::fs::remove_file(&term).unwrap();
    let (code, stderr, _) = tail.wait();
    assert_eq!(code, Some(0), "{stderr}");

    // `<log>-sigTerm-done` present.
    std::fs::write(dir.path().join("virt-serial0-log-sigTerm-done"), "").unwrap();
    let tail = Tail::start(&log, &[]);
    let (code, stderr, _) = tail.wait();
    assert_eq!(code, Some(0), "{stderr}");
}

#[test]
fn bad_invocations_are_refused() {
    let out = Command::new(VIRT_TAIL).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--logfile"));

    let out = Command::new(VIRT_TAIL)
        .args(["--logfile", "/x", "--no-such-flag"])
        .output()
        .unwrap();
    assert!(!out.status.success());
}

#[test]
fn container_disk_no_op_exits_zero_and_refuses_the_socket_mode() {
    let status = Command::new(CONTAINER_DISK)
        .arg("--no-op")
        .status()
        .unwrap();
    assert!(status.success());
    let out = Command::new(CONTAINER_DISK)
        .args(["--copy-path", "/var/run/x/disk_0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
    let out = Command::new(CONTAINER_DISK).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let out = Command::new(CONTAINER_DISK)
        .arg("--bogus")
        .output()
        .unwrap();
    assert!(!out.status.success());
}
