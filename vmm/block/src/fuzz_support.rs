//! Entry points shared by the cargo-fuzz targets (`fuzz/`) and the
//! deterministic random-input tests, so CI exercises the same code.

use int_cast::u64_to_usize;
use std::io::Write;

use crate::qcow2::{CreateOptions, Qcow2Image, Qcow2Options, create, header::Header};
use crate::{ConcurrentDisk, DiskBackend, DiskResult, Format, OpenOptions, SharedDisk};

/// Parses arbitrary bytes as a qcow2 first cluster, then (when it parses)
/// as a whole image file. Must never panic, loop or allocate without bound.
pub fn header_input(data: &[u8]) {
    if let Ok(h) = Header::parse(data) {
        // What parses must serialize and parse back to the same header.
        if let Ok(bytes) = h.to_cluster() {
            let again = Header::parse(&bytes);
            assert!(again.is_ok(), "serialized header does not parse: {again:?}");
        }
    }
    let Ok(dir) = tempfile::tempdir() else { return };
    let path = dir.path().join("fuzz.qcow2");
    let Ok(mut f) = std::fs::File::create(&path) else {
        return;
    };
    if f.write_all(data).is_err() {
        return;
    }
    drop(f);
    let opts = Qcow2Options {
        read_only: true,
        ..Qcow2Options::default()
    };
    if let Ok(mut img) = Qcow2Image::open_alone(&path, opts) {
        let size = img.size();
        let mut buf = vec![0u8; 4096];
        for off in [0, size / 2, size.saturating_sub(4096)] {
            if off + 4096 <= size {
                let _ = img.read_at(&mut buf, off);
            }
        }
    }
    let _ = crate::qcow2::check::check(&path);
}

/// The engine a request sequence drives.
enum Engine {
    /// `Qcow2Image`: one request at a time, through `&mut self`.
    Serial(Box<Qcow2Image>),
    /// `ConcurrentDisk`: what the VMM and virtio-blk use (driven from one
    /// thread here, so runs are deterministic).
    Concurrent(ConcurrentDisk),
}

impl Engine {
    fn write(&mut self, buf: &[u8], offset: u64) -> DiskResult<()> {
        match self {
            Engine::Serial(img) => img.write_at(buf, offset),
            Engine::Concurrent(disk) => SharedDisk::write_at(disk, buf, offset),
        }
    }
    fn read(&mut self, buf: &mut [u8], offset: u64) -> DiskResult<()> {
        match self {
            Engine::Serial(img) => img.read_at(buf, offset),
            Engine::Concurrent(disk) => SharedDisk::read_at(disk, buf, offset),
        }
    }
    fn write_zeroes(&mut self, offset: u64, len: u64, unmap: bool) -> DiskResult<()> {
        match self {
            Engine::Serial(img) => img.write_zeroes(offset, len, unmap),
            Engine::Concurrent(disk) => SharedDisk::write_zeroes(disk, offset, len, unmap),
        }
    }
    fn discard(&mut self, offset: u64, len: u64) -> DiskResult<()> {
        match self {
            Engine::Serial(img) => img.discard(offset, len),
            Engine::Concurrent(disk) => SharedDisk::discard(disk, offset, len),
        }
    }
    fn flush(&mut self) -> DiskResult<()> {
        match self {
            Engine::Serial(img) => img.flush(),
            Engine::Concurrent(disk) => SharedDisk::flush(disk),
        }
    }
    fn close(self) -> DiskResult<()> {
        match self {
            Engine::Serial(img) => img.close(),
            Engine::Concurrent(disk) => disk.close(),
        }
    }
}

/// Interprets bytes as a sequence of read/write/discard/zero/flush requests on
/// a small image through the one-request engine, checking every read against
/// an in-memory model of the disk.
pub fn ops_input(data: &[u8]) {
    run_ops(data, false);
}

/// The same sequences through `ConcurrentDisk`, the engine virtio-blk uses.
pub fn concurrent_ops_input(data: &[u8]) {
    run_ops(data, true);
}

fn run_ops(data: &[u8], concurrent: bool) {
    let Some((&cfg, ops)) = data.split_first() else {
        return;
    };
    let cluster_bits = 9 + u32::from(cfg % 4) * 2; // 512 .. 32 KiB
    let refcount_bits = 1u32 << ((cfg >> 2) % 7);
    let size: u64 = 256 << 10;
    let Ok(dir) = tempfile::tempdir() else { return };
    let path = dir.path().join("ops.qcow2");
    create(
        &path,
        &CreateOptions {
            size: Some(size),
            cluster_size: 1 << cluster_bits,
            refcount_bits,
            ..CreateOptions::default()
        },
    )
    .expect("creating a small image");
    let mut img = if concurrent {
        Engine::Concurrent(
            ConcurrentDisk::open(&path, Format::Qcow2, OpenOptions::default()).expect("opening it"),
        )
    } else {
        Engine::Serial(Box::new(
            Qcow2Image::open(&path, Qcow2Options::default()).expect("opening it"),
        ))
    };
    let mut model = vec![0u8; u64_to_usize(size)];
    let mut buf = Vec::new();
    for op in ops.chunks_exact(6) {
        let kind = op[0] % 6;
        let offset = (u64::from(u16::from_le_bytes([op[1], op[2]])) * 7) % size;
        let len = (u64::from(u16::from_le_bytes([op[3], op[4]])) % 20000).min(size - offset);
        let byte = op[5];
        match kind {
            0 | 1 => {
                buf.clear();
                buf.resize(len as usize, byte);
                img.write(&buf, offset).expect("write");
                model[u64_to_usize(offset)..u64_to_usize(offset + len)].fill(byte);
            }
            2 => {
                buf.clear();
                buf.resize(len as usize, 0);
                img.read(&mut buf, offset).expect("read");
                assert!(
                    buf[..] == model[u64_to_usize(offset)..u64_to_usize(offset + len)],
                    "read at {offset}+{len} differs from what was written"
                );
            }
            3 => {
                img.write_zeroes(offset, len, byte & 1 == 1)
                    .expect("write_zeroes");
                model[u64_to_usize(offset)..u64_to_usize(offset + len)].fill(0);
            }
            4 => {
                // Discarded bytes read as zeroes or as before; the model
                // tracks zeroes only where whole clusters were discarded
                // (no backing file: they become unallocated).
                img.discard(offset, len).expect("discard");
                let cs = 1u64 << cluster_bits;
                let first = offset.div_ceil(cs) * cs;
                let end = offset + len;
                let last = if end == size { end } else { end / cs * cs };
                if last > first {
                    model[u64_to_usize(first)..u64_to_usize(last)].fill(0);
                }
            }
            _ => img.flush().expect("flush"),
        }
    }
    img.close().expect("close");
    let report = crate::qcow2::check::check(&path).expect("check");
    assert_eq!(
        (report.corruptions, report.leaks),
        (0, 0),
        "image inconsistent after ops: {:?}",
        report.messages
    );
    let mut img = Qcow2Image::open(
        &path,
        Qcow2Options {
            read_only: true,
            ..Default::default()
        },
    )
    .expect("reopen");
    let mut all = vec![0u8; u64_to_usize(size)];
    img.read_at(&mut all, 0).expect("read back");
    assert!(all == model, "contents differ after reopening");
}
