//! Leader election on a `coordination.k8s.io/v1` Lease: replicas run, only the holder of the
//! Lease runs the controllers (KubeVirt: Lease `kubevirt/virt-controller`, 15 s duration).
//! The Lease handling itself is kube-lease-manager's (server-side apply, conflict-safe).

use kube::Client;
use kube_lease_manager::LeaseManagerBuilder;
use std::future::Future;
use std::pin::Pin;

/// Lease duration in seconds, as KubeVirt's virt-controller uses.
pub(crate) const LEASE_DURATION_SECONDS: u64 = 15;
/// How long before expiry the holder renews.
pub(crate) const LEASE_GRACE_SECONDS: u64 = 5;

#[derive(Debug, Clone)]
pub struct LeaderOptions {
    pub namespace: String,
    pub lease_name: String,
    pub identity: String,
}

/// Work to run while leading; it must return when the `lost` future resolves.
pub type LeaderWork = Box<
    dyn FnMut(Pin<Box<dyn Future<Output = ()> + Send>>) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send,
>;

/// Waits for the Lease, runs `work` while holding it and stops it when the Lease is lost;
/// then waits again. Returns when `shutdown` resolves (releasing the Lease).
pub async fn run_when_leader(
    client: Client,
    options: LeaderOptions,
    mut work: LeaderWork,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let manager = LeaseManagerBuilder::new(client, &options.lease_name)
        .with_namespace(&options.namespace)
        .with_identity(&options.identity)
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        .build()
        .await?;
    let (mut leading, task) = manager.watch().await;
    tracing::info!(identity = %options.identity, "attempting to acquire leader lease");
    // Shutdown stops the work like a lost Lease does, and lets it finish.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let election = async {
        loop {
            let mut stop = stop_rx.clone();
            tokio::select! {
                acquired = leading.wait_for(|l| *l) => if acquired.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
            tracing::info!(identity = %options.identity, "acquired the leader lease, starting controllers");
            let (mut lost_rx, mut stop) = (leading.clone(), stop_rx.clone());
            let lost: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(async move {
                tokio::select! {
                    _ = lost_rx.wait_for(|l| !*l) => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
            });
            work(lost).await;
            if *stop_rx.borrow() {
                return;
            }
            tracing::warn!(identity = %options.identity, "lost the leader lease, controllers stopped");
        }
    };
    let trigger = async {
        shutdown.await;
        let _ = stop_tx.send(true);
        std::future::pending::<()>().await;
    };
    tokio::select! {
        _ = election => {}
        _ = trigger => {}
    }
    // Closing the channel makes the manager release the Lease and end.
    drop(leading);
    task.await??;
    Ok(())
}
