//! Crash safety: a writer killed with SIGKILL at a random point leaves an
//! image that QEMU reads, that `qemu-img check` finds at most leaky, and
//! that holds every write acknowledged by a later flush.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use block::qcow2::{CreateOptions, create};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const BLOCK: u64 = 4096;

struct Write {
    index: usize,
    offset: u64,
    len: u64,
    pattern: u8,
}

#[test]
fn killed_writer_leaves_a_consistent_image_with_all_flushed_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(0xc0ffee);
    let size: u64 = 16 << 20;
    let base = dir.path().join("base.raw");
    std::fs::write(&base, mixed_data(size as usize, 9)).unwrap();
    for round in 0..10 {
        let cluster_size = [4096u64, 65536, 512][round % 3];
        let with_backing = round % 2 == 0;
        let img = dir.path().join(format!("crash{round}.qcow2"));
        create(
            &img,
            &CreateOptions {
                size: Some(size),
                cluster_size,
                backing_file: with_backing.then(|| "base.raw".to_string()),
                backing_format: with_backing.then_some(block::Format::Raw),
                lazy_refcounts: round % 4 == 3,
                ..Default::default()
            },
        )
        .unwrap();
        // The script: writes of 4 KiB blocks with a flush every few writes.
        let mut cmds = Vec::new();
        let mut writes = Vec::new();
        for i in 0..600 {
            if i % 7 == 6 {
                cmds.push("flush".to_string());
                continue;
            }
            let offset = rng.random_range(0..size / BLOCK) * BLOCK;
            let len = (rng.random_range(1..=32u64) * BLOCK).min(size - offset);
            let pattern = rng.random_range(1..=255u8);
            cmds.push(format!("write -P {pattern} {offset} {len}"));
            writes.push(Write {
                index: cmds.len() - 1,
                offset,
                len,
                pattern,
            });
        }
        let mut child = block_img()
            .args(["io", "-f", "qcow2"])
            .args(cmds.iter().flat_map(|c| ["-c".to_string(), c.clone()]))
            .arg(&img)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if line.starts_with("wrote ") && tx.send(()).is_err() {
                    break;
                }
            }
        });
        // Kill after a random number of acknowledged writes.
        let kill_after = rng.random_range(5..writes.len() - 5);
        let mut seen = 0;
        while seen < kill_after {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(()) => seen += 1,
                Err(_) => break,
            }
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..3000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let mut acknowledged = seen;
        while rx.try_recv().is_ok() {
            acknowledged += 1;
        }
        assert!(
            acknowledged < writes.len(),
            "round {round}: the writer finished before the kill"
        );

        // Lazy refcounts: the image is left dirty and its refcounts stale
        // on purpose; opening it for writing rebuilds them.
        if round % 4 == 3 {
            let h = block::qcow2::check::read_image_header(&img).unwrap();
            assert!(h.is_dirty(), "round {round}: lazy image not marked dirty");
            drop(block::open_disk(&img, block::Format::Qcow2, false).unwrap());
        }
        // At most leaks.
        let out = run(Command::new(qemu_tool("qemu-img"))
            .args(["check", "-f", "qcow2"])
            .arg(&img));
        let code = out.status.code();
        assert!(
            code == Some(0) || code == Some(3),
            "round {round}: qemu-img check after a crash: {code:?}\n{}",
            String::from_utf8_lossy(&out.stdout)
        );

        // Every write before the last acknowledged flush is there; blocks may
        // also hold a later write that landed before the kill.
        let last_ack_cmd = writes[acknowledged - 1].index;
        let durable_flush = (0..last_ack_cmd).rev().find(|&i| cmds[i] == "flush");
        let flat = dir.path().join(format!("flat{round}.raw"));
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
        let backing = if with_backing {
            mixed_data(size as usize, 9)
        } else {
            vec![0u8; size as usize]
        };
        let mut checked = 0;
        for b in 0..size / BLOCK {
            let start = b * BLOCK;
            let covering: Vec<&Write> = writes
                .iter()
                .filter(|w| w.offset <= start && start < w.offset + w.len)
                .collect();
            let got = &disk[start as usize..(start + BLOCK) as usize];
            let durable =
                durable_flush.and_then(|f| covering.iter().rfind(|w| w.index < f).copied());
            let mut allowed: Vec<Vec<u8>> = covering
                .iter()
                .filter(|w| durable_flush.is_none_or(|f| w.index > f))
                .map(|w| vec![w.pattern; BLOCK as usize])
                .collect();
            match durable {
                Some(w) => {
                    checked += 1;
                    allowed.push(vec![w.pattern; BLOCK as usize]);
                }
                None => allowed.push(backing[start as usize..(start + BLOCK) as usize].to_vec()),
            }
            assert!(
                allowed.iter().any(|a| a[..] == got[..]),
                "round {round}: block at {start:#x} lost a flushed write (durable: {:?})",
                durable.map(|w| (w.index, w.pattern))
            );
        }
        assert!(durable_flush.is_none() || checked > 0);
    }
}
