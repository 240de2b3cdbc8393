//! The `vmm` command: parses arguments ([`args`]) and calls the libraries
//! (`vmm` for VMs, `block` through [`img`] for disk images).

mod args;
mod img;
mod selftest;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use args::{Cli, Command};
use clap::Parser;
use vmm::lifecycle::INTERNAL_ERROR_EXIT_STATUS;
use vmm::{Vm, VmHandle};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        // Colour only on a terminal: logs in files and pipes stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let status = match cli.command {
        Command::Run(args) => {
            let shutdown_timeout = Duration::from_secs(args.shutdown_timeout);
            run(args.into_config(), shutdown_timeout)
        }
        Command::TestGuest { output } => match std::fs::write(&output, test_guest::ELF) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("vmm: cannot write {}: {e}", output.display());
                1
            }
        },
        Command::Selftest(args) => selftest::run(&selftest::Options {
            vcpus: args.vcpus,
            verbose: args.verbose,
        }),
        Command::Cpuid { vcpus, cpu_profile } => match vmm::vm::cpuid_table(cpu_profile, vcpus) {
            Ok(table) => {
                print!("{table}");
                0
            }
            Err(e) => {
                eprintln!("vmm cpuid: {e}");
                1
            }
        },
        Command::Img(command) => match img::run(command) {
            Ok(status) => status,
            Err(e) => {
                eprintln!("vmm img: {e:#}");
                1
            }
        },
    };
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

fn run(config: vmm::VmConfig, shutdown_timeout: Duration) -> i32 {
    // Blocked before any VM thread exists, so every thread inherits the mask
    // and only the watcher below receives them.
    let signals = match block_termination_signals() {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("vmm: cannot block SIGTERM/SIGINT: {e}");
            return INTERNAL_ERROR_EXIT_STATUS;
        }
    };
    let handle = match Vm::start(config) {
        Ok(handle) => Arc::new(handle),
        Err(e) => {
            eprintln!("vmm: cannot start the VM: {e}");
            return INTERNAL_ERROR_EXIT_STATUS;
        }
    };
    let watched = handle.clone();
    let watcher = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || forward_termination_signals(&signals, &watched, shutdown_timeout));
    if let Err(e) = watcher {
        eprintln!("vmm: cannot watch for SIGTERM/SIGINT: {e}");
    }
    let exit = handle.wait();
    if std::env::var_os("VMM_TIMINGS").is_some() {
        eprintln!("{}", vmm::timing::report_line());
    }
    eprintln!("vmm: VM ended: {exit}");
    exit.exit_status()
}

fn block_termination_signals() -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use;
    // pthread_sigmask only changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(std::io::Error::from_raw_os_error(rc));
        }
        Ok(set)
    }
}

/// SIGTERM or SIGINT: the first asks the guest to shut down (the ACPI
/// power button; Linux powers off, which ends the VM) and gives it
/// `shutdown_timeout` to do so; the second, or the end of that time, kills it.
fn forward_termination_signals(
    set: &libc::sigset_t,
    vm: &Arc<VmHandle>,
    shutdown_timeout: Duration,
) {
    let mut asked = false;
    loop {
        let mut signal = 0;
        // SAFETY: `set` holds signals blocked in every thread; sigwait
        // writes the one received into `signal`.
        if unsafe { libc::sigwait(set, &mut signal) } != 0 || vm.exit().is_some() {
            return;
        }
        if asked {
            eprintln!("vmm: signal {signal} again: killing the VM");
            vm.kill();
            return;
        }
        eprintln!(
            "vmm: signal {signal}: asking the guest to shut down within {}s (again to kill)",
            shutdown_timeout.as_secs()
        );
        if vm.request_shutdown().is_err() {
            return;
        }
        asked = true;
        let deadline = Arc::clone(vm);
        let timer = std::thread::Builder::new()
            .name("shutdown-timeout".into())
            .spawn(move || stop_after(&deadline, shutdown_timeout));
        if let Err(e) = timer {
            eprintln!("vmm: cannot time the shutdown ({e}): killing the VM");
            vm.kill();
            return;
        }
    }
}

/// Kills the VM unless it ends within `timeout`: a guest that ignores the
/// request (one still in early boot, say) must not keep the VMM alive.
fn stop_after(vm: &VmHandle, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        if vm.exit().is_some() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if vm.exit().is_none() {
        eprintln!(
            "vmm: the guest did not shut down within {}s (--shutdown-timeout): stopping the VM",
            timeout.as_secs()
        );
        vm.kill();
    }
}
