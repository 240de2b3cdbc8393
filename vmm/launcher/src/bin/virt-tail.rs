//! `virt-tail`: the `guest-console-log` sidecar of the launcher pod (KubeVirt v1.9.0
//! `cmd/virt-tail`). It copies the serial console log, `…/virt-serial0-log`, to stdout line by
//! line as it grows, so `kubectl logs <pod> -c guest-console-log` shows the guest's console.
//!
//! What it does, as KubeVirt's does:
//! - follows the file from its start, waiting for it to appear, and keeps following across
//!   truncation (reads again from the start) and rotation (a new file at the path: the old
//!   one is read to its end first);
//! - prints complete lines only, each as it was written (a line longer than 64 KiB is cut);
//! - watches the console socket (the log path without `-log`): exits 1 when it has not
//!   appeared within `--socket-timeout` (20 s), and 0 once it is removed (the VM is gone);
//! - exits 0 when `<log>-sigTerm` is removed or `<log>-sigTerm-done` exists, and 1 when the
//!   log's directory does not exist within 3 s;
//! - exits 0 on SIGTERM or SIGINT (KubeVirt's reacts to SIGINT and dies of SIGTERM).
//!
//! Differences: before exiting it prints what is left in the file, an unfinished last line
//! included (KubeVirt's stops at once); unknown flags are refused (KubeVirt's ignores them).
//! The file and the socket are polled every 100 ms rather than watched with inotify: a poll
//! of one path survives rotation without re-arming watches, and costs a few system calls.

use clap::Parser;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use std::fs::File;
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "virt-tail",
    about = "Streams the VM's serial console log to stdout (the guest-console-log sidecar)"
)]
struct Args {
    /// Path of the log file to stream (required; KubeVirt's exits 1 without it).
    #[arg(long)]
    logfile: Option<PathBuf>,
    /// How long to wait for the console socket to appear (Go duration: 20s, 1m30s, 500ms).
    #[arg(long, default_value = "20s", value_parser = parse_go_duration)]
    socket_timeout: Duration,
}

/// How often the file, the socket and the signals are looked at.
const POLL: Duration = Duration::from_millis(100);
/// How long the log's directory may take to appear.
const DIR_TIMEOUT: Duration = Duration::from_secs(3);
/// A line longer than this is printed in pieces (memory stays bounded; the sidecar's limit
/// is 60 MB).
const MAX_LINE: usize = 64 * 1024;

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(log) = args.logfile.as_deref() else {
        eprintln!("virt-tail: --logfile must be given");
        return ExitCode::from(1);
    };
    match run(log, args.socket_timeout) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("virt-tail: {e}");
            ExitCode::from(1)
        }
    }
}

/// Why following ended.
#[derive(Debug, PartialEq, Eq)]
enum Stop {
    Signal(Signal),
    SocketRemoved,
    TermFile,
}

fn run(log: &Path, socket_timeout: Duration) -> std::io::Result<()> {
    // Signals are blocked and read from a signalfd between polls: no handler code runs.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;

    let dir = log.parent().unwrap_or(Path::new("/"));
    let start = Instant::now();
    while !dir.is_dir() {
        if let Some(signal) = pending_signal(&signals)? {
            eprintln!("virt-tail: {signal}");
            return Ok(());
        }
        if start.elapsed() > DIR_TIMEOUT {
            return Err(std::io::Error::other(format!(
                "{} is still not there",
                dir.display()
            )));
        }
        std::thread::sleep(POLL);
    }

    let log_text = log.as_os_str().to_string_lossy();
    let socket = PathBuf::from(log_text.strip_suffix("-log").unwrap_or(&log_text));
    let term_file = PathBuf::from(format!("{log_text}-sigTerm"));
    let term_done = PathBuf::from(format!("{log_text}-sigTerm-done"));
    let watch_start = Instant::now();
    let mut socket_seen = false;
    let mut term_file_seen = false;
    let mut follower = Follower::new(log.to_path_buf());
    let stdout = std::io::stdout();
    let mut out = stdout.lock();

    let stop = loop {
        follower.poll(&mut out)?;
        if let Some(signal) = pending_signal(&signals)? {
            break Stop::Signal(signal);
        }
        if term_done.exists() {
            break Stop::TermFile;
        }
        if term_file.exists() {
            term_file_seen = true;
        } else if term_file_seen {
            break Stop::TermFile;
        }
        if socket.exists() {
            socket_seen = true;
        } else if socket_seen {
            break Stop::SocketRemoved;
        } else if watch_start.elapsed() > socket_timeout {
            follower.finish(&mut out)?;
            return Err(std::io::Error::other(format!(
                "{} is still not there after {:?}",
                socket.display(),
                socket_timeout
            )));
        }
        std::thread::sleep(POLL);
    };
    follower.finish(&mut out)?;
    match stop {
        Stop::Signal(signal) => eprintln!("virt-tail: {signal}, exiting"),
        Stop::SocketRemoved => eprintln!("virt-tail: {} was removed", socket.display()),
        Stop::TermFile => eprintln!("virt-tail: termination file"),
    }
    Ok(())
}

fn pending_signal(signals: &SignalFd) -> std::io::Result<Option<Signal>> {
    Ok(signals
        .read_signal()?
        .and_then(|info| Signal::try_from(info.ssi_signo as i32).ok()))
}

/// Follows one path: the file there now, across truncation and replacement.
struct Follower {
    path: PathBuf,
    open: Option<Open>,
    /// The start of a line whose end has not been written yet.
    partial: Vec<u8>,
}

struct Open {
    file: File,
    /// Device and inode: a different pair at the path means the file was replaced.
    id: (u64, u64),
    offset: u64,
}

impl Follower {
    fn new(path: PathBuf) -> Self {
        Self {
            path,
            open: None,
            partial: Vec::new(),
        }
    }

    /// Prints what was appended since the last poll.
    fn poll(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let at_path = std::fs::metadata(&self.path)
            .ok()
            .map(|m| (m.dev(), m.ino()));
        if let Some(open) = &self.open
            && at_path.is_some_and(|id| id != open.id)
        {
            // Rotated: finish the old file, then start on the new one.
            self.read_to_end(out)?;
            self.flush_partial(out)?;
            self.open = None;
        }
        if self.open.is_none() {
            match File::open(&self.path) {
                Ok(file) => {
                    let meta = file.metadata()?;
                    self.open = Some(Open {
                        file,
                        id: (meta.dev(), meta.ino()),
                        offset: 0,
                    });
                }
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        if let Some(open) = &mut self.open
            && open.file.metadata()?.len() < open.offset
        {
            // Truncated: read again from the start.
            open.offset = open.file.seek(SeekFrom::Start(0))?;
            self.flush_partial(out)?;
        }
        self.read_to_end(out)
    }

    fn read_to_end(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        let Some(open) = &mut self.open else {
            return Ok(());
        };
        let mut buf = [0u8; 16 * 1024];
        loop {
            let n = match open.file.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            open.offset += n as u64;
            let mut rest = &buf[..n];
            while let Some(end) = rest.iter().position(|&b| b == b'\n') {
                self.partial.extend_from_slice(&rest[..end]);
                out.write_all(&self.partial)?;
                out.write_all(b"\n")?;
                self.partial.clear();
                rest = &rest[end + 1..];
            }
            self.partial.extend_from_slice(rest);
            while self.partial.len() >= MAX_LINE {
                let piece: Vec<u8> = self.partial.drain(..MAX_LINE).collect();
                out.write_all(&piece)?;
                out.write_all(b"\n")?;
            }
        }
        out.flush()
    }

    fn flush_partial(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        if !self.partial.is_empty() {
            out.write_all(&self.partial)?;
            out.write_all(b"\n")?;
            self.partial.clear();
        }
        out.flush()
    }

    /// Prints what is left, an unfinished last line included.
    fn finish(&mut self, out: &mut impl Write) -> std::io::Result<()> {
        self.poll(out)?;
        self.flush_partial(out)
    }
}

/// Go's `time.ParseDuration` for what a flag would hold: a sequence of decimal numbers with a
/// unit each (`ns`, `us`, `µs`, `ms`, `s`, `m`, `h`), e.g. `20s`, `1m30s`, `1.5s`, or `0`.
fn parse_go_duration(text: &str) -> Result<Duration, String> {
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let invalid = || format!("invalid duration {text:?}");
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(invalid());
    }
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let number: f64 = rest[..number_len].parse().map_err(|_| invalid())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(invalid()),
        };
        total += number * seconds;
        rest = &rest[unit_len..];
    }
    Duration::try_from_secs_f64(total).map_err(|_| invalid())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_parse() {
        assert_eq!(parse_go_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_go_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_go_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_go_duration("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_go_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "20", "s", "1x", "1..2s", "-1s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_are_printed_whole_across_reads_and_long_ones_in_pieces() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("virt-serial0-log");
        let mut follower = Follower::new(log.clone());
        let mut out = Vec::new();
        follower.poll(&mut out).unwrap();
        assert!(out.is_empty(), "no file yet");
        std::fs::write(&log, b"one\ntw").unwrap();
        follower.poll(&mut out).unwrap();
        assert_eq!(out, b"one\n");
        let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        file.write_all(b"o\r\n").unwrap();
        file.write_all(&vec![b'x'; MAX_LINE + 5]).unwrap();
        follower.poll(&mut out).unwrap();
        let mut expected = b"one\ntwo\r\n".to_vec();
        expected.extend(vec![b'x'; MAX_LINE]);
        expected.push(b'\n');
        assert_eq!(out, expected);
        follower.finish(&mut out).unwrap();
        expected.extend(b"xxxxx\n");
        assert_eq!(out, expected);
    }
}
