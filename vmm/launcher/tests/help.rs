//! `--help` says what each program is for: the monitor's is its own, not the
//! launcher's it would otherwise pass the flag on to.

use std::process::Command;

fn help(binary: &str) -> String {
    let out = Command::new(binary)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success(), "{binary} --help: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8 help")
}

#[test]
fn monitor_and_launcher_each_explain_themselves() {
    let monitor = help(env!("CARGO_BIN_EXE_virt-launcher-monitor"));
    let launcher = help(env!("CARGO_BIN_EXE_virt-launcher"));
    assert!(
        monitor.starts_with("virt-launcher-monitor: PID 1"),
        "{monitor}"
    );
    assert!(monitor.contains("passed to virt-launcher"), "{monitor}");
    assert!(launcher.contains("Usage: virt-launcher"), "{launcher}");
    assert!(launcher.contains("cmd API"), "{launcher}");
    assert_ne!(monitor, launcher);
}
