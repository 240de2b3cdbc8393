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

use std::io::Read;

use block::cast::u32_to_usize;

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
    #[error("the kernel would be {0} bytes, more than the {MAX_KERNEL_SIZE} allowed")]
    TooBig(u64),
    #[error("{0} payload: {1}")]
    Corrupt(&'static str, String),
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
/// appended.
pub(crate) fn decompress(payload: &Payload<'_>) -> Result<Vec<u8>, Error> {
    let data = payload.data;
    let what = payload.compression.name();
    let (stream, size) = data.split_at(data.len().checked_sub(4).ok_or(Error::Truncated)?);
    let expected = u32_to_usize(u32::from_le_bytes([size[0], size[1], size[2], size[3]]));
    if expected > MAX_KERNEL_SIZE {
        return Err(Error::TooBig(expected as u64));
    }
    let corrupt = |e: &dyn std::fmt::Display| Error::Corrupt(what, e.to_string());
    let out = match payload.compression {
        // gzip's own trailer ends with the size: the stream is the whole payload.
        Compression::Gzip => read_limited(what, flate2::read::GzDecoder::new(data), expected)?,
        Compression::Bzip2 => read_limited(what, bzip2::read::BzDecoder::new(stream), expected)?,
        Compression::Lzma => {
            let reader = lzma_rust2::LzmaReader::new_mem_limit(stream, u32::MAX, None)
                .map_err(|e| corrupt(&e))?;
            read_limited(what, reader, expected)?
        }
        Compression::Xz => read_limited(what, lzma_rust2::XzReader::new(stream, false), expected)?,
        Compression::Lzo => lzop(stream, expected)?,
        Compression::Lz4 => lz4_legacy(stream, expected)?,
        Compression::Zstd => {
            let mut decoder = zstd::stream::read::Decoder::new(stream)
                .map_err(|e| corrupt(&e))?
                .single_frame();
            // The kernel build compresses with `zstd -22 --ultra`: windows up to 2^27.
            decoder.window_log_max(31).map_err(|e| corrupt(&e))?;
            read_limited(what, decoder, expected)?
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

/// Reads a decoder to its end, refusing more than `expected` bytes.
fn read_limited(what: &'static str, reader: impl Read, expected: usize) -> Result<Vec<u8>, Error> {
    let mut out = Vec::with_capacity(expected);
    reader
        .take(expected as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| Error::Corrupt(what, e.to_string()))?;
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
            assert_eq!(decompress(&found).unwrap(), k, "{compression:?}");
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
            assert_eq!(decompress(&found).unwrap(), k, "{compression:?}");
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
            decompress(&payload(&huge).unwrap()),
            Err(Error::TooBig(_))
        ));
        let garbage = wrap(&with_size(vec![0x28, 0xb5, 0x2f, 0xfd, 1, 2, 3, 4], 100));
        assert!(decompress(&payload(&garbage).unwrap()).is_err());
        let k = kernel();
        let lying = wrap(&with_size(
            zstd::bulk::compress(&k, 1).unwrap(),
            k.len() - 1,
        ));
        assert!(matches!(
            decompress(&payload(&lying).unwrap()),
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
                    let _ = decompress(&found);
                }
            }
        }
    }
}
