//! Building a VM from a [`VmConfig`] and running it on its own threads.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::devices::virtio::VirtioTransport;
use kvm_ioctls::VmFd;
use linux_loader::cmdline::Cmdline;
use virtio_devices::GuestMemoryMmap;

use crate::acpi::platform::{self, AcpiPlatform};
use crate::boot_disk::{self, BootReport};
use crate::bus::{Bus, lock};
use crate::config::CpuProfile;
use crate::config::{KernelSource, MAX_VCPUS, VirtioTransportKind, VmConfig};
use crate::devices::irq::IrqLine;
use crate::devices::legacy::exit_port::ExitPort;
use crate::devices::legacy::i8042::I8042;
use crate::devices::legacy::rtc::Rtc;
use crate::devices::legacy::serial::{Console, SerialDevice};
use crate::devices::legacy::{
    EXIT_PORT, EXIT_PORT_LEN, I8042_GSI, I8042_PORT, I8042_PORT_LEN, RTC_PORT, RTC_PORT_LEN,
    SERIAL_GSI, SERIAL_PORT, SERIAL_PORT_LEN,
};
use crate::devices::virtio_state;
use crate::error::{Error, Result};
use crate::kvm::boot::{InitrdInput, KernelInput};
use crate::kvm::cpuid::CpuidPolicy;
use crate::kvm::vcpu::Buses;
use crate::kvm::{self, layout};
use crate::lifecycle::{Control, VmExit, VmState};
use crate::migration::{
    self, MigrationError, MigrationOptions, MigrationProgress, MigrationReport,
};
use crate::pci::CONFIG_PORTS;
use crate::sandbox::Sandbox;
use crate::stats::{DeviceCounters, VcpuTids, VmStats};
use crate::vcpu_threads::{Launch, Shared, Start, StartingVcpus};
use crate::wire::{self, Decoder, Encoder, FormatError, Reply};

/// How long `pause` waits for every vCPU to leave the guest.
const PAUSE_TIMEOUT: Duration = Duration::from_secs(10);

/// Entry point of the library: builds and starts VMs.
pub struct Vm;

impl Vm {
    /// Builds the VM (memory, kernel, devices, vCPUs) and starts its vCPU
    /// threads. Configuration and set-up errors are returned here; once this
    /// returns, how the VM ends is reported by [`VmHandle::wait`].
    pub fn start(config: VmConfig) -> Result<VmHandle> {
        let (built, starting) = build(config, Boot::Kernel)?;
        let threads = starting.release(
            &built.control,
            Launch {
                start: Start::Entry(built.platform.entry),
                buses: built.platform.buses.clone(),
            },
        )?;
        Ok(built.into_handle(threads))
    }

    /// Builds the VM `config` describes, as the source of a live migration built it,
    /// and takes the source's VM from `stream` ([`VmHandle::migrate`] on the other
    /// end): its memory, devices and vCPUs, checked as untrusted input. Returns the VM
    /// running here; on failure the source is told why (and keeps its VM).
    pub fn receive<S: Read + Write>(config: VmConfig, stream: &mut S) -> Result<VmHandle> {
        Self::receive_gated(config, stream, &|| Ok(()))
    }

    /// [`Vm::receive`], asking `gate` once the whole state is here and before any vCPU
    /// runs whether the VM may run here: its `Err` (the target's owner let go of the
    /// migration meanwhile) refuses it, and the source, told why, keeps its VM.
    pub fn receive_gated<S: Read + Write>(
        config: VmConfig,
        stream: &mut S,
        gate: &dyn Fn() -> std::result::Result<(), String>,
    ) -> Result<VmHandle> {
        let result = Self::receive_inner(config, stream, gate);
        let reply = match &result {
            Ok(_) => Reply::Running {
                released_at_ns: migration::monotonic_ns(),
            },
            Err(e) => Reply::Failed(e.to_string()),
        };
        match (result, wire::write_reply(stream, &reply)) {
            (Ok(handle), Ok(())) => Ok(handle),
            (Ok(handle), Err(e)) => {
                // The source does not learn that the VM runs here: it keeps its copy
                // paused (`MigrationError::OutcomeUnknown`), so this one is the only
                // one running, and goes on.
                tracing::warn!("the VM runs here; the source was not told: {e}");
                Ok(handle)
            }
            (Err(e), _) => Err(e),
        }
    }

    fn receive_inner<S: Read>(
        config: VmConfig,
        stream: &mut S,
        gate: &dyn Fn() -> std::result::Result<(), String>,
    ) -> Result<VmHandle> {
        let layout = layout(&config)?;
        migration::receive_header(stream, &layout)?;
        let (built, starting) = build(config, Boot::Incoming)?;
        let disks = built.platform.virtio.disks.clone();
        let incoming =
            match migration::receive(stream, &built.memory, &layout, &disks).and_then(|incoming| {
                gate().map_err(|why| MigrationError::State(format!("the target let go: {why}")))?;
                Ok(incoming)
            }) {
                Ok(incoming) => incoming,
                Err(e) => {
                    built.control.finish(VmExit::InternalError(e.to_string()));
                    starting.abort();
                    return Err(Error::Migration(e));
                }
            };
        let devices = built.platform.devices();
        let vm = built.vm.clone();
        let control = built.control.clone();
        let paused = incoming.paused;
        let threads = starting
            .release_restored(
                &built.control,
                built.platform.buses.clone(),
                incoming.vcpus,
                || {
                    incoming.vm_state.restore(&vm)?;
                    devices
                        .restore(&incoming.devices)
                        .map_err(|e| e.to_string())?;
                    if paused {
                        // Paused by its owner on the source: the vCPUs park at once,
                        // the devices' threads wait (as after `VmHandle::pause`).
                        control.request_pause();
                        devices.pause_virtio(true);
                    }
                    Ok(())
                },
            )
            .map_err(|e| Error::Migration(MigrationError::State(e)))?;
        Ok(built.into_handle(threads))
    }
}

/// Whether a new VM boots its kernel or waits for a migration's state.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Boot {
    Kernel,
    /// Nothing is loaded into memory: the source's memory comes instead.
    Incoming,
}

/// A VM whose vCPUs wait at their gate.
struct Built {
    control: Arc<Control>,
    sandbox: Arc<Sandbox>,
    vm: Arc<VmFd>,
    memory: GuestMemoryMmap,
    platform: Platform,
    vcpu_tids: VcpuTids,
    layout: wire::Layout,
}

impl Built {
    fn into_handle(self, threads: Vec<JoinHandle<()>>) -> VmHandle {
        let platform = self.platform;
        VmHandle {
            control: self.control,
            sandbox: self.sandbox,
            devices: platform.devices(),
            i8042: platform.i8042,
            acpi: platform.acpi,
            virtio: platform.virtio.transports,
            counters: platform.virtio.counters,
            boot_report: platform.boot_report,
            vcpu_tids: self.vcpu_tids,
            layout: self.layout,
            migrating: AtomicBool::new(false),
            handed_off: AtomicBool::new(false),
            threads: Mutex::new(threads),
            resources: Resources {
                _buses: platform.buses,
                vm: self.vm,
                memory: self.memory,
                _console: platform.console,
            },
        }
    }
}

/// Builds the VM (memory, devices, vCPUs set up on their threads) and, for
/// [`Boot::Kernel`], loads the kernel; the vCPUs wait at their gate.
fn build(config: VmConfig, boot: Boot) -> Result<(Built, StartingVcpus)> {
    validate(&config)?;
    let layout = layout(&config)?;
    // Asked on a thread of its own while the VM is created: the kernel
    // answers with a few hundred host CPUID instructions, each a trap to
    // the outer hypervisor when this host is itself a VM (0.3-0.5 ms here).
    let (profile, vcpu_count) = (config.cpu_profile, config.vcpus);
    let cpuid_policy = std::thread::Builder::new()
        .name("cpuid".into())
        .spawn(move || {
            let supported = kvm::supported_cpuid()?;
            let profile = profile.unwrap_or_else(CpuProfile::detect);
            let msrs: Arc<[u32]> = kvm::msrs_to_save()?.into();
            Ok::<_, kvm::Error>((CpuidPolicy::new(&supported, profile, vcpu_count), msrs))
        })
        .map_err(Error::Thread)?;
    crate::kick::install_handler().map_err(Error::KickHandler)?;
    let sandbox =
        Sandbox::new(config.sandbox.clone(), removable_dirs(&config)).map_err(Error::Sandbox)?;
    // A boot disk is read on a sandboxed thread of its own while the VM is created.
    let finding = match (&config.kernel, boot) {
        (KernelSource::Disk(disk), Boot::Kernel) => {
            Some(boot_disk::spawn(&config, *disk, &sandbox)?)
        }
        _ => None,
    };
    let (vm, memory) = kvm::create_vm(config.memory_mib << 20)?;
    let vm = Arc::new(vm);
    let control = Arc::new(Control::new(usize::from(config.vcpus)));
    let (cpuid, msr_indices) = cpuid_policy
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
            msr_indices: &msr_indices,
            restore_first: boot == Boot::Incoming,
        },
    )?;
    let platform = match build_platform(
        &config, boot, finding, &vm, &memory, &control, &sandbox, &cpuid,
    ) {
        Ok(platform) => platform,
        Err(e) => {
            starting.abort();
            return Err(e);
        }
    };
    let built = Built {
        control,
        sandbox,
        vm,
        memory,
        platform,
        vcpu_tids,
        layout,
    };
    Ok((built, starting))
}

/// What both sides of a migration must have alike: the target checks the source's.
fn layout(config: &VmConfig) -> Result<wire::Layout> {
    let mut devices = vec![
        format!("transport={:?}", config.transport).to_lowercase(),
        "com1,i8042,rtc,acpi-ged".to_string(),
    ];
    // A read-only disk is shared by both sides; a writable one is copied.
    devices.extend(config.disks.iter().map(|disk| {
        if disk.read_only {
            "virtio-blk(ro)".to_string()
        } else {
            "virtio-blk".to_string()
        }
    }));
    // What the guest read from a net device's configuration (each side has its own tap).
    devices.extend(config.nets.iter().enumerate().map(|(i, net)| {
        let mac = net
            .mac
            .unwrap_or_else(|| crate::devices::virtio::default_mac(i));
        format!(
            "virtio-net(mac={},mtu={},link={})",
            mac.map(|b| format!("{b:02x}")).join(":"),
            net.mtu.map_or("none".to_string(), |m| m.to_string()),
            if net.link_up { "up" } else { "down" }
        )
    }));
    if config.rng {
        devices.push("virtio-rng".into());
    }
    // The guest's CPU as it sees it: its XSAVE state and MSRs must fit the target's.
    devices.push(format!("cpu={:?}", config.cpu_profile).to_lowercase());
    Ok(wire::Layout {
        memory_bytes: config.memory_mib << 20,
        vcpus: config.vcpus,
        devices: devices.join(" "),
    })
}

/// The devices on their buses and the loaded kernel.
struct Platform {
    buses: Arc<Buses>,
    /// The kernel entry point (0 for an incoming VM).
    entry: u64,
    console: Console,
    i8042: Arc<Mutex<I8042>>,
    acpi: Arc<Mutex<AcpiPlatform>>,
    rtc: Arc<Mutex<Rtc>>,
    /// Whether the legacy PCI configuration ports exist (virtio-pci).
    pci_config: bool,
    virtio: crate::devices::virtio::Attached,
    /// The entry a boot disk gave.
    boot_report: Option<BootReport>,
}

impl Platform {
    fn devices(&self) -> Devices {
        Devices {
            serial: self.console.device.clone(),
            i8042: self.i8042.clone(),
            rtc: self.rtc.clone(),
            acpi: self.acpi.clone(),
            pci_config: self.pci_config,
            virtio: self.virtio.transports.clone(),
            disks: self.virtio.disks.clone(),
            buses: self.buses.clone(),
        }
    }
}

/// The devices' state, saved and restored for migration (in this order): the legacy
/// devices, the 0xCF8 latch, the virtio transports.
struct Devices {
    serial: Arc<Mutex<SerialDevice>>,
    i8042: Arc<Mutex<I8042>>,
    rtc: Arc<Mutex<Rtc>>,
    acpi: Arc<Mutex<AcpiPlatform>>,
    /// Whether the legacy PCI configuration ports exist (virtio-pci).
    pci_config: bool,
    virtio: Vec<VirtioTransport>,
    /// The disks, for the block copy (`migration::disks`).
    disks: Vec<std::sync::Weak<block::DirtyTracked>>,
    /// To reach the 0xCF8 latch and the functions' command registers as a CPU would.
    buses: Arc<Buses>,
}

impl Devices {
    fn save(&self, e: &mut Encoder) -> std::result::Result<(), String> {
        lock(&self.serial).save(e);
        lock(&self.i8042).save(e);
        lock(&self.rtc).save(e);
        lock(&self.acpi).save(e);
        if self.pci_config {
            // The latch reads back what the guest wrote, as a CPU would see it.
            let mut latch = [0u8; 4];
            self.buses.pio.read(CONFIG_PORTS, &mut latch);
            e.bytes(&latch);
        }
        virtio_state::save(&self.virtio, e)
    }

    fn restore(&self, payload: &[u8]) -> std::result::Result<(), FormatError> {
        let mut d = Decoder::new(payload, "the devices' state");
        lock(&self.serial).restore(&mut d)?;
        lock(&self.i8042).restore(&mut d)?;
        lock(&self.rtc).restore(&mut d)?;
        lock(&self.acpi).restore(&mut d)?;
        if self.pci_config {
            let latch: [u8; 4] = d.array()?;
            self.buses.pio.write(CONFIG_PORTS, &latch);
        }
        virtio_state::restore(&self.virtio, &mut d, &self.buses)?;
        d.finish()
    }

    /// Stops (or restarts) the virtio devices' threads touching guest memory.
    fn pause_virtio(&self, pause: bool) {
        for transport in &self.virtio {
            if pause {
                transport.pause();
            } else {
                transport.resume();
            }
        }
    }
}

/// Attaches the devices, writes the boot tables and loads the kernel (a boot disk's
/// once `finding` has it).
#[allow(clippy::too_many_arguments)]
fn build_platform(
    config: &VmConfig,
    boot: Boot,
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
    let rtc = Arc::new(Mutex::new(Rtc::new(config.rtc_offset_seconds)));
    pio.insert(RTC_PORT, RTC_PORT_LEN, rtc.clone())?;

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
    // An incoming VM's memory comes from the source, its kernel and tables with it.
    let (entry, boot_report) = match boot {
        Boot::Incoming => (0, None),
        Boot::Kernel => (
            load_kernel(config, memory, booted.as_ref(), &cmdline, cpuid)?,
            booted.map(|b| b.report),
        ),
    };
    Ok(Platform {
        buses: Arc::new(Buses { pio, mmio }),
        entry,
        console,
        i8042,
        acpi,
        rtc,
        pci_config: config.transport == VirtioTransportKind::Pci,
        virtio,
        boot_report,
    })
}

/// Writes the boot tables (page tables, MP table, ACPI, SMBIOS) and loads the kernel (a
/// boot disk's, once `booted` has it); returns its entry point.
fn load_kernel(
    config: &VmConfig,
    memory: &GuestMemoryMmap,
    booted: Option<&boot_disk::Booted>,
    cmdline: &Cmdline,
    cpuid: &CpuidPolicy,
) -> Result<u64> {
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
    let (kernel, initrd) = match booted {
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
    Ok(kvm::boot::load(memory, kernel, cmdline, initrd, rsdp)?
        .entry
        .0)
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
    vm: Arc<VmFd>,
    memory: GuestMemoryMmap,
    _console: Console,
}

/// A running VM. Methods may be called from any thread; dropping the
/// handle kills the VM if it is still running.
pub struct VmHandle {
    control: Arc<Control>,
    sandbox: Arc<Sandbox>,
    i8042: Arc<Mutex<I8042>>,
    acpi: Arc<Mutex<AcpiPlatform>>,
    /// The legacy devices whose state a migration moves.
    devices: Devices,
    virtio: Vec<VirtioTransport>,
    counters: DeviceCounters,
    boot_report: Option<BootReport>,
    vcpu_tids: VcpuTids,
    /// What a migration's target must have alike.
    layout: wire::Layout,
    /// A migration runs: no second one, no pause, resume or guest input meanwhile.
    migrating: AtomicBool,
    /// A migration's answer was lost after the state went out: the target may run the
    /// VM, so this one stays paused for good (it can still be killed).
    handed_off: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    resources: Resources,
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

    /// Moves the running VM to the VMM at the other end of `stream` (which called
    /// [`Vm::receive`] with the same configuration): see `crate::migration`. On success
    /// the VM runs there and ends here as [`VmExit::Migrated`]; on failure it goes on
    /// running here. `progress` shows the rounds and cancels from another thread.
    pub fn migrate<S: Read + Write>(
        &self,
        stream: &mut S,
        options: &MigrationOptions,
        progress: &MigrationProgress,
    ) -> std::result::Result<MigrationReport, MigrationError> {
        virtio_state::migratable(&self.virtio).map_err(MigrationError::NotMigratable)?;
        migration::disks::check_shared(&self.devices.disks, &options.shared_disks)?;
        if self.handed_off.load(Ordering::SeqCst) {
            return Err(MigrationError::OutcomeUnknown(
                "an earlier migration's answer was lost".into(),
            ));
        }
        if self
            .migrating
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return Err(MigrationError::InProgress);
        }
        let result = self.migrate_now(stream, options, progress);
        if matches!(result, Err(MigrationError::OutcomeUnknown(_))) {
            // The target may run the VM: this copy never runs again.
            self.handed_off.store(true, Ordering::SeqCst);
        }
        self.migrating.store(false, Ordering::SeqCst);
        result
    }

    fn migrate_now<S: Read + Write>(
        &self,
        stream: &mut S,
        options: &MigrationOptions,
        progress: &MigrationProgress,
    ) -> std::result::Result<MigrationReport, MigrationError> {
        let devices = &self.devices;
        let source = migration::Source {
            vm: &self.resources.vm,
            memory: &self.resources.memory,
            control: &self.control,
            layout: self.layout.clone(),
            save_devices: &|e| devices.save(e),
            pause_devices: &|pause| devices.pause_virtio(pause),
            disks: &devices.disks,
            shared_disks: &options.shared_disks,
            was_paused: self.control.state() == VmState::Paused,
        };
        migration::send(&source, stream, options, progress)
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

    /// The kernel thread ids of the vCPU threads, in vCPU order (0 for a thread that
    /// has not started or has ended): for pinning them, or checking their sandbox.
    pub fn vcpu_thread_ids(&self) -> Vec<i32> {
        self.vcpu_tids
            .iter()
            .map(|tid| tid.load(Ordering::Relaxed))
            .collect()
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

    /// The VM runs and no migration is moving it (pause, resume and guest input
    /// would change what is being saved).
    fn ensure_running(&self) -> Result<()> {
        if let Some(exit) = self.control.exit() {
            return Err(Error::Ended(exit));
        }
        if self.migrating.load(Ordering::SeqCst) {
            return Err(Error::Migrating);
        }
        if self.handed_off.load(Ordering::SeqCst) {
            return Err(Error::MaybeMigrated);
        }
        Ok(())
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
