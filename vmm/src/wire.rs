//! The migration stream's format: a header, then frames.
//!
//! The receiving side reads it as untrusted input (a compromised or broken source, a
//! stranger on the socket): every length is checked against a fixed bound before
//! anything is allocated, every frame kind and field is checked, and a payload must be
//! used up exactly. Written by hand rather than with a serde format: the payloads are
//! KVM's own fixed-size structures (moved as their bytes, `zerocopy`), and a small
//! framing whose every limit is visible here is easier to check than a general decoder.
//!
//! ```text
//! header   "KVRS-MIG" | version u32 | layout: memory bytes u64, vCPUs u8,
//!          devices (u16 length, ≤ 4 KiB, UTF-8)
//! frame    kind u8 | length u32 (≤ MAX_FRAME) | payload
//! reply    (target → source, once) status u8 | u32 length (≤ 4 KiB) | payload
//! ```
//!
//! All integers are little-endian.

use std::io::{Read, Write};

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// The stream's first bytes.
pub(crate) const MAGIC: [u8; 8] = *b"KVRS-MIG";
/// The format's version; a receiver refuses any other.
pub(crate) const VERSION: u32 = 1;
/// Guest pages are moved in 4 KiB units (the dirty log's granularity on x86).
pub(crate) const PAGE: u64 = 4096;
/// Pages in one `Pages` frame at most (1 MiB of data).
pub(crate) const MAX_PAGES_PER_FRAME: u32 = 256;
/// The largest frame payload: a full `Pages` frame and its address.
pub(crate) const MAX_FRAME: u32 = MAX_PAGES_PER_FRAME * 4096 + 16;
/// Disk bytes in one `DiskData` frame at most (1 MiB, as a `Pages` frame).
pub(crate) const MAX_DISK_DATA: u64 = 1 << 20;
/// Disks are copied in whole sectors.
pub(crate) const SECTOR: u64 = 512;
/// The device layout's description at most.
const MAX_DEVICES_TEXT: u16 = 4096;
/// A reply's text at most.
const MAX_REPLY: u32 = 4096;

/// What a frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Kind {
    /// `gpa u64 | count u32 | count × 4 KiB`: guest pages with their contents.
    Pages = 1,
    /// `gpa u64 | count u64`: guest pages that are all zeros.
    ZeroPages = 2,
    /// The VM-wide state: interrupt controllers, PIT, clock, devices (`platform`).
    Platform = 3,
    /// `index u8 | state`: one vCPU's state (`vcpu`).
    Vcpu = 4,
    /// Nothing more follows: the target restores and starts the VM, then replies.
    Complete = 5,
    /// The source gave up (cancelled, timed out): the target discards the VM.
    Abort = 6,
    /// (Optional, before `Complete`.) The VM was paused by its owner on the source: it
    /// stays paused on the target.
    Paused = 7,
    /// `count u8 | count × (size u64 | read-only u8)`: the disks, first of all; the
    /// target checks them against its own before any disk data.
    Disks = 8,
    /// `disk u8 | offset u64 | bytes`: guest-visible contents of a copied disk
    /// (sector aligned, at most [`MAX_DISK_DATA`] bytes).
    DiskData = 9,
    /// `disk u8 | offset u64 | length u64`: a range of a copied disk that reads as zeros.
    DiskZeroes = 10,
}

impl Kind {
    fn from_u8(value: u8) -> Option<Kind> {
        Some(match value {
            1 => Kind::Pages,
            2 => Kind::ZeroPages,
            3 => Kind::Platform,
            4 => Kind::Vcpu,
            5 => Kind::Complete,
            6 => Kind::Abort,
            7 => Kind::Paused,
            8 => Kind::Disks,
            9 => Kind::DiskData,
            10 => Kind::DiskZeroes,
            _ => return None,
        })
    }
}

/// A malformed stream, with what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("not a migration stream (magic {0:02x?})")]
    Magic([u8; 8]),
    #[error("migration stream version {0}, this VMM reads version {VERSION}")]
    Version(u32),
    #[error("unknown frame kind {0}")]
    Kind(u8),
    #[error("{what} of {len} bytes is larger than the limit of {max}")]
    TooLong {
        what: &'static str,
        len: u64,
        max: u64,
    },
    #[error("{0} ends early")]
    Truncated(&'static str),
    #[error("{what} has {extra} bytes left over")]
    Trailing { what: &'static str, extra: usize },
    #[error("{0}")]
    Invalid(String),
}

/// Why reading or writing the stream failed.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("migration stream: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed migration stream: {0}")]
    Format(#[from] FormatError),
}

/// What must be the same on both sides: the target builds the same VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) memory_bytes: u64,
    pub(crate) vcpus: u8,
    /// The devices, as `platform::describe_devices` names them.
    pub(crate) devices: String,
}

pub(crate) fn write_header(out: &mut impl Write, layout: &Layout) -> Result<(), WireError> {
    let devices = layout.devices.as_bytes();
    let len = u16::try_from(devices.len())
        .ok()
        .filter(|&len| len <= MAX_DEVICES_TEXT)
        .ok_or(FormatError::TooLong {
            what: "the device layout",
            len: devices.len() as u64,
            max: u64::from(MAX_DEVICES_TEXT),
        })?;
    let mut e = Encoder::default();
    e.bytes(&MAGIC);
    e.u32(VERSION);
    e.u64(layout.memory_bytes);
    e.u8(layout.vcpus);
    e.u16(len);
    e.bytes(devices);
    out.write_all(&e.0)?;
    Ok(())
}

pub(crate) fn read_header(input: &mut impl Read) -> Result<Layout, WireError> {
    let mut fixed = [0u8; 8 + 4 + 8 + 1 + 2];
    read_exact(input, &mut fixed, "the header")?;
    let mut d = Decoder::new(&fixed, "the header");
    let magic: [u8; 8] = d.array()?;
    if magic != MAGIC {
        return Err(FormatError::Magic(magic).into());
    }
    let version = d.u32()?;
    if version != VERSION {
        return Err(FormatError::Version(version).into());
    }
    let memory_bytes = d.u64()?;
    let vcpus = d.u8()?;
    let len = d.u16()?;
    if len > MAX_DEVICES_TEXT {
        return Err(FormatError::TooLong {
            what: "the device layout",
            len: u64::from(len),
            max: u64::from(MAX_DEVICES_TEXT),
        }
        .into());
    }
    let mut devices = vec![0u8; usize::from(len)];
    read_exact(input, &mut devices, "the device layout")?;
    let devices = String::from_utf8(devices)
        .map_err(|_| FormatError::Invalid("the device layout is not UTF-8".into()))?;
    Ok(Layout {
        memory_bytes,
        vcpus,
        devices,
    })
}

pub(crate) fn write_frame(
    out: &mut impl Write,
    kind: Kind,
    payload: &[u8],
) -> Result<(), WireError> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&len| len <= MAX_FRAME)
        .ok_or(FormatError::TooLong {
            what: "a frame",
            len: payload.len() as u64,
            max: u64::from(MAX_FRAME),
        })?;
    let mut head = [0u8; 5];
    head[0] = kind as u8;
    head[1..].copy_from_slice(&len.to_le_bytes());
    out.write_all(&head)?;
    out.write_all(payload)?;
    Ok(())
}

/// Reads the next frame into `buf` (reused between frames); returns its kind.
pub(crate) fn read_frame(input: &mut impl Read, buf: &mut Vec<u8>) -> Result<Kind, WireError> {
    let mut head = [0u8; 5];
    read_exact(input, &mut head, "a frame header")?;
    let kind = Kind::from_u8(head[0]).ok_or(FormatError::Kind(head[0]))?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_FRAME {
        return Err(FormatError::TooLong {
            what: "a frame",
            len: u64::from(len),
            max: u64::from(MAX_FRAME),
        }
        .into());
    }
    buf.clear();
    buf.resize(int_cast::u32_to_usize(len), 0);
    read_exact(input, buf, "a frame")?;
    Ok(kind)
}

/// The target's one answer, after `Complete` (or on failure, at any time).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// The VM runs on the target; its vCPUs were released at this `CLOCK_MONOTONIC`
    /// time (nanoseconds; both sides on one host share the clock: the downtime).
    Running { released_at_ns: u64 },
    /// The target could not take the VM; the source keeps it.
    Failed(String),
}

pub(crate) fn write_reply(out: &mut impl Write, reply: &Reply) -> Result<(), WireError> {
    let (status, payload) = match reply {
        Reply::Running { released_at_ns } => (0u8, released_at_ns.to_le_bytes().to_vec()),
        Reply::Failed(message) => {
            let mut text = message.as_bytes().to_vec();
            text.truncate(int_cast::u32_to_usize(MAX_REPLY));
            (1, text)
        }
    };
    let mut e = Encoder::default();
    e.u8(status);
    e.u32(u32::try_from(payload.len()).unwrap_or(MAX_REPLY));
    e.bytes(&payload);
    out.write_all(&e.0)?;
    out.flush()?;
    Ok(())
}

pub(crate) fn read_reply(input: &mut impl Read) -> Result<Reply, WireError> {
    let mut head = [0u8; 5];
    read_exact(input, &mut head, "the target's reply")?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_REPLY {
        return Err(FormatError::TooLong {
            what: "the target's reply",
            len: u64::from(len),
            max: u64::from(MAX_REPLY),
        }
        .into());
    }
    let mut payload = vec![0u8; int_cast::u32_to_usize(len)];
    read_exact(input, &mut payload, "the target's reply")?;
    let mut d = Decoder::new(&payload, "the target's reply");
    let reply = match head[0] {
        0 => Reply::Running {
            released_at_ns: d.u64()?,
        },
        1 => {
            return Ok(Reply::Failed(
                String::from_utf8_lossy(&payload).into_owned(),
            ));
        }
        other => {
            return Err(FormatError::Invalid(format!("unknown reply status {other}")).into());
        }
    };
    d.finish()?;
    Ok(reply)
}

/// `read_exact`, with an early end of the stream named.
fn read_exact(input: &mut impl Read, buf: &mut [u8], what: &'static str) -> Result<(), WireError> {
    input.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => WireError::Format(FormatError::Truncated(what)),
        _ => WireError::Io(e),
    })
}

/// Builds a payload.
#[derive(Default)]
pub(crate) struct Encoder(pub(crate) Vec<u8>);

impl Encoder {
    pub(crate) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn i128(&mut self, v: i128) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(crate) fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    /// A byte string of at most `u16::MAX` bytes, its length first.
    pub(crate) fn short_bytes(&mut self, v: &[u8]) {
        let len = u16::try_from(v.len()).unwrap_or(u16::MAX);
        self.u16(len);
        self.bytes(&v[..usize::from(len)]);
    }
    /// A KVM structure, as its bytes.
    pub(crate) fn pod<T: IntoBytes + Immutable>(&mut self, v: &T) {
        self.0.extend_from_slice(v.as_bytes());
    }
}

/// Reads a payload; every read is bounds-checked and `finish` refuses leftovers.
pub(crate) struct Decoder<'a> {
    rest: &'a [u8],
    what: &'static str,
}

impl<'a> Decoder<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Decoder { rest: buf, what }
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], FormatError> {
        if n > self.rest.len() {
            return Err(FormatError::Truncated(self.what));
        }
        let (head, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(head)
    }

    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N], FormatError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self) -> Result<u8, FormatError> {
        Ok(self.array::<1>()?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, FormatError> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, FormatError> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, FormatError> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn i128(&mut self) -> Result<i128, FormatError> {
        Ok(i128::from_le_bytes(self.array()?))
    }
    /// A `u16` count of what follows, at most `max`.
    pub(crate) fn count(&mut self, max: usize, what: &'static str) -> Result<usize, FormatError> {
        let n = usize::from(self.u16()?);
        if n > max {
            return Err(FormatError::TooLong {
                what,
                len: n as u64,
                max: max as u64,
            });
        }
        Ok(n)
    }
    /// A byte string written by [`Encoder::short_bytes`], at most `max` bytes.
    pub(crate) fn short_bytes(
        &mut self,
        max: usize,
        what: &'static str,
    ) -> Result<&'a [u8], FormatError> {
        let len = self.count(max, what)?;
        self.take(len)
    }
    /// A KVM structure from its bytes (any bytes make a value; KVM checks the values).
    pub(crate) fn pod<T: FromBytes>(&mut self) -> Result<T, FormatError> {
        let bytes = self.take(std::mem::size_of::<T>())?;
        T::read_from_bytes(bytes).map_err(|_| FormatError::Truncated(self.what))
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.rest.len()
    }

    /// Everything was read.
    pub(crate) fn finish(self) -> Result<(), FormatError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(FormatError::Trailing {
                what: self.what,
                extra: self.rest.len(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> Layout {
        Layout {
            memory_bytes: 64 << 20,
            vcpus: 2,
            devices: "transport=pci".into(),
        }
    }

    #[test]
    fn a_header_and_frames_read_back() {
        let mut out = Vec::new();
        write_header(&mut out, &layout()).unwrap();
        write_frame(&mut out, Kind::ZeroPages, &[1, 2, 3]).unwrap();
        write_frame(&mut out, Kind::Complete, &[]).unwrap();
        let mut input = out.as_slice();
        assert_eq!(read_header(&mut input).unwrap(), layout());
        let mut buf = Vec::new();
        assert_eq!(read_frame(&mut input, &mut buf).unwrap(), Kind::ZeroPages);
        assert_eq!(buf, [1, 2, 3]);
        assert_eq!(read_frame(&mut input, &mut buf).unwrap(), Kind::Complete);
        assert!(buf.is_empty());
        assert!(input.is_empty());
    }

    fn format_error(result: Result<impl std::fmt::Debug, WireError>) -> String {
        match result {
            Err(WireError::Format(e)) => e.to_string(),
            other => panic!("expected a format error, got {other:?}"),
        }
    }

    #[test]
    fn bad_headers_are_refused_with_what_was_wrong() {
        let mut good = Vec::new();
        write_header(&mut good, &layout()).unwrap();

        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(format_error(read_header(&mut bad.as_slice())).contains("not a migration stream"));

        let mut bad = good.clone();
        bad[8..12].copy_from_slice(&2u32.to_le_bytes());
        assert!(format_error(read_header(&mut bad.as_slice())).contains("version 2"));

        let mut bad = good.clone();
        bad[21..23].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(format_error(read_header(&mut bad.as_slice())).contains("larger than the limit"));

        for cut in [0, 5, 22, good.len() - 1] {
            assert!(format_error(read_header(&mut &good[..cut])).contains("ends early"));
        }

        let mut bad = good.clone();
        let last = bad.len() - 1;
        bad[last] = 0xff;
        assert!(format_error(read_header(&mut bad.as_slice())).contains("UTF-8"));
    }

    #[test]
    fn oversized_unknown_and_cut_frames_are_refused_before_any_allocation() {
        let mut buf = Vec::new();
        let huge = [Kind::Pages as u8, 0xff, 0xff, 0xff, 0xff];
        assert!(format_error(read_frame(&mut huge.as_slice(), &mut buf)).contains("larger"));
        assert!(
            buf.capacity() < 1 << 20,
            "no allocation for an oversized length"
        );
        let unknown = [0x42, 0, 0, 0, 0];
        assert!(format_error(read_frame(&mut unknown.as_slice(), &mut buf)).contains("kind 66"));
        let cut = [Kind::Platform as u8, 10, 0, 0, 0, 1, 2];
        assert!(format_error(read_frame(&mut cut.as_slice(), &mut buf)).contains("ends early"));
        assert!(
            write_frame(
                &mut Vec::new(),
                Kind::Pages,
                &vec![0; MAX_FRAME as usize + 1]
            )
            .is_err()
        );
    }

    #[test]
    fn replies_read_back_and_bad_ones_are_refused() {
        for reply in [
            Reply::Running {
                released_at_ns: 123_456,
            },
            Reply::Failed("no room".into()),
        ] {
            let mut out = Vec::new();
            write_reply(&mut out, &reply).unwrap();
            assert_eq!(read_reply(&mut out.as_slice()).unwrap(), reply);
        }
        assert!(format_error(read_reply(&mut [9u8, 0, 0, 0, 0].as_slice())).contains("status 9"));
        assert!(format_error(read_reply(&mut [0u8, 0, 0, 1, 0].as_slice())).contains("larger"));
        assert!(
            format_error(read_reply(
                &mut [0u8, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0].as_slice()
            ))
            .contains("left over")
        );
    }

    #[test]
    fn a_decoder_checks_every_read_and_leftovers() {
        let bytes = [1u8, 2, 0, 3];
        let mut d = Decoder::new(&bytes, "test payload");
        assert_eq!(d.u8().unwrap(), 1);
        assert_eq!(d.u16().unwrap(), 2);
        assert!(d.u32().unwrap_err().to_string().contains("ends early"));
        let mut d = Decoder::new(&bytes, "test payload");
        d.u8().unwrap();
        assert!(
            d.finish()
                .unwrap_err()
                .to_string()
                .contains("3 bytes left over")
        );
        let mut d = Decoder::new(&[5, 0, 1, 2, 3, 4, 5], "test payload");
        assert!(d.short_bytes(4, "a string").is_err());
    }
}
