//! `vmm img ...`: qemu-img/qemu-io style commands over the `block` crate's
//! engines (create, info, check, bench, io), with qemu-img's flags. Like
//! qemu-img, they follow the backing files the images name
//! (`BackingPolicy::FollowImage`): they are for the user's own images,
//! never a tenant's.

mod bench;
mod check;
mod create;
mod info;
mod io;
pub(crate) mod size;

use std::path::PathBuf;

use block::Format;

/// The `img` subcommands and their qemu-img/qemu-io flags.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum ImgCommand {
    /// Create a disk image (qemu-img create).
    Create {
        /// Image format: qcow2 or raw.
        #[arg(short = 'f', default_value = "raw")]
        format: String,
        /// Backing file (stored as given; relative to the image's directory).
        #[arg(short = 'b')]
        backing: Option<String>,
        /// Backing file format (required with -b).
        #[arg(short = 'F')]
        backing_format: Option<String>,
        /// Format options, comma separated: cluster_size=, lazy_refcounts=,
        /// refcount_bits=, compat=, compression_type=, backing_file=, backing_fmt=, size=.
        #[arg(short = 'o')]
        options: Vec<String>,
        /// Quiet.
        #[arg(short = 'q')]
        quiet: bool,
        filename: PathBuf,
        /// Size, with optional k/M/G/T suffix.
        size: Option<String>,
    },
    /// Show information about an image (qemu-img info).
    Info {
        #[arg(short = 'f')]
        format: Option<String>,
        /// human or json.
        #[arg(long = "output", default_value = "human")]
        output: String,
        /// Accepted for compatibility (images are never locked here).
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        filename: PathBuf,
    },
    /// Check an image for consistency (qemu-img check).
    Check {
        #[arg(short = 'f')]
        format: Option<String>,
        #[arg(long = "output", default_value = "human")]
        output: String,
        #[arg(short = 'q')]
        quiet: bool,
        /// Repair: `leaks` or `all` (both rebuild the refcounts from the tables).
        #[arg(short = 'r')]
        repair: Option<String>,
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        filename: PathBuf,
    },
    /// Run a simple I/O benchmark (qemu-img bench).
    Bench {
        /// Number of requests.
        #[arg(short = 'c', default_value_t = 75000)]
        count: u64,
        /// Queue depth (requests are issued one after the other here).
        #[arg(short = 'd', default_value_t = 64)]
        depth: u64,
        #[arg(short = 'f')]
        format: Option<String>,
        /// Bypass the host page cache (same as -t none).
        #[arg(short = 'n')]
        nocache: bool,
        /// Start offset.
        #[arg(short = 'o', default_value = "0")]
        offset: String,
        /// Request size.
        #[arg(short = 's', default_value = "4096")]
        size: String,
        /// Distance between request offsets (default: the request size).
        #[arg(short = 'S')]
        step: Option<String>,
        /// Cache mode: writeback, none, writethrough, directsync, unsafe.
        #[arg(short = 't', default_value = "writeback")]
        cache: String,
        /// Write instead of read.
        #[arg(short = 'w')]
        write: bool,
        /// Byte written with -w.
        #[arg(long = "pattern", default_value = "0")]
        pattern: String,
        /// Flush after this many requests.
        #[arg(long = "flush-interval")]
        flush_interval: Option<u64>,
        #[arg(long = "no-drain")]
        no_drain: bool,
        /// AIO mode (accepted for compatibility).
        #[arg(short = 'i')]
        aio: Option<String>,
        #[arg(short = 'q')]
        quiet: bool,
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        filename: PathBuf,
    },
    /// Run qemu-io commands on an image (read, write, discard, flush).
    Io {
        /// Command to run; may be repeated.
        #[arg(short = 'c')]
        commands: Vec<String>,
        #[arg(short = 'f')]
        format: Option<String>,
        /// Bypass the host page cache.
        #[arg(short = 'n', long = "nocache")]
        nocache: bool,
        #[arg(short = 't', long = "cache")]
        cache: Option<String>,
        /// Open read-only.
        #[arg(short = 'r', long = "read-only")]
        read_only: bool,
        #[arg(short = 'U', long = "force-share")]
        force_share: bool,
        filename: PathBuf,
    },
}

/// Runs one command; returns the process exit code (qemu-img's conventions).
pub(crate) fn run(cmd: ImgCommand) -> anyhow::Result<i32> {
    match cmd {
        ImgCommand::Create {
            format,
            backing,
            backing_format,
            options,
            quiet,
            filename,
            size,
        } => create::run(
            &format,
            backing,
            backing_format,
            &options,
            quiet,
            &filename,
            size,
        ),
        ImgCommand::Info {
            format,
            output,
            filename,
            ..
        } => info::run(format.as_deref(), &output, &filename),
        ImgCommand::Check {
            format,
            output,
            quiet,
            repair,
            filename,
            ..
        } => check::run(
            format.as_deref(),
            &output,
            quiet,
            repair.as_deref(),
            &filename,
        ),
        ImgCommand::Bench {
            count,
            depth,
            format,
            nocache,
            offset,
            size,
            step,
            cache,
            write,
            pattern,
            flush_interval,
            quiet,
            filename,
            ..
        } => bench::run(bench::BenchArgs {
            count,
            depth,
            format: format.as_deref(),
            direct: nocache || cache_is_direct(&cache)?,
            offset: size::parse_size(&offset)?,
            size: size::parse_size(&size)?,
            step: step.as_deref().map(size::parse_size).transpose()?,
            write,
            pattern: size::pattern_byte(&pattern)?,
            flush_interval,
            quiet,
            filename: &filename,
        }),
        ImgCommand::Io {
            commands,
            format,
            nocache,
            cache,
            read_only,
            filename,
            ..
        } => {
            let direct = nocache
                || cache
                    .as_deref()
                    .map(cache_is_direct)
                    .transpose()?
                    .unwrap_or(false);
            io::run(&commands, format.as_deref(), direct, read_only, &filename)
        }
    }
}

/// Whether a qemu cache mode bypasses the host page cache.
fn cache_is_direct(mode: &str) -> anyhow::Result<bool> {
    match mode {
        "none" | "directsync" => Ok(true),
        "writeback" | "writethrough" | "unsafe" => Ok(false),
        other => anyhow::bail!("invalid cache mode {other:?}"),
    }
}

/// The format, which must be given: a format is never guessed from the contents.
fn required_format(format: Option<&str>) -> anyhow::Result<Format> {
    match format {
        Some(f) => Ok(f.parse()?),
        None => anyhow::bail!(
            "the image format must be given with -f (raw or qcow2); it is never guessed"
        ),
    }
}
