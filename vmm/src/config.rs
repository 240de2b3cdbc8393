//! What a VM is made of: the library's input, filled by the CLI or the launcher.

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::sandbox::SandboxConfig;

/// Default kernel command line: a Linux guest logs to the 8250 console and
/// reboots (through the i8042) instead of halting, which ends the VM.
pub const DEFAULT_CMDLINE: &str = "console=ttyS0 reboot=k panic=1";
pub const DEFAULT_MEMORY_MIB: u64 = 128;
/// Upper bound on vCPUs: APIC ids must fit the 8-bit xAPIC id field and
/// CPUID leaf 1's logical-processor count.
pub const MAX_VCPUS: u8 = 254;

/// Where the kernel image comes from.
#[derive(Clone, Debug)]
pub enum KernelSource {
    Path(PathBuf),
    /// An image in memory (the embedded test guest, for example).
    Bytes(Arc<[u8]>),
    /// The entry the boot loader configuration on one of the VM's disks chooses (see
    /// `disk_boot`): its kernel, initrd and command line. [`VmConfig::initrd`] must be
    /// empty; [`VmConfig::cmdline`], if not, is appended to the entry's command line.
    Disk(BootDisk),
}

/// Which disk to boot, and the firmware the VM pretends to have (where its boot loader
/// is looked for first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BootDisk {
    /// An index into [`VmConfig::disks`].
    pub disk: usize,
    pub firmware: BootFirmware,
}

/// BIOS or EFI, for a boot disk (`disk_boot::Firmware`).
pub use disk_boot::Firmware as BootFirmware;

/// Disk image format (the `block` crate's). Always given explicitly: a
/// format is never guessed from the file's contents (a guest could write a
/// qcow2 header into a raw disk).
pub use block::Format as DiskFormat;

/// Where a disk's qcow2 backing file may come from (the `block` crate's).
pub use block::BackingPolicy as DiskBacking;

/// A disk file the caller opened once (the `block` crate's `OpenedFile`).
pub use block::OpenedFile as DiskFile;

/// A virtio-blk disk: the image and how the guest sees it.
#[derive(Clone, Debug)]
pub struct DiskConfig {
    pub path: PathBuf,
    pub format: DiskFormat,
    pub read_only: bool,
    pub cache: DiskCache,
    /// The disk's serial, the answer to `VIRTIO_BLK_T_GET_ID` (at most 20
    /// bytes are used; longer serials are cut, as QEMU does). Empty: the
    /// guest reads an all-zero ID, as from QEMU without a serial.
    pub serial: String,
    /// Whether the guest may free space: offers `VIRTIO_BLK_F_DISCARD` and
    /// honours the unmap hint of write-zeroes (libvirt's `discard=unmap`).
    /// Off (`discard=ignore`), the guest cannot discard and written zeroes
    /// are always allocated. Never offered on a read-only disk.
    pub discard: bool,
    /// Which backing file a qcow2 image may open (`block::BackingPolicy`).
    /// The default opens none: an image naming one is refused, since its
    /// name could point at any host file.
    pub backing: DiskBacking,
    /// The image, already opened by the caller: every open of the VM (devices, boot disk,
    /// each restart) goes through it, and `path` only names it. For files the caller
    /// looked up under its own rules (a PVC's, a host disk's), which must not be looked up
    /// by name again. A qcow2 image opened so resolves no relative backing name.
    pub file: Option<DiskFile>,
}

impl DiskConfig {
    /// A writable disk with the host page cache (writeback), no serial and
    /// discard allowed.
    pub fn new(path: impl Into<PathBuf>, format: DiskFormat) -> Self {
        DiskConfig {
            path: path.into(),
            format,
            read_only: false,
            cache: DiskCache::default(),
            serial: String::new(),
            discard: true,
            backing: DiskBacking::Forbid,
            file: None,
        }
    }

    /// The path the engines open: the opened file's, else `path`.
    pub(crate) fn open_path(&self) -> PathBuf {
        self.file
            .as_ref()
            .map_or_else(|| self.path.clone(), DiskFile::path)
    }
}

/// Host caching of a disk, as KubeVirt's `disk.cache` (libvirt's driver
/// cache attribute) names it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DiskCache {
    /// `O_DIRECT`: guest I/O bypasses the host page cache; guest flushes
    /// still reach the disk.
    None,
    /// Page cache, and every write is flushed before the guest sees it
    /// complete (the guest's own flushes change nothing).
    WriteThrough,
    /// Page cache; data is durable when the guest flushes.
    #[default]
    WriteBack,
}

impl DiskCache {
    /// The KubeVirt / libvirt name.
    pub fn name(self) -> &'static str {
        match self {
            DiskCache::None => "none",
            DiskCache::WriteThrough => "writethrough",
            DiskCache::WriteBack => "writeback",
        }
    }
}

impl std::str::FromStr for DiskCache {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(DiskCache::None),
            "writethrough" => Ok(DiskCache::WriteThrough),
            "writeback" => Ok(DiskCache::WriteBack),
            other => Err(format!(
                "unknown cache mode {other:?} (none, writethrough or writeback)"
            )),
        }
    }
}

/// A virtio-net device on a tap.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Name of an existing tap device (the VMM does not create it).
    pub tap: String,
    /// Guest MAC address; when absent, 52:54:00:12:34:(0x56 + device index).
    pub mac: Option<[u8; 6]>,
    /// The MTU the device tells the guest to use (`VIRTIO_NET_F_MTU`, as
    /// QEMU's `host_mtu`); `None`: not offered, the guest picks its own.
    pub mtu: Option<u16>,
    /// Whether the link is up at boot (`VIRTIO_NET_S_LINK_UP`). Down, the
    /// guest sees no carrier and no frame passes in either direction.
    pub link_up: bool,
}

impl NetConfig {
    /// A device on `tap` with the default MAC, no MTU offered, link up.
    pub fn new(tap: impl Into<String>) -> Self {
        NetConfig {
            tap: tap.into(),
            mac: None,
            mtu: None,
            link_up: true,
        }
    }
}

/// Where the guest's serial console goes.
#[derive(Clone, Debug, Default)]
pub enum SerialTarget {
    #[default]
    Stdout,
    /// Appended to a file (created if missing).
    File(PathBuf),
    /// A unix socket the VMM listens on; console clients attach to it, see
    /// the recent output and can type into the guest.
    UnixSocket(PathBuf),
    /// Kept in memory (tests and `vmm selftest`).
    Capture(SerialCapture),
    /// Discarded.
    Null,
}

/// How secondary vCPUs start. The boot vCPU always starts at the kernel
/// entry; the MP table lists every vCPU either way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ApStart {
    /// At the kernel entry in long mode, runnable at once, each with its own
    /// stack (Firecracker-style; the test guest tells them apart by APIC id).
    /// A Linux kernel cannot run this way.
    Direct,
    /// Waiting for INIT/SIPI from the boot vCPU, as on hardware: what a
    /// Linux kernel expects (the test guest handles it too).
    #[default]
    InitSipi,
}

/// How virtio devices reach the guest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VirtioTransportKind {
    /// virtio-pci (modern) behind a PCI host bridge with MSI-X: what stock
    /// distribution kernels find (the default).
    #[default]
    Pci,
    /// virtio-mmio windows announced on the kernel command line
    /// (`virtio_mmio.device=`): kernels built for microVMs (the test guest
    /// drives either transport).
    Mmio,
}

/// How a bzImage is booted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KernelDecompress {
    /// The VMM decompresses the payload and enters the kernel directly
    /// (64-bit boot protocol): no in-guest decompressor.
    #[default]
    Host,
    /// The image is loaded as it is and its own decompressor runs in the
    /// guest (slow where KVM emulates; kept for images without a payload).
    Guest,
}

/// The SMBIOS (DMI) tables the guest reads (`/sys/class/dmi/id`, `dmidecode`, cloud-init's
/// platform checks), as libvirt has QEMU write them for KubeVirt: the system record from
/// KubeVirt's cluster SMBIOS settings and the VMI's firmware UUID and serial, the chassis
/// from the VMI's `chassis`; the BIOS, processor and memory records from the VM itself.
/// Empty strings are left out of the tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Smbios {
    pub system: SmbiosSystem,
    pub chassis: SmbiosChassis,
}

/// SMBIOS type 1, System Information.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmbiosSystem {
    pub manufacturer: String,
    pub product: String,
    pub version: String,
    pub serial: String,
    /// The system UUID in its canonical byte order (as `uuid::Uuid::as_bytes`); the table
    /// stores its first three fields little-endian, as SMBIOS 2.6+ does. `None`: all zero.
    pub uuid: Option<[u8; 16]>,
    pub sku: String,
    pub family: String,
}

/// SMBIOS type 3, System Enclosure or Chassis.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SmbiosChassis {
    pub manufacturer: String,
    pub version: String,
    pub serial: String,
    pub asset: String,
    pub sku: String,
}

/// A complete VM description.
#[derive(Clone, Debug)]
pub struct VmConfig {
    pub kernel: KernelSource,
    pub initrd: Option<PathBuf>,
    pub cmdline: String,
    pub memory_mib: u64,
    pub vcpus: u8,
    pub disks: Vec<DiskConfig>,
    pub nets: Vec<NetConfig>,
    pub rng: bool,
    pub serial: SerialTarget,
    pub ap_start: ApStart,
    pub kernel_decompress: KernelDecompress,
    /// The guest's CPUID profile; `None` detects it (see
    /// [`CpuProfile::detect`]).
    pub cpu_profile: Option<CpuProfile>,
    pub transport: VirtioTransportKind,
    /// How the VMM's threads are confined (see [`crate::sandbox`]).
    pub sandbox: SandboxConfig,
    /// The SMBIOS tables' contents.
    pub smbios: Smbios,
    /// The CMOS real-time clock's offset from UTC at start, in seconds (KubeVirt's
    /// `clock.utc.offsetSeconds`; 0 keeps it on UTC, libvirt's default for KubeVirt).
    pub rtc_offset_seconds: i64,
}

impl VmConfig {
    /// A VM with defaults (128 MiB, one vCPU, serial on stdout) for this kernel; the
    /// default command line for a kernel given directly, none added to a boot disk's.
    pub fn new(kernel: KernelSource) -> Self {
        let cmdline = match kernel {
            KernelSource::Disk(_) => String::new(),
            _ => DEFAULT_CMDLINE.to_string(),
        };
        VmConfig {
            kernel,
            initrd: None,
            cmdline,
            memory_mib: DEFAULT_MEMORY_MIB,
            vcpus: 1,
            disks: Vec::new(),
            nets: Vec::new(),
            rng: false,
            serial: SerialTarget::default(),
            ap_start: ApStart::default(),
            kernel_decompress: KernelDecompress::default(),
            cpu_profile: None,
            transport: VirtioTransportKind::default(),
            sandbox: SandboxConfig::default(),
            smbios: Smbios::default(),
            rtc_offset_seconds: 0,
        }
    }
}

/// Parses `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(text: &str) -> Option<[u8; 6]> {
    let mut mac = [0u8; 6];
    let mut parts = text.split(':');
    for byte in mac.iter_mut() {
        let part = parts.next()?;
        if part.len() != 2 {
            return None;
        }
        *byte = u8::from_str_radix(part, 16).ok()?;
    }
    parts.next().is_none().then_some(mac)
}

/// Output kept in memory, shared by clones; tests wait on it.
#[derive(Clone, Default)]
pub struct SerialCapture {
    inner: Arc<(Mutex<Vec<u8>>, Condvar)>,
}

impl std::fmt::Debug for SerialCapture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SerialCapture({} bytes)", self.bytes().len())
    }
}

impl SerialCapture {
    /// The bytes, even after a panic of a thread holding them (a poisoned lock).
    fn bytes(&self) -> MutexGuard<'_, Vec<u8>> {
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn new() -> Self {
        Self::default()
    }

    /// Everything written so far.
    pub fn contents(&self) -> Vec<u8> {
        self.bytes().clone()
    }

    /// Everything written so far, as (lossy) text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.contents()).into_owned()
    }

    /// Waits until the output contains `needle`; returns whether it does.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut data = self.bytes();
        loop {
            if data
                .windows(needle.len().max(1))
                .any(|w| w == needle.as_bytes())
            {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            data = self
                .inner
                .1
                .wait_timeout(data, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// What the serial device writes (its only writer).
    pub(crate) fn append(&self, bytes: &[u8]) {
        self.bytes().extend_from_slice(bytes);
        self.inner.1.notify_all();
    }
}

/// Which instructions the guest may be offered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CpuProfile {
    /// Everything KVM supports (after the normalisation `kvm::cpuid` applies to every
    /// profile).
    Host,
    /// Also hide what an instruction-emulating KVM cannot execute.
    Emulated,
}

impl CpuProfile {
    /// `Emulated` where `/dev/kvm` is served by `kvm_pvm` (it emulates
    /// every guest instruction), `Host` elsewhere.
    pub(crate) fn detect() -> CpuProfile {
        if std::path::Path::new("/sys/module/kvm_pvm").exists() {
            CpuProfile::Emulated
        } else {
            CpuProfile::Host
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            CpuProfile::Host => "host",
            CpuProfile::Emulated => "emulated",
        }
    }
}

impl std::str::FromStr for CpuProfile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "host" => Ok(CpuProfile::Host),
            "emulated" => Ok(CpuProfile::Emulated),
            other => Err(format!("unknown CPU profile {other:?} (host or emulated)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The engines open an opened disk through its descriptor, never by its name: a name
    /// reused after the open does not change which file the VM gets.
    #[test]
    fn an_opened_disk_is_opened_through_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let name = dir.path().join("disk.img");
        std::fs::write(&name, vec![0x11; 4096]).unwrap();
        let mut disk = DiskConfig::new(&name, DiskFormat::Raw);
        assert_eq!(disk.open_path(), name);
        let fd = std::fs::File::open(&name).unwrap();
        disk.file = Some(DiskFile::new(fd.into(), &name));
        std::fs::rename(&name, dir.path().join("moved.img")).unwrap();
        std::fs::write(&name, vec![0x22; 4096]).unwrap();
        let engine = block::ConcurrentDisk::open(
            &disk.open_path(),
            disk.format,
            block::OpenOptions::default(),
        )
        .unwrap();
        let mut buf = [0u8; 512];
        engine.read_at(&mut buf, 0).unwrap();
        assert_eq!(buf, [0x11; 512]);
    }

    #[test]
    fn mac_addresses_parse_strictly() {
        assert_eq!(
            parse_mac("52:54:00:12:34:5f"),
            Some([0x52, 0x54, 0, 0x12, 0x34, 0x5f])
        );
        for bad in [
            "",
            "52:54:00:12:34",
            "52:54:00:12:34:56:78",
            "5:54:00:12:34:56",
            "zz:54:00:12:34:56",
            "525400123456",
        ] {
            assert_eq!(parse_mac(bad), None, "{bad:?}");
        }
    }
}
