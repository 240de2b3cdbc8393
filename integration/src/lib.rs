//! Integration-test support for kubevirt-rs.
//!
//! [`controlplane`] runs a real etcd + kube-apiserver (+ kube-controller-manager) for tests
//! that talk to the Kubernetes API; [`cluster`] brings up a real single-node cluster
//! (`scripts/cluster.sh`: scheduler, containerd, kubelet, kube-proxy too) for tests that run
//! pods; [`manifests`] reads a manifest directory as `kubectl apply -f` does and creates its
//! objects; [`wait_for`] polls until the API shows what a test waits for.

pub mod cluster;
pub mod controlplane;
pub mod manifests;

use std::future::Future;
use std::time::{Duration, Instant};

/// How long [`wait_for`] waits: what a controller or a kubelet writes comes within seconds;
/// a loaded 2-core machine may take many times that.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// Calls `check` every 100 ms until it returns a value, and returns it; panics naming `what`
/// once [`PATIENCE`] has passed (a test's wait for what the API server, a controller or a
/// kubelet will write).
pub async fn wait_for<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_within(what, PATIENCE, check).await
}

/// [`wait_for`] with its own limit (a VM's boot, a migration, a drain take longer).
pub async fn wait_for_within<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out ({limit:?}) waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sends SIGTERM to `child` (a process the test started) and waits for it to end.
pub async fn terminate(child: &mut std::process::Child) -> std::process::ExitStatus {
    let pid = i32::try_from(child.id()).expect("a PID fits an i32");
    // SAFETY: signals a child process this test started and has not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "kill {pid}");
    tokio::task::block_in_place(|| child.wait()).expect("wait for the child")
}
