//! Deep backing chains: each file of a chain is opened once, and the memory
//! a chain may take is bounded (refused with a clear error past it).
//!
//! Memory is measured with a counting global allocator (bytes requested,
//! current and peak), which also refuses to go past 1 GiB: a regression
//! aborts this test binary instead of taking the shared machine's memory.
//! The tests measure one at a time.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use block::{BackingPolicy, ConcurrentDisk, Format, OpenOptions};
use common::{qemu_img, qemu_io};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Past this the allocator fails (the test binary aborts).
const CAP: usize = 1 << 30;

impl Counting {
    fn grow(&self, by: usize) -> bool {
        let now = CURRENT.fetch_add(by, Ordering::SeqCst) + by;
        if now > CAP {
            CURRENT.fetch_sub(by, Ordering::SeqCst);
            return false;
        }
        PEAK.fetch_max(now, Ordering::SeqCst);
        true
    }
}

// SAFETY: every call is forwarded to the system allocator with the same
// layout; the counters are only bookkeeping.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !self.grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout, passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !self.grow(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
        // SAFETY: allocated by `System` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() && !self.grow(new_size - layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: allocated by `System` with `layout`.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if new_size < layout.size() {
            CURRENT.fetch_sub(layout.size() - new_size, Ordering::SeqCst);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One measurement at a time: the counters are the process's.
static SERIAL: Mutex<()> = Mutex::new(());

/// Runs `f`; returns its result, the most heap it held at once above what
/// was held before, and the time it took.
fn measure<T>(f: impl FnOnce() -> T) -> (T, usize, Duration) {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    let start = Instant::now();
    let out = f();
    let took = start.elapsed();
    (out, PEAK.load(Ordering::SeqCst) - base, took)
}

const MIB: usize = 1 << 20;

/// `c0.qcow2` .. `c<files-1>.qcow2` of `size`, each the backing file of
/// the next (recorded as qcow2). With `tag`, layer `i` writes `i + 1` into
/// its own cluster `i`. Each file's zero blocks are made holes, as a
/// registry's sparse files are.
fn chain(dir: &Path, files: usize, size: &str, tag: bool) -> PathBuf {
    let mut top = PathBuf::new();
    for i in 0..files {
        top = dir.join(format!("c{i}.qcow2"));
        let t = top.to_str().unwrap();
        if i == 0 {
            qemu_img(&["create", "-q", "-f", "qcow2", t, size]);
        } else {
            let below = format!("c{}.qcow2", i - 1);
            let args = ["create", "-q", "-u", "-f", "qcow2", "-b", &below, "-F"];
            qemu_img(&[&args[..], &["qcow2", t, size]].concat());
        }
        if tag {
            let write = format!("write -P {} {}k 64k", i + 1, i * 64);
            qemu_io(&["-f", "qcow2", "-c", &write, t]);
        }
        let out = Command::new("fallocate").arg("-d").arg(&top).output();
        assert!(
            out.is_ok_and(|o| o.status.success()),
            "fallocate -d (util-linux) is needed"
        );
    }
    top
}

/// Descriptors this process holds open on files in `dir`.
fn open_files_in(dir: &Path) -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(dir))
        .count()
}

fn follow(read_only: bool) -> OpenOptions {
    OpenOptions {
        read_only,
        direct: false,
        backing: BackingPolicy::FollowImage,
    }
}

/// 17 files, the deepest chain allowed (16 below the top): opened through
/// `ConcurrentDisk` as the VMM opens a disk, every file is opened once
/// (before, each layer reopened the rest of the chain: 153 opens), the
/// heap stays small, and every layer's data reads through.
#[test]
fn each_file_of_a_deep_chain_is_opened_once() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().canonicalize().unwrap();
    let top = chain(&dir_path, 17, "1G", true);
    let (disk, heap, took) = measure(|| ConcurrentDisk::open(&top, Format::Qcow2, follow(false)));
    let disk = disk.expect("a 17-file chain opens");
    eprintln!(
        "17-file chain: {} KiB of heap at most, {took:?}",
        heap / 1024
    );
    // One descriptor for metadata and one for data I/O per file.
    let fds = open_files_in(&dir_path);
    assert!(fds <= 2 * 17, "{fds} descriptors open on 17 files");
    // Each layer costs its caches' bookkeeping and small tables (a 1 GiB
    // disk: 16-byte L1, 64 KiB refcount table of the writable top).
    assert!(heap < 4 * MIB, "{} KiB of heap", heap / 1024);
    for i in 0..17u64 {
        let mut buf = vec![0u8; 65536];
        disk.read_at(&mut buf, i * 65536).unwrap();
        assert!(buf.iter().all(|&b| b == i as u8 + 1), "layer {i}");
    }
    disk.close().unwrap();
    assert_eq!(open_files_in(&dir_path), 0, "all closed");
    // One more file is past the depth limit.
    let deeper = dir_path.join("c17.qcow2");
    let args = ["create", "-q", "-u", "-f", "qcow2", "-b", "c16.qcow2", "-F"];
    qemu_img(&[&args[..], &["qcow2", deeper.to_str().unwrap(), "1G"]].concat());
    let e = ConcurrentDisk::open(&deeper, Format::Qcow2, follow(false))
        .err()
        .expect("18 files are too deep");
    assert!(e.to_string().contains("deeper than 16"), "{e}");
}

/// The reported case: 17 sparse files (a few MiB on disk), each with the
/// largest L1 table QEMU allows (32 MiB: a 2 PiB disk). Before, opening
/// them through `ConcurrentDisk` took 5 GB and 17 s. Now the chain is
/// refused once its tables pass the budget, before they are read: the heap
/// holds at most the budget's 64 MiB (and a read buffer) on the way.
#[test]
fn a_chain_of_huge_tables_is_refused_before_it_takes_the_memory() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let top = chain(dir.path(), 17, "2P", false);
    let on_disk: u64 = (0..17)
        .map(|i| {
            use std::os::unix::fs::MetadataExt;
            let m = std::fs::metadata(dir.path().join(format!("c{i}.qcow2"))).unwrap();
            m.blocks() * 512
        })
        .sum();
    eprintln!("17 files of 2 PiB: {} KiB on disk", on_disk / 1024);
    for read_only in [false, true] {
        let (r, heap, took) =
            measure(|| ConcurrentDisk::open(&top, Format::Qcow2, follow(read_only)));
        eprintln!(
            "read_only={read_only}: {} MiB of heap at most, {took:?}",
            heap / MIB
        );
        let e = r.err().expect("the chain's tables are over the budget");
        assert!(
            e.to_string().contains("more than the 64 MiB"),
            "unclear error: {e}"
        );
        assert!(heap < 80 * MIB, "{} MiB of heap", heap / MIB);
        assert!(took < Duration::from_secs(30), "{took:?}");
    }
    // The one-request engine refuses it the same way.
    let (r, heap, _) =
        measure(|| block::open_disk_with(&top, Format::Qcow2, follow(true)).map(|d| d.size()));
    assert!(r.is_err());
    assert!(heap < 80 * MIB, "{} MiB of heap", heap / MIB);
}

/// Within the budget: 17 files with 2 MiB L1 tables (128 TiB disks, 34 MiB
/// of tables in all) open, and the heap holds each table once (before:
/// 153 copies, 306 MiB).
#[test]
fn a_deep_chain_of_large_tables_holds_each_table_once() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let top = chain(dir.path(), 17, "128T", false);
    let (disk, heap, took) = measure(|| ConcurrentDisk::open(&top, Format::Qcow2, follow(false)));
    let disk = disk.expect("34 MiB of tables is within the budget");
    eprintln!(
        "17 files of 128 TiB: {} MiB of heap at most, {took:?}",
        heap / MIB
    );
    assert!(heap < 48 * MIB, "{} MiB of heap", heap / MIB);
    assert!(took < Duration::from_secs(30), "{took:?}");
    let mut buf = vec![1u8; 4096];
    disk.read_at(&mut buf, 100 << 40).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    disk.close().unwrap();
}
