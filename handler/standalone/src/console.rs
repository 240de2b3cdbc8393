//! Prints a VMI's serial console: connects to the launcher's `virt-serial0` socket through
//! `/proc/<pid>/root` (as the handler's console endpoint does) and prints each line as
//! `[<ns>/<name>] console: <line>`, reconnecting while the launcher lives.
//!
//! The guest decides what the console carries, so what the handler holds for it is bounded:
//! a line is printed in pieces of at most [`MAX_LINE`] bytes, and only whether a console
//! showed the `--stop-after-console` text is kept, not the lines.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt};

use crate::store::say;
use handler::launchers::socket;

/// The longest piece of a console line printed at once (and held while it is read).
pub const MAX_LINE: usize = 4096;

/// Which consoles printed the `--stop-after-console` text.
#[derive(Default)]
pub struct ConsoleLines {
    /// The text looked for (`None`: nothing is looked for, nothing is kept).
    wanted: Option<String>,
    shown: Mutex<HashSet<String>>,
}

impl ConsoleLines {
    /// Looks for `wanted` in every console line.
    pub fn watching(wanted: Option<String>) -> Self {
        ConsoleLines {
            wanted: wanted.filter(|w| !w.is_empty()),
            shown: Mutex::new(HashSet::new()),
        }
    }

    pub fn push(&self, key: &str, line: &str) {
        if self.wanted.as_deref().is_some_and(|w| line.contains(w)) {
            self.shown
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(key.to_string());
        }
    }

    /// Whether `key`'s console printed a line containing the wanted text.
    pub fn has_shown(&self, key: &str) -> bool {
        self.shown
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }
}

/// The console socket of VMI `uid` in the launcher `pid`'s pod.
pub fn console_socket(pid: u32, uid: &str) -> std::io::Result<PathBuf> {
    socket::in_launcher(pid, &socket::serial_console_in_pod(uid))
}

/// Follows the console until the launcher is gone (`alive` returns false).
pub fn follow(
    key: String,
    pid: u32,
    uid: String,
    lines: Arc<ConsoleLines>,
    alive: impl Fn() -> bool + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while alive() {
            let connected = match console_socket(pid, &uid) {
                Ok(path) => socket::connect_async(&path).await,
                Err(e) => Err(e),
            };
            if let Ok(stream) = connected {
                print_lines(stream, &key, &lines, |line| {
                    say(&format!("[{key}] console: {line}"))
                })
                .await;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Hands each line of `stream` (without its end; a longer line in pieces of [`MAX_LINE`]
/// bytes) to `show` and to `lines`, until the stream ends.
async fn print_lines(
    stream: impl AsyncRead + Unpin,
    key: &str,
    lines: &ConsoleLines,
    mut show: impl FnMut(&str),
) {
    let mut reader = tokio::io::BufReader::new(stream);
    let mut buf = Vec::with_capacity(256);
    loop {
        buf.clear();
        match (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut buf)
            .await
        {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                // Guest bytes are untrusted: show them lossily, without the line end.
                let text = String::from_utf8_lossy(&buf);
                let line = text.trim_end_matches(['\r', '\n']);
                show(line);
                lines.push(key, line);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    /// A guest writing a long stretch without a newline: printed in bounded pieces, and
    /// nothing of it is kept.
    #[tokio::test]
    async fn console_lines_are_bounded() {
        let (mut guest, console) = tokio::net::UnixStream::pair().expect("pair");
        let writer = tokio::spawn(async move {
            guest.write_all(&vec![b'x'; 1 << 20]).await.expect("write");
            guest.write_all(b"\nlogin: ready\r\n").await.expect("write");
        });
        let lines = ConsoleLines::watching(Some("ready".into()));
        let mut longest = 0;
        let mut pieces = 0;
        let mut last = String::new();
        print_lines(console, "ns/v", &lines, |line| {
            longest = longest.max(line.len());
            pieces += 1;
            last = line.to_string();
        })
        .await;
        writer.await.expect("join");
        assert_eq!(longest, MAX_LINE);
        assert_eq!(pieces, (1 << 20) / MAX_LINE + 2);
        assert_eq!(last, "login: ready");
        assert!(lines.has_shown("ns/v"));
        assert!(!lines.has_shown("ns/other"));
        assert_eq!(lines.shown.lock().expect("lock").len(), 1);
    }
}
