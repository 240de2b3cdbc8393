//! The launcher called from a second, independent gRPC implementation:
//! Python `grpcio` (gRPC's C core), with stubs generated from our protos.
//! The C core sends the percent-encoded socket path as `:authority`, which
//! h2 used to answer with `RST_STREAM(PROTOCOL_ERROR)` (see
//! `vendor/h2/PATCHED.md`); grpc-go, KubeVirt's server, accepts it.
//!
//! `scripts/setup.sh` installs grpcio into
//! `~/.cache/kubevirt-rs/grpc-venv`; `KUBEVIRT_RS_GRPC_PYTHON` names
//! another interpreter. Without one the test fails, it never skips.

mod common;

use common::*;
use std::path::PathBuf;

fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("KUBEVIRT_RS_GRPC_PYTHON") {
        return p.into();
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME or XDG_CACHE_HOME is set");
    cache.join("kubevirt-rs/grpc-venv/bin/python3")
}

#[test]
fn a_grpcio_client_is_served() {
    require_root_and_kvm();
    let python = python();
    let probe = std::process::Command::new(&python)
        .args(["-c", "import grpc, grpc_tools"])
        .status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "{} has no grpcio/grpcio-tools: run scripts/setup.sh (or set KUBEVIRT_RS_GRPC_PYTHON)",
        python.display()
    );
    let pod = Pod::new();
    let _launcher = pod.start_launcher(&[]);
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(&python)
        .arg(manifest.join("tests/python/cmd_client.py"))
        .arg(manifest.join("../../proto/protos"))
        .arg(pod.paths.launcher_socket())
        .output()
        .expect("runs the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let result: serde_json::Value = serde_json::from_str(&stdout).expect("one JSON line");
    // Every call reached the service, over the same socket the handler uses.
    assert_eq!(
        result["Info"],
        serde_json::json!({"versions": [1]}),
        "{result}"
    );
    assert_eq!(
        result["Ping"],
        serde_json::json!({"success": true}),
        "{result}"
    );
    assert_eq!(
        result["GetDomain"],
        serde_json::json!({"success": true, "domain": ""}),
        "{result}"
    );
    assert_eq!(
        result["GetFilesystems"],
        serde_json::json!({"success": true, "list": "[]"}),
        "{result}"
    );
    // A status from the service itself, not a transport reset.
    assert_eq!(
        result["GetQemuVersion"]["code"], "UNIMPLEMENTED",
        "{result}"
    );
}
