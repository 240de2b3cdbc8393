//! The RPCs whose answers the handler acts on besides the lifecycle: what
//! KubeVirt's launcher answers for a guest without a connected agent, for
//! backups without changed block tracking, and `GetVMStats` with and
//! without `--vm-stats-collector`. Each is checked against the Go
//! launcher's answer (`pkg/virt-launcher/virtwrap/cmd-server/`).

mod common;

use common::*;
use proto::grpc::cmd::v1 as cmd;
use proto::grpc::cmd::v1::EmptyRequest;
use std::time::Duration;

const AGENT_ERROR: &str = "virError(Code=86, Domain=10, Message='Guest agent is not responding: QEMU guest agent is not connected')";

fn vmi() -> Option<cmd::Vmi> {
    Some(cmd::Vmi {
        vmi_json: vmi_json("", serde_json::json!({})),
    })
}

fn bad_vmi() -> Option<cmd::Vmi> {
    Some(cmd::Vmi {
        vmi_json: b"{not json".to_vec(),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn guest_agent_and_backup_rpcs_answer_as_without_an_agent() {
    require_root_and_kvm();
    let pod = Pod::new();
    let _launcher = pod.start_launcher(&[]);
    let mut c = cmd_client(&pod).await;

    // The handler's domain-stats scrape: GetDomainStats, then GetFilesystems.
    let stats = c
        .get_domain_stats(EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(stats.response.unwrap().success);
    let fs = c
        .get_filesystems(EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(fs.response.unwrap().success);
    assert_eq!(fs.guest_filesystems_response, "[]");
    let users = c.get_users(EmptyRequest {}).await.unwrap().into_inner();
    assert!(users.response.unwrap().success);
    assert_eq!(users.guest_user_list_response, "[]");
    let info = c
        .get_guest_info(EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(info.response.unwrap().success);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&info.guest_info_response).unwrap(),
        serde_json::json!({"os": {}, "timezone": ", 0", "fsInfo": {"disks": null}})
    );

    // virt-probe: the agent ping and exec probes fail with libvirt's error.
    let err = c
        .guest_ping(cmd::GuestPingRequest {
            domain_name: "ns1_testvmi".into(),
            timeout_seconds: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::Unknown, AGENT_ERROR)
    );
    let err = c
        .exec(cmd::ExecRequest {
            domain_name: "ns1_testvmi".into(),
            command: "true".into(),
            args: vec![],
            timeout_seconds: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (tonic::Code::Unknown, AGENT_ERROR)
    );

    // Freeze (snapshots): a failed response with the formatted libvirt error.
    let r = c
        .freeze_virtual_machine(cmd::FreezeRequest {
            vmi: vmi(),
            unfreeze_timeout_seconds: 300,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.success);
    assert_eq!(
        r.message,
        "LibvirtError(Code=86, Domain=10, Message='Guest agent is not responding: QEMU guest agent is not connected')"
    );
    let r = c
        .unfreeze_virtual_machine(cmd::VmiRequest {
            vmi: bad_vmi(),
            options: None,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.success, r.message.as_str()),
        (
            false,
            "No valid vmi object present in command server request"
        )
    );

    // Backups without changed block tracking: failures in the response,
    // never a gRPC error (the handler answers 503 and retries).
    let r = c
        .redefine_checkpoint(cmd::RedefineCheckpointRequest {
            vmi: vmi(),
            checkpoint: br#"{"name":"cp1"}"#.to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    let response = r.response.unwrap();
    assert_eq!(
        (
            response.success,
            response.message.as_str(),
            r.checkpoint_invalid
        ),
        (
            false,
            "Redefine checkpoint failed: ChangedBlockTracking is not enabled",
            false
        )
    );
    let r = c
        .backup_virtual_machine(cmd::BackupRequest {
            vmi: vmi(),
            options: b"{}".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (r.success, r.message.as_str()),
        (false, "Backup failed ChangedBlockTracking is not enabled")
    );

    // Without --vm-stats-collector: the Go launcher's plain error.
    let err = c
        .get_vm_stats(cmd::VmStatsRequest {
            domain_stats: Some(cmd::DomainStatsRequest {}),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (
            tonic::Code::Unknown,
            "VMStatsCollector feature gate is not enabled"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vm_stats_are_served_with_the_collector_flag() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&["--vm-stats-collector"]);
    let mut c = cmd_client(&pod).await;
    let vmi = vmi_json(
        "console=ttyS0 checks=serial,virtio-blk exit=halt wait=600",
        serde_json::json!({}),
    );
    ok(c.sync_virtual_machine(vmi_request(vmi)), "sync").await;
    notify.next(Duration::from_secs(60)).await;

    // Domain statistics alone: a successful answer with GetDomainStats' JSON.
    let r = c
        .get_vm_stats(cmd::VmStatsRequest {
            domain_stats: Some(cmd::DomainStatsRequest {}),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.response.as_ref().unwrap().success, "{r:?}");
    let stats = r.domain_stats.unwrap();
    assert!(stats.response.unwrap().success);
    let json: serde_json::Value = serde_json::from_str(&stats.domain_stats).unwrap();
    assert_eq!(json["Name"], "ns1_testvmi");
    assert_eq!(json["Block"][0]["Name"], "vda");
    assert!(r.dirty_rate_stats.is_none() && r.guest_agent_version.is_none());

    // With the dirty rate and agent commands: each answered as the Go
    // launcher does without them, and the whole response fails naming each.
    let r = c
        .get_vm_stats(cmd::VmStatsRequest {
            domain_stats: Some(cmd::DomainStatsRequest {}),
            dirty_rate: Some(cmd::DirtyRateRequest {}),
            guest_get_load: Some(cmd::AgentLoadRequest {}),
            guest_get_users: Some(cmd::AgentUsersRequest {}),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let top = r.response.unwrap();
    assert!(!top.success);
    assert_eq!(
        top.message,
        format!(
            "dirty rate stats: the dirty page rate is not measured by this launcher; \
             agent data guest-get-load: failed to get agent data for guest-get-load: {AGENT_ERROR}; \
             agent data guest-get-users: failed to get agent data for guest-get-users: {AGENT_ERROR}"
        )
    );
    assert!(r.domain_stats.unwrap().response.unwrap().success);
    let version = r.guest_agent_version.unwrap();
    assert_eq!((version.success, version.message.as_str()), (true, ""));
    let load = r.guest_get_load.unwrap();
    assert!(!load.success);
    assert!(r.guest_get_cpu_stats.is_none());
}
