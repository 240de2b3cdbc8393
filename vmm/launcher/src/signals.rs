//! The stop signals KubeVirt's launcher reacts to: SIGTERM, SIGINT, SIGHUP, SIGQUIT.

use tokio::signal::unix::{SignalKind, signal};

/// Resolves at the first stop signal.
pub(crate) async fn stop_signal() -> std::io::Result<&'static str> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut quit = signal(SignalKind::quit())?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
        _ = hup.recv() => "SIGHUP",
        _ = quit.recv() => "SIGQUIT",
    })
}
