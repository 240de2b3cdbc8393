//! `virt-launcher-monitor`: PID 1 of the compute container.

const HELP: &str = "\
virt-launcher-monitor: PID 1 of a KubeVirt launcher pod's compute container.

It starts virt-launcher with the same arguments and exits with its status,
forwards SIGTERM, SIGINT and SIGQUIT to it as SIGTERM, reaps orphaned
processes, passes CAP_NET_BIND_SERVICE on to it as an ambient capability (the
guest's DHCP server binds port 67), and removes the container-disk sockets
when it ends, as KubeVirt's monitor does.

Usage: virt-launcher-monitor [MONITOR FLAGS] [VIRT-LAUNCHER FLAGS]

Monitor flags:
  --keep-after-failure      keep the container running after virt-launcher failed
                            (KubeVirt's debug knob); not passed on
  --container-disk-dir DIR  where the container-disk sockets are (also passed on)
  -h, --help                this text; `virt-launcher --help` lists the rest

Every other flag is passed to virt-launcher ($VIRT_LAUNCHER_BINARY, else next
to this program, else /usr/bin/virt-launcher).
";

fn main() -> std::process::ExitCode {
    if std::env::args_os()
        .skip(1)
        .any(|a| a == "--help" || a == "-h")
    {
        print!("{HELP}");
        return std::process::ExitCode::SUCCESS;
    }
    let args = launcher::monitor::parse_args(std::env::args_os().skip(1));
    let code = launcher::monitor::run(args);
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(1))
}
