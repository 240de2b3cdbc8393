//! Where a disk's boot loader keeps its configuration, and which entry it would boot.
//!
//! The search follows what firmware and the boot loader do, without running either:
//!
//! - **EFI**: each EFI system partition, in table order: systemd-boot's
//!   `/loader/loader.conf` and `/loader/entries/` (with an `XBOOTLDR` partition), then
//!   GRUB's configuration beside its EFI binary, `/EFI/BOOT/grub.cfg` and `/EFI/<vendor>/
//!   grub.cfg` (usually a stub that finds the root filesystem by UUID and chains to its
//!   `/boot/grub/grub.cfg`). Then as for BIOS.
//! - **BIOS**: the partitions marked bootable first (MBR active flag, GPT legacy-bootable
//!   attribute), then the others in table order; on each, GRUB 2 (`/boot/grub/grub.cfg`,
//!   `/grub/grub.cfg`, `/boot/grub2/`, `/grub2/`: where `grub-install` puts its prefix),
//!   `extlinux.conf`/`syslinux.cfg`, GRUB legacy's `menu.lst`, and Boot Loader
//!   Specification entries on their own.
//!
//! The first configuration found decides, as the one boot loader a disk boots would: if its
//! default entry cannot be booted, the disk cannot (the error says why), rather than some
//! other configuration being tried.

pub(crate) mod bls;
pub(crate) mod extlinux;
pub(crate) mod grub;
pub(crate) mod menu_lst;

use crate::volumes::Files;
use crate::{Error, Firmware, Limits};

/// A file on the boot disk: a partition (an index into [`Files::partitions`]) and a path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileRef {
    pub(crate) part: usize,
    pub(crate) path: String,
}

/// Which boot loader's configuration chose the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loader {
    /// GRUB 2's `grub.cfg`.
    Grub,
    /// Boot Loader Specification entries through GRUB's `blscfg` (Fedora, RHEL).
    GrubBls,
    /// systemd-boot's `loader.conf` and entries on the EFI system partition.
    SystemdBoot,
    /// Boot Loader Specification entries without a boot loader configuration.
    Bls,
    /// `extlinux.conf` / `syslinux.cfg`.
    Extlinux,
    /// GRUB legacy's `menu.lst`.
    GrubLegacy,
}

impl Loader {
    pub fn name(self) -> &'static str {
        match self {
            Loader::Grub => "GRUB",
            Loader::GrubBls => "GRUB (BLS entries)",
            Loader::SystemdBoot => "systemd-boot",
            Loader::Bls => "BLS entries",
            Loader::Extlinux => "extlinux",
            Loader::GrubLegacy => "GRUB legacy",
        }
    }
}

/// What a boot loader's configuration chose.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chosen {
    pub(crate) loader: Loader,
    /// The configuration file that defined the entry.
    pub(crate) config: FileRef,
    pub(crate) title: String,
    pub(crate) kernel: FileRef,
    pub(crate) initrds: Vec<FileRef>,
    pub(crate) cmdline: String,
}

/// Why a configuration gave no entry to boot.
#[derive(Debug)]
pub(crate) enum LoaderError {
    /// The disk cannot be read further (read budget, I/O): the search ends.
    Fatal(Error),
    /// This configuration has no entry that can be booted, and why.
    NoEntry { config: FileRef, reason: String },
}

impl From<Error> for LoaderError {
    fn from(e: Error) -> Self {
        LoaderError::Fatal(e)
    }
}

/// Messages about what was skipped, kept for the report (bounded, without repeats).
#[derive(Debug, Default)]
pub(crate) struct Notes(pub(crate) Vec<String>);

const MAX_NOTES: usize = 64;

impl Notes {
    pub(crate) fn add(&mut self, note: impl Into<String>) {
        let note = note.into();
        if self.0.len() < MAX_NOTES && !self.0.contains(&note) {
            tracing::info!("boot disk: {note}");
            self.0.push(note);
        }
    }
}

/// What every loader gets.
pub(crate) struct Context<'a> {
    pub(crate) files: &'a dyn Files,
    pub(crate) limits: &'a Limits,
    pub(crate) firmware: Firmware,
    pub(crate) notes: Notes,
}

impl Context<'_> {
    /// A partition's name for messages: `partition 2 (hd0,gpt2)`.
    pub(crate) fn describe(&self, part: usize) -> String {
        match self.files.partitions().get(part) {
            Some(p) if p.number == 0 => "the whole disk".to_string(),
            Some(p) => format!("partition {} ({})", p.number, p.grub_name()),
            None => format!("partition #{part}"),
        }
    }

    pub(crate) fn describe_file(&self, file: &FileRef) -> String {
        format!("{} on {}", file.path, self.describe(file.part))
    }

    /// Whether `path` is a file on `part`; a read that ends the search is an error.
    pub(crate) fn is_file(&self, part: usize, path: &str) -> Result<bool, Error> {
        match self.files.is_file(part, path) {
            Ok(found) => Ok(found),
            Err(crate::fs::FsError::Budget) => Err(Error::ReadBudget),
            Err(_) => Ok(false),
        }
    }

    pub(crate) fn is_dir(&self, part: usize, path: &str) -> Result<bool, Error> {
        match self.files.is_dir(part, path) {
            Ok(found) => Ok(found),
            Err(crate::fs::FsError::Budget) => Err(Error::ReadBudget),
            Err(_) => Ok(false),
        }
    }

    /// A configuration file, at most [`Limits::config`] bytes, as text.
    pub(crate) fn read_config(&self, file: &FileRef) -> Result<String, LoaderError> {
        match self.files.read(file.part, &file.path, self.limits.config) {
            Ok(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Err(crate::fs::FsError::Budget) => Err(LoaderError::Fatal(Error::ReadBudget)),
            Err(e) => Err(LoaderError::NoEntry {
                config: file.clone(),
                reason: format!("cannot read {}: {e}", self.describe_file(file)),
            }),
        }
    }
}

/// GRUB 2's configuration, where `grub-install` puts it.
const GRUB_CONFIGS: &[&str] = &[
    "/boot/grub/grub.cfg",
    "/grub/grub.cfg",
    "/boot/grub2/grub.cfg",
    "/grub2/grub.cfg",
];
const EXTLINUX_CONFIGS: &[&str] = &[
    "/boot/extlinux/extlinux.conf",
    "/extlinux/extlinux.conf",
    "/boot/extlinux.conf",
    "/extlinux.conf",
    "/boot/syslinux/syslinux.cfg",
    "/syslinux/syslinux.cfg",
    "/boot/syslinux.cfg",
    "/syslinux.cfg",
];
const MENU_LST_CONFIGS: &[&str] = &["/boot/grub/menu.lst", "/grub/menu.lst"];
const BLS_DIRS: &[&str] = &["/loader/entries", "/boot/loader/entries"];

/// Finds the configuration the disk boots with and the entry it chooses.
pub(crate) fn find(cx: &mut Context<'_>) -> Result<Chosen, Error> {
    let count = cx.files.partitions().len();
    if cx.firmware == Firmware::Efi {
        for esp in (0..count).filter(|&p| cx.files.partitions()[p].is_esp()) {
            if let Some(found) = efi_system_partition(cx, esp)? {
                return found;
            }
        }
    }
    let mut order: Vec<usize> = (0..count)
        .filter(|&p| cx.files.partitions()[p].is_marked_bootable())
        .collect();
    order.extend((0..count).filter(|&p| !cx.files.partitions()[p].is_marked_bootable()));
    let mut unreadable = Vec::new();
    for part in order {
        if cx.files.partitions()[part].holds_no_filesystem() {
            continue;
        }
        if cx.files.fs_info(part)?.is_none() {
            if let Some(kind) = cx.files.unsupported(part) {
                unreadable.push(format!(
                    "{} holds {kind}, which is not read",
                    cx.describe(part)
                ));
            }
            continue;
        }
        if let Some(found) = partition(cx, part)? {
            return found;
        }
    }
    Err(Error::NoBootableEntry {
        firmware: cx.firmware,
        unreadable,
    })
}

/// The outcome of the first configuration found: `None` if there is none here.
type Found = Option<Result<Chosen, Error>>;

fn settle(cx: &Context<'_>, result: Result<Chosen, LoaderError>) -> Result<Found, Error> {
    match result {
        Ok(chosen) => Ok(Some(Ok(chosen))),
        Err(LoaderError::Fatal(e)) => Err(e),
        Err(LoaderError::NoEntry { config, reason }) => Ok(Some(Err(Error::NoUsableEntry {
            config: cx.describe_file(&config),
            reason,
        }))),
    }
}

fn efi_system_partition(cx: &mut Context<'_>, esp: usize) -> Result<Found, Error> {
    if cx.files.fs_info(esp)?.is_none() {
        return Ok(None);
    }
    if cx.is_file(esp, "/loader/loader.conf")? || cx.is_dir(esp, "/loader/entries")? {
        let result = bls::systemd_boot(cx, esp);
        return settle(cx, result);
    }
    let mut dirs = vec!["BOOT".to_string()];
    if let Ok(mut vendors) = cx.files.list(esp, "/EFI", 64) {
        vendors.sort();
        dirs.extend(
            vendors
                .into_iter()
                .filter(|d| !d.eq_ignore_ascii_case("BOOT")),
        );
    }
    for dir in dirs {
        let path = format!("/EFI/{dir}/grub.cfg");
        if cx.is_file(esp, &path)? {
            let config = FileRef { part: esp, path };
            let result = grub::boot(cx, config, &format!("/EFI/{dir}"));
            return settle(cx, result);
        }
    }
    if cx.is_dir(esp, "/EFI/Linux")? {
        cx.notes.add(format!(
            "{}: unified kernel images in /EFI/Linux are not booted",
            cx.describe(esp)
        ));
    }
    Ok(None)
}

fn partition(cx: &mut Context<'_>, part: usize) -> Result<Found, Error> {
    for path in GRUB_CONFIGS {
        if cx.is_file(part, path)? {
            let prefix = path.trim_end_matches("/grub.cfg").to_string();
            let config = FileRef {
                part,
                path: (*path).to_string(),
            };
            let result = grub::boot(cx, config, &prefix);
            return settle(cx, result);
        }
    }
    for path in EXTLINUX_CONFIGS {
        if cx.is_file(part, path)? {
            let config = FileRef {
                part,
                path: (*path).to_string(),
            };
            let result = extlinux::boot(cx, config);
            return settle(cx, result);
        }
    }
    for path in MENU_LST_CONFIGS {
        if cx.is_file(part, path)? {
            let config = FileRef {
                part,
                path: (*path).to_string(),
            };
            let result = menu_lst::boot(cx, config);
            return settle(cx, result);
        }
    }
    // Entries on an EFI system partition are systemd-boot's, which only EFI firmware runs.
    let esp = cx.files.partitions()[part].is_esp();
    for dir in BLS_DIRS.iter().filter(|_| !esp) {
        if cx.is_dir(part, dir)? {
            let result = bls::standalone(cx, part, dir);
            return settle(cx, result);
        }
    }
    Ok(None)
}
