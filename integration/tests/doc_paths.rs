//! Every repository path the Markdown docs name exists.
//!
//! The docs are every tracked `*.md` file (`git ls-files`, or a walk of the tree skipping
//! `target*`, `.git` and `fuzz/` build output when there is no `.git`), except the upstream
//! docs under `vendor/` (only `vendor/h2/PATCHED.md` is ours). What counts as a path:
//!
//! - **Links** `[text](target)` and `[label]: target` whose target is not a URL (`scheme:`) or
//!   an anchor alone: resolved against the file's folder (a leading `/` against the repository
//!   root), `#anchor` dropped. Every such link must exist.
//! - **Words of inline code spans** (`` `images/build.sh` ``, `` `cargo run -p proto -- images/deploy/crds` ``;
//!   words are split at spaces and `=`) and of fenced `sh`/`bash`/`shell` blocks (other fences
//!   are diagrams and output, not read). A word is a path candidate when it contains a `/`,
//!   consists only of `A-Z a-z 0-9 . _ - + /` once wrapping punctuation and a `:line` suffix are
//!   stripped, and is not absolute (`/dev/kvm`, `/var/run/kubevirt`), home-relative, a URL, a
//!   flag, or a placeholder or glob (`<…>`, `…`, `...`, `*`, `{}`, `|`, `$`).
//!   A candidate is checked only when its first component is an entry of the file's folder or
//!   of one of the folders above it up to the root (so `images/deploy/` anywhere, and `src/vm.rs`
//!   or `docs/design.md` in a crate's docs, resolved against that crate); it must then exist
//!   under one of those folders. A path whose first component is none of ours (`pkg/virt-handler/…`,
//!   `kubevirt.io/v1`, `x86_64/…`) is not a path of this repository and is not checked.
//! - A code span that directly follows another project's name in the possessive
//!   (`QEMU's`, `Firecracker's`, `KubeVirt's`, ...: [`OTHER_PROJECTS`]) names that project's
//!   file and is not checked: QEMU's `block/file-posix.c` is not `vmm/block`'s.
//!
//! Prose outside code spans is not read: there a `/` is as often "or" (`handler/launcher`) as a
//! path. A failure lists each missing path as `file:line: path`. The rule's cases are the
//! unit tests at the end, each on a small tree of its own.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

/// The repository's files and folders, relative to its root, `/`-separated.
struct Tree {
    files: BTreeSet<String>,
    dirs: BTreeSet<String>,
}

impl Tree {
    fn load(root: &Path) -> Tree {
        Tree::of(git_files(root).unwrap_or_else(|| {
            let mut files = BTreeSet::new();
            walk(root, "", &mut files);
            files
        }))
    }

    fn of(files: BTreeSet<String>) -> Tree {
        let mut dirs = BTreeSet::new();
        dirs.insert(String::new());
        for file in &files {
            let mut at = file.as_str();
            while let Some(cut) = at.rfind('/') {
                at = &at[..cut];
                if !dirs.insert(at.to_string()) {
                    break;
                }
            }
        }
        Tree { files, dirs }
    }

    fn exists(&self, path: &str) -> bool {
        self.files.contains(path) || self.dirs.contains(path)
    }
}

/// The checkout's files as git sees them: tracked, and new ones not yet added unless ignored
/// (build output is not a file of the repository). `None` without git.
fn git_files(root: &Path) -> Option<BTreeSet<String>> {
    if !root.join(".git").exists() {
        return None;
    }
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(
        text.split('\0')
            .filter(|f| !f.is_empty())
            // A file deleted in the working tree but not yet in the index is gone.
            .filter(|f| root.join(f).exists())
            .map(str::to_string)
            .collect(),
    )
}

fn walk(dir: &Path, rel: &str, out: &mut BTreeSet<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let skip = name == ".git"
            || (rel.is_empty() && name.starts_with("target"))
            || name == "target"
            || (rel.ends_with("fuzz") && ["corpus", "artifacts"].contains(&name.as_str()));
        if skip {
            continue;
        }
        let path = if rel.is_empty() {
            name.clone()
        } else {
            format!("{rel}/{name}")
        };
        match entry.file_type() {
            Ok(t) if t.is_dir() => walk(&entry.path(), &path, out),
            Ok(_) => {
                out.insert(path);
            }
            Err(_) => {}
        }
    }
}

/// `folder` joined with `path` (`.` and `..` resolved); `None` when it leaves the root.
fn join(folder: &str, path: &str) -> Option<String> {
    let mut parts: Vec<&str> = folder.split('/').filter(|p| !p.is_empty()).collect();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

/// The folders a doc's relative paths may be written against: its own, then each above it.
fn ancestors(doc: &str) -> Vec<String> {
    let mut folders = Vec::new();
    let mut at = doc;
    while let Some(cut) = at.rfind('/') {
        at = &at[..cut];
        folders.push(at.to_string());
    }
    folders.push(String::new());
    folders
}

/// One path a doc names, and where.
struct Mention {
    /// Byte offset in the doc.
    offset: usize,
    path: String,
    kind: Kind,
}

#[derive(Clone, Copy)]
enum Kind {
    Link,
    Code,
}

/// Byte offset → 1-based line number.
struct Lines(Vec<usize>);

impl Lines {
    fn new(text: &str) -> Lines {
        let mut starts = vec![0];
        starts.extend(text.match_indices('\n').map(|(i, _)| i + 1));
        Lines(starts)
    }
    fn at(&self, offset: usize) -> usize {
        self.0.partition_point(|&s| s <= offset)
    }
}

/// Splits a doc into what is read: fenced shell blocks (kept as code), other fenced blocks
/// (blanked), and the rest. Returns the text with every fenced block blanked (newlines kept,
/// so offsets and lines stay), and the byte ranges of the shell blocks' contents.
fn split_fences(text: &str) -> (String, Vec<(usize, usize)>) {
    let mut prose = String::with_capacity(text.len());
    let mut shell = Vec::new();
    let mut fence: Option<(String, bool, usize)> = None;
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let fence_char = trimmed.chars().next().filter(|&c| c == '`' || c == '~');
        let marker: String = fence_char
            .map(|f| trimmed.chars().take_while(|&c| c == f).collect())
            .unwrap_or_default();
        let is_marker = marker.len() >= 3;
        match &fence {
            None if is_marker => {
                let info = trimmed[marker.len()..].trim();
                let lang = info.split_whitespace().next().unwrap_or("");
                let is_shell = ["sh", "bash", "shell"].contains(&lang);
                fence = Some((marker, is_shell, offset + line.len()));
                blank(&mut prose, line);
            }
            None => prose.push_str(line),
            Some((open, is_shell, start)) => {
                if is_marker
                    && marker.starts_with(open.as_str())
                    && trimmed[marker.len()..].trim().is_empty()
                {
                    if *is_shell {
                        shell.push((*start, offset));
                    }
                    fence = None;
                }
                blank(&mut prose, line);
            }
        }
        offset += line.len();
    }
    (prose, shell)
}

fn blank(out: &mut String, line: &str) {
    // Byte for byte, so that offsets into the original text stay valid.
    out.extend(line.bytes().map(|b| if b == b'\n' { '\n' } else { ' ' }));
}

/// Inline code spans of `prose` (CommonMark: a run of n backticks closed by the next run of
/// exactly n, not across a blank line): the contents' ranges. The spans are blanked in `prose`.
fn code_spans(prose: &mut String) -> Vec<(usize, usize)> {
    let bytes = prose.as_bytes();
    let mut spans = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            i += 2;
            continue;
        }
        if bytes[i] != b'`' {
            i += 1;
            continue;
        }
        let run = bytes[i..].iter().take_while(|&&b| b == b'`').count();
        let start = i + run;
        let mut j = start;
        let mut close = None;
        while j < bytes.len() {
            if bytes[j] == b'\n' && blank_line_follows(&bytes[j + 1..]) {
                break;
            }
            if bytes[j] == b'`' {
                let n = bytes[j..].iter().take_while(|&&b| b == b'`').count();
                if n == run {
                    close = Some(j);
                    break;
                }
                j += n;
                continue;
            }
            j += 1;
        }
        match close {
            Some(end) => {
                spans.push((start, end));
                i = end + run;
            }
            None => i = start,
        }
    }
    // Every span, with its backticks, becomes spaces (newlines kept).
    let mut out: Vec<u8> = prose.as_bytes().to_vec();
    for &(s, e) in &spans {
        let from = s - out[..s].iter().rev().take_while(|&&b| b == b'`').count();
        let to = e + out[e..].iter().take_while(|&&b| b == b'`').count();
        for b in &mut out[from..to] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
    }
    *prose = String::from_utf8(out).expect("only ASCII bytes replaced");
    spans
}

/// Whether `rest` (what follows a newline) starts with a blank line: the paragraph ends.
fn blank_line_follows(rest: &[u8]) -> bool {
    rest.iter()
        .find(|&&b| b != b' ' && b != b'\t')
        .is_none_or(|&b| b == b'\n')
}

/// Link targets in `prose` (code already blanked): `](target)` and `[label]: target`.
fn links(prose: &str) -> Vec<Mention> {
    let mut found = Vec::new();
    for (at, _) in prose.match_indices("](") {
        let rest = &prose[at + 2..];
        let Some(end) = rest.find(')') else { continue };
        let inner = rest[..end].trim();
        let target = inner.split_whitespace().next().unwrap_or("");
        let target = target.trim_start_matches('<').trim_end_matches('>');
        found.push(Mention {
            offset: at,
            path: target.to_string(),
            kind: Kind::Link,
        });
    }
    let mut offset = 0;
    for line in prose.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[')
            && let Some(close) = t.find("]:")
            && !t[1..close].contains(']')
        {
            let target = t[close + 2..].split_whitespace().next().unwrap_or("");
            found.push(Mention {
                offset,
                path: target.to_string(),
                kind: Kind::Link,
            });
        }
        offset += line.len();
    }
    found
}

/// The words of a code range that may be paths, with their offsets.
fn code_words(text: &str, range: (usize, usize), out: &mut Vec<Mention>) {
    let (start, end) = range;
    for word in text[start..end].split(|c: char| c.is_whitespace() || c == '=') {
        // The word's offset in `text` (a subslice of it).
        let offset = word.as_ptr() as usize - text.as_ptr() as usize;
        if let Some(path) = candidate(word) {
            out.push(Mention {
                offset,
                path,
                kind: Kind::Code,
            });
        }
    }
}

/// A code word as a relative path, or `None` when it is not one (see the module doc).
fn candidate(word: &str) -> Option<String> {
    let word = word
        .trim_start_matches(['(', '"', '\'', '['])
        .trim_end_matches(['.', ',', ';', ')', '"', '\'', ']', '!', '?']);
    let word = match word.rsplit_once(':') {
        Some((path, line)) if !line.is_empty() && line.bytes().all(|b| b.is_ascii_digit()) => path,
        _ => word,
    };
    let word = word.split('#').next().unwrap_or("");
    if !word.contains('/')
        || word.starts_with('/')
        || word.starts_with('-')
        || word.contains("...")
        || word.contains("//")
        || !word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-+/".contains(c))
    {
        return None;
    }
    Some(word.trim_start_matches("./").to_string())
}

/// Whether a link target is a URL or only an anchor (neither is a file of ours).
fn is_external(target: &str) -> bool {
    target.is_empty()
        || target.starts_with('#')
        || target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
}

/// Other projects whose files the docs name (as `QEMU's `block/file-posix.c``).
const OTHER_PROJECTS: &[&str] = &[
    "KubeVirt's",
    "QEMU's",
    "libvirt's",
    "Firecracker's",
    "Hypervisor's",
    "Linux's",
    "Kubernetes'",
    "containerd's",
    "upstream's",
];

/// Whether the code span starting at `start` (its contents) follows another project's name
/// (`QEMU's `block/file-posix.c``): a file of that project, not of this repository.
fn introduced_as_another_projects(text: &str, start: usize) -> bool {
    let before = text[..start].trim_end_matches('`');
    before
        .split_whitespace()
        .next_back()
        .map(|w| w.trim_start_matches(['(', '[', '"']))
        .is_some_and(|w| OTHER_PROJECTS.contains(&w))
}

/// What a mention names.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// A file or folder of the repository.
    Exists,
    /// Nothing: why.
    Missing(String),
    /// Not a path of this repository (a URL, another project's path).
    NotOurs,
}

/// What `mention`, in the doc `doc`, names.
fn check(tree: &Tree, doc: &str, mention: &Mention) -> Verdict {
    match mention.kind {
        Kind::Link => {
            let target = mention.path.split('#').next().unwrap_or("");
            if is_external(&mention.path) {
                return Verdict::NotOurs;
            }
            let folder = if target.starts_with('/') {
                String::new()
            } else {
                doc.rsplit_once('/')
                    .map(|(d, _)| d.to_string())
                    .unwrap_or_default()
            };
            match join(&folder, target) {
                Some(p) if tree.exists(&p) => Verdict::Exists,
                Some(p) => Verdict::Missing(format!("link `{target}` ({p} does not exist)")),
                None => Verdict::Missing(format!("link `{target}` leaves the repository")),
            }
        }
        Kind::Code => {
            let path = mention.path.trim_end_matches('/');
            // Leading `..` steps belong to the base, which is then the file's folder only.
            let steps = path.len() - path.trim_start_matches("../").len();
            let (up, rest) = path.split_at(steps);
            let folders = if up.is_empty() {
                ancestors(doc)
            } else {
                ancestors(doc).into_iter().take(1).collect()
            };
            let Some(first) = rest.split('/').next().filter(|f| !f.is_empty()) else {
                return Verdict::NotOurs;
            };
            let mut ours = false;
            for folder in folders {
                let Some(base) = join(&folder, up) else {
                    continue;
                };
                if join(&base, rest).is_some_and(|p| tree.exists(&p)) {
                    return Verdict::Exists;
                }
                ours |= join(&base, first).is_some_and(|f| tree.exists(&f));
            }
            if ours {
                Verdict::Missing(format!("`{}`", mention.path))
            } else {
                Verdict::NotOurs
            }
        }
    }
}

fn docs(tree: &Tree) -> Vec<&str> {
    tree.files
        .iter()
        .map(String::as_str)
        .filter(|f| f.ends_with(".md"))
        .filter(|f| !f.starts_with("vendor/") || f.ends_with("/PATCHED.md"))
        .collect()
}

/// What the doc `doc` (its text) names: how many repository paths, and each missing one as
/// `file:line: what`.
fn check_doc(tree: &Tree, doc: &str, text: &str) -> (usize, Vec<String>) {
    let lines = Lines::new(text);
    let (mut prose, shell) = split_fences(text);
    let spans = code_spans(&mut prose);
    let mut mentions = links(&prose);
    for range in spans {
        if !introduced_as_another_projects(text, range.0) {
            code_words(text, range, &mut mentions);
        }
    }
    for range in shell {
        code_words(text, range, &mut mentions);
    }
    mentions.sort_by_key(|m| m.offset);
    let mut checked = 0;
    let mut missing = Vec::new();
    for m in &mentions {
        match check(tree, doc, m) {
            Verdict::Exists => checked += 1,
            Verdict::Missing(why) => {
                checked += 1;
                missing.push(format!("{doc}:{}: {why}", lines.at(m.offset)));
            }
            Verdict::NotOurs => {}
        }
    }
    (checked, missing)
}

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

#[test]
fn every_repository_path_named_in_the_docs_exists() {
    let started = std::time::Instant::now();
    let root = root();
    let tree = Tree::load(root);
    let docs = docs(&tree);
    assert!(
        docs.contains(&"README.md") && docs.contains(&"ARCHITECTURE.md"),
        "the docs were not found: {docs:?}"
    );
    let mut checked = 0;
    let mut missing = Vec::new();
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).unwrap_or_else(|e| panic!("{doc}: {e}"));
        let (n, m) = check_doc(&tree, doc, &text);
        checked += n;
        missing.extend(m);
    }
    assert!(
        missing.is_empty(),
        "{} path(s) named in the docs do not exist:\n{}",
        missing.len(),
        missing.join("\n")
    );
    // The docs name some 450 paths of ours; far fewer means the reading broke.
    assert!(
        checked > 300,
        "only {checked} paths found in {} docs",
        docs.len()
    );
    eprintln!(
        "{checked} paths in {} docs checked in {:?}",
        docs.len(),
        started.elapsed()
    );
}

/// A small repository for the rule's cases.
fn sample_tree() -> Tree {
    Tree::of(
        [
            "README.md",
            "controller/src/lib.rs",
            "images/deploy/10-virt-controller.yaml",
            "images/build.sh",
            "vmm/README.md",
            "vmm/src/vm.rs",
            "vmm/block/src/lock.rs",
            "vmm/docs/library.md",
        ]
        .into_iter()
        .map(str::to_string)
        .collect(),
    )
}

fn missing(doc: &str, text: &str) -> Vec<String> {
    check_doc(&sample_tree(), doc, text).1
}

#[test]
fn a_missing_path_in_a_code_span_or_a_link_is_reported_with_its_line() {
    let text =
        "# t\n\nSee `controller/deploy/virt-controller.yaml`\n(and [the lib](vmm/docs/lib.md)).\n";
    assert_eq!(
        missing("README.md", text),
        [
            "README.md:3: `controller/deploy/virt-controller.yaml`",
            "README.md:4: link `vmm/docs/lib.md` (vmm/docs/lib.md does not exist)",
        ]
    );
    assert_eq!(
        missing(
            "README.md",
            "`images/deploy/virt-controller.yaml`, `vmm/src/vm.rs:352`\n"
        ),
        ["README.md:1: `images/deploy/virt-controller.yaml`"]
    );
}

#[test]
fn paths_are_resolved_against_the_docs_folder_and_those_above_it() {
    // `src/vm.rs` in vmm/'s docs is vmm/src/vm.rs; `docs/library.md` from vmm/README.md too.
    assert!(
        missing(
            "vmm/docs/library.md",
            "`src/vm.rs`, `block/src/lock.rs`, `images/build.sh`"
        )
        .is_empty()
    );
    assert!(missing("vmm/README.md", "[lib](docs/library.md), `../README.md`").is_empty());
    assert_eq!(
        missing(
            "vmm/docs/library.md",
            "`src/vmm.rs` and [x](../src/gone.rs)"
        ),
        [
            "vmm/docs/library.md:1: `src/vmm.rs`",
            "vmm/docs/library.md:1: link `../src/gone.rs` (vmm/src/gone.rs does not exist)",
        ]
    );
}

#[test]
fn what_is_not_a_path_of_this_repository_is_not_checked() {
    let text = "\
`pkg/virt-handler/vm.go`, `kubevirt.io/v1`, `/dev/kvm`, `~/.cache/x`, `images/<name>.yaml`,
`images/deploy/handler-*.yaml`, `vmm/…/x.rs`, `--out=/tmp/x`, [KubeVirt](https://kubevirt.io/a/b),
[up](#layout), QEMU's `block/file-posix.c`, Firecracker's `src/vmm/src/builder.rs`,
`devices.kubevirt.io/kvm\\|tun`, `../run` (a symlink's target), `img create|info`.

```
  vmm/gone.rs ──► a diagram
```
";
    assert_eq!(missing("vmm/block/README.md", text), Vec::<String>::new());
}

#[test]
fn shell_blocks_are_read_and_a_span_may_wrap_a_line() {
    let text = "```sh\nbash images/build.sh --out x\nbash images/gone.sh\n```\n\nrun `cargo run --\nimages/missing.yaml` then\n";
    assert_eq!(
        missing("README.md", text),
        [
            "README.md:3: `images/gone.sh`",
            "README.md:7: `images/missing.yaml`"
        ]
    );
}
