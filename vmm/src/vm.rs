//! Building a VM from a [`VmConfig`] and running it on its own threads.

use std::sync::atomic::AtomicI32;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::devices::virtio::VirtioTransport;
use kvm_ioctls::VmFd;
use linux_loader::cmdline::Cmdline;
use vm_memory::GuestMemoryMmap;

use crate::acpi::platform::{self, AcpiPlatform};
use crate::boot_disk::{self, BootReport};
use crate::bus::{Bus, lock};
use crate::config::CpuProfile;
use crate::config::{KernelSource, MAX_VCPUS, VirtioTransportKind, VmConfig};
use crate::devices::irq::IrqLine;
use crate::devices::legacy::exit_port::ExitPort;
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::rtc::Rtc;
use crate::devices::legacy::serial::Console;
use crate::devices::legacy::{
    EXIT_PORT, EXIT_PORT_LEN, I8042_GSI, I8042_PORT, I8042_PORT_LEN, RTC_PORT, RTC_PORT_LEN,
    SERIAL_GSI, SERIAL_PORT, SERIAL_PORT_LEN,
};
use crate::error::{Error, Result};
use crate::kvm::boot::{InitrdInput, KernelInput};
use crate::kvm::cpuid::CpuidPolicy;
use crate::kvm::vcpu::Buses;
use crate::kvm::{self, layout};
use crate::lifecycle::{Control, VmExit, VmState};
use crate::sandbox::Sandbox;
use crate::stats::{DeviceCounters, VcpuTids, VmStats};
use crate::vcpu_threads::{Launch, Shared, StartingVcpus};

/// How long `pause` waits for every vCPU to leave the guest.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Entry point of the library: builds and starts VMs.
pub struct Vm;

impl Vm {
    /// Builds the VM (memory, kernel, devices, vCPUs) and starts its vCPU
    /// threads. Configuration and set-up errors are returned here; once this
    /// returns, how the VM ends is reported by [`VmHandle::wait`].
    pub fn start(config: VmConfig) -> Result<VmHandle> {
        validate(&config)?;
        // Asked on a thread of its own while the VM is created: the kernel
        // answers with a few hundred host CPUID instructions, each a trap to
        // the outer hypervisor when this host is itself a VM (0.3-0.5 ms here).
        let (profile, vcpu_count) = (config.cpu_profile, config.vcpus);
        let cpuid_policy = std::thread::Builder::new()
            .name("cpuid".into())
            .spawn(move || {
                let supported = kvm::supported_cpuid()?;
                let profile = profile.unwrap_or_else(CpuProfile::detect);
                Ok::<_, kvm::Error>(CpuidPolicy::new(&supported, profile, vcpu_count))
            })
            .map_err(Error::Thread)?;
        crate::kick::install_handler().map_err(Error::KickHandler)?;
        let sandbox = Sandbox::new(config.sandbox.clone(), removable_dirs(&config))
            .map_err(Error::Sandbox)?;
        // A boot disk is read on a sandboxed thread of its own while the VM is created.
        let finding = match &config.kernel {
            KernelSource::Disk(boot) => Some(boot_disk::spawn(&config, *boot, &sandbox)?),
            _ => None,
        };
        let (vm, memory) = kvm::create_vm(config.memory_mib << 20)?;
        let vm = Arc::new(vm);
        let control = Arc::new(Control::new(usize::from(config.vcpus)));
        let cpuid = cpuid_policy
            .join()
            .map_err(|_| Error::CpuidThreadPanicked)??;

        // The vCPUs are set up on their own threads while this one builds the
        // devices and loads the kernel.
        let vcpu_tids: VcpuTids = (0..config.vcpus).map(|_| AtomicI32::new(0)).collect();
        let starting = StartingVcpus::spawn(
            config.vcpus,
            &Shared {
                vm: &vm,
                memory: &memory,
                cpuid: &cpuid,
                ap_start: config.ap_start,
                control: &control,
                tids: &vcpu_tids,
                sandbox: &sandbox,
            },
        )?;
        let platform =
            match build_platform(&config, finding, &vm, &memory, &control, &sandbox, &cpuid) {
                Ok(platform) => platform,
                Err(e) => {
                    starting.abort();
                    return Err(e);
                }
            };
        let buses = Arc::new(platform.buses);
        let threads = starting.release(
            &control,
            Launch {
                entry: platform.entry,
                buses: buses.clone(),
            },
        )?;
        Ok(VmHandle {
            control,
            sandbox,
            i8042: platform.i8042,
            acpi: platform.acpi,
            virtio: platform.virtio.transports,
            counters: platform.virtio.counters,
            boot_report: platform.boot_report,
            vcpu_tids,
            threads: Mutex::new(threads),
            _resources: Resources {
                _vm: vm,
                _memory: memory,
                _console: platform.console,
                _buses: buses,
            },
        })
    }
}

/// The devices on their buses and the loaded kernel.
struct Platform {
    buses: Buses,
    /// The kernel entry point.
    entry: u64,
    console: Console,
    i8042: Arc<Mutex<I8042>>,
    acpi: Arc<Mutex<AcpiPlatform>>,
    virtio: crate::devices::virtio::Attached,
    /// The entry a boot disk gave.
    boot_report: Option<BootReport>,
}

/// Attaches the devices, writes the boot tables and loads the kernel (a boot disk's
/// once `finding` has it).
fn build_platform(
    config: &VmConfig,
    finding: Option<boot_disk::Finding>,
    vm: &Arc<VmFd>,
    memory: &GuestMemoryMmap,
    control: &Arc<Control>,
    sandbox: &Arc<Sandbox>,
    cpuid: &CpuidPolicy,
) -> Result<Platform> {
    let mut pio = Bus::new("port I/O");
    let mut mmio = Bus::new("MMIO");
    let console = Console::new(
        &config.serial,
        IrqLine::new(vm, SERIAL_GSI)?,
        sandbox.clone(),
        control.timeline().clone(),
    )
    .map_err(Error::SerialConsole)?;
    let i8042 = Arc::new(Mutex::new(I8042::new(
        control.clone(),
        IrqLine::new(vm, I8042_GSI)?,
    )));
    pio.insert(SERIAL_PORT, SERIAL_PORT_LEN, console.device.clone())?;
    pio.insert(I8042_PORT, I8042_PORT_LEN, i8042.clone())?;
    pio.insert(
        EXIT_PORT,
        EXIT_PORT_LEN,
        Arc::new(Mutex::new(ExitPort::new(control.clone()))),
    )?;
    pio.insert(
        RTC_PORT,
        RTC_PORT_LEN,
        Arc::new(Mutex::new(Rtc::new(config.rtc_offset_seconds))),
    )?;

    let acpi = Arc::new(Mutex::new(AcpiPlatform::new(
        control.clone(),
        crate::devices::irq::LevelIrqLine::new(vm, platform::GED_GSI, "acpi-ged", sandbox.clone())?,
    )));
    pio.insert(platform::PORT_BASE, platform::PORT_LEN, acpi.clone())?;

    // Before the devices open the disks: the boot disk is read-only here, theirs.
    let booted = finding.map(boot_disk::Finding::join).transpose()?;
    let mut cmdline = build_cmdline(
        booted.as_ref().map(|b| b.report.cmdline.as_str()),
        &config.cmdline,
    )?;
    let virtio = match config.transport {
        VirtioTransportKind::Mmio => {
            crate::devices::virtio::attach(config, vm, memory, &mut mmio, &mut cmdline, sandbox)
        }
        VirtioTransportKind::Pci => {
            crate::devices::virtio_pci::attach(config, vm, memory, &mut pio, &mut mmio, sandbox)
        }
    }
    .map_err(Error::Virtio)?;
    kvm::boot::write_long_mode_tables(memory)?;
    kvm::mptable::write(memory, config.vcpus)?;
    let rsdp = crate::acpi::write(
        memory,
        &crate::acpi::Platform {
            vcpus: config.vcpus,
            pci: config.transport == VirtioTransportKind::Pci,
        },
    )
    .map_err(Error::Acpi)?;
    let (cpuid_signature, cpuid_features) = cpuid.signature();
    crate::smbios::write(
        memory,
        &crate::smbios::Machine {
            smbios: &config.smbios,
            // The CPUID policy shows one package with a core per vCPU (`kvm::cpuid`).
            sockets: 1,
            cores_per_socket: config.vcpus,
            cpuid_signature,
            cpuid_features,
            ram_ranges: layout::ram_ranges(config.memory_mib << 20),
        },
    )
    .map_err(Error::Smbios)?;
    let (kernel, initrd) = match &booted {
        Some(b) => (
            KernelInput::Prepared(&b.kernel),
            if b.initrd.is_empty() {
                InitrdInput::None
            } else {
                InitrdInput::Bytes(&b.initrd)
            },
        ),
        None => (
            KernelInput::Source(&config.kernel, config.kernel_decompress),
            config
                .initrd
                .as_deref()
                .map_or(InitrdInput::None, InitrdInput::File),
        ),
    };
    let entry = kvm::boot::load(memory, kernel, &cmdline, initrd, rsdp)?;
    Ok(Platform {
        buses: Buses { pio, mmio },
        entry: entry.entry.0,
        console,
        i8042,
        acpi,
        virtio,
        boot_report: booted.map(|b| b.report),
    })
}

/// The guest CPUID `vcpus` vCPUs would get under `profile` (detected when
/// `None`), as the table `vmm cpuid` prints.
pub fn cpuid_table(profile: Option<CpuProfile>, vcpus: u8) -> Result<String> {
    let supported = kvm::supported_cpuid()?;
    let policy = CpuidPolicy::new(
        &supported,
        profile.unwrap_or_else(CpuProfile::detect),
        vcpus.max(1),
    );
    Ok(policy.describe(&supported))
}

fn validate(config: &VmConfig) -> Result<()> {
    if config.vcpus == 0 || config.vcpus > MAX_VCPUS {
        return Err(Error::Config(format!(
            "vCPU count must be 1..={MAX_VCPUS}, got {}",
            config.vcpus
        )));
    }
    // Room for the boot structures below 1 MiB and a kernel above it.
    if config.memory_mib < 2 {
        return Err(Error::Config(format!(
            "memory must be at least 2 MiB, got {} MiB",
            config.memory_mib
        )));
    }
    if let KernelSource::Disk(boot) = &config.kernel {
        if boot.disk >= config.disks.len() {
            return Err(Error::Config(format!(
                "boot disk {} does not exist ({} disks)",
                boot.disk,
                config.disks.len()
            )));
        }
        if config.initrd.is_some() {
            return Err(Error::Config(
                "a boot disk's entry names its own initrd: no initrd may be given".into(),
            ));
        }
    }
    if config
        .memory_mib
        .checked_mul(1 << 20)
        .is_none_or(|b| usize::try_from(b).is_err())
    {
        return Err(Error::Config(format!(
            "memory size {} MiB is too large",
            config.memory_mib
        )));
    }
    Ok(())
}

/// Directories the control threads may remove a file from once
/// sandboxed: the console socket's, removed when the VM ends.
fn removable_dirs(config: &VmConfig) -> Vec<std::path::PathBuf> {
    match &config.serial {
        crate::config::SerialTarget::UnixSocket(path) => path
            .parent()
            .map(|dir| vec![dir.to_path_buf()])
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}

/// The command line: a boot disk entry's, then the configuration's. With the virtio-mmio
/// transport the devices' `virtio_mmio.device=` entries are added later
/// (`devices::virtio::attach`); virtio-pci, the default, adds nothing (the guest finds its
/// devices by enumerating the PCI bus).
fn build_cmdline(entry: Option<&str>, configured: &str) -> Result<Cmdline> {
    let mut cmdline =
        Cmdline::new(layout::CMDLINE_MAX_SIZE).map_err(|e| Error::Config(e.to_string()))?;
    for part in [entry.unwrap_or(""), configured] {
        if !part.trim().is_empty() {
            cmdline
                .insert_str(part.trim())
                .map_err(|e| Error::Config(format!("kernel command line: {e}")))?;
        }
    }
    Ok(cmdline)
}

/// What must live as long as the VM runs. Field order is drop order: the
/// buses (whose PCI devices hold the VM fd for MSI routing) go first, then
/// the VM fd goes before the memory KVM maps.
struct Resources {
    _buses: Arc<Buses>,
    _vm: Arc<VmFd>,
    _memory: GuestMemoryMmap,
    _console: Console,
}

/// A running VM. Methods may be called from any thread; dropping the
/// handle kills the VM if it is still running.
pub struct VmHandle {
    control: Arc<Control>,
    sandbox: Arc<Sandbox>,
    i8042: Arc<Mutex<I8042>>,
    acpi: Arc<Mutex<AcpiPlatform>>,
    virtio: Vec<VirtioTransport>,
    counters: DeviceCounters,
    boot_report: Option<BootReport>,
    vcpu_tids: VcpuTids,
    threads: Mutex<Vec<JoinHandle<()>>>,
    _resources: Resources,
}

impl VmHandle {
    pub fn state(&self) -> VmState {
        self.control.state()
    }

    /// Stops every vCPU outside the guest, then the devices' own threads
    /// (the net receive thread). Returns once all are stopped.
    pub fn pause(&self) -> Result<()> {
        self.ensure_running()?;
        self.control.request_pause();
        if self.control.wait_paused(PAUSE_TIMEOUT) {
            for transport in &self.virtio {
                transport.pause();
            }
            return Ok(());
        }
        match self.control.exit() {
            Some(exit) => Err(Error::Ended(exit)),
            None => Err(Error::PauseTimeout(PAUSE_TIMEOUT)),
        }
    }

    /// Lets a paused VM run again.
    pub fn resume(&self) -> Result<()> {
        self.ensure_running()?;
        for transport in &self.virtio {
            transport.resume();
        }
        self.control.resume();
        Ok(())
    }

    /// Asks the guest to shut down: presses the ACPI power button (as
    /// KubeVirt's default graceful shutdown does through libvirt). A Linux
    /// guest powers off through `_S5`, which ends the VM with a power-off.
    pub fn request_shutdown(&self) -> Result<()> {
        self.ensure_running()?;
        lock(&self.acpi).press_power_button();
        Ok(())
    }

    /// Types Ctrl-Alt-Del on the guest's keyboard controller: a Linux guest
    /// reboots (a soft reboot), which ends the VM with a reset.
    pub fn request_ctrl_alt_del(&self) -> Result<()> {
        self.ensure_running()?;
        lock(&self.i8042).trigger_ctrl_alt_del();
        Ok(())
    }

    /// Stops the VM now. The ending is [`VmExit::Killed`] unless the VM had
    /// already ended.
    pub fn kill(&self) {
        self.control.finish(VmExit::Killed);
    }

    /// The devices' counters and the vCPUs' CPU time, now.
    pub fn stats(&self) -> VmStats {
        crate::stats::snapshot(&self.counters, &self.vcpu_tids)
    }

    /// The entry the VM booted from its boot disk (`None` for a kernel given directly).
    pub fn boot_report(&self) -> Option<&BootReport> {
        self.boot_report.as_ref()
    }

    /// This VM's boot milestones (first `KVM_RUN`, first serial byte, its end).
    pub fn timeline(&self) -> &crate::timing::BootTimeline {
        self.control.timeline()
    }

    /// The VM's sandbox: the control threads of a VMM program (`vmm run`)
    /// enter it as [`ThreadKind::Control`](crate::sandbox::ThreadKind::Control)
    /// once the VM has started.
    pub fn sandbox(&self) -> &Arc<Sandbox> {
        &self.sandbox
    }

    /// How the VM ended, if it has.
    pub fn exit(&self) -> Option<VmExit> {
        self.control.exit()
    }

    /// Blocks until the VM ends, its vCPU threads are gone and its devices
    /// are stopped and closed: every disk's writes and metadata flushed, its
    /// image closed and its locks released. A VM started on the same disks
    /// after this returns sees all the old VM wrote, whether the guest
    /// flushed or not, and nothing of the old VM writes to them any more.
    pub fn wait(&self) -> VmExit {
        let exit = self
            .control
            .wait_exit(None)
            .unwrap_or(VmExit::InternalError("no ending recorded".into()));
        self.join_threads();
        self.control.timeline().mark_vm_exit();
        exit
    }

    /// Like [`VmHandle::wait`], giving up after `timeout` (the VM keeps
    /// running). The devices' ending is not bounded by `timeout`.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<VmExit> {
        let exit = self.control.wait_exit(Some(timeout))?;
        self.join_threads();
        self.control.timeline().mark_vm_exit();
        Some(exit)
    }

    fn ensure_running(&self) -> Result<()> {
        match self.control.exit() {
            Some(exit) => Err(Error::Ended(exit)),
            None => Ok(()),
        }
    }

    /// The VM's ordered end, once it has ended: the vCPU threads are joined,
    /// then each device's thread finishes its batch and closes the device (a
    /// disk flushed and closed). Callers on other threads wait under the
    /// lock until all of it is done (the launcher's exit watcher and its
    /// Reset both wait).
    fn join_threads(&self) {
        let mut threads = lock(&self.threads);
        if !threads.is_empty() {
            self.control.forget_vcpu_threads();
            for thread in threads.drain(..) {
                if thread.join().is_err() {
                    tracing::error!("a vCPU thread panicked");
                }
            }
        }
        // No vCPU is left to notify a device; each stops at most once.
        for transport in &self.virtio {
            transport.stop();
        }
    }
}

impl Drop for VmHandle {
    fn drop(&mut self) {
        self.kill();
        self.join_threads();
    }
}
