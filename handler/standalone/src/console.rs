//! Prints a VMI's serial console: connects to the launcher's `virt-serial0` socket through
//! `/proc/<pid>/root` (as the handler's console endpoint does) and prints each line as
//! `[<ns>/<name>] console: <line>`, reconnecting while the launcher lives.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncBufReadExt;

use crate::store::say;
use handler::launchers::socket;

/// Lines seen so far on each console, for `--stop-after-console`.
#[derive(Default)]
pub struct ConsoleLines {
    seen: Mutex<Vec<(String, String)>>,
}

impl ConsoleLines {
    pub fn push(&self, key: &str, line: &str) {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((key.to_string(), line.to_string()));
    }

    /// Whether `key`'s console printed a line containing `text`.
    pub fn contains(&self, key: &str, text: &str) -> bool {
        self.seen
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(k, l)| k == key && l.contains(text))
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
            let stream = match connected {
                Ok(s) => s,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut reader = tokio::io::BufReader::new(stream);
            let mut buf = Vec::new();
            loop {
                buf.clear();
                match reader.read_until(b'\n', &mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        // Guest bytes are untrusted: show them lossily, without the line end.
                        let text = String::from_utf8_lossy(&buf);
                        let line = text.trim_end_matches(['\r', '\n']);
                        say(&format!("[{key}] console: {line}"));
                        lines.push(&key, line);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}
