//! The host's side of the guest's `virtio-blk-fill` check
//! (images/guest/src/virtio/blkfill.rs): the command line that asks for it, and the
//! check of a disk image after the run — every block of the filled area holds the last
//! generation that wrote it, header and body, and `qemu-img check` finds nothing wrong.

use std::path::Path;
use std::process::Command;

/// The block the guest writes: a header, then the generation's body byte.
pub const BLOCK: u64 = 4096;
/// The first bytes of every block the guest writes.
pub const MAGIC: &[u8; 8] = b"blkfill:";

/// How the run ends each generation but the last.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// The guest resets the VM through the i8042 (0xFE).
    Guest,
    /// The guest prints `BLKFILL gen=<g> written` and keeps rewriting its region until
    /// the host resets the VM.
    Host,
}

/// What the guest fills: generation `g` (from 1) writes `size_mib` MiB starting
/// `offset_mib + (g - 1) * step_mib` MiB into the disk.
#[derive(Clone, Copy, Debug)]
pub struct Fill {
    pub offset_mib: u64,
    pub size_mib: u64,
    pub step_mib: u64,
    /// The generation that ends the run (the earlier ones end with a reset).
    pub gens: u32,
}

impl Fill {
    /// 32 MiB per generation from the start of the disk, the second half of one
    /// generation's region rewritten by the next; two generations (one reset).
    pub const TWO_GENERATIONS: Fill = Fill {
        offset_mib: 0,
        size_mib: 32,
        step_mib: 16,
        gens: 2,
    };

    /// The guest's command-line words for this fill.
    pub fn cmdline(&self, reset: Reset) -> String {
        format!(
            "checks=virtio-blk-fill blkfill.mb={} blkfill.step_mb={} blkfill.offset_mb={} blkfill.gens={} blkfill.reset={}",
            self.size_mib,
            self.step_mib,
            self.offset_mib,
            self.gens,
            match reset {
                Reset::Guest => "guest",
                Reset::Host => "host",
            }
        )
    }

    /// The end of the area the generations write, in bytes.
    pub fn end(&self) -> u64 {
        (self.offset_mib + u64::from(self.gens.saturating_sub(1)) * self.step_mib + self.size_mib)
            << 20
    }

    /// The generation whose data the block at byte `offset` must hold (the last one that
    /// wrote it), if any wrote it.
    pub fn generation_at(&self, offset: u64) -> Option<u32> {
        (1..=self.gens).rev().find(|&g| {
            let start = (self.offset_mib + u64::from(g - 1) * self.step_mib) << 20;
            (start..start + (self.size_mib << 20)).contains(&offset)
        })
    }

    /// The 4 KiB block generation `g` writes at byte `offset`.
    pub fn block(generation: u32, offset: u64) -> Vec<u8> {
        let mut block = vec![body(generation); 4096];
        block[..8].copy_from_slice(MAGIC);
        block[8..12].copy_from_slice(&generation.to_le_bytes());
        let index = u32::try_from(offset / BLOCK).expect("test disks are below 16 TiB");
        block[12..16].copy_from_slice(&index.to_le_bytes());
        block
    }

    /// Checks a whole disk's bytes: every block of the filled area holds the last
    /// generation that wrote it. The error names the first wrong blocks and counts them
    /// by what they hold.
    pub fn verify(&self, disk: &[u8]) -> Result<(), String> {
        let end = usize::try_from(self.end()).expect("a test disk fits in memory");
        if disk.len() < end {
            return Err(format!(
                "the disk has {} bytes, the fill needs {end}",
                disk.len()
            ));
        }
        let start = usize::try_from(self.offset_mib << 20).expect("fits");
        let mut wrong = Vec::new();
        let mut count = 0usize;
        for (n, block) in (0u64..).zip(disk[start..end].chunks(4096)) {
            let offset = (self.offset_mib << 20) + BLOCK * n;
            let Some(generation) = self.generation_at(offset) else {
                continue;
            };
            if block != Fill::block(generation, offset).as_slice() {
                count += 1;
                if wrong.len() < 8 {
                    wrong.push(format!(
                        "block at {offset:#x} should be generation {generation}, holds {}",
                        describe(block)
                    ));
                }
            }
        }
        if count == 0 {
            Ok(())
        } else {
            Err(format!("{count} blocks wrong: {}", wrong.join("; ")))
        }
    }

    /// `qemu-img check` of a qcow2 image (its backing file named in it), then
    /// [`Fill::verify`] of its contents as `qemu-img convert` reads them.
    pub fn verify_qcow2(&self, image: &Path) -> Result<(), String> {
        let check = qemu_img(Command::new("qemu-img").arg("check").arg(image))?;
        if !check.status.success() {
            return Err(format!(
                "qemu-img check {}: {}{}",
                image.display(),
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr)
            ));
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let flat = dir.path().join("flat.raw");
        let convert = qemu_img(
            Command::new("qemu-img")
                .args(["convert", "-f", "qcow2", "-O", "raw"])
                .arg(image)
                .arg(&flat),
        )?;
        if !convert.status.success() {
            return Err(format!(
                "qemu-img convert: {}",
                String::from_utf8_lossy(&convert.stderr)
            ));
        }
        self.verify(&std::fs::read(&flat).map_err(|e| e.to_string())?)
    }
}

/// Runs `qemu-img`, again for up to 2 s while it is refused for an image lock: a
/// descriptor the test process closed lives on for a moment in a child another test
/// thread is starting (until its `exec`), and QEMU sees its lock.
fn qemu_img(cmd: &mut Command) -> Result<std::process::Output, String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let out = cmd
            .output()
            .map_err(|e| format!("qemu-img (Debian's qemu-utils) is needed: {e}"))?;
        if out.status.success()
            || !String::from_utf8_lossy(&out.stderr).contains("Is another process using the image")
            || std::time::Instant::now() > deadline
        {
            return Ok(out);
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// The byte after the header of generation `g`'s blocks (the guest's `body`).
pub fn body(generation: u32) -> u8 {
    0xa5 ^ generation.to_le_bytes()[0]
}

/// What a block holds, in a few words.
fn describe(block: &[u8]) -> String {
    if block.iter().all(|&b| b == 0) {
        return "zeroes".into();
    }
    if block.starts_with(MAGIC) {
        let word = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().expect("4 bytes"));
        let body_ok = block[16..].iter().all(|&b| b == body(word(8)));
        return format!(
            "generation {} block {:#x}{}",
            word(8),
            u64::from(word(12)) * BLOCK,
            if body_ok { "" } else { " with a wrong body" }
        );
    }
    format!("other bytes ({:02x?}...)", &block[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_generation_to_write_a_block_owns_it() {
        let f = Fill::TWO_GENERATIONS;
        assert_eq!(f.end(), 48 << 20);
        assert_eq!(f.generation_at(0), Some(1));
        assert_eq!(f.generation_at((16 << 20) - 4096), Some(1));
        assert_eq!(f.generation_at(16 << 20), Some(2));
        assert_eq!(f.generation_at((48 << 20) - 4096), Some(2));
        assert_eq!(f.generation_at(48 << 20), None);
        assert_eq!(
            f.cmdline(Reset::Host),
            "checks=virtio-blk-fill blkfill.mb=32 blkfill.step_mb=16 blkfill.offset_mb=0 blkfill.gens=2 blkfill.reset=host"
        );
    }

    #[test]
    fn verify_names_blocks_that_hold_an_older_generation_or_nothing() {
        let f = Fill {
            offset_mib: 1,
            size_mib: 1,
            step_mib: 1,
            gens: 2,
        };
        let mut disk = vec![0u8; 3 << 20];
        for offset in (1 << 20..3u64 << 20).step_by(4096) {
            let block = Fill::block(f.generation_at(offset).unwrap(), offset);
            let at = usize::try_from(offset).expect("a small test disk");
            disk[at..at + 4096].copy_from_slice(&block);
        }
        assert_eq!(f.verify(&disk), Ok(()));
        let stale = Fill::block(1, 2 << 20);
        disk[2 << 20..(2 << 20) + 4096].copy_from_slice(&stale);
        disk[(2 << 20) + 4096..(2 << 20) + 8192].fill(0);
        let err = f.verify(&disk).unwrap_err();
        assert!(err.starts_with("2 blocks wrong"), "{err}");
        assert!(err.contains("holds generation 1 block 0x200000"), "{err}");
        assert!(err.contains("holds zeroes"), "{err}");
    }
}
