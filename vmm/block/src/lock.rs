//! Image locks as QEMU takes them (`block/file-posix.c`), so that a second
//! writer of an image is refused, whoever it is: another VM of this process
//! (the new VM of a reset, before the old one is closed), another process, a
//! QEMU or `qemu-img` on the same host; and readers are allowed together.
//!
//! Open file description locks (`fcntl(F_OFD_SETLK)`), as QEMU uses them:
//! they belong to the open file description, so two opens of an image in
//! one process conflict (POSIX record locks would not), closing another
//! descriptor of the file keeps them (POSIX locks would go), and they go by
//! themselves when the description's last descriptor closes — no unlock
//! call, so a sandboxed thread that closes an image needs no system call
//! beyond `close`. Every lock is taken at open, on the opening thread.
//!
//! The scheme is QEMU's, byte for byte, so that QEMU and this engine see each
//! other: each permission `p` (bit `p` of consistent read, write, write
//! unchanged, resize) has two bytes. An opener takes a shared (read) lock on
//! byte `100 + p` for each permission it holds and on byte `200 + p` for
//! each permission it does not let others have; then, for each permission
//! it holds, it tests whether another description locks `200 + p` ("Failed
//! to get "write" lock"), and for each it does not share, whether another
//! locks `100 + p` ("Failed to get shared "write" lock"). Shared locks never
//! conflict with each other: only the tests (`F_OFD_GETLK` with a write
//! lock) find the others.
//!
//! What this engine holds, as QEMU's qcow2 file node does (raw images alike):
//! a writable image holds consistent read, write and resize (a qcow2 image
//! grows) and shares consistent read and write unchanged; a read-only image
//! (a backing file, a boot disk read before the devices open it, `check`)
//! holds consistent read and shares the same. So readers go together, a
//! writer excludes every other opener, and a backing file shared by several
//! overlays stays open to all of them and to no writer.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::{DiskError, DiskResult};

/// Byte of the first "holds" lock (QEMU's `RAW_LOCK_PERM_BASE`).
const HOLDS_BASE: i64 = 100;
/// Byte of the first "does not share" lock (QEMU's `RAW_LOCK_SHARED_BASE`).
const UNSHARED_BASE: i64 = 200;

/// QEMU's block permissions, by bit: consistent read, write, write
/// unchanged, resize (`BLK_PERM_*`, named as `bdrv_perm_names` names them).
const PERMISSIONS: [&str; 4] = ["consistent read", "write", "write unchanged", "resize"];
const READ: u8 = 1 << 0;
const WRITE: u8 = 1 << 1;
const WRITE_UNCHANGED: u8 = 1 << 2;
const RESIZE: u8 = 1 << 3;

/// What an opener holds and what it lets others hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Access {
    held: u8,
    shared: u8,
}

impl Access {
    /// An image opened for reading or for writing.
    pub(crate) fn of(writable: bool) -> Access {
        Access {
            held: if writable {
                READ | WRITE | RESIZE
            } else {
                READ
            },
            shared: READ | WRITE_UNCHANGED,
        }
    }
}

/// A lock of one byte: shared (`F_RDLCK`) or, to test, exclusive (`F_WRLCK`).
fn byte_lock(exclusive: bool, byte: i64) -> libc::flock {
    // SAFETY: `flock` is plain data; all-zero is a valid value, and the
    // fields that matter are set below (`l_pid` must be 0 for OFD locks).
    let mut lock: libc::flock = unsafe { std::mem::zeroed() };
    lock.l_type = if exclusive {
        const { int_cast::c_short_of_c_int(libc::F_WRLCK) }
    } else {
        const { int_cast::c_short_of_c_int(libc::F_RDLCK) }
    };
    lock.l_whence = const { int_cast::c_short_of_c_int(libc::SEEK_SET) };
    lock.l_start = byte;
    lock.l_len = 1;
    lock
}

/// Takes a shared lock on `byte` for `file`'s open file description.
fn lock_byte(file: &File, byte: i64) -> io::Result<()> {
    let lock = byte_lock(false, byte);
    // SAFETY: the descriptor is open for `file`'s life; the kernel reads the
    // `flock` we pass and keeps no pointer to it.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &raw const lock) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether another open file description locks `byte` (so that a write lock
/// could not be placed there).
fn locked_by_another(file: &File, byte: i64) -> io::Result<bool> {
    let mut lock = byte_lock(true, byte);
    // SAFETY: as in `lock_byte`; the kernel writes the conflicting lock (or
    // F_UNLCK) back into `lock`, which lives across the call.
    let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_GETLK, &raw mut lock) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(i32::from(lock.l_type) != libc::F_UNLCK)
}

/// How long a conflict is tested again before the open is refused. A
/// descriptor can outlive its `close` for a moment: a child that another
/// thread of the process is starting holds a copy of every descriptor
/// (close-on-exec ones too) until its `exec`, and with it the open file
/// description and its locks. The test harnesses start `qemu-img` that way
/// while VMs close and open images; the launcher and `vmm run` start no
/// process. A real conflict (another writer) lasts: it is refused after this.
const CONFLICT_WAIT: Duration = Duration::from_secs(2);
const CONFLICT_RETRY: Duration = Duration::from_millis(10);

/// Locks `file` (the image at `path`) for `access`, as QEMU does, and checks
/// that no other opener conflicts (testing again for [`CONFLICT_WAIT`]). On
/// an error the caller drops `file`, which releases what was locked.
pub(crate) fn lock(file: &File, path: &Path, access: Access) -> DiskResult<()> {
    lock_waiting(file, path, access, CONFLICT_WAIT)
}

fn lock_waiting(file: &File, path: &Path, access: Access, wait: Duration) -> DiskResult<()> {
    let failed = |byte: i64, e: io::Error| {
        DiskError::Io(io::Error::new(
            e.kind(),
            format!("{}: cannot lock byte {byte}: {e}", path.display()),
        ))
    };
    for (bit, _) in (0u8..).zip(PERMISSIONS) {
        let mask = 1 << bit;
        if access.held & mask != 0 {
            let byte = HOLDS_BASE + i64::from(bit);
            lock_byte(file, byte).map_err(|e| failed(byte, e))?;
        }
        if access.shared & mask == 0 {
            let byte = UNSHARED_BASE + i64::from(bit);
            lock_byte(file, byte).map_err(|e| failed(byte, e))?;
        }
    }
    let deadline = Instant::now() + wait;
    loop {
        match conflict(file, path, access) {
            Err(DiskError::Locked { .. }) if Instant::now() < deadline => {
                std::thread::sleep(CONFLICT_RETRY);
            }
            other => return other,
        }
    }
}

/// The first conflict with another opener, as QEMU's `raw_check_lock_bytes`
/// finds it: a permission this opener holds that another does not share,
/// then a permission this one does not share that another holds.
fn conflict(file: &File, path: &Path, access: Access) -> DiskResult<()> {
    let failed = |byte: i64, e: io::Error| {
        DiskError::Io(io::Error::new(
            e.kind(),
            format!(
                "{}: cannot test the lock of byte {byte}: {e}",
                path.display()
            ),
        ))
    };
    for (bit, name) in (0u8..).zip(PERMISSIONS) {
        let byte = UNSHARED_BASE + i64::from(bit);
        if access.held & (1 << bit) != 0
            && locked_by_another(file, byte).map_err(|e| failed(byte, e))?
        {
            return Err(DiskError::Locked {
                path: path.to_path_buf(),
                reason: format!(
                    "failed to get \"{name}\" lock: another VM or process has the image \
                     open and does not share \"{name}\""
                ),
            });
        }
    }
    for (bit, name) in (0u8..).zip(PERMISSIONS) {
        let byte = HOLDS_BASE + i64::from(bit);
        if access.shared & (1 << bit) == 0
            && locked_by_another(file, byte).map_err(|e| failed(byte, e))?
        {
            return Err(DiskError::Locked {
                path: path.to_path_buf(),
                reason: format!(
                    "failed to get shared \"{name}\" lock: another VM or process has the \
                     image open for \"{name}\""
                ),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(path: &Path, writable: bool) -> File {
        std::fs::OpenOptions::new()
            .read(true)
            .write(writable)
            .open(path)
            .unwrap()
    }

    #[test]
    fn writers_exclude_everyone_and_readers_go_together() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, [0u8; 512]).unwrap();
        // Refusals at once; successes wait as `lock` does (a child another
        // test starts may hold a closed descriptor for a moment).
        let refused = |writable: bool| {
            let file = open(&path, writable);
            lock_waiting(&file, &path, Access::of(writable), Duration::ZERO)
                .map(|()| file)
                .unwrap_err()
                .to_string()
        };
        let locked = |writable: bool| {
            let file = open(&path, writable);
            lock(&file, &path, Access::of(writable)).unwrap();
            file
        };
        let reader = locked(false);
        let second_reader = locked(false);
        let err = refused(true);
        assert!(err.contains("failed to get \"write\" lock"), "{err}");
        assert!(err.contains(&path.display().to_string()), "{err}");
        drop((reader, second_reader));
        let writer = locked(true);
        let err = refused(true);
        assert!(err.contains("failed to get \"write\" lock"), "{err}");
        let err = refused(false);
        assert!(err.contains("failed to get shared \"write\" lock"), "{err}");
        // A second descriptor of the same description shares its locks, and
        // closing some other descriptor of the file keeps them.
        let dup = writer.try_clone().unwrap();
        drop(writer);
        std::fs::File::open(&path).unwrap();
        refused(false);
        drop(dup);
        locked(true);
    }

    #[test]
    fn the_bytes_are_qemus() {
        // A writer holds 100, 101, 103 and does not share 201, 203; a reader
        // holds 100 and does not share 201, 203.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        std::fs::write(&path, [0u8; 512]).unwrap();
        let probe = open(&path, false);
        let held = |writable: bool| {
            let file = open(&path, writable);
            lock(&file, &path, Access::of(writable)).unwrap();
            let bytes: Vec<i64> = (100..104)
                .chain(200..204)
                .filter(|&b| locked_by_another(&probe, b).unwrap())
                .collect();
            drop(file);
            bytes
        };
        assert_eq!(held(true), vec![100, 101, 103, 201, 203]);
        assert_eq!(held(false), vec![100, 201, 203]);
    }
}
