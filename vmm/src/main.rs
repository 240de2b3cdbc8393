//! The `vmm` command: parses arguments (crate::cli) and calls the library.

use std::process::ExitCode;

use clap::Parser;
use vmm::cli::{Cli, Command};
use vmm::lifecycle::INTERNAL_ERROR_EXIT_STATUS;
use vmm::{Vm, selftest, test_guest};

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cli = Cli::parse();
    let status = match cli.command {
        Command::Run(args) => run(args.into_config()),
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
        Command::Img(command) => match block::img::run(command) {
            Ok(status) => status,
            Err(e) => {
                eprintln!("vmm img: {e:#}");
                1
            }
        },
    };
    ExitCode::from(u8::try_from(status).unwrap_or(1))
}

fn run(config: vmm::VmConfig) -> i32 {
    let handle = match Vm::start(config) {
        Ok(handle) => handle,
        Err(e) => {
            eprintln!("vmm: cannot start the VM: {e}");
            return INTERNAL_ERROR_EXIT_STATUS;
        }
    };
    let exit = handle.wait();
    if std::env::var_os("VMM_TIMINGS").is_some() {
        eprintln!("{}", vmm::timing::report_line());
    }
    eprintln!("vmm: VM ended: {exit}");
    exit.exit_status()
}
