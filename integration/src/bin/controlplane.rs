//! Runs the integration control plane until stdin closes or Ctrl-C, for manual experiments
//! (`cargo run -p integration --bin controlplane`, then `kubectl --kubeconfig <path>`) and for
//! the tests that check nothing outlives a test process.
//!
//! Prints `key=value` lines (`apiserver`, `kubeconfig`, `data_dir`, `pids`, `startup_ms`), then
//! `ready`. Exits through `std::process::exit`, as the test harness does, so the at-exit
//! cleanup of the shared instance is what stops the servers.

use std::io::{BufRead, Write};

use integration::controlplane;

fn main() {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("controlplane: cannot start a Tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    let control_plane = match runtime.block_on(controlplane::shared()) {
        Ok(control_plane) => control_plane,
        Err(e) => {
            eprintln!("controlplane: {e:#}");
            std::process::exit(1);
        }
    };
    let pids: Vec<String> = control_plane
        .process_ids()
        .iter()
        .map(u32::to_string)
        .collect();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "apiserver={}", control_plane.apiserver_url());
    let _ = writeln!(
        out,
        "kubeconfig={}",
        control_plane.kubeconfig_path().display()
    );
    let _ = writeln!(out, "data_dir={}", control_plane.data_dir().display());
    let _ = writeln!(out, "pids={}", pids.join(","));
    let _ = writeln!(
        out,
        "startup_ms={}",
        control_plane.startup_time().as_millis()
    );
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);

    runtime.spawn(async {
        let _ = tokio::signal::ctrl_c().await;
        std::process::exit(0);
    });
    // Until stdin reaches end of file (or fails).
    for line in std::io::stdin().lock().lines() {
        if line.is_err() {
            break;
        }
    }
    std::process::exit(0);
}
