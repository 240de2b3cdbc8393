//! The one virtqueue of a request/response device (virtio-blk, virtio-rng):
//! the driver puts a chain on it and the device answers in the same chain.
//! Activation, reset and draining are the same for every such device; only
//! what is done with one chain differs, and that is the device's closure.

use crate::GuestMemoryMmap;

use crate::chain::{ChainError, ValidatedChain};
use crate::device::{ActivateContext, ActivateError, DeviceError};
use crate::interrupt::DeviceInterrupt;
use crate::queue::{DeviceQueue, PoppedChain};

/// The queue with what it needs once the driver has set it up.
struct Active {
    mem: GuestMemoryMmap,
    queue: DeviceQueue,
    interrupt: DeviceInterrupt,
}

#[derive(Default)]
pub(crate) struct RequestQueue {
    active: Option<Active>,
}

impl RequestQueue {
    /// Takes the single queue the driver set up.
    pub(crate) fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        let got = ctx.queues.len();
        let Ok::<[_; 1], _>([queue]) = ctx.queues.try_into() else {
            return Err(ActivateError::QueueCount { expected: 1, got });
        };
        self.active = Some(Active {
            mem: ctx.mem,
            queue: DeviceQueue::new(queue),
            interrupt: ctx.interrupt,
        });
        Ok(())
    }

    pub(crate) fn reset(&mut self) {
        self.active = None;
    }

    /// The queue's next available and next used index while activated (none before).
    pub(crate) fn positions(&self) -> Vec<(u16, u16)> {
        self.active
            .iter()
            .map(|active| active.queue.position())
            .collect()
    }

    /// Answers a notification of queue `index`: every chain on the ring,
    /// at most one queue's worth (see [`DeviceQueue::size`]), goes to
    /// `handle`, which returns how many bytes it wrote into the chain (0 for
    /// a chain that failed validation), then the used buffers are signalled.
    pub(crate) fn process(
        &mut self,
        index: u16,
        mut handle: impl FnMut(Result<&ValidatedChain, &ChainError>, &GuestMemoryMmap) -> u32,
    ) -> Result<(), DeviceError> {
        self.process_batch(index, |chains, mem| {
            chains
                .iter()
                .map(|c| handle(c.chain.as_ref(), mem))
                .collect()
        })
    }

    /// Like [`Self::process`], but `handle` gets every chain of the
    /// notification at once (so that it may run them concurrently) and
    /// returns their used lengths, in the same order. A ring that turns out
    /// unusable part-way still gets the chains taken before answered.
    pub(crate) fn process_batch(
        &mut self,
        index: u16,
        handle: impl FnOnce(&[PoppedChain], &GuestMemoryMmap) -> Vec<u32>,
    ) -> Result<(), DeviceError> {
        if index != 0 {
            return Err(DeviceError::NoSuchQueue(index));
        }
        let Some(active) = self.active.as_mut() else {
            return Err(DeviceError::NotActivated);
        };
        let queue_err = |source| DeviceError::Queue { index: 0, source };
        let mut chains: Vec<PoppedChain> = Vec::new();
        let mut ring_error = None;
        for _ in 0..active.queue.size() {
            match active.queue.pop(&active.mem) {
                Ok(Some(popped)) => chains.push(popped),
                Ok(None) => break,
                Err(e) => {
                    ring_error = Some(queue_err(e));
                    break;
                }
            }
        }
        if chains.is_empty() {
            return ring_error.map_or(Ok(()), Err);
        }
        let used = handle(&chains, &active.mem);
        debug_assert_eq!(used.len(), chains.len());
        for (popped, used_len) in chains.iter().zip(used) {
            active
                .queue
                .add_used(&active.mem, popped.head, used_len)
                .map_err(queue_err)?;
        }
        if active.queue.wants_interrupt(&active.mem) {
            active.interrupt.signal_used_queue();
        }
        ring_error.map_or(Ok(()), Err)
    }
}
