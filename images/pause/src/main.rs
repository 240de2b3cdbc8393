//! `/pause`: the process that holds a pod sandbox's namespaces, as the kubelet's pause image
//! (`kubernetes/build/pause/linux/pause.c`) does.
//!
//! It blocks SIGINT, SIGTERM and SIGCHLD and waits for them synchronously: SIGCHLD reaps every
//! exited child (with a shared PID namespace, pause is PID 1 and inherits the pod's orphans),
//! SIGINT or SIGTERM ends it with status 0. `-v` prints the version; other arguments are
//! ignored, as pause.c ignores them. Signals are taken with `sigwait`, not a handler, so
//! nothing runs in signal context.

use nix::errno::Errno;
use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [flag] = args.as_slice()
        && flag.eq_ignore_ascii_case("-v")
    {
        println!("pause.rs {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    if std::process::id() != 1 {
        eprintln!("Warning: pause should be the first process");
    }
    let mut signals = SigSet::empty();
    for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGCHLD] {
        signals.add(signal);
    }
    if let Err(e) = signals.thread_block() {
        eprintln!("pause: blocking signals: {e}");
        return ExitCode::from(1);
    }
    loop {
        match signals.wait() {
            Ok(Signal::SIGCHLD) => reap_children(),
            Ok(signal) => {
                eprintln!("Shutting down, got signal: {signal}");
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("pause: sigwait: {e}");
                return ExitCode::from(1);
            }
        }
    }
}

/// Collects every child that has exited (one SIGCHLD may stand for several).
fn reap_children() {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("pause: waitpid: {e}");
                return;
            }
        }
    }
}
