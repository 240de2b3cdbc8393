//! Hostile images: every bad header or table gives a clear error, quickly,
//! without panics and without large allocations.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use block::qcow2::{CreateOptions, Qcow2Image, Qcow2Options, create};
use block::{BackingPolicy, DiskError, Format};
use common::*;

fn make(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    create(
        &p,
        &CreateOptions {
            size: Some(8 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    p
}

fn patch(path: &Path, offset: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, offset).unwrap();
}

/// Drops the backing format extension by renaming its type to an unknown
/// one, as images from before `-F` have none.
fn forget_backing_format(path: &Path) {
    let data = std::fs::read(path).unwrap();
    let pos = data
        .windows(4)
        .position(|w| w == [0xe2, 0x79, 0x2a, 0xca])
        .unwrap();
    patch(path, pos as u64, &[0x12, 0x34, 0x56, 0x78]);
}

/// Opening must fail, fast, with a message containing `needle`.
fn open_err(path: &Path, needle: &str) -> DiskError {
    open_err_with(path, BackingPolicy::Forbid, needle)
}

/// The same, with a backing policy.
fn open_err_with(path: &Path, backing: BackingPolicy, needle: &str) -> DiskError {
    let start = Instant::now();
    let r = Qcow2Image::open(
        path,
        Qcow2Options {
            read_only: true,
            backing,
            ..Default::default()
        },
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "open took too long"
    );
    let e = match r {
        Ok(_) => panic!(
            "{} opened, expected an error about {needle:?}",
            path.display()
        ),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert!(
        msg.contains(needle),
        "error {msg:?} does not mention {needle:?}"
    );
    e
}

#[test]
fn bad_headers_are_refused_with_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: &[(&str, u64, Vec<u8>, &str)] = &[
        ("magic", 0, vec![0, 0, 0, 0], "magic"),
        ("version", 4, 4u32.to_be_bytes().to_vec(), "version"),
        (
            "huge size",
            24,
            (u64::MAX / 2).to_be_bytes().to_vec(),
            "L1 table",
        ),
        ("enormous l1", 36, u32::MAX.to_be_bytes().to_vec(), "32 MiB"),
        (
            "l1 past eof",
            40,
            (1u64 << 40).to_be_bytes().to_vec(),
            "past the end",
        ),
        (
            "l1 unaligned",
            40,
            0x30200u64.to_be_bytes().to_vec(),
            "aligned",
        ),
        (
            "reftable past eof",
            48,
            (1u64 << 40).to_be_bytes().to_vec(),
            "past the end",
        ),
        (
            "overlapping tables",
            40,
            0x10000u64.to_be_bytes().to_vec(),
            "overlaps",
        ),
        ("l1 over header", 40, 0u64.to_be_bytes().to_vec(), "aligned"),
        (
            "huge reftable",
            56,
            u32::MAX.to_be_bytes().to_vec(),
            "8 MiB",
        ),
        (
            "refcount order 7",
            96,
            7u32.to_be_bytes().to_vec(),
            "refcount_order",
        ),
        (
            "cluster bits 8",
            20,
            8u32.to_be_bytes().to_vec(),
            "cluster_bits",
        ),
        (
            "cluster bits 22",
            20,
            22u32.to_be_bytes().to_vec(),
            "cluster_bits",
        ),
        (
            "cluster bits huge",
            20,
            200u32.to_be_bytes().to_vec(),
            "cluster_bits",
        ),
        ("encryption", 32, 1u32.to_be_bytes().to_vec(), "encryption"),
        (
            "unknown incompatible",
            72,
            (1u64 << 33).to_be_bytes().to_vec(),
            "incompatible feature bit 33",
        ),
        (
            "external data file",
            72,
            4u64.to_be_bytes().to_vec(),
            "external data file",
        ),
        (
            "extended l2",
            72,
            16u64.to_be_bytes().to_vec(),
            "extended L2",
        ),
        (
            "header length",
            100,
            8u32.to_be_bytes().to_vec(),
            "header_length",
        ),
        (
            "backing outside cluster 0",
            8,
            0xfff0u64.to_be_bytes().to_vec(),
            "outside the first cluster",
        ),
        (
            "too many snapshots",
            60,
            u32::MAX.to_be_bytes().to_vec(),
            "snapshots",
        ),
    ];
    for (name, off, bytes, needle) in cases {
        let p = make(d, &format!("{}.qcow2", name.replace(' ', "_")));
        if *name == "backing outside cluster 0" {
            patch(&p, 16, &100u32.to_be_bytes());
        }
        patch(&p, *off, bytes);
        open_err(&p, needle);
        // Our checker refuses it too, without panicking.
        let _ = block::qcow2::check::check(&p);
    }
    // A file too short to be an image.
    let short = d.join("short.qcow2");
    std::fs::write(&short, b"QFI\xfb\0\0\0\x03").unwrap();
    open_err(&short, "short");
    // Compression type byte without its feature bit.
    let p = make(d, "ctype.qcow2");
    patch(&p, 104, &[1]);
    open_err(&p, "compression type");
}

#[test]
fn backing_problems_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A chain that loops: a -> b -> a.
    let a = d.join("a.qcow2");
    let b = d.join("b.qcow2");
    create(
        &b,
        &CreateOptions {
            size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    let with_backing = |name: &str| CreateOptions {
        size: Some(1 << 20),
        backing_file: Some(name.to_string()),
        backing_format: Some(Format::Qcow2),
        backing_policy: BackingPolicy::FollowImage,
        ..Default::default()
    };
    create(&a, &with_backing("b.qcow2")).unwrap();
    create(&b, &with_backing("a.qcow2")).unwrap();
    open_err_with(&a, BackingPolicy::FollowImage, "loops");
    // An image that is its own backing file.
    let s = d.join("self.qcow2");
    create(
        &s,
        &CreateOptions {
            size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    create(&s, &with_backing("self.qcow2")).unwrap();
    open_err_with(&s, BackingPolicy::FollowImage, "loops");
    // A chain deeper than the limit.
    let mut prev = d.join("c0.qcow2");
    create(
        &prev,
        &CreateOptions {
            size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    for i in 1..40 {
        let p = d.join(format!("c{i}.qcow2"));
        // -u: QEMU does not open the chain either, so it can be deeper than we allow.
        let name = format!("c{}.qcow2", i - 1);
        qemu_img(&[
            "create",
            "-q",
            "-u",
            "-f",
            "qcow2",
            "-b",
            &name,
            "-F",
            "qcow2",
            p.to_str().unwrap(),
            "1M",
        ]);
        prev = p;
    }
    open_err_with(&prev, BackingPolicy::FollowImage, "deeper");
    // No recorded backing format: QEMU's images from before -F.
    let base = d.join("base.raw");
    std::fs::write(&base, vec![7u8; 1 << 20]).unwrap();
    let o = d.join("noformat.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        o.to_str().unwrap(),
    ]);
    forget_backing_format(&o);
    open_err_with(&o, BackingPolicy::FollowImage, "format");
    // A missing backing file.
    let m = d.join("missing.qcow2");
    create(
        &b,
        &CreateOptions {
            size: Some(1 << 20),
            ..Default::default()
        },
    )
    .unwrap();
    create(&m, &with_backing("b.qcow2")).unwrap();
    std::fs::remove_file(&b).unwrap();
    open_err_with(&m, BackingPolicy::FollowImage, "b.qcow2");
}

/// An image names a host file as its backing file, as a tenant's
/// container disk could. With no policy (every open's default) nothing is
/// opened; `Within` opens only a file that resolves inside its directory,
/// as its format, and no further; `FollowImage` (qemu-img's behaviour, for
/// the user's own images) follows the name.
#[test]
fn backing_files_open_only_as_the_caller_allows() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let bases = d.join("bases");
    std::fs::create_dir(&bases).unwrap();
    // What an attacker wants to read, outside the bases directory.
    let secret = d.join("secret.raw");
    std::fs::write(&secret, vec![0x5e; 1 << 20]).unwrap();
    std::fs::write(bases.join("good.raw"), vec![0x11; 1 << 20]).unwrap();
    // -u: the name is stored as given, nothing is opened.
    let overlay = |name: &str, backing: &str, format: &str| {
        let p = bases.join(name);
        let args = ["create", "-q", "-u", "-f", "qcow2", "-b", backing, "-F"];
        qemu_img(&[&args[..], &[format, p.to_str().unwrap(), "1M"]].concat());
        p
    };
    let absolute = overlay("absolute.qcow2", secret.to_str().unwrap(), "raw");
    let dotdot = overlay("dotdot.qcow2", "../secret.raw", "raw");
    std::os::unix::fs::symlink(&secret, bases.join("link.raw")).unwrap();
    let link = overlay("link.qcow2", "link.raw", "raw");
    let good = overlay("good.qcow2", "good.raw", "raw");

    // No policy: refused, through every way of opening.
    for image in [&absolute, &dotdot, &link, &good] {
        open_err(image, "may not have a backing file");
    }
    let e = block::open_disk(&absolute, Format::Qcow2, false)
        .err()
        .unwrap();
    assert!(e.to_string().contains("refused"), "{e}");
    let e = block::ConcurrentDisk::open(&absolute, Format::Qcow2, Default::default())
        .err()
        .unwrap();
    assert!(e.to_string().contains("refused"), "{e}");

    // Inside a directory: whatever leads out of it is refused.
    let within = |format| BackingPolicy::Within {
        dir: bases.clone(),
        format,
    };
    for image in [&absolute, &dotdot, &link] {
        let e = open_err_with(image, within(Format::Raw), "outside");
        assert!(e.to_string().contains("secret.raw"), "{e}");
    }
    // The policy's format, not a different one the image records.
    open_err_with(&good, within(Format::Qcow2), "records format raw");
    // The backing file may not have one of its own.
    let middle = overlay("middle.qcow2", "good.raw", "raw");
    let top = overlay("top.qcow2", "middle.qcow2", "qcow2");
    open_err_with(&top, within(Format::Qcow2), "may not have a backing file");
    // What resolves inside opens, also without a recorded format (the
    // caller's format counts), and reads the base.
    let unrecorded = overlay("unrecorded.qcow2", "good.raw", "raw");
    forget_backing_format(&unrecorded);
    for image in [&good, &unrecorded] {
        let opts = block::OpenOptions {
            read_only: true,
            direct: false,
            backing: within(Format::Raw),
        };
        let mut buf = vec![0u8; 4096];
        let disk = block::ConcurrentDisk::open(image, Format::Qcow2, opts.clone()).unwrap();
        disk.read_at(&mut buf, 8192).unwrap();
        assert!(buf.iter().all(|&b| b == 0x11));
        let mut img = block::open_disk_with(image, Format::Qcow2, opts).unwrap();
        img.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0x11));
    }

    // qemu-img's behaviour on request: the names are followed.
    for image in [&absolute, &dotdot, &link] {
        let opts = block::OpenOptions {
            read_only: true,
            direct: false,
            backing: BackingPolicy::FollowImage,
        };
        let mut img = block::open_disk_with(image, Format::Qcow2, opts).unwrap();
        let mut buf = vec![0u8; 512];
        img.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&b| b == 0x5e));
    }
    let opts = block::OpenOptions {
        read_only: true,
        direct: false,
        backing: BackingPolicy::FollowImage,
    };
    assert!(block::open_disk_with(&top, Format::Qcow2, opts).is_ok());
    drop(middle);
}

#[test]
fn bad_tables_give_errors_on_access() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("t.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p.to_str().unwrap(), "8M"]);
    qemu_io(&[
        "-f",
        "qcow2",
        "-c",
        "write -P 1 0 64k",
        "-c",
        "write -P 2 4M 64k",
        p.to_str().unwrap(),
    ]);
    let h = block::qcow2::check::read_image_header(&p).unwrap();
    let l1 = h.l1_table_offset;
    let l1e = {
        let f = std::fs::File::open(&p).unwrap();
        let mut b = [0u8; 8];
        f.read_exact_at(&mut b, l1).unwrap();
        u64::from_be_bytes(b) & 0x00ff_ffff_ffff_fe00
    };
    // L2 entry 0 points far past the end of the file.
    patch(&p, l1e, &((1u64 << 63) | (1u64 << 45)).to_be_bytes());
    let mut img = block::open_disk(&p, Format::Qcow2, false).unwrap();
    let mut buf = vec![0u8; 4096];
    let e = img.read_at(&mut buf, 0).unwrap_err();
    assert!(matches!(e, DiskError::Corrupt(_)), "{e}");
    let e = img.write_at(&buf, 100).unwrap_err();
    assert!(matches!(e, DiskError::Corrupt(_)), "{e}");
    // The other cluster still reads.
    img.read_at(&mut buf, 4 << 20).unwrap();
    assert!(buf.iter().all(|&b| b == 2));
    drop(img);
    // L2 entry with reserved bits, and a compressed entry with garbage data.
    patch(&p, l1e, &((1u64 << 63) | 0x50000 | 0x4).to_be_bytes());
    let mut img = block::open_disk(&p, Format::Qcow2, true).unwrap();
    assert!(matches!(
        img.read_at(&mut buf, 0),
        Err(DiskError::Corrupt(_))
    ));
    drop(img);
    patch(&p, l1e, &((1u64 << 62) | 0x100).to_be_bytes());
    let mut img = block::open_disk(&p, Format::Qcow2, true).unwrap();
    let e = img.read_at(&mut buf, 0).unwrap_err();
    assert!(e.to_string().contains("compressed"), "{e}");
    drop(img);
    // The same garbage through the concurrent reader, which decompresses
    // outside the engine: the same error, and the good cluster still reads.
    let ro = block::OpenOptions {
        read_only: true,
        ..block::OpenOptions::default()
    };
    let disk = block::ConcurrentDisk::open(&p, Format::Qcow2, ro.clone()).unwrap();
    let e = disk.read_at(&mut buf, 0).unwrap_err();
    assert!(matches!(e, DiskError::Corrupt(_)), "{e}");
    assert!(e.to_string().contains("compressed"), "{e}");
    disk.read_at(&mut buf, 4 << 20).unwrap();
    assert!(buf.iter().all(|&b| b == 2));
    drop(disk);
    // A compressed entry past the end of the file: refused before any read.
    patch(&p, l1e, &((1u64 << 62) | (1u64 << 40)).to_be_bytes());
    let disk = block::ConcurrentDisk::open(&p, Format::Qcow2, ro).unwrap();
    let e = disk.read_at(&mut buf, 0).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
    drop(disk);
    // L1 entry not aligned.
    patch(&p, l1, &((1u64 << 63) | 0x10200).to_be_bytes());
    let mut img = block::open_disk(&p, Format::Qcow2, true).unwrap();
    assert!(matches!(
        img.read_at(&mut buf, 0),
        Err(DiskError::Corrupt(_))
    ));
    // Out-of-range requests are refused, not wrapped.
    assert!(matches!(
        img.read_at(&mut buf, u64::MAX - 10),
        Err(DiskError::OutOfRange { .. })
    ));
    assert!(matches!(img.write_at(&buf, 0), Err(DiskError::ReadOnly)));
}

#[test]
fn read_only_and_state_bits_are_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let p = make(dir.path(), "c.qcow2");
    // Corrupt bit: readable, not writable.
    patch(&p, 72, &2u64.to_be_bytes());
    assert!(block::open_disk(&p, Format::Qcow2, true).is_ok());
    let e = block::open_disk(&p, Format::Qcow2, false)
        .err()
        .expect("corrupt image opened read-write");
    assert!(e.to_string().contains("corrupt"), "{e}");
    // Dirty bit (lazy refcounts after a crash): a writer rebuilds the
    // refcounts from the tables and clears the bit.
    let d = dir.path().join("dirty.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "lazy_refcounts=on,cluster_size=4k",
        d.to_str().unwrap(),
        "8M",
    ]);
    qemu_io(&[
        "-f",
        "qcow2",
        "-c",
        "write -P 9 0 100k",
        "-c",
        "write -P 8 5M 1M",
        d.to_str().unwrap(),
    ]);
    // Forget the refcounts of the data, as a crash before the close would.
    let h = block::qcow2::check::read_image_header(&d).unwrap();
    let f = std::fs::File::open(&d).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, h.refcount_table_offset).unwrap();
    let block0 = u64::from_be_bytes(b);
    patch(&d, block0 + 2 * 8, &[0u8; 4096 - 16]);
    patch(&d, 72, &1u64.to_be_bytes());
    let out = run(std::process::Command::new(qemu_tool("qemu-img"))
        .args(["check", "-f", "qcow2"])
        .arg(&d));
    assert_eq!(
        out.status.code(),
        Some(2),
        "the damaged image should have errors"
    );
    drop(block::open_disk(&d, Format::Qcow2, false).unwrap());
    assert!(
        !block::qcow2::check::read_image_header(&d)
            .unwrap()
            .is_dirty()
    );
    assert_qemu_check_clean(&d);
    let mut img = block::open_disk(&d, Format::Qcow2, true).unwrap();
    let mut buf = vec![0u8; 100 << 10];
    img.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&x| x == 9));
    // Unknown autoclear bits are cleared by a writer, as the spec says.
    let q = make(dir.path(), "a.qcow2");
    patch(&q, 88, &(1u64 << 20).to_be_bytes());
    drop(block::open_disk(&q, Format::Qcow2, false).unwrap());
    assert_eq!(
        block::qcow2::check::read_image_header(&q)
            .unwrap()
            .autoclear_features,
        0
    );
}

#[test]
fn shared_clusters_are_copied_before_a_write() {
    // Two guest clusters share one host cluster (refcount 2, no copied flag),
    // as internal snapshots or deduplication leave them. A write to one must
    // not show through the other.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("shared.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", p.to_str().unwrap(), "8M"]);
    qemu_io(&["-f", "qcow2", "-c", "write -P 6 0 64k", p.to_str().unwrap()]);
    let h = block::qcow2::check::read_image_header(&p).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, h.l1_table_offset).unwrap();
    let l2 = u64::from_be_bytes(e) & 0x00ff_ffff_ffff_fe00;
    f.read_exact_at(&mut e, l2).unwrap();
    let data = u64::from_be_bytes(e) & 0x00ff_ffff_ffff_fe00;
    let shared = data.to_be_bytes(); // no copied flag
    f.write_all_at(&shared, l2).unwrap();
    f.write_all_at(&shared, l2 + 8).unwrap();
    f.read_exact_at(&mut e, h.refcount_table_offset).unwrap();
    let block0 = u64::from_be_bytes(e);
    f.write_all_at(&2u16.to_be_bytes(), block0 + (data >> 16) * 2)
        .unwrap();
    drop(f);
    assert_qemu_check_clean(&p);
    let mut img = block::open_disk(&p, Format::Qcow2, false).unwrap();
    img.write_at(&[7u8; 4096], 65536 + 4096).unwrap();
    drop(img);
    // The refcounts are exact. Like QEMU, the remaining user's copied flag
    // is not searched for and set: `qemu-img check` reports that and only that.
    let out = run(std::process::Command::new(qemu_tool("qemu-img"))
        .args(["check", "-f", "qcow2"])
        .arg(&p));
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("ERROR") || l.starts_with("Leaked"))
        .collect();
    assert_eq!(
        errors,
        ["ERROR OFLAG_COPIED data cluster: l2_entry=50000 refcount=1"],
        "{text}"
    );
    let all = read_all(&p, Format::Qcow2);
    assert!(
        all[..65536].iter().all(|&b| b == 6),
        "the other user of the cluster changed"
    );
    assert!(all[65536..65536 + 4096].iter().all(|&b| b == 6));
    assert!(all[65536 + 4096..65536 + 8192].iter().all(|&b| b == 7));
}

#[test]
fn compressed_entries_that_differ_above_bit_56_are_different_clusters() {
    // 4 KiB clusters: a compressed entry's offset has 58 bits, so two entries
    // can differ only in bit 56 of the offset. The second lies past the end of
    // the file and must be refused, not served from the first one's cache.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=4k",
        p.to_str().unwrap(),
        "1M",
    ]);
    qemu_io(&[
        "-f",
        "qcow2",
        "-c",
        "write -c -P 5 0 4k",
        p.to_str().unwrap(),
    ]);
    let h = block::qcow2::check::read_image_header(&p).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, h.l1_table_offset).unwrap();
    let l2 = u64::from_be_bytes(e) & 0x00ff_ffff_ffff_fe00;
    f.read_exact_at(&mut e, l2).unwrap();
    let first = u64::from_be_bytes(e);
    const COMPRESSED: u64 = 1 << 62;
    assert_ne!(first & COMPRESSED, 0, "qemu-io wrote a compressed cluster");
    // One sector (no additional ones), so the old key `offset | sectors << 56`
    // of both entries is `offset | 1 << 56`.
    let offset = first & ((1u64 << 58) - 1);
    f.write_all_at(&(COMPRESSED | offset).to_be_bytes(), l2)
        .unwrap();
    f.write_all_at(&(COMPRESSED | offset | 1 << 56).to_be_bytes(), l2 + 8)
        .unwrap();
    drop(f);
    let mut first_cluster = vec![0u8; 4096];
    let mut second_cluster = vec![0u8; 4096];
    let mut img = block::open_disk(&p, Format::Qcow2, true).unwrap();
    img.read_at(&mut first_cluster, 0).unwrap();
    assert!(first_cluster.iter().all(|&b| b == 5));
    let e = img
        .read_at(&mut second_cluster, 4096)
        .expect_err("the second entry lies past the end of the image");
    assert!(e.to_string().contains("past the end"), "{e}");
    drop(img);
    let ro = block::OpenOptions {
        read_only: true,
        ..block::OpenOptions::default()
    };
    let disk = block::ConcurrentDisk::open(&p, Format::Qcow2, ro).unwrap();
    disk.read_at(&mut first_cluster, 0).unwrap();
    let e = disk.read_at(&mut second_cluster, 4096).unwrap_err();
    assert!(e.to_string().contains("past the end"), "{e}");
}

/// `BackingPolicy::Opened`: the backing file is the one the caller opened, reached through
/// its descriptor: a name switched to a link after the open changes nothing, at creation
/// (the size) or at open; an image naming another file or format is refused.
#[test]
fn an_opened_backing_file_is_used_whatever_its_name_becomes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    let secret = dir.path().join("secret.raw");
    std::fs::write(&base, vec![0x11; 1 << 20]).unwrap();
    std::fs::write(&secret, vec![0x5e; 2 << 20]).unwrap();
    let opened = block::OpenedFile::new(std::fs::File::open(&base).unwrap().into(), &base);
    std::fs::rename(&base, dir.path().join("moved.raw")).unwrap();
    std::os::unix::fs::symlink(&secret, &base).unwrap();

    let top = dir.path().join("top.qcow2");
    create(
        &top,
        &CreateOptions {
            backing_file: Some(base.to_str().unwrap().into()),
            backing_format: Some(Format::Raw),
            backing_opened: Some(opened.clone()),
            ..Default::default()
        },
    )
    .unwrap();
    let open = |backing| {
        let opts = block::OpenOptions {
            read_only: true,
            direct: false,
            backing,
        };
        block::ConcurrentDisk::open(&top, Format::Qcow2, opts)
    };
    let disk = open(BackingPolicy::Opened {
        file: opened.clone(),
        format: Format::Raw,
    })
    .unwrap();
    assert_eq!(disk.size(), 1 << 20, "the opened base's size");
    let mut buf = vec![0u8; 4096];
    disk.read_at(&mut buf, 0).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0x11),
        "the opened base shows through"
    );

    let err = open(BackingPolicy::Opened {
        file: opened.clone(),
        format: Format::Qcow2,
    })
    .err()
    .unwrap();
    assert!(err.to_string().contains("records format raw"), "{err}");
    let other = block::OpenedFile::new(std::fs::File::open(&secret).unwrap().into(), &secret);
    let err = open(BackingPolicy::Opened {
        file: other,
        format: Format::Raw,
    })
    .err()
    .unwrap();
    assert!(
        err.to_string().contains("the disk's configuration opened"),
        "{err}"
    );
}
