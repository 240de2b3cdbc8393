//! A PVC's disk file through the real launcher: looked up once, below its volume, and
//! never by its name again. A `disk.img` that links out of the volume is refused before
//! anything opens it; the VM keeps the file it was given even when the name is reused and
//! the VM restarts.

mod common;

use common::*;
use launcher::paths::PathName;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use std::path::Path;
use std::time::{Duration, Instant};

const BOOT: Duration = Duration::from_secs(60);
const ARGS: &str = "console=ttyS0 checks=virtio-blk exit=halt wait=600";
/// What the test guest writes at the start of sector 1 of each disk.
const MAGIC: &[u8] = b"virtio-blk-test\n";

/// The test VMI with a second disk on the filesystem PVC `pvc` (its claim's mode recorded in
/// the status, as KubeVirt's controller does).
fn pvc_vmi() -> Vec<u8> {
    let json = vmi_json(
        ARGS,
        serde_json::json!({
            "domain": {"devices": {"disks": [
                {"name": "containerdisk", "disk": {"bus": "virtio"}},
                {"name": "pvc", "disk": {"bus": "virtio"}}
            ]}},
            "volumes": [
                {"name": "containerdisk", "containerDisk": {"image": "test/disk:latest"}},
                {"name": "pvc", "persistentVolumeClaim": {"claimName": "claim"}}
            ]
        }),
    );
    let mut vmi: serde_json::Value = serde_json::from_slice(&json).unwrap();
    vmi["status"]["volumeStatus"] = serde_json::json!([{"name": "pvc", "target": "",
        "persistentVolumeClaimInfo": {"claimName": "claim", "volumeMode": "Filesystem"}}]);
    serde_json::to_vec(&vmi).unwrap()
}

fn pvc_dir(pod: &Pod) -> std::path::PathBuf {
    pod.paths.vmi_disks_dir(&PathName::volume("pvc").unwrap())
}

fn has_magic(path: &Path) -> bool {
    std::fs::read(path).is_ok_and(|b| b.get(512..512 + MAGIC.len()) == Some(MAGIC))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pvc_disk_linked_out_of_its_volume_is_refused_and_never_opened() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    // A file of the launcher's, and the tenant's link to it.
    let secret = pod.root.path().join("launcher-secret");
    std::fs::write(&secret, vec![0x5e; 1 << 20]).unwrap();
    let dir = pvc_dir(&pod);
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::symlink(&secret, dir.join("disk.img")).unwrap();
    let watch = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
    watch
        .add_watch(
            &secret,
            AddWatchFlags::IN_OPEN | AddWatchFlags::IN_ACCESS | AddWatchFlags::IN_MODIFY,
        )
        .unwrap();

    let _notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let reply = cmd
        .sync_virtual_machine(vmi_request(pvc_vmi()))
        .await
        .unwrap()
        .into_inner();
    assert!(!reply.success, "the VM started on a link out of its PVC");
    let expected = format!("volume pvc: {}: EXDEV", dir.join("disk.img").display());
    assert!(
        reply.message.contains(&expected) && reply.message.ends_with("it leads out of its volume"),
        "{}",
        reply.message
    );
    match watch.read_events() {
        Err(nix::errno::Errno::EAGAIN) => {}
        other => panic!("the file outside the volume was used: {other:?}"),
    }
    assert_eq!(std::fs::read(&secret).unwrap(), vec![0x5e; 1 << 20]);
}

/// The launcher opens the PVC's `disk.img` once; a reset restarts the VM on that file even
/// though the name now is another file's (as a name switched between two lookups would be).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_vm_keeps_the_pvc_file_it_opened_when_the_name_is_reused() {
    require_root_and_kvm();
    let pod = Pod::new();
    pod.container_disk(0, &vec![0; 1 << 20]);
    let dir = pvc_dir(&pod);
    std::fs::create_dir_all(&dir).unwrap();
    let (name, first) = (dir.join("disk.img"), dir.join("first.img"));
    std::fs::write(&name, vec![0; 1 << 20]).unwrap();

    let _notify = NotifyRecorder::start(&pod.paths.notify_socket());
    let _launcher = pod.start_launcher(&[]);
    let mut cmd = cmd_client(&pod).await;
    let vmi = pvc_vmi();
    ok(cmd.sync_virtual_machine(vmi_request(vmi.clone())), "sync").await;
    let wait = |what: &str, done: &dyn Fn() -> bool| {
        let deadline = Instant::now() + BOOT;
        while !done() {
            assert!(Instant::now() < deadline, "{what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait("the guest wrote to its PVC disk", &|| has_magic(&name));

    // The file moves away (its written sector cleared) and another takes its name.
    std::fs::rename(&name, &first).unwrap();
    {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&first)
            .unwrap();
        file.write_all_at(&[0; 512], 512).unwrap();
    }
    std::fs::write(&name, vec![0; 1 << 20]).unwrap();
    ok(cmd.reset_virtual_machine(vmi_request(vmi)), "reset").await;
    wait("the guest wrote to a PVC disk after the reset", &|| {
        has_magic(&first) || has_magic(&name)
    });
    assert!(
        has_magic(&first),
        "the restarted VM has the file first opened"
    );
    assert_eq!(
        std::fs::read(&name).unwrap(),
        vec![0; 1 << 20],
        "the file now named disk.img is never opened"
    );
}
