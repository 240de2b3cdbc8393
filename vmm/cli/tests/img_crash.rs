//! Crash safety: a writer killed with SIGKILL at a random point leaves an
//! image that QEMU reads, that `qemu-img check` finds at most leaky, and
//! that holds every write acknowledged by a later flush.
//!
//! Two writers: `img io` with plain writes (the one-request engine, one
//! write at a time) and `img io` with aio writes (a `ConcurrentDisk` with
//! up to 8 writes in flight, new clusters filled outside the engine's lock).

mod img_common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use block::qcow2::{CreateOptions, create};
use img_common::*;
use int_cast::u64_to_usize;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;
/// Granularity of the survivor check: a write that was not yet durable may
/// have landed in part (cluster by cluster), so sectors are judged alone.
const SECTOR: u64 = 512;
const SIZE: u64 = 16 << 20;

struct Write {
    /// Position in the script's order of durability: a write is durable
    /// once a flush with a higher `order` has completed.
    order: usize,
    offset: u64,
    len: u64,
    pattern: u8,
}

/// Even rounds write to an overlay of base.raw, odd ones to a bare image.
fn has_backing(round: usize) -> bool {
    round.is_multiple_of(2)
}

/// One round's image: its cluster size, backing file and lazy refcounts
/// vary with the round.
fn create_round_image(dir: &Path, name: &str, round: usize) -> std::path::PathBuf {
    let img = dir.join(format!("{name}{round}.qcow2"));
    let with_backing = has_backing(round);
    create(
        &img,
        &CreateOptions {
            size: Some(SIZE),
            cluster_size: [4096u64, 65536, 512][round % 3],
            backing_file: with_backing.then(|| "base.raw".to_string()),
            backing_format: with_backing.then_some(block::Format::Raw),
            lazy_refcounts: round % 4 == 3,
            ..Default::default()
        },
    )
    .unwrap();
    img
}

fn random_write(rng: &mut StdRng, order: usize) -> Write {
    let offset = rng.random_range(0..SIZE / BLOCK) * BLOCK;
    Write {
        order,
        offset,
        len: (rng.random_range(1..=32u64) * BLOCK).min(SIZE - offset),
        pattern: rng.random_range(1..=255u8),
    }
}

/// Runs `img io` with `script` on `img` and kills it (SIGKILL) after
/// `kill_after` acknowledged writes and a random pause. Returns the
/// `wrote ...` lines it printed before it died, in order.
fn run_and_kill(
    rng: &mut StdRng,
    img: &Path,
    cache: &str,
    script: &[String],
    kill_after: usize,
) -> Vec<String> {
    let mut child = vmm_img()
        .args(["io", "-f", "qcow2", "-t", cache])
        .args(script.iter().flat_map(|c| ["-c".to_string(), c.clone()]))
        .arg(img)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("wrote ") && tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut acked = Vec::new();
    while acked.len() < kill_after {
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => acked.push(line),
            Err(_) => break,
        }
    }
    std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    reader.join().unwrap();
    acked.extend(rx.try_iter());
    acked
}

/// After the kill: `qemu-img check` finds at most leaks, and every sector
/// holds the newest durable write covering it (`order < durable_before`),
/// or a later write that landed before the kill, or — with no durable
/// write — its old contents.
fn check_after_crash(
    dir: &Path,
    img: &Path,
    round: usize,
    writes: &[Write],
    durable_before: usize,
) {
    // Lazy refcounts: the image is left dirty and its refcounts stale on
    // purpose; opening it for writing rebuilds them.
    if round % 4 == 3 {
        let h = block::qcow2::check::read_image_header(img).unwrap();
        assert!(h.is_dirty(), "round {round}: lazy image not marked dirty");
        let opts = block::OpenOptions {
            backing: block::BackingPolicy::FollowImage,
            ..block::OpenOptions::default()
        };
        drop(block::open_disk_with(img, block::Format::Qcow2, opts).unwrap());
    }
    let out = run(Command::new(qemu_tool("qemu-img"))
        .args(["check", "-f", "qcow2"])
        .arg(img));
    let code = out.status.code();
    assert!(
        code == Some(0) || code == Some(3),
        "round {round}: qemu-img check after a crash: {code:?}\n{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let flat = dir.join(format!("flat{round}.raw"));
    qemu_img(&[
        "convert",
        "-f",
        "qcow2",
        "-O",
        "raw",
        img.to_str().unwrap(),
        flat.to_str().unwrap(),
    ]);
    let disk = std::fs::read(&flat).unwrap();
    let old = if has_backing(round) {
        mixed_data(u64_to_usize(SIZE), 9)
    } else {
        vec![0u8; u64_to_usize(SIZE)]
    };
    // The writes covering each sector, in script order.
    let mut by_sector: Vec<Vec<&Write>> = (0..SIZE / SECTOR).map(|_| Vec::new()).collect();
    for w in writes {
        for sector in w.offset / SECTOR..(w.offset + w.len) / SECTOR {
            by_sector[u64_to_usize(sector)].push(w);
        }
    }
    let mut checked = 0;
    for (sector, covering) in by_sector.iter().enumerate() {
        let start = sector as u64 * SECTOR;
        let range = u64_to_usize(start)..u64_to_usize(start + SECTOR);
        let covering = covering.iter().copied();
        let durable = covering
            .clone()
            .filter(|w| w.order < durable_before)
            .max_by_key(|w| w.order);
        let got = &disk[range.clone()];
        let is = |p: u8| got.iter().all(|&b| b == p);
        let ok = covering
            .filter(|w| w.order >= durable_before)
            .any(|w| is(w.pattern))
            || match durable {
                Some(w) => {
                    checked += 1;
                    is(w.pattern)
                }
                None => got == &old[range],
            };
        assert!(
            ok,
            "round {round}: sector at {start:#x} lost a flushed write (durable: {:?})",
            durable.map(|w| (w.order, w.pattern))
        );
    }
    assert!(durable_before == 0 || checked > 0);
}

fn write_base(dir: &Path) {
    std::fs::write(dir.join("base.raw"), mixed_data(u64_to_usize(SIZE), 9)).unwrap();
}

#[test]
fn killed_writer_leaves_a_consistent_image_with_all_flushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xc0ffee);
    write_base(dir.path());
    for round in 0..10 {
        let img = create_round_image(dir.path(), "crash", round);
        // Writes of 4 KiB blocks with a flush every few writes; a write's
        // order is its command index.
        let mut script = Vec::new();
        let mut writes = Vec::new();
        for i in 0..600 {
            if i % 7 == 6 {
                script.push("flush".to_string());
                continue;
            }
            let w = random_write(&mut rng, script.len());
            script.push(format!("write -P {} {} {}", w.pattern, w.offset, w.len));
            writes.push(w);
        }
        // Never in the last quarter: the writer must still be writing (and
        // not already exiting) when the kill comes.
        let kill_after = rng.random_range(5..writes.len() * 3 / 4);
        let acked = run_and_kill(&mut rng, &img, "writeback", &script, kill_after).len();
        assert!(
            acked < writes.len(),
            "round {round}: the writer finished before the kill"
        );
        // One write at a time: the flush before the last acknowledged
        // write has completed.
        let last_acked = writes[acked - 1].order;
        let durable_before = (0..last_acked)
            .rev()
            .find(|&i| script[i] == "flush")
            .unwrap_or(0);
        check_after_crash(dir.path(), &img, round, &writes, durable_before);
    }
}

#[test]
fn killed_concurrent_writer_leaves_a_consistent_image_with_all_flushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xa5a5);
    write_base(dir.path());
    for round in 0..10 {
        let img = create_round_image(dir.path(), "aio", round);
        // Groups of up to 8 aio writes in flight at once (ranges within a
        // group do not overlap, but share clusters), then aio_flush (wait
        // for them) and flush. A write's order is its group.
        let mut script = Vec::new();
        let mut writes: Vec<Write> = Vec::new();
        for group in 0..120 {
            let first = writes.len();
            for _ in 0..rng.random_range(1..=8) {
                let w = random_write(&mut rng, group);
                if writes[first..]
                    .iter()
                    .any(|o| w.offset < o.offset + o.len && o.offset < w.offset + w.len)
                {
                    continue;
                }
                script.push(format!("aio_write -P {} {} {}", w.pattern, w.offset, w.len));
                writes.push(w);
            }
            script.push("aio_flush".to_string());
            script.push("flush".to_string());
        }
        let cache = if round % 3 == 1 { "none" } else { "writeback" };
        // Never in the last quarter: the writer must still be writing (and
        // not already exiting) when the kill comes.
        let kill_after = rng.random_range(5..writes.len() * 3 / 4);
        let acked = run_and_kill(&mut rng, &img, cache, &script, kill_after);
        assert!(
            acked.len() < writes.len(),
            "round {round}: the writer finished before the kill"
        );
        // Map every acknowledgement to its write: groups run one after
        // the other, so the newest group acknowledged so far is the first
        // place to look.
        let mut group = 0;
        for line in &acked {
            let found = writes.iter().find(|w| {
                w.order >= group
                    && *line == format!("wrote {0}/{0} bytes at offset {1}", w.len, w.offset)
            });
            group = found
                .unwrap_or_else(|| panic!("round {round}: unexpected line {line:?}"))
                .order;
        }
        // A write of group g was sent only after the flush of group g - 1
        // had completed.
        check_after_crash(dir.path(), &img, round, &writes, group);
    }
}
