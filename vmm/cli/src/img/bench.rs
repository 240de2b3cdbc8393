//! `img bench`: the request pattern of `qemu-img bench` (start offset, step,
//! wrap at the end of the disk), timed the same way.
//!
//! The queue depth is real: `-d N` runs N workers on one `ConcurrentDisk`,
//! so up to N requests are on the host at once.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::Context;

use super::required_format;
use block::{BackingPolicy, ConcurrentDisk, OpenOptions, Pages, io_buffers};
use int_cast::u64_to_usize;

/// Most requests in flight (worker threads).
const MAX_DEPTH: u64 = 1024;

/// Offset of request `i`: qemu-img bench starts at `start`, adds `step` and
/// wraps at the end of the disk; a request that would cross the end starts
/// over at 0 (the position it came from stays the base for the next one).
fn request_offset(start: u64, step: u64, i: u64, size: u64, image_size: u64) -> u64 {
    if image_size == 0 {
        return 0;
    }
    let pos = (u128::from(start) + u128::from(step) * u128::from(i)) % u128::from(image_size);
    // A cast the lints refuse, allowed as nothing else fits: the remainder is below
    // `image_size`, a u64.
    #[allow(clippy::cast_possible_truncation)]
    let pos = pos as u64;
    if pos + size > image_size { 0 } else { pos }
}

pub(crate) struct BenchArgs<'a> {
    pub(crate) count: u64,
    pub(crate) depth: u64,
    pub(crate) format: Option<&'a str>,
    pub(crate) direct: bool,
    pub(crate) offset: u64,
    pub(crate) size: u64,
    pub(crate) step: Option<u64>,
    pub(crate) write: bool,
    pub(crate) pattern: u8,
    pub(crate) flush_interval: Option<u64>,
    pub(crate) quiet: bool,
    pub(crate) filename: &'a Path,
}

pub(crate) fn run(a: BenchArgs<'_>) -> anyhow::Result<i32> {
    let format = required_format(a.format)?;
    let disk = ConcurrentDisk::open(
        a.filename,
        format,
        OpenOptions {
            read_only: !a.write,
            direct: a.direct,
            // As qemu-img: the backing files the images name.
            backing: BackingPolicy::FollowImage,
        },
    )
    .with_context(|| format!("opening {}", a.filename.display()))?;
    let result = run_requests(&a, &disk);
    // Report metadata write errors at close instead of losing them in a drop.
    let closed = disk.close().context("closing the image");
    result.and(closed.map(|()| 0))
}

fn run_requests(a: &BenchArgs<'_>, disk: &ConcurrentDisk) -> anyhow::Result<()> {
    let image_size = disk.size();
    anyhow::ensure!(
        (1..=MAX_DEPTH).contains(&a.depth),
        "queue depth must be 1 to {MAX_DEPTH}, not {}",
        a.depth
    );
    let depth = a.depth.min(a.count.max(1));
    let step = a.step.unwrap_or(a.size);
    anyhow::ensure!(
        a.size > 0 && a.size <= 1 << 30,
        "invalid request size {}",
        a.size
    );
    anyhow::ensure!(
        a.offset.saturating_add(a.size) <= image_size,
        "request at offset {} does not fit the image ({image_size} bytes)",
        a.offset
    );
    if !a.quiet {
        println!(
            "Sending {} {} requests, {} bytes each, {} in parallel (starting at offset {}, step size {})",
            a.count,
            if a.write { "write" } else { "read" },
            a.size,
            a.depth,
            a.offset,
            step
        );
        if let Some(n) = a.flush_interval {
            println!("Sending flush every {n} requests");
        }
    }
    // `depth` workers take request numbers from a shared counter, so up to
    // `depth` requests are in flight at once, in qemu-img's order.
    let next = AtomicU64::new(0);
    // One pre-filled buffer per request slot, page aligned (O_DIRECT needs
    // no copy), cut from one huge-page mapping as virtio-blk's bounce
    // buffers are: this measures the path a guest's requests take.
    // (qemu-img bench cuts its buffers from one ordinary allocation.)
    let mut buffers = io_buffers(u64_to_usize(depth), u64_to_usize(a.size), Pages::Huge)
        .context("allocating the request buffers")?;
    for b in &mut buffers {
        b.as_mut_slice().fill(a.pattern);
    }
    let start = Instant::now();
    let next = &next;
    let results: Vec<anyhow::Result<()>> = std::thread::scope(|scope| {
        let workers: Vec<_> = buffers
            .iter_mut()
            .map(|buf| {
                let buf = buf.as_mut_slice();
                scope.spawn(move || -> anyhow::Result<()> {
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        if i >= a.count {
                            return Ok(());
                        }
                        let this = request_offset(a.offset, step, i, a.size, image_size);
                        if a.write {
                            disk.write_at(buf, this)?;
                        } else {
                            disk.read_at(buf, this)?;
                        }
                        if let Some(n) = a.flush_interval
                            && n > 0
                            && (i + 1).is_multiple_of(n)
                        {
                            disk.flush()?;
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| {
                w.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a bench worker panicked")))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    let elapsed = start.elapsed().as_secs_f64();
    if !a.quiet {
        println!("Run completed in {elapsed:.3} seconds.");
    }
    Ok(())
}
