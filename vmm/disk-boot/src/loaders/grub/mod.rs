//! GRUB 2's `grub.cfg`, interpreted as data: the subset of GRUB's script language and
//! commands that `grub-mkconfig` (Debian, Ubuntu, Fedora, SUSE) and distribution ESP stubs
//! write, run against the disk's files without running anything else.
//!
//! What it does as GRUB does: variables (`set`, `name=value`, `$name`, `${name}`,
//! positional parameters in functions and entries), `if`/`elif`/`else`, `while`/`until`,
//! `for`, functions, `[`/`test` with file tests, `load_env` (the `grubenv` block with
//! `saved_entry`, `next_entry`, `kernelopts`), `search` and `search.fs_uuid|fs_label|file`
//! (by filesystem UUID, label or file, on the boot disk), `probe`, `configfile`/`source`
//! (chains, as Ubuntu's and Fedora's ESP stubs use), `menuentry`/`submenu` with `--id`,
//! `blscfg` (Fedora's BLS entries), `default` as an index, title or id with `>` into
//! submenus, `fallback`; then the chosen entry's `linux`/`linuxefi`/`linux16` and
//! `initrd`/`initrdefi`/`initrd16`, with GRUB's `BOOT_IMAGE=` and argument quoting.
//!
//! Everything else is skipped: display and terminal commands succeed without effect;
//! commands GRUB uses to test the machine (`loadfont`, `background_image`, `hwmatch`,
//! `keystatus`, `fwsetup --is-supported`) fail, as they would on a serial console; unknown
//! commands fail and are noted. Nothing is written (`save_env` changes nothing).
//! Execution is bounded: statements run, function and chain depth, menu size.

mod env_block;
pub(crate) mod script;
mod test_expr;

use std::collections::BTreeMap;
use std::rc::Rc;

use script::{Node, Part, Word};
use test_expr::FileTest;

use super::{Chosen, Context, FileRef, Loader, LoaderError};
use crate::Firmware;
use crate::volumes::partition_by_grub_name;

/// Statements one boot may run (generated configs run a few hundred).
const MAX_STEPS: u64 = 200_000;
/// Function calls and `source` nesting.
const MAX_CALL_DEPTH: usize = 32;
/// `configfile` chains (the ESP stub → grub.cfg is one).
const MAX_CHAIN: usize = 8;
/// Entries kept in one menu.
const MAX_MENU: usize = 1024;

/// Runs the configuration `config` as GRUB would with its prefix in `prefix_dir` (a path on
/// the same partition), and returns the entry it boots.
pub(crate) fn boot(
    cx: &mut Context<'_>,
    config: FileRef,
    prefix_dir: &str,
) -> Result<Chosen, LoaderError> {
    let root = cx
        .files
        .partitions()
        .get(config.part)
        .map(|p| p.grub_name())
        .unwrap_or_default();
    let mut grub = Grub::new(cx, &config);
    grub.set("root", &root);
    grub.set("prefix", &format!("({root}){prefix_dir}"));
    if grub.cx.firmware == Firmware::Efi {
        grub.set("cmdpath", &format!("({root}){prefix_dir}"));
    }
    grub.run_config(config, 0)
}

/// One menu item.
#[derive(Clone)]
enum Item {
    Entry {
        title: String,
        id: Option<String>,
        body: Rc<Vec<Node>>,
        args: Vec<String>,
        submenu: bool,
    },
    /// A Boot Loader Specification entry that `blscfg` added.
    Bls {
        entry: Rc<super::bls::Entry>,
        /// Where its paths are relative to: the partition and the directory prefix
        /// (`/boot` when the entries were under `/boot/loader/entries`).
        part: usize,
        base: String,
    },
}

impl Item {
    fn title(&self) -> &str {
        match self {
            Item::Entry { title, .. } => title,
            Item::Bls { entry, .. } => &entry.title,
        }
    }

    fn id(&self) -> Option<&str> {
        match self {
            Item::Entry { id, .. } => id.as_deref(),
            Item::Bls { entry, .. } => Some(&entry.id),
        }
    }
}

/// What running an entry loaded.
#[derive(Default)]
struct Load {
    kernel: Option<(FileRef, String)>,
    initrds: Vec<FileRef>,
    /// Why the entry cannot be booted here (chainloader, a missing kernel...).
    refused: Option<String>,
}

/// How a statement list ended.
enum Flow {
    Normal,
    /// `return` in a function.
    Return,
    /// `configfile`, `boot` or `exit`: stop this script.
    Stop,
}

/// Interpretation stops altogether on a [`LoaderError`].
type Run<T> = Result<T, LoaderError>;

struct Grub<'c, 'a> {
    cx: &'c mut Context<'a>,
    env: BTreeMap<String, String>,
    functions: BTreeMap<String, Rc<Vec<Node>>>,
    positional: Vec<String>,
    status: i32,
    steps: u64,
    depth: usize,
    menu: Vec<Item>,
    load: Option<Load>,
    /// The result of a `configfile` that took over.
    handover: Option<Result<Chosen, LoaderError>>,
    /// The configuration being run (for errors) and its chain depth.
    config: FileRef,
    chain: usize,
}

impl<'c, 'a> Grub<'c, 'a> {
    fn new(cx: &'c mut Context<'a>, config: &FileRef) -> Self {
        let mut env = BTreeMap::new();
        // What GRUB 2.06+ sets before it reads grub.cfg (normal mode).
        let (platform, cpu) = match cx.firmware {
            Firmware::Bios => ("pc", "i386"),
            Firmware::Efi => ("efi", "x86_64"),
        };
        for (name, value) in [
            ("grub_platform", platform),
            ("grub_cpu", cpu),
            ("feature_chainloader_bpb", "y"),
            ("feature_ntldr", "y"),
            ("feature_platform_search_hint", "y"),
            ("feature_default_font_path", "y"),
            ("feature_all_video_module", "y"),
            ("feature_menuentry_id", "y"),
            ("feature_menuentry_options", "y"),
            ("feature_200_final", "y"),
            ("feature_nativedisk_cmd", "y"),
            ("feature_timeout_style", "y"),
            ("pager", ""),
        ] {
            env.insert(name.to_string(), value.to_string());
        }
        Grub {
            cx,
            env,
            functions: BTreeMap::new(),
            positional: Vec::new(),
            status: 0,
            steps: 0,
            depth: 0,
            menu: Vec::new(),
            load: None,
            handover: None,
            config: config.clone(),
            chain: 0,
        }
    }

    fn set(&mut self, name: &str, value: &str) {
        self.env.insert(name.to_string(), value.to_string());
    }

    fn get(&self, name: &str) -> String {
        if let Ok(n) = name.parse::<usize>() {
            return match n {
                0 => String::new(),
                n => self.positional.get(n - 1).cloned().unwrap_or_default(),
            };
        }
        match name {
            "?" => self.status.to_string(),
            "#" => self.positional.len().to_string(),
            "@" | "*" => self.positional.join(" "),
            _ => self.env.get(name).cloned().unwrap_or_default(),
        }
    }

    fn no_entry(&self, reason: impl Into<String>) -> LoaderError {
        LoaderError::NoEntry {
            config: self.config.clone(),
            reason: reason.into(),
        }
    }

    /// Reads and runs a configuration file, then boots its menu's default entry (unless a
    /// `configfile` in it took over).
    fn run_config(&mut self, config: FileRef, chain: usize) -> Result<Chosen, LoaderError> {
        if chain > MAX_CHAIN {
            return Err(self.no_entry(format!("configfile chains more than {MAX_CHAIN} deep")));
        }
        let text = self.cx.read_config(&config)?;
        let (outer_config, outer_chain) = (
            std::mem::replace(&mut self.config, config.clone()),
            self.chain,
        );
        self.chain = chain;
        let device = self.device_name(config.part);
        let directory = config
            .path
            .rsplit_once('/')
            .map_or("", |(d, _)| d)
            .to_string();
        self.set("config_directory", &format!("({device}){directory}"));
        self.set("config_file", &format!("({device}){}", config.path));
        let (nodes, errors) = script::parse(&text);
        for e in errors {
            self.cx
                .notes
                .add(format!("{}: skipped: {e}", self.cx.describe_file(&config)));
        }
        let outer_menu = std::mem::take(&mut self.menu);
        let result = match self.exec_list(&nodes) {
            Err(e) => Err(e),
            Ok(_) => match self.handover.take() {
                Some(result) => result,
                None => {
                    let menu = std::mem::take(&mut self.menu);
                    self.choose(&menu)
                }
            },
        };
        self.menu = outer_menu;
        self.config = outer_config;
        self.chain = outer_chain;
        result
    }

    fn device_name(&self, part: usize) -> String {
        self.cx
            .files
            .partitions()
            .get(part)
            .map(|p| p.grub_name())
            .unwrap_or_default()
    }

    /// Boots the menu's default entry, or its fallbacks when it cannot be booted.
    fn choose(&mut self, menu: &[Item]) -> Result<Chosen, LoaderError> {
        if menu.is_empty() {
            return Err(self.no_entry("the configuration defines no menu entries"));
        }
        let default = self.get("default");
        let first = self.boot_path(menu, &default, 0);
        let Err(LoaderError::NoEntry { .. }) = &first else {
            return first;
        };
        for fallback in self.get("fallback").split_whitespace() {
            self.cx.notes.add(format!(
                "default entry failed, trying fallback {fallback:?}"
            ));
            let result = self.boot_path(menu, fallback, 0);
            if result.is_ok() || matches!(result, Err(LoaderError::Fatal(_))) {
                return result;
            }
        }
        first
    }

    /// Boots the entry `path` names (`2`, `gnulinux-simple-…`, a title, `1>2`).
    fn boot_path(
        &mut self,
        menu: &[Item],
        path: &str,
        level: usize,
    ) -> Result<Chosen, LoaderError> {
        let (key, rest) = match path.split_once('>') {
            Some((key, rest)) => (key.trim(), Some(rest)),
            None => (path.trim(), None),
        };
        let index = find(menu, key).unwrap_or_else(|| {
            if !key.is_empty() {
                self.cx.notes.add(format!(
                    "default entry {key:?} is not in the menu: booting the first entry"
                ));
            }
            0
        });
        let Some(item) = menu.get(index).cloned() else {
            return Err(self.no_entry("the menu is empty"));
        };
        match item {
            Item::Entry {
                submenu: true,
                body,
                args,
                title,
                ..
            } => {
                if level >= MAX_CHAIN {
                    return Err(self.no_entry("submenus nest too deep"));
                }
                // A submenu's entries exist once it is opened: run its body for them.
                let outer = std::mem::take(&mut self.menu);
                let saved = std::mem::replace(&mut self.positional, args);
                let ran = self.exec_list(&body);
                self.positional = saved;
                let submenu = std::mem::replace(&mut self.menu, outer);
                ran?;
                if submenu.is_empty() {
                    return Err(self.no_entry(format!("submenu {title:?} has no entries")));
                }
                self.boot_path(&submenu, rest.unwrap_or("0"), level + 1)
            }
            item => self.run_entry(&item),
        }
    }

    /// Runs an entry's commands and returns what they loaded.
    fn run_entry(&mut self, item: &Item) -> Result<Chosen, LoaderError> {
        let title = item.title().to_string();
        match item {
            Item::Bls { entry, part, base } => {
                let entry = entry.clone();
                self.boot_bls(&entry, *part, base)
            }
            Item::Entry { body, args, .. } => {
                self.load = Some(Load::default());
                let saved = std::mem::replace(&mut self.positional, args.clone());
                let ran = self.exec_list(body);
                self.positional = saved;
                let load = self.load.take().unwrap_or_default();
                ran?;
                if let Some(result) = self.handover.take() {
                    return result;
                }
                self.finish(title, load)
            }
        }
    }

    fn finish(&mut self, title: String, load: Load) -> Result<Chosen, LoaderError> {
        if let Some(reason) = load.refused {
            return Err(self.no_entry(format!("entry {title:?}: {reason}")));
        }
        let Some((kernel, cmdline)) = load.kernel else {
            return Err(self.no_entry(format!("entry {title:?} loads no Linux kernel")));
        };
        Ok(Chosen {
            loader: Loader::Grub,
            config: self.config.clone(),
            title,
            kernel,
            initrds: load.initrds,
            cmdline,
        })
    }

    fn boot_bls(
        &mut self,
        entry: &super::bls::Entry,
        part: usize,
        base: &str,
    ) -> Result<Chosen, LoaderError> {
        let Some(linux) = &entry.linux else {
            return Err(self.no_entry(format!(
                "BLS entry {:?} has no linux line (an EFI program is not booted)",
                entry.id
            )));
        };
        let kernel = self.bls_file(part, base, linux);
        if !self.cx.is_file(kernel.part, &kernel.path)? {
            return Err(self.no_entry(format!(
                "BLS entry {:?}: kernel {} not found",
                entry.id,
                self.cx.describe_file(&kernel)
            )));
        }
        let mut initrds = Vec::new();
        for line in &entry.initrds {
            for path in self.expand_text(line).split_whitespace() {
                let file = self.bls_file(part, base, path);
                if !self.cx.is_file(file.part, &file.path)? {
                    return Err(self.no_entry(format!(
                        "BLS entry {:?}: initrd {} not found",
                        entry.id,
                        self.cx.describe_file(&file)
                    )));
                }
                initrds.push(file);
            }
        }
        let options: Vec<String> = entry.options.iter().map(|o| self.expand_text(o)).collect();
        let device = self.device_name(kernel.part);
        let mut args = vec![format!("({device}){linux}")];
        args.extend(options.join(" ").split_whitespace().map(str::to_string));
        Ok(Chosen {
            loader: Loader::GrubBls,
            config: FileRef {
                part,
                path: format!("{}/{}.conf", entry.dir, entry.id),
            },
            title: entry.title.clone(),
            kernel,
            initrds,
            cmdline: linux_cmdline(&args),
        })
    }

    /// A BLS path: relative to the partition the entries are on, or to `/boot` on it when
    /// they were under `/boot/loader/entries` and the path is not found at the root.
    fn bls_file(&self, part: usize, base: &str, path: &str) -> FileRef {
        let at_root = FileRef {
            part,
            path: path.to_string(),
        };
        if base.is_empty() || self.cx.is_file(part, path).unwrap_or(false) {
            return at_root;
        }
        FileRef {
            part,
            path: format!("{base}/{}", path.trim_start_matches('/')),
        }
    }

    /// `$name` and `${name}` in a BLS line (GRUB's blscfg expands them: `$kernelopts`).
    fn expand_text(&self, text: &str) -> String {
        let (nodes, _) = script::parse(&format!("x {text}"));
        let mut out = Vec::new();
        if let Some(Node::Simple { words, .. }) = nodes.first() {
            for word in words.iter().skip(1) {
                out.extend(self.expand_word(word));
            }
        }
        out.join(" ")
    }

    fn step(&mut self) -> Run<()> {
        self.steps += 1;
        if self.steps > MAX_STEPS {
            return Err(self.no_entry(format!(
                "the configuration ran more than {MAX_STEPS} statements"
            )));
        }
        Ok(())
    }

    fn exec_list(&mut self, nodes: &[Node]) -> Run<Flow> {
        for node in nodes {
            match self.exec(node)? {
                Flow::Normal => {}
                other => return Ok(other),
            }
        }
        Ok(Flow::Normal)
    }

    fn exec(&mut self, node: &Node) -> Run<Flow> {
        self.step()?;
        match node {
            Node::Simple {
                words,
                negate,
                line,
            } => {
                let flow = self.command(words, *line)?;
                if *negate {
                    self.status = i32::from(self.status == 0);
                }
                Ok(flow)
            }
            Node::If { arms, otherwise } => {
                for (condition, body) in arms {
                    if let flow @ (Flow::Return | Flow::Stop) = self.exec_list(condition)? {
                        return Ok(flow);
                    }
                    if self.status == 0 {
                        return self.exec_list(body);
                    }
                }
                match otherwise {
                    Some(body) => self.exec_list(body),
                    None => {
                        self.status = 0;
                        Ok(Flow::Normal)
                    }
                }
            }
            Node::Loop {
                until,
                condition,
                body,
            } => loop {
                self.step()?;
                if let flow @ (Flow::Return | Flow::Stop) = self.exec_list(condition)? {
                    return Ok(flow);
                }
                if (self.status == 0) == *until {
                    return Ok(Flow::Normal);
                }
                if let flow @ (Flow::Return | Flow::Stop) = self.exec_list(body)? {
                    return Ok(flow);
                }
            },
            Node::For { var, items, body } => {
                let values: Vec<String> = items.iter().flat_map(|w| self.expand_word(w)).collect();
                for value in values {
                    self.set(var, &value);
                    if let flow @ (Flow::Return | Flow::Stop) = self.exec_list(body)? {
                        return Ok(flow);
                    }
                }
                Ok(Flow::Normal)
            }
            Node::Function { name, body } => {
                self.functions.insert(name.clone(), body.clone());
                Ok(Flow::Normal)
            }
            Node::Menu {
                submenu,
                args,
                body,
                line,
            } => {
                let args: Vec<String> = args.iter().flat_map(|w| self.expand_word(w)).collect();
                self.add_menu_item(*submenu, &args, body.clone(), *line);
                Ok(Flow::Normal)
            }
        }
    }

    fn add_menu_item(&mut self, submenu: bool, args: &[String], body: Rc<Vec<Node>>, line: usize) {
        if self.menu.len() >= MAX_MENU {
            self.cx.notes.add(format!(
                "more than {MAX_MENU} menu entries: the rest are ignored"
            ));
            return;
        }
        let mut title = None;
        let mut id = None;
        let mut rest = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            match arg.as_str() {
                "--class" | "--users" | "--hotkey" | "--source" => i += 1,
                "--id" => {
                    id = args.get(i + 1).cloned();
                    i += 1;
                }
                "--unrestricted" => {}
                a if a.starts_with("--id=") => id = Some(a["--id=".len()..].to_string()),
                a if a.starts_with("--") && a.contains('=') => {}
                _ if title.is_none() => title = Some(arg.clone()),
                _ => rest.push(arg.clone()),
            }
            i += 1;
        }
        let title = title.unwrap_or_else(|| format!("(untitled entry, line {line})"));
        self.menu.push(Item::Entry {
            title,
            id,
            body,
            args: rest,
            submenu,
        });
    }

    /// Expands a word into fields: quoted parts stay whole, unquoted variables split at
    /// blanks, and an unquoted empty variable alone makes no field (as in GRUB and sh).
    fn expand_word(&self, word: &Word) -> Vec<String> {
        let mut fields = Vec::new();
        let mut current: Option<String> = None;
        for part in &word.0 {
            match part {
                Part::Text { text, .. } => current.get_or_insert_with(String::new).push_str(text),
                Part::Var { name, quoted: true } => current
                    .get_or_insert_with(String::new)
                    .push_str(&self.get(name)),
                Part::Var {
                    name,
                    quoted: false,
                } => {
                    let value = self.get(name);
                    if value.is_empty() {
                        continue;
                    }
                    if value.starts_with(char::is_whitespace)
                        && let Some(field) = current.take()
                    {
                        fields.push(field);
                    }
                    let mut pieces = value.split_whitespace().peekable();
                    while let Some(piece) = pieces.next() {
                        current.get_or_insert_with(String::new).push_str(piece);
                        if pieces.peek().is_some()
                            && let Some(field) = current.take()
                        {
                            fields.push(field);
                        }
                    }
                    if value.ends_with(char::is_whitespace)
                        && let Some(field) = current.take()
                    {
                        fields.push(field);
                    }
                }
            }
        }
        fields.extend(current);
        fields
    }

    /// A `name=value` assignment word, if the word is one.
    fn assignment(&self, word: &Word) -> Option<(String, String)> {
        let Some(Part::Text {
            text,
            quoted: false,
        }) = word.0.first()
        else {
            return None;
        };
        let (name, first) = text.split_once('=')?;
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return None;
        }
        let mut value = first.to_string();
        for part in &word.0[1..] {
            match part {
                Part::Text { text, .. } => value.push_str(text),
                Part::Var { name, .. } => value.push_str(&self.get(name)),
            }
        }
        Some((name.to_string(), value))
    }

    fn command(&mut self, words: &[Word], line: usize) -> Run<Flow> {
        if words.len() == 1
            && let Some((name, value)) = self.assignment(&words[0])
        {
            self.set(&name, &value);
            self.status = 0;
            return Ok(Flow::Normal);
        }
        let args: Vec<String> = words.iter().flat_map(|w| self.expand_word(w)).collect();
        let Some((name, args)) = args.split_first() else {
            return Ok(Flow::Normal);
        };
        let (status, flow) = self.builtin(name, args, line)?;
        self.status = status;
        Ok(flow)
    }

    fn builtin(&mut self, name: &str, args: &[String], line: usize) -> Run<(i32, Flow)> {
        let done = |status: i32| Ok((status, Flow::Normal));
        if let Some(body) = self.functions.get(name).cloned() {
            return self.call(&body, args);
        }
        match name {
            "set" => {
                for arg in args {
                    if let Some((n, v)) = arg.split_once('=') {
                        self.set(n, v);
                    }
                }
                done(0)
            }
            "unset" => {
                for arg in args {
                    self.env.remove(arg);
                }
                done(0)
            }
            "export"
            | "insmod"
            | "rmmod"
            | "echo"
            | "terminal_input"
            | "terminal_output"
            | "terminal"
            | "serial"
            | "font"
            | "play"
            | "sleep"
            | "clear"
            | "save_env"
            | "gettext"
            | "set_locale"
            | "cutmem"
            | "badram"
            | "videoinfo"
            | "background_color"
            | "menuentry_id_option"
            | "load_video"
            | "gfxmode"
            | "savedefault"
            | "recordfail"
            | "timeout"
            | "true"
            | "list_env"
            | "nativedisk"
            | "cryptomount" => done(0),
            "false" | "loadfont" | "background_image" | "hwmatch" | "keystatus" | "fwsetup"
            | "smbios" | "regexp" | "password_pbkdf2" | "password" => done(1),
            "cpuid" => done(0), // a 64-bit CPU (cpuid -l)
            "[" => {
                let args = match args.split_last() {
                    Some((last, rest)) if last == "]" => rest,
                    _ => {
                        self.cx.notes.add(format!(
                            "{}: line {line}: [ without ]",
                            self.cx.describe_file(&self.config)
                        ));
                        return done(1);
                    }
                };
                done(i32::from(!self.test(args)))
            }
            "test" => done(i32::from(!self.test(args))),
            "load_env" => {
                let status = self.load_env(args)?;
                done(status)
            }
            "search" | "search.fs_uuid" | "search.fs_label" | "search.file" => {
                let status = self.search(name, args)?;
                done(status)
            }
            "probe" => done(self.probe(args)?),
            "configfile" | "normal" | "source" | "." => {
                let Some(path) = args.first() else {
                    return done(if name == "normal" { 0 } else { 1 });
                };
                let Some(file) = self.resolve(path) else {
                    return done(1);
                };
                if !self.cx.is_file(file.part, &file.path)? {
                    self.cx.notes.add(format!("{name} {path}: not found"));
                    return done(1);
                }
                if name == "source" || name == "." {
                    return self.source(file);
                }
                match self.run_config(file, self.chain + 1) {
                    Err(LoaderError::Fatal(e)) => Err(LoaderError::Fatal(e)),
                    result => {
                        self.handover = Some(result);
                        Ok((0, Flow::Stop))
                    }
                }
            }
            "blscfg" => {
                self.blscfg()?;
                done(0)
            }
            "linux" | "linuxefi" | "linux16" => done(self.linux(args)?),
            "initrd" | "initrdefi" | "initrd16" => done(self.initrd(args)?),
            "chainloader" | "multiboot" | "multiboot2" | "ntldr" | "kfreebsd" | "knetbsd"
            | "kopenbsd" | "appleloader" | "xnu_kernel" | "xnu_kernel64" | "legacy_kernel" => {
                if let Some(load) = self.load.as_mut() {
                    load.refused = Some(format!(
                        "{name} boots something other than a Linux kernel, which is not supported"
                    ));
                }
                done(1)
            }
            "boot" => Ok((0, Flow::Stop)),
            "return" => Ok((
                args.first().and_then(|s| s.parse().ok()).unwrap_or(0),
                Flow::Return,
            )),
            "exit" | "halt" | "reboot" | "poweroff" => {
                if let Some(load) = self.load.as_mut() {
                    load.refused = Some(format!("the entry runs {name}"));
                }
                Ok((1, Flow::Stop))
            }
            "shift" => {
                if !self.positional.is_empty() {
                    self.positional.remove(0);
                }
                done(0)
            }
            other => {
                self.cx.notes.add(format!(
                    "{}: line {line}: command {other:?} is not understood (skipped)",
                    self.cx.describe_file(&self.config)
                ));
                done(1)
            }
        }
    }

    fn call(&mut self, body: &Rc<Vec<Node>>, args: &[String]) -> Run<(i32, Flow)> {
        if self.depth >= MAX_CALL_DEPTH {
            return Err(self.no_entry(format!("functions nest more than {MAX_CALL_DEPTH} deep")));
        }
        self.depth += 1;
        let saved = std::mem::replace(&mut self.positional, args.to_vec());
        let flow = self.exec_list(body);
        self.positional = saved;
        self.depth -= 1;
        match flow? {
            Flow::Stop => Ok((self.status, Flow::Stop)),
            Flow::Normal | Flow::Return => Ok((self.status, Flow::Normal)),
        }
    }

    fn source(&mut self, file: FileRef) -> Run<(i32, Flow)> {
        if self.depth >= MAX_CALL_DEPTH {
            return Err(self.no_entry("source nests too deep"));
        }
        let text = self.cx.read_config(&file)?;
        let (nodes, errors) = script::parse(&text);
        for e in errors {
            self.cx
                .notes
                .add(format!("{}: skipped: {e}", self.cx.describe_file(&file)));
        }
        self.depth += 1;
        let flow = self.exec_list(&nodes);
        self.depth -= 1;
        Ok((self.status, flow?))
    }

    /// A GRUB path (`(hd0,gpt2)/boot/x`, `/boot/x` on `$root`) on the boot disk; why not,
    /// noted, otherwise.
    fn resolve(&mut self, path: &str) -> Option<FileRef> {
        match self.locate(path) {
            Ok(file) => Some(file),
            Err(why) => {
                self.cx.notes.add(why);
                None
            }
        }
    }

    /// What [`Self::resolve`] finds, or why there is nothing.
    fn locate(&self, path: &str) -> Result<FileRef, String> {
        let (device, file) = match path.strip_prefix('(') {
            Some(rest) => match rest.split_once(')') {
                Some((device, file)) => (device.to_string(), file.to_string()),
                None => return Err(format!("malformed GRUB path {path:?}")),
            },
            None => (self.get("root"), path.to_string()),
        };
        if file.contains('+') && !file.starts_with('/') {
            return Err(format!("{path:?}: block lists are not supported"));
        }
        let part = partition_by_grub_name(self.cx.files.partitions(), &device)
            .map_err(|e| format!("{path:?}: {e}"))?;
        Ok(FileRef {
            part,
            path: if file.is_empty() { "/".into() } else { file },
        })
    }

    /// A file a loading command (`linux`, `initrd`) names: what cannot be resolved makes
    /// the entry unbootable, with the reason.
    fn resolve_for_load(&mut self, path: &str) -> Option<FileRef> {
        match self.locate(path) {
            Ok(file) => Some(file),
            Err(why) => {
                self.cx.notes.add(why.clone());
                if let Some(load) = self.load.as_mut()
                    && load.refused.is_none()
                {
                    load.refused = Some(why);
                }
                None
            }
        }
    }

    /// `[`/`test`. A read that spends the budget answers false here; the disk remembers
    /// it and the search ends with that error (`crate::load`).
    fn test(&mut self, args: &[String]) -> bool {
        let mut check = |kind: FileTest, path: &str| -> bool {
            let Some(file) = self.resolve(path) else {
                return false;
            };
            let files = self.cx.files;
            let answer = match kind {
                FileTest::File => files.is_file(file.part, &file.path),
                FileTest::Dir => files.is_dir(file.part, &file.path),
                FileTest::Exists => files
                    .is_file(file.part, &file.path)
                    .and_then(|f| Ok(f || files.is_dir(file.part, &file.path)?)),
                FileTest::NonEmpty => files
                    .read(file.part, &file.path, self.cx.limits.config)
                    .map(|d| !d.is_empty()),
            };
            answer.unwrap_or(false)
        };
        test_expr::eval(args, &mut check)
    }

    fn load_env(&mut self, args: &[String]) -> Run<i32> {
        let mut file = None;
        let mut names = Vec::new();
        let mut i = 0;
        while i < args.len() {
            match args[i].as_str() {
                "-f" | "--file" => {
                    file = args.get(i + 1).cloned();
                    i += 1;
                }
                a if a.starts_with("--file=") => file = Some(a["--file=".len()..].to_string()),
                "-s" | "--skip-sig" => {}
                other => names.push(other.to_string()),
            }
            i += 1;
        }
        let path = file.unwrap_or_else(|| format!("{}/grubenv", self.get("prefix")));
        let Some(file) = self.resolve(&path) else {
            return Ok(1);
        };
        let text = match self
            .cx
            .files
            .read(file.part, &file.path, self.cx.limits.config)
        {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(crate::fs::FsError::Budget) => {
                return Err(LoaderError::Fatal(crate::Error::ReadBudget));
            }
            Err(_) => return Ok(1),
        };
        for (name, value) in env_block::parse(&text) {
            if names.is_empty() || names.contains(&name) {
                self.set(&name, &value);
            }
        }
        Ok(0)
    }

    /// `search`: the first partition of the boot disk (hints first) whose filesystem has
    /// the UUID or label, or holds the file; its name goes into the variable.
    fn search(&mut self, command: &str, args: &[String]) -> Run<i32> {
        #[derive(PartialEq)]
        enum By {
            Uuid,
            Label,
            File,
        }
        let mut by = match command {
            "search.fs_uuid" => By::Uuid,
            "search.fs_label" => By::Label,
            _ => By::File,
        };
        let mut var = None;
        let mut hints = Vec::new();
        let mut positional = Vec::new();
        let mut i = 0;
        while i < args.len() {
            let arg = args[i].as_str();
            match arg {
                "-u" | "--fs-uuid" => by = By::Uuid,
                "-l" | "--label" => by = By::Label,
                "-f" | "--file" => by = By::File,
                "-s" | "--set" => var = Some("root".to_string()),
                "-n" | "--no-floppy" | "--efidisk-only" | "--root-dev-only" | "-r" => {}
                "-h" | "--hint" | "--hint-bios" | "--hint-efi" | "--hint-baremetal"
                | "--hint-ieee1275" | "--hint-arc" | "--hint-uboot" => {
                    if let Some(h) = args.get(i + 1) {
                        hints.push(h.clone());
                    }
                    i += 1;
                }
                a if a.starts_with("--set=") => var = Some(a["--set=".len()..].to_string()),
                a if a.starts_with("--hint") && a.contains('=') => {
                    hints.push(a.split_once('=').map_or("", |(_, h)| h).to_string());
                }
                a if a.starts_with('-') && a.len() > 1 => {}
                _ => positional.push(arg.to_string()),
            }
            i += 1;
        }
        let Some(wanted) = positional.first().cloned() else {
            return Ok(1);
        };
        if command != "search" {
            // search.fs_uuid UUID [VAR] [HINT...]
            var = Some(positional.get(1).cloned().unwrap_or_else(|| "root".into()));
            hints.extend(positional.iter().skip(2).cloned());
        }
        let partitions = self.cx.files.partitions().len();
        let mut order: Vec<usize> = hints
            .iter()
            .filter_map(|h| partition_by_grub_name(self.cx.files.partitions(), h).ok())
            .collect();
        order.extend(0..partitions);
        for part in order {
            let found = match by {
                By::File => {
                    let path = if wanted.starts_with('/') {
                        wanted.clone()
                    } else {
                        format!("/{wanted}")
                    };
                    self.cx.is_file(part, &path)?
                }
                By::Uuid | By::Label => match self.cx.files.fs_info(part)? {
                    Some(info) if by == By::Uuid => info.uuid.eq_ignore_ascii_case(&wanted),
                    Some(info) => info.label == wanted,
                    None => false,
                },
            };
            if found {
                if let Some(var) = &var {
                    let name = self.device_name(part);
                    self.set(var, &name);
                }
                return Ok(0);
            }
        }
        self.cx.notes.add(format!(
            "{command} found no filesystem for {wanted:?} on the boot disk"
        ));
        Ok(1)
    }

    /// `probe --set VAR --fs-uuid|--label|--fs DEVICE`.
    fn probe(&mut self, args: &[String]) -> Run<i32> {
        let mut var = None;
        let mut what = None;
        let mut device = None;
        let mut i = 0;
        while i < args.len() {
            match args[i].as_str() {
                "-s" | "--set" => {
                    var = args.get(i + 1).cloned();
                    i += 1;
                }
                a if a.starts_with("--set=") => var = Some(a["--set=".len()..].to_string()),
                a @ ("-u" | "--fs-uuid" | "-l" | "--label" | "-f" | "--fs") => {
                    what = Some(a.to_string());
                }
                other => device = Some(other.to_string()),
            }
            i += 1;
        }
        let (Some(what), Some(device)) = (what, device) else {
            return Ok(1);
        };
        let Ok(part) = partition_by_grub_name(self.cx.files.partitions(), &device) else {
            return Ok(1);
        };
        let Some(info) = self.cx.files.fs_info(part)? else {
            return Ok(1);
        };
        let value = match what.as_str() {
            "-u" | "--fs-uuid" => info.uuid,
            "-l" | "--label" => info.label,
            _ => if info.kind == "fat" { "fat" } else { "ext2" }.to_string(),
        };
        if let Some(var) = var {
            self.set(&var, &value);
        }
        Ok(0)
    }

    /// `linux PATH ARGS...`: checks the kernel is there and records it with GRUB's
    /// command line.
    fn linux(&mut self, args: &[String]) -> Run<i32> {
        let Some(path) = args.first() else {
            return Ok(1);
        };
        let Some(file) = self.resolve_for_load(path) else {
            return Ok(1);
        };
        if !self.cx.is_file(file.part, &file.path)? {
            let reason = format!("kernel {} not found", self.cx.describe_file(&file));
            if let Some(load) = self.load.as_mut()
                && load.refused.is_none()
            {
                load.refused = Some(reason);
            }
            return Ok(1);
        }
        if let Some(load) = self.load.as_mut() {
            load.kernel = Some((file, linux_cmdline(args)));
            load.initrds.clear();
        }
        Ok(0)
    }

    /// `initrd PATH...`.
    fn initrd(&mut self, args: &[String]) -> Run<i32> {
        let mut files = Vec::new();
        for path in args.iter().filter(|a| !a.starts_with("--")) {
            let Some(file) = self.resolve_for_load(path) else {
                return Ok(1);
            };
            if !self.cx.is_file(file.part, &file.path)? {
                let reason = format!("initrd {} not found", self.cx.describe_file(&file));
                if let Some(load) = self.load.as_mut()
                    && load.refused.is_none()
                {
                    load.refused = Some(reason);
                }
                return Ok(1);
            }
            files.push(file);
        }
        if let Some(load) = self.load.as_mut() {
            if load.kernel.is_none() && load.refused.is_none() {
                load.refused = Some("initrd before linux (GRUB needs the kernel first)".into());
            }
            load.initrds = files;
        }
        Ok(0)
    }

    /// `blscfg`: the BLS entries on `$root` (in `$blsdir`, `/loader/entries` or
    /// `/boot/loader/entries`), newest version first, as menu entries.
    fn blscfg(&mut self) -> Run<()> {
        let root = self.get("root");
        let Ok(part) = partition_by_grub_name(self.cx.files.partitions(), &root) else {
            self.cx
                .notes
                .add(format!("blscfg: $root {root:?} names no partition"));
            return Ok(());
        };
        let custom = self.get("blsdir");
        let mut dirs: Vec<String> = Vec::new();
        if !custom.is_empty() {
            dirs.push(custom);
        }
        dirs.extend([
            "/loader/entries".to_string(),
            "/boot/loader/entries".to_string(),
        ]);
        for dir in dirs {
            if !self.cx.is_dir(part, &dir)? {
                continue;
            }
            let mut entries = super::bls::read_dir(self.cx, part, &dir)?;
            super::bls::sort_newest_first(&mut entries);
            let base = if dir.starts_with("/boot/") {
                "/boot"
            } else {
                ""
            };
            for entry in entries {
                if self.menu.len() >= MAX_MENU {
                    break;
                }
                self.menu.push(Item::Bls {
                    entry: Rc::new(entry),
                    part,
                    base: base.to_string(),
                });
            }
            return Ok(());
        }
        self.cx.notes.add(format!(
            "blscfg: no BLS entries on {}",
            self.cx.describe(part)
        ));
        Ok(())
    }
}

/// The menu item `key` names: an index, else an id, else a title (GRUB's
/// `get_entry_index_by_name` order).
fn find(menu: &[Item], key: &str) -> Option<usize> {
    if key.is_empty() {
        return None;
    }
    if let Ok(index) = key.parse::<usize>() {
        return (index < menu.len()).then_some(index);
    }
    menu.iter()
        .position(|i| i.id() == Some(key))
        .or_else(|| menu.iter().position(|i| i.title() == key))
}

/// GRUB's kernel command line: `BOOT_IMAGE=<path>` then the arguments, each with `\`,
/// `'` and `"` escaped and quoted if it holds a blank (`grub_create_loader_cmdline`).
fn linux_cmdline(args: &[String]) -> String {
    let mut out = String::from("BOOT_IMAGE=");
    for (i, arg) in args.iter().enumerate() {
        if i > 0 {
            out.push(' ');
        }
        let blank = arg.contains([' ', '\t']);
        if blank {
            out.push('"');
        }
        for c in arg.chars() {
            if matches!(c, '\\' | '\'' | '"') {
                out.push('\\');
            }
            out.push(c);
        }
        if blank {
            out.push('"');
        }
    }
    out
}

#[cfg(test)]
mod tests;
