//! Narrowing the VMM's own constants (guest-physical addresses, port numbers, table sizes)
//! into the narrower fields that boot protocols, ACPI and the MP table give them.
//!
//! Each function panics when the value does not fit; call them only in const context
//! (`const { narrow::u32_of(LAPIC_ADDR) }`), so a constant that outgrows its field fails the
//! build instead of being truncated. Values from outside use `try_from` instead.

/// `value` as a `u32`; a build error (in const context) when it does not fit.
pub(crate) const fn u32_of(value: u64) -> u32 {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] => u32::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in 32 bits"),
    }
}

/// `value` as a `u16`; a build error (in const context) when it does not fit.
pub(crate) const fn u16_of(value: u64) -> u16 {
    match value.to_le_bytes() {
        [a, b, 0, 0, 0, 0, 0, 0] => u16::from_le_bytes([a, b]),
        _ => panic!("constant does not fit in 16 bits"),
    }
}

/// `value` as a `u8`; a build error (in const context) when it does not fit.
pub(crate) const fn u8_of(value: u64) -> u8 {
    match value.to_le_bytes() {
        [a, 0, 0, 0, 0, 0, 0, 0] => a,
        _ => panic!("constant does not fit in 8 bits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_values_that_fit() {
        assert_eq!(u32_of(0xfee0_0000), 0xfee0_0000);
        assert_eq!(u16_of(0x3f8), 0x3f8);
        assert_eq!(u8_of(0xff), 0xff);
    }

    #[test]
    #[should_panic(expected = "32 bits")]
    fn refuses_a_value_that_does_not_fit() {
        let _ = u32_of(1 << 32);
    }
}
