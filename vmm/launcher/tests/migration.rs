//! Live migration between two real launcher processes, each in its own pod directory,
//! driven through their cmd sockets as KubeVirt's handlers drive them
//! (`docs/migration-contract.md`): SyncMigrationTarget on the target, then
//! MigrateVirtualMachine on the source; the stream goes through the two pods'
//! `migrationproxy/<uid>-49152-source.sock`, joined here by a relay as the handlers'
//! proxies join them. Notify servers stand in for the two handlers.

mod common;

use common::*;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use proto::grpc::cmd::v1::{EmptyRequest, MigrationRequest};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

const BOOT: Duration = Duration::from_secs(60);
const MIGRATION_UID: &str = "99999999-8888-7777-6666-555555555555";
const TARGET_POD: &str = "virt-launcher-testvmi-target";
/// The test guest keeps its disk and RNG busy and rewrites 4 MiB of memory every tick.
const ARGS: &str = "console=ttyS0 checks=serial exit=tick wait=600 dirty=4 blk=tick";

/// KubeVirt's default migration options, as its handler sends them.
const OPTIONS: &str = r#"{"Bandwidth":"0","ProgressTimeout":150,"CompletionTimeoutPerGiB":150,"MaxDowntimeMs":900,"UnsafeMigration":false,"AllowAutoConverge":false,"AllowPostCopy":false,"ParallelMigrationThreads":8,"AllowWorkloadDisruption":false,"StallDetectorOptions":null,"Compression":null}"#;

/// The VMI as the handlers see it during the migration: `status.migrationState` set.
fn migrating_vmi(args: &str) -> Vec<u8> {
    let mut vmi: serde_json::Value =
        serde_json::from_slice(&vmi_json(args, serde_json::json!({}))).unwrap();
    vmi["status"] = serde_json::json!({
        "phase": "Running",
        "migrationState": {
            "migrationUid": MIGRATION_UID,
            "targetPod": TARGET_POD,
            "sourceNode": "node-a",
            "targetNode": "node-b",
        }
    });
    serde_json::to_vec(&vmi).unwrap()
}

fn socket(pod: &Pod) -> PathBuf {
    pod.paths
        .share_dir
        .join("migrationproxy")
        .join(format!("{UID}-49152-source.sock"))
}

/// The two handlers' proxies in one: every connection to the source pod's socket is
/// joined to the target pod's.
fn relay(source: &Path, target: PathBuf) {
    std::fs::create_dir_all(source.parent().unwrap()).unwrap();
    let listener = UnixListener::bind(source).unwrap();
    std::thread::spawn(move || {
        for incoming in listener.incoming() {
            let Ok(from) = incoming else { return };
            let to = UnixStream::connect(&target).expect("the target listens");
            let (mut a, mut b) = (from.try_clone().unwrap(), to.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Both);
            });
            let (mut a, mut b) = (to, from);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut a, &mut b);
                let _ = b.shutdown(std::net::Shutdown::Both);
            });
        }
    });
}

fn migration_request(vmi: Vec<u8>, options: &str) -> MigrationRequest {
    MigrationRequest {
        vmi: Some(proto::grpc::cmd::v1::Vmi { vmi_json: vmi }),
        options: options.as_bytes().to_vec(),
    }
}

fn migration_of(d: &Domain) -> Option<&proto::domain::MigrationMetadata> {
    d.spec.metadata.kubevirt.migration.as_ref()
}

fn log_text(pod: &Pod) -> String {
    let uid = launcher::paths::PathName::vmi_uid(UID).unwrap();
    std::fs::read_to_string(pod.paths.serial_log(&uid)).unwrap_or_default()
}

/// The last `blk ok N` in a serial log.
fn last_blk(text: &str) -> u64 {
    text.rsplit("blk ok ")
        .next()
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn wait_log(pod: &Pod, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + BOOT;
    loop {
        let text = log_text(pod);
        if pred(&text) {
            return text;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Two pods with the same container disk image, their handlers' stand-ins, launchers.
struct Pair {
    source: Pod,
    target: Pod,
    source_notify: NotifyRecorder,
    target_notify: NotifyRecorder,
    source_launcher: Launcher,
    target_launcher: Launcher,
}

fn pair() -> Pair {
    let (source, target) = (Pod::new(), Pod::new());
    let base: Vec<u8> = (0..4usize << 20)
        .map(|i| (i / 4096).to_le_bytes()[0])
        .collect();
    source.container_disk(0, &base);
    target.container_disk(0, &base);
    let source_notify = NotifyRecorder::start(&source.paths.notify_socket());
    let target_notify = NotifyRecorder::start(&target.paths.notify_socket());
    let source_launcher = source.start_launcher(&[]);
    let target_launcher = target.start_launcher_with_env(&[], &[("POD_NAME", TARGET_POD)]);
    relay(&socket(&source), socket(&target));
    Pair {
        source,
        target,
        source_notify,
        target_notify,
        source_launcher,
        target_launcher,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_moves_from_one_launcher_to_another_with_its_disk() {
    require_root_and_kvm();
    let mut p = pair();
    let mut source = cmd_client(&p.source).await;
    let mut target = cmd_client(&p.target).await;
    ok(
        source.sync_virtual_machine(vmi_request(vmi_json(ARGS, serde_json::json!({})))),
        "sync",
    )
    .await;
    p.source_notify
        .expect(BOOT, "source running", |_, d| {
            d.status.status == LifeCycle::Running
        })
        .await;
    wait_log(&p.source, "the guest writes its disk", |t| last_blk(t) >= 3).await;

    // The target first, as KubeVirt's handlers order it.
    let vmi = migrating_vmi(ARGS);
    ok(
        target.sync_migration_target(vmi_request(vmi.clone())),
        "SyncMigrationTarget",
    )
    .await;
    ok(
        target.sync_migration_target(vmi_request(vmi.clone())),
        "SyncMigrationTarget again",
    )
    .await;
    // No domain on the target until the stream starts.
    assert_eq!(
        target
            .get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
        ""
    );

    ok(
        source.migrate_virtual_machine(migration_request(vmi.clone(), OPTIONS)),
        "Migrate",
    )
    .await;
    // Sent again before the handler saw the start: nothing more happens.
    ok(
        source.migrate_virtual_machine(migration_request(vmi.clone(), OPTIONS)),
        "Migrate again",
    )
    .await;
    let (_, started) = p
        .source_notify
        .expect(BOOT, "the source's migration metadata", |_, d| {
            migration_of(d).is_some_and(|m| m.start_timestamp.is_some())
        })
        .await;
    let m = migration_of(&started).unwrap();
    assert_eq!(
        (m.uid.as_str(), m.mode.as_str()),
        (MIGRATION_UID, "PreCopy")
    );

    // The target's domain appears paused for the migration, then runs, with the end
    // time the handler hands the VMI over on.
    let (kind, _) = p
        .target_notify
        .expect(BOOT, "the target's domain", |_, d| {
            d.status.status == LifeCycle::Paused && d.status.reason == StateChangeReason::Migration
        })
        .await;
    assert_eq!(kind, "ADDED");
    let (_, running) = p
        .target_notify
        .expect(BOOT, "the target's domain running", |_, d| {
            d.status.status == LifeCycle::Running
                && migration_of(d).is_some_and(|m| m.end_timestamp.is_some())
        })
        .await;
    assert_eq!(migration_of(&running).unwrap().uid, MIGRATION_UID);
    // The source's ends migrated, its migration ended well.
    p.source_notify
        .expect(BOOT, "the source shut off, migrated", |_, d| {
            d.status.status == LifeCycle::Shutoff && d.status.reason == StateChangeReason::Migrated
        })
        .await;
    let (_, ended) = p
        .source_notify
        .expect(BOOT, "the source's migration ended", |_, d| {
            migration_of(d).is_some_and(|m| m.end_timestamp.is_some())
        })
        .await;
    let m = migration_of(&ended).unwrap();
    assert!(
        !m.failed && m.failure_reason.is_empty() && m.abort_status.is_empty(),
        "{m:?}"
    );
    // One migration per UID.
    let again = source
        .migrate_virtual_machine(migration_request(vmi.clone(), OPTIONS))
        .await
        .unwrap()
        .into_inner();
    assert!(!again.success);
    assert!(
        again
            .message
            .contains(&format!("migration job {MIGRATION_UID} already executed")),
        "{}",
        again.message
    );

    // The guest goes on on the target: it writes its disk on and reads back there what
    // it wrote on the source; it did not boot again.
    let before = last_blk(&log_text(&p.source));
    let text = wait_log(&p.target, "the guest goes on on the target", |t| {
        last_blk(t) >= before + 3
    })
    .await;
    assert!(!text.contains("FAIL") && !text.contains("DONE"), "{text}");
    assert!(!log_text(&p.source).contains("FAIL"));
    // Finalize is asked twice by KubeVirt's handler.
    let finalize = vmi_request(vmi.clone());
    ok(
        target.finalize_virtual_machine_migration(finalize.clone()),
        "Finalize",
    )
    .await;
    ok(
        target.finalize_virtual_machine_migration(finalize),
        "Finalize again",
    )
    .await;
    // A sync on the received domain changes nothing.
    ok(
        target.sync_virtual_machine(vmi_request(vmi.clone())),
        "sync on the target",
    )
    .await;

    // The source's handler deletes the migrated domain: the source launcher exits.
    ok(
        source.delete_virtual_machine(vmi_request(vmi.clone())),
        "delete on the source",
    )
    .await;
    assert_eq!(
        p.source_launcher.wait_exit(Duration::from_secs(60)),
        Some(0)
    );
    // The target's VM ends; its own overlay is sound.
    ok(
        target.delete_virtual_machine(vmi_request(vmi)),
        "delete on the target",
    )
    .await;
    assert_eq!(
        p.target_launcher.wait_exit(Duration::from_secs(60)),
        Some(0)
    );
    let overlay = p
        .target
        .paths
        .overlay(&launcher::paths::PathName::volume("containerdisk").unwrap());
    let check = std::process::Command::new("qemu-img")
        .args(["check", "-q", "-f", "qcow2"])
        .arg(&overlay)
        .output()
        .expect("qemu-img (qemu-utils)");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_migration_leaves_the_vmi_on_the_source_and_the_target_lets_go() {
    require_root_and_kvm();
    let mut p = pair();
    let mut source = cmd_client(&p.source).await;
    let mut target = cmd_client(&p.target).await;
    // Rewriting 16 MiB per tick against 1 MiB/s: it cannot converge.
    let args = "console=ttyS0 checks=serial exit=tick wait=600 dirty=16";
    ok(
        source.sync_virtual_machine(vmi_request(vmi_json(args, serde_json::json!({})))),
        "sync",
    )
    .await;
    wait_log(&p.source, "the guest ticks", |t| {
        t.contains("dirty ok pass=10")
    })
    .await;
    let vmi = migrating_vmi(args);
    ok(
        target.sync_migration_target(vmi_request(vmi.clone())),
        "SyncMigrationTarget",
    )
    .await;
    let slow = OPTIONS.replace(r#""Bandwidth":"0""#, r#""Bandwidth":"1Mi""#);
    ok(
        source.migrate_virtual_machine(migration_request(vmi.clone(), &slow)),
        "Migrate",
    )
    .await;
    p.target_notify
        .expect(BOOT, "the stream started", |_, d| {
            d.status.reason == StateChangeReason::Migration
        })
        .await;

    ok(
        source.cancel_virtual_machine_migration(vmi_request(vmi.clone())),
        "Cancel",
    )
    .await;
    let (_, aborting) = p
        .source_notify
        .expect(BOOT, "aborting", |_, d| {
            migration_of(d).is_some_and(|m| m.abort_status == "Aborting")
        })
        .await;
    assert!(migration_of(&aborting).unwrap().end_timestamp.is_none());
    let (_, ended) = p
        .source_notify
        .expect(BOOT, "the abort's outcome", |_, d| {
            migration_of(d).is_some_and(|m| m.end_timestamp.is_some())
        })
        .await;
    let m = migration_of(&ended).unwrap();
    assert!(m.failed, "{m:?}");
    assert_eq!(m.failure_reason, "Live migration has been aborted");
    assert_eq!(m.abort_status, "Succeeded");
    assert_eq!(
        ended.status.status,
        LifeCycle::Running,
        "the VM runs on at the source"
    );
    // A second cancel changes nothing.
    ok(
        source.cancel_virtual_machine_migration(vmi_request(vmi.clone())),
        "Cancel again",
    )
    .await;
    let passes = log_text(&p.source).matches("dirty ok").count();
    wait_log(&p.source, "the guest ticks on at the source", |t| {
        t.matches("dirty ok").count() > passes + 2
    })
    .await;
    assert!(!log_text(&p.source).contains("FAIL"));

    // The target's domain is gone; its handler lets it go and it exits.
    p.target_notify
        .expect(BOOT, "the target's domain gone", |_, d| {
            d.status.status == LifeCycle::NoState
        })
        .await;
    ok(
        target.signal_target_pod_cleanup(vmi_request(vmi.clone())),
        "SignalTargetPodCleanup",
    )
    .await;
    assert_eq!(
        p.target_launcher.wait_exit(Duration::from_secs(30)),
        Some(0)
    );
    ok(
        source.kill_virtual_machine(vmi_request(vmi)),
        "kill the source",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_requests_without_what_they_need_are_refused_with_kubevirts_messages() {
    require_root_and_kvm();
    let pod = Pod::new();
    let _notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let mut launcher = pod.start_launcher_with_env(&[], &[("POD_NAME", TARGET_POD)]);
    let mut cmd = cmd_client(&pod).await;
    let refused = |reply: proto::grpc::cmd::v1::Response| {
        assert!(!reply.success);
        reply.message
    };
    let vmi = migrating_vmi(ARGS);
    let no_state = vmi_json(ARGS, serde_json::json!({}));
    for (request, expected) in [
        (
            migration_request(vmi.clone(), ""),
            "migration options object not present in command server request",
        ),
        (
            migration_request(vmi.clone(), "{not json"),
            "no valid migration options object present in command server request",
        ),
        (
            migration_request(vmi.clone(), r#"{"ProgressTimeout":"soon"}"#),
            "no valid migration options object present in command server request",
        ),
        (
            migration_request(no_state.clone(), OPTIONS),
            "cannot migrate VMI until migrationState is ready",
        ),
        (
            migration_request(b"[]".to_vec(), OPTIONS),
            "No valid vmi object present in command server request",
        ),
        // Nothing runs here to migrate.
        (
            migration_request(vmi.clone(), OPTIONS),
            "no domain is defined",
        ),
    ] {
        let reply = cmd
            .migrate_virtual_machine(request)
            .await
            .unwrap()
            .into_inner();
        let message = refused(reply);
        assert!(message.contains(expected), "{expected}: {message}");
    }
    let reply = cmd
        .sync_migration_target(vmi_request(no_state))
        .await
        .unwrap()
        .into_inner();
    assert!(refused(reply).contains("until migrationState is ready"));
    // Cancel and finalize with nothing running, and a cleanup for another pod: true,
    // and the launcher stays.
    ok(
        cmd.cancel_virtual_machine_migration(vmi_request(vmi.clone())),
        "cancel",
    )
    .await;
    ok(
        cmd.finalize_virtual_machine_migration(vmi_request(vmi.clone())),
        "finalize",
    )
    .await;
    let other_pod = String::from_utf8(vmi.clone())
        .unwrap()
        .replace(TARGET_POD, "virt-launcher-testvmi-other");
    ok(
        cmd.signal_target_pod_cleanup(vmi_request(other_pod.into_bytes())),
        "cleanup of another pod",
    )
    .await;
    ok(cmd.ping(EmptyRequest {}), "still there").await;
    // A cleanup for this pod, still waiting for a domain: it exits (KubeVirt's early
    // exit signal).
    ok(cmd.signal_target_pod_cleanup(vmi_request(vmi)), "cleanup").await;
    assert_eq!(launcher.wait_exit(Duration::from_secs(30)), Some(0));
}
