//! virtio-rng (entropy device): fills the guest's writable buffers with
//! bytes from the host kernel's CSPRNG (`getrandom(2)`).

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ids::VIRTIO_ID_RNG;
use vm_memory::Bytes;

use crate::chain::ValidatedChain;
use crate::device::feature_bit;
use crate::device::{ActivateContext, ActivateError, DeviceError, VirtioDevice};
use crate::log_limit::{GuestErrorLog, guest_error};
use crate::request_queue::RequestQueue;

pub(crate) const QUEUE_SIZE: u16 = 256;
/// Most bytes handed out per chain: a guest asking for gigabytes gets a
/// short answer (the used length says how much) instead of stalling its vCPU.
pub(crate) const MAX_BYTES_PER_REQUEST: u32 = 64 * 1024;
const CHUNK: usize = 4096;

/// The virtio-rng device.
pub struct Rng {
    requests: RequestQueue,
    log: GuestErrorLog,
}

impl Rng {
    pub fn new() -> Rng {
        Rng {
            requests: RequestQueue::default(),
            log: GuestErrorLog::default(),
        }
    }
}

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

/// Fills `buf` from the kernel's random pool. `getrandom` without flags only
/// blocks before the pool is initialised at boot, never afterwards.
fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, which we own.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        // Not negative: checked just above.
        done += n.cast_unsigned();
    }
    Ok(())
}

impl Rng {
    /// Fills the chain's writable buffers; returns the bytes written.
    fn fill_chain(&mut self, chain: &ValidatedChain, mem: &GuestMemoryMmap) -> u32 {
        if !chain.readable().is_empty() {
            guest_error!(self.log, "virtio-rng: request has device-readable buffers");
            return 0;
        }
        let mut chunk = [0u8; CHUNK];
        let mut written: u32 = 0;
        for b in chain.writable() {
            let mut done: u32 = 0;
            while done < b.len && written < MAX_BYTES_PER_REQUEST {
                let n = (b.len - done)
                    .min(MAX_BYTES_PER_REQUEST - written)
                    .min(const { int_cast::u32_of_usize(CHUNK) });
                let bytes = &mut chunk[..int_cast::u32_to_usize(n)];
                if let Err(e) = fill_random(bytes) {
                    tracing::error!("virtio-rng: getrandom failed: {e}");
                    return written;
                }
                // Inside a buffer the chain check proved does not wrap.
                let at = vm_memory::Address::unchecked_add(&b.addr, u64::from(done));
                if mem.write_slice(bytes, at).is_err() {
                    return written;
                }
                done += n;
                written += n;
            }
        }
        written
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        VIRTIO_ID_RNG
    }

    fn queue_max_sizes(&self) -> &[u16] {
        &[QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        feature_bit(VIRTIO_F_VERSION_1)
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        // No config space.
        data.fill(0);
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        guest_error!(
            self.log,
            offset,
            len = data.len(),
            "virtio-rng: has no config space"
        );
    }

    fn activate(&mut self, ctx: ActivateContext) -> Result<(), ActivateError> {
        self.requests.activate(ctx)
    }

    fn reset(&mut self) {
        self.requests.reset();
    }

    /// An RNG has no state but its queue: what it wrote is in guest memory already.
    fn queue_positions(&self) -> Option<Vec<(u16, u16)>> {
        Some(self.requests.positions())
    }

    fn process_queue(&mut self, index: u16) -> Result<(), DeviceError> {
        // The queue is taken out while its chains are handled with `self`.
        let mut requests = std::mem::take(&mut self.requests);
        let result = requests.process(index, |chain, mem| match chain {
            Ok(chain) => self.fill_chain(chain, mem),
            Err(e) => {
                guest_error!(self.log, "virtio-rng: bad descriptor chain: {e}");
                0
            }
        });
        self.requests = requests;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Desc, GuestDriver, MEM_SIZE, MmioDriver, test_memory};
    use vm_memory::GuestAddress;

    fn setup(mem: &GuestMemoryMmap) -> (MmioDriver, GuestDriver<'_>) {
        let mut mmio = MmioDriver::new(Box::new(Rng::new()), mem);
        let q = GuestDriver::new(mem, 16);
        mmio.bring_up(0, &[&q]);
        (mmio, q)
    }

    fn guest(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    #[test]
    fn fills_writable_buffers_with_random_bytes() {
        let mem = test_memory();
        let (mut mmio, mut q) = setup(&mem);
        q.add_chain(&[Desc::write(0x10_0000, 64), Desc::write(0x10_1000, 64)]);
        mmio.notify(0);
        assert_eq!(q.used_idx(), 1);
        assert_eq!(q.used_elem(0), (0, 128));
        let a = guest(&mem, 0x10_0000, 64);
        let b = guest(&mem, 0x10_1000, 64);
        // 64 zero bytes from a CSPRNG has probability 2^-512.
        assert_ne!(a, vec![0; 64]);
        assert_ne!(a, b);
        assert_eq!(mmio.interrupts(), 1);
    }

    #[test]
    fn large_requests_are_capped() {
        let mem = test_memory();
        let (mut mmio, mut q) = setup(&mem);
        q.add_chain(&[Desc::write(0x10_0000, 1 << 20)]);
        mmio.notify(0);
        assert_eq!(q.used_elem(0).1, MAX_BYTES_PER_REQUEST);
        // Nothing past the cap was written.
        let after = guest(&mem, 0x10_0000 + u64::from(MAX_BYTES_PER_REQUEST), 4096);
        assert_eq!(after, vec![0; 4096]);
    }

    #[test]
    fn readable_or_bad_buffers_get_nothing() {
        let mem = test_memory();
        let (mut mmio, mut q) = setup(&mem);
        q.add_chain(&[Desc::read(0x10_0000, 64)]);
        q.add_chain(&[Desc::read(0x10_0000, 16), Desc::write(0x10_1000, 64)]);
        q.add_chain(&[Desc::write(MEM_SIZE - 32, 64)]);
        q.add_chain(&[Desc::write(u64::MAX - 8, 64)]);
        mmio.notify(0);
        assert_eq!(q.used_idx(), 4);
        for i in 0..4 {
            assert_eq!(q.used_elem(i).1, 0, "chain {i}");
        }
        assert_eq!(guest(&mem, 0x10_0000, 64), vec![0; 64]);
        assert_eq!(guest(&mem, 0x10_1000, 64), vec![0; 64]);
        assert_eq!(guest(&mem, MEM_SIZE - 32, 32), vec![0; 32]);
    }

    #[test]
    fn notifications_for_other_queues_need_a_reset() {
        let mem = test_memory();
        let mut rng = Rng::new();
        assert!(matches!(
            rng.process_queue(0),
            Err(DeviceError::NotActivated)
        ));
        let (mut mmio, _q) = setup(&mem);
        // The transport drops out-of-range indexes before the device.
        mmio.notify(1);
        assert_eq!(
            mmio.status() & virtio_bindings::virtio_config::VIRTIO_CONFIG_S_NEEDS_RESET,
            0
        );
        assert!(matches!(
            rng.process_queue(1),
            Err(DeviceError::NoSuchQueue(1))
        ));
    }
}
