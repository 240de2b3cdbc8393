//! Refcount blocks: reading and writing entries of every width (1..=64 bits).
//!
//! Sub-byte widths pack entries starting at the least significant bit of each
//! byte; widths of 8 bits and more are big-endian integers (qcow2 spec).

/// Reads entry `index` of a refcount block with entries `1 << order` bits wide.
pub fn get(block: &[u8], order: u32, index: usize) -> u64 {
    match order {
        0..=2 => {
            let bits = 1usize << order;
            let per_byte = 8 / bits;
            let byte = block[index / per_byte];
            let shift = (index % per_byte) * bits;
            u64::from(byte >> shift) & ((1u64 << bits) - 1)
        }
        _ => {
            let bytes = 1usize << (order - 3);
            let start = index * bytes;
            block[start..start + bytes]
                .iter()
                .fold(0u64, |acc, &b| acc << 8 | u64::from(b))
        }
    }
}

/// Writes entry `index`. `value` must fit (see [`max_value`]).
pub fn set(block: &mut [u8], order: u32, index: usize, value: u64) {
    match order {
        0..=2 => {
            let bits = 1usize << order;
            let per_byte = 8 / bits;
            let shift = (index % per_byte) * bits;
            let mask = (u8::MAX >> (8 - bits)) << shift;
            let byte = &mut block[index / per_byte];
            // The entry is at most 4 bits: the low byte of `value` holds all of it.
            let [low, ..] = value.to_le_bytes();
            *byte = (*byte & !mask) | ((low << shift) & mask);
        }
        _ => {
            let bytes = 1usize << (order - 3);
            let start = index * bytes;
            let be = value.to_be_bytes();
            block[start..start + bytes].copy_from_slice(&be[8 - bytes..]);
        }
    }
}

/// Largest refcount an entry of this width can hold.
pub(crate) fn max_value(order: u32) -> u64 {
    if order >= 6 {
        u64::MAX
    } else {
        (1u64 << (1u32 << order)) - 1
    }
}

/// Entries in one refcount block.
pub(crate) fn entries_per_block(cluster_bits: u32, order: u32) -> u64 {
    (1u64 << (cluster_bits + 3)) >> order
}

#[cfg(test)]
mod tests {
    use super::*;
    use int_cast::u64_to_usize;

    #[test]
    fn every_width_roundtrips_without_touching_neighbours() {
        for order in 0..=6u32 {
            let n = u64_to_usize(entries_per_block(9, order));
            let mut block = vec![0u8; 512];
            let max = max_value(order);
            for i in 0..n {
                set(&mut block, order, i, (i as u64 * 7 + 1) & max);
            }
            for i in 0..n {
                assert_eq!(
                    get(&block, order, i),
                    (i as u64 * 7 + 1) & max,
                    "order {order} i {i}"
                );
            }
            set(&mut block, order, 3, max);
            assert_eq!(get(&block, order, 3), max);
            assert_eq!(get(&block, order, 2), (2 * 7 + 1) & max);
            assert_eq!(get(&block, order, 4), (4 * 7 + 1) & max);
        }
        // Known layouts: 1-bit entries start at the LSB; 16-bit are big-endian.
        let mut b = vec![0u8; 4];
        set(&mut b, 0, 1, 1);
        assert_eq!(b[0], 0b10);
        set(&mut b, 4, 1, 0x0102);
        assert_eq!(&b[2..4], &[1, 2]);
    }
}
