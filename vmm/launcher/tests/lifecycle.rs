//! The full lifecycle of a VMI through the real launcher binary, its real
//! cmd socket and a notify server standing in for the handler: sync →
//! running event → GetDomain → pause → unpause → shutdown → shutoff → delete
//! → gone event and exit; kill; bad input; a late notify socket.

mod common;

use common::*;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use proto::grpc::cmd::info::{CmdInfoRequest, cmd_info_client::CmdInfoClient};
use proto::grpc::cmd::v1::EmptyRequest;
use std::time::Duration;

const BOOT: Duration = Duration::from_secs(60);
const ARGS: &str = "console=ttyS0 checks=serial,virtio-blk,virtio-rng exit=halt wait=600";
/// One vCPU online of the two `maxSockets: 2` declares.
const ARGS_SMP: &str =
    "console=ttyS0 checks=serial,smp,virtio-blk,virtio-rng cpus=1 exit=halt wait=600";

fn has_deletion_timestamp(d: &Domain) -> bool {
    d.spec
        .metadata
        .kubevirt
        .grace_period
        .as_ref()
        .is_some_and(|g| g.deletion_timestamp.is_some())
}

fn status_is(status: LifeCycle, reason: StateChangeReason) -> impl Fn(&str, &Domain) -> bool {
    move |_, d| d.status.status == status && d.status.reason == reason
}

fn sha(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sync_pause_unpause_shutdown_delete() {
    require_root_and_kvm();
    let pod = Pod::new();
    let base = pod.container_disk(0, &vec![0x5a; 1 << 20]);
    let base_before = sha(&base);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let mut launcher = pod.start_launcher(&[]);

    let channel = launcher::server::unix_channel(&pod.paths.launcher_socket())
        .await
        .unwrap();
    let versions = CmdInfoClient::new(channel)
        .info(CmdInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(versions.supported_cmd_versions, vec![1]);

    let mut cmd = cmd_client(&pod).await;
    ok(cmd.ping(EmptyRequest {}), "ping").await;
    // No domain yet: GetDomain answers success with an empty domain.
    let none = cmd.get_domain(EmptyRequest {}).await.unwrap().into_inner();
    assert_eq!(none.domain, "");

    // A disk serial and CPU hot-plug headroom: what the handler and the
    // guest see of them is checked below.
    let vmi = vmi_json(
        ARGS_SMP,
        serde_json::json!({"domain": {
            "cpu": {"sockets": 1, "maxSockets": 2},
            "devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "virtio"}, "serial": "D1SK-SERIAL"}]}
        }}),
    );
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let (t, added) = notify
        .expect(
            BOOT,
            "ADDED Running",
            status_is(LifeCycle::Running, StateChangeReason::Unknown),
        )
        .await;
    assert_eq!(t, "ADDED");
    assert_eq!(added.spec.metadata.kubevirt.uid, UID);
    assert_eq!(added.key(), "ns1/testvmi");
    assert_eq!(
        added
            .spec
            .metadata
            .kubevirt
            .grace_period
            .as_ref()
            .unwrap()
            .deletion_grace_period_seconds,
        20
    );

    // GetDomain returns the same domain, with KubeVirt's keys.
    let json = cmd
        .get_domain(EmptyRequest {})
        .await
        .unwrap()
        .into_inner()
        .domain;
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["Spec"]["Name"], "ns1_testvmi");
    assert_eq!(value["Status"]["Status"], "Running");
    assert_eq!(
        value["Spec"]["Devices"]["Disks"][0]["Target"]["Device"],
        "vda"
    );
    assert_eq!(
        value["Spec"]["Devices"]["Disks"][0]["Alias"]["Name"],
        "containerdisk"
    );
    let overlay = pod
        .paths
        .overlay(&launcher::paths::PathName::volume("containerdisk").unwrap());
    assert_eq!(
        value["Spec"]["Devices"]["Disks"][0]["Source"]["File"],
        overlay.to_string_lossy().as_ref()
    );
    // The kernel as KubeVirt's launcher names it: a link under the
    // container-disk directory into the kernel-boot image.
    let kernel_link = pod.paths.container_disk_dir.join("kernel-boot/guest.elf");
    assert_eq!(
        value["Spec"]["OS"]["Kernel"],
        kernel_link.to_string_lossy().as_ref()
    );
    assert!(std::fs::read_link(&kernel_link).is_ok());
    // No cache mode in the VMI: direct I/O works on the test's file
    // system (ext4), so KubeVirt's rule picks `none`.
    assert_eq!(
        value["Spec"]["Devices"]["Disks"][0]["Driver"]["Cache"],
        "none"
    );
    assert_eq!(
        value["Spec"]["Devices"]["Disks"][0]["Serial"],
        "D1SK-SERIAL"
    );
    // What libvirt reports: memory in KiB and the current memory the
    // handler copies into `status.memory.guestCurrent`.
    assert_eq!(
        value["Spec"]["CurrentMemory"],
        serde_json::json!({"Value": 65536, "Unit": "KiB"})
    );
    assert_eq!(value["Spec"]["Memory"], value["Spec"]["CurrentMemory"]);
    // maxSockets: two vCPUs declared, the first online, as KubeVirt's
    // converter writes them.
    assert_eq!(value["Spec"]["VCPU"]["CPUs"], 2);
    assert_eq!(value["Spec"]["CPU"]["Topology"]["Sockets"], 2);
    assert_eq!(
        value["Spec"]["VCPUs"],
        serde_json::json!({"VCPU": [
            {"ID": 0, "Enabled": "yes", "Hotpluggable": "no", "Order": 0},
            {"ID": 1, "Enabled": "no", "Hotpluggable": "yes", "Order": 0}
        ]})
    );

    // The guest ran its checks; the blk check wrote into the overlay only.
    let uid = launcher::paths::PathName::vmi_uid(UID).unwrap();
    let serial = pod.paths.serial_socket(&uid);
    wait_for(&serial, Duration::from_secs(10));
    // The console log (tailed by KubeVirt's guest-console-log container)
    // fills with the guest's output.
    let log = pod.paths.serial_log(&uid);
    let deadline = std::time::Instant::now() + BOOT;
    loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.contains("DONE passed=") {
            assert!(!text.contains("FAIL"), "guest checks failed:\n{text}");
            assert!(text.contains("TEST virtio-blk-write PASS"), "{text}");
            assert!(text.contains("TEST virtio-rng"), "{text}");
            // The VMI's disk serial is the guest's (VIRTIO_BLK_T_GET_ID).
            assert!(text.contains("id=D1SK-SERIAL"), "{text}");
            // Only the enabled vCPU runs (the guest expects cpus=1).
            assert!(text.contains("TEST smp PASS cpus=1"), "{text}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "console log has no result:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Statistics in KubeVirt's `stats.DomainStats` shape: the guest's disk
    // requests on `vda` (alias `containerdisk`), one running vCPU with CPU
    // time, the launcher's CPU time and memory.
    let reply = cmd
        .get_domain_stats(EmptyRequest {})
        .await
        .unwrap()
        .into_inner();
    assert!(reply.response.as_ref().unwrap().success);
    let stats: serde_json::Value = serde_json::from_str(&reply.domain_stats).unwrap();
    assert_eq!(stats["Name"], "ns1_testvmi");
    let block = &stats["Block"][0];
    assert_eq!(block["Name"], "vda");
    assert_eq!(block["Alias"], "containerdisk");
    assert_eq!(block["Path"], overlay.to_string_lossy().as_ref());
    assert_eq!(block["RdReqsSet"], true);
    assert!(block["RdReqs"].as_u64().unwrap() >= 2, "{block}");
    assert!(block["WrBytes"].as_u64().unwrap() >= 512, "{block}");
    assert!(block["FlReqs"].as_u64().unwrap() >= 1, "{block}");
    assert_eq!(block["Errors"], 0);
    assert_eq!(block["Capacity"], 1 << 20);
    assert!(block["Physical"].as_u64().unwrap() > 0, "{block}");
    assert_eq!(stats["Vcpu"].as_array().unwrap().len(), 1);
    assert_eq!(stats["Vcpu"][0]["State"], 1);
    assert!(stats["Vcpu"][0]["Time"].as_u64().unwrap() > 0, "{stats}");
    assert!(stats["Cpu"]["Time"].as_u64().unwrap() > 0, "{stats}");
    assert_eq!(stats["Memory"]["RSSSet"], true);
    assert!(stats["Memory"]["RSS"].as_u64().unwrap() > 0);
    assert_eq!(stats["Net"].as_array().map(Vec::len), Some(0));

    // Sync again: idempotent, no restart.
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;

    // Pause and unpause.
    ok(cmd.pause_virtual_machine(vmi_request(vmi.clone())), "pause").await;
    notify
        .expect(
            Duration::from_secs(20),
            "Paused/User",
            status_is(LifeCycle::Paused, StateChangeReason::User),
        )
        .await;
    // A sync must not unpause a user-paused VM.
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let d = Domain::from_json(
        &cmd.get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
    )
    .unwrap();
    assert_eq!(d.status.status, LifeCycle::Paused);
    ok(
        cmd.unpause_virtual_machine(vmi_request(vmi.clone())),
        "unpause",
    )
    .await;
    notify
        .expect(
            Duration::from_secs(20),
            "Running after unpause",
            status_is(LifeCycle::Running, StateChangeReason::Unknown),
        )
        .await;

    // A graceful shutdown the guest honours, event by event as libvirt
    // reports it: the deletion timestamp while still Running (the handler
    // keeps asking until the state changes), then ShuttingDown/Unknown once
    // the guest goes down, then Shutoff/Shutdown.
    ok(
        cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
        "shutdown",
    )
    .await;
    let (t, asked) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(t, "MODIFIED");
    assert!(has_deletion_timestamp(&asked));
    assert_eq!(
        (asked.status.status, asked.status.reason),
        (LifeCycle::Running, StateChangeReason::Unknown)
    );
    let (t, down) = notify.next(BOOT).await;
    assert_eq!(t, "MODIFIED");
    assert_eq!(
        (down.status.status, down.status.reason),
        (LifeCycle::ShuttingDown, StateChangeReason::Unknown)
    );
    let (_, off) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(
        (off.status.status, off.status.reason),
        (LifeCycle::Shutoff, StateChangeReason::Shutdown)
    );
    // A repeated request changes nothing.
    ok(
        cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
        "shutdown",
    )
    .await;

    // The base image is untouched; the overlay is a valid qcow2 over it.
    assert_eq!(
        sha(&base),
        base_before,
        "the container disk base was modified"
    );
    let check = std::process::Command::new("qemu-img")
        .arg("check")
        .arg(&overlay)
        .output()
        .expect("qemu-img is installed");
    assert!(
        check.status.success(),
        "qemu-img check: {}",
        String::from_utf8_lossy(&check.stdout)
    );

    // Delete: the gone event, an empty GetDomain, and the launcher exits.
    ok(
        cmd.delete_virtual_machine(vmi_request(vmi.clone())),
        "delete",
    )
    .await;
    let (t, gone) = notify
        .expect(Duration::from_secs(20), "gone", |_, d| d.is_gone())
        .await;
    assert_eq!(t, "MODIFIED");
    assert_eq!(gone.status.status, LifeCycle::NoState);
    assert_eq!(gone.status.reason, StateChangeReason::NonExistent);
    assert_eq!(gone.spec.metadata.kubevirt.uid, UID);
    let code = tokio::task::spawn_blocking(move || launcher.wait_exit(Duration::from_secs(30)))
        .await
        .unwrap();
    assert_eq!(
        code,
        Some(0),
        "the launcher exits cleanly after the domain is deleted"
    );
    assert!(
        !pod.paths.launcher_socket().exists(),
        "launcher-sock is removed on exit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_reports_destroyed() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    notify
        .expect(
            BOOT,
            "Running",
            status_is(LifeCycle::Running, StateChangeReason::Unknown),
        )
        .await;
    ok(cmd.kill_virtual_machine(vmi_request(vmi.clone())), "kill").await;
    notify
        .expect(
            Duration::from_secs(20),
            "Shutoff/Destroyed",
            status_is(LifeCycle::Shutoff, StateChangeReason::Destroyed),
        )
        .await;
    let d = Domain::from_json(
        &cmd.get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
    )
    .unwrap();
    assert_eq!(d.status.status, LifeCycle::Shutoff);
}

/// KubeVirt's handler, driving the launcher as it drives a stock one, sends
/// SIGTERM and then ShutdownVirtualMachine right after the domain starts,
/// while the guest still boots and has not enabled ACPI: the power-button
/// press stays pending until the guest enables the GED, which then powers
/// off through S5. The domain ends Shutoff/Shutdown, as with libvirt, not
/// Destroyed at the end of the grace period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_right_after_the_sync_reaches_the_guest_when_its_acpi_comes_up() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    // The guest enables its power button 2 s after its checks: long after
    // the requests below.
    let vmi = vmi_json(
        "console=ttyS0 checks=serial exit=halt wait=600 acpi_delay=2000",
        serde_json::json!({}),
    );
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(
            libc::pid_t::try_from(launcher.child.id()).expect("a Linux pid fits a pid_t"),
        ),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    ok(
        cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
        "shutdown",
    )
    .await;
    let (_, off) = notify
        .expect(BOOT, "Shutoff", |_, d| {
            d.status.status == LifeCycle::Shutoff
        })
        .await;
    let uid = launcher::paths::PathName::vmi_uid(UID).unwrap();
    let console = std::fs::read_to_string(pod.paths.serial_log(&uid)).unwrap_or_default();
    assert_eq!(
        off.status.reason,
        StateChangeReason::Shutdown,
        "the guest did not see the power button:\n{console}"
    );
    // The press came before the guest enabled the button, and it saw the
    // press only then.
    let enabled = console.find("WAITING for Ctrl-Alt-Del or the power button");
    let seen = console.find("SHUTDOWN requested\nPOWEROFF acpi-s5");
    assert!(
        console.contains("ACPI power button enabled later") && enabled.is_some() && enabled < seen,
        "{console}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_vmis_are_refused_while_the_vm_keeps_running() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;

    // Not JSON at all.
    let reply = cmd
        .sync_virtual_machine(vmi_request(b"{not json".to_vec()))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success);
    assert!(
        reply.message.contains("cannot parse the VMI JSON"),
        "{}",
        reply.message
    );
    // A bus this launcher does not have: the message names the field.
    let sata = vmi_json(
        ARGS,
        serde_json::json!({"domain": {"devices": {"disks": [{"name": "containerdisk", "disk": {"bus": "sata"}}]}}}),
    );
    let reply = cmd
        .sync_virtual_machine(vmi_request(sata))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success);
    assert!(
        reply
            .message
            .contains("spec.domain.devices.disks[0].disk.bus"),
        "{}",
        reply.message
    );
    // A volume name that would lead out of the pod's directories, and two volumes of one
    // name (the second a cloud-init volume): refused with the field, not a crash, and no
    // file appears outside the pod.
    let escape = format!("escape-{}", std::process::id());
    let outside = pod
        .root
        .path()
        .parent()
        .unwrap()
        .join(format!("{escape}.qcow2"));
    let climbing = format!("../../../../../{escape}");
    let hostile = vmi_json(
        ARGS,
        serde_json::json!({
            "domain": {"devices": {"disks": [{"name": climbing, "disk": {"bus": "virtio"}}]}},
            "volumes": [{"name": climbing, "emptyDisk": {"capacity": "1Mi"}}],
        }),
    );
    let reply = cmd
        .sync_virtual_machine(vmi_request(hostile))
        .await
        .expect("an answer, not a gRPC error")
        .into_inner();
    assert!(!reply.success);
    assert!(
        reply.message.contains("spec.volumes[0].name"),
        "{}",
        reply.message
    );
    assert!(!outside.exists(), "{} was created", outside.display());
    let twice = vmi_json(
        ARGS,
        serde_json::json!({"volumes": [
            {"name": "containerdisk", "containerDisk": {"image": "test/disk:latest"}},
            {"name": "containerdisk", "cloudInitNoCloud": {"userData": "#cloud-config"}},
        ]}),
    );
    let reply = cmd
        .sync_virtual_machine(vmi_request(twice))
        .await
        .expect("an answer, not a gRPC error (INTERNAL from a panic)")
        .into_inner();
    assert!(!reply.success);
    assert!(
        reply
            .message
            .contains("spec.volumes[1] and spec.volumes[0] must not have the same name"),
        "{}",
        reply.message
    );
    // Firmware boot instead of kernel boot.
    let efi = vmi_json(
        ARGS,
        serde_json::json!({"domain": {"firmware": {"kernelBoot": null, "bootloader": {"efi": {}}}}}),
    );
    let reply = cmd
        .sync_virtual_machine(vmi_request(efi))
        .await
        .unwrap()
        .into_inner();
    assert!(
        reply
            .message
            .contains("spec.domain.firmware.bootloader.efi"),
        "{}",
        reply.message
    );
    // Nothing was defined by the failures.
    assert_eq!(
        cmd.get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
        ""
    );

    // Now a good VMI, then garbage again: the VM keeps running.
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi)), "sync").await;
    notify
        .expect(
            BOOT,
            "Running",
            status_is(LifeCycle::Running, StateChangeReason::Unknown),
        )
        .await;
    let reply = cmd
        .sync_virtual_machine(vmi_request(b"[]".to_vec()))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success);
    let other_uid = String::from_utf8(vmi_json(ARGS, serde_json::json!({})))
        .unwrap()
        .replace(UID, "99999999-2222-3333-4444-555555555555");
    let reply = cmd
        .sync_virtual_machine(vmi_request(other_uid.into_bytes()))
        .await
        .unwrap()
        .into_inner();
    assert!(
        !reply.success && reply.message.contains("not 99999999"),
        "{}",
        reply.message
    );
    let d = Domain::from_json(
        &cmd.get_domain(EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
    )
    .unwrap();
    assert_eq!(d.status.status, LifeCycle::Running);

    // Unimplemented RPCs say so.
    let err = cmd.get_qemu_version(EmptyRequest {}).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(err.message().contains("GetQemuVersion"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_reach_a_notify_socket_that_appears_late() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(ARGS, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi)), "sync").await;
    // The handler shows up three seconds later.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let (t, d) = notify
        .expect(Duration::from_secs(30), "ADDED after retries", |_, _| true)
        .await;
    assert_eq!(t, "ADDED");
    assert_eq!(d.status.status, LifeCycle::Running);
}

#[test]
fn launcher_exits_when_no_domain_is_defined_in_time() {
    require_root_and_kvm();
    let pod = Pod::new();
    let mut launcher = pod.start_launcher(&["--qemu-timeout", "2s"]);
    let code = launcher.wait_exit(Duration::from_secs(30));
    assert_eq!(
        code,
        Some(1),
        "no domain within --qemu-timeout is a failure"
    );
}

#[test]
fn monitor_forwards_sigterm_and_returns_the_launcher_status() {
    require_root_and_kvm();
    let pod = Pod::new();
    let monitor = std::process::Command::new(env!("CARGO_BIN_EXE_virt-launcher-monitor"))
        .args(pod.flags(&["--keep-after-failure=false"]))
        .env("VIRT_LAUNCHER_BINARY", env!("CARGO_BIN_EXE_virt-launcher"))
        .spawn()
        .unwrap();
    let mut monitor = Launcher { child: monitor };
    wait_for(&pod.paths.launcher_socket(), Duration::from_secs(20));
    // A stale container-disk socket is removed on exit.
    std::fs::create_dir_all(&pod.paths.container_disk_dir).unwrap();
    let stale = pod.paths.container_disk_dir.join("disk_0.sock");
    std::fs::write(&stale, b"").unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(
            libc::pid_t::try_from(monitor.child.id()).expect("a Linux pid fits a pid_t"),
        ),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let code = monitor.wait_exit(Duration::from_secs(30));
    assert_eq!(
        code,
        Some(0),
        "SIGTERM before any domain: the launcher exits 0 and so does the monitor"
    );
    assert!(!stale.exists());
    assert!(!pod.paths.launcher_socket().exists());
}
