//! The launcher's main flow, as KubeVirt's `cmd/virt-launcher/virt-launcher.go`:
//! serve the cmd socket, report domain events, wait for a domain within
//! `--qemu-timeout`, watch the VM until it is gone (asking for a graceful
//! shutdown on a stop signal and killing once `--grace-period-seconds` are
//! over), wait for the final "domain gone" event, then stop.

use crate::flags::Flags;
use crate::manager::{Manager, ManagerOptions, Stage};
use crate::notify::Progress;
use proto::kubevirt::parse_vmi;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;

/// How long the self-check may take before the launcher gives up (as Go's 15 s).
const SELF_CHECK: Duration = Duration::from_secs(15);
/// `waitForFinalNotify`: how long to wait for the final "domain gone"
/// event once the VM is gone, before killing the domain...
const FINAL_NOTIFY: Duration = Duration::from_secs(15);
/// ... and how long after that kill.
const FINAL_NOTIFY_AFTER_KILL: Duration = Duration::from_secs(30);
/// The process monitor's polling period (`monitorLoop`'s rate).
const MONITOR_RATE: Duration = Duration::from_secs(1);

/// Runs the launcher (its VMM confined by `sandbox`); returns the process
/// exit status.
pub async fn run(flags: Flags, sandbox: vmm::SandboxConfig) -> i32 {
    match run_inner(flags, sandbox).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("virt-launcher: {e:#}");
            eprintln!("virt-launcher: {e:#}");
            1
        }
    }
}

async fn run_inner(flags: Flags, sandbox: vmm::SandboxConfig) -> anyhow::Result<i32> {
    use anyhow::Context as _;
    let paths = flags.paths();
    let sockets = paths.sockets_dir();
    std::fs::create_dir_all(&sockets).with_context(|| format!("creating {}", sockets.display()))?;
    if !flags.uid.is_empty() {
        let uid = crate::paths::PathName::vmi_uid(&flags.uid).context("--uid")?;
        let private = paths.vmi_private_dir(&uid);
        std::fs::create_dir_all(&private)
            .with_context(|| format!("creating {}", private.display()))?;
    }
    let (manager, events, mut stage) = Manager::new(ManagerOptions {
        paths: paths.clone(),
        sys_class_net: "/sys/class/net".into(),
        serve_dhcp: true,
        sandbox,
    });

    // The cmd server: bound under the init name, renamed once it answers.
    let init_socket = paths.init_socket();
    let launcher_socket = paths.launcher_socket();
    for stale in [&init_socket, &launcher_socket] {
        let _ = std::fs::remove_file(stale);
    }
    let listener = tokio::net::UnixListener::bind(&init_socket)
        .with_context(|| format!("binding {}", init_socket.display()))?;
    let (stop_server, server_stopped) = tokio::sync::oneshot::channel::<()>();
    let options = crate::server::ServerOptions {
        vm_stats_collector: flags.vm_stats_collector,
        vmi_uid: (!flags.uid.is_empty()).then(|| flags.uid.clone()),
    };
    let server = tokio::spawn(crate::server::serve(
        manager.clone(),
        options,
        listener,
        async {
            let _ = server_stopped.await;
        },
    ));
    self_check(&init_socket).await?;
    std::fs::rename(&init_socket, &launcher_socket)
        .with_context(|| format!("renaming to {}", launcher_socket.display()))?;
    tracing::info!("cmd server ready at {}", launcher_socket.display());

    let (progress_tx, mut progress) = watch::channel(Progress::default());
    tokio::spawn(crate::notify::run(
        paths.notify_socket(),
        events,
        progress_tx,
    ));

    let standalone = std::env::var("STANDALONE_VMI").ok();
    if let Some(text) = &standalone {
        let vmi = parse_vmi(text).context("STANDALONE_VMI")?;
        let m = manager.clone();
        tokio::task::spawn_blocking(move || m.sync(&vmi, None))
            .await?
            .map_err(|f| anyhow::anyhow!("STANDALONE_VMI: {f}"))?;
    }

    let mut signals = Box::pin(crate::signals::stop_signal());
    // Wait for the handler to define a domain. A domain defined by the time
    // a stop signal is seen wins: the monitor then takes the signal.
    let defined = tokio::select! {
        biased;
        r = stage.wait_for(|s| *s != Stage::Waiting) => r.is_ok(),
        _ = tokio::time::sleep(flags.qemu_timeout) => {
            anyhow::bail!("no domain was defined within --qemu-timeout {:?}", flags.qemu_timeout);
        }
        s = &mut signals => {
            tracing::info!("{} before any domain was defined: exiting", s.unwrap_or("signal"));
            false
        }
    };

    // A migration's target waits for its VM (or to be let go, or a stop signal).
    let defined = defined
        && (*stage.borrow() != Stage::Incoming
            || {
                tokio::select! {
                    biased;
                    r = stage.wait_for(|s| *s != Stage::Incoming) => {
                        r.is_ok_and(|s| *s == Stage::Defined)
                    }
                    s = &mut signals => {
                        tracing::info!("{} while waiting for a migration: exiting", s.unwrap_or("signal"));
                        false
                    }
                }
            });
    // Let go before any domain ran here (SignalTargetPodCleanup): nothing to watch.
    let defined = defined && *stage.borrow() != Stage::Deleted;
    if defined {
        monitor(&flags, &manager, &mut signals, standalone.is_some()).await;
        wait_for_final_notify(&manager, &mut progress).await;
    }
    // Never exit with domain events still queued: each one is either
    // delivered or given up on after the notifier's retries.
    let emitted = manager.emitted_events();
    let _ = progress.wait_for(|p| p.processed >= emitted).await;
    let _ = stop_server.send(());
    let _ = server.await;
    let _ = std::fs::remove_file(&launcher_socket);
    Ok(0)
}

/// Seconds since the epoch, the clock the Go monitor measures its grace
/// period with.
fn unix_seconds() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// KubeVirt's process monitor (`pkg/virt-launcher/monitor.go`): polls every
/// second until the VM is gone. The first stop signal marks the domain for
/// a graceful shutdown (the handler then asks the guest) and starts the
/// grace period; once more than `--grace-period-seconds` have passed, each
/// poll kills the VM. Without a handler (`STANDALONE_VMI`) the launcher
/// deletes the domain itself when the VM is gone.
async fn monitor(
    flags: &Flags,
    manager: &Arc<Manager>,
    signals: &mut std::pin::Pin<
        Box<impl std::future::Future<Output = std::io::Result<&'static str>>>,
    >,
    standalone: bool,
) {
    let grace = flags.grace_period_seconds;
    let mut grace_start: Option<i64> = None;
    let mut tick = tokio::time::interval(MONITOR_RATE);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            s = &mut *signals, if grace_start.is_none() => {
                tracing::info!("{}: marked for graceful shutdown, kill after {grace}s", s.unwrap_or("signal"));
                let m = manager.clone();
                let _ = tokio::task::spawn_blocking(move || m.mark_for_graceful_shutdown()).await;
                grace_start = Some(unix_seconds());
            }
            _ = tick.tick() => {
                // Off the async runtime (one thread): the manager's lock is
                // held for as long as a VM takes to start.
                let m = manager.clone();
                let (alive, defined) =
                    tokio::task::spawn_blocking(move || (m.vm_alive(), m.domain().is_some()))
                        .await
                        .unwrap_or((false, false));
                if !alive {
                    tracing::info!("the VM is gone");
                    if standalone && defined {
                        let m = manager.clone();
                        let _ = tokio::task::spawn_blocking(move || m.delete()).await;
                    }
                    return;
                }
                if grace_start.is_some_and(|start| unix_seconds() - start > grace) {
                    tracing::warn!("grace period expired: killing the VM");
                    let m = manager.clone();
                    let _ = tokio::task::spawn_blocking(move || m.kill()).await;
                }
            }
        }
    }
}

/// `waitForFinalNotify`: the handler deletes the domain once it has seen
/// it stopped; wait up to 15 s for that "domain gone" event to go out, then
/// kill the domain (idempotent) and wait up to 30 s more. The launcher
/// cannot block its pod for ever: the handler also learns of the end from
/// the cmd socket going away.
async fn wait_for_final_notify(manager: &Arc<Manager>, progress: &mut watch::Receiver<Progress>) {
    tracing::info!("waiting on final notifications to be sent to virt-handler");
    if tokio::time::timeout(FINAL_NOTIFY, progress.wait_for(|p| p.gone))
        .await
        .is_ok()
    {
        tracing::info!("final delete notification sent");
        return;
    }
    tracing::info!("timed out waiting for the final delete notification: killing the domain");
    let m = manager.clone();
    let _ = tokio::task::spawn_blocking(move || m.kill()).await;
    match tokio::time::timeout(FINAL_NOTIFY_AFTER_KILL, progress.wait_for(|p| p.gone)).await {
        Ok(_) => tracing::info!("final delete notification sent after calling kill"),
        Err(_) => {
            tracing::info!("timed out waiting for the final delete notification after calling kill")
        }
    }
}

/// Pings our own server until it answers (the socket may take a moment).
async fn self_check(socket: &Path) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + SELF_CHECK;
    loop {
        let attempt = async {
            let mut client = crate::server::connect(socket).await?;
            client
                .ping(proto::grpc::cmd::v1::EmptyRequest {})
                .await
                .map_err(anyhow::Error::from)?;
            anyhow::Ok(())
        };
        match attempt.await {
            Ok(()) => return Ok(()),
            Err(e) if tokio::time::Instant::now() >= deadline => {
                anyhow::bail!("the cmd server did not answer its self-check: {e}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}
