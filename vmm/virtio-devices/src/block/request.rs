//! Parsing a virtio-blk request out of a validated descriptor chain.
//!
//! A request is `header | data... | status` (virtio 1.2 §5.2.6). The chain
//! has already been checked as a whole (every buffer inside guest memory,
//! readable before writable, see [`crate::chain`]); this module checks what a
//! block request must look like, one error per rule, so that execution only
//! sees requests that are safe to run against the disk:
//!
//! - the last buffer is device-writable and exactly 1 byte: the status;
//! - the first buffer is device-readable and holds the 16-byte header;
//! - no more data buffers than the advertised `seg_max`;
//! - data buffers point the right way (the device writes only into buffers
//!   the driver marked writable, reads only from readable ones);
//! - reads and writes move whole 512-byte sectors, and the sector range,
//!   computed without overflow, lies inside the disk;
//! - discard / write-zeroes segments are well formed and inside the disk;
//! - writes to a read-only disk and unknown request types are refused.

use crate::GuestMemoryMmap;
use int_cast::usize_to_u64;
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_UNSUPP, VIRTIO_BLK_T_DISCARD,
    VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
    VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use vm_memory::{Address, Bytes, GuestAddress};

use crate::chain::{Buffer, ValidatedChain};

/// Bytes per virtio-blk sector, whatever the disk's block size.
pub(crate) const SECTOR_SIZE: u64 = 512;
const SECTOR_SHIFT: u32 = 9;
/// `struct virtio_blk_outhdr`: type, ioprio, sector.
pub(crate) const HEADER_SIZE: u32 = 16;
/// `struct virtio_blk_discard_write_zeroes`: sector, num_sectors, flags.
pub(crate) const SEGMENT_SIZE: u32 = 16;

/// What the device advertises and the request must respect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DiskLimits {
    /// Disk size in 512-byte sectors.
    pub(crate) capacity: u64,
    pub(crate) read_only: bool,
    /// `VIRTIO_BLK_F_DISCARD` offered.
    pub(crate) discard: bool,
    /// `VIRTIO_BLK_F_WRITE_ZEROES` offered.
    pub(crate) write_zeroes: bool,
    /// Most segments in one discard / write-zeroes request.
    pub(crate) max_segments: u32,
    /// Most sectors in one discard / write-zeroes segment.
    pub(crate) max_segment_sectors: u32,
    /// Most data buffers in one request (`seg_max` in the config space).
    pub(crate) max_data_buffers: u32,
}

/// One range of a discard or write-zeroes request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) sector: u64,
    pub(crate) sectors: u32,
    /// Write-zeroes only: the device may deallocate the range.
    pub(crate) unmap: bool,
}

/// A request that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RequestKind {
    /// Read `data` (device-writable buffers) from `sector` on.
    Read {
        sector: u64,
        data: Vec<Buffer>,
    },
    /// Write `data` (device-readable buffers) at `sector`.
    Write {
        sector: u64,
        data: Vec<Buffer>,
    },
    Flush,
    /// Write the device ID string into `data`.
    GetId {
        data: Vec<Buffer>,
    },
    Discard {
        segments: Vec<Segment>,
    },
    WriteZeroes {
        segments: Vec<Segment>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Request {
    pub(crate) kind: RequestKind,
    /// Where the one status byte goes.
    pub(crate) status: GuestAddress,
}

/// Why a request was refused; one variant per rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum RequestError {
    #[error("the last descriptor (status) is not device-writable")]
    StatusNotWritable,
    #[error("the status descriptor is {len} bytes, not 1")]
    StatusLength { len: u32 },
    #[error("the chain has no header before the status")]
    MissingHeader,
    #[error("the header descriptor is device-writable")]
    HeaderNotReadable,
    #[error("the header descriptor is {len} bytes, less than {HEADER_SIZE}")]
    HeaderTooShort { len: u32 },
    #[error("the header could not be read from guest memory")]
    HeaderUnreadable,
    #[error("request type {0} is not supported")]
    Unsupported(u32),
    #[error("{count} data buffers, more than the advertised seg_max {max}")]
    TooManyDataBuffers { count: usize, max: u32 },
    #[error("a {request} request needs data buffers")]
    MissingData { request: &'static str },
    #[error("a {request} request carries data buffers")]
    UnexpectedData { request: &'static str },
    #[error("a {request} request has a data buffer the device may not write")]
    DataNotWritable { request: &'static str },
    #[error("a {request} request has a data buffer the device may not read")]
    DataNotReadable { request: &'static str },
    #[error("data length {len} is not a multiple of {SECTOR_SIZE}")]
    DataLengthNotSectorMultiple { len: u64 },
    #[error("sector range {sector} + {sectors} overflows")]
    SectorOverflow { sector: u64, sectors: u64 },
    #[error("sectors [{sector}, +{sectors}) are outside the disk of {capacity} sectors")]
    SectorOutOfRange {
        sector: u64,
        sectors: u64,
        capacity: u64,
    },
    #[error("the disk is read-only")]
    ReadOnly,
    #[error("segment data length {len} is not a multiple of {SEGMENT_SIZE}")]
    SegmentLength { len: u64 },
    #[error("{count} segments, more than the advertised {max}")]
    TooManySegments { count: u64, max: u32 },
    #[error("segment of {sectors} sectors, more than the advertised {max}")]
    SegmentTooLarge { sectors: u32, max: u32 },
    #[error("segment flags {flags:#x} are not valid for this request")]
    SegmentFlags { flags: u32 },
    #[error("segment could not be read from guest memory")]
    SegmentUnreadable,
}

impl RequestError {
    /// The virtio-blk status the driver gets for this error.
    pub(crate) fn status(&self) -> u8 {
        match self {
            RequestError::Unsupported(_) | RequestError::SegmentFlags { .. } => {
                const { int_cast::u8_of_u32(VIRTIO_BLK_S_UNSUPP) }
            }
            _ => const { int_cast::u8_of_u32(VIRTIO_BLK_S_IOERR) },
        }
    }
}

/// A refused request and where to report it. `status` is `None` when the
/// chain has no usable status byte: the driver then only gets the chain back
/// with a used length of 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub(crate) error: RequestError,
    pub(crate) status: Option<GuestAddress>,
}

/// Parses and checks one request.
pub(crate) fn parse(
    chain: &ValidatedChain,
    mem: &GuestMemoryMmap,
    limits: &DiskLimits,
) -> Result<Request, Refused> {
    let buffers = chain.buffers();
    let no_status = |error| Refused {
        error,
        status: None,
    };
    // A validated chain is never empty.
    let Some((status_buf, rest)) = buffers.split_last() else {
        return Err(no_status(RequestError::MissingHeader));
    };
    if !status_buf.writable {
        return Err(no_status(RequestError::StatusNotWritable));
    }
    // The status byte ends the request: the last byte of the last buffer.
    // (Validated chains have no zero-length buffers and no address wrap; the
    // checked forms keep this panic-free regardless.)
    let Some(status) = status_buf
        .addr
        .checked_add(u64::from(status_buf.len).saturating_sub(1))
    else {
        return Err(no_status(RequestError::StatusLength {
            len: status_buf.len,
        }));
    };
    let refuse = |error| Refused {
        error,
        status: Some(status),
    };
    if status_buf.len != 1 {
        return Err(refuse(RequestError::StatusLength {
            len: status_buf.len,
        }));
    }
    match parse_after_status(rest, mem, limits) {
        Ok(kind) => Ok(Request { kind, status }),
        Err(error) => Err(refuse(error)),
    }
}

/// Everything before the status byte: header, then data.
fn parse_after_status(
    rest: &[Buffer],
    mem: &GuestMemoryMmap,
    limits: &DiskLimits,
) -> Result<RequestKind, RequestError> {
    let (header_buf, data) = rest.split_first().ok_or(RequestError::MissingHeader)?;
    if header_buf.writable {
        return Err(RequestError::HeaderNotReadable);
    }
    if header_buf.len < HEADER_SIZE {
        return Err(RequestError::HeaderTooShort {
            len: header_buf.len,
        });
    }
    let mut header = [0u8; int_cast::u32_to_usize(HEADER_SIZE)];
    mem.read_slice(&mut header, header_buf.addr)
        .map_err(|_| RequestError::HeaderUnreadable)?;
    let request_type = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    if usize_to_u64(data.len()) > u64::from(limits.max_data_buffers) {
        return Err(RequestError::TooManyDataBuffers {
            count: data.len(),
            max: limits.max_data_buffers,
        });
    }
    let sector = u64::from_le_bytes([
        header[8], header[9], header[10], header[11], header[12], header[13], header[14],
        header[15],
    ]);

    Ok(match request_type {
        VIRTIO_BLK_T_IN => {
            require_data(data, "read", true)?;
            check_sectors(sector, data, limits)?;
            RequestKind::Read {
                sector,
                data: data.to_vec(),
            }
        }
        VIRTIO_BLK_T_OUT => {
            require_data(data, "write", false)?;
            require_writable_disk(limits)?;
            check_sectors(sector, data, limits)?;
            RequestKind::Write {
                sector,
                data: data.to_vec(),
            }
        }
        VIRTIO_BLK_T_FLUSH => {
            if !data.is_empty() {
                return Err(RequestError::UnexpectedData { request: "flush" });
            }
            RequestKind::Flush
        }
        VIRTIO_BLK_T_GET_ID => {
            require_data(data, "get-id", true)?;
            RequestKind::GetId {
                data: data.to_vec(),
            }
        }
        VIRTIO_BLK_T_DISCARD if limits.discard => {
            require_data(data, "discard", false)?;
            require_writable_disk(limits)?;
            RequestKind::Discard {
                segments: read_segments(data, mem, limits, false)?,
            }
        }
        VIRTIO_BLK_T_WRITE_ZEROES if limits.write_zeroes => {
            require_data(data, "write-zeroes", false)?;
            require_writable_disk(limits)?;
            RequestKind::WriteZeroes {
                segments: read_segments(data, mem, limits, true)?,
            }
        }
        other => return Err(RequestError::Unsupported(other)),
    })
}

fn require_writable_disk(limits: &DiskLimits) -> Result<(), RequestError> {
    if limits.read_only {
        Err(RequestError::ReadOnly)
    } else {
        Ok(())
    }
}

/// Data buffers exist and all point the way the request needs.
fn require_data(
    data: &[Buffer],
    request: &'static str,
    device_writes: bool,
) -> Result<(), RequestError> {
    if data.is_empty() {
        return Err(RequestError::MissingData { request });
    }
    if data.iter().any(|b| b.writable != device_writes) {
        return Err(if device_writes {
            RequestError::DataNotWritable { request }
        } else {
            RequestError::DataNotReadable { request }
        });
    }
    Ok(())
}

/// Whole sectors, no overflow, inside the disk.
fn check_sectors(sector: u64, data: &[Buffer], limits: &DiskLimits) -> Result<(), RequestError> {
    let len = ValidatedChain::total_len(data);
    if !len.is_multiple_of(SECTOR_SIZE) {
        return Err(RequestError::DataLengthNotSectorMultiple { len });
    }
    check_range(sector, len >> SECTOR_SHIFT, limits.capacity)
}

fn check_range(sector: u64, sectors: u64, capacity: u64) -> Result<(), RequestError> {
    let end = sector
        .checked_add(sectors)
        .ok_or(RequestError::SectorOverflow { sector, sectors })?;
    if end > capacity {
        return Err(RequestError::SectorOutOfRange {
            sector,
            sectors,
            capacity,
        });
    }
    Ok(())
}

/// Reads the `virtio_blk_discard_write_zeroes` segments of a request.
fn read_segments(
    data: &[Buffer],
    mem: &GuestMemoryMmap,
    limits: &DiskLimits,
    write_zeroes: bool,
) -> Result<Vec<Segment>, RequestError> {
    let len = ValidatedChain::total_len(data);
    if !len.is_multiple_of(u64::from(SEGMENT_SIZE)) {
        return Err(RequestError::SegmentLength { len });
    }
    let count = len / u64::from(SEGMENT_SIZE);
    if count > u64::from(limits.max_segments) {
        return Err(RequestError::TooManySegments {
            count,
            max: limits.max_segments,
        });
    }
    // At most `max_segments` (small) segments: gather the bytes, then decode.
    let mut bytes = Vec::with_capacity(int_cast::u64_to_usize(len));
    for b in data {
        let start = bytes.len();
        bytes.resize(start + int_cast::u32_to_usize(b.len), 0);
        mem.read_slice(&mut bytes[start..], b.addr)
            .map_err(|_| RequestError::SegmentUnreadable)?;
    }
    let allowed_flags = if write_zeroes {
        VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
    } else {
        0
    };
    let mut segments = Vec::with_capacity(int_cast::u64_to_usize(count));
    for raw in bytes.chunks_exact(int_cast::u32_to_usize(SEGMENT_SIZE)) {
        let field = |at: usize, n: usize| -> u64 {
            raw[at..at + n]
                .iter()
                .rev()
                .fold(0u64, |acc, &b| acc << 8 | u64::from(b))
        };
        let sector = field(0, 8);
        let sectors = u32::from_le_bytes([raw[8], raw[9], raw[10], raw[11]]);
        let flags = u32::from_le_bytes([raw[12], raw[13], raw[14], raw[15]]);
        if flags & !allowed_flags != 0 {
            return Err(RequestError::SegmentFlags { flags });
        }
        if sectors > limits.max_segment_sectors {
            return Err(RequestError::SegmentTooLarge {
                sectors,
                max: limits.max_segment_sectors,
            });
        }
        check_range(sector, u64::from(sectors), limits.capacity)?;
        segments.push(Segment {
            sector,
            sectors,
            // Without discard (`discard=ignore`) zeroes stay allocated.
            unmap: flags & VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP != 0 && limits.discard,
        });
    }
    Ok(segments)
}

/// The GET_ID answer: up to 20 bytes, zero padded, not NUL terminated when
/// the ID uses all 20.
pub(crate) fn device_id_bytes(id: &str) -> [u8; int_cast::u32_to_usize(VIRTIO_BLK_ID_BYTES)] {
    let mut out = [0u8; int_cast::u32_to_usize(VIRTIO_BLK_ID_BYTES)];
    let n = id.len().min(out.len());
    out[..n].copy_from_slice(&id.as_bytes()[..n]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Desc, GuestDriver, test_memory};
    use virtio_queue::QueueT;

    const HDR: u64 = 0x10_0000;
    const DATA: u64 = 0x11_0000;
    const STATUS: u64 = 0x12_0000;

    const LIMITS: DiskLimits = DiskLimits {
        capacity: 100,
        read_only: false,
        discard: true,
        write_zeroes: true,
        max_segments: 2,
        max_segment_sectors: 8,
        max_data_buffers: 3,
    };

    /// Parses `descs` after writing a header of `request_type` at `sector`
    /// and `segments` at DATA.
    fn parse_with(
        request_type: u32,
        sector: u64,
        segments: &[(u64, u32, u32)],
        descs: &[Desc],
        limits: &DiskLimits,
    ) -> Result<Request, Refused> {
        let mem = test_memory();
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&request_type.to_le_bytes());
        h[8..].copy_from_slice(&sector.to_le_bytes());
        mem.write_slice(&h, GuestAddress(HDR)).unwrap();
        let mut seg_bytes = Vec::new();
        for (s, n, f) in segments {
            seg_bytes.extend_from_slice(&s.to_le_bytes());
            seg_bytes.extend_from_slice(&n.to_le_bytes());
            seg_bytes.extend_from_slice(&f.to_le_bytes());
        }
        mem.write_slice(&seg_bytes, GuestAddress(DATA)).unwrap();
        let mut driver = GuestDriver::new(&mem, 16);
        driver.add_chain(descs);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        let chain = ValidatedChain::new(chain, &mem, 16).expect("a valid chain");
        parse(&chain, &mem, limits)
    }

    fn error(request_type: u32, sector: u64, data: &[Desc]) -> RequestError {
        let mut descs = vec![Desc::read(HDR, 16)];
        descs.extend_from_slice(data);
        descs.push(Desc::write(STATUS, 1));
        let refused = parse_with(request_type, sector, &[], &descs, &LIMITS).unwrap_err();
        assert_eq!(refused.status, Some(GuestAddress(STATUS)));
        refused.error
    }

    fn segment_error(request_type: u32, segments: &[(u64, u32, u32)]) -> RequestError {
        let len = u32::try_from((segments.len() * 16).max(16)).expect("few test segments");
        let descs = [
            Desc::read(HDR, 16),
            Desc::read(DATA, len),
            Desc::write(STATUS, 1),
        ];
        parse_with(request_type, 0, segments, &descs, &LIMITS)
            .unwrap_err()
            .error
    }

    #[test]
    fn well_formed_requests_parse() {
        let descs = [
            Desc::read(HDR, 16),
            Desc::write(DATA, 1024),
            Desc::write(STATUS, 1),
        ];
        let req = parse_with(VIRTIO_BLK_T_IN, 98, &[], &descs, &LIMITS).unwrap();
        assert_eq!(req.status, GuestAddress(STATUS));
        assert!(matches!(req.kind, RequestKind::Read { sector: 98, ref data } if data.len() == 1));
        let descs = [
            Desc::read(HDR, 16),
            Desc::read(DATA, 32),
            Desc::write(STATUS, 1),
        ];
        let req = parse_with(
            VIRTIO_BLK_T_WRITE_ZEROES,
            0,
            &[(1, 2, 1), (90, 8, 0)],
            &descs,
            &LIMITS,
        )
        .unwrap();
        assert_eq!(
            req.kind,
            RequestKind::WriteZeroes {
                segments: vec![
                    Segment {
                        sector: 1,
                        sectors: 2,
                        unmap: true
                    },
                    Segment {
                        sector: 90,
                        sectors: 8,
                        unmap: false
                    },
                ]
            }
        );
    }

    #[test]
    fn without_discard_written_zeroes_are_never_unmapped() {
        // `discard=ignore`: the guest's unmap hint is accepted and dropped.
        let no_discard = DiskLimits {
            discard: false,
            ..LIMITS
        };
        let descs = [
            Desc::read(HDR, 16),
            Desc::read(DATA, 16),
            Desc::write(STATUS, 1),
        ];
        let req = parse_with(
            VIRTIO_BLK_T_WRITE_ZEROES,
            0,
            &[(1, 2, 1)],
            &descs,
            &no_discard,
        )
        .unwrap();
        assert_eq!(
            req.kind,
            RequestKind::WriteZeroes {
                segments: vec![Segment {
                    sector: 1,
                    sectors: 2,
                    unmap: false
                }]
            }
        );
    }

    #[test]
    fn the_status_rules() {
        let no_status = parse_with(
            VIRTIO_BLK_T_FLUSH,
            0,
            &[],
            &[Desc::read(HDR, 16), Desc::read(STATUS, 1)],
            &LIMITS,
        )
        .unwrap_err();
        assert_eq!(
            no_status,
            Refused {
                error: RequestError::StatusNotWritable,
                status: None
            }
        );
        let long = parse_with(
            VIRTIO_BLK_T_FLUSH,
            0,
            &[],
            &[Desc::read(HDR, 16), Desc::write(STATUS, 4)],
            &LIMITS,
        )
        .unwrap_err();
        assert_eq!(long.error, RequestError::StatusLength { len: 4 });
        assert_eq!(long.status, Some(GuestAddress(STATUS + 3)), "the last byte");
        let alone = parse_with(
            VIRTIO_BLK_T_FLUSH,
            0,
            &[],
            &[Desc::write(STATUS, 1)],
            &LIMITS,
        )
        .unwrap_err();
        assert_eq!(alone.error, RequestError::MissingHeader);
    }

    #[test]
    fn the_header_rules() {
        let status = Desc::write(STATUS, 1);
        let e = parse_with(
            VIRTIO_BLK_T_FLUSH,
            0,
            &[],
            &[Desc::write(HDR, 16), status],
            &LIMITS,
        );
        assert_eq!(e.unwrap_err().error, RequestError::HeaderNotReadable);
        let e = parse_with(
            VIRTIO_BLK_T_FLUSH,
            0,
            &[],
            &[Desc::read(HDR, 15), status],
            &LIMITS,
        );
        assert_eq!(
            e.unwrap_err().error,
            RequestError::HeaderTooShort { len: 15 }
        );
    }

    #[test]
    fn the_data_rules() {
        assert_eq!(
            error(VIRTIO_BLK_T_IN, 0, &[]),
            RequestError::MissingData { request: "read" }
        );
        assert_eq!(
            error(VIRTIO_BLK_T_FLUSH, 0, &[Desc::read(DATA, 512)]),
            RequestError::UnexpectedData { request: "flush" }
        );
        assert_eq!(
            error(VIRTIO_BLK_T_IN, 0, &[Desc::read(DATA, 512)]),
            RequestError::DataNotWritable { request: "read" }
        );
        assert_eq!(
            error(VIRTIO_BLK_T_GET_ID, 0, &[Desc::read(DATA, 20)]),
            RequestError::DataNotWritable { request: "get-id" }
        );
        assert_eq!(
            error(VIRTIO_BLK_T_OUT, 0, &[Desc::write(DATA, 512)]),
            RequestError::DataNotReadable { request: "write" }
        );
        assert_eq!(
            error(VIRTIO_BLK_T_OUT, 0, &[Desc::read(DATA, 513)]),
            RequestError::DataLengthNotSectorMultiple { len: 513 }
        );
    }

    #[test]
    fn the_sector_rules() {
        assert_eq!(
            error(VIRTIO_BLK_T_IN, 99, &[Desc::write(DATA, 1024)]),
            RequestError::SectorOutOfRange {
                sector: 99,
                sectors: 2,
                capacity: 100
            }
        );
        assert_eq!(
            error(VIRTIO_BLK_T_IN, u64::MAX, &[Desc::write(DATA, 1024)]),
            RequestError::SectorOverflow {
                sector: u64::MAX,
                sectors: 2
            }
        );
    }

    #[test]
    fn no_more_data_buffers_than_seg_max() {
        let mut descs = vec![Desc::read(HDR, 16)];
        descs.extend((0..3).map(|i| Desc::write(DATA + 512 * i, 512)));
        descs.push(Desc::write(STATUS, 1));
        assert!(parse_with(VIRTIO_BLK_T_IN, 0, &[], &descs, &LIMITS).is_ok());
        descs.insert(1, Desc::write(DATA + 0x1000, 512));
        let e = parse_with(VIRTIO_BLK_T_IN, 0, &[], &descs, &LIMITS).unwrap_err();
        assert_eq!(
            e.error,
            RequestError::TooManyDataBuffers { count: 4, max: 3 }
        );
        assert_eq!(e.status, Some(GuestAddress(STATUS)));
    }

    #[test]
    fn the_read_only_rule() {
        let ro = DiskLimits {
            read_only: true,
            ..LIMITS
        };
        let descs = [
            Desc::read(HDR, 16),
            Desc::read(DATA, 512),
            Desc::write(STATUS, 1),
        ];
        for t in [
            VIRTIO_BLK_T_OUT,
            VIRTIO_BLK_T_DISCARD,
            VIRTIO_BLK_T_WRITE_ZEROES,
        ] {
            let e = parse_with(t, 0, &[(0, 1, 0)], &descs, &ro)
                .unwrap_err()
                .error;
            assert_eq!(e, RequestError::ReadOnly, "type {t}");
        }
    }

    #[test]
    fn the_type_rules() {
        assert_eq!(error(2, 0, &[]), RequestError::Unsupported(2));
        let plain = DiskLimits {
            discard: false,
            write_zeroes: false,
            ..LIMITS
        };
        let descs = [
            Desc::read(HDR, 16),
            Desc::read(DATA, 16),
            Desc::write(STATUS, 1),
        ];
        let e = parse_with(VIRTIO_BLK_T_DISCARD, 0, &[(0, 1, 0)], &descs, &plain).unwrap_err();
        assert_eq!(e.error, RequestError::Unsupported(VIRTIO_BLK_T_DISCARD));
        assert_eq!(e.error.status(), int_cast::u8_of_u32(VIRTIO_BLK_S_UNSUPP));
    }

    #[test]
    fn the_segment_rules() {
        let descs = [
            Desc::read(HDR, 16),
            Desc::read(DATA, 20),
            Desc::write(STATUS, 1),
        ];
        let e = parse_with(VIRTIO_BLK_T_DISCARD, 0, &[], &descs, &LIMITS).unwrap_err();
        assert_eq!(e.error, RequestError::SegmentLength { len: 20 });
        assert_eq!(
            segment_error(VIRTIO_BLK_T_DISCARD, &[(0, 1, 0); 3]),
            RequestError::TooManySegments { count: 3, max: 2 }
        );
        assert_eq!(
            segment_error(VIRTIO_BLK_T_DISCARD, &[(0, 9, 0)]),
            RequestError::SegmentTooLarge { sectors: 9, max: 8 }
        );
        assert_eq!(
            segment_error(VIRTIO_BLK_T_DISCARD, &[(0, 1, 1)]),
            RequestError::SegmentFlags { flags: 1 }
        );
        assert_eq!(
            segment_error(VIRTIO_BLK_T_WRITE_ZEROES, &[(0, 1, 4)]),
            RequestError::SegmentFlags { flags: 4 }
        );
        assert_eq!(
            segment_error(VIRTIO_BLK_T_WRITE_ZEROES, &[(99, 2, 0)]),
            RequestError::SectorOutOfRange {
                sector: 99,
                sectors: 2,
                capacity: 100
            }
        );
        assert_eq!(
            segment_error(VIRTIO_BLK_T_DISCARD, &[(u64::MAX, 1, 0)]),
            RequestError::SectorOverflow {
                sector: u64::MAX,
                sectors: 1
            }
        );
    }

    #[test]
    fn device_ids_are_cut_and_padded() {
        assert_eq!(&device_id_bytes("abc")[..4], b"abc\0");
        assert_eq!(
            &device_id_bytes("0123456789abcdefghijKLMN"),
            b"0123456789abcdefghij"
        );
    }
}
