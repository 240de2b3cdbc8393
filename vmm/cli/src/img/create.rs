//! `img create`.

use std::path::Path;

use anyhow::Context;

use super::size::parse_size;
use block::Format;
use block::qcow2::{BackingPolicy, CreateOptions, create as create_qcow2, header::CompressionType};

fn on_off(key: &str, v: &str) -> anyhow::Result<bool> {
    match v {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => anyhow::bail!("{key}: expected on or off, got {v:?}"),
    }
}

pub(crate) fn run(
    format: &str,
    backing: Option<String>,
    backing_format: Option<String>,
    options: &[String],
    quiet: bool,
    filename: &Path,
    size: Option<String>,
) -> anyhow::Result<i32> {
    let format: Format = format.parse()?;
    let mut opts = CreateOptions {
        backing_file: backing,
        backing_format: backing_format.as_deref().map(str::parse).transpose()?,
        size: size.as_deref().map(parse_size).transpose()?,
        // As qemu-img: the backing file's own chain is opened to check it.
        backing_policy: BackingPolicy::FollowImage,
        ..CreateOptions::default()
    };
    for kv in options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|s| !s.is_empty())
    {
        let (k, v) = kv.split_once('=').unwrap_or((kv, "on"));
        match k {
            "cluster_size" => opts.cluster_size = parse_size(v)?,
            "lazy_refcounts" => opts.lazy_refcounts = on_off(k, v)?,
            "refcount_bits" => opts.refcount_bits = v.parse().context("refcount_bits")?,
            "compat" => {
                opts.compat_v2 = match v {
                    "0.10" | "v2" => true,
                    "1.1" | "v3" => false,
                    _ => anyhow::bail!("compat: expected 0.10 or 1.1, got {v:?}"),
                }
            }
            "compression_type" => {
                opts.compression_type = match v {
                    "zlib" => CompressionType::Zlib,
                    "zstd" => CompressionType::Zstd,
                    _ => anyhow::bail!("compression_type: expected zlib or zstd, got {v:?}"),
                }
            }
            "backing_file" => opts.backing_file = Some(v.to_string()),
            "backing_fmt" => opts.backing_format = Some(v.parse()?),
            "size" => opts.size = Some(parse_size(v)?),
            "extended_l2" if !on_off(k, v)? => {}
            "preallocation" if v == "off" => {}
            _ => anyhow::bail!("unsupported option {kv:?}"),
        }
    }
    match format {
        Format::Raw => {
            anyhow::ensure!(
                opts.backing_file.is_none(),
                "raw images have no backing file"
            );
            let size = opts.size.context("image size is required")?;
            if !quiet {
                println!("Formatting '{}', fmt=raw size={size}", filename.display());
            }
            let f = std::fs::File::create(filename)
                .with_context(|| format!("creating {}", filename.display()))?;
            f.set_len(size)?;
        }
        Format::Qcow2 => {
            if !quiet {
                let mut line = format!(
                    "Formatting '{}', fmt=qcow2 cluster_size={} extended_l2=off compression_type={}",
                    filename.display(),
                    opts.cluster_size,
                    opts.compression_type
                );
                if let Some(s) = opts.size {
                    line += &format!(" size={s}");
                }
                if let Some(b) = &opts.backing_file {
                    line += &format!(" backing_file={b}");
                }
                if let Some(f) = opts.backing_format {
                    line += &format!(" backing_fmt={f}");
                }
                line += &format!(
                    " lazy_refcounts={} refcount_bits={}",
                    if opts.lazy_refcounts { "on" } else { "off" },
                    opts.refcount_bits
                );
                println!("{line}");
            }
            create_qcow2(filename, &opts)
                .with_context(|| format!("creating {}", filename.display()))?;
        }
    }
    Ok(0)
}
