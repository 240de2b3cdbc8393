//! Bootable disk images laid out as distributions ship them, holding a kernel of the
//! caller's (the test guest, or Debian's stock kernel): for the boot-from-disk tests and
//! the project's test disk image (`vmm test-guest --disk`).
//!
//! Made with the system's own tools, as a distribution's image build does: `sgdisk` and
//! `sfdisk` for the partition tables, `mkfs.ext4 -d` (filled without mounting),
//! `mkfs.vfat` with `mmd`/`mcopy` for EFI system partitions, `mkfs.btrfs`/`mkfs.xfs` for
//! root filesystems a boot loader does not read (Debian packages `gdisk`, `fdisk`,
//! `e2fsprogs`, `dosfstools`, `mtools`, `btrfs-progs`, `xfsprogs`). The configurations are
//! written as `update-grub`, `grub2-mkconfig`, `kernel-install` and Alpine's
//! `update-extlinux` write them (their logic kept, themes and fonts left out).

use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The kernel a disk boots.
#[derive(Clone, Copy, Debug)]
pub struct Kernel<'a> {
    /// An ELF `vmlinux` or a bzImage.
    pub image: &'a [u8],
    pub initrd: Option<&'a [u8]>,
    /// The command line the boot entry gives it (`root=UUID=…` is added before it).
    pub cmdline: &'a str,
}

/// How the disk is laid out and which boot loader configuration it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// GPT: a BIOS boot partition, an EFI system partition with Debian's GRUB stub
    /// (`/EFI/debian/grub.cfg`), and an ext4 root with `/boot/grub/grub.cfg` as
    /// `update-grub` writes it (default entry, and the advanced submenu).
    Debian,
    /// GPT: an EFI system partition whose `/EFI/ubuntu/grub.cfg` finds the root filesystem
    /// with `search.fs_uuid` and chains to its `/boot/grub/grub.cfg` (Ubuntu's).
    Ubuntu,
    /// GPT: an EFI system partition with Fedora's stub, an ext4 `/boot` with
    /// `grub2/grub.cfg` (`blscfg`), two BLS entries and a `grubenv` whose `saved_entry`
    /// names the older one, and a btrfs root (which no boot loader reads).
    Fedora,
    /// MBR: one active ext4 partition with `/boot/extlinux.conf` (Alpine's).
    Alpine,
    /// GPT: an EFI system partition with systemd-boot's `loader.conf` and entries.
    SystemdBoot,
}

impl Layout {
    pub const ALL: [Layout; 5] = [
        Layout::Debian,
        Layout::Ubuntu,
        Layout::Fedora,
        Layout::Alpine,
        Layout::SystemdBoot,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Layout::Debian => "debian",
            Layout::Ubuntu => "ubuntu",
            Layout::Fedora => "fedora",
            Layout::Alpine => "alpine",
            Layout::SystemdBoot => "systemd-boot",
        }
    }

    pub fn parse(name: &str) -> Option<Layout> {
        Layout::ALL.into_iter().find(|l| l.name() == name)
    }
}

/// What was written where.
#[derive(Clone, Debug)]
pub struct Built {
    /// The partition number the kernel is on.
    pub kernel_partition: u32,
    /// The kernel's path on that partition's filesystem.
    pub kernel_path: String,
    pub initrd_path: Option<String>,
    /// The UUID of the root filesystem (`root=UUID=` on the command line).
    pub root_uuid: String,
    /// The command line the entry passes, as the boot loader would pass it.
    pub cmdline: String,
}

/// A filesystem type the builder can make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Ext4,
    Vfat,
    Btrfs,
    Xfs,
}

/// A filesystem image and what goes in it.
#[derive(Clone, Debug)]
pub struct Filesystem {
    pub kind: FsKind,
    pub label: String,
    /// ext4/btrfs/xfs: a UUID; vfat: the volume id as 8 hex digits.
    pub uuid: String,
    pub size_mib: u64,
    /// (path, contents).
    pub files: Vec<(String, Vec<u8>)>,
    /// (path, target): ext4 only.
    pub symlinks: Vec<(String, String)>,
}

impl Filesystem {
    pub fn new(kind: FsKind, label: &str, uuid: &str, size_mib: u64) -> Self {
        Filesystem {
            kind,
            label: label.into(),
            uuid: uuid.into(),
            size_mib,
            files: Vec::new(),
            symlinks: Vec::new(),
        }
    }

    pub fn file(mut self, path: &str, contents: impl Into<Vec<u8>>) -> Self {
        self.files.push((path.into(), contents.into()));
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        self.symlinks.push((path.into(), target.into()));
        self
    }
}

/// A GPT partition: an `sgdisk` type code (`EF00` ESP, `EF02` BIOS boot, `8300` Linux,
/// `EA00` XBOOTLDR) and what it holds.
#[derive(Clone, Debug)]
pub struct GptPartition {
    pub code: &'static str,
    pub name: &'static str,
    pub size_mib: u64,
    pub legacy_bootable: bool,
    pub content: Option<Filesystem>,
}

/// An MBR partition: a type byte and what it holds.
#[derive(Clone, Debug)]
pub struct MbrPartition {
    pub type_byte: u8,
    pub size_mib: u64,
    pub active: bool,
    pub content: Option<Filesystem>,
}

fn run(command: &mut Command) -> io::Result<String> {
    let program = command.get_program().to_string_lossy().into_owned();
    let out = command.output().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{program}: {e} (Debian packages gdisk, fdisk, e2fsprogs, dosfstools, mtools, btrfs-progs, xfsprogs)"),
        )
    })?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "{program} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `mkfs.*` and `/sbin` are not on every user's PATH.
fn tool(name: &str) -> Command {
    for dir in ["/usr/sbin", "/sbin", "/usr/bin"] {
        let path = Path::new(dir).join(name);
        if path.exists() {
            return Command::new(path);
        }
    }
    Command::new(name)
}

/// Writes `fs` as an image file at `image`.
pub fn make_filesystem(fs: &Filesystem, image: &Path) -> io::Result<()> {
    let _ = std::fs::remove_file(image);
    match fs.kind {
        FsKind::Ext4 => {
            let tree = tempfile::tempdir()?;
            for (path, contents) in &fs.files {
                let at = tree.path().join(path.trim_start_matches('/'));
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::fs::write(at, contents)?;
            }
            for (path, target) in &fs.symlinks {
                let at = tree.path().join(path.trim_start_matches('/'));
                if let Some(parent) = at.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                std::os::unix::fs::symlink(target, at)?;
            }
            run(tool("mkfs.ext4")
                .args([
                    "-q",
                    "-F",
                    "-U",
                    &fs.uuid,
                    "-L",
                    &fs.label,
                    "-E",
                    "root_owner=0:0",
                    "-d",
                ])
                .arg(tree.path())
                .arg(image)
                .arg(format!("{}M", fs.size_mib)))?;
        }
        FsKind::Vfat => {
            run(tool("mkfs.vfat")
                .args(["-C", "-n", &fs.label, "-i", &fs.uuid])
                .arg(image)
                .arg((fs.size_mib * 1024).to_string()))?;
            let mut dirs: Vec<String> = Vec::new();
            for (path, _) in &fs.files {
                let mut at = String::new();
                let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                for part in &parts[..parts.len().saturating_sub(1)] {
                    at = format!("{at}/{part}");
                    if !dirs.contains(&at) {
                        dirs.push(at.clone());
                    }
                }
            }
            for dir in &dirs {
                run(Command::new("mmd")
                    .env("MTOOLS_SKIP_CHECK", "1")
                    .arg("-i")
                    .arg(image)
                    .arg(format!("::{dir}")))?;
            }
            let staging = tempfile::tempdir()?;
            for (i, (path, contents)) in fs.files.iter().enumerate() {
                let local = staging.path().join(i.to_string());
                std::fs::write(&local, contents)?;
                run(Command::new("mcopy")
                    .env("MTOOLS_SKIP_CHECK", "1")
                    .arg("-i")
                    .arg(image)
                    .arg(&local)
                    .arg(format!("::{path}")))?;
            }
        }
        FsKind::Btrfs => {
            std::fs::File::create(image)?.set_len(fs.size_mib << 20)?;
            run(tool("mkfs.btrfs")
                .args(["-q", "-f", "-L", &fs.label, "-U", &fs.uuid])
                .arg(image))?;
        }
        FsKind::Xfs => {
            std::fs::File::create(image)?.set_len(fs.size_mib << 20)?;
            run(tool("mkfs.xfs")
                .args([
                    "-q",
                    "-f",
                    "-L",
                    &fs.label,
                    "-m",
                    &format!("uuid={}", fs.uuid),
                ])
                .arg(image))?;
        }
    }
    Ok(())
}

/// Copies `image` into `disk` at byte `offset`, leaving zero runs as holes.
fn copy_into(disk: &Path, image: &Path, offset: u64) -> io::Result<()> {
    let mut from = std::fs::File::open(image)?;
    let mut to = std::fs::OpenOptions::new().write(true).open(disk)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = offset;
    loop {
        let n = from.read(&mut buf)?;
        if n == 0 {
            break;
        }
        if buf[..n].iter().any(|&b| b != 0) {
            to.seek(SeekFrom::Start(at))?;
            to.write_all(&buf[..n])?;
        }
        at += n as u64;
    }
    Ok(())
}

/// Sectors before the first partition (1 MiB, as every partitioning tool aligns).
const FIRST: u64 = 2048;

/// Writes a GPT disk at `path`: partitions in order from 1 MiB, each filled with its
/// filesystem. Returns each partition's byte offset.
pub fn gpt_disk(path: &Path, partitions: &[GptPartition]) -> io::Result<Vec<u64>> {
    let total: u64 = partitions.iter().map(|p| p.size_mib).sum::<u64>() + 2;
    let _ = std::fs::remove_file(path);
    std::fs::File::create(path)?.set_len(total << 20)?;
    let mut sgdisk = tool("sgdisk");
    sgdisk.arg("-o");
    let mut start = FIRST;
    let mut offsets = Vec::new();
    for (i, p) in partitions.iter().enumerate() {
        let n = i + 1;
        let end = start + (p.size_mib << 11) - 1;
        sgdisk
            .arg(format!("-n{n}:{start}:{end}"))
            .arg(format!("-t{n}:{}", p.code))
            .arg(format!("-c{n}:{}", p.name));
        if p.legacy_bootable {
            sgdisk.arg(format!("-A{n}:set:2"));
        }
        offsets.push(start * 512);
        start = end + 1;
    }
    run(sgdisk.arg(path))?;
    fill(
        path,
        partitions.iter().map(|p| p.content.as_ref()),
        &offsets,
    )?;
    Ok(offsets)
}

fn fill<'a>(
    disk: &Path,
    contents: impl Iterator<Item = Option<&'a Filesystem>>,
    offsets: &[u64],
) -> io::Result<()> {
    let staging = tempfile::tempdir()?;
    for (i, (fs, offset)) in contents.zip(offsets).enumerate() {
        if let Some(fs) = fs {
            let image = staging.path().join(format!("part{i}.img"));
            make_filesystem(fs, &image)?;
            copy_into(disk, &image, *offset)?;
        }
    }
    Ok(())
}

/// Writes an MBR disk: primary partitions, then (if any) an extended partition holding
/// the logical ones (numbered from 5). Returns the byte offsets of all, primary first.
pub fn mbr_disk(
    path: &Path,
    primary: &[MbrPartition],
    logical: &[MbrPartition],
) -> io::Result<Vec<u64>> {
    let sizes: u64 = primary.iter().chain(logical).map(|p| p.size_mib + 1).sum();
    let _ = std::fs::remove_file(path);
    std::fs::File::create(path)?.set_len((sizes + 2) << 20)?;
    let mut script = String::from("label: dos\n");
    let line = |p: &MbrPartition| {
        format!(
            "size={}MiB, type={:x}{}\n",
            p.size_mib,
            p.type_byte,
            if p.active { ", bootable" } else { "" }
        )
    };
    for p in primary {
        script.push_str(&line(p));
    }
    if !logical.is_empty() {
        script.push_str("type=5\n");
        for p in logical {
            script.push_str(&line(p));
        }
    }
    let mut child = tool("sfdisk")
        .args(["-q", "--no-reread", "--no-tell-kernel"])
        .arg(path)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| io::Error::other("sfdisk stdin"))?
        .write_all(script.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "sfdisk failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    // Where sfdisk put each partition: `<disk>N : start= S, size= Z, type=T`.
    let dump = run(tool("sfdisk").arg("-d").arg(path))?;
    let mut offsets = Vec::new();
    for line in dump.lines().filter(|l| l.contains("start=")) {
        let start: u64 = line
            .split("start=")
            .nth(1)
            .and_then(|s| s.split(',').next())
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| io::Error::other(format!("sfdisk -d: {line}")))?;
        let kind = line.split("type=").nth(1).unwrap_or("").trim();
        if kind.starts_with('5') && kind.len() == 1 {
            continue; // the extended partition itself
        }
        offsets.push(start * 512);
    }
    let contents = primary.iter().chain(logical).map(|p| p.content.as_ref());
    fill(path, contents, &offsets)?;
    Ok(offsets)
}

/// Writes a disk without a partition table: one filesystem from byte 0.
pub fn whole_disk(path: &Path, fs: &Filesystem) -> io::Result<()> {
    make_filesystem(fs, path)
}

const ROOT_UUID: &str = "6e2c1d7a-3b4f-4c8e-9a1d-2f5b7c9e0a11";
const BOOT_UUID: &str = "0b1c2d3e-4f50-4617-8a9b-c0d1e2f3a4b5";
const BTRFS_UUID: &str = "9f8e7d6c-5b4a-4938-8271-605f4e3d2c1b";
const ESP_ID: &str = "1A2B3C4D";
const KERNEL_VERSION: &str = "6.1.0-test-amd64";
const FEDORA_OLD: &str = "6.8.5-301.fc40.x86_64";
const FEDORA_NEW: &str = "6.10.3-200.fc40.x86_64";
const MACHINE_ID: &str = "5f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c";

/// Writes a bootable disk at `path` in `layout`, booting `kernel`.
pub fn write_boot_disk(path: &Path, layout: Layout, kernel: &Kernel<'_>) -> io::Result<Built> {
    match layout {
        Layout::Debian | Layout::Ubuntu => debian_like(path, layout, kernel),
        Layout::Fedora => fedora(path, kernel),
        Layout::Alpine => alpine(path, kernel),
        Layout::SystemdBoot => systemd_boot(path, kernel),
    }
}

fn esp(files: Vec<(String, Vec<u8>)>) -> GptPartition {
    let mut fs = Filesystem::new(FsKind::Vfat, "EFI", ESP_ID, 34);
    fs.files = files;
    GptPartition {
        code: "EF00",
        name: "EFI System",
        size_mib: 34,
        legacy_bootable: false,
        content: Some(fs),
    }
}

/// The size an ext4 partition needs for these files (with room for metadata).
fn ext4_size(files: &[&[u8]]) -> u64 {
    let bytes: usize = files.iter().map(|f| f.len()).sum();
    (bytes as u64 >> 20) + 16
}

fn debian_like(path: &Path, layout: Layout, kernel: &Kernel<'_>) -> io::Result<Built> {
    let vmlinuz = format!("/boot/vmlinuz-{KERNEL_VERSION}");
    let initrd = kernel
        .initrd
        .map(|_| format!("/boot/initrd.img-{KERNEL_VERSION}"));
    let (distro, stub) = match layout {
        Layout::Ubuntu => (
            "ubuntu",
            // Ubuntu 24.04's /EFI/ubuntu/grub.cfg.
            format!(
                "search.fs_uuid {ROOT_UUID} root hd0,gpt2\nset prefix=($root)'/boot/grub'\nconfigfile $prefix/grub.cfg\n"
            ),
        ),
        _ => (
            "debian",
            format!(
                "search.fs_uuid {ROOT_UUID} root hd0,gpt3\nset prefix=($root)'/boot/grub'\nconfigfile $prefix/grub.cfg\n"
            ),
        ),
    };
    let root_gpt = if layout == Layout::Ubuntu { 2 } else { 3 };
    let cmdline = format!("root=UUID={ROOT_UUID} ro {}", kernel.cmdline);
    let grub_cfg = grub_mkconfig(distro, root_gpt, &vmlinuz, initrd.as_deref(), &cmdline);
    let mut root = Filesystem::new(
        FsKind::Ext4,
        "root",
        ROOT_UUID,
        ext4_size(&[kernel.image, kernel.initrd.unwrap_or(&[])]),
    )
    .file("/boot/grub/grub.cfg", grub_cfg)
    .file(
        "/boot/grub/grubenv",
        format!("# GRUB Environment Block\n{}", "#".repeat(1024 - 25)),
    )
    .file(&vmlinuz, kernel.image)
    .file("/etc/os-release", format!("ID={distro}\n"))
    .symlink("/vmlinuz", &vmlinuz[1..]);
    if let (Some(path), Some(data)) = (&initrd, kernel.initrd) {
        root = root.file(path, data).symlink("/initrd.img", &path[1..]);
    }
    let stub_path = format!("/EFI/{distro}/grub.cfg");
    let mut partitions = Vec::new();
    if layout == Layout::Debian {
        partitions.push(GptPartition {
            code: "EF02",
            name: "BIOS boot",
            size_mib: 1,
            legacy_bootable: false,
            content: None,
        });
    }
    partitions.push(esp(vec![(stub_path, stub.into_bytes())]));
    partitions.push(GptPartition {
        code: "8300",
        name: "root",
        size_mib: root.size_mib,
        legacy_bootable: false,
        content: Some(root),
    });
    gpt_disk(path, &partitions)?;
    Ok(Built {
        kernel_partition: root_gpt,
        kernel_path: vmlinuz.clone(),
        initrd_path: initrd,
        root_uuid: ROOT_UUID.into(),
        cmdline: format!(
            "BOOT_IMAGE={vmlinuz} {}",
            cmdline.split_whitespace().collect::<Vec<_>>().join(" ")
        ),
    })
}

/// The part of `grub-mkconfig`'s `00_header` that Debian's and Fedora's `grub.cfg` share
/// (menu entry ids, the saved entry, `savedefault`, `load_video`).
const GRUB_HEADER_COMMON: &str = r#"if [ x"${feature_menuentry_id}" = xy ]; then
  menuentry_id_option="--id"
else
  menuentry_id_option=""
fi

export menuentry_id_option

if [ "${prev_saved_entry}" ]; then
  set saved_entry="${prev_saved_entry}"
  save_env saved_entry
  set prev_saved_entry=
  save_env prev_saved_entry
  set boot_once=true
fi

function savedefault {
  if [ -z "${boot_once}" ]; then
    saved_entry="${chosen}"
    save_env saved_entry
  fi
}

function load_video {
  if [ x$feature_all_video_module = xy ]; then
    insmod all_video
  else
    insmod efi_gop
    insmod efi_uga
    insmod ieee1275_fb
    insmod vbe
    insmod vga
    insmod video_bochs
    insmod video_cirrus
  fi
}
"#;

/// `grub.cfg` as Debian's and Ubuntu's `update-grub` write it for a GPT disk whose root
/// is partition `root_gpt` (header, `10_linux` with the advanced submenu, custom.cfg).
fn grub_mkconfig(
    distro: &str,
    root_gpt: u32,
    vmlinuz: &str,
    initrd: Option<&str>,
    cmdline: &str,
) -> String {
    let name = if distro == "ubuntu" {
        "Ubuntu"
    } else {
        "Debian GNU/Linux"
    };
    let search = format!(
        "set root='hd0,gpt{root_gpt}'\n\tif [ x$feature_platform_search_hint = xy ]; then\n\t  search --no-floppy --fs-uuid --set=root --hint-bios=hd0,gpt{root_gpt} --hint-efi=hd0,gpt{root_gpt} --hint-baremetal=ahci0,gpt{root_gpt}  {ROOT_UUID}\n\telse\n\t  search --no-floppy --fs-uuid --set=root {ROOT_UUID}\n\tfi"
    );
    let initrd_line = initrd
        .map(|i| format!("\techo\t'Loading initial ramdisk ...'\n\tinitrd\t{i}\n"))
        .unwrap_or_default();
    let entry = |title: &str, id: &str, extra: &str| {
        format!(
            "menuentry '{title}' --class {distro} --class gnu-linux --class gnu --class os $menuentry_id_option '{id}' {{\n\tload_video\n\tinsmod gzio\n\tif [ x$grub_platform = xxen ]; then insmod xzio; insmod lzopio; fi\n\tinsmod part_gpt\n\tinsmod ext2\n\t{search}\n\techo\t'Loading Linux {KERNEL_VERSION} ...'\n\tlinux\t{vmlinuz} {cmdline}{extra}\n{initrd_line}}}\n"
        )
    };
    let header_common = GRUB_HEADER_COMMON;
    format!(
        r#"#
# DO NOT EDIT THIS FILE
#
# It is automatically generated by grub-mkconfig using templates
# from /etc/grub.d and settings from /etc/default/grub
#

### BEGIN /etc/grub.d/00_header ###
if [ -s $prefix/grubenv ]; then
  set have_grubenv=true
  load_env
fi
if [ "${{next_entry}}" ] ; then
   set default="${{next_entry}}"
   set next_entry=
   save_env next_entry
   set boot_once=true
else
   set default="0"
fi

{header_common}
if [ x$feature_default_font_path = xy ] ; then
   font=unicode
else
insmod part_gpt
insmod ext2
{search}
    font="/usr/share/grub/unicode.pf2"
fi

if loadfont $font ; then
  set gfxmode=auto
  load_video
  insmod gfxterm
fi
terminal_output gfxterm
if [ "${{recordfail}}" = 1 ] ; then
  set timeout=30
else
  if [ x$feature_timeout_style = xy ] ; then
    set timeout_style=menu
    set timeout=5
  # Fallback normal timeout code in case the timeout_style feature is
  # unavailable.
  else
    set timeout=5
  fi
fi
### END /etc/grub.d/00_header ###

### BEGIN /etc/grub.d/10_linux ###
function gfxmode {{
	set gfxpayload="${{1}}"
}}
set linux_gfx_mode=
export linux_gfx_mode
{simple}submenu 'Advanced options for {name}' $menuentry_id_option 'gnulinux-advanced-{ROOT_UUID}' {{
{advanced}{recovery}}}

### END /etc/grub.d/10_linux ###

### BEGIN /etc/grub.d/30_uefi-firmware ###
if [ "$grub_platform" = "efi" ]; then
	fwsetup --is-supported
	if [ "$?" = 0 ]; then
		menuentry 'UEFI Firmware Settings' $menuentry_id_option 'uefi-firmware' {{
			fwsetup
		}}
	fi
fi
### END /etc/grub.d/30_uefi-firmware ###

### BEGIN /etc/grub.d/41_custom ###
if [ -f  ${{config_directory}}/custom.cfg ]; then
  source ${{config_directory}}/custom.cfg
elif [ -z "${{config_directory}}" -a -f  $prefix/custom.cfg ]; then
  source $prefix/custom.cfg
fi
### END /etc/grub.d/41_custom ###
"#,
        simple = entry(name, &format!("gnulinux-simple-{ROOT_UUID}"), ""),
        advanced = entry(
            &format!("{name}, with Linux {KERNEL_VERSION}"),
            &format!("gnulinux-{KERNEL_VERSION}-advanced-{ROOT_UUID}"),
            ""
        ),
        recovery = entry(
            &format!("{name}, with Linux {KERNEL_VERSION} (recovery mode)"),
            &format!("gnulinux-{KERNEL_VERSION}-recovery-{ROOT_UUID}"),
            " single"
        ),
    )
}

fn fedora(path: &Path, kernel: &Kernel<'_>) -> io::Result<Built> {
    let stub = format!(
        "search --no-floppy --root-dev-only --fs-uuid --set=dev {BOOT_UUID}\nset boot=${{dev}}\nset prefix=($boot)/grub2\nexport $prefix\nconfigfile $prefix/grub.cfg\n"
    );
    let header_common = GRUB_HEADER_COMMON;
    let grub_cfg = format!(
        r#"### BEGIN /etc/grub.d/00_header ###
set pager=1

if [ -f ${{config_directory}}/grubenv ]; then
  load_env -f ${{config_directory}}/grubenv
elif [ -s $prefix/grubenv ]; then
  load_env
fi
if [ "${{next_entry}}" ] ; then
   set default="${{next_entry}}"
   set next_entry=
   save_env next_entry
   set boot_once=true
else
   set default="${{saved_entry}}"
fi

{header_common}
terminal_output console
if [ x$feature_timeout_style = xy ] ; then
  set timeout_style=menu
  set timeout=5
# Fallback normal timeout code in case the timeout_style feature is
# unavailable.
else
  set timeout=5
fi
### END /etc/grub.d/00_header ###

### BEGIN /etc/grub.d/01_users ###
if [ -f ${{prefix}}/user.cfg ]; then
  source ${{prefix}}/user.cfg
  if [ -n "${{GRUB2_PASSWORD}}" ]; then
    set superusers="root"
    export superusers
    password_pbkdf2 root ${{GRUB2_PASSWORD}}
  fi
fi
### END /etc/grub.d/01_users ###

### BEGIN /etc/grub.d/10_linux ###
insmod part_gpt
insmod ext2
set root='hd0,gpt2'
if [ x$feature_platform_search_hint = xy ]; then
  search --no-floppy --fs-uuid --set=root --hint-bios=hd0,gpt2 --hint-efi=hd0,gpt2 --hint-baremetal=ahci0,gpt2  {BOOT_UUID}
else
  search --no-floppy --fs-uuid --set=root {BOOT_UUID}
fi
insmod blscfg
blscfg
### END /etc/grub.d/10_linux ###
"#
    );
    let entry = |version: &str, initrd: bool| {
        format!(
            "title Fedora Linux ({version}) 40 (Server Edition)\nversion {version}\nlinux /vmlinuz-{version}\n{}options $kernelopts $tuned_params\ngrub_users $grub_users\ngrub_arg --unrestricted\ngrub_class fedora\n",
            if initrd {
                format!("initrd /initramfs-{version}.img $tuned_initrd\n")
            } else {
                String::new()
            }
        )
    };
    let kernelopts = format!(
        "root=UUID={BTRFS_UUID} ro rootflags=subvol=root {}",
        kernel.cmdline
    );
    let grubenv = format!(
        "# GRUB Environment Block\nsaved_entry={MACHINE_ID}-{FEDORA_OLD}\nkernelopts={kernelopts}\nboot_success=0\n"
    );
    let mut boot = Filesystem::new(
        FsKind::Ext4,
        "boot",
        BOOT_UUID,
        ext4_size(&[kernel.image, kernel.image, kernel.initrd.unwrap_or(&[])]),
    )
    .file("/grub2/grub.cfg", grub_cfg)
    .file("/grub2/grubenv", grubenv)
    .file(
        &format!("/loader/entries/{MACHINE_ID}-{FEDORA_OLD}.conf"),
        entry(FEDORA_OLD, kernel.initrd.is_some()),
    )
    .file(
        &format!("/loader/entries/{MACHINE_ID}-{FEDORA_NEW}.conf"),
        entry(FEDORA_NEW, kernel.initrd.is_some()),
    )
    .file(&format!("/vmlinuz-{FEDORA_OLD}"), kernel.image)
    // The newer kernel is not the test's: booting it would be a wrong choice.
    .file(
        &format!("/vmlinuz-{FEDORA_NEW}"),
        b"not the saved entry's kernel".to_vec(),
    );
    if let Some(initrd) = kernel.initrd {
        boot = boot
            .file(&format!("/initramfs-{FEDORA_OLD}.img"), initrd)
            .file(
                &format!("/initramfs-{FEDORA_NEW}.img"),
                b"wrong initrd".to_vec(),
            );
    }
    gpt_disk(
        path,
        &[
            esp(vec![("/EFI/fedora/grub.cfg".into(), stub.into_bytes())]),
            GptPartition {
                code: "8300",
                name: "boot",
                size_mib: boot.size_mib,
                legacy_bootable: false,
                content: Some(boot),
            },
            GptPartition {
                code: "8300",
                name: "root",
                size_mib: 128,
                legacy_bootable: false,
                content: Some(Filesystem::new(FsKind::Btrfs, "fedora", BTRFS_UUID, 128)),
            },
        ],
    )?;
    Ok(Built {
        kernel_partition: 2,
        kernel_path: format!("/vmlinuz-{FEDORA_OLD}"),
        initrd_path: kernel
            .initrd
            .map(|_| format!("/initramfs-{FEDORA_OLD}.img")),
        root_uuid: BTRFS_UUID.into(),
        cmdline: format!(
            "BOOT_IMAGE=(hd0,gpt2)/vmlinuz-{FEDORA_OLD} {}",
            kernelopts.split_whitespace().collect::<Vec<_>>().join(" ")
        ),
    })
}

fn alpine(path: &Path, kernel: &Kernel<'_>) -> io::Result<Built> {
    let cmdline = format!(
        "root=UUID={ROOT_UUID} modules=sd-mod,usb-storage,ext4 rootfstype=ext4 {}",
        kernel.cmdline
    );
    let conf = format!(
        "# Generated by update-extlinux 6.04_pre1-r15\nDEFAULT menu.c32\nPROMPT 0\nMENU TITLE Alpine/Linux Boot Menu\nMENU HIDDEN\nMENU AUTOBOOT Alpine will be booted automatically in # seconds.\nTIMEOUT 10\nLABEL lts\n  MENU DEFAULT\n  MENU LABEL Linux lts\n  LINUX vmlinuz-lts\n{}  APPEND {cmdline}\n\nMENU SEPARATOR\n",
        if kernel.initrd.is_some() {
            "  INITRD initramfs-lts\n"
        } else {
            ""
        }
    );
    let mut root = Filesystem::new(
        FsKind::Ext4,
        "alpine",
        ROOT_UUID,
        ext4_size(&[kernel.image, kernel.initrd.unwrap_or(&[])]),
    )
    .file("/boot/extlinux.conf", conf)
    .file("/boot/vmlinuz-lts", kernel.image);
    if let Some(initrd) = kernel.initrd {
        root = root.file("/boot/initramfs-lts", initrd);
    }
    mbr_disk(
        path,
        &[MbrPartition {
            type_byte: 0x83,
            size_mib: root.size_mib,
            active: true,
            content: Some(root),
        }],
        &[],
    )?;
    Ok(Built {
        kernel_partition: 1,
        kernel_path: "/boot/vmlinuz-lts".into(),
        initrd_path: kernel.initrd.map(|_| "/boot/initramfs-lts".into()),
        root_uuid: ROOT_UUID.into(),
        cmdline: format!("BOOT_IMAGE=vmlinuz-lts {cmdline}"),
    })
}

fn systemd_boot(path: &Path, kernel: &Kernel<'_>) -> io::Result<Built> {
    let cmdline = format!("root=UUID={ROOT_UUID} rw {}", kernel.cmdline);
    let entry = format!(
        "title      Arch Linux\nlinux      /vmlinuz-linux\n{}options    {cmdline}\n",
        if kernel.initrd.is_some() {
            "initrd     /initramfs-linux.img\n"
        } else {
            ""
        }
    );
    let mut files = vec![
        (
            "/loader/loader.conf".to_string(),
            b"default arch.conf\ntimeout 4\nconsole-mode max\n".to_vec(),
        ),
        ("/loader/entries/arch.conf".to_string(), entry.into_bytes()),
        (
            "/loader/entries/arch-fallback.conf".to_string(),
            b"title Arch Linux (fallback)\nlinux /vmlinuz-linux\noptions wrong-entry\n".to_vec(),
        ),
        ("/vmlinuz-linux".to_string(), kernel.image.to_vec()),
    ];
    if let Some(initrd) = kernel.initrd {
        files.push(("/initramfs-linux.img".to_string(), initrd.to_vec()));
    }
    let size = ext4_size(&[kernel.image, kernel.initrd.unwrap_or(&[])]).max(34);
    let mut esp = esp(files);
    esp.size_mib = size;
    if let Some(fs) = esp.content.as_mut() {
        fs.size_mib = size;
    }
    gpt_disk(
        path,
        &[
            esp,
            GptPartition {
                code: "8300",
                name: "root",
                size_mib: 16,
                legacy_bootable: false,
                content: Some(Filesystem::new(FsKind::Ext4, "root", ROOT_UUID, 16)),
            },
        ],
    )?;
    Ok(Built {
        kernel_partition: 1,
        kernel_path: "/vmlinuz-linux".into(),
        initrd_path: kernel.initrd.map(|_| "/initramfs-linux.img".into()),
        root_uuid: ROOT_UUID.into(),
        cmdline,
    })
}

/// The test guest as a bzImage: its ELF gzip-compressed as the payload behind a setup
/// header (boot protocol 2.15), as Linux's build packs a kernel. Booted with the payload
/// decompressed on the host.
pub fn guest_bzimage() -> Vec<u8> {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    gz.write_all(crate::ELF).expect("compress in memory");
    let payload = gz.finish().expect("compress in memory");
    const SETUP_SECTS: u8 = 4;
    let header_end = (usize::from(SETUP_SECTS) + 1) * 512;
    let mut image = vec![0u8; header_end + 0x40];
    image[0x1f1] = SETUP_SECTS;
    image[0x1fe..0x200].copy_from_slice(&0xaa55u16.to_le_bytes());
    image[0x202..0x206].copy_from_slice(b"HdrS");
    image[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    image[0x211] = 0x01; // LOADED_HIGH
    image[0x214..0x218].copy_from_slice(&0x10_0000u32.to_le_bytes());
    // payload_offset is from the start of the protected-mode code.
    image[0x248..0x24c].copy_from_slice(&0x40u32.to_le_bytes());
    let len = u32::try_from(payload.len()).expect("the test guest compresses to well under 4 GiB");
    image[0x24c..0x250].copy_from_slice(&len.to_le_bytes());
    image.extend_from_slice(&payload);
    image
}

/// Where a disk image of `layout` goes in `dir`.
pub fn path_in(dir: &Path, layout: Layout) -> PathBuf {
    dir.join(format!("{}.raw", layout.name()))
}
