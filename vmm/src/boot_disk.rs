//! Booting from a disk: what the disk's boot loader would boot, found by `disk_boot` on a
//! sandboxed thread of its own.
//!
//! The disk is the guest's (it can rewrite its `/boot` and reboot), so everything read from
//! it is hostile input: the partition tables, filesystems and configurations, and the
//! kernel image whose bzImage payload is decompressed here. The thread opens the disk
//! image read-only through the block engine (raw, qcow2 with its backing chain and
//! compressed clusters), then enters the [`ThreadKind::BootLoader`] sandbox (unprivileged,
//! no file access, a seccomp allowlist of reads and memory) before it parses a byte. It
//! hands back the prepared kernel, the initrd and the command line; the starting thread
//! loads them into guest memory as for a direct kernel boot.
//!
//! It runs while the VM is created, and is joined before the devices open their disks:
//! the boot disk is never open for reading here and for writing by virtio-blk at once.

use std::thread::JoinHandle;

use crate::config::{BootDisk, BootFirmware, VmConfig};
use crate::error::{Error, Result};
use crate::kvm::boot::{self, Prepared};
use crate::sandbox::{Sandbox, ThreadKind};

pub use disk_boot::{BootFile, Error as BootError, Loader};

/// Which entry a VM booted from its disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BootReport {
    /// The index of the disk in [`VmConfig::disks`].
    pub disk: usize,
    pub firmware: BootFirmware,
    pub loader: Loader,
    /// The configuration file that chose the entry.
    pub config: BootFile,
    pub title: String,
    pub kernel: BootFile,
    pub initrds: Vec<BootFile>,
    /// The entry's command line (before anything the VMM appends).
    pub cmdline: String,
    /// What the loader skipped or found odd.
    pub notes: Vec<String>,
}

impl BootReport {
    /// One line: loader, entry, configuration, kernel and initrds.
    pub fn describe(&self) -> String {
        disk_boot::describe_entry(
            self.loader,
            &self.title,
            &self.config,
            &self.kernel,
            &self.initrds,
        )
    }
}

/// What the boot disk gave.
pub(crate) struct Booted {
    pub(crate) kernel: Prepared,
    pub(crate) initrd: Vec<u8>,
    pub(crate) report: BootReport,
}

/// The thread finding the boot disk's entry.
pub(crate) struct Finding(JoinHandle<Result<Booted>>);

/// Starts finding `boot`'s entry on a thread of its own.
pub(crate) fn spawn(
    config: &VmConfig,
    boot: BootDisk,
    sandbox: &std::sync::Arc<Sandbox>,
) -> Result<Finding> {
    let disk = config.disks.get(boot.disk).cloned().ok_or_else(|| {
        Error::Config(format!(
            "boot disk {} does not exist ({} disks)",
            boot.disk,
            config.disks.len()
        ))
    })?;
    let memory = config.memory_mib << 20;
    let decompress = config.kernel_decompress;
    let sandbox = sandbox.clone();
    let thread = std::thread::Builder::new()
        .name("boot-disk".into())
        .spawn(move || {
            let failed = |source: disk_boot::Error| Error::BootDisk {
                disk: boot.disk,
                path: disk.path.clone(),
                source,
            };
            // Read-only and through the page cache, whatever the device's mode: nothing
            // is written, and O_DIRECT would need aligned buffers.
            let image = block::open_disk_with(
                &disk.open_path(),
                disk.format,
                block::OpenOptions {
                    read_only: true,
                    direct: false,
                    backing: disk.backing.clone(),
                },
            )
            .map_err(|e| failed(disk_boot::Error::Io(std::io::Error::other(e.to_string()))))?;
            sandbox
                .enter(ThreadKind::BootLoader)
                .map_err(|source| Error::EnterSandbox {
                    kind: ThreadKind::BootLoader,
                    source,
                })?;
            let found = disk_boot::load(
                Box::new(image),
                boot.firmware,
                &disk_boot::Limits::for_guest_memory(memory),
            )
            .map_err(failed)?;
            let report = BootReport {
                disk: boot.disk,
                firmware: boot.firmware,
                loader: found.loader,
                config: found.config,
                title: found.title,
                kernel: found.kernel_file,
                initrds: found.initrd_files,
                cmdline: found.cmdline,
                notes: found.notes,
            };
            tracing::info!(disk = %disk.path.display(), "booting {}", report.describe());
            let kernel =
                boot::prepare(found.kernel, decompress, memory).map_err(|e| Error::BootDisk {
                    disk: boot.disk,
                    path: disk.path.clone(),
                    source: disk_boot::Error::File {
                        what: "kernel",
                        file: report.kernel.to_string(),
                        reason: e.to_string(),
                    },
                })?;
            Ok(Booted {
                kernel,
                initrd: found.initrd,
                report,
            })
        })
        .map_err(Error::Thread)?;
    Ok(Finding(thread))
}

impl Finding {
    /// Waits for the entry.
    pub(crate) fn join(self) -> Result<Booted> {
        self.0
            .join()
            .map_err(|_| Error::Config("the boot disk thread panicked".into()))?
    }
}
