//! The crate's one error type: why a VM could not start, or a lifecycle request failed.
//! Every module that builds or drives a VM returns it ([`crate::vm`], [`crate::boot_disk`],
//! the vCPU threads); the KVM layer's own errors ([`crate::kvm`]) convert into it.

use std::time::Duration;

use crate::kvm;
use crate::lifecycle::VmExit;

/// Why a VM could not start, or a lifecycle request failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Kvm(#[from] kvm::Error),
    /// The vCPU kick's signal handler (`crate::kick`) could not be installed.
    #[error("cannot install the vCPU kick signal handler: {0}")]
    KickHandler(#[source] std::io::Error),
    /// The thread asking KVM for its CPUID panicked.
    #[error("the CPUID query thread panicked")]
    CpuidThreadPanicked,
    /// The serial console's output (a file, a socket) could not be opened.
    #[error("serial console: {0}")]
    SerialConsole(#[source] std::io::Error),
    /// Two devices were placed on one range of a bus (a bug of the VMM, not of a guest).
    #[error(transparent)]
    BusOverlap(#[from] crate::bus::OverlapError),
    /// The virtio devices (disks, network, rng) could not be set up.
    #[error("virtio devices: {0}")]
    Virtio(#[source] crate::devices::virtio::Error),
    /// The ACPI tables could not be written into guest memory.
    #[error("ACPI tables: {0}")]
    Acpi(#[source] crate::acpi::Error),
    /// The SMBIOS tables could not be written into guest memory.
    #[error("SMBIOS tables: {0}")]
    Smbios(#[source] crate::smbios::Error),
    #[error("cannot start a thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error("the VM has already ended: {0}")]
    Ended(VmExit),
    #[error("the vCPUs did not stop within {0:?}")]
    PauseTimeout(Duration),
    /// The sandbox could not be prepared (filters, Landlock rules, credentials).
    #[error("sandbox: {0}")]
    Sandbox(#[source] crate::sandbox::SandboxError),
    /// A thread of the VM (`kind`) could not enter its sandbox.
    #[error("the {kind:?} thread cannot enter its sandbox: {source}")]
    EnterSandbox {
        kind: crate::sandbox::ThreadKind,
        #[source]
        source: std::io::Error,
    },
    /// A live migration is moving the VM: it cannot be paused, resumed or sent input.
    #[error("the VM is being migrated")]
    Migrating,
    /// A live migration's answer was lost after the VM's state went out: the target may
    /// run it, so this copy stays paused (`MigrationError::OutcomeUnknown`).
    #[error("the VM may run on its migration's target (the answer was lost): it stays paused here")]
    MaybeMigrated,
    /// A live migration's target could not take the VM (`crate::migration`).
    #[error("incoming migration: {0}")]
    Migration(#[from] crate::migration::MigrationError),
    /// A vCPU thread ended before it reported whether it could start.
    #[error("a vCPU thread ended at start")]
    VcpuThreadEnded,
    /// The boot disk has nothing this VMM can boot, or cannot be read.
    #[error("cannot boot from disk {disk} ({}): {source}", path.display())]
    BootDisk {
        /// The index of the disk in [`crate::config::VmConfig::disks`].
        disk: usize,
        path: std::path::PathBuf,
        #[source]
        source: disk_boot::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;
