//! Command-line parsing for the `vmm` command. Parsing only: every command
//! turns into library calls in main.rs.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use vmm::config::{
    ApStart, BootDisk, BootFirmware, CpuProfile, DiskBacking, DiskCache, DiskConfig, DiskFormat,
    KernelDecompress, KernelSource, NetConfig, SerialTarget, VirtioTransportKind, VmConfig,
    parse_mac,
};

#[derive(Debug, Parser)]
#[command(
    name = "vmm",
    version,
    about = "A KVM virtual machine monitor built on rust-vmm"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Boot a kernel, or without --kernel the entry the boot disk's own boot
    /// loader configuration chooses (GRUB, BLS, systemd-boot, extlinux), and run
    /// until the guest ends. Exit status: 0 after a guest reset, the guest's
    /// code after a write to port 0xf4, 125 after a guest crash, 126 on a VMM
    /// error (a disk with nothing to boot included).
    Run(RunArgs),
    /// Write the embedded test guest (an ELF kernel) to a file, or a bootable
    /// disk image holding it.
    TestGuest(TestGuestArgs),
    /// Boot the embedded test guest with one of each device and report
    /// PASS/FAIL per check. Exit status 0 only if every check passes.
    Selftest(SelftestArgs),
    /// Print the CPUID every vCPU of a VM would get (one line per leaf of
    /// vCPU 0, then the fields where other vCPUs differ) and the features
    /// the policy hides.
    Cpuid {
        #[arg(long, default_value_t = 1)]
        vcpus: u8,
        /// host or emulated (default: detected from the host's KVM).
        #[arg(long)]
        cpu_profile: Option<CpuProfile>,
    },
    /// Disk image tools (create, info, check, bench, io) over the `block`
    /// crate's engines, with qemu-img's and qemu-io's flags.
    #[command(subcommand)]
    Img(crate::img::ImgCommand),
}

#[derive(Debug, Args)]
pub(crate) struct TestGuestArgs {
    /// Where to write the guest's ELF image.
    #[arg(long, required_unless_present = "disk")]
    pub(crate) output: Option<PathBuf>,
    /// Write a raw disk image instead, laid out as a distribution's and booting
    /// the guest through its boot loader configuration.
    #[arg(long)]
    pub(crate) disk: Option<PathBuf>,
    /// The disk's layout: debian, ubuntu, fedora, alpine or systemd-boot.
    #[arg(long, default_value = "debian", requires = "disk", value_parser = parse_layout)]
    pub(crate) layout: test_guest::disks::Layout,
    /// The guest's command line in the boot entry (after `root=UUID=… ro`).
    #[arg(
        long,
        default_value = "console=ttyS0 checks=serial exit=poweroff",
        requires = "disk"
    )]
    pub(crate) cmdline: String,
}

fn parse_layout(text: &str) -> Result<test_guest::disks::Layout, String> {
    test_guest::disks::Layout::parse(text).ok_or_else(|| {
        format!("unknown layout {text:?} (debian, ubuntu, fedora, alpine or systemd-boot)")
    })
}

#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    /// Kernel image: ELF vmlinux or bzImage. Without it the VM boots from its
    /// disk: the first, or the one given with boot=on.
    #[arg(long)]
    pub(crate) kernel: Option<PathBuf>,
    /// The firmware a boot disk is booted as: `bios` (the bootable partition's
    /// boot loader) or `efi` (the EFI system partition's first).
    #[arg(long, default_value = "bios", value_parser = parse_firmware)]
    pub(crate) firmware: BootFirmware,
    /// Where a bzImage is decompressed: `host` (the VMM decompresses the
    /// payload and enters the kernel directly) or `guest` (the image's own
    /// decompressor runs in the guest).
    #[arg(long, default_value = "host", value_parser = parse_decompress)]
    pub(crate) decompress: KernelDecompress,
    /// How virtio devices reach the guest: `pci` (virtio-pci behind a PCI
    /// host bridge, with MSI-X; what stock kernels find) or `mmio`
    /// (virtio-mmio windows appended to the command line).
    #[arg(long, default_value = "pci", value_parser = parse_transport)]
    pub(crate) transport: VirtioTransportKind,
    /// Guest CPUID profile: host or emulated (default: detected; see `vmm cpuid`).
    #[arg(long)]
    pub(crate) cpu_profile: Option<CpuProfile>,
    #[arg(long, requires = "kernel")]
    pub(crate) initrd: Option<PathBuf>,
    /// Kernel command line (default with --kernel: `console=ttyS0 reboot=k
    /// panic=1`); when booting from a disk, appended to the entry's. The
    /// virtio-mmio devices are appended to it with `--transport mmio`.
    #[arg(long)]
    pub(crate) cmdline: Option<String>,
    /// Guest memory in MiB.
    #[arg(long, default_value_t = vmm::config::DEFAULT_MEMORY_MIB)]
    pub(crate) memory: u64,
    #[arg(long, default_value_t = 1)]
    pub(crate) vcpus: u8,
    /// A virtio-blk disk:
    /// path=PATH,format=raw|qcow2[,readonly=on|off][,cache=none|writethrough|writeback]
    /// [,serial=ID][,discard=unmap|ignore]
    /// [,backing=none|follow | ,backing-dir=DIR,backing-format=raw|qcow2][,boot=on].
    /// Repeatable. cache defaults to writeback, discard to unmap; without a
    /// serial the guest reads an all-zero ID. A qcow2 image may open a
    /// backing file only when asked: `follow` takes the names the images
    /// record (as QEMU), `backing-dir` only a file inside DIR, of that
    /// format, without one of its own. boot=on: the disk to boot without
    /// --kernel (default the first).
    #[arg(long, value_parser = parse_disk_arg)]
    pub(crate) disk: Vec<DiskArg>,
    /// A virtio-net device on an existing tap: tap=NAME[,mac=MAC]. Repeatable.
    #[arg(long, value_parser = parse_net)]
    pub(crate) net: Vec<NetConfig>,
    /// Add a virtio-rng device.
    #[arg(long)]
    pub(crate) rng: bool,
    /// How secondary vCPUs start: `init-sipi` (waiting for the guest to
    /// start them, as Linux does) or `direct` (at the kernel entry, runnable
    /// at once).
    #[arg(long, default_value = "init-sipi", value_parser = parse_ap_start)]
    pub(crate) ap_start: ApStart,
    /// Serial console: stdout, file:PATH or unix:PATH.
    #[arg(long, default_value = "stdout", value_parser = parse_serial)]
    pub(crate) serial: SerialTarget,
    /// Seconds a guest gets to shut down after SIGTERM/SIGINT before the VM is
    /// stopped (as KubeVirt's grace period bounds its launcher's); 0 stops it at once.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    pub(crate) shutdown_timeout: u64,
    /// What a VMM thread's system call outside its seccomp filter does:
    /// `trap` ends the VMM with status 159, `log` lets it through and the
    /// kernel logs it, `none` installs no filter (debugging only).
    #[arg(long, default_value = "trap", value_name = "none|log|trap")]
    pub(crate) seccomp: vmm::SeccompMode,
    /// Restrict the VMM threads' file access with Landlock where the kernel
    /// has it.
    #[arg(
        long,
        default_value = "on",
        value_parser = parse_on_off,
        action = clap::ArgAction::Set,
        value_name = "on|off"
    )]
    pub(crate) landlock: bool,
}

/// A `--disk`: the disk, and whether it is the one to boot.
#[derive(Clone, Debug)]
pub(crate) struct DiskArg {
    pub(crate) config: DiskConfig,
    pub(crate) boot: bool,
}

impl RunArgs {
    pub(crate) fn into_config(self) -> Result<VmConfig, String> {
        let boots: Vec<usize> = (0..self.disk.len())
            .filter(|&i| self.disk[i].boot)
            .collect();
        let kernel = match (self.kernel, boots.as_slice()) {
            (Some(_), [_, ..]) => {
                return Err("boot=on is for booting from a disk: not with --kernel".into());
            }
            (Some(kernel), []) => KernelSource::Path(kernel),
            (None, [_, _, ..]) => return Err("only one disk may have boot=on".into()),
            (None, []) if self.disk.is_empty() => {
                return Err("nothing to boot: give --kernel, or a --disk to boot from".into());
            }
            (None, boots) => KernelSource::Disk(BootDisk {
                disk: boots.first().copied().unwrap_or(0),
                firmware: self.firmware,
            }),
        };
        let cmdline = match (&kernel, self.cmdline) {
            (_, Some(cmdline)) => cmdline,
            (KernelSource::Disk(_), None) => String::new(),
            (_, None) => vmm::config::DEFAULT_CMDLINE.to_string(),
        };
        Ok(VmConfig {
            kernel,
            initrd: self.initrd,
            cmdline,
            memory_mib: self.memory,
            vcpus: self.vcpus,
            disks: self.disk.into_iter().map(|d| d.config).collect(),
            nets: self.net,
            rng: self.rng,
            serial: self.serial,
            ap_start: self.ap_start,
            kernel_decompress: self.decompress,
            cpu_profile: self.cpu_profile,
            transport: self.transport,
            sandbox: vmm::SandboxConfig {
                seccomp: self.seccomp,
                landlock: self.landlock,
                ..vmm::SandboxConfig::default()
            },
            smbios: vmm::Smbios::default(),
            rtc_offset_seconds: 0,
        })
    }
}

pub(crate) fn parse_firmware(text: &str) -> Result<BootFirmware, String> {
    match text {
        "bios" => Ok(BootFirmware::Bios),
        "efi" => Ok(BootFirmware::Efi),
        _ => Err(format!("expected bios or efi, got {text:?}")),
    }
}

/// A `--disk` with the `boot=on|off` option taken out.
pub(crate) fn parse_disk_arg(text: &str) -> Result<DiskArg, String> {
    let mut boot = false;
    let mut rest = Vec::new();
    for pair in text.split(',') {
        match pair.split_once('=') {
            Some(("boot", value)) => boot = on_off("boot", value)?,
            _ => rest.push(pair),
        }
    }
    Ok(DiskArg {
        config: parse_disk(&rest.join(","))?,
        boot,
    })
}

fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("expected on or off, got {other:?}")),
    }
}

#[derive(Debug, Args)]
pub(crate) struct SelftestArgs {
    /// vCPUs for the test guest.
    #[arg(long, default_value_t = 2)]
    pub(crate) vcpus: u8,
    /// Print the guest's serial output as well.
    #[arg(long)]
    pub(crate) verbose: bool,
    /// As for `run`: what a VMM thread's system call outside its filter does.
    #[arg(long, default_value = "trap", value_name = "none|log|trap")]
    pub(crate) seccomp: vmm::SeccompMode,
}

/// `key=value` pairs separated by commas.
fn pairs(text: &str) -> Result<Vec<(&str, &str)>, String> {
    text.split(',')
        .map(|pair| {
            pair.split_once('=')
                .ok_or_else(|| format!("expected key=value, got {pair:?}"))
        })
        .collect()
}

fn on_off(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{key} must be on or off, got {value:?}")),
    }
}

pub(crate) fn parse_disk(text: &str) -> Result<DiskConfig, String> {
    let (mut path, mut format, mut read_only) = (None, None, false);
    let mut cache = DiskCache::default();
    let (mut serial, mut discard) = (String::new(), true);
    let (mut backing, mut backing_dir, mut backing_format) = (None, None, None);
    for (key, value) in pairs(text)? {
        match key {
            "path" if !value.is_empty() => path = Some(PathBuf::from(value)),
            "format" => {
                format = Some(
                    value
                        .parse::<DiskFormat>()
                        .map_err(|_| format!("unknown disk format {value:?} (raw or qcow2)"))?,
                )
            }
            "readonly" => read_only = on_off(key, value)?,
            "cache" => cache = value.parse()?,
            "serial" => serial = value.to_string(),
            "discard" => {
                discard = match value {
                    "unmap" => true,
                    "ignore" => false,
                    _ => return Err(format!("discard must be unmap or ignore, got {value:?}")),
                }
            }
            "backing" => {
                backing = Some(match value {
                    "none" => DiskBacking::Forbid,
                    "follow" => DiskBacking::FollowImage,
                    _ => return Err(format!("backing must be none or follow, got {value:?}")),
                })
            }
            "backing-dir" if !value.is_empty() => backing_dir = Some(PathBuf::from(value)),
            "backing-format" => {
                backing_format = Some(
                    value
                        .parse::<DiskFormat>()
                        .map_err(|_| format!("unknown backing format {value:?} (raw or qcow2)"))?,
                )
            }
            _ => return Err(format!("unknown or empty disk option {key:?}")),
        }
    }
    Ok(DiskConfig {
        path: path.ok_or("a disk needs path=PATH")?,
        // Never guessed from the file: a guest could have written any header.
        format: format.ok_or("a disk needs format=raw|qcow2 (it is never guessed)")?,
        read_only,
        cache,
        serial,
        discard,
        backing: match (backing, backing_dir, backing_format) {
            (backing, None, None) => backing.unwrap_or_default(),
            (None, Some(dir), Some(format)) => DiskBacking::Within { dir, format },
            _ => {
                return Err(
                    "backing-dir and backing-format go together, and not with backing=".into(),
                );
            }
        },
        file: None,
    })
}

pub(crate) fn parse_net(text: &str) -> Result<NetConfig, String> {
    let (mut tap, mut mac) = (None, None);
    for (key, value) in pairs(text)? {
        match key {
            "tap" if !value.is_empty() && value.len() < libc::IFNAMSIZ => {
                tap = Some(value.to_string())
            }
            "tap" => return Err(format!("invalid tap name {value:?}")),
            "mac" => {
                mac =
                    Some(parse_mac(value).ok_or_else(|| format!("invalid MAC address {value:?}"))?)
            }
            _ => return Err(format!("unknown net option {key:?}")),
        }
    }
    Ok(NetConfig {
        mac,
        ..NetConfig::new(tap.ok_or("a net device needs tap=NAME")?)
    })
}

pub(crate) fn parse_transport(text: &str) -> Result<VirtioTransportKind, String> {
    match text {
        "pci" => Ok(VirtioTransportKind::Pci),
        "mmio" => Ok(VirtioTransportKind::Mmio),
        _ => Err(format!("expected pci or mmio, got {text:?}")),
    }
}

pub(crate) fn parse_decompress(text: &str) -> Result<KernelDecompress, String> {
    match text {
        "host" => Ok(KernelDecompress::Host),
        "guest" => Ok(KernelDecompress::Guest),
        _ => Err(format!("expected host or guest, got {text:?}")),
    }
}

pub(crate) fn parse_ap_start(text: &str) -> Result<ApStart, String> {
    match text {
        "direct" => Ok(ApStart::Direct),
        "init-sipi" => Ok(ApStart::InitSipi),
        _ => Err(format!("expected direct or init-sipi, got {text:?}")),
    }
}

pub(crate) fn parse_serial(text: &str) -> Result<SerialTarget, String> {
    match text.split_once(':') {
        _ if text == "stdout" => Ok(SerialTarget::Stdout),
        _ if text == "null" => Ok(SerialTarget::Null),
        Some(("file", path)) if !path.is_empty() => Ok(SerialTarget::File(path.into())),
        Some(("unix", path)) if !path.is_empty() => Ok(SerialTarget::UnixSocket(path.into())),
        _ => Err(format!(
            "serial must be stdout, null, file:PATH or unix:PATH, got {text:?}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_args(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut args = vec!["vmm", "run", "--kernel", "/k"];
        args.extend_from_slice(extra);
        match Cli::try_parse_from(args)?.command {
            Command::Run(run) => Ok(run),
            other => panic!("not a run: {other:?}"),
        }
    }

    #[test]
    fn the_sandbox_is_on_unless_asked_otherwise() {
        let config = run_args(&[]).unwrap().into_config().unwrap();
        assert_eq!(config.sandbox.seccomp, vmm::SeccompMode::Trap);
        assert!(config.sandbox.landlock);
        let config = run_args(&["--seccomp", "log", "--landlock", "off"])
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(config.sandbox.seccomp, vmm::SeccompMode::Log);
        assert!(!config.sandbox.landlock);
        let config = run_args(&["--seccomp=none", "--landlock=on"])
            .unwrap()
            .into_config()
            .unwrap();
        assert_eq!(config.sandbox.seccomp, vmm::SeccompMode::None);
        assert!(config.sandbox.landlock);
        for bad in [
            &["--seccomp", "kill"][..],
            &["--landlock", "maybe"],
            &["--landlock"],
        ] {
            assert!(run_args(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn disks_need_an_explicit_format() {
        let d = parse_disk("path=/a b,format=qcow2,readonly=on").unwrap();
        assert_eq!(
            (d.path, d.format, d.read_only),
            (PathBuf::from("/a b"), DiskFormat::Qcow2, true)
        );
        assert!(!parse_disk("path=/x,format=raw").unwrap().read_only);
        assert_eq!(
            parse_disk("path=/x,format=raw").unwrap().cache,
            DiskCache::WriteBack
        );
        for (text, cache) in [
            ("none", DiskCache::None),
            ("writethrough", DiskCache::WriteThrough),
            ("writeback", DiskCache::WriteBack),
        ] {
            let d = parse_disk(&format!("path=/x,format=raw,cache={text}")).unwrap();
            assert_eq!(d.cache, cache);
        }
        let d = parse_disk("path=/x,format=raw,serial=D1,discard=ignore").unwrap();
        assert_eq!((d.serial.as_str(), d.discard), ("D1", false));
        let d = parse_disk("path=/x,format=raw").unwrap();
        assert_eq!((d.serial.as_str(), d.discard), ("", true));
        // No backing file unless asked for.
        assert_eq!(d.backing, DiskBacking::Forbid);
        let d = parse_disk("path=/x,format=qcow2,backing=follow").unwrap();
        assert_eq!(d.backing, DiskBacking::FollowImage);
        let d = parse_disk("path=/x,format=qcow2,backing-dir=/b,backing-format=raw").unwrap();
        assert_eq!(
            d.backing,
            DiskBacking::Within {
                dir: PathBuf::from("/b"),
                format: DiskFormat::Raw
            }
        );
        for bad in [
            "path=/x",
            "format=raw",
            "path=/x,format=vmdk",
            "path=/x,format=raw,readonly=maybe",
            "path=,format=raw",
            "path=/x,format=raw,cache=unsafe",
            "path=/x,format=raw,cache=",
            "path=/x,format=raw,discard=maybe",
            "path=/x,format=qcow2,backing=yes",
            "path=/x,format=qcow2,backing-dir=/b",
            "path=/x,format=qcow2,backing-format=raw",
            "path=/x,format=qcow2,backing=follow,backing-dir=/b,backing-format=raw",
            "path=/x,format=qcow2,backing-dir=/b,backing-format=vmdk",
            "junk",
        ] {
            assert!(parse_disk(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn nets_take_a_tap_and_an_optional_mac() {
        let n = parse_net("tap=tap0,mac=52:54:00:00:00:01").unwrap();
        assert_eq!(
            (n.tap.as_str(), n.mac),
            ("tap0", Some([0x52, 0x54, 0, 0, 0, 1]))
        );
        assert_eq!(parse_net("tap=t").unwrap().mac, None);
        for bad in [
            "mac=52:54:00:00:00:01",
            "tap=",
            "tap=aaaaaaaaaaaaaaaaaaaa",
            "tap=t,mac=xx",
            "tap=t,queues=2",
        ] {
            assert!(parse_net(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn serial_targets() {
        assert!(matches!(parse_serial("stdout"), Ok(SerialTarget::Stdout)));
        assert!(
            matches!(parse_serial("file:/tmp/x"), Ok(SerialTarget::File(p)) if p == std::path::Path::new("/tmp/x"))
        );
        assert!(matches!(
            parse_serial("unix:/tmp/s"),
            Ok(SerialTarget::UnixSocket(_))
        ));
        for bad in ["", "file:", "tcp:1", "stderr"] {
            assert!(parse_serial(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn run_arguments_become_a_config() {
        let cli = Cli::try_parse_from([
            "vmm",
            "run",
            "--kernel",
            "/k",
            "--memory",
            "256",
            "--vcpus",
            "2",
            "--disk",
            "path=/d,format=raw",
            "--rng",
            "--serial",
            "file:/s",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else {
            panic!("not run")
        };
        let config = args.into_config().unwrap();
        assert_eq!(
            (
                config.memory_mib,
                config.vcpus,
                config.disks.len(),
                config.rng
            ),
            (256, 2, 1, true)
        );
        assert!(Cli::try_parse_from(["vmm", "run", "--kernel", "/k", "--vcpus", "300"]).is_err());
    }

    fn config_of(args: &[&str]) -> Result<VmConfig, String> {
        let mut all = vec!["vmm", "run"];
        all.extend_from_slice(args);
        match Cli::try_parse_from(all).map_err(|e| e.to_string())?.command {
            Command::Run(run) => run.into_config(),
            other => panic!("not a run: {other:?}"),
        }
    }

    #[test]
    fn without_a_kernel_the_first_disk_or_the_one_marked_boots() {
        let config = config_of(&[
            "--disk",
            "path=/a,format=raw",
            "--disk",
            "path=/b,format=qcow2",
        ])
        .unwrap();
        assert!(matches!(
            config.kernel,
            KernelSource::Disk(BootDisk {
                disk: 0,
                firmware: BootFirmware::Bios
            })
        ));
        assert_eq!(config.cmdline, "");
        let config = config_of(&[
            "--disk",
            "path=/a,format=raw",
            "--disk",
            "path=/b,format=qcow2,boot=on",
            "--firmware",
            "efi",
            "--cmdline",
            "extra=1",
        ])
        .unwrap();
        assert!(matches!(
            config.kernel,
            KernelSource::Disk(BootDisk {
                disk: 1,
                firmware: BootFirmware::Efi
            })
        ));
        assert_eq!(config.cmdline, "extra=1");
        assert_eq!(config.disks[1].path, PathBuf::from("/b"));
        let config = config_of(&["--kernel", "/k"]).unwrap();
        assert_eq!(config.cmdline, vmm::config::DEFAULT_CMDLINE);
        for bad in [
            &[][..],
            &["--firmware", "uefi", "--disk", "path=/a,format=raw"],
            &[
                "--disk",
                "path=/a,format=raw,boot=on",
                "--disk",
                "path=/b,format=raw,boot=on",
            ],
            &["--kernel", "/k", "--disk", "path=/a,format=raw,boot=on"],
            &["--initrd", "/i", "--disk", "path=/a,format=raw"],
            &["--disk", "path=/a,format=raw,boot=maybe"],
        ] {
            assert!(config_of(bad).is_err(), "{bad:?}");
        }
    }
}
