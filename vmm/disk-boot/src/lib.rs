//! Boots a disk the way its own boot loader would, without running it.
//!
//! Given a VM's boot disk, read-only, [`load`] finds the partition table (GPT or MBR),
//! reads the filesystems a boot loader reads (ext2/3/4, FAT), finds the boot loader's
//! configuration (GRUB 2, Boot Loader Specification entries through GRUB or systemd-boot,
//! extlinux/syslinux, GRUB legacy), chooses the entry that loader would boot by default,
//! and returns its kernel, initrd and command line. The VMM then boots them exactly as a
//! direct kernel boot. No firmware, boot loader or other code from the disk runs; every
//! configuration is read as data, and what is not understood is skipped and noted.
//!
//! The disk is untrusted (a guest writes its own `/boot`): every size, count, depth and
//! loop is bounded ([`Limits`], the read budget in `disk`), reads never leave their
//! partition, and a panic in a parser is caught and reported as an error. The VMM runs
//! this on a sandboxed thread of its own.
//!
//! See `docs/design.md` for what is covered and what is not.

mod disk;
mod fs;
mod loaders;
mod partitions;
mod volumes;

pub use disk::DiskRead;
pub use loaders::Loader;
pub use partitions::{Partition, PartitionType, Scheme};

use int_cast::usize_to_u64;

use loaders::{Chosen, Context, FileRef, Notes};
use volumes::DiskFiles;

/// Which firmware the VM's definition asks for: where the boot loader is looked for first.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Firmware {
    /// BIOS: the boot loader of the bootable partition (GRUB's `/boot/grub/grub.cfg`,
    /// extlinux).
    #[default]
    Bios,
    /// EFI: the EFI system partition first (systemd-boot, GRUB's ESP configuration).
    Efi,
}

impl Firmware {
    pub fn name(self) -> &'static str {
        match self {
            Firmware::Bios => "BIOS",
            Firmware::Efi => "EFI",
        }
    }
}

/// How much the loader may read.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The kernel file.
    pub kernel: u64,
    /// All initrd files together.
    pub initrd: u64,
    /// One configuration file.
    pub config: u64,
    /// Bytes of the disk read while the entry is searched for (partition tables,
    /// filesystem metadata, configurations, directory walks; a read costs at least a
    /// sector): what ends a walk that loops.
    pub metadata: u64,
}

/// The largest kernel file read: stock bzImages are about 10 MiB, uncompressed ELF kernels
/// well under 100 MiB.
pub const MAX_KERNEL_FILE: u64 = 256 << 20;
/// The largest configuration file read (generated `grub.cfg` files are a few KiB).
pub const MAX_CONFIG_FILE: u64 = 1 << 20;
/// Metadata reads allowed besides the kernel and initrd.
pub const METADATA_BUDGET: u64 = 64 << 20;

impl Limits {
    /// Limits for a guest of `memory` bytes: kernel and initrd must fit in its RAM.
    pub fn for_guest_memory(memory: u64) -> Limits {
        Limits {
            kernel: MAX_KERNEL_FILE.min(memory),
            initrd: memory,
            config: MAX_CONFIG_FILE,
            metadata: METADATA_BUDGET,
        }
    }
}

/// A file the boot used: its partition and path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootFile {
    /// The partition's number (GRUB's and Linux's: from 1; 0 for a disk without a table).
    pub partition: u32,
    /// GRUB's name for the partition: `hd0,gpt2`.
    pub device: String,
    pub path: String,
}

impl std::fmt::Display for BootFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.partition == 0 {
            write!(f, "{} on the whole disk", self.path)
        } else {
            write!(
                f,
                "{} on partition {} ({})",
                self.path, self.partition, self.device
            )
        }
    }
}

/// What the disk boots.
#[derive(Clone, Debug)]
pub struct Boot {
    pub loader: Loader,
    pub scheme: Scheme,
    /// The configuration file that chose the entry.
    pub config: BootFile,
    /// The entry's title (GRUB's menu entry, a BLS title, an extlinux label).
    pub title: String,
    pub kernel_file: BootFile,
    pub initrd_files: Vec<BootFile>,
    /// The kernel command line, as the boot loader would pass it (`root=UUID=…` as written).
    pub cmdline: String,
    /// The kernel file's contents (an ELF `vmlinux` or a bzImage).
    pub kernel: Vec<u8>,
    /// The initrd files' contents, each padded to 4 bytes as GRUB loads several.
    pub initrd: Vec<u8>,
    /// What was skipped or odd on the way (unknown commands, a damaged backup GPT...).
    pub notes: Vec<String>,
}

impl Boot {
    /// One line for logs and events: loader, entry, files.
    pub fn describe(&self) -> String {
        describe_entry(
            self.loader,
            &self.title,
            &self.config,
            &self.kernel_file,
            &self.initrd_files,
        )
    }
}

/// One line naming a boot entry: loader, title, the configuration that chose it, kernel
/// and initrds (also for a caller that kept only these of a [`Boot`]).
pub fn describe_entry(
    loader: Loader,
    title: &str,
    config: &BootFile,
    kernel: &BootFile,
    initrds: &[BootFile],
) -> String {
    let mut text = format!(
        "{} entry {title:?} from {config}: kernel {}",
        loader.name(),
        kernel.path
    );
    for initrd in initrds {
        text.push_str(", initrd ");
        text.push_str(&initrd.path);
    }
    text
}

/// Why a disk cannot be booted.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read the disk: {0}")]
    Io(std::io::Error),
    #[error(
        "reading the boot files needed more than the allowed disk reads: a damaged or hostile filesystem (a loop?)"
    )]
    ReadBudget,
    #[error("the disk is damaged: {0}")]
    Corrupt(String),
    #[error("no boot loader configuration found for {} boot (GRUB, systemd-boot, extlinux/syslinux, GRUB legacy or BLS entries){}", firmware.name(), unreadable_list(unreadable))]
    NoBootableEntry {
        firmware: Firmware,
        /// Partitions holding filesystems that are not read (xfs, btrfs...).
        unreadable: Vec<String>,
    },
    #[error("{config}: {reason}")]
    NoUsableEntry { config: String, reason: String },
    #[error("cannot read {what} {file}: {reason}")]
    File {
        what: &'static str,
        file: String,
        reason: String,
    },
    #[error("the boot disk could not be parsed: {0}")]
    Panicked(String),
}

fn unreadable_list(unreadable: &[String]) -> String {
    if unreadable.is_empty() {
        String::new()
    } else {
        format!(": {}", unreadable.join("; "))
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        if disk::is_budget_error(&e) {
            Error::ReadBudget
        } else {
            Error::Io(e)
        }
    }
}

/// Finds the entry the disk's boot loader would boot and reads its files.
///
/// A parser that panics on a hostile disk is caught here: the boot fails with
/// [`Error::Panicked`] and the caller goes on.
pub fn load(disk: Box<dyn DiskRead>, firmware: Firmware, limits: &Limits) -> Result<Boot, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        load_unguarded(disk, firmware, limits)
    }))
    .unwrap_or_else(|panic| {
        let message = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a parser panicked".into());
        Err(Error::Panicked(message))
    })
}

fn load_unguarded(
    disk: Box<dyn DiskRead>,
    firmware: Firmware,
    limits: &Limits,
) -> Result<Boot, Error> {
    let disk = disk::Disk::new(disk, limits.metadata);
    let table = partitions::read(&disk)?;
    let files = DiskFiles::new(disk.clone(), table.clone());
    let mut cx = Context {
        files: &files,
        limits,
        firmware,
        notes: Notes::default(),
    };
    for note in &table.notes {
        cx.notes.add(note.clone());
    }
    let found = loaders::find(&mut cx);
    if files.disk().budget_spent() {
        return Err(Error::ReadBudget);
    }
    let chosen = found?;
    files
        .disk()
        .allow(limits.kernel.saturating_add(limits.initrd));
    let kernel = read(&cx, "kernel", &chosen.kernel, limits.kernel)?;
    let mut initrd = Vec::new();
    for file in &chosen.initrds {
        let left = limits.initrd.saturating_sub(usize_to_u64(initrd.len()));
        let data = read(&cx, "initrd", file, left)?;
        initrd.extend_from_slice(&data);
        initrd.resize(initrd.len().next_multiple_of(4), 0);
    }
    Ok(report(&cx, table.scheme, chosen, kernel, initrd))
}

fn read(
    cx: &Context<'_>,
    what: &'static str,
    file: &FileRef,
    limit: u64,
) -> Result<Vec<u8>, Error> {
    cx.files
        .read(file.part, &file.path, limit)
        .map_err(|e| match e {
            fs::FsError::Budget => Error::ReadBudget,
            other => Error::File {
                what,
                file: cx.describe_file(file),
                reason: other.to_string(),
            },
        })
}

fn report(
    cx: &Context<'_>,
    scheme: Scheme,
    chosen: Chosen,
    kernel: Vec<u8>,
    initrd: Vec<u8>,
) -> Boot {
    let file = |f: &FileRef| {
        let partition = cx.files.partitions().get(f.part);
        BootFile {
            partition: partition.map_or(0, |p| p.number),
            device: partition.map(Partition::grub_name).unwrap_or_default(),
            path: f.path.clone(),
        }
    };
    Boot {
        loader: chosen.loader,
        scheme,
        config: file(&chosen.config),
        title: chosen.title,
        kernel_file: file(&chosen.kernel),
        initrd_files: chosen.initrds.iter().map(file).collect(),
        cmdline: chosen.cmdline,
        kernel,
        initrd,
        notes: cx.notes.0.clone(),
    }
}

/// The partition table of `disk` (for tools and tests).
pub fn partition_table(disk: Box<dyn DiskRead>) -> Result<Vec<Partition>, Error> {
    let disk = disk::Disk::new(disk, METADATA_BUDGET);
    Ok(partitions::read(&disk)?.partitions)
}
