//! What `blk=tick` writes, for the guest and the host's check alike (the host's
//! `test_guest` crate includes this file).

/// The first sector the ticks write.
pub const FIRST_SECTOR: u64 = 64;
pub const SECTOR: u64 = 512;

/// Byte `i` of the sector of write `n`: `n` in its first 8 bytes, then a pattern of
/// both.
pub fn tick_pattern(n: u64, i: u64) -> u8 {
    // The low byte of each (`to_le_bytes`: no truncating casts).
    let low = |x: u64| x.to_le_bytes()[0];
    if i < 8 {
        low(n >> (8 * i))
    } else {
        low(n).wrapping_mul(13) ^ low(i).wrapping_mul(7) ^ 0xa5
    }
}
