//! A launcher runs one VMI: every command about another VMI (another UID, no
//! UID, no VMI at all) is refused over the real cmd socket, and the running
//! VM is left exactly as it was; the same commands with its own UID work.

mod common;

use common::*;
use proto::domain::{LifeCycle, StateChangeReason};
use proto::grpc::cmd::v1::{EmptyRequest, Response, VmiRequest, cmd_client::CmdClient};
use std::time::Duration;
use tonic::transport::Channel;

const ARGS: &str = "console=ttyS0 checks=serial exit=halt wait=600";
const FOREIGN_UID: &str = "99999999-8888-7777-6666-555555555555";

#[derive(Clone, Copy, Debug)]
enum Command {
    Sync,
    Pause,
    Unpause,
    Shutdown,
    Kill,
    Delete,
    SoftReboot,
    Reset,
}

const EVERY: [Command; 8] = [
    Command::Pause,
    Command::Kill,
    Command::Shutdown,
    Command::Reset,
    Command::Unpause,
    Command::SoftReboot,
    Command::Delete,
    Command::Sync,
];

async fn send(cmd: &mut CmdClient<Channel>, command: Command, request: VmiRequest) -> Response {
    let reply = match command {
        Command::Sync => cmd.sync_virtual_machine(request).await,
        Command::Pause => cmd.pause_virtual_machine(request).await,
        Command::Unpause => cmd.unpause_virtual_machine(request).await,
        Command::Shutdown => cmd.shutdown_virtual_machine(request).await,
        Command::Kill => cmd.kill_virtual_machine(request).await,
        Command::Delete => cmd.delete_virtual_machine(request).await,
        Command::SoftReboot => cmd.soft_reboot_virtual_machine(request).await,
        Command::Reset => cmd.reset_virtual_machine(request).await,
    };
    reply
        .unwrap_or_else(|e| panic!("{command:?}: {e}"))
        .into_inner()
}

/// The test VMI with its `metadata.uid` replaced (`None`: removed).
fn with_uid(vmi: &[u8], uid: Option<&str>) -> Vec<u8> {
    let mut value: serde_json::Value = serde_json::from_slice(vmi).unwrap();
    match uid {
        Some(uid) => value["metadata"]["uid"] = uid.into(),
        None => {
            value["metadata"].as_object_mut().unwrap().remove("uid");
        }
    }
    serde_json::to_vec(&value).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_about_another_vmi_are_refused_and_the_vm_keeps_running() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let mut launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;

    // Before any domain: a Sync for another VMI than `--uid` defines nothing.
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    let foreign = with_uid(&vmi, Some(FOREIGN_UID));
    let reply = send(&mut cmd, Command::Sync, vmi_request(foreign.clone())).await;
    assert!(!reply.success, "a foreign VMI was defined");
    assert!(reply.message.contains(FOREIGN_UID), "{}", reply.message);
    assert!(
        cmd.get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain
            .is_empty()
    );

    let reply = send(&mut cmd, Command::Sync, vmi_request(vmi.clone())).await;
    assert!(reply.success, "{}", reply.message);
    notify
        .expect(Duration::from_secs(60), "Running", |_, d| {
            d.status.status == LifeCycle::Running
        })
        .await;
    let log = pod
        .paths
        .serial_log(&launcher::paths::PathName::vmi_uid(UID).unwrap());
    let console = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !console().contains("DONE passed=") {
        assert!(
            std::time::Instant::now() < deadline,
            "the guest did not finish its checks"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    while notify.events.try_recv().is_ok() {}

    let no_uid = with_uid(&vmi, None);
    let requests = [
        ("a foreign UID", Some(foreign.clone()), FOREIGN_UID),
        ("no UID", Some(no_uid), UID),
        ("no VMI", None, "No valid vmi object"),
    ];
    for (what, json, named) in requests {
        for command in EVERY {
            let request = match &json {
                Some(json) => vmi_request(json.clone()),
                None => VmiRequest::default(),
            };
            let reply = send(&mut cmd, command, request).await;
            assert!(!reply.success, "{command:?} with {what} was executed");
            assert!(
                reply.message.contains(named),
                "{command:?} with {what}: {}",
                reply.message
            );
        }
    }

    // Nothing changed: no state change, no grace period, no reset (the guest
    // would run its checks again), the launcher still serves.
    notify.expect_none(Duration::from_secs(3)).await;
    let domain = cmd
        .get_domain(EmptyRequest {})
        .await
        .unwrap()
        .into_inner()
        .domain;
    let domain = proto::domain::Domain::from_json(&domain).unwrap();
    assert_eq!(
        (domain.status.status, domain.status.reason),
        (LifeCycle::Running, StateChangeReason::Unknown)
    );
    assert!(
        domain
            .spec
            .metadata
            .kubevirt
            .grace_period
            .is_none_or(|g| g.deletion_timestamp.is_none()),
        "a foreign Shutdown started the grace period"
    );
    assert_eq!(
        console().matches("DONE passed=").count(),
        1,
        "{}",
        console()
    );
    assert!(launcher.child.try_wait().unwrap().is_none());

    // The launcher's own VMI is obeyed.
    let reply = send(&mut cmd, Command::Pause, vmi_request(vmi.clone())).await;
    assert!(reply.success, "{}", reply.message);
    notify
        .expect(Duration::from_secs(10), "Paused", |_, d| {
            d.status.status == LifeCycle::Paused && d.status.reason == StateChangeReason::User
        })
        .await;
    let reply = send(&mut cmd, Command::Kill, vmi_request(vmi.clone())).await;
    assert!(reply.success, "{}", reply.message);
    notify
        .expect(Duration::from_secs(10), "Shutoff", |_, d| {
            d.status.status == LifeCycle::Shutoff && d.status.reason == StateChangeReason::Destroyed
        })
        .await;
}
