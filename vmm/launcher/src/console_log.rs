//! The serial console log (`virt-serial0-log`): KubeVirt's `guest-console-log`
//! sidecar tails it. The VMM serves the console on a unix socket; the log is
//! simply one more client of that socket, appending what it reads, so the
//! VMM needs no second output path.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Copies the console at `socket` into `log` until the console closes.
pub fn start(socket: PathBuf, log: PathBuf) -> std::io::Result<()> {
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
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => file.write_all(&buf[..n])?,
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
