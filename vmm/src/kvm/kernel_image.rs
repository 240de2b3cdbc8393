//! The kernel inside a bzImage, decompressed on the host.
//!
//! A bzImage is setup code, then a small decompressor with the real kernel
//! (an ELF `vmlinux`) as its compressed payload. Run in the guest, that
//! decompressor takes minutes on an emulating KVM and some 100 ms on real
//! hardware; Firecracker and Cloud Hypervisor boot uncompressed kernels for
//! that reason. The VMM finds the payload through the setup header
//! (`payload_offset`/`payload_length`, boot protocol 2.08+), recognises the
//! compression by its magic bytes as Linux's own `decompress_method` does,
//! decompresses it here and enters the `vmlinux` directly (64-bit boot
//! protocol). Every compression Linux's x86 build offers is read: gzip,
//! bzip2, lzma, xz (with the x86 BCJ filter the kernel build uses), lzo
//! (lzop framing), lz4 (legacy framing) and zstd. The build appends the
//! uncompressed size as 4 little-endian bytes; the output must match it.
//!
//! The image may come from the guest's own disk, so nothing it claims sizes a
//! reservation beyond what the VM may hold: the kernel is at most the guest's
//! memory ([`kernel_limit`]), and no decoder keeps a window larger than the
//! kernel it produces (zstd decodes into the kernel's own buffer, lzma's
//! dictionary is cut to the kernel's size, xz's is refused above
//! [`xz_dictionary_limit`]; gzip, bzip2, lz4 and lzo have small fixed ones).

use std::io::Read;

use int_cast::u32_to_usize;

/// Where the setup header's fields are in a bzImage (boot protocol, see
/// Linux's Documentation/arch/x86/boot.rst).
const SETUP_SECTS_OFFSET: usize = 0x1f1;
const HEADER_MAGIC_OFFSET: usize = 0x202;
const VERSION_OFFSET: usize = 0x206;
const PAYLOAD_OFFSET_OFFSET: usize = 0x248;
const PAYLOAD_LENGTH_OFFSET: usize = 0x24c;
/// `payload_offset`/`payload_length` exist from protocol 2.08.
const MIN_PAYLOAD_VERSION: u16 = 0x0208;
const SECTOR: usize = 512;

/// The decompressed kernel may not be larger than this (a hostile image
/// must not make the VMM allocate without bound).
pub(crate) const MAX_KERNEL_SIZE: usize = 1 << 30;

/// The largest dictionary of xz's presets (`xz -9`; the kernel build uses
/// 32 MiB): allowed even when the kernel is smaller.
const XZ_PRESET_DICTIONARY_MAX: usize = 64 << 20;

/// The most a kernel may decompress to in a VM of `guest_memory` bytes: it
/// must fit in guest memory, and never more than [`MAX_KERNEL_SIZE`].
pub(crate) fn kernel_limit(guest_memory: u64) -> usize {
    usize::try_from(guest_memory)
        .unwrap_or(usize::MAX)
        .min(MAX_KERNEL_SIZE)
}

/// The largest xz dictionary a payload of a kernel of `expected` bytes may
/// declare. A dictionary larger than the output is never used, but xz's
/// presets do not shrink theirs to the input, so they are allowed too.
pub(crate) fn xz_dictionary_limit(expected: usize) -> usize {
    expected.max(XZ_PRESET_DICTIONARY_MAX)
}

/// A compression Linux's build can use for the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Compression {
    Gzip,
    Bzip2,
    Lzma,
    Xz,
    Lzo,
    Lz4,
    Zstd,
}

impl Compression {
    /// Recognises a payload by its magic bytes (Linux's `compressed_formats`).
    pub(crate) fn detect(payload: &[u8]) -> Option<Compression> {
        const MAGICS: [(&[u8], Compression); 7] = [
            (&[0x1f, 0x8b], Compression::Gzip),
            (b"BZh", Compression::Bzip2),
            (&[0x5d, 0x00, 0x00], Compression::Lzma),
            (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], Compression::Xz),
            (&[0x89, b'L', b'Z', b'O'], Compression::Lzo),
            (&[0x02, 0x21, 0x4c, 0x18], Compression::Lz4),
            (&[0x28, 0xb5, 0x2f, 0xfd], Compression::Zstd),
        ];
        MAGICS
            .iter()
            .find(|(magic, _)| payload.starts_with(magic))
            .map(|&(_, c)| c)
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
            Compression::Lzma => "lzma",
            Compression::Xz => "xz",
            Compression::Lzo => "lzo",
            Compression::Lz4 => "lz4",
            Compression::Zstd => "zstd",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a bzImage (no HdrS setup header)")]
    NotBzImage,
    #[error("boot protocol {0:#06x} has no payload fields (2.08 or later needed)")]
    OldProtocol(u16),
    #[error("the payload lies outside the image")]
    PayloadOutside,
    #[error("unknown payload compression (magic {0:02x?})")]
    UnknownCompression(Vec<u8>),
    #[error("the payload is too short")]
    Truncated,
    #[error(
        "the kernel would be {size} bytes, more than the {limit} allowed (the guest's memory, at most {MAX_KERNEL_SIZE})"
    )]
    TooBig { size: usize, limit: usize },
    #[error("{0} payload: {1}")]
    Corrupt(&'static str, String),
    #[error(
        "{what} payload: its window is larger than the {limit} bytes allowed for a kernel of {expected} bytes"
    )]
    WindowTooBig {
        what: &'static str,
        limit: usize,
        expected: usize,
    },
    #[error("{what} payload decompressed to {got} bytes, the image says {expected}")]
    SizeMismatch {
        what: &'static str,
        got: usize,
        expected: usize,
    },
}

/// The compressed kernel of a bzImage: where it is and how it is packed.
pub(crate) struct Payload<'a> {
    pub(crate) compression: Compression,
    pub(crate) data: &'a [u8],
}

/// Finds the payload of a bzImage.
pub(crate) fn payload(image: &[u8]) -> Result<Payload<'_>, Error> {
    let u16_at = |at: usize| {
        image
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        image
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    if image.get(HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4) != Some(b"HdrS") {
        return Err(Error::NotBzImage);
    }
    let version = u16_at(VERSION_OFFSET).ok_or(Error::NotBzImage)?;
    if version < MIN_PAYLOAD_VERSION {
        return Err(Error::OldProtocol(version));
    }
    // setup_sects 0 means 4 (protocol rule).
    let setup_sects = match image[SETUP_SECTS_OFFSET] {
        0 => 4,
        n => usize::from(n),
    };
    let offset = u32_to_usize(u32_at(PAYLOAD_OFFSET_OFFSET).ok_or(Error::NotBzImage)?);
    let length = u32_to_usize(u32_at(PAYLOAD_LENGTH_OFFSET).ok_or(Error::NotBzImage)?);
    let start = (setup_sects + 1) * SECTOR + offset;
    let data = start
        .checked_add(length)
        .and_then(|end| image.get(start..end))
        .filter(|d| !d.is_empty())
        .ok_or(Error::PayloadOutside)?;
    let compression = Compression::detect(data).ok_or_else(|| {
        Error::UnknownCompression(data.iter().take(6).copied().collect::<Vec<u8>>())
    })?;
    Ok(Payload { compression, data })
}

/// Decompresses a payload to the kernel ELF, checking the size the build
/// appended, which may be at most `limit` bytes ([`kernel_limit`]).
pub(crate) fn decompress(payload: &Payload<'_>, limit: usize) -> Result<Vec<u8>, Error> {
    let data = payload.data;
    let what = payload.compression.name();
    let (stream, size) = data.split_at(data.len().checked_sub(4).ok_or(Error::Truncated)?);
    let expected = u32_to_usize(u32::from_le_bytes([size[0], size[1], size[2], size[3]]));
    let limit = limit.min(MAX_KERNEL_SIZE);
    if expected > limit {
        return Err(Error::TooBig {
            size: expected,
            limit,
        });
    }
    let corrupt = |e: &dyn std::fmt::Display| Error::Corrupt(what, e.to_string());
    let out = match payload.compression {
        // gzip's own trailer ends with the size: the stream is the whole payload.
        Compression::Gzip => read_limited(what, flate2::read::GzDecoder::new(data), expected)?,
        Compression::Bzip2 => read_limited(what, bzip2::read::BzDecoder::new(stream), expected)?,
        Compression::Lzma => read_limited(what, lzma_reader(stream, expected)?, expected)?,
        Compression::Xz => {
            let dictionary = xz_dictionary_limit(expected);
            // KiB, with room for the decoder's own buffers (lzma-rust2 counts ~104 KiB).
            let mem_limit_kb = u32::try_from(dictionary.div_ceil(1024) + 256).unwrap_or(u32::MAX);
            let reader = lzma_rust2::XzReader::new_mem_limit(stream, false, mem_limit_kb);
            // lzma-rust2 refuses a block's dictionary over the limit before reserving it.
            read_to_limit(reader, expected).map_err(|e| {
                if e.kind() == std::io::ErrorKind::OutOfMemory {
                    Error::WindowTooBig {
                        what,
                        limit: dictionary,
                        expected,
                    }
                } else {
                    Error::Corrupt(what, e.to_string())
                }
            })?
        }
        Compression::Lzo => lzop(stream, expected)?,
        Compression::Lz4 => lz4_legacy(stream, expected)?,
        // In one call into the kernel's buffer, which is the decoder's window: a
        // streaming decoder would reserve the window the frame declares (up to 2 GiB
        // for the `zstd -22 --ultra` of the kernel build's format, whatever the size).
        Compression::Zstd => {
            // One byte more than claimed: a longer kernel shows as a size mismatch.
            let mut out = Vec::with_capacity(expected + 1);
            zstd::bulk::Decompressor::new()
                .and_then(|mut d| d.decompress_to_buffer(stream, &mut out))
                .map_err(|e| corrupt(&e))?;
            out
        }
    };
    if out.len() != expected {
        return Err(Error::SizeMismatch {
            what,
            got: out.len(),
            expected,
        });
    }
    Ok(out)
}

/// An lzma (`.lzma`, "alone") reader whose dictionary is at most the kernel's
/// size: no match reaches further back than what was decoded, so a larger
/// declared one (up to 4 GiB) is never needed. (lzma-rust2 0.25 also grows its
/// window with the output; this does not depend on it.)
fn lzma_reader(stream: &[u8], expected: usize) -> Result<impl Read + '_, Error> {
    let corrupt = |e: &dyn std::fmt::Display| Error::Corrupt("lzma", e.to_string());
    // Properties (1 byte), dictionary size (4), uncompressed size (8, all ones: unknown).
    let (header, body) = stream.split_first_chunk::<13>().ok_or(Error::Truncated)?;
    let props = header[0];
    let declared = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
    let uncompressed = u64::from_le_bytes([
        header[5], header[6], header[7], header[8], header[9], header[10], header[11], header[12],
    ]);
    let dictionary = declared.min(u32::try_from(expected).unwrap_or(u32::MAX));
    lzma_rust2::LzmaReader::new_with_props(body, uncompressed, props, dictionary, None)
        .map_err(|e| corrupt(&e))
}

/// Reads a decoder to its end, refusing more than `expected` bytes.
fn read_limited(what: &'static str, reader: impl Read, expected: usize) -> Result<Vec<u8>, Error> {
    read_to_limit(reader, expected).map_err(|e| Error::Corrupt(what, e.to_string()))
}

/// Reads at most `expected` + 1 bytes (one more shows the size was a lie).
fn read_to_limit(reader: impl Read, expected: usize) -> std::io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(expected);
    reader.take(expected as u64 + 1).read_to_end(&mut out)?;
    Ok(out)
}

/// lz4 legacy framing (`lz4 -l`, what the kernel build writes): the magic,
/// then blocks of a 32-bit little-endian compressed length and an lz4 block
/// of at most 8 MiB decompressed, until the input ends.
fn lz4_legacy(stream: &[u8], expected: usize) -> Result<Vec<u8>, Error> {
    const LEGACY_MAGIC: [u8; 4] = [0x02, 0x21, 0x4c, 0x18];
    const BLOCK_MAX: usize = 8 << 20;
    let corrupt = |why: String| Error::Corrupt("lz4", why);
    let mut rest = stream
        .strip_prefix(&LEGACY_MAGIC[..])
        .ok_or(Error::Truncated)?;
    let mut out = Vec::with_capacity(expected);
    while rest.len() >= 4 {
        let (len, tail) = rest.split_at(4);
        // Concatenated legacy frames repeat the magic.
        if len == LEGACY_MAGIC {
            rest = tail;
            continue;
        }
        let len = u32_to_usize(u32::from_le_bytes([len[0], len[1], len[2], len[3]]));
        let block = tail
            .get(..len)
            .ok_or_else(|| corrupt(format!("block of {len} bytes past the end")))?;
        let room = BLOCK_MAX.min(expected.saturating_sub(out.len()) + 1);
        let start = out.len();
        out.resize(start + room, 0);
        let n = lz4_flex::block::decompress_into(block, &mut out[start..])
            .map_err(|e| corrupt(e.to_string()))?;
        out.truncate(start + n);
        if out.len() > expected {
            break;
        }
        rest = &tail[len..];
    }
    Ok(out)
}

/// lzop framing (`lzop -9`, what the kernel build writes; Linux's
/// `lib/decompress_unlzo.c` reads the same): a header, then blocks of
/// big-endian (uncompressed, compressed) lengths, optional checksums and
/// LZO1X data (stored as is when both lengths are equal), until a zero
/// length.
fn lzop(stream: &[u8], expected: usize) -> Result<Vec<u8>, Error> {
    const MAGIC: [u8; 9] = [0x89, b'L', b'Z', b'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a];
    const F_ADLER32_D: u32 = 0x1;
    const F_ADLER32_C: u32 = 0x2;
    const F_H_EXTRA_FIELD: u32 = 0x40;
    const F_CRC32_D: u32 = 0x100;
    const F_CRC32_C: u32 = 0x200;
    const F_H_FILTER: u32 = 0x800;
    let corrupt = |why: &str| Error::Corrupt("lzo", why.to_string());
    let mut r = ByteReader(stream.strip_prefix(&MAGIC[..]).ok_or(Error::Truncated)?);
    let version = r.u16()?;
    r.skip(2)?; // library version
    if version >= 0x0940 {
        r.skip(2)?; // version needed to extract
    }
    r.skip(1)?; // method
    if version >= 0x0940 {
        r.skip(1)?; // level
    }
    let flags = r.u32()?;
    if flags & F_H_FILTER != 0 {
        r.skip(4)?;
    }
    r.skip(4 + 4)?; // mode, mtime
    if version >= 0x0940 {
        r.skip(4)?; // mtime high
    }
    let name_len = usize::from(r.u8()?);
    r.skip(name_len + 4)?; // name, header checksum
    if flags & F_H_EXTRA_FIELD != 0 {
        let extra = u32_to_usize(r.u32()?);
        r.skip(extra.checked_add(4).ok_or(Error::Truncated)?)?;
    }
    let mut out = Vec::with_capacity(expected);
    loop {
        let dst_len = u32_to_usize(r.u32()?);
        if dst_len == 0 {
            break;
        }
        let src_len = u32_to_usize(r.u32()?);
        if src_len > dst_len || out.len() + dst_len > expected {
            return Err(corrupt("block lengths out of range"));
        }
        let checksums = [F_ADLER32_D, F_CRC32_D]
            .iter()
            .filter(|&&f| flags & f != 0)
            .count()
            + if src_len < dst_len {
                [F_ADLER32_C, F_CRC32_C]
                    .iter()
                    .filter(|&&f| flags & f != 0)
                    .count()
            } else {
                0
            };
        r.skip(4 * checksums)?;
        let block = r.take(src_len)?;
        if src_len == dst_len {
            out.extend_from_slice(block);
        } else {
            let data = lzokay_native::decompress_all(block, Some(dst_len))
                .map_err(|e| corrupt(&format!("{e:?}")))?;
            if data.len() != dst_len {
                return Err(corrupt("a block decompressed to the wrong length"));
            }
            out.extend_from_slice(&data);
        }
    }
    Ok(out)
}

/// Big-endian fields of the lzop framing.
struct ByteReader<'a>(&'a [u8]);

impl<'a> ByteReader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if self.0.len() < n {
            return Err(Error::Truncated);
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }

    fn skip(&mut self, n: usize) -> Result<(), Error> {
        self.take(n).map(|_| ())
    }

    fn u8(&mut self) -> Result<u8, Error> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, Error> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    fn u32(&mut self) -> Result<u32, Error> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bzImage around `payload` (protocol 2.15, two setup sectors).
    pub(crate) fn wrap(payload: &[u8]) -> Vec<u8> {
        let mut image = vec![0u8; 3 * SECTOR + 0x40];
        image[SETUP_SECTS_OFFSET] = 2;
        image[HEADER_MAGIC_OFFSET..HEADER_MAGIC_OFFSET + 4].copy_from_slice(b"HdrS");
        image[VERSION_OFFSET..VERSION_OFFSET + 2].copy_from_slice(&0x020fu16.to_le_bytes());
        image[PAYLOAD_OFFSET_OFFSET..PAYLOAD_OFFSET_OFFSET + 4]
            .copy_from_slice(&0x40u32.to_le_bytes());
        image[PAYLOAD_LENGTH_OFFSET..PAYLOAD_LENGTH_OFFSET + 4].copy_from_slice(
            &u32::try_from(payload.len())
                .expect("a test payload is small")
                .to_le_bytes(),
        );
        image.extend_from_slice(payload);
        image
    }

    fn kernel() -> Vec<u8> {
        (0..200_000u32)
            .flat_map(|i| (i % 251).to_le_bytes())
            .collect()
    }

    /// Appends the low 32 bits of `size` (the trailer Linux reads): huge sizes wrap on purpose.
    fn with_size(mut stream: Vec<u8>, size: usize) -> Vec<u8> {
        stream.extend_from_slice(&size.to_le_bytes()[..4]);
        stream
    }

    #[test]
    fn gzip_bzip2_zstd_lz4_and_lzo_payloads_round_trip() {
        use std::io::Write;
        let k = kernel();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        gz.write_all(&k).unwrap();
        let gzip = gz.finish().unwrap();
        let mut bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::best());
        bz.write_all(&k).unwrap();
        let bzip2 = with_size(bz.finish().unwrap(), k.len());
        let zstd = with_size(zstd::bulk::compress(&k, 19).unwrap(), k.len());
        let mut lz4 = vec![0x02, 0x21, 0x4c, 0x18];
        for chunk in k.chunks(8 << 20) {
            let block = lz4_flex::block::compress(chunk);
            lz4.extend_from_slice(
                &u32::try_from(block.len())
                    .expect("an 8 MiB chunk compresses to less than 4 GiB")
                    .to_le_bytes(),
            );
            lz4.extend_from_slice(&block);
        }
        let lz4 = with_size(lz4, k.len());
        let lzo = with_size(lzop_stream(&k), k.len());
        for (payload, compression) in [
            (gzip, Compression::Gzip),
            (bzip2, Compression::Bzip2),
            (zstd, Compression::Zstd),
            (lz4, Compression::Lz4),
            (lzo, Compression::Lzo),
        ] {
            let image = wrap(&payload);
            let found = super::payload(&image).unwrap();
            assert_eq!(found.compression, compression);
            assert_eq!(
                decompress(&found, MAX_KERNEL_SIZE).unwrap(),
                k,
                "{compression:?}"
            );
        }
    }

    #[test]
    fn xz_with_the_x86_filter_and_lzma_round_trip() {
        use lzma_rust2::{LzmaOptions, LzmaWriter, XzOptions, XzWriter};
        use std::io::Write;
        let k = kernel();
        // As the kernel build's `xz --check=crc32 --x86`.
        let mut options = XzOptions::with_preset(6);
        options.set_check_sum_type(lzma_rust2::CheckType::Crc32);
        options.prepend_pre_filter(lzma_rust2::FilterType::BcjX86, 0);
        let mut xz = XzWriter::new(Vec::new(), options).unwrap();
        xz.write_all(&k).unwrap();
        let xz = with_size(xz.finish().unwrap(), k.len());
        let mut lz =
            LzmaWriter::new_use_header(Vec::new(), &LzmaOptions::with_preset(6), None).unwrap();
        lz.write_all(&k).unwrap();
        let lzma = with_size(lz.finish().unwrap(), k.len());
        for (payload, compression) in [(xz, Compression::Xz), (lzma, Compression::Lzma)] {
            let image = wrap(&payload);
            let found = super::payload(&image).unwrap();
            assert_eq!(found.compression, compression);
            assert_eq!(
                decompress(&found, MAX_KERNEL_SIZE).unwrap(),
                k,
                "{compression:?}"
            );
        }
    }

    /// An lzop file as `lzop -9` writes it (version 0x1040, no checksums
    /// beyond the header's, 256 KiB blocks).
    fn lzop_stream(data: &[u8]) -> Vec<u8> {
        let mut s = vec![0x89, b'L', b'Z', b'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a];
        s.extend_from_slice(&0x1040u16.to_be_bytes());
        s.extend_from_slice(&0x2080u16.to_be_bytes());
        s.extend_from_slice(&0x0940u16.to_be_bytes());
        s.push(3); // method LZO1X-999
        s.push(9);
        s.extend_from_slice(&F_ADLER32_D.to_be_bytes());
        s.extend_from_slice(&[0; 4 + 4 + 4]); // mode, mtime low/high
        s.push(0); // no name
        s.extend_from_slice(&[0; 4]); // header checksum (not checked, as in Linux)
        for chunk in data.chunks(256 << 10) {
            let block = lzokay_native::compress(chunk).unwrap();
            s.extend_from_slice(
                &u32::try_from(chunk.len())
                    .expect("chunks are 256 KiB")
                    .to_be_bytes(),
            );
            s.extend_from_slice(
                &u32::try_from(block.len())
                    .expect("a 256 KiB chunk compresses small")
                    .to_be_bytes(),
            );
            s.extend_from_slice(&[0; 4]); // adler32 of the data
            s.extend_from_slice(&block);
        }
        s.extend_from_slice(&[0; 4]);
        s
    }
    const F_ADLER32_D: u32 = 0x1;

    #[test]
    fn bad_images_are_refused_not_panicked_on() {
        assert!(matches!(payload(b"short"), Err(Error::NotBzImage)));
        let mut old = wrap(&[0x1f, 0x8b, 0, 0]);
        old[VERSION_OFFSET..VERSION_OFFSET + 2].copy_from_slice(&0x0206u16.to_le_bytes());
        assert!(matches!(payload(&old), Err(Error::OldProtocol(0x0206))));
        let mut outside = wrap(&[0x1f, 0x8b, 0, 0]);
        outside[PAYLOAD_LENGTH_OFFSET..PAYLOAD_LENGTH_OFFSET + 4]
            .copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(payload(&outside), Err(Error::PayloadOutside)));
        assert!(matches!(
            payload(&wrap(b"ELF?....")),
            Err(Error::UnknownCompression(_))
        ));
        // A size beyond the limit, a corrupt stream, a lying size.
        let huge = wrap(&with_size(
            vec![0x28, 0xb5, 0x2f, 0xfd, 1, 2],
            usize::MAX >> 1,
        ));
        assert!(matches!(
            decompress(&payload(&huge).unwrap(), MAX_KERNEL_SIZE),
            Err(Error::TooBig { .. })
        ));
        let garbage = wrap(&with_size(vec![0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3, 4], 100));
        assert!(decompress(&payload(&garbage).unwrap(), MAX_KERNEL_SIZE).is_err());
        let k = kernel();
        let lying = wrap(&with_size(
            zstd::bulk::compress(&k, 1).unwrap(),
            k.len() - 1,
        ));
        assert!(matches!(
            decompress(&payload(&lying).unwrap(), MAX_KERNEL_SIZE),
            Err(Error::SizeMismatch { .. })
        ));
        // Random bytes after each magic never panic.
        let mut seed = 0x1234_5678u32;
        for magic in [
            &[0x89, b'L', b'Z', b'O', 0x00, 0x0d, 0x0a, 0x1a, 0x0a][..],
            &[0x02, 0x21, 0x4c, 0x18],
            &[0x5d, 0, 0],
            &[0xfd, b'7', b'z', b'X', b'Z', 0],
            b"BZh9",
            &[0x1f, 0x8b, 8, 0],
        ] {
            for len in [0usize, 3, 17, 300] {
                let mut p = magic.to_vec();
                p.extend((0..len).map(|_| {
                    seed = seed.wrapping_mul(1_103_515_245).wrapping_add(12345);
                    (seed >> 16).to_le_bytes()[0]
                }));
                p.extend_from_slice(&4096u32.to_le_bytes());
                if let Ok(found) = payload(&wrap(&p)) {
                    let _ = decompress(&found, MAX_KERNEL_SIZE);
                }
            }
        }
    }

    #[test]
    fn the_kernel_is_bounded_by_guest_memory_and_windows_by_the_kernel() {
        assert_eq!(kernel_limit(64 << 20), 64 << 20);
        assert_eq!(kernel_limit(8 << 30), MAX_KERNEL_SIZE);
        assert_eq!(kernel_limit(u64::MAX), MAX_KERNEL_SIZE);
        assert_eq!(xz_dictionary_limit(1 << 20), 64 << 20);
        assert_eq!(xz_dictionary_limit(200 << 20), 200 << 20);
        // A real payload claiming 900 MiB in a 64 MiB guest: refused before anything
        // is reserved for it.
        let k = kernel();
        let claims = wrap(&with_size(zstd::bulk::compress(&k, 1).unwrap(), 900 << 20));
        let err = decompress(&payload(&claims).unwrap(), kernel_limit(64 << 20)).unwrap_err();
        assert!(
            matches!(err, Error::TooBig { size, limit } if size == 900 << 20 && limit == 64 << 20),
            "{err}"
        );
        // The same kernel, honestly sized, fits.
        let honest = wrap(&with_size(zstd::bulk::compress(&k, 1).unwrap(), k.len()));
        assert_eq!(
            decompress(&payload(&honest).unwrap(), kernel_limit(64 << 20)).unwrap(),
            k
        );
    }

    /// A zstd frame of raw blocks declaring a window of 2^`window_log` bytes and no
    /// content size (as `zstd` writes when it reads a pipe, as the kernel build does).
    fn zstd_frame_with_window(data: &[u8], window_log: u8) -> Vec<u8> {
        let mut f = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, (window_log - 10) << 3];
        let chunks: Vec<&[u8]> = data.chunks(128 << 10).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let last = u32::from(i + 1 == chunks.len());
            let len = u32::try_from(chunk.len()).expect("128 KiB chunks");
            f.extend_from_slice(&(len << 3 | last).to_le_bytes()[..3]);
            f.extend_from_slice(chunk);
        }
        f
    }

    /// CRC-32 (IEEE), as the xz block header carries.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    crc >> 1 ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    /// An xz stream of `data` whose block declares the LZMA2 dictionary `dict_byte`
    /// (40: 4 GiB - 1), its header checksum fixed.
    fn xz_with_dictionary(data: &[u8], dict_byte: u8) -> Vec<u8> {
        use lzma_rust2::{XzOptions, XzWriter};
        use std::io::Write;
        let mut xz = XzWriter::new(Vec::new(), XzOptions::with_preset(1)).unwrap();
        xz.write_all(data).unwrap();
        let mut s = xz.finish().unwrap();
        // Stream header (12 bytes), then the block header: size, flags (one filter, no
        // sizes), LZMA2 (0x21), 1 property byte, the dictionary, padding, CRC-32.
        let size = (usize::from(s[12]) + 1) * 4;
        assert_eq!(&s[13..16], &[0x00, 0x21, 0x01], "one LZMA2 filter");
        s[16] = dict_byte;
        let crc = crc32(&s[12..12 + size - 4]);
        s[12 + size - 4..12 + size].copy_from_slice(&crc.to_le_bytes());
        s
    }

    /// An `.lzma` stream of `data` whose header declares a `dictionary`-byte window.
    fn lzma_with_dictionary(data: &[u8], dictionary: u32) -> Vec<u8> {
        use lzma_rust2::{LzmaOptions, LzmaWriter};
        use std::io::Write;
        let mut lz =
            LzmaWriter::new_use_header(Vec::new(), &LzmaOptions::with_preset(1), None).unwrap();
        lz.write_all(data).unwrap();
        let mut s = lz.finish().unwrap();
        s[1..5].copy_from_slice(&dictionary.to_le_bytes());
        s
    }

    #[test]
    fn hostile_windows_are_refused_or_never_reserved() {
        let k = kernel();
        // xz: a 3 GiB dictionary for a kernel of 800 KB is refused by name.
        let xz = wrap(&with_size(xz_with_dictionary(&k, 39), k.len()));
        let err = decompress(&payload(&xz).unwrap(), MAX_KERNEL_SIZE).unwrap_err();
        assert!(
            matches!(err, Error::WindowTooBig { limit, .. } if limit == 64 << 20),
            "{err}"
        );
        // A dictionary as large as xz's presets use still decodes (24: 16 MiB).
        let xz = wrap(&with_size(xz_with_dictionary(&k, 24), k.len()));
        assert_eq!(
            decompress(&payload(&xz).unwrap(), MAX_KERNEL_SIZE).unwrap(),
            k
        );
        // lzma: a 4 GiB dictionary is cut to the kernel's size, which loses nothing.
        let lzma = wrap(&with_size(lzma_with_dictionary(&k, 0xffff_0000), k.len()));
        assert_eq!(
            decompress(&payload(&lzma).unwrap(), MAX_KERNEL_SIZE).unwrap(),
            k
        );
        // zstd: a 2 GiB window decodes into the kernel's buffer.
        let zstd = wrap(&with_size(zstd_frame_with_window(&k, 31), k.len()));
        assert_eq!(
            decompress(&payload(&zstd).unwrap(), MAX_KERNEL_SIZE).unwrap(),
            k
        );
    }

    const SMALL_ADDRESS_SPACE_CHILD: &str = "VMM_KERNEL_IMAGE_SMALL_ADDRESS_SPACE";

    /// The hostile payloads above, in a child whose address space is limited to 1 GiB
    /// (`RLIMIT_AS`): a decoder that reserved the 2-4 GiB its header declares fails
    /// there, one bounded by the kernel's size does not.
    #[test]
    fn hostile_windows_fit_in_a_small_address_space() {
        if std::env::var_os(SMALL_ADDRESS_SPACE_CHILD).is_some() {
            let k = kernel();
            for stream in [
                zstd_frame_with_window(&k, 31),
                lzma_with_dictionary(&k, 0xffff_0000),
            ] {
                let image = wrap(&with_size(stream, k.len()));
                assert_eq!(
                    decompress(&payload(&image).unwrap(), MAX_KERNEL_SIZE).unwrap(),
                    k
                );
            }
            let xz = wrap(&with_size(xz_with_dictionary(&k, 40), k.len()));
            assert!(matches!(
                decompress(&payload(&xz).unwrap(), MAX_KERNEL_SIZE),
                Err(Error::WindowTooBig { .. })
            ));
            return;
        }
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new(std::env::current_exe().unwrap());
        child
            .args([
                "--exact",
                "kvm::kernel_image::tests::hostile_windows_fit_in_a_small_address_space",
                "--test-threads=1",
                "--nocapture",
            ])
            .env(SMALL_ADDRESS_SPACE_CHILD, "1");
        // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
        unsafe {
            child.pre_exec(|| {
                let limit = libc::rlimit {
                    rlim_cur: 1 << 30,
                    rlim_max: 1 << 30,
                };
                if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = child.output().expect("run the child");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran the test: {text}");
    }
}
