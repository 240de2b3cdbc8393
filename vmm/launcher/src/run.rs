//! The launcher's main flow (contract §4.2): serve the cmd socket, report
//! domain events, wait for a domain within `--qemu-timeout`, and on a stop
//! signal ask for a graceful shutdown and kill after the grace period.

use crate::flags::Flags;
use crate::manager::{Manager, ManagerOptions, Stage};
use proto::kubevirt::parse_vmi;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long the self-check may take before the launcher gives up (as Go's 15 s).
const SELF_CHECK: Duration = Duration::from_secs(15);
/// How long to wait for the final "domain gone" event to reach the handler.
const FINAL_NOTIFY: Duration = Duration::from_secs(15);

/// Runs the launcher; returns the process exit status.
pub async fn run(flags: Flags) -> i32 {
    match run_inner(flags).await {
        Ok(code) => code,
        Err(e) => {
            tracing::error!("virt-launcher: {e:#}");
            eprintln!("virt-launcher: {e:#}");
            1
        }
    }
}

async fn run_inner(flags: Flags) -> anyhow::Result<i32> {
    use anyhow::Context as _;
    let paths = flags.paths();
    let sockets = paths.sockets_dir();
    std::fs::create_dir_all(&sockets).with_context(|| format!("creating {}", sockets.display()))?;
    if !flags.uid.is_empty() {
        let private = paths.vmi_private_dir(&flags.uid);
        std::fs::create_dir_all(&private)
            .with_context(|| format!("creating {}", private.display()))?;
    }
    let (manager, events, mut stage) = Manager::new(ManagerOptions {
        paths: paths.clone(),
        sys_class_net: "/sys/class/net".into(),
        serve_dhcp: true,
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
    let server = tokio::spawn(crate::server::serve(manager.clone(), listener, async {
        let _ = server_stopped.await;
    }));
    self_check(&init_socket).await?;
    std::fs::rename(&init_socket, &launcher_socket)
        .with_context(|| format!("renaming to {}", launcher_socket.display()))?;
    tracing::info!("cmd server ready at {}", launcher_socket.display());

    let (gone_tx, mut gone) = watch::channel(false);
    tokio::spawn(crate::notify::run(paths.notify_socket(), events, gone_tx));

    let standalone = std::env::var("STANDALONE_VMI").ok();
    if let Some(text) = &standalone {
        let vmi = parse_vmi(text).context("STANDALONE_VMI")?;
        let m = manager.clone();
        tokio::task::spawn_blocking(move || m.sync(&vmi, None))
            .await?
            .map_err(|f| anyhow::anyhow!("STANDALONE_VMI: {}", f.0))?;
    }

    let mut signals = Box::pin(crate::signals::stop_signal());
    // Wait for the handler to define a domain.
    let defined = tokio::select! {
        r = stage.wait_for(|s| *s != Stage::Waiting) => r.is_ok(),
        _ = tokio::time::sleep(flags.qemu_timeout) => {
            anyhow::bail!("no domain was defined within --qemu-timeout {:?}", flags.qemu_timeout);
        }
        s = &mut signals => {
            tracing::info!("{} before any domain was defined: exiting", s.unwrap_or("signal"));
            false
        }
    };

    let mut code = 0;
    if defined {
        code = supervise(
            &flags,
            &manager,
            &mut stage,
            &mut signals,
            standalone.is_some(),
        )
        .await;
        if *stage.borrow() == Stage::Deleted {
            let _ = tokio::time::timeout(FINAL_NOTIFY, gone.wait_for(|g| *g)).await;
        }
    }
    let _ = stop_server.send(());
    let _ = server.await;
    let _ = std::fs::remove_file(&launcher_socket);
    Ok(code)
}

/// From a defined domain to the end: returns when the domain is deleted, or
/// after a stop signal once the VM is gone.
async fn supervise(
    flags: &Flags,
    manager: &Arc<Manager>,
    stage: &mut watch::Receiver<Stage>,
    signals: &mut std::pin::Pin<
        Box<impl std::future::Future<Output = std::io::Result<&'static str>>>,
    >,
    standalone: bool,
) -> i32 {
    let grace = Duration::from_secs(flags.grace_period_seconds.max(0) as u64);
    let mut kill_at: Option<tokio::time::Instant> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stage.wait_for(|s| *s == Stage::Deleted) => return 0,
            s = &mut *signals, if kill_at.is_none() => {
                tracing::info!("{}: asking for a graceful shutdown, kill in {grace:?}", s.unwrap_or("signal"));
                let m = manager.clone();
                let _ = tokio::task::spawn_blocking(move || m.mark_for_graceful_shutdown()).await;
                kill_at = Some(tokio::time::Instant::now() + grace);
            }
            _ = tick.tick() => {
                let alive = manager.vm_alive();
                if let Some(at) = kill_at {
                    if !alive {
                        return 0;
                    }
                    if tokio::time::Instant::now() >= at {
                        tracing::warn!("grace period over: killing the VM");
                        let m = manager.clone();
                        let _ = tokio::task::spawn_blocking(move || m.kill()).await;
                    }
                } else if standalone && !alive {
                    // No handler will delete the domain: finish by ourselves.
                    let m = manager.clone();
                    let _ = tokio::task::spawn_blocking(move || m.delete()).await;
                    return 0;
                }
            }
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
