//! `img io -c CMD ...`: the qemu-io commands read, write, discard and flush,
//! and their asynchronous forms aio_read, aio_write and aio_flush, with
//! qemu-io's output lines so the same scripts run through both.
//!
//! A script runs on the one-request-at-a-time engine (`open_disk_with`)
//! unless it has aio_ commands: then it runs on a [`ConcurrentDisk`], each
//! aio request on a thread of its own, so requests really overlap (crash
//! tests of the concurrent write path use this). `aio_flush` waits for
//! every request in flight, as in qemu-io; it does not flush the image
//! (`flush` does).

use int_cast::usize_to_u64;
use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use anyhow::Context;

use super::required_format;
use super::size::{human, parse_size, pattern_byte};
use block::{
    BackingPolicy, ConcurrentDisk, OpenOptions, SerializedDisk, SharedDisk, open_disk_with,
};
use int_cast::u64_to_usize;

/// qemu-io's default write pattern.
const DEFAULT_WRITE_PATTERN: u8 = 0xcd;
/// Most aio requests in flight; one more waits for the oldest to finish.
const MAX_AIO_IN_FLIGHT: usize = 64;

#[derive(Debug, PartialEq, Eq)]
enum Command {
    Read {
        pattern: Option<u8>,
        offset: u64,
        len: u64,
        quiet: bool,
    },
    Write {
        pattern: u8,
        zero: bool,
        unmap: bool,
        offset: u64,
        len: u64,
        quiet: bool,
    },
    Discard {
        offset: u64,
        len: u64,
        quiet: bool,
    },
    Flush,
    /// `aio_read` / `aio_write`: the inner command, run without waiting.
    Aio(Box<Command>),
    /// `aio_flush`: wait for every aio request in flight.
    AioFlush,
}

fn parse(cmd: &str) -> anyhow::Result<Command> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    match words.split_first() {
        Some((&"aio_flush", [])) => Ok(Command::AioFlush),
        Some((&"aio_flush", _)) => anyhow::bail!("aio_flush takes no arguments"),
        Some((name, rest)) if *name == "aio_read" || *name == "aio_write" => {
            let sync = format!("{} {}", &name[4..], rest.join(" "));
            Ok(Command::Aio(Box::new(parse_sync(&sync)?)))
        }
        _ => parse_sync(cmd),
    }
}

fn parse_sync(cmd: &str) -> anyhow::Result<Command> {
    let words: Vec<&str> = cmd.split_whitespace().collect();
    let (name, args) = words.split_first().context("empty command")?;
    let mut pattern = None;
    let mut zero = false;
    let mut unmap = false;
    let mut quiet = false;
    let mut pos = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "-P" => {
                let p = it.next().context("-P needs a pattern")?;
                pattern = Some(pattern_byte(p)?);
            }
            "-z" => zero = true,
            "-u" => unmap = true,
            "-q" => quiet = true,
            _ if a.starts_with("-P") => pattern = Some(pattern_byte(&a[2..])?),
            _ if a.starts_with('-') => anyhow::bail!("{name}: unsupported flag {a}"),
            _ => pos.push(parse_size(a)?),
        }
    }
    let off_len = |pos: &[u64]| -> anyhow::Result<(u64, u64)> {
        match pos {
            [o, l] => Ok((*o, *l)),
            _ => anyhow::bail!("{name}: expected OFFSET LENGTH"),
        }
    };
    Ok(match *name {
        "read" | "r" => {
            let (offset, len) = off_len(&pos)?;
            Command::Read {
                pattern,
                offset,
                len,
                quiet,
            }
        }
        "write" | "w" => {
            let (offset, len) = off_len(&pos)?;
            anyhow::ensure!(
                !(zero && pattern.is_some()),
                "write: -z and -P are exclusive"
            );
            Command::Write {
                pattern: pattern.unwrap_or(DEFAULT_WRITE_PATTERN),
                zero,
                unmap,
                offset,
                len,
                quiet,
            }
        }
        "discard" | "d" => {
            let (offset, len) = off_len(&pos)?;
            Command::Discard { offset, len, quiet }
        }
        "flush" | "f" => Command::Flush,
        other => anyhow::bail!("unsupported command {other:?}"),
    })
}

fn report(verb: &str, len: u64, offset: u64, start: Instant) {
    let secs = start.elapsed().as_secs_f64();
    let rate = if secs > 0.0 { len as f64 / secs } else { 0.0 };
    // Float to integer has no From/TryFrom; `as` saturates, which a rate may.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let rate = rate as u64;
    // One print: lines of concurrent aio requests must not interleave.
    print!(
        "{verb} {len}/{len} bytes at offset {offset}\n{}, 1 ops; {secs:.4} sec ({} /sec and {:.4} ops/sec)\n",
        human(len),
        human(rate),
        if secs > 0.0 { 1.0 / secs } else { 0.0 }
    );
}

/// Runs one synchronous command (aio commands are dispatched by `run`).
fn exec(disk: &dyn SharedDisk, cmd: &Command, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let start = Instant::now();
    match *cmd {
        Command::Read {
            pattern,
            offset,
            len,
            quiet,
        } => {
            buf.clear();
            buf.resize(u64_to_usize(len), 0);
            disk.read_at(buf, offset)?;
            if let Some(p) = pattern
                && let Some(bad) = buf.iter().position(|&b| b != p)
            {
                println!(
                    "Pattern verification failed at offset {}, {} bytes",
                    offset + usize_to_u64(bad),
                    len
                );
                anyhow::bail!("pattern verification failed");
            }
            if !quiet {
                report("read", len, offset, start);
            }
        }
        Command::Write {
            pattern,
            zero,
            unmap,
            offset,
            len,
            quiet,
        } => {
            disk.check_range(offset, len)?; // before allocating the buffer
            if zero {
                disk.write_zeroes(offset, len, unmap)?;
            } else {
                buf.clear();
                buf.resize(u64_to_usize(len), pattern);
                disk.write_at(buf, offset)?;
            }
            if !quiet {
                report("wrote", len, offset, start);
            }
        }
        Command::Discard { offset, len, quiet } => {
            disk.discard(offset, len)?;
            if !quiet {
                report("discard", len, offset, start);
            }
        }
        Command::Flush => disk.flush()?,
        Command::Aio(_) | Command::AioFlush => anyhow::bail!("aio command run synchronously"),
    }
    Ok(())
}

pub(crate) fn run(
    commands: &[String],
    format: Option<&str>,
    direct: bool,
    read_only: bool,
    filename: &Path,
) -> anyhow::Result<i32> {
    let format = required_format(format)?;
    let parsed = commands
        .iter()
        .map(|c| parse(c).with_context(|| format!("command {c:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let opts = OpenOptions {
        read_only,
        direct,
        // As qemu-io: the backing files the images name (the user's own).
        backing: BackingPolicy::FollowImage,
    };
    let opening = || format!("opening {}", filename.display());
    let script: Vec<(&Command, &str)> = parsed
        .iter()
        .zip(commands.iter().map(String::as_str))
        .collect();
    if !parsed.iter().any(|c| matches!(c, Command::Aio(_))) {
        let disk = open_disk_with(filename, format, opts).with_context(opening)?;
        // Closed by its drop, which writes the metadata back.
        return run_script(&SerializedDisk::new(disk), &script);
    }
    let disk = ConcurrentDisk::open(filename, format, opts).with_context(opening)?;
    let status = run_script(&disk, &script)?;
    disk.close().context("closing the image")?;
    Ok(status)
}

/// Runs the commands in order; aio requests run on threads of their own
/// until an `aio_flush` or the end of the script waits for them.
fn run_script(disk: &dyn SharedDisk, script: &[(&Command, &str)]) -> anyhow::Result<i32> {
    let failed = AtomicBool::new(false);
    let report_error = |text: &str, e: anyhow::Error| {
        println!("{text}: {e:#}");
        failed.store(true, Ordering::Relaxed);
    };
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut in_flight = VecDeque::new();
        let mut buf = Vec::new();
        for &(cmd, text) in script {
            match cmd {
                Command::Aio(inner) => {
                    if in_flight.len() >= MAX_AIO_IN_FLIGHT
                        && let Some(oldest) = in_flight.pop_front()
                    {
                        join_request(oldest);
                    }
                    let report_error = &report_error;
                    in_flight.push_back(scope.spawn(move || {
                        let mut buf = Vec::new();
                        if let Err(e) = exec(disk, inner, &mut buf) {
                            report_error(text, e);
                        }
                        let _ = std::io::stdout().flush();
                    }));
                }
                Command::AioFlush => in_flight.drain(..).for_each(join_request),
                _ => {
                    if let Err(e) = exec(disk, cmd, &mut buf) {
                        report_error(text, e);
                    }
                }
            }
            // A line per completed command, visible at once (crash tests
            // read them).
            std::io::stdout().flush()?;
        }
        // qemu-io also waits for what is in flight before it closes.
        in_flight.drain(..).for_each(join_request);
        Ok(())
    })?;
    Ok(i32::from(failed.load(Ordering::Relaxed)))
}

/// Waits for an aio request; a panic in one is a bug, reported as such.
fn join_request(handle: std::thread::ScopedJoinHandle<'_, ()>) {
    if handle.join().is_err() {
        println!("an aio request panicked");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_qemu_io_commands() {
        assert_eq!(
            parse("write -P 0x11 64k 4k").unwrap(),
            Command::Write {
                pattern: 0x11,
                zero: false,
                unmap: false,
                offset: 65536,
                len: 4096,
                quiet: false
            }
        );
        assert_eq!(
            parse("write -z 0 1M").unwrap(),
            Command::Write {
                pattern: 0xcd,
                zero: true,
                unmap: false,
                offset: 0,
                len: 1 << 20,
                quiet: false
            }
        );
        assert_eq!(
            parse("read -P 7 512 512").unwrap(),
            Command::Read {
                pattern: Some(7),
                offset: 512,
                len: 512,
                quiet: false
            }
        );
        assert_eq!(parse("flush").unwrap(), Command::Flush);
        assert_eq!(
            parse("discard 0 64k").unwrap(),
            Command::Discard {
                offset: 0,
                len: 65536,
                quiet: false
            }
        );
        assert_eq!(
            parse("aio_write -P 3 4k 512").unwrap(),
            Command::Aio(Box::new(Command::Write {
                pattern: 3,
                zero: false,
                unmap: false,
                offset: 4096,
                len: 512,
                quiet: false
            }))
        );
        assert_eq!(parse("aio_flush").unwrap(), Command::AioFlush);
        assert!(parse("aio_flush 0").is_err());
        assert!(parse("aio_discard 0 512").is_err());
        assert!(parse("aio_write").is_err());
        assert!(parse("write 0").is_err());
        assert!(parse("write -z -P 1 0 1").is_err());
        assert!(parse("frobnicate 0 1").is_err());
        assert!(parse("").is_err());
    }
}
