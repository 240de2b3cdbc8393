//! A VMI whose `kernelBoot` is Debian's stock kernel and the initramfs of
//! `scripts/stock-linux.sh`, run by the launcher as KubeVirt runs it, then
//! shut down through `ShutdownVirtualMachine` (an ACPI power-button press).
//!
//! Where the kernel reaches its `/init` (hardware KVM), the initramfs waits
//! for the power button (`stock.wait`) and powers off through ACPI S5: the
//! domain goes ShuttingDown, then Shutoff/Shutdown. On this project's
//! machines (an instruction-emulating KVM, see `vmm/docs/stock-kernel.md`) the kernel
//! is still in early boot when asked, so the test checks that it booted
//! through the launcher (its banner and our ACPI tables on the console),
//! that the request is recorded as KubeVirt's handler expects, and that a
//! kill then ends the domain.

mod common;

use common::*;
use proto::domain::{LifeCycle, StateChangeReason};
use std::time::{Duration, Instant};
use test_guest::stock_linux::artifacts;

const CMDLINE: &str = "console=ttyS0 earlyprintk=serial,ttyS0,115200 reboot=k panic=-1 nowatchdog noxsave \
    clearcpuid=popcnt,smap,fsgsbase,rdpid,rdrand,rdseed,clflushopt,clwb,pku,umip,la57,avx2,bmi1,bmi2,invpcid,pcid \
    stock.wait";
/// On hardware KVM the kernel runs `/init` within seconds and the
/// initramfs waits for the button soon after (its DHCP may take a while).
const TO_INIT: Duration = Duration::from_secs(20);
const TO_WAITING: Duration = Duration::from_secs(90);
/// Early boot on the emulating KVM: the banner and the ACPI tables (about
/// 22 s of VMM CPU; 120 s of wall time at a load average of 10-13 on 2
/// cores). Only a failing run waits this long.
const EARLY: Duration = Duration::from_secs(600);

fn console(pod: &Pod) -> String {
    let uid = launcher::paths::PathName::vmi_uid(UID).expect("the test UID");
    std::fs::read_to_string(pod.paths.serial_log(&uid)).unwrap_or_default()
}

/// Waits until the console shows `text`; false after `timeout`.
async fn console_shows(pod: &Pod, text: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if console(pod).contains(text) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stock_kernel_vmi_boots_and_is_shut_down_by_acpi() {
    require_root_and_kvm();
    let (kernel, initrd) = artifacts();
    let pod = Pod::new();
    let boot = pod.paths.kernel_boot_dir.join("boot");
    std::fs::copy(&kernel, boot.join("vmlinuz")).unwrap();
    std::fs::copy(&initrd, boot.join("initramfs.gz")).unwrap();
    let mut disk = b"kubevirt-rs-stock-marker".to_vec();
    disk.resize(1 << 20, 0);
    pod.container_disk(0, &disk);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = vmi_json(
        CMDLINE,
        serde_json::json!({"domain": {
            "memory": {"guest": "512Mi"},
            "firmware": {"kernelBoot": {"container": {
                "kernelPath": "/boot/vmlinuz", "initrdPath": "/boot/initramfs.gz"
            }}}
        }}),
    );
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let (t, _) = notify.next(Duration::from_secs(60)).await;
    assert_eq!(t, "ADDED");

    let waiting = console_shows(&pod, "Run /init as init process", TO_INIT).await
        && console_shows(&pod, "STOCK waiting for the power button", TO_WAITING).await;
    if !waiting {
        // The emulating KVM: still in early boot. The packaged bzImage was
        // decompressed on the host and read our ACPI tables.
        assert!(
            console_shows(&pod, "ACPI: XSDT 0x", EARLY).await,
            "the stock kernel did not boot through the launcher:\n{}",
            console(&pod)
        );
        assert!(console(&pod).contains("Linux version 6."));
    }

    ok(
        cmd.shutdown_virtual_machine(vmi_request(vmi.clone())),
        "shutdown",
    )
    .await;
    let (t, asked) = notify.next(Duration::from_secs(20)).await;
    assert_eq!(t, "MODIFIED");
    assert!(
        asked
            .spec
            .metadata
            .kubevirt
            .grace_period
            .as_ref()
            .is_some_and(|g| g.deletion_timestamp.is_some()),
        "the shutdown request is recorded for the handler's grace timer"
    );
    if waiting {
        notify
            .expect(
                Duration::from_secs(60),
                "ShuttingDown after the power button",
                |_, d| d.status.status == LifeCycle::ShuttingDown,
            )
            .await;
        notify
            .expect(Duration::from_secs(30), "Shutoff/Shutdown", |_, d| {
                (d.status.status, d.status.reason)
                    == (LifeCycle::Shutoff, StateChangeReason::Shutdown)
            })
            .await;
        assert!(console(&pod).contains("STOCK power button: powering off"));
        return;
    }
    // Too early for the guest to act on the button: the handler's grace
    // period ends in a kill.
    ok(cmd.kill_virtual_machine(vmi_request(vmi.clone())), "kill").await;
    notify
        .expect(Duration::from_secs(30), "Shutoff after the kill", |_, d| {
            d.status.status == LifeCycle::Shutoff
                && matches!(
                    d.status.reason,
                    StateChangeReason::Destroyed | StateChangeReason::Crashed
                )
        })
        .await;
}
