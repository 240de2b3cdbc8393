//! GRUB legacy's `menu.lst` (older CirrOS and distribution images): `default N`, `title`
//! blocks with `root (hd0,N)` (partitions counted from 0), `kernel` and `initrd`.

use super::{Chosen, Context, FileRef, Loader, LoaderError};
use crate::volumes::partition_by_grub_name;

/// Entries kept.
const MAX_ENTRIES: usize = 1024;

#[derive(Clone, Debug, Default)]
struct Entry {
    title: String,
    root: Option<String>,
    kernel: Option<String>,
    initrd: Option<String>,
    other: Option<String>,
}

pub(crate) fn boot(cx: &mut Context<'_>, config: FileRef) -> Result<Chosen, LoaderError> {
    let text = cx.read_config(&config)?;
    let mut default = 0usize;
    let mut entries: Vec<Entry> = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        // `key value` or `key=value`.
        let split = line
            .find(|c: char| c.is_whitespace() || c == '=')
            .unwrap_or(line.len());
        let key = line[..split].to_ascii_lowercase();
        let value = line[split..]
            .trim_start_matches(|c: char| c.is_whitespace() || c == '=')
            .trim()
            .to_string();
        match key.as_str() {
            "default" => default = value.parse().unwrap_or(0),
            "title" if entries.len() < MAX_ENTRIES => {
                entries.push(Entry {
                    title: value,
                    ..Entry::default()
                });
            }
            "root" | "rootnoverify" => {
                if let Some(e) = entries.last_mut() {
                    e.root = Some(value);
                }
            }
            "kernel" => {
                if let Some(e) = entries.last_mut() {
                    e.kernel = Some(value);
                }
            }
            "initrd" => {
                if let Some(e) = entries.last_mut() {
                    e.initrd = Some(value);
                }
            }
            "chainloader" | "makeactive" => {
                if let Some(e) = entries.last_mut() {
                    e.other = Some(key.clone());
                }
            }
            _ => {}
        }
    }
    let no_entry = |reason: String| LoaderError::NoEntry {
        config: config.clone(),
        reason,
    };
    let entry = entries
        .get(default)
        .or(entries.first())
        .cloned()
        .ok_or_else(|| no_entry("no title to boot".into()))?;
    if let Some(other) = &entry.other {
        return Err(no_entry(format!(
            "entry {:?} uses {other}, which is not supported",
            entry.title
        )));
    }
    let Some(kernel_line) = &entry.kernel else {
        return Err(no_entry(format!("entry {:?} has no kernel", entry.title)));
    };
    let mut words = kernel_line.split_whitespace();
    let kernel_path = words.next().unwrap_or("");
    let args: Vec<&str> = words.collect();
    let kernel = file(cx, &config, entry.root.as_deref(), kernel_path).map_err(&no_entry)?;
    if !cx.is_file(kernel.part, &kernel.path)? {
        return Err(no_entry(format!(
            "entry {:?}: kernel {} not found",
            entry.title,
            cx.describe_file(&kernel)
        )));
    }
    let mut initrds = Vec::new();
    if let Some(initrd) = entry
        .initrd
        .as_deref()
        .and_then(|l| l.split_whitespace().next())
    {
        let initrd = file(cx, &config, entry.root.as_deref(), initrd).map_err(&no_entry)?;
        if !cx.is_file(initrd.part, &initrd.path)? {
            return Err(no_entry(format!(
                "entry {:?}: initrd {} not found",
                entry.title,
                cx.describe_file(&initrd)
            )));
        }
        initrds.push(initrd);
    }
    Ok(Chosen {
        loader: Loader::GrubLegacy,
        config,
        title: entry.title,
        kernel,
        initrds,
        cmdline: args.join(" "),
    })
}

/// A GRUB legacy path: `(hd0,N)/path` or `/path` on the entry's `root`, partitions
/// numbered from 0 (`(hd0,0)` is the first).
fn file(
    cx: &Context<'_>,
    config: &FileRef,
    root: Option<&str>,
    path: &str,
) -> Result<FileRef, String> {
    let (device, path) = match path.strip_prefix('(') {
        Some(rest) => match rest.split_once(')') {
            Some((device, path)) => (Some(device.to_string()), path.to_string()),
            None => return Err(format!("malformed path {path:?}")),
        },
        None => (
            root.map(|r| r.trim_matches(['(', ')']).to_string()),
            path.to_string(),
        ),
    };
    let Some(device) = device else {
        return Ok(FileRef {
            part: config.part,
            path,
        });
    };
    // Legacy numbering: (hd0,0) is GRUB 2's (hd0,1).
    let modern = match device.split_once(',') {
        Some((disk, n)) => match n.trim().parse::<u32>() {
            Ok(n) => format!("{disk},{}", n + 1),
            Err(_) => device.clone(),
        },
        None => device.clone(),
    };
    let part = partition_by_grub_name(cx.files.partitions(), &modern)
        .map_err(|e| format!("({device}): {e}"))?;
    Ok(FileRef { part, path })
}
