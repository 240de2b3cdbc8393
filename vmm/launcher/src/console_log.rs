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
//! Hand-written rather than taken from a rotating-file crate: those number
//! backups from 1 (virtlogd from 0) and do not end files on a line boundary;
//! what is needed is a few renames.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The largest a log file grows before it rotates (virtlogd's `max_size`, 2 MiB).
pub(crate) const MAX_SIZE: u64 = 2 << 20;
/// How many rotated files are kept (virtlogd's `max_backups`).
pub(crate) const MAX_BACKUPS: usize = 3;
/// A file about to fill up ends at a newline found this close to its end, so a
/// line is not split across two files (as virtlogd does).
const LINE_SEARCH: usize = 80;

/// Copies the console at `socket` into `log` until the console closes.
pub(crate) fn start(socket: PathBuf, log: PathBuf) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("console-log".into())
        .spawn(move || {
            if let Err(e) = copy(&socket, &log) {
                tracing::warn!("console log {}: {e}", log.display());
            }
        })?;
    Ok(())
}

fn copy(socket: &Path, log: &Path) -> std::io::Result<()> {
    let mut stream = connect(socket)?;
    let mut file = RotatingLog::open(log, MAX_SIZE, MAX_BACKUPS)?;
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => file.append(&buf[..n])?,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
}

/// The VMM binds the socket while it builds the VM; allow it a moment.
fn connect(socket: &Path) -> std::io::Result<UnixStream> {
    let mut last = None;
    for _ in 0..50 {
        match UnixStream::connect(socket) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last.unwrap_or_else(|| std::io::Error::other("console socket never appeared")))
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
        let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        let text = lines(300_000); // ~18 MiB
        let feeder = {
            let text = text.clone();
            std::thread::spawn(move || {
                let (mut guest, _) = listener.accept().unwrap();
                guest.write_all(&text).unwrap();
            })
        };
        copy(&socket, &path).unwrap();
        feeder.join().unwrap();
        let (sizes, kept) = on_disk(&path, MAX_BACKUPS + 2);
        assert!(sizes.iter().all(|&s| s <= MAX_SIZE), "{sizes:?}");
        assert!(kept.len() as u64 <= MAX_SIZE * (1 + MAX_BACKUPS as u64));
        assert!(text.ends_with(&kept));
    }
}
