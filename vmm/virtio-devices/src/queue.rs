//! A device's view of one split virtqueue: taking chains off the available
//! ring and putting them on the used ring.
//!
//! Ring access is `virtio-queue`'s; this adds the checks that decide whether
//! the queue itself is still usable. Errors here are not about one request
//! (those are [`ChainError`]s, reported to the guest through the used ring)
//! but about the rings: the device cannot safely continue and needs a reset.

use std::num::Wrapping;
use std::sync::atomic::Ordering;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_ring::VRING_AVAIL_F_NO_INTERRUPT;
use virtio_queue::{Queue, QueueOwnedT, QueueT};
use vm_memory::Bytes;

use crate::chain::{ChainError, ValidatedChain};

/// The queue's rings are unusable.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("cannot access the available ring: {0}")]
    AvailRing(virtio_queue::Error),
    #[error(
        "available index {avail} is more than the queue size {size} ahead of the device's {next}"
    )]
    AvailIndexJump { avail: u16, next: u16, size: u16 },
    #[error("chain head {head} is outside the descriptor table of size {size}")]
    HeadOutOfRange { head: u16, size: u16 },
    #[error("cannot write the used ring: {0}")]
    UsedRing(virtio_queue::Error),
}

/// A chain taken off the available ring. `head` must be returned with
/// [`DeviceQueue::add_used`] whether or not the chain was valid.
#[derive(Debug)]
pub(crate) struct PoppedChain {
    pub(crate) head: u16,
    pub(crate) chain: Result<ValidatedChain, ChainError>,
}

/// One activated queue.
#[derive(Debug)]
pub(crate) struct DeviceQueue {
    queue: Queue,
}

impl DeviceQueue {
    /// Wraps a queue the transport has validated (size, alignment, rings in
    /// guest memory).
    pub(crate) fn new(queue: Queue) -> Self {
        DeviceQueue { queue }
    }

    /// The next available index the device will read and the next used index it will
    /// write (for live migration).
    pub(crate) fn position(&self) -> (u16, u16) {
        (self.queue.next_avail(), self.queue.next_used())
    }

    /// Number of entries; also the most chains a device handles per
    /// notification, so that a guest that keeps refilling the ring cannot keep
    /// a vCPU thread in the device forever.
    pub(crate) fn size(&self) -> u16 {
        self.queue.size()
    }

    /// Takes the next available chain and validates it, or `None` if the ring
    /// is empty.
    pub(crate) fn pop(&mut self, mem: &GuestMemoryMmap) -> Result<Option<PoppedChain>, QueueError> {
        let size = self.queue.size();
        let avail = self
            .queue
            .avail_idx(mem, Ordering::Acquire)
            .map_err(QueueError::AvailRing)?;
        let next = Wrapping(self.queue.next_avail());
        if avail == next {
            return Ok(None);
        }
        if (avail - next).0 > size {
            return Err(QueueError::AvailIndexJump {
                avail: avail.0,
                next: next.0,
                size,
            });
        }
        let chain = self
            .queue
            .iter(mem)
            .map_err(QueueError::AvailRing)?
            .next()
            // The index said there is an entry but the ring slot could not be
            // read (checked in guest memory at activation, so unexpected).
            .ok_or(QueueError::AvailRing(
                virtio_queue::Error::InvalidAvailRingIndex,
            ))?;
        let head = chain.head_index();
        if head >= size {
            return Err(QueueError::HeadOutOfRange { head, size });
        }
        Ok(Some(PoppedChain {
            head,
            chain: ValidatedChain::new(chain, mem, size),
        }))
    }

    /// Puts the last popped chain back (the device could not use it yet, for
    /// example a receive buffer with no frame to put in it).
    pub(crate) fn undo_pop(&mut self) {
        self.queue.go_to_previous_position();
    }

    /// Returns a chain to the driver with `len` bytes written into it.
    pub(crate) fn add_used(
        &mut self,
        mem: &GuestMemoryMmap,
        head: u16,
        len: u32,
    ) -> Result<(), QueueError> {
        self.queue
            .add_used(mem, head, len)
            .map_err(QueueError::UsedRing)
    }

    /// Whether the driver wants an interrupt for used buffers. Without
    /// `VIRTIO_RING_F_EVENT_IDX` (not offered) that is the inverse of
    /// `VRING_AVAIL_F_NO_INTERRUPT`, which virtio-queue does not look at.
    pub(crate) fn wants_interrupt(&self, mem: &GuestMemoryMmap) -> bool {
        // The used index just written must be visible before the flags are
        // read (virtio 1.x, 2.7.10): a driver that clears NO_INTERRUPT, fences
        // and re-checks the used index would otherwise wait for an interrupt
        // never sent. virtio-queue's own `needs_notification` fences the same way.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        let flags: Result<u16, _> = mem.read_obj(vm_memory::GuestAddress(self.queue.avail_ring()));
        match flags {
            Ok(f) => {
                u16::from_le(f) & const { int_cast::u16_of_u32(VRING_AVAIL_F_NO_INTERRUPT) } == 0
            }
            Err(_) => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Desc, GuestDriver, test_memory};

    #[test]
    fn pops_chains_in_order_then_reports_empty() {
        let mem = test_memory();
        let mut d = GuestDriver::new(&mem, 8);
        let a = d.add_chain(&[Desc::read(0x10000, 8)]);
        let b = d.add_chain(&[Desc::write(0x11000, 8)]);
        let mut q = DeviceQueue::new(d.queue());
        assert_eq!(q.pop(&mem).unwrap().unwrap().head, a);
        let second = q.pop(&mem).unwrap().unwrap();
        assert_eq!(second.head, b);
        assert!(q.pop(&mem).unwrap().is_none());
        q.add_used(&mem, second.head, 8).unwrap();
        assert_eq!(d.used_idx(), 1);
        assert_eq!(d.used_elem(0), (u32::from(b), 8));
    }

    #[test]
    fn an_available_index_too_far_ahead_is_fatal() {
        let mem = test_memory();
        let mut d = GuestDriver::new(&mem, 8);
        d.set_avail_idx(9);
        let mut q = DeviceQueue::new(d.queue());
        assert!(matches!(
            q.pop(&mem),
            Err(QueueError::AvailIndexJump {
                avail: 9,
                next: 0,
                size: 8
            })
        ));
    }

    #[test]
    fn an_available_index_that_wrapped_is_fine() {
        let mem = test_memory();
        let mut d = GuestDriver::new(&mem, 8);
        // Both sides just below the wrap point; the two chains wrap avail.idx to 0.
        d.set_avail_idx(u16::MAX - 1);
        let mut raw = d.queue();
        raw.set_next_avail(u16::MAX - 1);
        let mut q = DeviceQueue::new(raw);
        d.add_chain(&[Desc::read(0x10000, 8)]);
        d.add_chain(&[Desc::read(0x10000, 8)]);
        assert!(q.pop(&mem).unwrap().is_some());
        assert!(q.pop(&mem).unwrap().is_some());
        assert!(q.pop(&mem).unwrap().is_none());
    }

    #[test]
    fn a_head_index_outside_the_table_is_fatal() {
        let mem = test_memory();
        let mut d = GuestDriver::new(&mem, 8);
        d.publish(8);
        let mut q = DeviceQueue::new(d.queue());
        assert!(matches!(
            q.pop(&mem),
            Err(QueueError::HeadOutOfRange { head: 8, size: 8 })
        ));
    }

    #[test]
    fn no_interrupt_flag_is_honoured() {
        let mem = test_memory();
        let mut d = GuestDriver::new(&mem, 8);
        let q = DeviceQueue::new(d.queue());
        assert!(q.wants_interrupt(&mem));
        d.set_avail_flags(const { int_cast::u16_of_u32(VRING_AVAIL_F_NO_INTERRUPT) });
        assert!(!q.wants_interrupt(&mem));
    }
}
