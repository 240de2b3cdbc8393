//! Image locks as QEMU takes them: a second writer of an image is refused with an
//! error naming it — in this process (another engine), from QEMU's tools, and QEMU's
//! tools by this engine — while readers (a base shared by overlays) go together.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use block::qcow2::create::{CreateOptions, create};
use block::{BackingPolicy, ConcurrentDisk, DiskError, Format, OpenOptions, open_disk_with};
use common::{qemu_img, qemu_tool};

fn options(read_only: bool) -> OpenOptions {
    OpenOptions {
        read_only,
        ..OpenOptions::default()
    }
}

fn qcow2(dir: &Path, name: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    create(
        &path,
        &CreateOptions {
            size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    path
}

/// The open is refused as a lock conflict naming `path`, with QEMU's wording.
fn assert_locked(result: Result<impl Sized, DiskError>, path: &Path, wording: &str) {
    match result {
        Ok(_) => panic!("{} opened while in use", path.display()),
        Err(e @ DiskError::Locked { .. }) => {
            let text = e.to_string();
            assert!(text.contains(&path.display().to_string()), "{text}");
            assert!(text.contains(wording), "{text}");
        }
        Err(e) => panic!("not a lock conflict: {e}"),
    }
}

#[test]
fn a_second_writable_open_in_this_process_is_refused_naming_the_image() {
    let dir = tempfile::tempdir().unwrap();
    for format in [Format::Qcow2, Format::Raw] {
        let path = match format {
            Format::Qcow2 => qcow2(dir.path(), "disk.qcow2"),
            Format::Raw => {
                let path = dir.path().join("disk.raw");
                std::fs::write(&path, vec![0u8; 1 << 20]).unwrap();
                path
            }
        };
        let writer = ConcurrentDisk::open(&path, format, options(false)).unwrap();
        assert_locked(
            ConcurrentDisk::open(&path, format, options(false)),
            &path,
            "failed to get \"write\" lock",
        );
        assert_locked(
            open_disk_with(&path, format, options(false)),
            &path,
            "failed to get \"write\" lock",
        );
        // A reader of an image being written is refused too (as QEMU without -U).
        assert_locked(
            open_disk_with(&path, format, options(true)),
            &path,
            "failed to get shared \"write\" lock",
        );
        // So is creating an image over it: it is not emptied under its writer.
        if format == Format::Qcow2 {
            let before = std::fs::read(&path).unwrap();
            assert_locked(
                create(
                    &path,
                    &CreateOptions {
                        size: Some(1 << 20),
                        ..Default::default()
                    },
                ),
                &path,
                "failed to get \"write\" lock",
            );
            assert_eq!(std::fs::read(&path).unwrap(), before, "the image is intact");
        }
        writer.close().unwrap();
        // Closed: free again, for a reader and then a writer.
        drop(open_disk_with(&path, format, options(true)).unwrap());
        drop(open_disk_with(&path, format, options(false)).unwrap());
    }
}

#[test]
fn overlays_share_their_base_which_no_one_may_write_meanwhile() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    std::fs::write(&base, vec![0x5au8; 1 << 20]).unwrap();
    let overlay = |name: &str| {
        let path = dir.path().join(name);
        create(
            &path,
            &CreateOptions {
                backing_file: Some(base.to_str().unwrap().into()),
                backing_format: Some(Format::Raw),
                backing_policy: BackingPolicy::Within {
                    dir: dir.path().into(),
                    format: Format::Raw,
                },
                ..Default::default()
            },
        )
        .unwrap();
        let opts = OpenOptions {
            backing: BackingPolicy::Within {
                dir: dir.path().into(),
                format: Format::Raw,
            },
            ..options(false)
        };
        ConcurrentDisk::open(&path, Format::Qcow2, opts).unwrap()
    };
    // Two VMs' overlays over one container disk base, both writable.
    let first = overlay("a.qcow2");
    let second = overlay("b.qcow2");
    let mut buf = [0u8; 512];
    second.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0x5a; 512]);
    // Readers of the base go along; a writer does not.
    drop(open_disk_with(&base, Format::Raw, options(true)).unwrap());
    assert_locked(
        open_disk_with(&base, Format::Raw, options(false)),
        &base,
        "failed to get \"write\" lock",
    );
    drop((first, second));
    drop(open_disk_with(&base, Format::Raw, options(false)).unwrap());
}

/// Whether another open file description locks byte `byte` of `path` (QEMU's
/// "holds write" byte is 101), tested without locking anything.
fn byte_locked(path: &Path, byte: i64) -> bool {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: `flock` is plain data, all-zero is valid; the fields used are set.
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = libc::c_short::try_from(libc::F_WRLCK).unwrap();
    lock.l_whence = libc::c_short::try_from(libc::SEEK_SET).unwrap();
    lock.l_start = byte;
    lock.l_len = 1;
    // SAFETY: a valid descriptor and a `flock` that outlives the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &raw mut lock) };
    assert_eq!(rc, 0, "F_OFD_GETLK: {}", std::io::Error::last_os_error());
    i32::from(lock.l_type) != libc::F_UNLCK
}

/// Waits (10 s at most) until `child` holds `path` for writing.
fn wait_for_a_writer(path: &Path, child: &mut std::process::Child) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !byte_locked(path, 101) {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            panic!("qemu-io ended ({status}) before holding the image: {err}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "qemu-io never locked the image"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn qemu_and_this_engine_see_each_others_locks() {
    let dir = tempfile::tempdir().unwrap();
    let path = qcow2(dir.path(), "disk.qcow2");
    let p = path.to_str().unwrap();

    // This engine writes: QEMU's tools are refused as QEMU refuses them, and may
    // still look with -U (force share).
    let writer = ConcurrentDisk::open(&path, Format::Qcow2, options(false)).unwrap();
    // Refusals expected: each tool runs once (`common::run` runs a refused one again).
    for args in [vec!["info", p], vec!["check", p]] {
        let out = Command::new(qemu_tool("qemu-img"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "qemu-img {args:?} ran on an image in use"
        );
        assert!(
            stderr.contains("Failed to get shared \"write\" lock"),
            "{stderr}"
        );
    }
    let out = Command::new(qemu_tool("qemu-io"))
        .args(["-f", "qcow2", "-c", "write 0 512", p])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("Failed to get \"write\" lock"), "{stderr}");
    qemu_img(&["info", "-U", p]);
    drop(writer);

    // QEMU writes (qemu-io, held open by its sleep): this engine is refused.
    let mut qemu_io = Command::new(qemu_tool("qemu-io"))
        .args([
            "-f",
            "qcow2",
            "-c",
            "write -P 7 0 512",
            "-c",
            "sleep 60000",
            p,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_a_writer(&path, &mut qemu_io);
    assert_locked(
        ConcurrentDisk::open(&path, Format::Qcow2, options(false)),
        &path,
        "failed to get \"write\" lock",
    );
    assert_locked(
        open_disk_with(&path, Format::Qcow2, options(true)),
        &path,
        "failed to get shared \"write\" lock",
    );
    qemu_io.kill().unwrap();
    qemu_io.wait().unwrap();
    // QEMU's locks went with its process.
    let disk = ConcurrentDisk::open(&path, Format::Qcow2, options(false)).unwrap();
    let mut buf = [0u8; 512];
    disk.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7; 512]);
}
