//! `img bench`: the request pattern of `qemu-img bench` (start offset, step,
//! wrap at the end of the disk), timed the same way.
//!
//! Requests run one after the other: the engine is synchronous, so the
//! queue depth is reported but does not change the I/O pattern.

use std::path::Path;
use std::time::Instant;

use anyhow::Context;

use super::required_format;
use crate::{OpenOptions, open_disk_with};

pub struct BenchArgs<'a> {
    pub count: u64,
    pub depth: u64,
    pub format: Option<&'a str>,
    pub direct: bool,
    pub offset: u64,
    pub size: u64,
    pub step: Option<u64>,
    pub write: bool,
    pub pattern: u8,
    pub flush_interval: Option<u64>,
    pub quiet: bool,
    pub filename: &'a Path,
}

pub fn run(a: BenchArgs<'_>) -> anyhow::Result<i32> {
    let format = required_format(a.format)?;
    let mut disk = open_disk_with(
        a.filename,
        format,
        OpenOptions {
            read_only: !a.write,
            direct: a.direct,
        },
    )
    .with_context(|| format!("opening {}", a.filename.display()))?;
    let image_size = disk.size();
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
    let mut buf = vec![a.pattern; a.size as usize];
    let mut offset = a.offset;
    let start = Instant::now();
    for i in 0..a.count {
        // Like qemu-img, a request that would cross the end starts over at 0.
        let this = if offset + a.size > image_size {
            0
        } else {
            offset
        };
        if a.write {
            disk.write_at(&buf, this)?;
        } else {
            disk.read_at(&mut buf, this)?;
        }
        if let Some(n) = a.flush_interval
            && n > 0
            && (i + 1) % n == 0
        {
            disk.flush()?;
        }
        offset = if image_size == 0 {
            0
        } else {
            (offset + step) % image_size
        };
    }
    let elapsed = start.elapsed().as_secs_f64();
    if !a.quiet {
        println!("Run completed in {elapsed:.3} seconds.");
    }
    Ok(0)
}
