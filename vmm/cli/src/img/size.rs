//! Sizes and numbers as qemu-img and qemu-io write them.

/// Parses `4096`, `64k`, `1M`, `10G`, `0x1000`... (binary suffixes, any case;
/// a trailing `b`/`B` alone means bytes).
pub(crate) fn parse_size(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() && !s.starts_with("0x") => {
            let shift = match c.to_ascii_lowercase() {
                'b' => 0,
                'k' => 10,
                'm' => 20,
                'g' => 30,
                't' => 40,
                'p' => 50,
                'e' => 60,
                _ => anyhow::bail!("invalid size suffix in {s:?}"),
            };
            (&s[..i], 1u64 << shift)
        }
        _ => (s, 1),
    };
    if num.contains('.') {
        let v: f64 = num
            .parse()
            .map_err(|_| anyhow::anyhow!("invalid size {s:?}"))?;
        let bytes = v * mult as f64;
        anyhow::ensure!(
            bytes >= 0.0 && bytes < u64::MAX as f64,
            "size {s:?} out of range"
        );
        // Float to integer has no From/TryFrom; the range is checked just above.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        return Ok(bytes as u64);
    }
    let v = parse_number(num)?;
    v.checked_mul(mult)
        .ok_or_else(|| anyhow::anyhow!("size {s:?} out of range"))
}

/// Parses a plain number in C notation: decimal, `0x` hex or leading-0 octal.
pub(crate) fn parse_number(s: &str) -> anyhow::Result<u64> {
    let s = s.trim();
    let r = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if s.len() > 1 && s.starts_with('0') {
        u64::from_str_radix(&s[1..], 8)
    } else {
        s.parse()
    };
    r.map_err(|_| anyhow::anyhow!("invalid number {s:?}"))
}

/// A pattern byte (`-P`, `--pattern`): a number as [`parse_number`] reads it, refused above
/// 255 as qemu-io and qemu-img refuse it ("invalid pattern byte").
pub(crate) fn pattern_byte(s: &str) -> anyhow::Result<u8> {
    let v = parse_number(s)?;
    u8::try_from(v).map_err(|_| anyhow::anyhow!("invalid pattern byte {s:?}: above 255"))
}

/// Human form used in messages: `64 KiB`, `1 GiB`, `1.5 MiB`.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.3} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_bytes_stop_at_255() {
        assert_eq!(pattern_byte("0xff").unwrap(), 0xff);
        assert_eq!(pattern_byte("171").unwrap(), 171);
        assert!(pattern_byte("256").is_err());
        assert!(pattern_byte("0x1ab").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("64K").unwrap(), 65536);
        assert_eq!(parse_size("1M").unwrap(), 1 << 20);
        assert_eq!(parse_size("2G").unwrap(), 2 << 30);
        assert_eq!(parse_size("0x200").unwrap(), 512);
        assert_eq!(parse_size("1.5k").unwrap(), 1536);
        assert!(parse_size("12q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999E").is_err());
        assert_eq!(parse_number("0x11").unwrap(), 17);
        assert_eq!(parse_number("010").unwrap(), 8);
        assert_eq!(human(65536), "64 KiB");
    }
}
