//! The `vmm` command: parses arguments ([`args`]) and calls the libraries
//! (`vmm` for VMs, `block` through [`img`] for disk images).

mod args;
mod img;
mod selftest;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use args::{Cli, Command};
use clap::Parser;
use vmm::lifecycle::INTERNAL_ERROR_EXIT_STATUS;
use vmm::sandbox::ThreadKind;
use vmm::{Vm, VmHandle};

fn main() -> ExitCode {
    // One malloc arena: the VM's threads allocate little, and an arena of
    // their own costs each of them its touched heap pages (the short-lived
    // CPUID thread's alone added about 120 KiB to the peak RSS).
    // SAFETY: mallopt only sets an allocator parameter; called before any
    // other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // fatfs warns about FAT layouts other implementations might not read
                // (a boot disk's EFI system partition): nothing to act on here.
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,fatfs=error")),
        )
        // Colour only on a terminal: logs in files and pipes stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let status = match cli.command {
        Command::Run(args) => {
            let shutdown_timeout = Duration::from_secs(args.shutdown_timeout);
            match args.into_config() {
                Ok(config) => run(config, shutdown_timeout),
                Err(e) => {
                    eprintln!("vmm run: {e}");
                    2
                }
            }
        }
        Command::TestGuest(args) => test_guest_command(&args),
        Command::Selftest(args) => selftest::run(&selftest::Options {
            vcpus: args.vcpus,
            verbose: args.verbose,
            seccomp: args.seccomp,
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
    if let Some(report) = handle.boot_report() {
        eprintln!(
            "vmm: booting disk {} ({}): {}",
            report.disk,
            report.firmware.name(),
            report.describe()
        );
        eprintln!("vmm: command line: {}", report.cmdline);
    }
    let watched = handle.clone();
    let watcher = std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Err(e) = watched.sandbox().enter(ThreadKind::Control) {
                eprintln!("vmm: cannot sandbox the signal watcher, stopping the VM: {e}");
                watched.kill();
                return;
            }
            forward_termination_signals(&signals, &watched, shutdown_timeout)
        });
    if let Err(e) = watcher {
        eprintln!("vmm: cannot watch for SIGTERM/SIGINT: {e}");
    }
    // From here on this thread only waits for the VM and reports.
    if let Err(e) = handle.sandbox().enter(ThreadKind::Control) {
        eprintln!("vmm: cannot sandbox the main thread, stopping the VM: {e}");
        handle.kill();
        handle.wait();
        return INTERNAL_ERROR_EXIT_STATUS;
    }
    let exit = handle.wait();
    if std::env::var_os("VMM_TIMINGS").is_some() {
        eprintln!("{}", handle.timeline().report_line());
    }
    if std::env::var_os("VMM_STATS").is_some() {
        for (index, disk) in handle.stats().disks.iter().enumerate() {
            eprintln!("{}", disk_stats_line(index, disk));
        }
    }
    eprintln!("vmm: VM ended: {exit}");
    exit.exit_status()
}

/// `vmm test-guest`: the guest's ELF, or a bootable disk image holding it.
fn test_guest_command(args: &args::TestGuestArgs) -> i32 {
    let result = match (&args.output, &args.disk) {
        (_, Some(disk)) => test_guest::disks::write_boot_disk(
            disk,
            args.layout,
            &test_guest::disks::Kernel {
                image: test_guest::ELF,
                initrd: None,
                cmdline: &args.cmdline,
            },
        )
        .map(|built| {
            eprintln!(
                "vmm test-guest: {} ({} layout): kernel {} on partition {}, command line {:?}",
                disk.display(),
                args.layout.name(),
                built.kernel_path,
                built.kernel_partition,
                built.cmdline
            );
        }),
        (Some(output), None) => std::fs::write(output, test_guest::ELF),
        (None, None) => Ok(()),
    };
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("vmm test-guest: {e}");
            1
        }
    }
}

/// `VMM_STATS disk=N rd_reqs=.. rd_bytes=.. wr_reqs=.. wr_bytes=.. fl_reqs=..
/// errors=.. rd_total_ns=.. wr_total_ns=..`: what a disk's device counted
/// (printed at the end with `VMM_STATS=1`, for the guest I/O benchmark).
fn disk_stats_line(index: usize, c: &vmm::stats::BlockCounts) -> String {
    format!(
        "VMM_STATS disk={index} rd_reqs={} rd_bytes={} wr_reqs={} wr_bytes={} fl_reqs={} errors={} rd_total_ns={} wr_total_ns={}",
        c.rd_reqs,
        c.rd_bytes,
        c.wr_reqs,
        c.wr_bytes,
        c.fl_reqs,
        c.errors,
        c.rd_total_ns,
        c.wr_total_ns
    )
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

/// Waits for a signal of `set`, at most until `deadline` (forever without
/// one). `None` when the deadline passed.
fn wait_signal(set: &libc::sigset_t, deadline: Option<Instant>) -> Option<i32> {
    loop {
        let timeout = deadline.map(|d| {
            let left = d.saturating_duration_since(Instant::now());
            libc::timespec {
                tv_sec: libc::time_t::try_from(left.as_secs()).unwrap_or(libc::time_t::MAX),
                tv_nsec: libc::c_long::from(left.subsec_nanos()),
            }
        });
        let timeout_ptr = timeout
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: `set` holds signals blocked in every thread; the kernel
        // fills no siginfo (null) and reads the timeout if given.
        let signal = unsafe { libc::sigtimedwait(set, std::ptr::null_mut(), timeout_ptr) };
        if signal > 0 {
            return Some(signal);
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => continue,
            _ => return None,
        }
    }
}

/// SIGTERM or SIGINT: the first asks the guest to shut down (the ACPI
/// power button; Linux powers off, which ends the VM) and gives it
/// `shutdown_timeout` to do so (a guest still in early boot may ignore the
/// request and must not keep the VMM alive); the second, or the end of that
/// time, kills it. One thread, no timer thread: it runs in the control
/// threads' sandbox.
fn forward_termination_signals(
    set: &libc::sigset_t,
    vm: &Arc<VmHandle>,
    shutdown_timeout: Duration,
) {
    let Some(signal) = wait_signal(set, None) else {
        return;
    };
    if vm.exit().is_some() {
        return;
    }
    eprintln!(
        "vmm: signal {signal}: asking the guest to shut down within {}s (again to kill)",
        shutdown_timeout.as_secs()
    );
    if vm.request_shutdown().is_err() {
        return;
    }
    let deadline = Instant::now() + shutdown_timeout;
    match wait_signal(set, Some(deadline)) {
        Some(signal) => {
            if vm.exit().is_none() {
                eprintln!("vmm: signal {signal} again: killing the VM");
                vm.kill();
            }
        }
        None => {
            if vm.exit().is_none() {
                eprintln!(
                    "vmm: the guest did not shut down within {}s (--shutdown-timeout): stopping the VM",
                    shutdown_timeout.as_secs()
                );
                vm.kill();
            }
        }
    }
}
