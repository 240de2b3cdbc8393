//! Integer conversions that the workspace's numeric-cast lints cannot prove lossless; the one
//! home of them for the VMM crates (`block`, `disk-boot`, `virtio-devices`, `vmm`, the launcher
//! and the `vmm` command).
//!
//! A crate of its own, below all of them: the conversions belong to no disk format or device,
//! and a crate that needs one should not have to depend on the disk engine (`block`) for it.
//!
//! Three kinds, by where the value comes from:
//!
//! - Widening between `usize` and the fixed widths ([`u64_to_usize`], [`u32_to_usize`],
//!   [`usize_to_u64`]). The VMM crates build for 64-bit targets only
//!   (x86_64 today), where `usize` and `u64` have the same width: converting offsets, lengths
//!   and counts between them never loses a bit. `u64_to_usize` says so once, instead of an
//!   `as` (which the lints refuse) or a `try_from` whose error can never happen at every call
//!   site. It converts; it does not check ranges: a value from outside (an image header, the
//!   guest) is still checked against what it indexes.
//! - Narrowing a constant (virtio and libc constants, the VMM's guest-physical layout, port
//!   numbers, table sizes) into the narrower field a protocol gives it: the `*_of_*` functions
//!   panic when the value does not fit. Call them only in const context
//!   (`const { int_cast::u32_of_u64(LAPIC_ADDR) }`), so a constant that outgrows its field
//!   fails the build instead of being truncated. Values from outside use `try_from` instead.
//! - The 32-bit windows onto a 64-bit register ([`low_half`], [`high_half`]): taking the low
//!   or high bytes is what the register layout says, not a loss.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the VMM crates support 64-bit targets only (see the int-cast crate)");

/// `value` as a `usize`: lossless on the 64-bit targets this crate builds for.
#[inline]
#[must_use]
// The one sanctioned `as` for this conversion: the compile_error above makes it lossless.
#[allow(clippy::cast_possible_truncation)]
pub const fn u64_to_usize(value: u64) -> usize {
    value as usize
}

/// `value` as a `usize`: lossless on every target with at least 32-bit pointers (`usize` has
/// no `From<u32>` only because of 16-bit targets). An `as` here would pass every cast lint and
/// silently become a truncation if the source type grew.
#[inline]
#[must_use]
pub const fn u32_to_usize(value: u32) -> usize {
    value as usize
}

/// `value` as a `u64`: lossless on the 64-bit targets this crate builds for (`u64` has no
/// `From<usize>` because of 128-bit targets). An `as` here passes every cast lint.
#[inline]
#[must_use]
pub const fn usize_to_u64(value: usize) -> u64 {
    value as u64
}

/// The low half of a 64-bit register (a 32-bit window onto it).
#[must_use]
pub const fn low_half(value: u64) -> u32 {
    let [a, b, c, d, ..] = value.to_le_bytes();
    u32::from_le_bytes([a, b, c, d])
}

/// The high half of a 64-bit register (a 32-bit window onto it).
#[must_use]
pub const fn high_half(value: u64) -> u32 {
    let [.., e, f, g, h] = value.to_le_bytes();
    u32::from_le_bytes([e, f, g, h])
}

/// `value` as a `u32`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u32_of_u64(value: u64) -> u32 {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] => u32::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in 32 bits"),
    }
}

/// `value` as a `u32`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u32_of_usize(value: usize) -> u32 {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] => u32::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in 32 bits"),
    }
}

/// `value` as a `u16`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u16_of_u64(value: u64) -> u16 {
    match value.to_le_bytes() {
        [a, b, 0, 0, 0, 0, 0, 0] => u16::from_le_bytes([a, b]),
        _ => panic!("constant does not fit in 16 bits"),
    }
}

/// `value` as a `u16`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u16_of_u32(value: u32) -> u16 {
    match value.to_le_bytes() {
        [a, b, 0, 0] => u16::from_le_bytes([a, b]),
        _ => panic!("constant does not fit in 16 bits"),
    }
}

/// `value` as a `u8`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u8_of_u64(value: u64) -> u8 {
    match value.to_le_bytes() {
        [a, 0, 0, 0, 0, 0, 0, 0] => a,
        _ => panic!("constant does not fit in 8 bits"),
    }
}

/// `value` as a `u8`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u8_of_u32(value: u32) -> u8 {
    match value.to_le_bytes() {
        [a, 0, 0, 0] => a,
        _ => panic!("constant does not fit in 8 bits"),
    }
}

/// `value` as a `u8`; a build error (in const context) when it does not fit.
#[must_use]
pub const fn u8_of_usize(value: usize) -> u8 {
    match value.to_le_bytes() {
        [a, 0, 0, 0, 0, 0, 0, 0] => a,
        _ => panic!("constant does not fit in 8 bits"),
    }
}

/// A non-negative libc constant as a `u16`.
#[must_use]
pub const fn u16_of_c_int(value: libc::c_int) -> u16 {
    match value.to_le_bytes() {
        [a, b, 0, 0] => u16::from_le_bytes([a, b]),
        _ => panic!("constant does not fit in 16 bits"),
    }
}

/// Flag bits of a libc `int` as the C `short` an `ifreq` carries them in (the sign bit
/// included: `IFF_TUN_EXCL` is 0x8000).
#[must_use]
pub const fn c_short_of_c_int(value: libc::c_int) -> libc::c_short {
    match value.to_le_bytes() {
        [a, b, 0, 0] => libc::c_short::from_le_bytes([a, b]),
        _ => panic!("flags do not fit in 16 bits"),
    }
}

/// `value` as a C `int` (a length an ioctl takes).
#[must_use]
pub const fn c_int_of_usize(value: usize) -> libc::c_int {
    match value.to_le_bytes() {
        [a, b, c, d, 0, 0, 0, 0] if d < 0x80 => libc::c_int::from_le_bytes([a, b, c, d]),
        _ => panic!("constant does not fit in a C int"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_bit() {
        assert_eq!(u64_to_usize(u64::MAX), usize::MAX);
        assert_eq!(u64_to_usize(1 << 40), 1usize << 40);
        assert_eq!(u32_to_usize(u32::MAX), 0xffff_ffff);
        assert_eq!(usize_to_u64(usize::MAX), u64::MAX);
    }

    #[test]
    fn narrowing_keeps_values_that_fit() {
        assert_eq!(low_half(0x1234_5678_9abc_def0), 0x9abc_def0);
        assert_eq!(high_half(0x1234_5678_9abc_def0), 0x1234_5678);
        assert_eq!(u32_of_u64(0xfee0_0000), 0xfee0_0000);
        assert_eq!(u32_of_usize(4096), 4096);
        assert_eq!(u16_of_u64(0x3f8), 0x3f8);
        assert_eq!(u16_of_u32(0xffff), 0xffff);
        assert_eq!(u8_of_u64(0xff), 0xff);
        assert_eq!(u8_of_u32(0xff), 0xff);
        assert_eq!(u8_of_usize(0x50), 0x50);
        assert_eq!(u16_of_c_int(libc::ETH_P_ALL), 3);
        assert_eq!(c_short_of_c_int(0x8000), libc::c_short::MIN);
        assert_eq!(c_int_of_usize(12), 12);
    }

    #[test]
    #[should_panic(expected = "32 bits")]
    fn refuses_a_u64_that_does_not_fit() {
        let _ = u32_of_u64(1 << 32);
    }

    #[test]
    #[should_panic(expected = "8 bits")]
    fn refuses_a_u32_that_does_not_fit() {
        let _ = u8_of_u32(0x100);
    }

    #[test]
    #[should_panic(expected = "C int")]
    fn refuses_a_length_past_c_int() {
        let _ = c_int_of_usize(0x8000_0000);
    }
}
