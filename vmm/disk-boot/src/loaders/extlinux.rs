//! `extlinux.conf` / `syslinux.cfg` (Alpine, older images): `DEFAULT`, `LABEL` blocks with
//! `LINUX`/`KERNEL`, `INITRD` (comma-separated) and `APPEND`, `MENU DEFAULT`, a global
//! `APPEND`, and `INCLUDE`. Keywords are case-insensitive; relative paths are relative to
//! the configuration file's directory, as syslinux takes them.

use super::{Chosen, Context, FileRef, Loader, LoaderError};

/// `INCLUDE` nesting.
const MAX_INCLUDE: usize = 8;
/// Labels kept.
const MAX_LABELS: usize = 1024;

#[derive(Clone, Debug, Default)]
struct Label {
    name: String,
    kernel: Option<String>,
    initrd: Option<String>,
    append: Option<String>,
    menu_default: bool,
}

#[derive(Default)]
struct Config {
    default: Option<String>,
    append: Option<String>,
    labels: Vec<Label>,
}

pub(crate) fn boot(cx: &mut Context<'_>, config: FileRef) -> Result<Chosen, LoaderError> {
    let dir = config
        .path
        .rsplit_once('/')
        .map_or(String::new(), |(d, _)| d.to_string());
    let mut parsed = Config::default();
    read(cx, &config, &dir, &mut parsed, 0)?;
    let no_entry = |reason: String| LoaderError::NoEntry {
        config: config.clone(),
        reason,
    };
    let wanted = parsed.default.clone().unwrap_or_default();
    let wanted_label = wanted.split_whitespace().next().unwrap_or("").to_string();
    let label = parsed
        .labels
        .iter()
        .find(|l| l.name == wanted_label)
        .or_else(|| {
            parsed
                .labels
                .iter()
                .find(|l| l.name.eq_ignore_ascii_case(&wanted_label))
        })
        .or_else(|| parsed.labels.iter().find(|l| l.menu_default))
        .cloned();
    let label = match label {
        Some(label) => label,
        // `DEFAULT vmlinuz root=...` without a label of that name is a command line.
        None if !wanted_label.is_empty() && !wanted_label.ends_with(".c32") => Label {
            name: wanted_label.clone(),
            kernel: Some(wanted_label.clone()),
            append: Some(
                wanted
                    .split_once(char::is_whitespace)
                    .map_or(String::new(), |(_, rest)| rest.trim().to_string()),
            ),
            ..Label::default()
        },
        None => match parsed.labels.first() {
            Some(first) => first.clone(),
            None => return Err(no_entry("no LABEL to boot".into())),
        },
    };
    let Some(kernel_name) = label.kernel.clone() else {
        return Err(no_entry(format!("label {:?} names no kernel", label.name)));
    };
    if kernel_name.ends_with(".c32")
        || kernel_name.ends_with(".bs")
        || kernel_name.ends_with(".bin")
    {
        return Err(no_entry(format!(
            "label {:?} runs {kernel_name:?}, not a Linux kernel",
            label.name
        )));
    }
    let kernel = FileRef {
        part: config.part,
        path: relative(&dir, &kernel_name),
    };
    if !cx.is_file(kernel.part, &kernel.path)? {
        return Err(no_entry(format!(
            "label {:?}: kernel {} not found",
            label.name,
            cx.describe_file(&kernel)
        )));
    }
    let append = label
        .append
        .clone()
        .or(parsed.append.clone())
        .filter(|a| a != "-")
        .unwrap_or_default();
    // INITRD, or syslinux's `initrd=` in the command line.
    let initrd_list = label.initrd.clone().or_else(|| {
        append
            .split_whitespace()
            .find_map(|a| a.strip_prefix("initrd=").map(str::to_string))
    });
    let mut initrds = Vec::new();
    for name in initrd_list.iter().flat_map(|l| l.split(',')) {
        let name = name.trim();
        if name.is_empty() {
            continue;
        }
        let file = FileRef {
            part: config.part,
            path: relative(&dir, name),
        };
        if !cx.is_file(file.part, &file.path)? {
            return Err(no_entry(format!(
                "label {:?}: initrd {} not found",
                label.name,
                cx.describe_file(&file)
            )));
        }
        initrds.push(file);
    }
    let cmdline = if append.is_empty() {
        format!("BOOT_IMAGE={kernel_name}")
    } else {
        format!("BOOT_IMAGE={kernel_name} {append}")
    };
    Ok(Chosen {
        loader: Loader::Extlinux,
        config,
        title: label.name,
        kernel,
        initrds,
        cmdline,
    })
}

fn relative(dir: &str, path: &str) -> String {
    if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{dir}/{path}")
    }
}

fn read(
    cx: &mut Context<'_>,
    file: &FileRef,
    dir: &str,
    into: &mut Config,
    depth: usize,
) -> Result<(), LoaderError> {
    let text = cx.read_config(file)?;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (keyword, value) = match line.split_once(char::is_whitespace) {
            Some((k, v)) => (k.to_ascii_lowercase(), v.trim()),
            None => (line.to_ascii_lowercase(), ""),
        };
        let room = into.labels.len() < MAX_LABELS;
        let current = into.labels.last_mut();
        match (keyword.as_str(), current) {
            ("default", _) => into.default = Some(value.to_string()),
            ("label", _) if room => {
                into.labels.push(Label {
                    name: value.to_string(),
                    ..Label::default()
                });
            }
            ("linux" | "kernel", Some(label)) => label.kernel = Some(value.to_string()),
            ("initrd", Some(label)) => label.initrd = Some(value.to_string()),
            ("append", Some(label)) => label.append = Some(value.to_string()),
            ("append", None) => into.append = Some(value.to_string()),
            ("menu", Some(label)) if value.eq_ignore_ascii_case("default") => {
                label.menu_default = true;
            }
            ("include", _) => {
                if depth >= MAX_INCLUDE {
                    cx.notes.add(format!("INCLUDE {value}: nested too deep"));
                    continue;
                }
                let included = FileRef {
                    part: file.part,
                    path: relative(dir, value.split_whitespace().next().unwrap_or("")),
                };
                if cx.is_file(included.part, &included.path)? {
                    read(cx, &included, dir, into, depth + 1)?;
                } else {
                    cx.notes.add(format!("INCLUDE {value}: not found"));
                }
            }
            _ => {}
        }
    }
    Ok(())
}
