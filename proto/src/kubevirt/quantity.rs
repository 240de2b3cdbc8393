//! Kubernetes resource quantities (`128Mi`, `1G`, `1.5Gi`, `100m`) as numbers.
//!
//! Only what VM sizing needs: a quantity in bytes, or in milli-units for CPU.
//! k8s-openapi keeps `Quantity` as the raw string, so the parsing lives here.

use super::Quantity;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QuantityError {
    #[error("{0:?} is not a quantity")]
    Invalid(String),
    #[error("{0:?} is too large")]
    Overflow(String),
    #[error("{0:?} is not a whole number of bytes")]
    Fractional(String),
}

/// Value of the quantity in thousandths (so `100m` is 100 and `1` is 1000).
pub fn to_milli(q: &Quantity) -> Result<u128, QuantityError> {
    let text = q.0.trim();
    let invalid = || QuantityError::Invalid(q.0.clone());
    let overflow = || QuantityError::Overflow(q.0.clone());
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    if number.is_empty() || number.starts_with('.') && number.len() == 1 {
        return Err(invalid());
    }
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number, ""),
    };
    if frac.contains('.') || frac.len() > 9 {
        return Err(invalid());
    }
    // (multiplier numerator, denominator) applied to the milli value.
    let (mul, div): (u128, u128) = match suffix {
        "" => (1000, 1),
        "m" => (1, 1),
        "k" => (1000 * 1000, 1),
        "M" => (1000 * 1_000_000, 1),
        "G" => (1000 * 1_000_000_000, 1),
        "T" => (1000 * 1_000_000_000_000, 1),
        "P" => (1000 * 1_000_000_000_000_000, 1),
        "Ki" => (1000 << 10, 1),
        "Mi" => (1000 << 20, 1),
        "Gi" => (1000 << 30, 1),
        "Ti" => (1000 << 40, 1),
        "Pi" => (1000 << 50, 1),
        "Ei" => (1000 << 60, 1),
        _ => return Err(invalid()),
    };
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| overflow())?
    };
    // At most 9 (checked above).
    let frac_digits = u32::try_from(frac.len()).map_err(|_| invalid())?;
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| invalid())?
    };
    let scale = 10u128.pow(frac_digits);
    let total = whole
        .checked_mul(scale)
        .and_then(|v| v.checked_add(frac_value))
        .and_then(|v| v.checked_mul(mul))
        .ok_or_else(overflow)?;
    // Round up a sub-milli remainder, as Kubernetes does.
    Ok(total.div_ceil(scale * div))
}

/// Value of a memory quantity in bytes.
pub fn to_bytes(q: &Quantity) -> Result<u64, QuantityError> {
    let milli = to_milli(q)?;
    if milli % 1000 != 0 {
        return Err(QuantityError::Fractional(q.0.clone()));
    }
    u64::try_from(milli / 1000).map_err(|_| QuantityError::Overflow(q.0.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn memory_quantities() {
        assert_eq!(to_bytes(&q("128Mi")), Ok(128 << 20));
        assert_eq!(to_bytes(&q("1024M")), Ok(1_024_000_000));
        assert_eq!(to_bytes(&q("1Gi")), Ok(1 << 30));
        assert_eq!(to_bytes(&q("2G")), Ok(2_000_000_000));
        assert_eq!(to_bytes(&q("1.5Gi")), Ok(3 << 29));
        assert_eq!(to_bytes(&q("4096")), Ok(4096));
        assert_eq!(to_bytes(&q("1k")), Ok(1000));
    }

    #[test]
    fn cpu_quantities() {
        assert_eq!(to_milli(&q("100m")), Ok(100));
        assert_eq!(to_milli(&q("2")), Ok(2000));
        assert_eq!(to_milli(&q("0.5")), Ok(500));
    }

    #[test]
    fn bad_quantities_are_errors() {
        for bad in ["", "Mi", "12Qi", "1.2.3", "-1", "abc", ".", "1e3"] {
            assert!(to_milli(&q(bad)).is_err(), "{bad:?}");
        }
        assert!(matches!(
            to_bytes(&q("99999999999999999999999Ei")),
            Err(QuantityError::Overflow(_))
        ));
        assert!(matches!(
            to_bytes(&q("1m")),
            Err(QuantityError::Fractional(_))
        ));
    }
}
