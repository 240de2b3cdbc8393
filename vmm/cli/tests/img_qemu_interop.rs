//! Cross-checks with qemu-img and qemu-io: images we make are valid for QEMU,
//! images QEMU makes read back byte-exact through us, and the same write
//! scripts give the same disks.

mod img_common;

use std::path::Path;

use block::Format;
use block::qcow2::{CreateOptions, create, header::CompressionType};
use img_common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn images_we_create_pass_qemu_check_and_show_our_options() {
    let dir = tempfile::tempdir().unwrap();
    for cluster_size in [512u64, 4096, 65536, 2 << 20] {
        for refcount_bits in [1u32, 2, 4, 8, 16, 32, 64] {
            let p = dir
                .path()
                .join(format!("c{cluster_size}-r{refcount_bits}.qcow2"));
            let lazy = refcount_bits == 8;
            create(
                &p,
                &CreateOptions {
                    size: Some(3 << 30),
                    cluster_size,
                    refcount_bits,
                    lazy_refcounts: lazy,
                    ..CreateOptions::default()
                },
            )
            .unwrap();
            assert_qemu_check_clean(&p);
            let info = info_json(&p);
            assert_eq!(info["virtual-size"], 3u64 << 30);
            assert_eq!(info["cluster-size"], cluster_size);
            let data = &info["format-specific"]["data"];
            assert_eq!(data["compat"], "1.1");
            assert_eq!(data["refcount-bits"], refcount_bits);
            assert_eq!(data["lazy-refcounts"], lazy);
            assert_eq!(data["corrupt"], false);
        }
    }
    // compat=0.10 and zstd.
    let v2 = dir.path().join("v2.qcow2");
    create(
        &v2,
        &CreateOptions {
            size: Some(1 << 30),
            compat_v2: true,
            ..Default::default()
        },
    )
    .unwrap();
    assert_qemu_check_clean(&v2);
    assert_eq!(info_json(&v2)["format-specific"]["data"]["compat"], "0.10");
    let z = dir.path().join("zstd.qcow2");
    create(
        &z,
        &CreateOptions {
            size: Some(1 << 30),
            compression_type: CompressionType::Zstd,
            ..Default::default()
        },
    )
    .unwrap();
    assert_qemu_check_clean(&z);
    assert_eq!(
        info_json(&z)["format-specific"]["data"]["compression-type"],
        "zstd"
    );
}

#[test]
fn create_command_matches_qemu_img_create_for_overlays() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    std::fs::write(&base, mixed_data(3 << 20, 1)).unwrap();
    // Relative backing name, resolved against the overlay's directory; size
    // taken from the backing file.
    let ours = dir.path().join("ours.qcow2");
    run_ok(vmm_img().args([
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        s(&ours),
    ]));
    let theirs = dir.path().join("theirs.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        "-F",
        "raw",
        s(&theirs),
    ]);
    assert_qemu_check_clean(&ours);
    let (a, b) = (info_json(&ours), info_json(&theirs));
    for key in [
        "virtual-size",
        "cluster-size",
        "backing-filename",
        "backing-filename-format",
        "format-specific",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_identical(&ours, "qcow2", &base, "raw");
    // Byte for byte the file qemu-img writes: same layout and extensions.
    let ha = std::fs::read(&ours).unwrap();
    let hb = std::fs::read(&theirs).unwrap();
    assert!(
        ha == hb,
        "our image differs from qemu-img's ({} and {} bytes)",
        ha.len(),
        hb.len()
    );

    // -o cluster_size and lazy_refcounts, and a missing backing format is refused.
    let o = dir.path().join("o.qcow2");
    run_ok(vmm_img().args([
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=4k,lazy_refcounts=on",
        s(&o),
        "10M",
    ]));
    let info = info_json(&o);
    assert_eq!(info["cluster-size"], 4096);
    assert_eq!(info["format-specific"]["data"]["lazy-refcounts"], true);
    let out = run(vmm_img().args([
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        "base.raw",
        s(&dir.path().join("x.qcow2")),
    ]));
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("format"));
}

#[test]
fn qemu_images_of_every_cluster_size_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("src.raw");
    let data = mixed_data(5 << 20, 2);
    std::fs::write(&raw, &data).unwrap();
    let mut bits = 9;
    while bits <= 21 {
        let cs = 1u64 << bits;
        let q = dir.path().join(format!("c{cs}.qcow2"));
        qemu_img(&[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            &format!("cluster_size={cs}"),
            s(&raw),
            s(&q),
        ]);
        assert!(
            read_all(&q, Format::Qcow2) == data,
            "cluster size {cs}: contents differ"
        );
        // Our checker agrees with QEMU's on QEMU's images.
        let r = block::qcow2::check::check(&q).unwrap();
        assert_eq!((r.corruptions, r.leaks), (0, 0), "{cs}: {:?}", r.messages);
        bits += 1;
    }
}

#[test]
fn compressed_images_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("src.raw");
    let data = mixed_data(4 << 20, 3);
    std::fs::write(&raw, &data).unwrap();
    for (cs, ctype) in [
        (65536, "zlib"),
        (4096, "zlib"),
        (2 << 20, "zlib"),
        (65536, "zstd"),
        (512, "zstd"),
    ] {
        let q = dir.path().join(format!("c{cs}-{ctype}.qcow2"));
        qemu_img(&[
            "convert",
            "-c",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            &format!("cluster_size={cs},compression_type={ctype}"),
            s(&raw),
            s(&q),
        ]);
        let check = block::qcow2::check::check(&q).unwrap();
        assert!(
            check.compressed_clusters > 0,
            "{cs} {ctype}: nothing was compressed"
        );
        assert!(
            read_all(&q, Format::Qcow2) == data,
            "{cs} {ctype}: contents differ"
        );
        // Writing over compressed clusters moves them out; QEMU must agree.
        let mut img = block::open_disk(&q, Format::Qcow2, false).unwrap();
        img.write_at(&[0x5a; 3000], 12345).unwrap();
        img.write_zeroes(1 << 20, 1 << 20, false).unwrap();
        img.discard(2 << 20, 1 << 20).unwrap();
        drop(img);
        assert_qemu_check_clean(&q);
        let mut expect = data.clone();
        expect[12345..12345 + 3000].fill(0x5a);
        expect[1 << 20..2 << 20].fill(0);
        let converted = dir.path().join("out.raw");
        qemu_img(&["convert", "-f", "qcow2", "-O", "raw", s(&q), s(&converted)]);
        let theirs = std::fs::read(&converted).unwrap();
        assert!(
            theirs == read_all(&q, Format::Qcow2),
            "{cs} {ctype}: QEMU and we disagree"
        );
        // Discarded bytes read as zeroes or as before.
        let discarded = &theirs[2 << 20..3 << 20];
        assert!(discarded.iter().all(|&b| b == 0) || discarded == &data[2 << 20..3 << 20]);
        assert!(
            theirs[..2 << 20] == expect[..2 << 20] && theirs[3 << 20..] == expect[3 << 20..],
            "{cs} {ctype}: after writes"
        );
    }
}

#[test]
fn backing_chains_read_through_raw_and_qcow2_bases() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    std::fs::write(&base, mixed_data(4 << 20, 4)).unwrap();
    let mid = dir.path().join("mid.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=4096",
        "-b",
        "base.raw",
        "-F",
        "raw",
        s(&mid),
    ]);
    qemu_io(&[
        "-f",
        "qcow2",
        "-c",
        "write -P 0x61 100k 200k",
        "-c",
        "write -z 1M 64k",
        "-c",
        "discard 2M 128k",
        s(&mid),
    ]);
    // A top layer, larger than its backing file.
    let top = dir.path().join("top.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-b",
        s(&mid),
        "-F",
        "qcow2",
        s(&top),
        "6M",
    ]);
    qemu_io(&[
        "-f",
        "qcow2",
        "-c",
        "write -P 0x62 150k 10k",
        "-c",
        "write -P 0x63 5M 4k",
        s(&top),
    ]);
    for img in [&mid, &top] {
        let flat = dir.path().join("flat.raw");
        qemu_img(&["convert", "-f", "qcow2", "-O", "raw", s(img), s(&flat)]);
        assert!(
            read_all(img, Format::Qcow2) == std::fs::read(&flat).unwrap(),
            "{}",
            img.display()
        );
    }
    // Copy-on-write through our engine into the top layer.
    run_ok(vmm_img().args([
        "io",
        "-f",
        "qcow2",
        "-c",
        "write -P 0x64 1000 3000",
        "-c",
        "write -P 0x65 3M 70k",
        s(&top),
    ]));
    assert_qemu_check_clean(&top);
    let ours = read_all(&top, Format::Qcow2);
    let flat = dir.path().join("flat2.raw");
    qemu_img(&["convert", "-f", "qcow2", "-O", "raw", s(&top), s(&flat)]);
    assert!(ours == std::fs::read(&flat).unwrap());
    assert!(ours[1000..4000].iter().all(|&b| b == 0x64));
    // The bases were not touched.
    assert!(std::fs::read(&base).unwrap() == mixed_data(4 << 20, 4));
}

/// A random qemu-io script: writes with patterns, zero writes, discards, flushes.
fn random_script(rng: &mut StdRng, size: u64, n: usize) -> Vec<String> {
    let mut cmds = Vec::new();
    for _ in 0..n {
        let unit = if rng.random_bool(0.5) { 512 } else { 1 };
        let off = rng.random_range(0..size / unit) * unit;
        let max = (size - off).min(300_000);
        let len = (rng.random_range(1..=max) / unit).max(1) * unit;
        let len = len.min(size - off);
        let cmd = match rng.random_range(0..10) {
            0..=5 => format!("write -P {} {off} {len}", rng.random_range(1..255)),
            6 => format!("write -z {off} {len}"),
            7 => format!("discard {off} {len}"),
            8 => "flush".to_string(),
            _ => format!(
                "write -P {} {} {}",
                rng.random_range(1..255),
                off / 65536 * 65536,
                65536.min(size - off / 65536 * 65536)
            ),
        };
        cmds.push(cmd);
    }
    cmds
}

fn script_args(cmds: &[String]) -> Vec<String> {
    cmds.iter()
        .flat_map(|c| ["-c".to_string(), c.clone()])
        .collect()
}

#[test]
fn same_random_scripts_through_qemu_io_and_ours_give_identical_disks() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    let size: u64 = 6 << 20;
    std::fs::write(&base, mixed_data(int_cast::u64_to_usize(size), 5)).unwrap();
    let qbase = dir.path().join("base.qcow2");
    qemu_img(&[
        "convert",
        "-f",
        "raw",
        "-O",
        "qcow2",
        "-o",
        "cluster_size=8192",
        s(&base),
        s(&qbase),
    ]);
    let mut rng = StdRng::seed_from_u64(0x9c0e);
    let cases: &[(&str, Option<(&str, &str)>)] = &[
        ("cluster_size=65536", None),
        ("cluster_size=512", None),
        ("cluster_size=4096,refcount_bits=1", None),
        ("cluster_size=65536,refcount_bits=64", None),
        ("cluster_size=2M", None),
        ("compat=0.10,cluster_size=16384", None),
        ("cluster_size=65536", Some(("base.raw", "raw"))),
        ("cluster_size=4096", Some(("base.qcow2", "qcow2"))),
        ("compat=0.10", Some(("base.raw", "raw"))),
        (
            "cluster_size=512,lazy_refcounts=on",
            Some(("base.qcow2", "qcow2")),
        ),
    ];
    for (i, (opts, backing)) in cases.iter().enumerate() {
        let a = dir.path().join(format!("qemu{i}.qcow2"));
        let mut args = vec!["create", "-q", "-f", "qcow2", "-o", opts];
        if let Some((b, f)) = backing {
            args.extend(["-b", b, "-F", f]);
        }
        args.push(s(&a));
        args.push("6M");
        qemu_img(&args);
        let b = dir.path().join(format!("ours{i}.qcow2"));
        std::fs::copy(&a, &b).unwrap();
        let script = random_script(&mut rng, size, 60);
        let args = script_args(&script);
        run_ok(
            std::process::Command::new(qemu_tool("qemu-io"))
                .arg("-f")
                .arg("qcow2")
                .args(&args)
                .arg(&a),
        );
        // Every other case bypasses the page cache (cache=none, O_DIRECT).
        let cache = if i % 2 == 1 { "none" } else { "writeback" };
        run_ok(
            vmm_img()
                .args(["io", "-f", "qcow2", "-t", cache])
                .args(&args)
                .arg(&b),
        );
        assert_qemu_check_clean(&b);
        assert_identical(&a, "qcow2", &b, "qcow2");
        let r = block::qcow2::check::check(&b).unwrap();
        assert_eq!(
            (r.corruptions, r.leaks),
            (0, 0),
            "case {i} ({opts}): {:?}",
            r.messages
        );
    }
}

/// A random script of aio groups: up to 8 `aio_write`s at ranges that do
/// not overlap (but often share clusters, new or allocated), then
/// `aio_flush`, sometimes a synchronous zero write, discard or flush. The
/// result does not depend on the order the requests finish in.
fn random_aio_script(rng: &mut StdRng, size: u64, groups: usize) -> Vec<String> {
    let mut cmds = Vec::new();
    for _ in 0..groups {
        let mut taken: Vec<(u64, u64)> = Vec::new();
        for _ in 0..rng.random_range(1..=8) {
            let off = rng.random_range(0..size / 512) * 512;
            let len = (rng.random_range(1..=256u64) * 512).min(size - off);
            if taken.iter().any(|&(a, b)| off < b && a < off + len) {
                continue;
            }
            taken.push((off, off + len));
            cmds.push(format!(
                "aio_write -P {} {off} {len}",
                rng.random_range(1..255)
            ));
        }
        cmds.push("aio_flush".to_string());
        let off = rng.random_range(0..size / 65536 - 1) * 65536;
        match rng.random_range(0..6) {
            0 => cmds.push(format!("write -z {off} 65536")),
            1 => cmds.push(format!("discard {off} 131072")),
            2 => cmds.push("flush".to_string()),
            _ => {}
        }
    }
    cmds
}

#[test]
fn same_random_aio_scripts_through_qemu_io_and_ours_give_identical_disks() {
    let dir = tempfile::tempdir().unwrap();
    let size: u64 = 4 << 20;
    let base = dir.path().join("base.raw");
    std::fs::write(&base, mixed_data(int_cast::u64_to_usize(size), 11)).unwrap();
    let mut rng = StdRng::seed_from_u64(0xa10);
    let cases: &[(&str, Option<&str>)] = &[
        ("cluster_size=65536", None),
        ("cluster_size=4096", Some("base.raw")),
        ("cluster_size=512", Some("base.raw")),
        ("cluster_size=65536,refcount_bits=1", Some("base.raw")),
    ];
    for (i, (opts, backing)) in cases.iter().enumerate() {
        let a = dir.path().join(format!("qemu-aio{i}.qcow2"));
        let mut args = vec!["create", "-q", "-f", "qcow2", "-o", opts];
        if let Some(b) = backing {
            args.extend(["-b", b, "-F", "raw"]);
        }
        args.push(s(&a));
        args.push("4M");
        qemu_img(&args);
        let b = dir.path().join(format!("ours-aio{i}.qcow2"));
        std::fs::copy(&a, &b).unwrap();
        let args = script_args(&random_aio_script(&mut rng, size, 40));
        run_ok(
            std::process::Command::new(qemu_tool("qemu-io"))
                .args(["-f", "qcow2"])
                .args(&args)
                .arg(&a),
        );
        let cache = if i % 2 == 1 { "none" } else { "writeback" };
        let out = run_ok(
            vmm_img()
                .args(["io", "-f", "qcow2", "-t", cache])
                .args(&args)
                .arg(&b),
        );
        let acked = out.lines().filter(|l| l.starts_with("wrote ")).count();
        let asked = args.iter().filter(|a| a.starts_with("aio_write")).count();
        assert!(
            acked >= asked,
            "case {i}: {acked} of {asked} aio writes reported"
        );
        assert_qemu_check_clean(&b);
        assert_identical(&a, "qcow2", &b, "qcow2");
    }
}

#[test]
fn small_clusters_grow_the_refcount_table() {
    // 512-byte clusters with 16-bit refcounts: one refcount table cluster
    // covers only 8 MiB of file, so writing 20 MiB must grow the table.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("grow.qcow2");
    create(
        &p,
        &CreateOptions {
            size: Some(64 << 20),
            cluster_size: 512,
            ..Default::default()
        },
    )
    .unwrap();
    let data = mixed_data(20 << 20, 6);
    let mut img = block::open_disk(&p, Format::Qcow2, false).unwrap();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        img.write_at(chunk, (i as u64) * (3 << 20) % (60 << 20))
            .unwrap();
    }
    img.flush().unwrap();
    drop(img);
    assert_qemu_check_clean(&p);
    let mut img = block::open_disk(&p, Format::Qcow2, true).unwrap();
    for (i, chunk) in data.chunks(1 << 20).enumerate() {
        let mut buf = vec![0u8; chunk.len()];
        img.read_at(&mut buf, (i as u64) * (3 << 20) % (60 << 20))
            .unwrap();
        // Later chunks may overwrite earlier ones at the same offset.
        let last = data
            .chunks(1 << 20)
            .enumerate()
            .rfind(|(j, _)| {
                (*j as u64) * (3 << 20) % (60 << 20) == (i as u64) * (3 << 20) % (60 << 20)
            })
            .unwrap()
            .1;
        assert!(buf == last);
    }
    let h = block::qcow2::check::read_image_header(&p).unwrap();
    assert!(h.refcount_table_clusters > 1, "table did not grow");
}

#[test]
fn check_and_info_commands_agree_with_qemu_img() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("leaky.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", s(&p), "16M"]);
    qemu_io(&[
        "-f",
        "qcow2",
        "-c",
        "write -P 3 0 192k",
        "-c",
        "write -P 4 8M 64k",
        s(&p),
    ]);
    let ours = |args: &[&str]| {
        let out = run(vmm_img().args(args));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let theirs = |args: &[&str]| {
        let out = run(std::process::Command::new(qemu_tool("qemu-img")).args(args));
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let json = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
    let fields = [
        "leaks",
        "corruptions",
        "check-errors",
        "total-clusters",
        "allocated-clusters",
    ];
    let compare = |what: &str| {
        let (co, o) = ours(&["check", "-f", "qcow2", "--output=json", s(&p)]);
        let (ct, t) = theirs(&["check", "-f", "qcow2", "--output=json", s(&p)]);
        assert_eq!(co, ct, "{what}: exit codes\nours: {o}\ntheirs: {t}");
        let (o, t) = (json(&o), json(&t));
        for f in fields {
            assert_eq!(o[f], t[f], "{what}: {f}");
        }
    };
    compare("clean");
    // Leak the second data cluster: clear its L2 entry.
    let h = block::qcow2::check::read_image_header(&p).unwrap();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p)
        .unwrap();
    use std::os::unix::fs::FileExt;
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, h.l1_table_offset).unwrap();
    let l2 = u64::from_be_bytes(e) & 0x00ff_ffff_ffff_fe00;
    f.write_all_at(&[0u8; 8], l2 + 8).unwrap();
    compare("leak");
    // Point the third entry at the first cluster's data: a refcount too low.
    f.read_exact_at(&mut e, l2).unwrap();
    f.write_all_at(&e, l2 + 16).unwrap();
    drop(f);
    let (code, _) = ours(&["check", "-f", "qcow2", "--output=json", s(&p)]);
    let (qcode, _) = theirs(&["check", "-f", "qcow2", "--output=json", s(&p)]);
    assert_eq!((code, qcode), (Some(2), Some(2)));
    // `check -r all` rebuilds the refcounts from the tables. A cluster
    // shared by two L2 entries needs a copy, not a refcount: undo that one,
    // then the leak is what gets repaired.
    {
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[0u8; 8], l2 + 16).unwrap();
    }
    let (code, _) = ours(&["check", "-f", "qcow2", "-r", "all", s(&p)]);
    assert_eq!(code, Some(0));
    assert_qemu_check_clean(&p);
    // info --output=json
    let (code, o) = ours(&["info", "-f", "qcow2", "--output=json", s(&p)]);
    assert_eq!(code, Some(0));
    let (_, t) = theirs(&["info", "-f", "qcow2", "--output=json", s(&p)]);
    let (o, t) = (json(&o), json(&t));
    for f in [
        "virtual-size",
        "cluster-size",
        "format",
        "format-specific",
        "dirty-flag",
    ] {
        assert_eq!(o[f], t[f], "info {f}");
    }
    // The format is never guessed.
    let (code, _) = ours(&["info", s(&p)]);
    assert_eq!(code, Some(1));
}

/// The disk of the bench test: 4 MiB.
const BENCH_DISK: usize = 4 << 20;

/// `img bench -d 16 -w` writes what `qemu-img bench -d 16 -w` writes: the
/// same request pattern (with wrap-around), all requests done, clean image.
#[test]
fn bench_at_depth_writes_what_qemu_img_bench_writes() {
    let dir = tempfile::tempdir().unwrap();
    let base = dir.path().join("base.raw");
    std::fs::write(&base, mixed_data(BENCH_DISK, 5)).unwrap();
    let mut overlays = Vec::new();
    for tool in ["qemu", "ours"] {
        let ov = dir.path().join(format!("{tool}.qcow2"));
        let (b, o) = (base.to_str().unwrap(), ov.to_str().unwrap());
        qemu_img(&["create", "-q", "-f", "qcow2", "-b", b, "-F", "raw", o]);
        // 1100 requests of 3000 bytes, stride 1237 * 4096 bytes: wraps the
        // 4 MiB disk many times and lands on unaligned, shared clusters.
        let args = [
            "bench",
            "-q",
            "-f",
            "qcow2",
            "-w",
            "-d",
            "16",
            "-c",
            "600",
            "-s",
            "3000",
            "-S",
            "5066752",
            "-o",
            "1000",
            "--pattern",
            "171",
            o,
        ];
        if tool == "qemu" {
            qemu_img(&args);
        } else {
            run_ok(vmm_img().args(args));
        }
        overlays.push(ov);
    }
    assert_qemu_check_clean(&overlays[1]);
    assert_identical(&overlays[0], "qcow2", &overlays[1], "qcow2");
    // And the data really changed (a bench that wrote nothing would pass the
    // comparison above only if qemu-img wrote nothing too).
    assert!(read_all(&overlays[1], Format::Qcow2) != mixed_data(BENCH_DISK, 5));

    let ov = overlays[1].to_str().unwrap();
    let out = run(vmm_img().args(["bench", "-f", "qcow2", "-d", "0", ov]));
    assert!(!out.status.success(), "depth 0 must be refused");
    run_ok(vmm_img().args(["bench", "-q", "-f", "qcow2", "-d", "64", "-c", "500", ov]));
}
