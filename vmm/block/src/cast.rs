//! Integer conversions that the workspace's numeric-cast lints cannot prove lossless.
//!
//! The VMM crates build for 64-bit targets only (x86_64 today), where `usize` and `u64` have
//! the same width: converting offsets, lengths and counts between them never loses a bit.
//! `u64_to_usize` says so once, instead of an `as` (which the lints refuse) or a `try_from`
//! whose error can never happen at every call site. It converts; it does not check ranges: a
//! value from outside (an image header, the guest) is still checked against what it indexes.

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the VMM crates support 64-bit targets only (see block::cast)");

/// `value` as a `usize`: lossless on the 64-bit targets this crate builds for.
#[inline]
#[must_use]
// The one sanctioned `as` for this conversion: the compile_error above makes it lossless.
#[allow(clippy::cast_possible_truncation)]
pub const fn u64_to_usize(value: u64) -> usize {
    value as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_every_bit() {
        assert_eq!(u64_to_usize(u64::MAX), usize::MAX);
        assert_eq!(u64_to_usize(1 << 40), 1usize << 40);
    }
}
