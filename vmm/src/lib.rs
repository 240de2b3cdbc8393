//! A virtual machine monitor on `/dev/kvm`, built from the rust-vmm crates.
//!
//! [`Vm::start`] builds a VM from a [`VmConfig`] and runs it on its own
//! threads; the returned [`VmHandle`] pauses, resumes, asks the guest to shut
//! down, kills, reports how the VM ended ([`VmExit`]) and what its devices
//! and vCPUs have done so far ([`VmStats`]).
//!
//! Modules: `config` (what a VM is made of), `kvm` (VM, memory, boot set-up, vCPUs),
//! `boot_disk` (booting what a disk's boot loader would, through `disk_boot`), `devices`
//! (legacy devices, the virtio-pci wiring, the default, and the virtio-mmio one), `bus`
//! (port I/O and MMIO dispatch), `kick` (getting a vCPU out of `KVM_RUN`),
//! `pci` (the host bridge, configuration space, BARs, MSI-X routing), `acpi` and `smbios`
//! (the tables the guest reads), `vm`/`lifecycle` (the API), `vcpu_threads` (vCPUs set up
//! in parallel with the devices), `sandbox` (what every VMM thread enters: credentials,
//! no_new_privs, Landlock, seccomp), `stats` (device counters, CPU time), `timing` (boot
//! milestones for the boot benchmark), `fuzzing` (the fuzz targets' entry points, with the
//! `testing` feature only), `migration` (live migration: pre-copy by KVM's dirty log, the
//! VM's state saved and restored) over `wire` (the migration stream's checked format).
//! Modules import downwards only: ARCHITECTURE.md (section 2) draws the floors.
//! The `vmm` command (`run`, `selftest`, `test-guest`, `cpuid`, `img`) is the `vmm-cli`
//! crate; the test guest is the `test-guest` crate.

pub(crate) mod acpi;
pub mod boot_disk;
pub(crate) mod bus;
pub mod config;
pub(crate) mod devices;
pub mod error;
#[cfg(feature = "testing")]
pub mod fuzzing;
pub(crate) mod kick;
pub(crate) mod kvm;
pub mod lifecycle;
pub mod migration;
pub(crate) mod pci;
pub mod sandbox;
pub(crate) mod smbios;
pub mod stats;
pub mod timing;
pub(crate) mod vcpu_threads;
pub mod vm;
pub mod wire;

pub use boot_disk::BootReport;
pub use config::{
    ApStart, BootDisk, BootFirmware, CpuProfile, DiskBacking, DiskCache, DiskConfig, DiskFile,
    DiskFormat, KernelDecompress, KernelSource, NetConfig, SerialCapture, SerialTarget, Smbios,
    SmbiosChassis, SmbiosSystem, VirtioTransportKind, VmConfig,
};
pub use error::{Error, Result};
pub use lifecycle::{VmExit, VmState};
pub use migration::{
    DEFAULT_MAX_DOWNTIME, MigrationError, MigrationOptions, MigrationProgress, MigrationReport,
};
pub use sandbox::{Credentials, SandboxConfig, SeccompMode};
pub use stats::VmStats;
pub use vm::{Vm, VmHandle};
