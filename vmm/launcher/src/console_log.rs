//! The serial console log (`virt-serial0-log`): KubeVirt's `guest-console-log`
//! sidecar tails it. The VMM serves the console on a unix socket; the log is
//! simply one more client of that socket, appending what it reads, so the
//! VMM needs no second output path.
//!
//! The guest decides how much it prints, so the log is bounded as libvirt's
//! virtlogd bounds KubeVirt's (its `virtlogd.conf` defaults, which KubeVirt
//! keeps): a file grows to [`MAX_SIZE`], then rotates by renaming —
//! `virt-serial0-log` becomes `virt-serial0-log.0`, `.0` becomes `.1`, ...,
//! and the oldest of [`MAX_BACKUPS`] is dropped — and a new, empty
//! `virt-serial0-log` is started. At most `MAX_SIZE × (1 + MAX_BACKUPS)` (8 MiB)
//! are ever on disk. A reader following the log (`virt-tail`) keeps its open
//! file across a rotation, reads it to its end, then opens the path again for
//! the new file; no file is ever truncated or rewritten.
//!
//! The console hangs up a client that falls behind, and the VM's console is
//! a new one after every guest reboot or reset: the log reconnects (with a
//! short backoff) for as long as the domain's VM runs; see [`follow`] for what
//! the console replays on a reconnect and what that means for the log.
//!
//! Hand-written rather than taken from a rotating-file crate: those number
//! backups from 1 (virtlogd from 0) and do not end files on a line boundary;
//! what is needed is a few renames.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The largest a log file grows before it rotates (virtlogd's `max_size`, 2 MiB).
pub(crate) const MAX_SIZE: u64 = 2 << 20;
/// How many rotated files are kept (virtlogd's `max_backups`).
pub(crate) const MAX_BACKUPS: usize = 3;
/// A file about to fill up ends at a newline found this close to its end, so a
/// line is not split across two files (as virtlogd does).
const LINE_SEARCH: usize = 80;

/// How long the first reconnect waits; each failed attempt doubles it, up to
/// [`RECONNECT_MAX`]. A connection that is made resets it.
const RECONNECT_FIRST: Duration = Duration::from_millis(50);
/// The longest wait between two connection attempts.
const RECONNECT_MAX: Duration = Duration::from_secs(1);

/// The console-log thread of one domain: it reconnects until this handle is
/// dropped (the domain's VM has ended for good, or the domain is deleted),
/// then ends at the console's next end of file.
pub(crate) struct ConsoleLog {
    stop: Arc<AtomicBool>,
    #[cfg_attr(not(test), allow(dead_code))]
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for ConsoleLog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Copies the console at `socket` into `log`, reconnecting whenever the
/// console hangs up, until the returned handle is dropped.
pub(crate) fn start(socket: PathBuf, log: PathBuf) -> std::io::Result<ConsoleLog> {
    let stop = Arc::new(AtomicBool::new(false));
    let stopped = stop.clone();
    let thread = std::thread::Builder::new()
        .name("console-log".into())
        .spawn(move || {
            let result = RotatingLog::open(&log, MAX_SIZE, MAX_BACKUPS)
                .and_then(|mut file| follow(&socket, |bytes| file.append(bytes), &stopped));
            if let Err(e) = result {
                tracing::warn!("console log {}: {e}", log.display());
            }
        })?;
    Ok(ConsoleLog {
        stop,
        thread: Some(thread),
    })
}

/// Appends what the console at `socket` sends, connection after connection,
/// until `stop` is set and the console hangs up (or cannot be reached).
///
/// The VMM hangs up a client that falls 64 KiB behind the output (a log on a
/// slow disk) and, on every new connection, first replays the newest 64 KiB
/// of output; a guest reboot starts a new console (the old one hangs up) whose
/// replay holds only the new boot's output. The replay therefore never
/// repeats what this client already appended: a client hung up for lagging
/// was more than the replay's 64 KiB behind, so its log jumps from what it had
/// read to the replay, and the output in between is lost (the console tells a
/// client neither how much it replays nor how much was skipped). The log
/// keeps the rest, in order, without duplicated lines.
fn follow(
    socket: &Path,
    mut append: impl FnMut(&[u8]) -> std::io::Result<()>,
    stop: &AtomicBool,
) -> std::io::Result<()> {
    let mut buf = [0u8; 4096];
    let mut wait = RECONNECT_FIRST;
    let mut connections = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let mut stream = match UnixStream::connect(socket) {
            Ok(stream) => stream,
            Err(e) => {
                // The VMM binds the socket while it builds the VM and binds it
                // anew when a reboot restarts it.
                tracing::debug!("console {}: {e}; retrying", socket.display());
                std::thread::sleep(wait);
                wait = (wait * 2).min(RECONNECT_MAX);
                continue;
            }
        };
        wait = RECONNECT_FIRST;
        connections += 1;
        if connections > 1 {
            tracing::info!("console log reconnected to {}", socket.display());
        }
        loop {
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => append(&buf[..n])?,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!("console {}: {e}", socket.display());
                    break;
                }
            }
        }
    }
    Ok(())
}

/// An append-only log file of bounded size with numbered backups (`<path>.0` newest).
pub(crate) struct RotatingLog {
    path: PathBuf,
    file: File,
    /// Bytes in the current file.
    len: u64,
    /// The current file ended on a line boundary short of `max_size`: rotate first.
    ended: bool,
    max_size: u64,
    backups: usize,
}

impl RotatingLog {
    /// Opens `path` for appending (a launcher restart continues the same file), rotating
    /// first if it is already full.
    pub(crate) fn open(path: &Path, max_size: u64, backups: usize) -> std::io::Result<Self> {
        let file = open_append(path)?;
        let len = file.metadata()?.len();
        Ok(RotatingLog {
            path: path.to_path_buf(),
            file,
            len,
            ended: false,
            max_size: max_size.max(1),
            backups,
        })
    }

    /// Appends `data`, rotating as often as the bound requires.
    pub(crate) fn append(&mut self, mut data: &[u8]) -> std::io::Result<()> {
        while !data.is_empty() {
            if self.ended || self.len >= self.max_size {
                self.rotate()?;
            }
            let room = usize::try_from(self.max_size - self.len).unwrap_or(usize::MAX);
            let mut take = data.len().min(room);
            if self.len + take as u64 >= self.max_size {
                // This write fills the file: end it after the last newline close to the end.
                if let Some(back) = data[..take]
                    .iter()
                    .rev()
                    .take(LINE_SEARCH)
                    .position(|&b| b == b'\n')
                {
                    take -= back;
                    self.ended = true;
                }
            }
            self.file.write_all(&data[..take])?;
            self.len += take as u64;
            data = &data[take..];
        }
        Ok(())
    }

    /// `<path>.N-2` → `<path>.N-1`, ..., `<path>` → `<path>.0`, then a new `<path>`.
    fn rotate(&mut self) -> std::io::Result<()> {
        if self.backups == 0 {
            ignore_missing(std::fs::remove_file(&self.path))?;
        } else {
            for i in (1..self.backups).rev() {
                ignore_missing(std::fs::rename(
                    backup(&self.path, i - 1),
                    backup(&self.path, i),
                ))?;
            }
            ignore_missing(std::fs::rename(&self.path, backup(&self.path, 0)))?;
        }
        self.file = open_append(&self.path)?;
        self.len = self.file.metadata()?.len();
        self.ended = false;
        Ok(())
    }
}

/// The name of backup `n` of `path` (`<path>.<n>`, 0 the newest).
pub(crate) fn backup(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Appends to `path`, created `0640` if missing; never through a link planted at the path.
fn open_append(path: &Path) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

fn ignore_missing(result: std::io::Result<()>) -> std::io::Result<()> {
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::net::UnixListener;

    /// Every file of the log, oldest first, and their contents joined.
    fn on_disk(path: &Path, backups: usize) -> (Vec<u64>, Vec<u8>) {
        let mut sizes = Vec::new();
        let mut all = Vec::new();
        let files = (0..backups)
            .rev()
            .map(|n| backup(path, n))
            .chain([path.to_path_buf()]);
        for file in files {
            if let Ok(bytes) = std::fs::read(&file) {
                sizes.push(bytes.len() as u64);
                all.extend(bytes);
            }
        }
        (sizes, all)
    }

    /// Lines of varying length, numbered, so order and loss show.
    fn lines(count: usize) -> Vec<u8> {
        (0..count)
            .flat_map(|i| format!("line {i} {}\n", "x".repeat(i % 60)).into_bytes())
            .collect()
    }

    #[test]
    fn writing_far_past_the_bound_keeps_the_newest_bytes_within_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("virt-serial0-log");
        let mut log = RotatingLog::open(&path, MAX_SIZE, MAX_BACKUPS).unwrap();
        let text = lines(400_000); // ~24 MiB, three times the bound
        for chunk in text.chunks(4096) {
            log.append(chunk).unwrap();
        }
        let (sizes, kept) = on_disk(&path, MAX_BACKUPS + 2);
        let bound = MAX_SIZE * (1 + MAX_BACKUPS as u64);
        assert_eq!(sizes.len(), 1 + MAX_BACKUPS, "{sizes:?}");
        assert!(sizes.iter().all(|&s| s <= MAX_SIZE), "{sizes:?}");
        assert!(kept.len() as u64 <= bound);
        // The rotated files are full (to a line end close to the bound).
        assert!(kept.len() as u64 > MAX_BACKUPS as u64 * (MAX_SIZE - LINE_SEARCH as u64));
        assert!(text.ends_with(&kept), "the newest bytes, in order");
        // Files end on line boundaries: each rotated file ends with a newline.
        for n in 0..MAX_BACKUPS {
            let bytes = std::fs::read(backup(&path, n)).unwrap();
            assert_eq!(bytes.last(), Some(&b'\n'), "backup {n}");
        }
    }

    #[test]
    fn a_line_longer_than_the_search_is_cut_at_the_bound() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = RotatingLog::open(&path, 100, 1).unwrap();
        log.append(&[b'a'; 250]).unwrap();
        assert_eq!(std::fs::read(backup(&path, 0)).unwrap(), vec![b'a'; 100]);
        assert_eq!(std::fs::read(&path).unwrap(), vec![b'a'; 50]);
        // Without backups the full file is dropped.
        let path = dir.path().join("none");
        let mut log = RotatingLog::open(&path, 10, 0).unwrap();
        log.append(b"0123456789abc").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert!(!backup(&path, 0).exists());
    }

    #[test]
    fn a_restarted_writer_continues_and_rotates_a_full_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        std::fs::write(&path, vec![b'o'; 100]).unwrap();
        let mut log = RotatingLog::open(&path, 100, 2).unwrap();
        log.append(b"new").unwrap();
        assert_eq!(std::fs::read(backup(&path, 0)).unwrap(), vec![b'o'; 100]);
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
    }

    #[test]
    fn a_link_planted_at_the_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let path = dir.path().join("log");
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        assert!(RotatingLog::open(&path, 100, 1).is_err());
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
    }

    /// A reader that follows the path as `virt-tail` does (keeps its open file; when a
    /// different file is at the path, reads the old one to its end, then opens the new one)
    /// sees every byte once, in order, across rotations.
    #[test]
    fn a_follower_reads_every_byte_across_rotations() {
        struct Follower {
            path: PathBuf,
            open: Option<(File, u64)>,
            seen: Vec<u8>,
        }
        impl Follower {
            fn poll(&mut self) {
                let at_path = std::fs::metadata(&self.path).ok().map(|m| m.ino());
                if let Some((file, _)) = &mut self.open {
                    file.read_to_end(&mut self.seen).unwrap();
                }
                if self.open.as_ref().map(|(_, ino)| Some(*ino)) != Some(at_path)
                    && let Some(ino) = at_path
                {
                    let mut file = File::open(&self.path).unwrap();
                    file.read_to_end(&mut self.seen).unwrap();
                    self.open = Some((file, ino));
                }
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("log");
        let mut log = RotatingLog::open(&path, 1000, 3).unwrap();
        let mut follower = Follower {
            path: path.clone(),
            open: None,
            seen: Vec::new(),
        };
        let text = lines(2000);
        let mut rotations_seen = 0;
        for chunk in text.chunks(300) {
            let before = std::fs::metadata(&path).map(|m| m.ino()).ok();
            log.append(chunk).unwrap();
            rotations_seen += usize::from(std::fs::metadata(&path).map(|m| m.ino()).ok() != before);
            follower.poll();
        }
        assert!(rotations_seen > 50, "{rotations_seen}");
        assert_eq!(follower.seen, text);
    }

    /// The console writer fed through a real socket far past the bound.
    #[test]
    fn the_console_copy_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("virt-serial0");
        let path = dir.path().join("virt-serial0-log");
        let listener = UnixListener::bind(&socket).unwrap();
        let text = lines(300_000); // ~18 MiB
        let stop = Arc::new(AtomicBool::new(false));
        let feeder = {
            let text = text.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let (mut guest, _) = listener.accept().unwrap();
                guest.write_all(&text).unwrap();
                // The VM ended for good: no reconnect after this end of file.
                stop.store(true, Ordering::SeqCst);
            })
        };
        let mut log = RotatingLog::open(&path, MAX_SIZE, MAX_BACKUPS).unwrap();
        follow(&socket, |bytes| log.append(bytes), &stop).unwrap();
        feeder.join().unwrap();
        let (sizes, kept) = on_disk(&path, MAX_BACKUPS + 2);
        assert!(sizes.iter().all(|&s| s <= MAX_SIZE), "{sizes:?}");
        assert!(kept.len() as u64 <= MAX_SIZE * (1 + MAX_BACKUPS as u64));
        assert!(text.ends_with(&kept));
    }

    /// Whether `thread` ends within `timeout` (a hung thread fails a test
    /// rather than hanging it).
    fn ended_within<T>(thread: &std::thread::JoinHandle<T>, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        while !thread.is_finished() {
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// The next connection to `listener`, if one comes within `timeout`.
    fn accept_within(listener: &UnixListener, timeout: Duration) -> Option<UnixStream> {
        listener.set_nonblocking(true).unwrap();
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match listener.accept() {
                Ok((stream, _)) => {
                    stream.set_nonblocking(false).unwrap();
                    return Some(stream);
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if std::time::Instant::now() >= deadline {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// The VMM console's replay to a new client: the newest 64 KiB of output
    /// (`vmm/src/devices/legacy/serial.rs`, `BACKLOG_BYTES`).
    const REPLAY: usize = 64 * 1024;

    /// A log writer that blocks (a stalled disk) makes the console hang the
    /// client up, as the VMM's console does to a client that falls behind; the
    /// log goes on after the reconnect, with the replay and then new output,
    /// no line twice, and the thread ends once stopped and hung up.
    #[test]
    fn the_log_goes_on_after_the_console_hangs_up() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("virt-serial0");
        let path = dir.path().join("virt-serial0-log");
        let listener = UnixListener::bind(&socket).unwrap();
        let (unblock, blocked) = std::sync::mpsc::channel::<()>();
        let mut blocked = Some(blocked);
        let mut log = RotatingLog::open(&path, MAX_SIZE, MAX_BACKUPS).unwrap();
        let client = {
            let socket = socket.clone();
            let stop = Arc::new(AtomicBool::new(false));
            let stopped = stop.clone();
            let thread = std::thread::spawn(move || {
                follow(
                    &socket,
                    |bytes| {
                        // The first write stalls until the console has hung up.
                        if let Some(gate) = blocked.take() {
                            gate.recv().unwrap();
                        }
                        log.append(bytes)
                    },
                    &stopped,
                )
            });
            (stop, thread)
        };

        // The console writes without blocking until the stalled client's
        // socket is full, then hangs up (shutdown, not just a close).
        let mut numbered = (0..).map(|i| format!("line {i} {}\n", "x".repeat(i % 60)).into_bytes());
        let mut output = Vec::new();
        let (first, _) = listener.accept().unwrap();
        first.set_nonblocking(true).unwrap();
        let mut sent = 0;
        'fill: loop {
            output.extend(numbered.next().unwrap());
            while sent < output.len() {
                match (&first).write(&output[sent..]) {
                    Ok(n) => sent += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break 'fill,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        first.shutdown(std::net::Shutdown::Both).unwrap();
        // It was hung up for lagging: more than the replay behind by now.
        while output.len() - sent <= REPLAY + 1000 {
            output.extend(numbered.next().unwrap());
        }
        unblock.send(()).unwrap();

        // The reconnect gets the replay, then new output.
        let mut second = accept_within(&listener, Duration::from_secs(60))
            .expect("no reconnect after the hang-up");
        let replay = output[output.len() - REPLAY..].to_vec();
        second.write_all(&replay).unwrap();
        let mut after = Vec::new();
        for _ in 0..1000 {
            after.extend(numbered.next().unwrap());
        }
        second.write_all(&after).unwrap();
        let expected = [&output[..sent], &replay, &after].concat();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while std::fs::read(&path).unwrap().len() < expected.len() {
            assert!(
                std::time::Instant::now() < deadline,
                "the log stopped at {} of {} bytes: no reconnect after the hang-up",
                std::fs::read(&path).unwrap().len(),
                expected.len()
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        // The VM ended: stop, hang up; the client ends without reconnecting.
        let (stop, thread) = client;
        stop.store(true, Ordering::SeqCst);
        second.shutdown(std::net::Shutdown::Both).unwrap();
        assert!(
            ended_within(&thread, Duration::from_secs(10)),
            "still following after the stop"
        );
        thread.join().unwrap().unwrap();
        assert!(
            accept_within(&listener, Duration::ZERO).is_none(),
            "reconnected after the stop"
        );

        let logged = std::fs::read(&path).unwrap();
        assert_eq!(logged.len(), expected.len());
        assert!(
            logged == expected,
            "the log is what the console sent, in order"
        );
        // No line twice: the numbers of the whole lines only grow.
        let numbers: Vec<u64> = String::from_utf8(logged)
            .unwrap()
            .lines()
            .filter_map(|l| {
                // Whole lines only (the hang-up and the replay cut lines).
                let (n, xs) = l.strip_prefix("line ")?.split_once(' ')?;
                let n: u64 = n.parse().ok()?;
                (xs.len() as u64 == n % 60 && xs.bytes().all(|b| b == b'x')).then_some(n)
            })
            .collect();
        assert!(numbers.len() > 2000, "{}", numbers.len());
        assert!(numbers.windows(2).all(|w| w[0] < w[1]), "a line repeated");
    }

    /// The handle stops the thread: dropped while the console is unreachable
    /// (the VM ended and its socket is gone), the thread ends within the
    /// bounded backoff.
    #[test]
    fn a_dropped_handle_ends_the_reconnects() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = start(dir.path().join("absent"), dir.path().join("log")).unwrap();
        std::thread::sleep(RECONNECT_MAX * 2);
        assert!(
            !log.thread.as_ref().unwrap().is_finished(),
            "gave up while the VM runs"
        );
        let thread = log.thread.take().unwrap();
        drop(log);
        assert!(
            ended_within(&thread, RECONNECT_MAX + Duration::from_secs(5)),
            "still reconnecting after the handle was dropped"
        );
    }
}
