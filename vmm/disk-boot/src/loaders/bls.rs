//! Boot Loader Specification type #1 entries (`/loader/entries/*.conf`): as GRUB's
//! `blscfg` reads them (Fedora, RHEL: newest version first, `saved_entry` from `grubenv`)
//! and as systemd-boot does (`loader.conf`'s `default` glob on the EFI system partition,
//! with an `XBOOTLDR` partition beside it).

use std::cmp::Ordering;

use super::{Chosen, Context, FileRef, Loader, LoaderError};

/// Entries read from one directory.
const MAX_ENTRIES: usize = 256;
/// One entry file (they are a few hundred bytes).
const MAX_ENTRY_BYTES: u64 = 64 << 10;

/// One entry file's keys.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Entry {
    /// The file name without `.conf`: the entry's id (`saved_entry`, `default`).
    pub(crate) id: String,
    /// The directory it was read from.
    pub(crate) dir: String,
    pub(crate) title: String,
    pub(crate) version: String,
    pub(crate) machine_id: String,
    pub(crate) sort_key: String,
    pub(crate) linux: Option<String>,
    pub(crate) initrds: Vec<String>,
    pub(crate) options: Vec<String>,
    pub(crate) efi: Option<String>,
}

/// Parses an entry: `key value` lines, `#` comments; `initrd` and `options` may repeat.
pub(crate) fn parse(id: &str, dir: &str, text: &str) -> Entry {
    let mut entry = Entry {
        id: id.to_string(),
        dir: dir.to_string(),
        ..Entry::default()
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (key, value) = match line.split_once(char::is_whitespace) {
            Some((k, v)) => (k, v.trim().to_string()),
            None => (line, String::new()),
        };
        match key {
            "title" => entry.title = value,
            "version" => entry.version = value,
            "machine-id" => entry.machine_id = value,
            "sort-key" => entry.sort_key = value,
            "linux" => entry.linux = Some(value),
            "initrd" => entry.initrds.push(value),
            "options" => entry.options.push(value),
            "efi" => entry.efi = Some(value),
            _ => {}
        }
    }
    if entry.title.is_empty() {
        entry.title = id.to_string();
    }
    entry
}

/// The `*.conf` entries in `dir` on `part`, in file-name order.
pub(crate) fn read_dir(
    cx: &mut Context<'_>,
    part: usize,
    dir: &str,
) -> Result<Vec<Entry>, LoaderError> {
    let names = match cx.files.list(part, dir, MAX_ENTRIES * 4) {
        Ok(names) => names,
        Err(crate::fs::FsError::Budget) => return Err(crate::Error::ReadBudget.into()),
        Err(e) => {
            return Err(LoaderError::NoEntry {
                config: FileRef {
                    part,
                    path: dir.to_string(),
                },
                reason: format!("cannot list {dir}: {e}"),
            });
        }
    };
    let mut names: Vec<String> = names
        .into_iter()
        .filter(|n| n.ends_with(".conf") && !n.starts_with('.'))
        .collect();
    names.sort();
    if names.len() > MAX_ENTRIES {
        cx.notes.add(format!(
            "{dir}: more than {MAX_ENTRIES} entries, the rest are ignored"
        ));
        names.truncate(MAX_ENTRIES);
    }
    let mut entries = Vec::new();
    for name in names {
        let path = format!("{dir}/{name}");
        match cx.files.read(part, &path, MAX_ENTRY_BYTES) {
            Ok(bytes) => {
                let id = name.trim_end_matches(".conf");
                entries.push(parse(id, dir, &String::from_utf8_lossy(&bytes)));
            }
            Err(crate::fs::FsError::Budget) => return Err(crate::Error::ReadBudget.into()),
            Err(e) => cx.notes.add(format!("{path}: skipped: {e}")),
        }
    }
    Ok(entries)
}

/// GRUB `blscfg`'s order: by version, newest first (RPM's version comparison), then by id.
pub(crate) fn sort_newest_first(entries: &mut [Entry]) {
    entries.sort_by(|a, b| {
        let version = |e: &Entry| {
            if e.version.is_empty() {
                e.id.clone()
            } else {
                e.version.clone()
            }
        };
        rpm_version_cmp(&version(b), &version(a)).then_with(|| b.id.cmp(&a.id))
    });
}

/// systemd-boot's order: entries with a sort key first, by sort key, machine id and
/// version (newest first); the others by id, newest version first.
fn sort_systemd(entries: &mut [Entry]) {
    entries.sort_by(
        |a, b| match (a.sort_key.is_empty(), b.sort_key.is_empty()) {
            (false, true) => Ordering::Less,
            (true, false) => Ordering::Greater,
            (false, false) => a
                .sort_key
                .cmp(&b.sort_key)
                .then_with(|| a.machine_id.cmp(&b.machine_id))
                .then_with(|| rpm_version_cmp(&b.version, &a.version)),
            (true, true) => rpm_version_cmp(&b.id, &a.id),
        },
    );
}

/// RPM's `rpmvercmp` (also what systemd-boot and `blscfg` use): runs of digits compare
/// as numbers, runs of letters as text, digits beat letters, `~` sorts before anything.
pub(crate) fn rpm_version_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        a = skip_separators(a);
        b = skip_separators(b);
        match (a.first(), b.first()) {
            (Some(b'~'), Some(b'~')) => {
                a = &a[1..];
                b = &b[1..];
                continue;
            }
            (Some(b'~'), _) => return Ordering::Less,
            (_, Some(b'~')) => return Ordering::Greater,
            (Some(b'^'), Some(b'^')) => {
                a = &a[1..];
                b = &b[1..];
                continue;
            }
            (Some(b'^'), None) => return Ordering::Greater,
            (None, Some(b'^')) => return Ordering::Less,
            (Some(b'^'), _) => return Ordering::Less,
            (_, Some(b'^')) => return Ordering::Greater,
            (None, None) => return Ordering::Equal,
            (None, _) => return Ordering::Less,
            (_, None) => return Ordering::Greater,
            _ => {}
        }
        let numeric = a[0].is_ascii_digit();
        let run = |s: &[u8]| {
            s.iter()
                .take_while(|c| {
                    if numeric {
                        c.is_ascii_digit()
                    } else {
                        c.is_ascii_alphabetic()
                    }
                })
                .count()
        };
        let (na, nb) = (run(a), run(b));
        if nb == 0 {
            // One side digits, the other letters: digits are newer.
            return if numeric {
                Ordering::Greater
            } else {
                Ordering::Less
            };
        }
        let (sa, sb) = (&a[..na], &b[..nb]);
        let order = if numeric {
            let trim = |s: &[u8]| {
                let zeros = s.iter().take_while(|c| **c == b'0').count();
                s[zeros..].to_vec()
            };
            let (ta, tb) = (trim(sa), trim(sb));
            ta.len().cmp(&tb.len()).then_with(|| ta.cmp(&tb))
        } else {
            sa.cmp(sb)
        };
        if order != Ordering::Equal {
            return order;
        }
        a = &a[na..];
        b = &b[nb..];
    }
}

/// Past the characters `rpmvercmp` ignores between segments.
fn skip_separators(s: &[u8]) -> &[u8] {
    let n = s
        .iter()
        .take_while(|c| !c.is_ascii_alphanumeric() && **c != b'~' && **c != b'^')
        .count();
    &s[n..]
}

/// An entry's files and command line, its paths relative to `part`.
fn chosen(
    cx: &Context<'_>,
    loader: Loader,
    entry: &Entry,
    part: usize,
) -> Result<Chosen, LoaderError> {
    let config = FileRef {
        part,
        path: format!("{}/{}.conf", entry.dir, entry.id),
    };
    let no_entry = |reason: String| LoaderError::NoEntry {
        config: config.clone(),
        reason,
    };
    let Some(linux) = &entry.linux else {
        return Err(no_entry(format!(
            "entry {:?} has no linux line (an EFI program is not booted)",
            entry.id
        )));
    };
    let kernel = FileRef {
        part,
        path: linux.clone(),
    };
    if !cx.is_file(part, linux)? {
        return Err(no_entry(format!(
            "entry {:?}: kernel {} not found",
            entry.id,
            cx.describe_file(&kernel)
        )));
    }
    let mut initrds = Vec::new();
    for path in entry.initrds.iter().flat_map(|l| l.split_whitespace()) {
        let file = FileRef {
            part,
            path: path.to_string(),
        };
        if !cx.is_file(part, path)? {
            return Err(no_entry(format!(
                "entry {:?}: initrd {} not found",
                entry.id,
                cx.describe_file(&file)
            )));
        }
        initrds.push(file);
    }
    Ok(Chosen {
        loader,
        config,
        title: entry.title.clone(),
        kernel,
        initrds,
        cmdline: entry.options.join(" "),
    })
}

/// systemd-boot on the EFI system partition `esp`: entries there and on an `XBOOTLDR`
/// partition, `loader.conf`'s `default` (a glob over entry ids; `@saved` needs an EFI
/// variable there is none of, so the first entry), else the first in its order.
pub(crate) fn systemd_boot(cx: &mut Context<'_>, esp: usize) -> Result<Chosen, LoaderError> {
    let conf = FileRef {
        part: esp,
        path: "/loader/loader.conf".into(),
    };
    let mut default = None;
    if cx.is_file(esp, &conf.path)? {
        let text = cx.read_config(&conf)?;
        for line in text.lines() {
            let mut words = line.split_whitespace();
            if words.next() == Some("default") {
                default = words.next().map(str::to_string);
            }
        }
    }
    let mut entries: Vec<(Entry, usize)> = Vec::new();
    let xbootldr =
        (0..cx.files.partitions().len()).find(|&p| cx.files.partitions()[p].is_xbootldr());
    for part in std::iter::once(esp).chain(xbootldr) {
        if cx.is_dir(part, "/loader/entries")? {
            for entry in read_dir(cx, part, "/loader/entries")? {
                entries.push((entry, part));
            }
        }
    }
    if entries.is_empty() {
        return Err(LoaderError::NoEntry {
            config: conf,
            reason: "systemd-boot has no entries in /loader/entries".into(),
        });
    }
    let mut order: Vec<Entry> = entries.iter().map(|(e, _)| e.clone()).collect();
    sort_systemd(&mut order);
    let pick = default
        .filter(|d| d != "@saved" && d != "@default")
        .and_then(|pattern| {
            order
                .iter()
                .find(|e| glob(&pattern, &e.id) || glob(&pattern, &format!("{}.conf", e.id)))
                .cloned()
        })
        .unwrap_or_else(|| order[0].clone());
    let part = entries
        .iter()
        .find(|(e, _)| e.id == pick.id && e.dir == pick.dir)
        .map_or(esp, |(_, p)| *p);
    chosen(cx, Loader::SystemdBoot, &pick, part)
}

/// BLS entries found on their own (no boot loader configuration beside them): the newest.
pub(crate) fn standalone(
    cx: &mut Context<'_>,
    part: usize,
    dir: &str,
) -> Result<Chosen, LoaderError> {
    let mut entries = read_dir(cx, part, dir)?;
    sort_systemd(&mut entries);
    let Some(first) = entries.first() else {
        return Err(LoaderError::NoEntry {
            config: FileRef {
                part,
                path: dir.to_string(),
            },
            reason: format!("no entries in {dir}"),
        });
    };
    let mut chosen = chosen(cx, Loader::Bls, first, part)?;
    // Under /boot/loader/entries on a root filesystem, paths are relative to /boot.
    if dir.starts_with("/boot/") && !chosen.kernel.path.starts_with("/boot/") {
        chosen.kernel.path = format!("/boot{}", chosen.kernel.path);
    }
    Ok(chosen)
}

/// `*` and `?` glob matching (systemd-boot's `default` pattern).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_as_rpm_does() {
        use Ordering::*;
        for (a, b, want) in [
            ("6.8.5-301.fc40.x86_64", "6.8.5-301.fc40.x86_64", Equal),
            ("6.10.0", "6.9.12", Greater),
            ("6.8.5-301", "6.8.5-300", Greater),
            ("1.0a", "1.0", Greater),
            ("1.0", "1.0a", Less),
            ("1.0~rc1", "1.0", Less),
            ("1.0^git1", "1.0", Greater),
            ("1.05", "1.5", Equal),
            ("2", "a", Greater),
        ] {
            assert_eq!(rpm_version_cmp(a, b), want, "{a} vs {b}");
        }
    }

    #[test]
    fn entries_parse_and_sort() {
        let e = parse(
            "abc-6.8.5",
            "/loader/entries",
            "title Fedora Linux (6.8.5)\nversion 6.8.5\nlinux /vmlinuz-6.8.5\ninitrd /initramfs-6.8.5.img $tuned_initrd\noptions root=UUID=x ro\noptions $tuned_params\n# comment\nunknown key\n",
        );
        assert_eq!(e.linux.as_deref(), Some("/vmlinuz-6.8.5"));
        assert_eq!(e.options, vec!["root=UUID=x ro", "$tuned_params"]);
        assert_eq!(e.initrds, vec!["/initramfs-6.8.5.img $tuned_initrd"]);
        let mut list = vec![
            parse("a-6.9", "/l", "version 6.9.0"),
            parse("a-6.10", "/l", "version 6.10.1"),
            parse("a-6.8", "/l", "version 6.8.5"),
        ];
        sort_newest_first(&mut list);
        let ids: Vec<&str> = list.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["a-6.10", "a-6.9", "a-6.8"]);
    }

    #[test]
    fn globs() {
        assert!(glob("fedora-*", "fedora-6.8"));
        assert!(glob("*6.8*", "fedora-6.8.conf"));
        assert!(!glob("arch-*", "fedora-6.8"));
        assert!(glob("a?c", "abc"));
    }
}
