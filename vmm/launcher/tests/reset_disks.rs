//! The container disk's overlay across resets, through the real launcher: the guest
//! writes 32 MiB without a flush, the VM resets (the guest's i8042 reset, or the Reset
//! RPC while the guest is still writing), the new VM writes 32 MiB more over half of it
//! and powers off. `qemu-img check` must find the overlay clean and every block must
//! hold what was written last, before or after the reset: the old VM's disks are closed
//! before the new VM opens them, and one VM's engine never writes over the other's.

mod common;

use common::*;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use std::time::Duration;
use test_guest::blkfill::{Fill, Reset};

const RUN: Duration = Duration::from_secs(180);

fn status_is(status: LifeCycle, reason: StateChangeReason) -> impl Fn(&str, &Domain) -> bool {
    move |_, d| d.status.status == status && d.status.reason == reason
}

/// Waits until the serial log holds `text`; returns the log.
async fn wait_for_log(pod: &Pod, text: &str) -> String {
    let uid = launcher::paths::PathName::vmi_uid(UID).unwrap();
    let log = pod.paths.serial_log(&uid);
    let deadline = std::time::Instant::now() + RUN;
    loop {
        let contents = std::fs::read_to_string(&log).unwrap_or_default();
        if contents.contains(text) {
            return contents;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no {text:?} in the console log:\n{contents}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs the fill's two generations on the VMI's container disk overlay, the reset
/// between them made by `reset`, and checks the overlay after the guest powered off
/// (the launcher still running, with its last VM).
async fn fill_across_a_reset(reset: Reset) {
    require_root_and_kvm();
    let pod = Pod::new();
    let fill = Fill::TWO_GENERATIONS;
    // A 64 MiB base of zeroes, sparse: the overlay the launcher makes is as large.
    let base = pod.container_disk(0, &[]);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&base)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let args = format!("console=ttyS0 {} exit=poweroff", fill.cmdline(reset));
    let vmi = vmi_json(&args, serde_json::json!({}));
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let (_, added) = notify
        .expect(
            RUN,
            "ADDED Running",
            status_is(LifeCycle::Running, StateChangeReason::Unknown),
        )
        .await;
    // The converter's choice on this file system: cache=none, whose requests of a
    // batch run on the device's I/O threads.
    assert_eq!(
        added.spec.devices.as_ref().unwrap().disks[0]
            .driver
            .as_ref()
            .map(|d| d.cache.as_str()),
        Some("none")
    );

    wait_for_log(&pod, "BLKFILL gen=1 written").await;
    if reset == Reset::Host {
        // The guest goes on rewriting its region: requests are in flight.
        ok(cmd.reset_virtual_machine(vmi_request(vmi.clone())), "reset").await;
    }
    let (_, off) = notify
        .expect(RUN, "Shutoff after the second generation", |_, d| {
            d.status.status == LifeCycle::Shutoff
        })
        .await;
    let uid = launcher::paths::PathName::vmi_uid(UID).unwrap();
    let log = std::fs::read_to_string(pod.paths.serial_log(&uid)).unwrap_or_default();
    assert_eq!(
        off.status.reason,
        StateChangeReason::Shutdown,
        "the guest did not power off after its second generation:\n{log}"
    );
    let log = wait_for_log(&pod, "TEST virtio-blk-fill").await;
    assert!(
        log.contains("TEST virtio-blk-fill PASS gen=2 "),
        "the second VM did not find the first one's writes:\n{log}"
    );
    assert_eq!(log.matches("BLKFILL gen=1 written").count(), 1, "{log}");
    let overlay = pod
        .paths
        .overlay(&launcher::paths::PathName::volume("containerdisk").unwrap());
    fill.verify_qcow2(&overlay)
        .unwrap_or_else(|e| panic!("{}: {e}", overlay.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_reset_keeps_every_write_and_the_overlay_consistent() {
    fill_across_a_reset(Reset::Guest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reset_rpc_keeps_every_write_and_the_overlay_consistent() {
    fill_across_a_reset(Reset::Host).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_whose_new_vm_cannot_start_leaves_the_domain_shut_off_failed() {
    // The old VM is gone once Reset has waited for its end: if the new one cannot
    // start, the domain is down, not Running without a VM.
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0u8; 1 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(
        "console=ttyS0 checks=serial exit=halt wait=600",
        serde_json::json!({}),
    );
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    wait_for_log(&pod, "WAITING").await;
    // The kernel-boot image's kernel disappears: the next VM has nothing to load.
    std::fs::remove_file(pod.paths.kernel_boot_dir.join("boot/guest.elf")).unwrap();
    let reply = cmd
        .reset_virtual_machine(vmi_request(vmi.clone()))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success, "a reset without a kernel succeeded");
    notify
        .expect(
            Duration::from_secs(20),
            "Shutoff/Failed",
            status_is(LifeCycle::Shutoff, StateChangeReason::Failed),
        )
        .await;
    // The launcher goes on serving.
    ok(cmd.ping(proto::grpc::cmd::v1::EmptyRequest {}), "ping").await;
}
