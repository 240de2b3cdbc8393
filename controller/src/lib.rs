//! virt-controller: the cluster-wide half of KubeVirt v1.9.0's control plane that this project
//! re-implements — the VirtualMachine controller (run strategies, VMI creation), the
//! VirtualMachineInstance controller (launcher pod, phases up to the hand-off to a node) and
//! leader election between replicas.
//!
//! Decisions are pure functions ([`vm::decide`], [`vmi::decide`], [`template`]); the
//! controllers around them only read caches and write what the decisions say.

pub mod admission;
pub mod context;
pub mod defaults;
pub mod kubevirt_cr;
pub mod leader;
pub mod metrics;
pub mod migration;
pub mod quantity;
pub mod run;
pub mod template;
pub mod vm;
pub mod vmi;
pub mod writes;

/// The log set-up of virt-controller and virt-api: `RUST_LOG` (default `info`) to stdout,
/// coloured only on a terminal so that logs in files and pipes stay plain text.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();
}

/// Resolves when the process is asked to stop: SIGTERM (Kubernetes stops a pod with it) or
/// SIGINT (a terminal). For virt-controller and virt-api. Fails only if the SIGTERM handler
/// cannot be installed.
pub fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = terminate.recv() => {}
        }
        tracing::info!("shutting down");
    })
}
