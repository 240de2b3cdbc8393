//! A disk copied as live migration's block copy does it (`block::dirty`): what the top
//! image defines, cross-checked with `qemu-img map`, written into a fresh overlay over
//! the same base gives the same disk (`qemu-img compare`, `qemu-img check`).

mod common;

use std::path::Path;
use std::sync::Arc;

use block::{
    BackingPolicy, ConcurrentDisk, DefinedRange, DirtyTracked, Format, OpenOptions, SharedDisk,
};
use common::{assert_identical, assert_qemu_check_clean, qemu_img, qemu_io};

const SIZE: u64 = 8 << 20;

fn overlay_over(dir: &Path, name: &str, base: &Path) -> std::path::PathBuf {
    let overlay = dir.join(name);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        base.to_str().unwrap(),
        "-F",
        "raw",
        overlay.to_str().unwrap(),
    ]);
    overlay
}

fn open_rw(path: &Path) -> ConcurrentDisk {
    let opts = OpenOptions {
        read_only: false,
        direct: false,
        backing: BackingPolicy::FollowImage,
    };
    ConcurrentDisk::open(path, Format::Qcow2, opts).expect("open overlay")
}

/// The top layer's ranges as `qemu-img map` reports them (depth 0: data or zero).
fn qemu_top_layer(path: &Path) -> Vec<DefinedRange> {
    let out = qemu_img(&[
        "map",
        "-U",
        "--output=json",
        "-f",
        "qcow2",
        path.to_str().unwrap(),
    ]);
    let map: Vec<serde_json::Value> = serde_json::from_str(&out).expect("qemu-img map JSON");
    let mut ranges: Vec<DefinedRange> = Vec::new();
    for e in map.iter().filter(|e| e["depth"] == 0) {
        let (offset, len) = (e["start"].as_u64().unwrap(), e["length"].as_u64().unwrap());
        let zero = e["zero"] == true && e["data"] == false;
        match ranges.last_mut() {
            Some(last) if last.zero == zero && last.offset + last.len == offset => last.len += len,
            _ => ranges.push(DefinedRange { offset, len, zero }),
        }
    }
    ranges
}

#[test]
fn the_top_layer_copied_into_a_fresh_overlay_gives_the_same_disk() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    std::fs::write(&base, common::mixed_data(usize::try_from(SIZE).unwrap(), 7)).unwrap();
    let source = overlay_over(dir.path(), "source.qcow2", &base);
    // Data clusters, a zero cluster hiding the base, a partly written cluster.
    for cmd in [
        "write -P 0x11 0 128k",
        "write -z 1M 64k",
        "write -P 0x22 3M 4k",
        "write -P 0x33 7M 64k",
    ] {
        qemu_io(&["-f", "qcow2", "-c", cmd, source.to_str().unwrap()]);
    }
    let disk = open_rw(&source);
    let ranges = disk.defined_ranges().expect("defined ranges");
    assert_eq!(ranges, qemu_top_layer(&source), "what qemu-img map reports");
    assert!(
        ranges.iter().any(|r| r.zero),
        "the zero cluster is there: {ranges:?}"
    );

    // Copy it as the migration does: the defined ranges, then what was written
    // meanwhile (tracked), into another overlay over the same base.
    let tracked = DirtyTracked::new(Arc::new(disk));
    tracked.start_tracking();
    let target_path = overlay_over(dir.path(), "target.qcow2", &base);
    let target = open_rw(&target_path);
    let copy = |from: &DirtyTracked, ranges: &[DefinedRange]| {
        for r in ranges {
            if r.zero {
                target.write_zeroes(r.offset, r.len, false).unwrap();
            } else {
                let mut buf = vec![0; usize::try_from(r.len).unwrap()];
                from.read_at(&mut buf, r.offset).unwrap();
                target.write_at(&buf, r.offset).unwrap();
            }
        }
    };
    copy(&tracked, &ranges);
    // The guest writes on after the first copy: a new cluster and a zeroed one.
    tracked.write_at(&[0x44; 4096], 5 << 20).unwrap();
    tracked.write_zeroes(0, 4096, false).unwrap();
    let dirty: Vec<DefinedRange> = tracked
        .take_dirty(1 << 20)
        .into_iter()
        .map(|(offset, len)| DefinedRange {
            offset,
            len,
            zero: false,
        })
        .collect();
    assert_eq!(dirty.len(), 2, "{dirty:?}");
    copy(&tracked, &dirty);
    drop(tracked);
    target.close().unwrap();
    assert_identical(&source, "qcow2", &target_path, "qcow2");
    assert_qemu_check_clean(&target_path);
    // The copy did not turn the base's clusters into the target's own.
    let copied = qemu_top_layer(&target_path);
    let owned: u64 = copied.iter().map(|r| r.len).sum();
    assert!(
        owned < SIZE / 2,
        "the target owns {owned} bytes: {copied:?}"
    );
}

#[test]
fn a_raw_image_defines_what_holds_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("disk.raw");
    let file = std::fs::File::create(&path).unwrap();
    file.set_len(SIZE).unwrap();
    // Data at 1 MiB and in the last 4 KiB; holes elsewhere.
    use std::os::unix::fs::FileExt;
    file.write_all_at(&[7; 4096], 1 << 20).unwrap();
    file.write_all_at(&[8; 4096], SIZE - 4096).unwrap();
    file.sync_all().unwrap();
    let disk = ConcurrentDisk::open(&path, Format::Raw, OpenOptions::default()).unwrap();
    let ranges = disk.defined_ranges().unwrap();
    let covers = |at: u64| {
        ranges
            .iter()
            .any(|r| r.offset <= at && at < r.offset + r.len)
    };
    assert!(covers(1 << 20) && covers(SIZE - 1), "{ranges:?}");
    assert!(ranges.iter().all(|r| !r.zero));
    // The holes are left out (as the file system reports them: at least most of it).
    let defined: u64 = ranges.iter().map(|r| r.len).sum();
    assert!(defined < SIZE / 2, "{ranges:?}");
}
