//! Compressed clusters (read side): raw deflate or zstd, per the header.

use super::header::CompressionType;
use int_cast::u64_to_usize;

/// Decompresses one cluster from `input` into `out` (exactly one cluster).
/// `input` may carry trailing bytes: the compressed stream is followed by
/// whatever the rest of its last sector holds.
pub(crate) fn decompress(
    kind: CompressionType,
    input: &[u8],
    out: &mut [u8],
) -> Result<(), String> {
    match kind {
        CompressionType::Zlib => inflate_raw(input, out),
        CompressionType::Zstd => zstd_decompress(input, out),
    }
}

fn inflate_raw(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    // QEMU writes raw deflate (no zlib header, window bits -12).
    let mut d = flate2::Decompress::new(false);
    let status = d
        .decompress(input, out, flate2::FlushDecompress::Finish)
        .map_err(|e| format!("deflate: {e}"))?;
    let produced = u64_to_usize(d.total_out());
    match status {
        flate2::Status::StreamEnd if produced == out.len() => Ok(()),
        // The stream may continue past a full cluster only as garbage.
        _ if produced == out.len() => Ok(()),
        _ => Err(format!(
            "deflate stream gave {produced} bytes, cluster needs {}",
            out.len()
        )),
    }
}

/// The largest zstd window (log2) a frame of one cluster of `cluster` bytes may
/// declare: QEMU compresses each cluster as one frame of known size, so its
/// window is at most the cluster (zstd's smallest is 2^10). Without this bound
/// a hostile image could make every read reserve zstd's default 128 MiB.
pub(crate) fn zstd_window_log_max(cluster: usize) -> u32 {
    cluster
        .checked_next_power_of_two()
        .map_or(usize::BITS, usize::trailing_zeros)
        .max(10)
}

fn zstd_decompress(input: &[u8], out: &mut [u8]) -> Result<(), String> {
    use zstd::stream::raw::{Decoder, InBuffer, Operation, OutBuffer};
    use zstd::zstd_safe::DParameter;
    let mut dec = Decoder::new().map_err(|e| format!("zstd: {e}"))?;
    dec.set_parameter(DParameter::WindowLogMax(zstd_window_log_max(out.len())))
        .map_err(|e| format!("zstd: {e}"))?;
    let mut inb = InBuffer::around(input);
    let mut outb = OutBuffer::around(out);
    // Bounded: each round either consumes input or produces output.
    loop {
        let before = (inb.pos(), outb.pos());
        let hint = dec
            .run(&mut inb, &mut outb)
            .map_err(|e| format!("zstd: {e}"))?;
        if outb.pos() == outb.capacity() {
            return Ok(());
        }
        if hint == 0 || (inb.pos(), outb.pos()) == before || inb.pos() == input.len() {
            return Err(format!(
                "zstd stream gave {} bytes, cluster needs {}",
                outb.pos(),
                outb.capacity()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn inflates_raw_deflate_with_trailing_garbage() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 7) as u8).collect();
        let mut enc =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&data).unwrap();
        let mut c = enc.finish().unwrap();
        c.extend_from_slice(&[0xaa; 100]);
        let mut out = vec![0u8; 4096];
        decompress(CompressionType::Zlib, &c, &mut out).unwrap();
        assert_eq!(out, data);
        let mut short = vec![0u8; 8192];
        assert!(decompress(CompressionType::Zlib, &c, &mut short).is_err());
        assert!(decompress(CompressionType::Zlib, &[0xff; 64], &mut out).is_err());
    }

    #[test]
    fn zstd_roundtrip() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i % 13) as u8).collect();
        let mut c = zstd::bulk::compress(&data, 3).unwrap();
        c.extend_from_slice(&[0u8; 37]);
        let mut out = vec![0u8; 4096];
        decompress(CompressionType::Zstd, &c, &mut out).unwrap();
        assert_eq!(out, data);
        assert!(decompress(CompressionType::Zstd, &[1, 2, 3, 4], &mut out).is_err());
    }

    #[test]
    fn zstd_windows_are_bounded_by_the_cluster() {
        assert_eq!(zstd_window_log_max(512), 10);
        assert_eq!(zstd_window_log_max(4096), 12);
        assert_eq!(zstd_window_log_max(64 << 10), 16);
        assert_eq!(zstd_window_log_max(2 << 20), 21);
        // As QEMU writes them (one frame per cluster, its size known): every
        // cluster size decodes.
        for bits in 9..=21 {
            let data: Vec<u8> = (0..1u32 << bits).map(|i| (i % 251) as u8).collect();
            let c = zstd::bulk::compress(&data, 3).unwrap();
            let mut out = vec![0u8; data.len()];
            decompress(CompressionType::Zstd, &c, &mut out).unwrap();
            assert_eq!(out, data);
        }
        // A 4 KiB cluster whose frame declares a 128 MiB window (zstd's default
        // limit) and no size: refused before the window is reserved.
        let data = vec![7u8; 4096];
        let mut frame = vec![0x28, 0xb5, 0x2f, 0xfd, 0x00, (27 - 10) << 3];
        frame.extend_from_slice(&(4096u32 << 3 | 1).to_le_bytes()[..3]); // last raw block
        frame.extend_from_slice(&data);
        let mut out = vec![0u8; 4096];
        let e = decompress(CompressionType::Zstd, &frame, &mut out).unwrap_err();
        assert!(e.contains("zstd"), "{e}");
        // The same frame declaring a 4 KiB window is fine.
        frame[5] = (12 - 10) << 3;
        decompress(CompressionType::Zstd, &frame, &mut out).unwrap();
        assert_eq!(out, data);
    }
}
