//! VMIs without `kernelBoot`, as KubeVirt users write them: the launcher boots the container
//! disk (under its qcow2 overlay) through the disk's boot loader configuration, reports the
//! entry as an event, and ends a disk with nothing to boot at once, with the reason.

mod common;

use common::*;
use proto::domain::{Domain, LifeCycle, StateChangeReason};
use std::time::Duration;
use test_guest::disks::{Kernel, Layout, write_boot_disk};

const BOOT: Duration = Duration::from_secs(120);
const CHECKS: &str =
    "console=ttyS0 checks=serial,bootparams,smbios,rtc,virtio-blk,virtio-rng exit=poweroff";
/// The VMI's firmware UUID and serial, which the guest reads back from SMBIOS.
const FIRMWARE_UUID: &str = "6f4e1c2a-9b3d-4e5f-8a7b-1c2d3e4f5a6b";
const FIRMWARE_SERIAL: &str = "vmi-serial-7";

/// A VMI with the container disk and no kernel boot; `firmware` is merged into the domain.
fn disk_vmi(firmware: serde_json::Value) -> Vec<u8> {
    let mut vmi: serde_json::Value =
        serde_json::from_slice(&vmi_json("", serde_json::json!({}))).unwrap();
    let domain = &mut vmi["spec"]["domain"];
    domain.as_object_mut().unwrap().remove("firmware");
    let mut firmware = if firmware.is_null() {
        serde_json::json!({})
    } else {
        firmware
    };
    firmware["uuid"] = serde_json::json!(FIRMWARE_UUID);
    firmware["serial"] = serde_json::json!(FIRMWARE_SERIAL);
    domain["firmware"] = firmware;
    serde_json::to_vec(&vmi).unwrap()
}

/// `SyncVirtualMachine` as KubeVirt's handler sends it: with the cluster's SMBIOS settings
/// (KubeVirt's defaults).
fn sync_request(vmi: Vec<u8>) -> proto::grpc::cmd::v1::VmiRequest {
    let mut request = vmi_request(vmi);
    request.options = Some(proto::grpc::cmd::v1::VirtualMachineOptions {
        virtual_machine_sm_bios: Some(proto::grpc::cmd::v1::SmBios {
            manufacturer: "KubeVirt".into(),
            product: "None".into(),
            family: "KubeVirt".into(),
            ..Default::default()
        }),
        ..Default::default()
    });
    request
}

/// A bootable disk image of `layout` with the test guest, as bytes.
fn boot_disk(layout: Layout) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.raw");
    write_boot_disk(
        &path,
        layout,
        &Kernel {
            image: test_guest::ELF,
            initrd: None,
            cmdline: CHECKS,
        },
    )
    .unwrap();
    std::fs::read(&path).unwrap()
}

fn status_is(status: LifeCycle, reason: StateChangeReason) -> impl Fn(&str, &Domain) -> bool {
    move |_, d| d.status.status == status && d.status.reason == reason
}

async fn boots(layout: Layout, firmware: serde_json::Value, expected_entry: &str, partition: &str) {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &boot_disk(layout));
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    ok(
        cmd.sync_virtual_machine(sync_request(disk_vmi(firmware))),
        "sync",
    )
    .await;
    // The entry, its configuration and partition, on the VMI's disk.
    let event = notify
        .k8s_event(Duration::from_secs(20), "BootedFromDisk")
        .await;
    assert_eq!(event["type"], "Normal");
    assert_eq!(event["involvedObject"]["uid"], UID);
    let message = event["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("booted disk \"containerdisk\"")
            && message.contains(expected_entry)
            && message.contains(partition),
        "{message}"
    );
    // The guest ran its checks on the overlay and powered off.
    notify
        .expect(
            BOOT,
            "Shutoff/Shutdown",
            status_is(LifeCycle::Shutoff, StateChangeReason::Shutdown),
        )
        .await;
    let uid = launcher::paths::PathName::vmi_uid(UID).unwrap();
    let text = std::fs::read_to_string(pod.paths.serial_log(&uid)).unwrap_or_default();
    assert!(
        text.contains("DONE passed=")
            && !text.contains("FAIL")
            && text.contains("TEST virtio-rng-read PASS")
            && text.contains("TEST rtc PASS"),
        "{text}"
    );
    // SMBIOS as libvirt writes it for KubeVirt: the cluster's settings, the VMI's firmware
    // UUID and serial.
    assert!(
        text.contains(&format!(
            "TEST smbios PASS manufacturer=KubeVirt product=None family=KubeVirt serial={FIRMWARE_SERIAL} uuid={FIRMWARE_UUID} cpus=1 memory_mib=64"
        )),
        "{text}"
    );
    // The domain says which firmware the VMI asked for, and carries its SMBIOS sysinfo.
    let domain = Domain::from_json(
        &cmd.get_domain(proto::grpc::cmd::v1::EmptyRequest {})
            .await
            .unwrap()
            .into_inner()
            .domain,
    )
    .unwrap();
    let os = domain.spec.os.unwrap();
    assert!(os.kernel.is_empty(), "{:?}", os.kernel);
    assert_eq!(os.smbios.unwrap().mode, "sysinfo");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vmi_without_kernel_boot_boots_its_container_disk_by_bios() {
    boots(
        Layout::Alpine,
        serde_json::Value::Null,
        "extlinux entry \"lts\" from /boot/extlinux.conf",
        "partition 1 (hd0,msdos1)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_efi_vmi_without_secure_boot_boots_through_the_esp() {
    boots(
        Layout::Ubuntu,
        serde_json::json!({"bootloader": {"efi": {"secureBoot": false}}}),
        "GRUB entry \"Ubuntu\" from /boot/grub/grub.cfg",
        "partition 2 (hd0,gpt2)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_disk_with_nothing_to_boot_ends_the_domain_at_once_with_the_reason() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0u8; 8 << 20]);
    let mut notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let reply = cmd
        .sync_virtual_machine(vmi_request(disk_vmi(serde_json::Value::Null)))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success);
    assert!(
        reply.message.contains("cannot boot disk \"containerdisk\"")
            && reply
                .message
                .contains("no boot loader configuration found for BIOS boot"),
        "{}",
        reply.message
    );
    let event = notify
        .k8s_event(Duration::from_secs(20), "BootFailed")
        .await;
    assert_eq!(event["type"], "Warning");
    assert_eq!(event["message"].as_str(), Some(reply.message.as_str()));
    // Defined and crashed: KubeVirt's handler makes the VMI Failed.
    notify
        .expect(
            Duration::from_secs(20),
            "Shutoff/Crashed",
            status_is(LifeCycle::Shutoff, StateChangeReason::Crashed),
        )
        .await;
    // A later sync neither starts a VM nor fails differently: the domain is defined.
    ok(
        cmd.sync_virtual_machine(vmi_request(disk_vmi(serde_json::Value::Null))),
        "sync",
    )
    .await;
}
