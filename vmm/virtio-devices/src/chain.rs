//! Whole-chain validation of a descriptor chain before a device uses it.
//!
//! `virtio-queue` follows `next` links with a time-to-live of the queue size,
//! rejects nested or malformed indirect tables and stops when the total length
//! would overflow a `u32`, but it reports all of these by simply ending the
//! iteration, and it never checks that the buffers lie in guest memory. This
//! module turns "the iteration ended while the last descriptor still said
//! NEXT" into an error and adds the checks it leaves to devices (see
//! anchors §3.4; crosvm validates chains the same way).
//!
//! It also bounds what one chain can make the VMM hold: virtio 1.2
//! §2.7.5.3.1 says a driver MUST NOT create a chain longer than the queue
//! size, indirect descriptors included, but `virtio-queue` accepts indirect
//! tables of up to 65 535 entries. A chain is refused as soon as it has more
//! descriptors than the queue has entries, before more are collected; so a
//! notification (at most a queue's worth of chains) holds at most
//! queue size² buffers (1 MiB of [`Buffer`]s for a 256-entry queue) instead of
//! the ~16 M one shared 65 535-entry table allowed.

use std::ops::Deref;

use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::DescriptorChain;
use vm_memory::{Address, GuestAddress, GuestMemory, GuestMemoryBackend};

/// The descriptor flags, as the 16-bit field of a descriptor carries them.
pub(crate) const DESC_F_NEXT: u16 = int_cast::u16_of_u32(VRING_DESC_F_NEXT);
pub(crate) const DESC_F_WRITE: u16 = int_cast::u16_of_u32(VRING_DESC_F_WRITE);
pub(crate) const DESC_F_INDIRECT: u16 = int_cast::u16_of_u32(VRING_DESC_F_INDIRECT);

/// Flags a split-ring descriptor may carry; anything else is a driver bug.
const KNOWN_FLAGS: u16 = DESC_F_NEXT | DESC_F_WRITE | DESC_F_INDIRECT;

/// Why a descriptor chain was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChainError {
    #[error("the chain has no descriptors (unreadable head or empty indirect table)")]
    Empty,
    #[error(
        "the chain ends after {descriptors} descriptors while the last one still points to a next one: \
         a loop, a chain longer than the queue, a next index outside the table, an invalid indirect \
         table or a total length over 4 GiB"
    )]
    Unterminated { descriptors: usize },
    #[error("descriptor {index} has unknown flags {flags:#x}")]
    UnknownFlags { index: usize, flags: u16 },
    #[error("descriptor {index} has length 0")]
    ZeroLength { index: usize },
    #[error("descriptor {index} [{addr:#x}, +{len:#x}) wraps around the address space")]
    AddressWraps { index: usize, addr: u64, len: u32 },
    #[error("descriptor {index} [{addr:#x}, +{len:#x}) is not inside guest memory")]
    OutsideGuestMemory { index: usize, addr: u64, len: u32 },
    #[error("descriptor {index} is device-readable but follows a device-writable one")]
    ReadableAfterWritable { index: usize },
    #[error("the chain has more than {max} descriptors (the queue size; indirect ones count)")]
    TooLong { max: u16 },
}

/// One buffer of a validated chain. Its whole range lies in guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Buffer {
    pub(crate) addr: GuestAddress,
    pub(crate) len: u32,
    /// Device-writable (`VRING_DESC_F_WRITE`); otherwise device-readable.
    pub(crate) writable: bool,
}

/// A descriptor chain whose buffers have all been checked. Readable buffers
/// come first, then writable ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidatedChain {
    buffers: Vec<Buffer>,
}

impl ValidatedChain {
    /// Walks `chain` and checks every descriptor against `mem`. A chain of
    /// more than `max_len` descriptors (the queue size) is refused without
    /// collecting the rest.
    pub(crate) fn new<M, G>(
        chain: DescriptorChain<M>,
        mem: &G,
        max_len: u16,
    ) -> Result<Self, ChainError>
    where
        M: Deref,
        M::Target: GuestMemory,
        G: GuestMemoryBackend,
    {
        let mut buffers = Vec::new();
        let mut last_had_next = false;
        let mut seen_writable = false;
        for (index, desc) in chain.enumerate() {
            if index >= usize::from(max_len) {
                return Err(ChainError::TooLong { max: max_len });
            }
            let flags = desc.flags();
            if flags & !KNOWN_FLAGS != 0 {
                return Err(ChainError::UnknownFlags { index, flags });
            }
            let (addr, len) = (desc.addr(), desc.len());
            if len == 0 {
                return Err(ChainError::ZeroLength { index });
            }
            // `len > 0` here, so the last byte is at `addr + len - 1`.
            if addr.checked_add(u64::from(len) - 1).is_none() {
                return Err(ChainError::AddressWraps {
                    index,
                    addr: addr.raw_value(),
                    len,
                });
            }
            if !mem.check_range(addr, int_cast::u32_to_usize(len)) {
                return Err(ChainError::OutsideGuestMemory {
                    index,
                    addr: addr.raw_value(),
                    len,
                });
            }
            let writable = desc.is_write_only();
            if seen_writable && !writable {
                return Err(ChainError::ReadableAfterWritable { index });
            }
            seen_writable |= writable;
            last_had_next = desc.has_next();
            buffers.push(Buffer {
                addr,
                len,
                writable,
            });
        }
        if buffers.is_empty() {
            return Err(ChainError::Empty);
        }
        if last_had_next {
            return Err(ChainError::Unterminated {
                descriptors: buffers.len(),
            });
        }
        Ok(ValidatedChain { buffers })
    }

    /// All buffers in chain order.
    pub(crate) fn buffers(&self) -> &[Buffer] {
        &self.buffers
    }

    /// The device-readable buffers (the first part of the chain).
    pub(crate) fn readable(&self) -> &[Buffer] {
        let n = self.buffers.iter().take_while(|b| !b.writable).count();
        &self.buffers[..n]
    }

    /// The device-writable buffers (the last part of the chain).
    pub(crate) fn writable(&self) -> &[Buffer] {
        let n = self.readable().len();
        &self.buffers[n..]
    }

    /// Sum of the lengths of `buffers`. Cannot overflow a `u64`.
    pub(crate) fn total_len(buffers: &[Buffer]) -> u64 {
        buffers.iter().map(|b| u64::from(b.len)).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Desc, GuestDriver, MEM_SIZE, test_memory};
    use virtio_queue::QueueT;

    fn validate(
        mem: &crate::GuestMemoryMmap,
        descs: &[Desc],
    ) -> Result<ValidatedChain, ChainError> {
        let mut driver = GuestDriver::new(mem, 16);
        driver.add_chain(descs);
        let mut queue = driver.queue();
        let chain = queue
            .pop_descriptor_chain(mem)
            .expect("the driver made one chain available");
        ValidatedChain::new(chain, mem, 16)
    }

    #[test]
    fn a_well_formed_chain_is_accepted_in_order() {
        let mem = test_memory();
        let chain = validate(
            &mem,
            &[
                Desc::read(0x10000, 16),
                Desc::write(0x11000, 512),
                Desc::write(0x12000, 1),
            ],
        )
        .unwrap();
        assert_eq!(chain.readable().len(), 1);
        assert_eq!(chain.writable().len(), 2);
        assert_eq!(ValidatedChain::total_len(chain.writable()), 513);
        assert_eq!(chain.buffers()[1].addr, GuestAddress(0x11000));
    }

    #[test]
    fn a_buffer_past_the_end_of_memory_is_refused() {
        let mem = test_memory();
        let err = validate(&mem, &[Desc::read(MEM_SIZE - 8, 16)]).unwrap_err();
        assert!(
            matches!(err, ChainError::OutsideGuestMemory { index: 0, .. }),
            "{err}"
        );
        let err = validate(&mem, &[Desc::read(MEM_SIZE + 0x1000, 1)]).unwrap_err();
        assert!(
            matches!(err, ChainError::OutsideGuestMemory { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_huge_length_is_refused() {
        let mem = test_memory();
        let err = validate(&mem, &[Desc::write(0x10000, u32::MAX)]).unwrap_err();
        assert!(
            matches!(err, ChainError::OutsideGuestMemory { .. }),
            "{err}"
        );
    }

    #[test]
    fn an_address_that_wraps_is_refused() {
        let mem = test_memory();
        let err = validate(&mem, &[Desc::read(u64::MAX - 4, 16)]).unwrap_err();
        assert!(matches!(err, ChainError::AddressWraps { .. }), "{err}");
    }

    #[test]
    fn a_zero_length_descriptor_is_refused() {
        let mem = test_memory();
        let err = validate(&mem, &[Desc::read(0x10000, 16), Desc::write(0x11000, 0)]).unwrap_err();
        assert_eq!(err, ChainError::ZeroLength { index: 1 });
    }

    #[test]
    fn a_readable_buffer_after_a_writable_one_is_refused() {
        let mem = test_memory();
        let err = validate(&mem, &[Desc::write(0x10000, 16), Desc::read(0x11000, 16)]).unwrap_err();
        assert_eq!(err, ChainError::ReadableAfterWritable { index: 1 });
    }

    #[test]
    fn unknown_flags_are_refused() {
        let mem = test_memory();
        let mut d = Desc::read(0x10000, 16);
        d.flags |= 0x80;
        let err = validate(&mem, &[d]).unwrap_err();
        assert!(
            matches!(err, ChainError::UnknownFlags { index: 0, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_loop_is_refused() {
        let mem = test_memory();
        let mut driver = GuestDriver::new(&mem, 16);
        // 0 -> 1 -> 0 -> ...
        driver.set_desc(0, 0x10000, 16, DESC_F_NEXT, 1);
        driver.set_desc(1, 0x11000, 16, DESC_F_NEXT, 0);
        driver.publish(0);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        let err = ValidatedChain::new(chain, &mem, 16).unwrap_err();
        assert_eq!(err, ChainError::Unterminated { descriptors: 16 });
    }

    #[test]
    fn a_next_index_outside_the_table_is_refused() {
        let mem = test_memory();
        let mut driver = GuestDriver::new(&mem, 16);
        driver.set_desc(0, 0x10000, 16, DESC_F_NEXT, 16);
        driver.publish(0);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        let err = ValidatedChain::new(chain, &mem, 16).unwrap_err();
        assert_eq!(err, ChainError::Unterminated { descriptors: 1 });
    }

    #[test]
    fn a_head_index_outside_the_table_gives_an_empty_chain() {
        let mem = test_memory();
        let mut driver = GuestDriver::new(&mem, 16);
        driver.publish(200);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        assert_eq!(
            ValidatedChain::new(chain, &mem, 16).unwrap_err(),
            ChainError::Empty
        );
    }

    #[test]
    fn total_length_over_4_gib_is_refused() {
        // virtio-queue stops the walk when the sum overflows a u32, before
        // the memory check would see the second buffer; we must report it.
        let mem = test_memory();
        let mut driver = GuestDriver::new(&mem, 16);
        driver.set_desc(0, 0x1000, 0x1000, DESC_F_NEXT, 1);
        driver.set_desc(1, 0x2000, u32::MAX, 0, 0);
        driver.publish(0);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        let err = ValidatedChain::new(chain, &mem, 16).unwrap_err();
        assert_eq!(err, ChainError::Unterminated { descriptors: 1 });
    }

    #[test]
    fn indirect_tables_are_followed_and_checked() {
        let mem = test_memory();
        let mut driver = GuestDriver::new(&mem, 16);
        let table = 0x20000;
        driver.write_indirect_table(
            table,
            &[
                Desc::read(0x10000, 16).with_next(1),
                Desc::write(0x11000, 1),
            ],
        );
        driver.set_desc(0, table, 32, DESC_F_INDIRECT, 0);
        driver.publish(0);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        let chain = ValidatedChain::new(chain, &mem, 16).unwrap();
        assert_eq!(chain.buffers().len(), 2);
    }

    #[test]
    fn a_chain_longer_than_the_queue_is_refused_indirect_entries_included() {
        let mem = test_memory();
        // One direct descriptor, then an indirect table: 1 + 15 entries fill
        // a 16-entry queue exactly; one more entry is one too many.
        for (entries, ok) in [(15usize, true), (16, false), (4000, false)] {
            let mut driver = GuestDriver::new(&mem, 16);
            let table = 0x20000;
            let descs: Vec<Desc> = (0..entries)
                .map(|i| {
                    let d = Desc::read(0x10000, 16);
                    if i + 1 < entries {
                        d.with_next(u16::try_from(i).expect("few entries") + 1)
                    } else {
                        d
                    }
                })
                .collect();
            driver.write_indirect_table(table, &descs);
            driver.set_desc(0, 0x10000, 16, DESC_F_NEXT, 1);
            driver.set_desc(
                1,
                table,
                16 * u32::try_from(entries).expect("few entries"),
                DESC_F_INDIRECT,
                0,
            );
            driver.publish(0);
            let mut queue = driver.queue();
            let chain = queue.pop_descriptor_chain(&mem).unwrap();
            let result = ValidatedChain::new(chain, &mem, 16);
            if ok {
                assert_eq!(result.unwrap().buffers().len(), 16);
            } else {
                assert_eq!(
                    result.unwrap_err(),
                    ChainError::TooLong { max: 16 },
                    "{entries}"
                );
            }
        }
    }

    #[test]
    fn nested_indirect_tables_are_refused() {
        let mem = test_memory();
        let mut driver = GuestDriver::new(&mem, 16);
        let inner = 0x21000;
        driver.write_indirect_table(inner, &[Desc::read(0x10000, 16)]);
        let mut nested = Desc::read(inner, 16);
        nested.flags = DESC_F_INDIRECT;
        let outer = 0x20000;
        driver.write_indirect_table(outer, &[Desc::read(0x10000, 16).with_next(1), nested]);
        driver.set_desc(0, outer, 32, DESC_F_INDIRECT, 0);
        driver.publish(0);
        let mut queue = driver.queue();
        let chain = queue.pop_descriptor_chain(&mem).unwrap();
        let err = ValidatedChain::new(chain, &mem, 16).unwrap_err();
        assert_eq!(err, ChainError::Unterminated { descriptors: 1 });
    }

    #[test]
    fn an_indirect_table_outside_memory_or_misaligned_is_refused() {
        let mem = test_memory();
        for (addr, len) in [(MEM_SIZE + 0x1000, 32u32), (0x20000, 24)] {
            let mut driver = GuestDriver::new(&mem, 16);
            driver.set_desc(0, 0x10000, 16, DESC_F_NEXT, 1);
            driver.set_desc(1, addr, len, DESC_F_INDIRECT, 0);
            driver.publish(0);
            let mut queue = driver.queue();
            let chain = queue.pop_descriptor_chain(&mem).unwrap();
            let err = ValidatedChain::new(chain, &mem, 16).unwrap_err();
            assert_eq!(
                err,
                ChainError::Unterminated { descriptors: 1 },
                "table {addr:#x}+{len}"
            );
        }
    }
}
