//! Narrowing constants (virtio and libc constants, the crate's own layout) into the narrower
//! fields that virtio and the kernel give them.
//!
//! Each function panics when the value does not fit; call them only in const context
//! (`const { narrow::u8_of_u32(VIRTIO_BLK_S_OK) }`), so a constant that outgrows its field
//! fails the build instead of being truncated. Values from the guest use `try_from`, or take
//! their low bytes with `to_le_bytes` where the register layout says so, as [`low_half`] and
//! [`high_half`] do for the 32-bit windows onto 64-bit registers.

/// The low half of a 64-bit register (a 32-bit window onto it).
pub(crate) const fn low_half(value: u64) -> u32 {
    let [a, b, c, d, ..] = value.to_le_bytes();
    u32::from_le_bytes([a, b, c, d])
}

/// The high half of a 64-bit register (a 32-bit window onto it).
pub(crate) const fn high_half(value: u64) -> u32 {
    let [.., e, f, g, h] = value.to_le_bytes();
    u32::from_le_bytes([e, f, g, h])
}

/// `value` as a `u8`.
pub(crate) const fn u8_of_u32(value: u32) -> u8 {
    match value.to_le_bytes() {
        [a, 0, 0, 0] => a,
        _ => panic!("constant does not fit in 8 bits"),
    }
}

/// `value` as a `u8`.
pub(crate) const fn u8_of_usize(value: usize) -> u8 {
    match value.to_le_bytes() {
        [a, 0, 0, 0, 0, 0, 0, 0] => a,
        _ => panic!("constant does not fit in 8 bits"),
    }
}

/// `value` as a `u16`.
pub(crate) const fn u16_of_u32(value: u32) -> u16 {
    match value.to_le_bytes() {
        [a, b, 0, 0] => u16::from_le_bytes([a, b]),
        _ => panic!("constant does not fit in 16 bits"),
    }
}

/// A non-negative libc constant as a `u16`.
pub(crate) const fn u16_of_c_int(value: libc::c_int) -> u16 {
    match value.to_le_bytes() {
        [a, b, 0, 0] => u16::from_le_bytes([a, b]),
        _ => panic!("constant does not fit in 16 bits"),
    }
}

/// Flag bits of a libc `int` as the C `short` an `ifreq` carries them in (the sign bit
/// included: `IFF_TUN_EXCL` is 0x8000).
pub(crate) const fn c_short_of_c_int(value: libc::c_int) -> libc::c_short {
    match value.to_le_bytes() {
        [a, b, 0, 0] => libc::c_short::from_le_bytes([a, b]),
        _ => panic!("flags do not fit in 16 bits"),
    }
}

/// `value` as a C `int` (a length an ioctl takes).
pub(crate) const fn c_int_of_usize(value: usize) -> libc::c_int {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] if d < 0x80 => libc::c_int::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in a C int"),
    }
}

/// `value` as a `u32`.
pub(crate) const fn u32_of_u64(value: u64) -> u32 {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] => u32::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in 32 bits"),
    }
}

/// `value` as a `u32`.
pub(crate) const fn u32_of_usize(value: usize) -> u32 {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] => u32::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in 32 bits"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_values_that_fit() {
        assert_eq!(low_half(0x1234_5678_9abc_def0), 0x9abc_def0);
        assert_eq!(high_half(0x1234_5678_9abc_def0), 0x1234_5678);
        assert_eq!(u8_of_u32(0xff), 0xff);
        assert_eq!(u8_of_usize(0x50), 0x50);
        assert_eq!(u16_of_u32(0xffff), 0xffff);
        assert_eq!(u16_of_c_int(libc::ETH_P_ALL), 3);
        assert_eq!(c_short_of_c_int(0x8000), libc::c_short::MIN);
        assert_eq!(u32_of_u64(0x6000), 0x6000);
        assert_eq!(u32_of_usize(4096), 4096);
        assert_eq!(c_int_of_usize(12), 12);
    }

    #[test]
    #[should_panic(expected = "8 bits")]
    fn refuses_a_value_that_does_not_fit() {
        let _ = u8_of_u32(0x100);
    }
}
