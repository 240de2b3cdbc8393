//! `img io -c CMD ...`: the qemu-io commands read, write, discard and flush,
//! with qemu-io's output lines so the same scripts run through both.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;

use super::required_format;
use super::size::{human, parse_number, parse_size};
use crate::{DiskBackend, OpenOptions, open_disk_with};

/// qemu-io's default write pattern.
const DEFAULT_WRITE_PATTERN: u8 = 0xcd;

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
}

fn parse(cmd: &str) -> anyhow::Result<Command> {
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
                pattern = Some(parse_number(p)? as u8);
            }
            "-z" => zero = true,
            "-u" => unmap = true,
            "-q" => quiet = true,
            _ if a.starts_with("-P") => pattern = Some(parse_number(&a[2..])? as u8),
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
    println!("{verb} {len}/{len} bytes at offset {offset}");
    let rate = if secs > 0.0 { len as f64 / secs } else { 0.0 };
    println!(
        "{}, 1 ops; {secs:.4} sec ({} /sec and {:.4} ops/sec)",
        human(len),
        human(rate as u64),
        if secs > 0.0 { 1.0 / secs } else { 0.0 }
    );
}

fn exec(disk: &mut dyn DiskBackend, cmd: &Command, buf: &mut Vec<u8>) -> anyhow::Result<()> {
    let start = Instant::now();
    match *cmd {
        Command::Read {
            pattern,
            offset,
            len,
            quiet,
        } => {
            buf.clear();
            buf.resize(len as usize, 0);
            disk.read_at(buf, offset)?;
            if let Some(p) = pattern
                && let Some(bad) = buf.iter().position(|&b| b != p)
            {
                println!(
                    "Pattern verification failed at offset {}, {} bytes",
                    offset + bad as u64,
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
                buf.resize(len as usize, pattern);
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
    }
    Ok(())
}

pub fn run(
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
    let mut disk = open_disk_with(filename, format, OpenOptions { read_only, direct })
        .with_context(|| format!("opening {}", filename.display()))?;
    let mut buf = Vec::new();
    let mut status = 0;
    let mut out = std::io::stdout();
    for (cmd, text) in parsed.iter().zip(commands) {
        if let Err(e) = exec(disk.as_mut(), cmd, &mut buf) {
            println!("{text}: {e:#}");
            status = 1;
        }
        // A line per completed command, visible at once (crash tests read it).
        out.flush()?;
    }
    Ok(status)
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
        assert!(parse("write 0").is_err());
        assert!(parse("write -z -P 1 0 1").is_err());
        assert!(parse("frobnicate 0 1").is_err());
        assert!(parse("").is_err());
    }
}
