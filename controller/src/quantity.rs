//! Resource quantities with Kubernetes' arithmetic and canonical spelling.
//!
//! The pod's resources are sums of quantities (`2Gi` guest + `280Mi` overhead) and must be
//! written the way apimachinery's `resource.Quantity` writes them, so that a rendered pod
//! compares equal, field by field, with the one KubeVirt renders. proto parses a quantity into
//! milli-units; this module adds the format (binary or decimal suffixes) that apimachinery
//! carries along, the `Add` rule for it, and the canonical form.

use proto::kubevirt::Quantity;
use proto::kubevirt::quantity::{QuantityError, to_milli};

/// Which suffix family a quantity is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `Ki`, `Mi`, `Gi`, ...
    BinarySi,
    /// `k`, `M`, `G`, ..., `m`, or no suffix.
    DecimalSi,
}

/// A non-negative quantity in thousandths of a unit, with its format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Qty {
    pub milli: u128,
    pub format: Format,
}

impl Qty {
    pub const ZERO: Qty = Qty {
        milli: 0,
        format: Format::DecimalSi,
    };

    pub fn parse(q: &Quantity) -> Result<Self, QuantityError> {
        let milli = to_milli(q)?;
        let format = if q.0.trim_end().ends_with('i') {
            Format::BinarySi
        } else {
            Format::DecimalSi
        };
        Ok(Qty { milli, format })
    }

    pub fn bytes(bytes: u64, format: Format) -> Self {
        Qty {
            milli: u128::from(bytes) * 1000,
            format,
        }
    }

    pub(crate) fn mebibytes(mib: u64) -> Self {
        Self::bytes(mib << 20, Format::BinarySi)
    }

    /// The value rounded up to a whole unit (apimachinery's `Value()`).
    pub fn value(&self) -> u128 {
        self.milli.div_ceil(1000)
    }

    pub fn is_zero(&self) -> bool {
        self.milli == 0
    }

    /// apimachinery's `Add`: a zero receiver takes the other's format.
    pub fn plus(self, other: Qty) -> Qty {
        Qty {
            milli: self.milli + other.milli,
            format: if self.milli == 0 {
                other.format
            } else {
                self.format
            },
        }
    }

    /// apimachinery's `Sub` for a smaller `other` (the resources never go negative): the
    /// receiver's format is kept, as with [`Qty::plus`].
    pub(crate) fn minus(self, other: Qty) -> Qty {
        Qty {
            milli: self.milli.saturating_sub(other.milli),
            format: self.format,
        }
    }

    pub(crate) fn to_quantity(self) -> Quantity {
        Quantity(self.to_string())
    }
}

impl std::fmt::Display for Qty {
    /// The canonical form: the largest suffix that keeps the number whole; values below one
    /// unit (or below 1024 in binary format) are written in decimal, fractions as milli-units.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.milli.is_multiple_of(1000) {
            return write!(f, "{}m", self.milli);
        }
        let whole = self.milli / 1000;
        let binary = self.format == Format::BinarySi && whole >= 1024;
        let (base, suffixes): (u128, &[&str]) = if binary {
            (1024, &["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])
        } else {
            (1000, &["", "k", "M", "G", "T", "P", "E"])
        };
        let mut number = whole;
        let mut index = 0;
        while number != 0 && number.is_multiple_of(base) && index + 1 < suffixes.len() {
            number /= base;
            index += 1;
        }
        // `index` stays below `suffixes.len()` by the loop condition.
        write!(f, "{number}{}", suffixes[index])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Qty {
        Qty::parse(&Quantity(text.into())).expect("valid quantity")
    }

    #[test]
    fn canonical_forms_match_apimachinery() {
        for (input, canonical) in [
            ("2Gi", "2Gi"),
            ("2048Mi", "2Gi"),
            ("100m", "100m"),
            ("0.1", "100m"),
            ("1.5", "1500m"),
            ("50M", "50M"),
            ("50000k", "50M"),
            ("1", "1"),
            ("0", "0"),
            ("1000Ki", "1000Ki"),
            ("512Ki", "512Ki"),
            ("4096", "4096"),
        ] {
            assert_eq!(q(input).to_string(), canonical, "{input}");
        }
    }

    #[test]
    fn sums_keep_the_receiver_format() {
        let request = q("2Gi").plus(Qty::mebibytes(280));
        assert_eq!(request.to_string(), "2328Mi");
        let storage = Qty::ZERO.plus(q("50M"));
        assert_eq!(storage.to_string(), "50M");
        // A binary sum that is not a whole KiB is written as a plain number.
        let odd = q("1Gi").plus(Qty::bytes(1, Format::DecimalSi));
        assert_eq!(odd.to_string(), "1073741825");
    }

    #[test]
    fn bad_quantities_are_errors() {
        assert!(Qty::parse(&Quantity("lots".into())).is_err());
    }
}
