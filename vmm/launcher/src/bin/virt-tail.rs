//! `virt-tail`: the `guest-console-log` sidecar of the launcher pod (KubeVirt v1.9.0
//! `cmd/virt-tail`). It copies the serial console log, `…/virt-serial0-log`, to stdout line by
//! line as it grows, so `kubectl logs <pod> -c guest-console-log` shows the guest's console.
//!
//! What it does, as KubeVirt's does:
//! - follows the file from its start, waiting for it (and its directory, which the launcher
//!   creates after this sidecar started) to appear, for as long as it runs, and keeps
//!   following across truncation (reads again from the start) and rotation (a new file at
//!   the path: the old one is read to its end first);
//! - prints complete lines only, each as it was written (a line longer than 64 KiB is cut);
//! - exits 0 on SIGTERM or SIGINT, and only then: the pod restarts a sidecar that exits
//!   (`restartPolicy: Always`), and a restarted one prints the whole log again. A VM that is
//!   slow to start, or that has stopped, is no reason to exit (KubeVirt's earlier virt-tail
//!   left when the console socket did not appear within 20 s or went away; on a real node
//!   that made the sidecar crash-loop while the VMI waited for its node, and v1.9.0's follows
//!   the file until it is stopped).
//!
//! Differences: before exiting it prints what is left in the file, an unfinished last line
//! included (KubeVirt's stops at once); unknown flags are refused (KubeVirt's ignores them);
//! `<log>-sigTerm` removed or `<log>-sigTerm-done` present end it with status 0 (as the
//! earlier virt-tail did; nothing in this project writes them).
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
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "virt-tail",
    about = "Streams the VM's serial console log to stdout (the guest-console-log sidecar)"
)]
struct Args {
    /// Path of the log file to stream (required; KubeVirt's exits 1 without it).
    #[arg(long)]
    logfile: Option<PathBuf>,
}

/// How often the file, the socket and the signals are looked at.
const POLL: Duration = Duration::from_millis(100);
/// A line longer than this is printed in pieces (memory stays bounded; the sidecar's limit
/// is 60 MB).
const MAX_LINE: usize = 64 * 1024;

fn main() -> ExitCode {
    let args = Args::parse();
    let Some(log) = args.logfile.as_deref() else {
        eprintln!("virt-tail: --logfile must be given");
        return ExitCode::from(1);
    };
    match run(log) {
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
    TermFile,
}

fn run(log: &Path) -> std::io::Result<()> {
    // Signals are blocked and read from a signalfd between polls: no handler code runs.
    let mut mask = SigSet::empty();
    mask.add(Signal::SIGTERM);
    mask.add(Signal::SIGINT);
    mask.thread_block()?;
    let signals = SignalFd::with_flags(&mask, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)?;

    let log_text = log.as_os_str().to_string_lossy();
    let term_file = PathBuf::from(format!("{log_text}-sigTerm"));
    let term_done = PathBuf::from(format!("{log_text}-sigTerm-done"));
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
        std::thread::sleep(POLL);
    };
    follower.finish(&mut out)?;
    match stop {
        Stop::Signal(signal) => eprintln!("virt-tail: {signal}, exiting"),
        Stop::TermFile => eprintln!("virt-tail: termination file"),
    }
    Ok(())
}

fn pending_signal(signals: &SignalFd) -> std::io::Result<Option<Signal>> {
    Ok(signals
        .read_signal()?
        .and_then(|info| i32::try_from(info.ssi_signo).ok())
        .and_then(|signo| Signal::try_from(signo).ok()))
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

#[cfg(test)]
mod tests {
    use super::*;

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
