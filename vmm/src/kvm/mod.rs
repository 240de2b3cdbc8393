//! Everything that talks to `/dev/kvm`: the VM and its memory, x86 boot
//! set-up, vCPUs and their run loop.

pub(crate) mod boot;
pub(crate) mod cpu;
pub(crate) mod cpuid;
pub(crate) mod emulation;
pub(crate) mod kernel_image;
pub(crate) mod layout;
pub(crate) mod memory;
pub(crate) mod mptable;
pub(crate) mod vcpu;
pub(crate) mod vcpu_state;
pub(crate) mod vm_state;

use std::path::PathBuf;

use kvm_bindings::{KVM_PIT_SPEAKER_DUMMY, kvm_pit_config};
use kvm_ioctls::{Kvm, VmFd};

/// Why a VM could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot open /dev/kvm: {0} (is KVM available and are you allowed to use it?)")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("{0} failed: {1}")]
    Kvm(&'static str, #[source] kvm_ioctls::Error),
    #[error("{0}: {1}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("invalid memory size {0} bytes")]
    MemorySize(u64),
    #[error("cannot allocate guest memory: {0}")]
    Memory(#[source] vm_memory::mmap::FromRangesError),
    #[error("guest memory region: {0}")]
    MemoryRegion(#[source] vm_memory::GuestMemoryError),
    #[error("memory slot {0} does not fit a u32")]
    MemorySlot(usize),
    #[error("cannot open kernel {0}: {1}")]
    KernelFile(PathBuf, #[source] std::io::Error),
    #[error("cannot load the kernel: bzImage payload: {0}")]
    KernelPayload(#[from] kernel_image::Error),
    #[error("cannot load the kernel: {0}")]
    KernelLoad(#[source] linux_loader::loader::Error),
    #[error("cannot load the kernel: the decompressed payload is not an ELF kernel")]
    PayloadNotElf,
    #[error("cannot load the kernel: a boot disk's kernel is read before it is loaded")]
    KernelNotRead,
    #[error("cannot load the kernel: entry point {0:#x} is outside guest memory")]
    KernelEntryOutside(u64),
    #[error("cannot load the kernel: it ends at {0:#x}, past the end of guest memory")]
    KernelPastMemory(u64),
    #[error("cannot load the kernel: its 64-bit entry point overflows")]
    KernelEntryOverflow,
    #[error("cannot open initrd {0}: {1}")]
    InitrdFile(PathBuf, #[source] std::io::Error),
    #[error("the initrd ({0} bytes) does not fit in guest memory below the kernel's limit")]
    InitrdTooBig(u64),
    #[error("cannot load the initrd: {0}")]
    InitrdLoad(#[source] vm_memory::GuestMemoryError),
    #[error("invalid kernel command line: {0}")]
    Cmdline(#[source] linux_loader::cmdline::Error),
    #[error("the kernel command line ({0} bytes) does not fit a u32")]
    CmdlineTooLong(usize),
    #[error("cannot write the kernel command line: {0}")]
    CmdlineLoad(#[source] linux_loader::loader::Error),
    #[error("cannot write the boot parameters: {0}")]
    BootParams(#[source] linux_loader::configurator::Error),
    #[error("cannot write the boot parameters: more e820 entries than the zero page holds")]
    TooManyE820Entries,
    #[error("cannot write {what} into guest memory: {source}")]
    GuestWrite {
        what: &'static str,
        #[source]
        source: vm_memory::GuestMemoryError,
    },
    #[error("the MP table ({0} bytes) does not fit its area")]
    MptableTooBig(usize),
    #[error("the boot MSR list: {0}")]
    MsrList(#[source] vmm_sys_util::fam::Error),
    #[error("KVM set only {set} of {wanted} boot MSRs")]
    Msrs { set: usize, wanted: usize },
}

pub(crate) type Result<T> = std::result::Result<T, Error>;

/// Adds the name of the failed ioctl to a KVM error.
pub(crate) fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |e| Error::Kvm(what, e)
}

/// Opens /dev/kvm and creates a VM with `mem_bytes` of guest RAM and the
/// in-kernel irqchip (PIC, IOAPIC, local APICs); the PIT comes after
/// ([`create_pit`]).
///
/// The order matters for start-up time: the RAM's memory slots are registered
/// before the irqchip. KVM waits for an SRCU grace period on every memory-slot
/// change; right after `KVM_CREATE_IRQCHIP` (whose I/O-bus and routing updates
/// ran grace periods of their own) that wait took 5.6–10 ms here (one or two
/// 4 ms timer ticks), before it 0.04 ms (`vmm/cli/benches/README.md`).
pub(crate) fn create_vm(mem_bytes: u64) -> Result<(VmFd, virtio_devices::GuestMemoryMmap)> {
    let kvm = Kvm::new().map_err(Error::OpenKvm)?;
    let vm = kvm.create_vm().map_err(kvm_err("KVM_CREATE_VM"))?;
    let memory = memory::create(&vm, mem_bytes)?;
    vm.set_tss_address(layout::KVM_TSS_ADDR)
        .map_err(kvm_err("KVM_SET_TSS_ADDR"))?;
    vm.create_irq_chip()
        .map_err(kvm_err("KVM_CREATE_IRQCHIP"))?;
    // Every instruction KVM cannot emulate comes to the VMM (`emulation`),
    // user mode included, with its bytes.
    if kvm.check_extension_raw(u64::from(kvm_bindings::KVM_CAP_EXIT_ON_EMULATION_FAILURE)) > 0 {
        let cap = kvm_bindings::kvm_enable_cap {
            cap: kvm_bindings::KVM_CAP_EXIT_ON_EMULATION_FAILURE,
            args: [1, 0, 0, 0],
            ..Default::default()
        };
        vm.enable_cap(&cap)
            .map_err(kvm_err("KVM_ENABLE_CAP(EXIT_ON_EMULATION_FAILURE)"))?;
    }
    Ok((vm, memory))
}

/// Adds the in-kernel PIT to a VM that has its irqchip. KVM starts a kernel
/// thread for it, which took 1-1.5 ms here: the first vCPU's thread does it
/// while the VM's devices are built (`vcpu_threads`).
pub(crate) fn create_pit(vm: &VmFd) -> Result<()> {
    // The speaker port is left to KVM's dummy so guests probing it do not exit.
    let pit = kvm_pit_config {
        flags: KVM_PIT_SPEAKER_DUMMY,
        ..Default::default()
    };
    vm.create_pit2(pit).map_err(kvm_err("KVM_CREATE_PIT2"))
}

/// The CPUID entries KVM supports on this host (`KVM_GET_SUPPORTED_CPUID`),
/// through a /dev/kvm handle of its own so that it can be asked on any thread.
pub(crate) fn supported_cpuid() -> Result<kvm_bindings::CpuId> {
    Kvm::new()
        .map_err(Error::OpenKvm)?
        .get_supported_cpuid(kvm_bindings::KVM_MAX_CPUID_ENTRIES)
        .map_err(kvm_err("KVM_GET_SUPPORTED_CPUID"))
}

/// The MSRs KVM saves and restores for a vCPU (`KVM_GET_MSR_INDEX_LIST`), through a
/// /dev/kvm handle of its own (asked on the CPUID thread, before any sandbox).
pub(crate) fn msrs_to_save() -> Result<Vec<u32>> {
    Ok(Kvm::new()
        .map_err(Error::OpenKvm)?
        .get_msr_index_list()
        .map_err(kvm_err("KVM_GET_MSR_INDEX_LIST"))?
        .as_slice()
        .to_vec())
}
