//! The disk boot loader on damaged real disks: each input picks a base image (Debian-style
//! GPT with an EFI system partition and ext4, Alpine-style MBR with extlinux, Fedora-style
//! BLS entries through GRUB, systemd-boot on FAT) and a firmware, then overwrites bytes where
//! the partition tables, filesystem metadata and configuration files live. Whatever the
//! bytes, `disk_boot::load` must return (an entry or an error), never panic — its own
//! `catch_unwind` is reported as a crash here — and never hang (libFuzzer's timeout).

#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use disk_boot::{DiskRead, Error, Firmware, Limits};
use libfuzzer_sys::fuzz_target;
use test_guest::disks::{Kernel, Layout, write_boot_disk};

/// A base image and the byte ranges worth damaging.
struct Base {
    bytes: Arc<Vec<u8>>,
    hot: Vec<(u64, u64)>,
}

fn bases() -> &'static [Base] {
    static BASES: OnceLock<Vec<Base>> = OnceLock::new();
    BASES.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("disk-boot-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let kernel = Kernel {
            image: b"\x7fELF not a kernel",
            initrd: Some(b"070701 not an initramfs"),
            cmdline: "console=ttyS0",
        };
        let bases = [Layout::Debian, Layout::Alpine, Layout::Fedora, Layout::SystemdBoot]
            .into_iter()
            .map(|layout| {
                let path = dir.join(layout.name());
                write_boot_disk(&path, layout, &kernel).expect("the base image (mkfs tools)");
                let bytes = std::fs::read(&path).expect("the base image");
                let partitions =
                    disk_boot::partition_table(Box::new(bytes.clone())).expect("its table");
                let mut hot = vec![(0u64, 1u64 << 20)];
                hot.extend(partitions.iter().map(|p| (p.start, p.len.min(2 << 20))));
                // The backup GPT at the end.
                let len = bytes.len() as u64;
                hot.push((len.saturating_sub(34 * 512), 34 * 512));
                Base {
                    bytes: Arc::new(bytes),
                    hot,
                }
            })
            .collect();
        let _ = std::fs::remove_dir_all(&dir);
        bases
    })
}

/// The base image with the input's bytes over it.
struct Damaged {
    base: Arc<Vec<u8>>,
    patches: BTreeMap<u64, u8>,
}

impl DiskRead for Damaged {
    fn size(&self) -> u64 {
        self.base.len() as u64
    }

    fn read_exact_at(&mut self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let start = usize::try_from(offset).map_err(|_| std::io::ErrorKind::UnexpectedEof)?;
        let end = start
            .checked_add(buf.len())
            .filter(|&e| e <= self.base.len())
            .ok_or(std::io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&self.base[start..end]);
        for (at, byte) in self.patches.range(offset..offset + buf.len() as u64) {
            buf[(at - offset) as usize] = *byte;
        }
        Ok(())
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&select, mut rest)) = data.split_first() else {
        return;
    };
    let bases = bases();
    let base = &bases[usize::from(select & 0x7f) % bases.len()];
    let firmware = if select & 0x80 != 0 {
        Firmware::Efi
    } else {
        Firmware::Bios
    };
    // Patches: region (1 byte), offset in it (4 bytes), length (1 byte), bytes.
    let mut patches = BTreeMap::new();
    while rest.len() >= 6 {
        let (region, offset, len) = (
            rest[0],
            u32::from_le_bytes([rest[1], rest[2], rest[3], rest[4]]),
            usize::from(rest[5]),
        );
        rest = &rest[6..];
        let (start, size) = base.hot[usize::from(region) % base.hot.len()];
        let at = start + u64::from(offset) % size.max(1);
        for (i, &byte) in rest.iter().take(len).enumerate() {
            patches.insert(at + i as u64, byte);
        }
        rest = &rest[len.min(rest.len())..];
    }
    let disk = Damaged {
        base: base.bytes.clone(),
        patches,
    };
    let limits = Limits::for_guest_memory(256 << 20);
    if let Err(Error::Panicked(message)) = disk_boot::load(Box::new(disk), firmware, &limits) {
        panic!("a parser panicked: {message}");
    }
});
