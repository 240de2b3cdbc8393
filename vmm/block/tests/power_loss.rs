//! Power loss: the engines run on a simulated image file
//! (`block::power_loss`) that loses every write after the last completed
//! sync, or keeps an arbitrary part of them (whole writes or single
//! sectors, later ones without earlier ones: what a page cache and a disk
//! cache writing back in any order leave). After the power fails at a
//! random point, `qemu-img check` must find at most leaks and every sector
//! must hold the data it had at the last acknowledged flush or data written
//! after it, never zeroes or stale bytes in its place.
//!
//! A SIGKILL (`vmm/cli/tests/img_crash.rs`) cannot show a missing barrier:
//! the page cache survives it. These runs do: drop one of the engine's
//! barriers and they fail (see `vmm/block/docs/design.md`).

mod common;

use int_cast::u64_to_usize;
use std::path::{Path, PathBuf};
use std::process::Command;

use block::power_loss::{self, PowerLossFile};
use block::qcow2::{CreateOptions, Qcow2Image, Qcow2Options, create};
use block::{BackingPolicy, ConcurrentDisk, DiskBackend, Format, SharedDisk};
use common::{qemu_tool, run};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const SECTOR: u64 = 512;
const SIZE: u64 = 4 << 20;
const SECTORS: usize = (SIZE / SECTOR) as usize;
/// What the base image holds in every sector.
const BASE: u32 = 1;

/// Contents of `sector` written by write number `id` (0: zeroes). Every
/// sector says which write put it there.
fn sector_data(id: u32, sector: u64) -> [u8; u64_to_usize(SECTOR)] {
    let mut s = [0u8; u64_to_usize(SECTOR)];
    if id != 0 {
        for (i, word) in s.chunks_exact_mut(4).enumerate() {
            let v = if i % 2 == 0 {
                id
            } else {
                u32::try_from(sector).expect("a small disk")
            };
            word.copy_from_slice(&v.to_le_bytes());
        }
    }
    s
}

/// Which write a sector's bytes came from; `None` for anything else.
fn decode(bytes: &[u8], sector: u64) -> Option<u32> {
    let id = u32::from_le_bytes(bytes[..4].try_into().unwrap());
    (bytes == sector_data(id, sector)).then_some(id)
}

fn data(first: u64, count: u64, id: u32) -> Vec<u8> {
    (first..first + count)
        .flat_map(|s| sector_data(id, s))
        .collect()
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Write {
        sector: u64,
        count: u64,
    },
    Zeroes {
        sector: u64,
        count: u64,
        unmap: bool,
    },
    Discard {
        sector: u64,
        count: u64,
    },
    Flush,
}

fn random_ops(rng: &mut StdRng, n: usize, cluster: u64) -> Vec<Op> {
    let max = 3 * cluster / SECTOR;
    (0..n)
        .map(|_| {
            let count = rng.random_range(1..=max);
            let sector = rng.random_range(0..SECTORS as u64 - count);
            match rng.random_range(0..20) {
                0..=10 => Op::Write { sector, count },
                11..=12 => Op::Zeroes {
                    sector,
                    count,
                    unmap: rng.random_bool(0.5),
                },
                13 => Op::Discard { sector, count },
                _ => Op::Flush,
            }
        })
        .collect()
}

/// The engine under test.
enum Engine {
    Serial(Box<Qcow2Image>),
    Concurrent(ConcurrentDisk),
}

impl Engine {
    fn apply(&mut self, op: Op, id: u32) {
        let r = match (self, op) {
            (Engine::Serial(d), Op::Write { sector, count }) => {
                d.write_at(&data(sector, count, id), sector * SECTOR)
            }
            (Engine::Concurrent(d), Op::Write { sector, count }) => {
                d.write_at(&data(sector, count, id), sector * SECTOR)
            }
            (
                Engine::Serial(d),
                Op::Zeroes {
                    sector,
                    count,
                    unmap,
                },
            ) => d.write_zeroes(sector * SECTOR, count * SECTOR, unmap),
            (
                Engine::Concurrent(d),
                Op::Zeroes {
                    sector,
                    count,
                    unmap,
                },
            ) => d.write_zeroes(sector * SECTOR, count * SECTOR, unmap),
            (Engine::Serial(d), Op::Discard { sector, count }) => {
                d.discard(sector * SECTOR, count * SECTOR)
            }
            (Engine::Concurrent(d), Op::Discard { sector, count }) => {
                d.discard(sector * SECTOR, count * SECTOR)
            }
            (Engine::Serial(d), Op::Flush) => d.flush(),
            (Engine::Concurrent(d), Op::Flush) => SharedDisk::flush(d),
        };
        r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }

    fn read(&mut self, sector: u64, count: u64) -> Vec<u8> {
        let mut buf = vec![0u8; u64_to_usize(count * SECTOR)];
        match self {
            Engine::Serial(d) => d.read_at(&mut buf, sector * SECTOR),
            Engine::Concurrent(d) => d.read_at(&mut buf, sector * SECTOR),
        }
        .expect("read");
        buf
    }
}

/// The guest's view: per sector, the write whose data it holds now, the
/// one it held at the last acknowledged flush, and every one since.
struct Model {
    now: Vec<u32>,
    acked: Vec<u32>,
    since: Vec<Vec<u32>>,
}

impl Model {
    fn set(&mut self, sector: u64, id: u32) {
        let s = u64_to_usize(sector);
        self.now[s] = id;
        self.since[s].push(id);
    }

    fn ack(&mut self) {
        self.acked.clone_from(&self.now);
        self.since.iter_mut().for_each(Vec::clear);
    }
}

#[derive(Clone, Copy, Debug)]
struct Case {
    cluster: u64,
    lazy: bool,
    backing: bool,
    concurrent: bool,
}

struct Setup {
    dir: tempfile::TempDir,
    /// The image before the power-loss phase (a history of writes,
    /// zeroes and discards behind it), and the guest's view of it.
    image: Vec<u8>,
    start: Vec<u32>,
}

fn opts(dir: &Path) -> Qcow2Options {
    Qcow2Options {
        // 4 L2 tables at most: evictions happen all the time.
        l2_cache_bytes: 0,
        refcount_cache_bytes: 0,
        backing: BackingPolicy::Within {
            dir: dir.to_path_buf(),
            format: Format::Raw,
        },
        ..Qcow2Options::default()
    }
}

fn image_path(dir: &Path) -> PathBuf {
    dir.join("disk.qcow2")
}

/// Creates the image (over `base.raw` filled with `BASE`, or bare) and
/// gives it a history on a real file, so the power-loss phase starts from
/// allocated, preallocated-zero and freed clusters.
fn setup(case: Case, seed: u64) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(dir.path());
    if case.backing {
        let base: Vec<u8> = (0..SECTORS as u64)
            .flat_map(|s| sector_data(BASE, s))
            .collect();
        std::fs::write(dir.path().join("base.raw"), base).unwrap();
    }
    create(
        &path,
        &CreateOptions {
            size: Some(SIZE),
            cluster_size: case.cluster,
            lazy_refcounts: case.lazy,
            backing_file: case.backing.then(|| "base.raw".into()),
            backing_format: case.backing.then_some(Format::Raw),
            ..Default::default()
        },
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut engine = Engine::Serial(Box::new(Qcow2Image::open(&path, opts(dir.path())).unwrap()));
    for (i, op) in random_ops(&mut rng, 60, case.cluster)
        .into_iter()
        .enumerate()
    {
        engine.apply(op, 1_000_000 + u32::try_from(i).expect("a few ops"));
    }
    let start = decode_all(&engine.read(0, SECTORS as u64), 0);
    drop(engine);
    Setup {
        image: std::fs::read(&path).unwrap(),
        start,
        dir,
    }
}

/// The writes the sectors from `first` on hold, as the engine reads them.
fn decode_all(bytes: &[u8], first: u64) -> Vec<u32> {
    bytes
        .chunks_exact(u64_to_usize(SECTOR))
        .zip(first..)
        .map(|(b, s)| decode(b, s).unwrap_or_else(|| panic!("sector {s} reads {:?}", &b[..16])))
        .collect()
}

/// One run: the power fails before file operation `fail_at` (or after the
/// last one), `seed` choosing which unsynced writes survive. Without
/// `punch_holes` the file system cannot punch holes: freed clusters keep
/// their old bytes when they are reused (for a new L2 table, say).
fn run_once(
    case: Case,
    setup: &Setup,
    ops: &[Op],
    fail_at: Option<u64>,
    seed: u64,
    punch_holes: bool,
) -> Model {
    let file = PowerLossFile::new(setup.image.clone(), seed);
    if let Some(op) = fail_at {
        file.fail_before(op);
    }
    if !punch_holes {
        file.refuse_hole_punching();
    }
    let mut engine = open_on(case, setup.dir.path(), &file);
    let mut model = Model {
        now: setup.start.clone(),
        acked: setup.start.clone(),
        since: vec![Vec::new(); SECTORS],
    };
    for (i, &op) in ops.iter().enumerate() {
        let id = 2_000_000 + u32::try_from(i).expect("a few ops");
        engine.apply(op, id);
        match op {
            Op::Write { sector, count } => (sector..sector + count).for_each(|s| model.set(s, id)),
            Op::Zeroes { sector, count, .. } => {
                (sector..sector + count).for_each(|s| model.set(s, 0))
            }
            Op::Discard { sector, count } => {
                // Reads as zeroes or as before: what the engine says now.
                let now = decode_all(&engine.read(sector, count), sector);
                for (k, id) in now.into_iter().enumerate() {
                    model.set(sector + k as u64, id);
                }
            }
            // Acknowledged only if the power was still on when it returned.
            Op::Flush if !file.failed() => model.ack(),
            Op::Flush => {}
        }
    }
    file.fail_now();
    drop(engine); // its closing writes go nowhere: the power is off
    std::fs::write(image_path(setup.dir.path()), file.after_failure().unwrap()).unwrap();
    model
}

/// The case's engine on the simulated file.
fn open_on(case: Case, dir: &Path, file: &PowerLossFile) -> Engine {
    let (path, o) = (image_path(dir), opts(dir));
    if case.concurrent {
        Engine::Concurrent(power_loss::open_concurrent(&path, file, o).unwrap())
    } else {
        Engine::Serial(Box::new(power_loss::open_qcow2(&path, file, o).unwrap()))
    }
}

/// File operations of the whole run without a power failure: how many,
/// and the ranges that flushes (and the closing flush) issue, where the
/// ordering of metadata writes matters most.
fn ops_of_a_full_run(case: Case, setup: &Setup, ops: &[Op]) -> (u64, Vec<(u64, u64)>) {
    let file = PowerLossFile::new(setup.image.clone(), 1);
    let mut engine = open_on(case, setup.dir.path(), &file);
    let mut flushes = Vec::new();
    for (i, &op) in ops.iter().enumerate() {
        let before = file.ops();
        engine.apply(op, u32::try_from(i).expect("a few ops") + 1);
        if matches!(op, Op::Flush) {
            flushes.push((before, file.ops()));
        }
    }
    let before = file.ops();
    drop(engine);
    flushes.push((before, file.ops()));
    (file.ops(), flushes)
}

/// The checks after a power loss; `Err` says what is wrong.
fn check_survivor(case: Case, dir: &Path, model: &Model) -> Result<(), String> {
    let path = image_path(dir);
    let header = block::qcow2::check::read_image_header(&path).map_err(|e| e.to_string())?;
    if case.lazy && header.is_dirty() {
        // Lazy refcounts: the refcounts on disk may be stale on purpose;
        // the next writer rebuilds them from the tables.
        let img = Qcow2Image::open(&path, opts(dir)).map_err(|e| e.to_string())?;
        img.close().map_err(|e| e.to_string())?;
    }
    let out = run(Command::new(qemu_tool("qemu-img"))
        .args(["check", "-f", "qcow2"])
        .arg(&path));
    if !matches!(out.status.code(), Some(0 | 3)) {
        return Err(format!(
            "qemu-img check: {:?}\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    let flat = dir.join("flat.raw");
    let out = run(Command::new(qemu_tool("qemu-img"))
        .args(["convert", "-f", "qcow2", "-O", "raw"])
        .arg(&path)
        .arg(&flat));
    if !out.status.success() {
        return Err(format!(
            "qemu-img convert: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let bytes = std::fs::read(&flat).unwrap();
    for s in 0..SECTORS {
        let found = decode(
            &bytes[s * u64_to_usize(SECTOR)..][..u64_to_usize(SECTOR)],
            s as u64,
        );
        let ok = found.is_some_and(|id| id == model.acked[s] || model.since[s].contains(&id));
        if !ok {
            return Err(format!(
                "sector {s}: holds {found:?}, acknowledged {}, written since {:?}",
                model.acked[s], model.since[s]
            ));
        }
    }
    Ok(())
}

/// `rounds` power failures at random points of one random run.
fn power_failures(case: Case, seed: u64, rounds: usize) {
    let setup = setup(case, seed);
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let ops = random_ops(&mut rng, 80, case.cluster);
    let (total, flushes) = ops_of_a_full_run(case, &setup, &ops);
    let mut failed = Vec::new();
    for round in 0..rounds {
        // Half of the failures hit a flush.
        let fail_at = if round % 2 == 0 {
            rng.random_range(0..=total)
        } else {
            let (a, b) = flushes[rng.random_range(0..flushes.len())];
            rng.random_range(a..=b)
        };
        let seed = seed + round as u64;
        let model = run_once(
            case,
            &setup,
            &ops,
            Some(fail_at),
            seed,
            !seed.is_multiple_of(3),
        );
        if let Err(e) = check_survivor(case, setup.dir.path(), &model) {
            failed.push(format!("power lost before operation {fail_at}: {e}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{case:?}, seed {seed}: {} of {rounds} power losses broke the image:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// A power failure before every file operation of `ops`, `seeds`
/// survivor choices each.
fn every_power_failure(case: Case, setup: &Setup, ops: &[Op], punch_holes: bool, seeds: u64) {
    let (total, _) = ops_of_a_full_run(case, setup, ops);
    let mut failed = Vec::new();
    for fail_at in 0..=total {
        for seed in 0..seeds {
            let seed = 100 * fail_at + seed;
            let model = run_once(case, setup, ops, Some(fail_at), seed, punch_holes);
            if let Err(e) = check_survivor(case, setup.dir.path(), &model) {
                failed.push(format!("before operation {fail_at}, seed {seed}: {e}"));
            }
        }
    }
    assert!(failed.is_empty(), "{case:?}:\n{}", failed.join("\n"));
}

/// A bare image of the case's geometry, `refcount_bits` wide, with `setup`
/// applied on a real file first; `start` is the guest's view after it.
fn bare_setup(case: Case, refcount_bits: u32, setup: &[(Op, u32)], start: Vec<u32>) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let path = image_path(dir.path());
    create(
        &path,
        &CreateOptions {
            size: Some(SIZE),
            cluster_size: case.cluster,
            lazy_refcounts: case.lazy,
            refcount_bits,
            ..Default::default()
        },
    )
    .unwrap();
    {
        let mut img = Engine::Serial(Box::new(Qcow2Image::open(&path, opts(dir.path())).unwrap()));
        for &(op, id) in setup {
            img.apply(op, id);
        }
    }
    Setup {
        image: std::fs::read(&path).unwrap(),
        start,
        dir,
    }
}

const ROUNDS: usize = 30;

#[test]
fn power_loss_small_clusters_with_backing() {
    for concurrent in [false, true] {
        for lazy in [false, true] {
            let case = Case {
                cluster: 512,
                lazy,
                backing: true,
                concurrent,
            };
            power_failures(case, 11 + u64::from(lazy), ROUNDS);
        }
    }
}

#[test]
fn power_loss_4k_clusters_bare() {
    for concurrent in [false, true] {
        for lazy in [false, true] {
            let case = Case {
                cluster: 4096,
                lazy,
                backing: false,
                concurrent,
            };
            power_failures(case, 21 + u64::from(lazy), ROUNDS);
        }
    }
}

#[test]
fn power_loss_64k_clusters_with_backing() {
    for concurrent in [false, true] {
        for lazy in [false, true] {
            let case = Case {
                cluster: 65536,
                lazy,
                backing: true,
                concurrent,
            };
            power_failures(case, 31 + u64::from(lazy), ROUNDS);
        }
    }
}

/// Preallocated zero clusters (zeroes written without unmapping over data)
/// given data again: the L2 entry that drops the zero flag must not reach
/// the disk before the data, whose cluster still holds the old bytes.
#[test]
fn power_loss_while_preallocated_zero_clusters_get_data() {
    for lazy in [false, true] {
        let case = Case {
            cluster: 4096,
            lazy,
            backing: false,
            concurrent: false,
        };
        let per = case.cluster / SECTOR;
        let clusters = 8;
        let all = |op| (op, 7);
        let setup = bare_setup(
            case,
            16,
            &[
                all(Op::Write {
                    sector: 0,
                    count: clusters * per,
                }),
                all(Op::Zeroes {
                    sector: 0,
                    count: clusters * per,
                    unmap: false,
                }),
            ],
            vec![0; SECTORS],
        );
        let ops: Vec<Op> = (0..clusters)
            .map(|c| Op::Write {
                sector: c * per + 1,
                count: 2,
            })
            .chain([Op::Flush])
            .collect();
        every_power_failure(case, &setup, &ops, true, 6);
    }
}

/// A new L2 table in a cluster freed by a discard, on a file system that
/// cannot punch holes (the cluster keeps old guest data): the L1 entry
/// must not reach the disk before the table, or it points at that data.
#[test]
fn power_loss_while_a_new_l2_table_reuses_a_freed_cluster() {
    for lazy in [false, true] {
        let case = Case {
            cluster: 512,
            lazy,
            backing: false,
            concurrent: false,
        };
        let mut start = vec![0; SECTORS];
        start[..4].fill(7);
        let setup = bare_setup(
            case,
            16,
            &[(
                Op::Write {
                    sector: 0,
                    count: 4,
                },
                7,
            )],
            start,
        );
        // Free the four clusters, then write where no L2 table is yet (an
        // L2 table maps 32 KiB here): its data and its table reuse them.
        let ops = [
            Op::Discard {
                sector: 0,
                count: 4,
            },
            Op::Flush,
            Op::Write {
                sector: 1000,
                count: 1,
            },
            Op::Flush,
        ];
        every_power_failure(case, &setup, &ops, false, 8);
    }
}

/// The image grows new refcount blocks (64-bit refcounts: a 512-byte
/// block counts 64 clusters): the refcount table must not name a block
/// before the block is on disk.
#[test]
fn power_loss_while_the_image_grows_refcount_blocks() {
    let case = Case {
        cluster: 512,
        lazy: false,
        backing: false,
        concurrent: false,
    };
    let setup = bare_setup(case, 64, &[], vec![0; SECTORS]);
    let ops = [
        Op::Write {
            sector: 0,
            count: 300,
        },
        Op::Flush,
    ];
    every_power_failure(case, &setup, &ops, true, 8);
}
