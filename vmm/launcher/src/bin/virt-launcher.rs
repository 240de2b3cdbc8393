//! `virt-launcher`: runs one VMI's VM and serves KubeVirt's cmd API.

use clap::Parser;

fn main() -> std::process::ExitCode {
    one_malloc_arena();
    let flags = launcher::flags::Flags::parse();
    // Before any other thread exists: every thread inherits the filter.
    let sandbox = match launcher::sandbox::from_env() {
        Ok(sandbox) => sandbox,
        Err(e) => {
            eprintln!("virt-launcher: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    if let Err(e) = vmm::sandbox::apply_host_denylist(sandbox.seccomp) {
        eprintln!("virt-launcher: cannot install the seccomp filter: {e}");
        return std::process::ExitCode::from(1);
    }
    let default_level = if flags.verbosity >= 4 {
        "debug"
    } else {
        "info"
    };
    let filter = std::env::var("VIRT_LAUNCHER_LOG_VERBOSITY")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .map(|v| if v >= 4 { "debug" } else { "info" })
        .unwrap_or(default_level);
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // fatfs warns about FAT layouts other implementations might not read
                // (a boot disk's EFI system partition): nothing to act on here.
                .unwrap_or_else(|_| {
                    tracing_subscriber::EnvFilter::new(format!("{filter},fatfs=error"))
                }),
        )
        // Colour only on a terminal: logs in files and pipes stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // One thread for the cmd server, the notifier and the timers of one VM:
    // the VM's work runs on its own threads and manager calls on the
    // blocking pool (`spawn_blocking`), so no async task blocks. Worker
    // threads would only add stacks and malloc arenas
    // (vmm/launcher/docs/memory.md).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("virt-launcher: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(1);
        }
    };
    let code = runtime.block_on(launcher::run::run(flags, sandbox));
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// One glibc malloc arena for the whole process, set before any thread
/// exists. glibc gives each thread that allocates its own arena (up to 8 per
/// core), each with resident pages of its own; the launcher's threads (vCPU,
/// devices, console, blocking pool) allocate little and rarely, so they
/// share the main one (vmm/launcher/docs/memory.md has the numbers).
fn one_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; no thread but this
    // one exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}
