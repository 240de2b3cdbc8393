//! A simulated image file with a disk's volatile write cache, for the
//! power-loss tests (`tests/power_loss.rs`).
//!
//! Killing a writer (SIGKILL) leaves the host page cache intact, so it
//! cannot show a missing barrier: every write the process made still
//! reaches the disk. A power loss keeps only what a completed sync made
//! durable, plus any part of the writes since: the device and the page
//! cache write back in any order. This file models that: reads see every
//! write; `sync` makes all writes so far durable; a power failure keeps the
//! durable contents and, of each write issued since the last sync, all of
//! it, none of it or some of its 512-byte sectors, chosen at random and
//! independently of the other writes (so a later write may survive an
//! earlier one). The engines reach it through `HostFile`, the one way they
//! touch their image file, so every write and every barrier they issue is
//! seen here.
//!
//! Not a general-purpose API: hidden from the docs, used by the tests.

use int_cast::u64_to_usize;
use int_cast::usize_to_u64;
use std::io;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use crate::host_file::HostFile;
use crate::qcow2::{Qcow2Image, Qcow2Options};
use crate::{ConcurrentDisk, DiskResult};

const SECTOR: usize = 512;

/// One write since the last sync, as the device may still lose it.
enum Unsynced {
    Write { offset: u64, data: Vec<u8> },
    Zero { offset: u64, len: u64 },
    Extend { len: u64 },
}

struct State {
    /// What reads see: every write.
    current: Vec<u8>,
    /// What a power failure keeps for sure: the contents at the last sync.
    durable: Vec<u8>,
    unsynced: Vec<Unsynced>,
    /// Writes, zeroings, extensions and syncs so far.
    ops: u64,
    syncs: u64,
    /// The power fails just before operation number `fail_at`.
    fail_at: Option<u64>,
    /// The file as the power failure left it.
    after_failure: Option<Vec<u8>>,
    rng: u64,
    /// Whether freeing space (hole punching) works, as on most file
    /// systems; without it freed clusters keep their old bytes.
    punch_holes: bool,
}

impl State {
    fn random(&mut self) -> u64 {
        // xorshift64*: deterministic for a seed, good enough for choices.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn coin(&mut self) -> bool {
        self.random() >> 63 == 0
    }

    /// Counts an operation; true when it is lost (the power failed before it).
    fn start_op(&mut self) -> bool {
        if self.after_failure.is_none() && self.fail_at == Some(self.ops) {
            self.fail();
        }
        self.ops += 1;
        self.after_failure.is_some()
    }

    fn fail(&mut self) {
        let mut image = self.durable.clone();
        let unsynced = std::mem::take(&mut self.unsynced);
        for u in &unsynced {
            // All of it, none of it, or a random part of its sectors.
            let keep_all = match self.random() % 8 {
                0..=2 => true,
                3..=5 => continue,
                _ => false,
            };
            match u {
                Unsynced::Write { offset, data } => {
                    let mut at = 0;
                    while at < data.len() {
                        // Pieces end on the file's sector boundaries.
                        let pos = u64_to_usize(*offset) + at;
                        let n = (SECTOR - pos % SECTOR).min(data.len() - at);
                        if keep_all || self.coin() {
                            put(&mut image, pos, &data[at..at + n]);
                        }
                        at += n;
                    }
                }
                Unsynced::Zero { offset, len } => {
                    if keep_all || self.coin() {
                        zero(&mut image, *offset, *len);
                    }
                }
                Unsynced::Extend { len } => {
                    if image.len() < u64_to_usize(*len) {
                        image.resize(u64_to_usize(*len), 0);
                    }
                }
            }
        }
        self.after_failure = Some(image);
    }
}

fn put(image: &mut Vec<u8>, pos: usize, data: &[u8]) {
    if image.len() < pos + data.len() {
        image.resize(pos + data.len(), 0);
    }
    image[pos..pos + data.len()].copy_from_slice(data);
}

/// Zeroes `[offset, offset + len)` inside the file (the size stays).
fn zero(image: &mut [u8], offset: u64, len: u64) {
    let start = u64_to_usize(offset).min(image.len());
    let end = u64_to_usize(offset.saturating_add(len)).min(image.len());
    image[start..end].fill(0);
}

/// The simulated file. Clones share it.
#[derive(Clone)]
pub struct PowerLossFile(Arc<Mutex<State>>);

impl PowerLossFile {
    /// A file holding `contents`, all durable; `seed` drives which unsynced
    /// writes a power failure keeps.
    pub fn new(contents: Vec<u8>, seed: u64) -> PowerLossFile {
        PowerLossFile(Arc::new(Mutex::new(State {
            durable: contents.clone(),
            current: contents,
            unsynced: Vec::new(),
            ops: 0,
            syncs: 0,
            fail_at: None,
            after_failure: None,
            rng: seed | 1,
            punch_holes: true,
        })))
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the power fail just before operation `op` (counted from the
    /// file's creation: see `ops`).
    pub fn fail_before(&self, op: u64) {
        self.state().fail_at = Some(op);
    }

    /// Refuses hole punching from now on (`EOPNOTSUPP`), as some file
    /// systems do: freed clusters then keep their old contents, which a
    /// table written out of order could expose.
    pub fn refuse_hole_punching(&self) {
        self.state().punch_holes = false;
    }

    /// Makes the power fail now.
    pub fn fail_now(&self) {
        let mut s = self.state();
        if s.after_failure.is_none() {
            s.fail();
        }
    }

    /// Operations (writes, zeroings, extensions, syncs) so far.
    pub fn ops(&self) -> u64 {
        self.state().ops
    }

    /// Completed syncs so far.
    pub fn syncs(&self) -> u64 {
        self.state().syncs
    }

    pub fn failed(&self) -> bool {
        self.state().after_failure.is_some()
    }

    /// The file as the power failure left it (`None` before one).
    pub fn after_failure(&self) -> Option<Vec<u8>> {
        self.state().after_failure.clone()
    }

    /// What reads see now.
    pub fn contents(&self) -> Vec<u8> {
        self.state().current.clone()
    }

    pub(crate) fn len(&self) -> u64 {
        usize_to_u64(self.state().current.len())
    }

    pub(crate) fn read(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let s = self.state();
        let start = u64_to_usize(offset).min(s.current.len());
        let n = (s.current.len() - start).min(buf.len());
        buf[..n].copy_from_slice(&s.current[start..start + n]);
        buf[n..].fill(0);
        Ok(())
    }

    pub(crate) fn write(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut s = self.state();
        let lost = s.start_op();
        put(&mut s.current, u64_to_usize(offset), buf);
        if !lost {
            s.unsynced.push(Unsynced::Write {
                offset,
                data: buf.to_vec(),
            });
        }
        Ok(())
    }

    /// Frees a range (it reads as zeroes), where hole punching works.
    pub(crate) fn punch(&self, offset: u64, len: u64) -> io::Result<()> {
        if !self.state().punch_holes {
            return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
        }
        self.zero(offset, len)
    }

    pub(crate) fn zero(&self, offset: u64, len: u64) -> io::Result<()> {
        let mut s = self.state();
        let lost = s.start_op();
        zero(&mut s.current, offset, len);
        if !lost {
            s.unsynced.push(Unsynced::Zero { offset, len });
        }
        Ok(())
    }

    pub(crate) fn extend(&self, len: u64) -> io::Result<()> {
        let mut s = self.state();
        let lost = s.start_op();
        if s.current.len() < u64_to_usize(len) {
            s.current.resize(u64_to_usize(len), 0);
        }
        if !lost {
            s.unsynced.push(Unsynced::Extend { len });
        }
        Ok(())
    }

    pub(crate) fn sync(&self) -> io::Result<()> {
        let mut s = self.state();
        if s.start_op() {
            return Ok(());
        }
        let unsynced = std::mem::take(&mut s.unsynced);
        for u in unsynced {
            match u {
                Unsynced::Write { offset, data } => {
                    put(&mut s.durable, u64_to_usize(offset), &data)
                }
                Unsynced::Zero { offset, len } => zero(&mut s.durable, offset, len),
                Unsynced::Extend { len } => {
                    if s.durable.len() < u64_to_usize(len) {
                        s.durable.resize(u64_to_usize(len), 0);
                    }
                }
            }
        }
        s.syncs += 1;
        Ok(())
    }
}

/// Opens the qcow2 image held in `file` with the one-request engine.
/// `path` names it: backing file names resolve against its directory.
pub fn open_qcow2(path: &Path, file: &PowerLossFile, opts: Qcow2Options) -> DiskResult<Qcow2Image> {
    Qcow2Image::open_file(HostFile::simulated(file.clone()), path, opts)
}

/// Opens the qcow2 image held in `file` as a `ConcurrentDisk`.
pub fn open_concurrent(
    path: &Path,
    file: &PowerLossFile,
    opts: Qcow2Options,
) -> DiskResult<ConcurrentDisk> {
    ConcurrentDisk::from_qcow2(open_qcow2(path, file, opts)?)
}
