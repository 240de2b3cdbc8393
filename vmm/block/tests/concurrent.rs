//! `ConcurrentDisk` under real concurrency: several threads write and read
//! random pieces of the same clusters at once (so allocations, in-place
//! writes and reads race), checked byte-exact against a model, then by
//! `qemu-img check` and `qemu-img compare`.

mod common;

use int_cast::u64_to_usize;
use std::path::Path;
use std::sync::Mutex;

use block::{BackingPolicy, ConcurrentDisk, Format, OpenOptions};
use common::{assert_identical, assert_qemu_check_clean, mixed_data, qemu_img, read_all};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const DISK: usize = 4 << 20;
const THREADS: usize = 8;
const OPS_PER_THREAD: usize = 400;
/// Thread `t` owns the blocks `b` with `b % THREADS == t`: a 64 KiB cluster
/// holds blocks of every thread, so threads race on the same clusters but
/// never on the same bytes (which keeps the expected result exact).
const BLOCK: usize = 2048;

fn owner(pos: usize) -> usize {
    (pos / BLOCK) % THREADS
}

/// Runs the random workload on `disk`; returns the model of the final contents.
fn hammer(disk: &ConcurrentDisk, initial: Vec<u8>, seed: u64) -> Vec<u8> {
    let model = Mutex::new(initial);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let model = &model;
            s.spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed * 100 + t as u64);
                let blocks = DISK / BLOCK;
                for op in 0..OPS_PER_THREAD {
                    // One of this thread's blocks, and a piece of it.
                    let b = rng.random_range(0..blocks / THREADS) * THREADS + t;
                    let start = b * BLOCK + rng.random_range(0..BLOCK);
                    let len = rng.random_range(1..=b * BLOCK + BLOCK - start);
                    match rng.random_range(0..100) {
                        0..60 => {
                            let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
                            disk.write_at(&data, start as u64)
                                .unwrap_or_else(|e| panic!("thread {t} op {op}: write: {e}"));
                            model.lock().unwrap()[start..start + len].copy_from_slice(&data);
                        }
                        60..65 => {
                            disk.write_zeroes(start as u64, len as u64, rng.random())
                                .unwrap_or_else(|e| panic!("thread {t} op {op}: zeroes: {e}"));
                            model.lock().unwrap()[start..start + len].fill(0);
                        }
                        65..68 => disk.flush().expect("flush"),
                        68..85 => {
                            let mut got = vec![0u8; len];
                            disk.read_at(&mut got, start as u64).expect("read");
                            let want = model.lock().unwrap()[start..start + len].to_vec();
                            assert!(got == want, "thread {t} op {op}: read [{start}, +{len})");
                        }
                        _ => {
                            // A long read over many clusters and every thread's
                            // blocks: only this thread's bytes are stable.
                            let start = rng.random_range(0..DISK - 1);
                            let len = rng.random_range(1..=(DISK - start).min(512 << 10));
                            let mut got = vec![0u8; len];
                            disk.read_at(&mut got, start as u64).expect("long read");
                            let m = model.lock().unwrap();
                            for (i, g) in got.iter().enumerate() {
                                let pos = start + i;
                                if owner(pos) == t {
                                    assert_eq!(*g, m[pos], "thread {t} op {op}: byte {pos}");
                                }
                            }
                        }
                    }
                }
            });
        }
    });
    model.into_inner().unwrap()
}

/// Aligned requests from aligned buffers: with O_DIRECT these skip the
/// bounce copy. Several threads, disjoint 64 KiB-aligned chunks.
fn aligned_round(disk: &ConcurrentDisk, model: &mut [u8], seed: u64) {
    const CHUNK: usize = 64 << 10;
    let chunks: Vec<(usize, u8)> = (0..16u8)
        .map(|i| {
            (
                (usize::from(i) * 7 + u64_to_usize(seed)) % (DISK / CHUNK) * CHUNK,
                i + 1,
            )
        })
        .collect();
    std::thread::scope(|s| {
        for &(off, fill) in &chunks {
            s.spawn(move || {
                // A 4 KiB-aligned piece inside the chunk, then the whole chunk back.
                let mut buf = block::DirectBuf::new(CHUNK, fill);
                disk.write_at(&buf.as_mut_slice()[..CHUNK - 4096], off as u64)
                    .expect("aligned write");
                let mut back = block::DirectBuf::new(CHUNK, 0);
                disk.read_at(back.as_mut_slice(), off as u64)
                    .expect("aligned read");
                assert!(
                    back.as_mut_slice()[..CHUNK - 4096]
                        .iter()
                        .all(|b| *b == fill)
                );
            });
        }
    });
    for (off, fill) in chunks {
        model[off..off + CHUNK - 4096].fill(fill);
    }
}

fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

fn check_against_model(image: &Path, format: Format, model: &[u8], dir: &Path) {
    assert!(
        read_all(image, format) == model,
        "final contents differ from the model"
    );
    let model_file = dir.join("model.raw");
    write_file(&model_file, model);
    assert_identical(image, format.name(), &model_file, "raw");
}

fn qcow2_case(base_format: &str, cluster_size: u32, direct: bool, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let base_data = mixed_data(DISK, seed);
    let base_raw = dir.path().join("base.raw");
    write_file(&base_raw, &base_data);
    let base = dir.path().join(format!("base.{base_format}"));
    if base_format == "qcow2" {
        let b = base.to_str().unwrap();
        qemu_img(&[
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            base_raw.to_str().unwrap(),
            b,
        ]);
    }
    let overlay = dir.path().join("overlay.qcow2");
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("cluster_size={cluster_size}"),
        "-b",
        base.to_str().unwrap(),
        "-F",
        base_format,
        overlay.to_str().unwrap(),
    ]);
    // The overlay may open its base, in the test's directory, as the
    // launcher lets a container disk's overlay open its base.
    let opts = OpenOptions {
        read_only: false,
        direct,
        backing: BackingPolicy::Within {
            dir: dir.path().to_path_buf(),
            format: base_format.parse().unwrap(),
        },
    };
    let disk = ConcurrentDisk::open(&overlay, Format::Qcow2, opts.clone()).expect("open overlay");
    assert_eq!(disk.size(), DISK as u64);
    let mut model = hammer(&disk, base_data, seed);
    aligned_round(&disk, &mut model, seed);
    disk.close().expect("close");
    assert_qemu_check_clean(&overlay);
    check_against_model(&overlay, Format::Qcow2, &model, dir.path());

    // Reopen: every write survived the close, and a second round over the
    // now mostly allocated image (in-place writes) agrees too.
    let disk = ConcurrentDisk::open(&overlay, Format::Qcow2, opts).expect("reopen");
    let model = hammer(&disk, model, seed + 1);
    disk.close().expect("close");
    assert_qemu_check_clean(&overlay);
    check_against_model(&overlay, Format::Qcow2, &model, dir.path());
}

#[test]
fn concurrent_qcow2_over_raw_base_matches_model() {
    qcow2_case("raw", 65536, false, 1);
}

#[test]
fn concurrent_qcow2_over_qcow2_base_small_clusters_matches_model() {
    qcow2_case("qcow2", 4096, false, 2);
}

#[test]
fn concurrent_qcow2_direct_matches_model() {
    qcow2_case("raw", 65536, true, 3);
}

#[test]
fn concurrent_raw_matches_model() {
    let dir = tempfile::tempdir().unwrap();
    let data = mixed_data(DISK, 4);
    let image = dir.path().join("disk.raw");
    write_file(&image, &data);
    let opts = OpenOptions {
        read_only: false,
        direct: true,
        ..OpenOptions::default()
    };
    let disk = ConcurrentDisk::open(&image, Format::Raw, opts).expect("open raw");
    let mut model = hammer(&disk, data, 4);
    aligned_round(&disk, &mut model, 4);
    disk.close().expect("close");
    check_against_model(&image, Format::Raw, &model, dir.path());
}

#[test]
fn concurrent_disk_refuses_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("small.qcow2");
    qemu_img(&["create", "-q", "-f", "qcow2", image.to_str().unwrap(), "1M"]);
    let ro = OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    };
    let disk = ConcurrentDisk::open(&image, Format::Qcow2, ro).expect("open");
    let mut buf = [0u8; 16];
    assert!(matches!(
        disk.read_at(&mut buf, (1 << 20) - 8),
        Err(block::DiskError::OutOfRange { .. })
    ));
    assert!(matches!(
        disk.write_at(&buf, 0),
        Err(block::DiskError::ReadOnly)
    ));
    disk.read_at(&mut buf, 0).expect("read in range");
    assert_eq!(buf, [0u8; 16]);
}

/// Compressed clusters (zlib and zstd, `qemu-img convert -c`) are read and
/// decompressed outside the engine's lock, each thread keeping its last
/// cluster: 8 threads reading random, often cluster-crossing ranges of
/// the image and of an overlay over it (with some of its own clusters)
/// must all see QEMU's bytes.
#[test]
fn concurrent_reads_of_compressed_clusters_match_qemu() {
    let dir = tempfile::tempdir().unwrap();
    let data = mixed_data(DISK, 6);
    let raw = dir.path().join("src.raw");
    write_file(&raw, &data);
    for (cs, ctype) in [(65536, "zlib"), (4096, "zstd"), (512, "zlib")] {
        let base = dir.path().join(format!("c{cs}-{ctype}.qcow2"));
        let (r, b) = (raw.to_str().unwrap(), base.to_str().unwrap());
        let opts = format!("cluster_size={cs},compression_type={ctype}");
        qemu_img(&[
            "convert", "-c", "-f", "raw", "-O", "qcow2", "-o", &opts, r, b,
        ]);
        let overlay = dir.path().join(format!("ov{cs}-{ctype}.qcow2"));
        let o = overlay.to_str().unwrap();
        qemu_img(&["create", "-q", "-f", "qcow2", "-b", b, "-F", "qcow2", o]);
        let mut expect_overlay = data.clone();
        // Some clusters of the overlay's own, between compressed ones.
        {
            let rw = OpenOptions {
                read_only: false,
                direct: false,
                backing: BackingPolicy::FollowImage,
            };
            let disk = ConcurrentDisk::open(&overlay, Format::Qcow2, rw).expect("open overlay");
            for k in 0..16u8 {
                let at = u64::from(k) * 200_003 % (DISK as u64 - 5000);
                disk.write_at(&[k + 1; 5000], at).expect("write");
                expect_overlay[u64_to_usize(at)..u64_to_usize(at) + 5000].fill(k + 1);
            }
            disk.close().expect("close");
        }
        for (image, expect) in [(&base, &data), (&overlay, &expect_overlay)] {
            let ro = OpenOptions {
                read_only: true,
                direct: false,
                backing: BackingPolicy::FollowImage,
            };
            let disk = ConcurrentDisk::open(image, Format::Qcow2, ro).expect("open");
            std::thread::scope(|scope| {
                for t in 0..8u64 {
                    let disk = &disk;
                    scope.spawn(move || {
                        let mut rng = StdRng::seed_from_u64(t * 31 + cs);
                        for _ in 0..300 {
                            let len = rng.random_range(1..3 * u64_to_usize(cs));
                            let at = rng.random_range(0..DISK - len);
                            let mut buf = vec![0u8; len];
                            disk.read_at(&mut buf, at as u64).expect("read");
                            assert!(
                                buf[..] == expect[at..at + len],
                                "{} at {at}+{len}",
                                image.display()
                            );
                        }
                    });
                }
            });
        }
    }
}
