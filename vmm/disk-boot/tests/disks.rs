//! The loader on real disk images, made with the tools distributions use (`sgdisk`,
//! `sfdisk`, `mkfs.ext4 -d`, `mkfs.vfat`, `mtools`, `mkfs.btrfs`, `mkfs.xfs`), laid out as
//! Debian, Ubuntu, Fedora, Alpine and systemd-boot images are; and on damaged and hostile
//! ones, which must end in a clear error, never a panic or a hang.

use std::path::{Path, PathBuf};

use disk_boot::{Error, Firmware, Limits, Loader};
use rand::{Rng, SeedableRng};
use test_guest::disks::{
    self, Filesystem, FsKind, GptPartition, Kernel, Layout, MbrPartition, write_boot_disk,
};

const KERNEL: &[u8] = b"\x7fELF pretend kernel bytes, odd length";
const INITRD: &[u8] = b"070701 pretend initramfs";
const CMDLINE: &str = "console=ttyS0 checks=serial";

fn kernel() -> Kernel<'static> {
    Kernel {
        image: KERNEL,
        initrd: Some(INITRD),
        cmdline: CMDLINE,
    }
}

fn open(path: &Path) -> Box<dyn disk_boot::DiskRead> {
    Box::new(std::fs::File::open(path).expect("the test image"))
}

fn load(path: &Path, firmware: Firmware) -> Result<disk_boot::Boot, Error> {
    disk_boot::load(open(path), firmware, &Limits::for_guest_memory(256 << 20))
}

fn padded(data: &[u8]) -> Vec<u8> {
    let mut v = data.to_vec();
    v.resize(v.len().next_multiple_of(4), 0);
    v
}

#[test]
fn every_layout_boots_its_default_entry_under_the_firmware_it_was_made_for() {
    let dir = tempfile::tempdir().unwrap();
    for (layout, firmware, loader) in [
        (Layout::Debian, Firmware::Bios, Loader::Grub),
        (Layout::Debian, Firmware::Efi, Loader::Grub),
        (Layout::Ubuntu, Firmware::Efi, Loader::Grub),
        (Layout::Ubuntu, Firmware::Bios, Loader::Grub),
        (Layout::Fedora, Firmware::Efi, Loader::GrubBls),
        (Layout::Fedora, Firmware::Bios, Loader::GrubBls),
        (Layout::Alpine, Firmware::Bios, Loader::Extlinux),
        (Layout::Alpine, Firmware::Efi, Loader::Extlinux),
        (Layout::SystemdBoot, Firmware::Efi, Loader::SystemdBoot),
    ] {
        let path = disks::path_in(dir.path(), layout);
        let built = write_boot_disk(&path, layout, &kernel()).unwrap();
        let boot = load(&path, firmware).unwrap_or_else(|e| panic!("{layout:?} {firmware:?}: {e}"));
        let case = format!("{layout:?} {firmware:?}: {}", boot.describe());
        assert_eq!(boot.loader, loader, "{case}");
        assert_eq!(boot.kernel, KERNEL, "{case}");
        assert_eq!(boot.initrd, padded(INITRD), "{case}");
        assert_eq!(boot.cmdline, built.cmdline, "{case}");
        assert_eq!(boot.kernel_file.partition, built.kernel_partition, "{case}");
        assert_eq!(boot.kernel_file.path, built.kernel_path, "{case}");
        assert_eq!(
            boot.initrd_files.first().map(|f| f.path.clone()),
            built.initrd_path,
            "{case}"
        );
    }
}

#[test]
fn a_systemd_boot_disk_needs_efi() {
    let dir = tempfile::tempdir().unwrap();
    let path = disks::path_in(dir.path(), Layout::SystemdBoot);
    write_boot_disk(&path, Layout::SystemdBoot, &kernel()).unwrap();
    let err = load(&path, Firmware::Bios).unwrap_err();
    assert!(matches!(err, Error::NoBootableEntry { .. }), "{err}");
    assert!(err.to_string().contains("BIOS"), "{err}");
}

fn ext4_with(files: &[(&str, &[u8])]) -> Filesystem {
    let mut fs = Filesystem::new(
        FsKind::Ext4,
        "root",
        "11111111-2222-3333-4444-555555555555",
        16,
    );
    for (path, data) in files {
        fs = fs.file(path, data.to_vec());
    }
    fs
}

fn linux(fs: Filesystem) -> GptPartition {
    GptPartition {
        code: "8300",
        name: "root",
        size_mib: fs.size_mib,
        legacy_bootable: false,
        content: Some(fs),
    }
}

#[test]
fn a_filesystem_on_the_whole_disk_and_logical_partitions_boot() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = b"menuentry one { linux /boot/k whole=1 }".as_slice();
    let whole = dir.path().join("whole.raw");
    disks::whole_disk(
        &whole,
        &ext4_with(&[("/boot/grub/grub.cfg", cfg), ("/boot/k", KERNEL)]),
    )
    .unwrap();
    let boot = load(&whole, Firmware::Bios).unwrap();
    assert_eq!(boot.scheme, disk_boot::Scheme::None);
    assert_eq!(boot.kernel_file.partition, 0);
    assert_eq!(boot.cmdline, "BOOT_IMAGE=/boot/k whole=1");

    // The kernel on logical partition 6 (the second in the extended partition), found by
    // GRUB's `search --fs-uuid` from a configuration on partition 1.
    let logical_uuid = "0a0b0c0d-1111-2222-3333-444455556666";
    let cfg = format!(
        "search --fs-uuid --set=root {logical_uuid}\nmenuentry logical {{ linux /k part=$root }}"
    );
    let mbr = dir.path().join("mbr.raw");
    let small = |fs: Filesystem, active| MbrPartition {
        type_byte: 0x83,
        size_mib: fs.size_mib,
        active,
        content: Some(fs),
    };
    disks::mbr_disk(
        &mbr,
        &[small(
            ext4_with(&[("/boot/grub/grub.cfg", cfg.as_bytes())]),
            true,
        )],
        &[
            small(
                Filesystem::new(
                    FsKind::Ext4,
                    "five",
                    "5aaaaaaa-1111-2222-3333-444455556666",
                    8,
                ),
                false,
            ),
            small(
                Filesystem::new(FsKind::Ext4, "six", logical_uuid, 8).file("/k", KERNEL.to_vec()),
                false,
            ),
        ],
    )
    .unwrap();
    let boot = load(&mbr, Firmware::Bios).unwrap();
    assert_eq!(boot.scheme, disk_boot::Scheme::Mbr);
    assert_eq!(boot.kernel_file.partition, 6);
    assert_eq!(boot.kernel_file.device, "hd0,msdos6");
    assert_eq!(boot.cmdline, "BOOT_IMAGE=/k part=hd0,msdos6");
    assert_eq!(boot.kernel, KERNEL);
}

#[test]
fn unreadable_boot_filesystems_are_named() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, name, size) in [(FsKind::Xfs, "xfs", 300), (FsKind::Btrfs, "btrfs", 128)] {
        let path = dir.path().join(format!("{name}.raw"));
        disks::gpt_disk(
            &path,
            &[GptPartition {
                code: "8300",
                name: "boot",
                size_mib: size,
                legacy_bootable: false,
                content: Some(Filesystem::new(
                    kind,
                    "boot",
                    "12345678-1234-1234-1234-123456789abc",
                    size,
                )),
            }],
        )
        .unwrap();
        let err = load(&path, Firmware::Bios).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("partition 1 (hd0,gpt1) holds {name}")),
            "{text}"
        );
    }
    let empty = dir.path().join("empty.raw");
    std::fs::File::create(&empty)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    let err = load(&empty, Firmware::Efi).unwrap_err();
    assert!(matches!(err, Error::NoBootableEntry { .. }), "{err}");
}

/// Files of a test filesystem: (path, contents).
type FileList<'a> = Vec<(&'a str, &'a [u8])>;

#[test]
fn a_bad_entry_is_reported_with_its_configuration_and_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, FileList, &str); 4] = [
        (
            "missing kernel",
            vec![(
                "/boot/grub/grub.cfg",
                b"menuentry Gone { linux /boot/vmlinuz-gone }".as_slice(),
            )],
            "kernel /boot/vmlinuz-gone on partition 1 (hd0,gpt1) not found",
        ),
        (
            "another disk",
            vec![(
                "/boot/grub/grub.cfg",
                b"menuentry Far { linux (hd1,gpt2)/vmlinuz }".as_slice(),
            )],
            "another disk",
        ),
        (
            "windows",
            vec![(
                "/boot/grub/grub.cfg",
                b"menuentry 'Windows' { chainloader +1 }".as_slice(),
            )],
            "chainloader",
        ),
        (
            "no label",
            vec![(
                "/boot/extlinux.conf",
                b"DEFAULT menu.c32\nPROMPT 0\n".as_slice(),
            )],
            "no LABEL",
        ),
    ];
    for (name, files, expected) in cases {
        let path = dir.path().join(format!("{name}.raw"));
        disks::gpt_disk(&path, &[linux(ext4_with(&files))]).unwrap();
        let err = load(&path, Firmware::Bios).unwrap_err();
        assert!(matches!(err, Error::NoUsableEntry { .. }), "{name}: {err}");
        let text = err.to_string();
        assert!(text.contains(expected), "{name}: {text}");
        assert!(text.contains("on partition 1 (hd0,gpt1)"), "{name}: {text}");
    }
}

/// The ext4 image of one partition with a symlink loop for the kernel.
#[test]
fn link_loops_and_oversized_files_end_in_errors() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("loop.raw");
    let fs = ext4_with(&[(
        "/boot/grub/grub.cfg",
        b"menuentry L { linux /boot/vmlinuz }".as_slice(),
    )])
    .symlink("/boot/vmlinuz", "/boot/a")
    .symlink("/boot/a", "/boot/vmlinuz");
    disks::gpt_disk(&path, &[linux(fs)]).unwrap();
    let err = load(&path, Firmware::Bios).unwrap_err();
    assert!(err.to_string().contains("/boot/vmlinuz"), "{err}");

    let path = dir.path().join("big.raw");
    let big_kernel = vec![0x42u8; 3 << 20];
    let huge_config = "# padding\n".repeat(200_000);
    disks::gpt_disk(
        &path,
        &[linux(ext4_with(&[
            (
                "/boot/grub/grub.cfg",
                b"menuentry Big { linux /boot/vmlinuz }".as_slice(),
            ),
            ("/boot/vmlinuz", &big_kernel),
        ]))],
    )
    .unwrap();
    let mut limits = Limits::for_guest_memory(256 << 20);
    limits.kernel = 1 << 20;
    let err = disk_boot::load(open(&path), Firmware::Bios, &limits).unwrap_err();
    assert!(
        err.to_string()
            .contains("kernel /boot/vmlinuz on partition 1 (hd0,gpt1)")
            && err.to_string().contains("more than"),
        "{err}"
    );
    let path = dir.path().join("bigcfg.raw");
    disks::gpt_disk(
        &path,
        &[linux(ext4_with(&[(
            "/boot/grub/grub.cfg",
            huge_config.as_bytes(),
        )]))],
    )
    .unwrap();
    let err = load(&path, Firmware::Bios).unwrap_err();
    assert!(err.to_string().contains("more than"), "{err}");
}

fn write_at(path: &Path, offset: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    std::fs::File::open(path)
        .unwrap()
        .read_exact_at(&mut buf, offset)
        .unwrap();
    buf
}

fn debian(dir: &Path) -> PathBuf {
    let path = disks::path_in(dir, Layout::Debian);
    write_boot_disk(&path, Layout::Debian, &kernel()).unwrap();
    path
}

#[test]
fn a_damaged_primary_gpt_falls_back_to_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let path = debian(dir.path());
    // The test guest's disk check writes sectors 1-3, where the primary GPT lives.
    write_at(&path, 512, &[0x5a; 512 * 3]);
    let boot = load(&path, Firmware::Bios).unwrap();
    assert_eq!(boot.kernel, KERNEL);
    assert!(
        boot.notes.iter().any(|n| n.contains("backup GPT")),
        "{:?}",
        boot.notes
    );
}

#[test]
fn a_gpt_header_with_a_valid_crc_but_a_huge_array_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = debian(dir.path());
    let mut header = read_at(&path, 512, 92);
    // 2^24 entries of 128 bytes: 2 GiB to read, if it were believed.
    header[80..84].copy_from_slice(&(1u32 << 24).to_le_bytes());
    header[16..20].fill(0);
    let crc = crc32(&header);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    write_at(&path, 512, &header);
    let boot = load(&path, Firmware::Bios).unwrap();
    assert!(
        boot.notes.iter().any(|n| n.contains("exceed")),
        "{:?}",
        boot.notes
    );
}

/// CRC-32 (IEEE), for forging GPT headers.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xffff_ffffu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn an_ebr_chain_that_loops_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ebr.raw");
    let cfg = b"menuentry e { linux /k }".as_slice();
    let part = |fs: Filesystem| MbrPartition {
        type_byte: 0x83,
        size_mib: fs.size_mib,
        active: false,
        content: Some(fs),
    };
    let offsets = disks::mbr_disk(
        &path,
        &[part(ext4_with(&[
            ("/boot/grub/grub.cfg", cfg),
            ("/k", KERNEL),
        ]))],
        &[part(Filesystem::new(
            FsKind::Ext4,
            "l",
            "7aaaaaaa-1111-2222-3333-444455556666",
            8,
        ))],
    )
    .unwrap();
    // The extended partition's start, from the MBR's second entry.
    let mbr = read_at(&path, 0, 512);
    let ext_start = u64::from(u32::from_le_bytes(
        mbr[0x1ce + 8..0x1ce + 12].try_into().unwrap(),
    ));
    // The first EBR's "next" entry points back at itself (relative 0 is the first EBR).
    let mut ebr = read_at(&path, ext_start * 512, 512);
    ebr[0x1ce..0x1de].copy_from_slice(&[0, 0, 0, 0, 0x05, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    write_at(&path, ext_start * 512, &ebr);
    assert_eq!(offsets.len(), 2);
    let boot = load(&path, Firmware::Bios).unwrap();
    assert_eq!(boot.kernel, KERNEL);
    assert!(
        boot.notes.iter().any(|n| n.contains("points back")),
        "{:?}",
        boot.notes
    );
}

#[test]
fn a_fat_directory_whose_cluster_chain_loops_spends_the_budget_and_ends() {
    let dir = tempfile::tempdir().unwrap();
    let path = disks::path_in(dir.path(), Layout::Ubuntu);
    write_boot_disk(&path, Layout::Ubuntu, &kernel()).unwrap();
    // The ESP is partition 1 at 1 MiB, FAT16 at 34 MiB. Point the /EFI directory's cluster
    // at itself, and fill the cluster with deleted entries: no end-of-directory marker
    // stops a walk of it.
    let esp = 1u64 << 20;
    let bpb = read_at(&path, esp, 512);
    let bytes_per_sector = u64::from(u16::from_le_bytes([bpb[11], bpb[12]]));
    let cluster_bytes = bytes_per_sector * u64::from(bpb[13]);
    let reserved = u64::from(u16::from_le_bytes([bpb[14], bpb[15]]));
    let fats = u64::from(bpb[16]);
    let root_entries = u64::from(u16::from_le_bytes([bpb[17], bpb[18]]));
    let fat_size = u64::from(u16::from_le_bytes([bpb[22], bpb[23]]));
    assert!(
        fat_size > 0 && root_entries > 0,
        "expected FAT16 for a 34 MiB ESP"
    );
    let root = esp + (reserved + fats * fat_size) * bytes_per_sector;
    let entries = read_at(&path, root, usize::try_from(root_entries * 32).unwrap());
    let efi = entries
        .chunks(32)
        // Not the volume label, which is "EFI" too.
        .find(|e| &e[..11] == b"EFI        " && e[11] & 0x10 != 0)
        .expect("the EFI directory entry");
    let cluster = u16::from_le_bytes([efi[26], efi[27]]);
    for copy in 0..fats {
        let fat = esp + (reserved + copy * fat_size) * bytes_per_sector;
        write_at(&path, fat + 2 * u64::from(cluster), &cluster.to_le_bytes());
    }
    let data = root + (root_entries * 32).next_multiple_of(bytes_per_sector);
    let at = data + u64::from(cluster - 2) * cluster_bytes;
    let mut contents = read_at(&path, at, usize::try_from(cluster_bytes).unwrap());
    for slot in contents.chunks_mut(32).filter(|s| s[0] == 0) {
        slot[0] = 0xe5;
    }
    write_at(&path, at, &contents);
    let limits = Limits {
        kernel: 1 << 20,
        initrd: 1 << 20,
        config: 1 << 20,
        metadata: 8 << 20,
    };
    let started = std::time::Instant::now();
    let err = disk_boot::load(open(&path), Firmware::Efi, &limits).unwrap_err();
    assert!(matches!(err, Error::ReadBudget), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
}

/// A disk image shared by many damaged copies: each copy is the image plus its own bytes.
struct Damaged {
    base: std::rc::Rc<Vec<u8>>,
    patches: std::collections::BTreeMap<u64, u8>,
}

impl disk_boot::DiskRead for Damaged {
    fn size(&self) -> u64 {
        self.base.len() as u64
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).unwrap();
        buf.copy_from_slice(&self.base[start..start + buf.len()]);
        for (at, byte) in self.patches.range(offset..offset + buf.len() as u64) {
            buf[usize::try_from(at - offset).unwrap()] = *byte;
        }
        Ok(())
    }
}

/// Random damage to real images where their metadata lies (the fuzz target's idea, run
/// briefly here): whatever the bytes, the loader returns, and most damage to unused
/// bytes still boots.
#[test]
fn damaged_images_never_panic() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_b007);
    let mut images = Vec::new();
    for layout in [
        Layout::Debian,
        Layout::Alpine,
        Layout::Fedora,
        Layout::SystemdBoot,
    ] {
        let path = disks::path_in(dir.path(), layout);
        write_boot_disk(&path, layout, &kernel()).unwrap();
        let partitions = disk_boot::partition_table(open(&path)).unwrap();
        // Where damage matters: the tables, and the first MiB of each filesystem.
        let mut hot: Vec<(u64, u64)> = vec![(0, 1 << 20)];
        hot.extend(partitions.iter().map(|p| (p.start, p.len.min(1 << 20))));
        images.push((std::rc::Rc::new(std::fs::read(&path).unwrap()), hot, layout));
    }
    let mut outcomes = [0usize; 2];
    for round in 0..400 {
        let (base, hot, layout) = &images[round % images.len()];
        let mut patches = std::collections::BTreeMap::new();
        for _ in 0..rng.random_range(1..32) {
            let (start, len) = hot[rng.random_range(0..hot.len())];
            patches.insert(start + rng.random_range(0..len), rng.random());
        }
        let firmware = if round % 3 == 0 {
            Firmware::Bios
        } else {
            Firmware::Efi
        };
        let disk = Damaged {
            base: base.clone(),
            patches,
        };
        let result = disk_boot::load(
            Box::new(disk),
            firmware,
            &Limits::for_guest_memory(64 << 20),
        );
        if let Err(Error::Panicked(message)) = &result {
            panic!("round {round} ({layout:?}): a parser panicked: {message}");
        }
        outcomes[usize::from(result.is_ok())] += 1;
    }
    eprintln!(
        "damaged images: {} refused, {} still booted",
        outcomes[0], outcomes[1]
    );
    assert!(outcomes[1] > 0 && outcomes[0] > 0, "{outcomes:?}");
}
