//! Shutdown as KubeVirt's handler sees it from a stock launcher: the events
//! of a shutdown request the guest cannot act on, and the launcher's own
//! stop sequence on SIGTERM (`cmd/virt-launcher/virt-launcher.go`: mark
//! the domain for graceful shutdown, kill after the grace period, wait for
//! the handler to delete the domain, then exit).

mod common;

use common::*;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use proto::grpc::cmd::v1::EmptyRequest;
use std::time::{Duration, Instant};

const BOOT: Duration = Duration::from_secs(60);
const ARGS: &str = "console=ttyS0 checks=serial exit=halt wait=600";

fn state(d: &Domain) -> (LifeCycle, StateChangeReason) {
    (d.status.status, d.status.reason)
}

fn grace(d: &Domain) -> proto::domain::GracePeriodMetadata {
    d.spec
        .metadata
        .kubevirt
        .grace_period
        .clone()
        .unwrap_or_default()
}

/// Waits until the guest waits for Ctrl-Alt-Del (it then honours one).
async fn guest_waiting(pod: &Pod) {
    let log = pod
        .paths
        .serial_log(&launcher::paths::PathName::vmi_uid(UID).unwrap());
    let deadline = Instant::now() + BOOT;
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("WAITING for Ctrl-Alt-Del")
    {
        assert!(Instant::now() < deadline, "the guest did not boot");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn sigterm(launcher: &Launcher) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(
            libc::pid_t::try_from(launcher.child.id()).expect("a Linux pid fits a pid_t"),
        ),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

fn alive(launcher: &mut Launcher) -> bool {
    launcher.child.try_wait().unwrap().is_none()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_the_guest_does_not_act_on_leaves_it_running_until_killed() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let (t, _) = notify.next(BOOT).await;
    assert_eq!(t, "ADDED");
    // A paused guest cannot act on the request; libvirt does not resume it.
    ok(cmd.pause_virtual_machine(vmi_request(vmi.clone())), "pause").await;
    let (_, paused) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(state(&paused), (LifeCycle::Paused, StateChangeReason::User));

    ok(
        cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
        "shutdown",
    )
    .await;
    // Only the deletion timestamp, in the state the domain is in.
    let (t, asked) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(t, "MODIFIED");
    assert!(grace(&asked).deletion_timestamp.is_some());
    assert_eq!(state(&asked), (LifeCycle::Paused, StateChangeReason::User));
    // The handler asks again (every 5 s in KubeVirt): nothing changes, no
    // event, the domain is not ShuttingDown.
    for _ in 0..2 {
        ok(
            cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
            "shutdown",
        )
        .await;
    }
    notify.expect_none(Duration::from_secs(4)).await;
    let d = Domain::from_json(
        &cmd.get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
    )
    .unwrap();
    assert_eq!(state(&d), (LifeCycle::Paused, StateChangeReason::User));
    // The grace period is over: the handler kills.
    ok(cmd.kill_virtual_machine(vmi_request(vmi.clone())), "kill").await;
    let (_, off) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(
        state(&off),
        (LifeCycle::Shutoff, StateChangeReason::Destroyed)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_the_handler_to_delete_the_domain() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let mut launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let (t, _) = notify.next(BOOT).await;
    assert_eq!(t, "ADDED");
    guest_waiting(&pod).await;

    sigterm(&launcher);
    // The launcher only marks the domain; the handler does the shutdown.
    let (t, marked) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(t, "MODIFIED");
    assert_eq!(grace(&marked).marked_for_graceful_shutdown, Some(true));
    assert!(grace(&marked).deletion_timestamp.is_none());
    assert_eq!(
        state(&marked),
        (LifeCycle::Running, StateChangeReason::Unknown)
    );
    notify.expect_none(Duration::from_secs(3)).await;

    // The handler's shutdown; the guest honours it.
    ok(
        cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
        "shutdown",
    )
    .await;
    let (_, asked) = notify.next(Duration::from_secs(20)).await;
    assert!(grace(&asked).deletion_timestamp.is_some());
    assert_eq!(
        state(&asked),
        (LifeCycle::Running, StateChangeReason::Unknown)
    );
    let (_, down) = notify.next(BOOT).await;
    assert_eq!(
        state(&down),
        (LifeCycle::ShuttingDown, StateChangeReason::Unknown)
    );
    let (_, off) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(
        state(&off),
        (LifeCycle::Shutoff, StateChangeReason::Shutdown)
    );

    // The VM is gone, the domain is not: the launcher keeps serving and
    // waits for the handler's delete (up to 15 s).
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        alive(&mut launcher),
        "exited before the handler deleted the domain"
    );
    assert!(pod.paths.launcher_socket().exists());
    ok(
        cmd.delete_virtual_machine(vmi_request(vmi.clone())),
        "delete",
    )
    .await;
    let (_, gone) = notify.next(Duration::from_secs(20)).await;
    assert!(gone.is_gone());
    assert_eq!(
        state(&gone),
        (LifeCycle::NoState, StateChangeReason::NonExistent)
    );
    let code = tokio::task::spawn_blocking(move || {
        let code = launcher.wait_exit(Duration::from_secs(30));
        (code, launcher)
    })
    .await
    .unwrap()
    .0;
    assert_eq!(code, Some(0));
    assert!(!pod.paths.launcher_socket().exists());
    notify.expect_none(Duration::from_secs(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_without_a_handler_kills_after_the_grace_period_then_waits_for_the_delete() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let mut launcher = pod.start_launcher(&["--grace-period-seconds", "2"]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    notify.next(BOOT).await;

    let signalled = Instant::now();
    sigterm(&launcher);
    let (_, marked) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(grace(&marked).marked_for_graceful_shutdown, Some(true));
    // Nobody shuts the guest down: more than 2 s later the launcher kills.
    let (_, off) = notify.next(Duration::from_secs(30)).await;
    assert_eq!(
        state(&off),
        (LifeCycle::Shutoff, StateChangeReason::Destroyed)
    );
    let killed = Instant::now();
    assert!(
        killed - signalled > Duration::from_secs(2),
        "killed {:?} after SIGTERM",
        killed - signalled
    );
    // Then 15 s for the final delete, a kill, and 30 s more.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        alive(&mut launcher),
        "exited without waiting for the delete"
    );
    let (code, _launcher) = tokio::task::spawn_blocking(move || {
        let code = launcher.wait_exit(Duration::from_secs(90));
        (code, launcher)
    })
    .await
    .unwrap();
    let waited = killed.elapsed();
    assert_eq!(code, Some(0));
    assert!(
        waited >= Duration::from_secs(40),
        "exited {waited:?} after the VM was gone (15 s + 30 s expected)"
    );
    assert!(!pod.paths.launcher_socket().exists());
    notify.expect_none(Duration::from_secs(1)).await;
}
