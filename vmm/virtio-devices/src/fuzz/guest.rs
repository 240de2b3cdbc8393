//! A fuzzer-driven guest driver: brings a device up through its MMIO
//! registers with full-size queues (256 entries, as the VMM advertises),
//! then interprets the rest of the input as driver actions (descriptor
//! table entries, chains, indirect tables, available ring pushes and index
//! jumps, guest memory writes, MMIO register reads and writes,
//! notifications, pause and resume). Whatever the input, the device must
//! not panic, hang or touch memory it should not.

use std::sync::Arc;

use crate::GuestMemoryMmap;
use virtio_bindings::virtio_config::{
    VIRTIO_CONFIG_S_ACKNOWLEDGE, VIRTIO_CONFIG_S_DRIVER, VIRTIO_CONFIG_S_DRIVER_OK,
    VIRTIO_CONFIG_S_FEATURES_OK,
};
use virtio_bindings::virtio_mmio::*;
use virtio_bindings::virtio_ring::{VRING_DESC_F_INDIRECT, VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::{EFD_NONBLOCK, EventFd};

use super::NoInterrupt;
use crate::{MmioTransport, Unsandboxed, VirtioDevice};
use int_cast::{high_half, low_half, u16_of_u32};

/// Guest memory: room for the rings of two queues and 64 KiB frames.
pub(super) const MEM_SIZE: u64 = 1 << 20;
/// Entries per queue, the size the VMM's devices advertise.
const QUEUE_SIZE: u16 = 256;
/// Queue `q`'s rings live at `q * RING_STRIDE` (descriptor table, then the
/// available ring at +0x1000 and the used ring at +0x2000).
const RING_STRIDE: u64 = 0x4000;
/// Buffers the harness lays out (indirect tables) start here.
pub(super) const DATA_START: u64 = 0x1_0000;

/// Reads the input front to back; `None` once it is used up.
pub(super) struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Input(data)
    }
    pub(super) fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    pub(super) fn u8(&mut self) -> Option<u8> {
        self.bytes(1).map(|b| b[0])
    }
    pub(super) fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(|b| u16::from_le_bytes([b[0], b[1]]))
    }
    pub(super) fn u32(&mut self) -> Option<u32> {
        self.bytes(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(super) fn u64(&mut self) -> Option<u64> {
        let lo = u64::from(self.u32()?);
        let hi = u64::from(self.u32()?);
        Some(lo | hi << 32)
    }
}

/// Device-specific actions (opcode 8).
pub(super) trait DeviceActions {
    /// One action, its arguments read from `input`.
    fn act(&mut self, guest: &mut Guest, input: &mut Input) -> Option<()>;
    /// After every notification (drain what the device sent to the host).
    fn after_notify(&mut self, _guest: &mut Guest) {}
}

/// A device behind its MMIO transport, and the driver's view of its queues.
pub(super) struct Guest {
    pub(super) mem: GuestMemoryMmap,
    transport: MmioTransport,
    queues: u16,
    /// Next free descriptor per queue (chains are laid out round-robin).
    next_desc: Vec<u16>,
    /// The driver's available index per queue.
    avail_idx: Vec<u16>,
    paused: bool,
}

impl Guest {
    /// The device on a fresh transport, brought up with every queue at
    /// [`QUEUE_SIZE`]. The first input byte picks the transport (bit 0: a
    /// device thread woken by eventfds, as in the VMM, instead of the
    /// caller's thread); the next four mask the low feature bits the driver
    /// accepts (`VERSION_1` is always accepted).
    pub(super) fn start(device: Box<dyn VirtioDevice>, input: &mut Input) -> Option<Guest> {
        let mem =
            GuestMemoryMmap::from_ranges(&[(GuestAddress(0), int_cast::u64_to_usize(MEM_SIZE))])
                .ok()?;
        let cfg = input.u8()?;
        let feature_mask = input.u32()?;
        let queues = u16::try_from(device.queue_max_sizes().len()).ok()?;
        let offered = device.features();
        let transport = if cfg & 1 == 1 {
            let notifiers = (0..queues)
                .map(|_| EventFd::new(EFD_NONBLOCK))
                .collect::<Result<Vec<_>, _>>()
                .ok()?;
            MmioTransport::with_thread(
                "fuzz-device",
                device,
                mem.clone(),
                Arc::new(NoInterrupt),
                notifiers,
                Arc::new(Unsandboxed),
            )
            .ok()?
        } else {
            MmioTransport::new(device, mem.clone(), Arc::new(NoInterrupt))
        };
        let mut g = Guest {
            mem,
            transport,
            queues,
            next_desc: vec![0; usize::from(queues)],
            avail_idx: vec![0; usize::from(queues)],
            paused: false,
        };
        g.bring_up(offered, feature_mask);
        Some(g)
    }

    fn write_reg(&mut self, reg: u32, value: u32) {
        self.transport.write(u64::from(reg), &value.to_le_bytes());
    }

    fn bring_up(&mut self, offered: u64, feature_mask: u32) {
        let ack = VIRTIO_CONFIG_S_ACKNOWLEDGE | VIRTIO_CONFIG_S_DRIVER;
        self.write_reg(VIRTIO_MMIO_STATUS, VIRTIO_CONFIG_S_ACKNOWLEDGE);
        self.write_reg(VIRTIO_MMIO_STATUS, ack);
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 0);
        self.write_reg(
            VIRTIO_MMIO_DRIVER_FEATURES,
            low_half(offered) & feature_mask,
        );
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES_SEL, 1);
        self.write_reg(VIRTIO_MMIO_DRIVER_FEATURES, high_half(offered));
        self.write_reg(VIRTIO_MMIO_STATUS, ack | VIRTIO_CONFIG_S_FEATURES_OK);
        for q in 0..self.queues {
            let base = u64::from(q) * RING_STRIDE;
            self.write_reg(VIRTIO_MMIO_QUEUE_SEL, u32::from(q));
            self.write_reg(VIRTIO_MMIO_QUEUE_NUM, u32::from(QUEUE_SIZE));
            self.write_reg(VIRTIO_MMIO_QUEUE_DESC_LOW, low_half(base));
            self.write_reg(VIRTIO_MMIO_QUEUE_AVAIL_LOW, low_half(base + 0x1000));
            self.write_reg(VIRTIO_MMIO_QUEUE_USED_LOW, low_half(base + 0x2000));
            self.write_reg(VIRTIO_MMIO_QUEUE_READY, 1);
        }
        self.write_reg(
            VIRTIO_MMIO_STATUS,
            ack | VIRTIO_CONFIG_S_FEATURES_OK | VIRTIO_CONFIG_S_DRIVER_OK,
        );
    }

    fn queue(&self, b: u8) -> u16 {
        u16::from(b) % self.queues
    }

    fn desc_addr(q: u16, index: u16) -> GuestAddress {
        GuestAddress(u64::from(q) * RING_STRIDE + u64::from(index % QUEUE_SIZE) * 16)
    }

    fn write_desc(&self, at: GuestAddress, addr: u64, len: u32, flags: u16, next: u16) {
        let mut d = [0u8; 16];
        d[..8].copy_from_slice(&addr.to_le_bytes());
        d[8..12].copy_from_slice(&len.to_le_bytes());
        d[12..14].copy_from_slice(&flags.to_le_bytes());
        d[14..16].copy_from_slice(&next.to_le_bytes());
        let _ = self.mem.write_slice(&d, at);
    }

    fn push_avail(&mut self, q: u16, head: u16) {
        let base = u64::from(q) * RING_STRIDE + 0x1000;
        let i = &mut self.avail_idx[usize::from(q)];
        let slot = GuestAddress(base + 4 + u64::from(*i % QUEUE_SIZE) * 2);
        let _ = self.mem.write_obj(head, slot);
        *i = i.wrapping_add(1);
        let _ = self.mem.write_obj(*i, GuestAddress(base + 2));
    }

    /// A buffer address: inside guest memory, or (top bit set) anywhere.
    fn addr(raw: u32) -> u64 {
        if raw & 0x8000_0000 == 0 {
            u64::from(raw) % MEM_SIZE
        } else {
            u64::from(raw) << 8
        }
    }

    /// One descriptor spec: address, length, flags byte (bit 0 write,
    /// bit 1 indirect, bit 2 long length).
    fn desc_spec(input: &mut Input) -> Option<(u64, u32, u16)> {
        let addr = Self::addr(input.u32()?);
        let len = u32::from(input.u16()?);
        let f = input.u8()?;
        let len = if f & 4 != 0 { len << 12 } else { len };
        let mut flags = 0;
        if f & 1 != 0 {
            flags |= const { u16_of_u32(VRING_DESC_F_WRITE) };
        }
        if f & 2 != 0 {
            flags |= const { u16_of_u32(VRING_DESC_F_INDIRECT) };
        }
        Some((addr, len, flags))
    }

    /// Interprets the rest of the input; stops when it runs out. Returns
    /// each queue's used index (what the device completed), for tests.
    pub(super) fn run(&mut self, input: &mut Input, device: &mut dyn DeviceActions) -> Vec<u16> {
        while self.step(input, device).is_some() {}
        if self.paused {
            self.transport.resume();
        }
        self.transport.sync();
        (0..self.queues)
            .map(|q| {
                let at = GuestAddress(u64::from(q) * RING_STRIDE + 0x2000 + 2);
                self.mem.read_obj(at).unwrap_or(0)
            })
            .collect()
    }

    fn step(&mut self, input: &mut Input, device: &mut dyn DeviceActions) -> Option<()> {
        match input.u8()? % 11 {
            // A chain of 1..=256 descriptors in the queue's table, pushed.
            0 => {
                let q = self.queue(input.u8()?);
                let n = u16::from(input.u8()?) + 1;
                let head = self.next_desc[usize::from(q)];
                for k in 0..n {
                    let (addr, len, mut flags) = Self::desc_spec(input)?;
                    let index = head.wrapping_add(k) % QUEUE_SIZE;
                    let next = (index + 1) % QUEUE_SIZE;
                    if k + 1 < n {
                        flags |= const { u16_of_u32(VRING_DESC_F_NEXT) };
                    }
                    self.write_desc(Self::desc_addr(q, index), addr, len, flags, next);
                }
                self.next_desc[usize::from(q)] = head.wrapping_add(n) % QUEUE_SIZE;
                self.push_avail(q, head);
            }
            // One raw descriptor table entry (loops, bad nexts, any flags).
            1 => {
                let q = self.queue(input.u8()?);
                let index = input.u16()?;
                let addr = Self::addr(input.u32()?);
                let len = input.u32()?;
                let flags = input.u16()?;
                let next = input.u16()?;
                self.write_desc(Self::desc_addr(q, index), addr, len, flags, next);
            }
            // Push any head index.
            2 => {
                let q = self.queue(input.u8()?);
                let head = input.u16()?;
                self.push_avail(q, head);
            }
            // Move the available index anywhere (index jumps).
            3 => {
                let q = self.queue(input.u8()?);
                let idx = input.u16()?;
                self.avail_idx[usize::from(q)] = idx;
                let at = GuestAddress(u64::from(q) * RING_STRIDE + 0x1000 + 2);
                let _ = self.mem.write_obj(idx, at);
            }
            // Guest memory bytes anywhere (headers, rings, flags).
            4 => {
                let at = u64::from(input.u32()?) % MEM_SIZE;
                let n = usize::from(input.u8()?);
                let bytes = input.bytes(n)?;
                let _ = self.mem.write_slice(bytes, GuestAddress(at));
            }
            // Any MMIO register write (resets, queue reconfiguration).
            5 => {
                let offset = u64::from(input.u16()?) % 0x1100;
                let width = usize::from(input.u8()? % 9);
                let value = input.u64()?.to_le_bytes();
                self.transport.write(offset, &value[..width]);
            }
            // Any MMIO register read.
            6 => {
                let offset = u64::from(input.u16()?) % 0x1100;
                let width = usize::from(input.u8()? % 9);
                let mut buf = [0u8; 8];
                self.transport.read(offset, &mut buf[..width]);
            }
            // A notification, for a queue the device may not have.
            7 => {
                let value = u32::from(input.u8()?);
                let value = if value < 0x80 {
                    value % u32::from(self.queues)
                } else {
                    value
                };
                self.write_reg(VIRTIO_MMIO_QUEUE_NOTIFY, value);
                self.transport.sync();
                device.after_notify(self);
            }
            8 => device.act(self, input)?,
            // An indirect table of 1..=64 entries at a data address, pushed
            // as one descriptor.
            9 => {
                let q = self.queue(input.u8()?);
                let n = u64::from(input.u8()? % 64) + 1;
                let table = DATA_START + (u64::from(input.u16()?) * 16) % (MEM_SIZE - DATA_START);
                for k in 0..n {
                    let (addr, len, mut flags) = Self::desc_spec(input)?;
                    if k + 1 < n {
                        flags |= const { u16_of_u32(VRING_DESC_F_NEXT) };
                    }
                    let next = u16::try_from(k + 1).unwrap_or(0);
                    self.write_desc(GuestAddress(table + k * 16), addr, len, flags, next);
                }
                let index = self.next_desc[usize::from(q)];
                self.write_desc(
                    Self::desc_addr(q, index),
                    table,
                    u32::try_from(n * 16).ok()?,
                    const { u16_of_u32(VRING_DESC_F_INDIRECT) },
                    0,
                );
                self.next_desc[usize::from(q)] = (index + 1) % QUEUE_SIZE;
                self.push_avail(q, index);
            }
            // VM pause or resume.
            _ => {
                if self.paused {
                    self.transport.resume();
                } else {
                    self.transport.pause();
                }
                self.paused = !self.paused;
            }
        }
        Some(())
    }
}
