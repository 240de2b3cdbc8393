//! `virt-launcher-monitor`: PID 1 of the compute container.

fn main() -> std::process::ExitCode {
    let args = launcher::monitor::parse_args(std::env::args_os().skip(1));
    let code = launcher::monitor::run(args);
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
