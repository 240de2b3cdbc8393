//! Go's `time.Duration` text, as KubeVirt writes durations on the wire: the launcher's flags
//! (`--qemu-timeout 287s`), a freeze request's `unfreezeTimeout` (`5m0s`).
//!
//! Hand-written: a sequence of numbers with units is a dozen lines, where a duration crate
//! would bring a syntax of its own (`5 min`, `1d`) that Go does not accept.

use std::time::Duration;

/// Parses a Go duration: numbers (with an optional fraction) each with a unit `h`, `m`, `s`,
/// `ms`, `us` (`µs`), `ns` (`240s`, `3m`, `1h30m`, `1.5s`, `5m0s`), or a lone `0`. No sign:
/// what KubeVirt sends this way is never negative.
pub fn parse(text: &str) -> Result<Duration, String> {
    let bad = || format!("invalid duration {text:?} (examples: 240s, 3m, 1h30m)");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() {
        return Err(bad());
    }
    let mut rest = text;
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(bad)?;
        if number_len == 0 {
            return Err(bad());
        }
        let value: f64 = rest[..number_len].parse().map_err(|_| bad())?;
        rest = &rest[number_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let seconds = match &rest[..unit_len] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 1e12 {
        return Err(bad());
    }
    Ok(Duration::from_secs_f64(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        for (text, seconds) in [
            ("240s", 240.0),
            ("3m", 180.0),
            ("1h30m", 5400.0),
            ("1.5s", 1.5),
            ("250ms", 0.25),
            ("5m0s", 300.0),
            ("1h2m3s", 3723.0),
            ("0", 0.0),
        ] {
            assert_eq!(parse(text), Ok(Duration::from_secs_f64(seconds)), "{text}");
        }
        for bad in [
            "",
            "s",
            "10",
            "10x",
            "-3s",
            "1e9h",
            "1..2s",
            "99999999999999h",
            "m5",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
