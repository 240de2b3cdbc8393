//! Host-side cost of the devices, without KVM: requests submitted through the
//! virtio-mmio registers and a split ring in guest memory, as a driver would,
//! 32 per notification. virtio-blk runs against an in-memory disk (the
//! device's own cost; `Block::new`, one request at a time) and against a
//! raw file through `ConcurrentDisk`, in the page cache (cache=writeback)
//! and with O_DIRECT (cache=none, where host I/O latency dominates), each with the
//! batch run on the notifying thread alone (`io_threads: 0`) and on the
//! default I/O threads; the ratio is threads / alone. Prints requests per
//! second and bandwidth.
//!
//! `cargo bench -p virtio-devices --bench devices [-- DIR]` (DIR: where the
//! raw file goes; default the current directory, which must allow O_DIRECT)

use std::sync::Arc;
use std::time::Instant;

use virtio_devices::GuestMemoryMmap;
use virtio_devices::block::{Block, BlockOptions};
use virtio_devices::fuzz::MemDisk;
use virtio_devices::rng::Rng;
use virtio_devices::{InterruptTrigger, MmioTransport, VirtioDevice};
use vm_memory::{Bytes, GuestAddress};

struct NoIrq;
impl InterruptTrigger for NoIrq {
    fn trigger(&self) -> std::io::Result<()> {
        Ok(())
    }
}

const QSIZE: u16 = 256;
const DESC: u64 = 0x1000;
const AVAIL: u64 = 0x2000;
const USED: u64 = 0x3000;
const HDR: u64 = 0x10_0000;
const STATUS: u64 = 0x10_1000;
const DATA: u64 = 0x20_0000;

struct Driver {
    mem: GuestMemoryMmap,
    t: MmioTransport,
    avail_idx: u16,
}

impl Driver {
    fn new(dev: Box<dyn VirtioDevice>) -> Driver {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 16 << 20)]).unwrap();
        let mut t = MmioTransport::new(dev, mem.clone(), Arc::new(NoIrq));
        let mut w = |reg: u64, v: u32| t.write(reg, &v.to_le_bytes());
        w(0x70, 1);
        w(0x70, 3);
        w(0x24, 1);
        w(0x20, 1); // VERSION_1
        w(0x70, 11);
        w(0x30, 0);
        w(0x38, u32::from(QSIZE));
        w(0x80, u32::try_from(DESC).expect("below 4 GiB"));
        w(0x90, u32::try_from(AVAIL).expect("below 4 GiB"));
        w(0xa0, u32::try_from(USED).expect("below 4 GiB"));
        w(0x44, 1);
        w(0x70, 15);
        Driver {
            mem,
            t,
            avail_idx: 0,
        }
    }

    fn desc(&self, i: u16, addr: u64, len: u32, flags: u16, next: u16) {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..].copy_from_slice(&next.to_le_bytes());
        self.mem
            .write_slice(&raw, GuestAddress(DESC + u64::from(i) * 16))
            .unwrap();
    }

    /// Makes chain `head` available `n` times and notifies once per batch.
    fn submit(&mut self, head: u16, n: u16) {
        for _ in 0..n {
            let slot = AVAIL + 4 + u64::from(self.avail_idx % QSIZE) * 2;
            self.mem.write_obj(head, GuestAddress(slot)).unwrap();
            self.avail_idx = self.avail_idx.wrapping_add(1);
        }
        self.mem
            .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
            .unwrap();
        self.t.write(0x50, &0u32.to_le_bytes());
        let used: u16 = self.mem.read_obj(GuestAddress(USED + 2)).unwrap();
        assert_eq!(used, self.avail_idx, "every request completed");
    }
}

/// Where a benchmark disk lives.
#[derive(Clone, Copy)]
enum Backing<'a> {
    Memory,
    /// A raw file through the page cache (cache=writeback).
    Cached(&'a std::path::Path),
    /// A raw file opened with O_DIRECT (cache=none).
    Direct(&'a std::path::Path),
}

fn device(backing: Backing<'_>, io_threads: usize) -> Block {
    let options = BlockOptions {
        io_threads,
        ..BlockOptions::default()
    };
    match backing {
        Backing::Memory => Block::new(Box::new(MemDisk::new(64 << 20)), options),
        Backing::Cached(path) | Backing::Direct(path) => {
            let opts = block::OpenOptions {
                read_only: false,
                direct: matches!(backing, Backing::Direct(_)),
                ..block::OpenOptions::default()
            };
            let disk = block::ConcurrentDisk::open(path, block::Format::Raw, opts)
                .expect("open the benchmark file");
            Block::shared(Arc::new(disk), options)
        }
    }
}

fn blk(dev: Block, kind: u32, bytes: u32, batch: u16, rounds: u32) -> (f64, f64) {
    let mut d = Driver::new(Box::new(dev));
    let mut hdr = [0u8; 16];
    hdr[..4].copy_from_slice(&kind.to_le_bytes());
    hdr[8..].copy_from_slice(&8u64.to_le_bytes());
    d.mem.write_slice(&hdr, GuestAddress(HDR)).unwrap();
    let data_flags = if kind == 0 { 2 } else { 0 };
    // The same three-descriptor chain, made available `batch` times per
    // notification (allowed: the device only reads it).
    d.desc(0, HDR, 16, 1, 1);
    d.desc(1, DATA, bytes, data_flags | 1, 2);
    d.desc(2, STATUS, 1, 2, 0);
    let start = Instant::now();
    for _ in 0..rounds {
        d.submit(0, batch);
    }
    let secs = start.elapsed().as_secs_f64();
    let requests = f64::from(rounds) * f64::from(batch);
    (
        requests / secs,
        requests * f64::from(bytes) / secs / f64::from(1 << 20),
    )
}

fn rng() -> f64 {
    let mut d = Driver::new(Box::new(Rng::new()));
    d.desc(0, DATA, 64, 2, 0);
    let rounds = 2000u32;
    let start = Instant::now();
    for _ in 0..rounds {
        d.submit(0, 16);
    }
    f64::from(rounds) * 16.0 / start.elapsed().as_secs_f64()
}

fn main() {
    let dir = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_else(|| ".".into());
    let file = tempfile::Builder::new()
        .prefix("virtio-blk-bench")
        .tempfile_in(&dir)
        .expect("benchmark file");
    file.as_file()
        .set_len(64 << 20)
        .expect("size the benchmark file");
    // Real blocks, not a hole: reads then reach the disk.
    std::fs::write(file.path(), vec![0x5a; 64 << 20]).expect("fill the benchmark file");
    println!(
        "{:18} {:8} {:>12} {:>9} {:>12} {:>9} {:>6}",
        "request", "disk", "alone req/s", "MiB/s", "threads req/s", "MiB/s", "ratio"
    );
    for (backing, label, rounds) in [
        (Backing::Memory, "memory", 2000),
        (Backing::Cached(file.path()), "cached", 1000),
        (Backing::Direct(file.path()), "O_DIRECT", 200),
    ] {
        for (name, kind, bytes) in [
            ("blk read 4 KiB", 0, 4096),
            ("blk write 4 KiB", 1, 4096),
            ("blk read 64 KiB", 0, 65536),
            ("blk write 64 KiB", 1, 65536),
        ] {
            let (alone, alone_mibs) = blk(device(backing, 0), kind, bytes, 32, rounds);
            if matches!(backing, Backing::Memory) {
                // `Block::new` always runs requests on the notifying thread.
                println!("{name:18} {label:8} {alone:>12.0} {alone_mibs:>9.0}");
                continue;
            }
            let threads = virtio_devices::block::DEFAULT_IO_THREADS;
            let (many, many_mibs) = blk(device(backing, threads), kind, bytes, 32, rounds);
            println!(
                "{name:18} {label:8} {alone:>12.0} {alone_mibs:>9.0} {many:>12.0} {many_mibs:>9.0} {:>6.2}",
                many / alone
            );
        }
    }
    println!("{:18} {:>10.0} requests/s", "rng 64 B", rng());
}
