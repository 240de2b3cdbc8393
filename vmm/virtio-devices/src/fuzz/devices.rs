//! Entry points that drive each device as the VMM runs it, through
//! [`super::guest::Guest`]: virtio-blk over the concurrent qcow2 engine on a
//! real file with its I/O threads, virtio-net over a socket pair standing in
//! for the tap, virtio-rng.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ::block::qcow2::{CreateOptions, create};
use ::block::{ConcurrentDisk, Format, OpenOptions};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES,
};
use vm_memory::{Bytes, GuestAddress};

use super::guest::{DeviceActions, Guest, Input, MEM_SIZE};
use crate::block::{Block, BlockOptions};
use crate::net::{MAX_FRAME, MIN_FRAME, Net, NetOptions, Tap};
use crate::rng::Rng;

/// What a run reached (the fuzz targets ignore it; tests check that the
/// harness gets requests through).
#[derive(Debug, Default)]
pub struct Reached {
    /// Each queue's used index at the end.
    pub used: Vec<u16>,
    /// Frames the net device sent to the host side.
    pub host_frames: usize,
}

/// Virtual size of the fuzzed image.
const DISK_SIZE: u64 = 4 << 20;

/// A qcow2 file under the temporary directory, removed on drop.
struct TempImage(PathBuf);

impl TempImage {
    fn create(cluster_size: u64) -> Option<TempImage> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "virtio-fuzz-{}-{}.qcow2",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let image = TempImage(path);
        let opts = CreateOptions {
            size: Some(DISK_SIZE),
            cluster_size,
            ..CreateOptions::default()
        };
        create(&image.0, &opts).ok()?;
        Some(image)
    }
}

impl Drop for TempImage {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// virtio-blk as the VMM runs a qcow2 disk: a [`ConcurrentDisk`] on a real
/// file, 256-entry queue, I/O threads. The first byte picks the image's
/// cluster size (512 B..64 KiB), read-only, write-through and the number
/// of I/O threads (1..=8); the rest drives the guest ([`Guest`]). After
/// the run the image must pass the qcow2 check without corruption.
pub fn blk_concurrent(data: &[u8]) -> Reached {
    let mut input = Input::new(data);
    let Some(cfg) = input.u8() else {
        return Reached::default();
    };
    let Some(image) = TempImage::create(512 << (cfg % 8)) else {
        return Reached::default();
    };
    let read_only = cfg & 8 != 0;
    let opts = OpenOptions {
        read_only,
        direct: false,
        ..OpenOptions::default()
    };
    let disk = ConcurrentDisk::open(&image.0, Format::Qcow2, opts).expect("open a new image");
    let options = BlockOptions {
        write_through: cfg & 0x80 != 0,
        io_threads: usize::from((cfg >> 4) & 7) + 1,
        ..BlockOptions::default()
    };
    let device = Block::shared(Arc::new(disk), options);
    let Some(mut guest) = Guest::start(Box::new(device), &mut input) else {
        return Reached::default();
    };
    let used = guest.run(&mut input, &mut BlkActions);
    drop(guest);
    let report = ::block::qcow2::check::check(&image.0).expect("check the image");
    assert_eq!(
        report.corruptions, 0,
        "guest requests corrupted the image: {:?}",
        report.messages
    );
    Reached {
        used,
        host_frames: 0,
    }
}

/// Writes a request header (and for discard / write-zeroes one segment)
/// where the input says: the fuzzer then only has to find the chain.
struct BlkActions;

impl DeviceActions for BlkActions {
    fn act(&mut self, guest: &mut Guest, input: &mut Input) -> Option<()> {
        let at = u64::from(input.u32()?) % MEM_SIZE;
        let kind = match input.u8()? % 8 {
            0 => VIRTIO_BLK_T_IN,
            1 => VIRTIO_BLK_T_OUT,
            2 => VIRTIO_BLK_T_FLUSH,
            3 => VIRTIO_BLK_T_GET_ID,
            4 => VIRTIO_BLK_T_DISCARD,
            5 => VIRTIO_BLK_T_WRITE_ZEROES,
            _ => input.u32()?,
        };
        let sector = sector(input.u32()?);
        let mut header = [0u8; 16];
        header[..4].copy_from_slice(&kind.to_le_bytes());
        header[8..].copy_from_slice(&sector.to_le_bytes());
        let _ = guest.mem.write_slice(&header, GuestAddress(at));
        if kind == VIRTIO_BLK_T_DISCARD || kind == VIRTIO_BLK_T_WRITE_ZEROES {
            let mut segment = [0u8; 16];
            segment[..8].copy_from_slice(&sector.to_le_bytes());
            segment[8..12].copy_from_slice(&u32::from(input.u16()?).to_le_bytes());
            segment[12..].copy_from_slice(&u32::from(input.u8()? % 4).to_le_bytes());
            let _ = guest.mem.write_slice(&segment, GuestAddress(at + 16));
        }
        Some(())
    }
}

/// A sector mostly inside the disk, sometimes anywhere.
fn sector(raw: u32) -> u64 {
    if raw & 0x8000_0000 == 0 {
        u64::from(raw) % (DISK_SIZE / 512 + 8)
    } else {
        u64::from(raw) << 32 | u64::from(raw)
    }
}

/// virtio-net with both queues at 256 entries; the tap is one end of a
/// `SOCK_SEQPACKET` socket pair (one message per frame, as a tap), so no
/// root and no network namespace are needed. The first byte picks the link
/// state and the MTU offer; device action 8 injects a frame from the host
/// side (the guest sees it once it notifies the receive queue, or at once
/// when the device has its own thread). Every frame the device transmits is
/// checked against the rules of [`crate::net`].
pub fn net_queues(data: &[u8]) -> Reached {
    let mut input = Input::new(data);
    let Some(cfg) = input.u8() else {
        return Reached::default();
    };
    let Some((device_end, host_end)) = seqpacket_pair() else {
        return Reached::default();
    };
    let options = NetOptions {
        mac: [0x52, 0x54, 0, 0x12, 0x34, 0x56],
        mtu: (cfg & 2 != 0).then_some(1500),
        link_up: cfg & 1 == 0 || cfg & 4 != 0,
    };
    let device = Net::with_tap(Tap::stand_in(device_end, "fuzz-tap"), options);
    let Some(mut guest) = Guest::start(Box::new(device), &mut input) else {
        return Reached::default();
    };
    let mut host = NetHost {
        socket: host_end,
        frame: vec![0u8; MAX_FRAME + 1],
        frames: 0,
    };
    let used = guest.run(&mut input, &mut host);
    host.drain();
    // The device goes first: a closed socket reads as endless empty frames
    // (end of file), which a tap never returns.
    drop(guest);
    Reached {
        used,
        host_frames: host.frames,
    }
}

fn seqpacket_pair() -> Option<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    let kind = libc::SOCK_SEQPACKET | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC;
    // SAFETY: socketpair writes two descriptors into `fds`.
    let rc = unsafe { libc::socketpair(libc::AF_UNIX, kind, 0, fds.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Some(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// The host side of the stand-in tap.
struct NetHost {
    socket: OwnedFd,
    frame: Vec<u8>,
    frames: usize,
}

impl NetHost {
    /// Reads every frame the device sent; each must be one the device may
    /// send (length within bounds, no offload in the header).
    fn drain(&mut self) {
        loop {
            // SAFETY: the buffer is valid for its length.
            let n = unsafe {
                libc::recv(
                    self.socket.as_raw_fd(),
                    self.frame.as_mut_ptr().cast(),
                    self.frame.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            let Ok(n) = usize::try_from(n) else { return };
            assert!(
                (MIN_FRAME..=MAX_FRAME).contains(&n),
                "device sent a {n}-byte frame"
            );
            assert_eq!(
                &self.frame[..2],
                &[0, 0],
                "device sent a frame with offload flags"
            );
            self.frames += 1;
        }
    }
}

impl DeviceActions for NetHost {
    /// Injects one frame (any length up to past the largest, its bytes the
    /// input's repeated) into the device's receive side.
    fn act(&mut self, _guest: &mut Guest, input: &mut Input) -> Option<()> {
        let len = usize::from(input.u16()?) % (MAX_FRAME + 64);
        let n = usize::from(input.u8()?);
        let pattern = input.bytes(n)?;
        let mut frame = vec![0u8; len];
        if !pattern.is_empty() {
            for (dst, src) in frame.iter_mut().zip(pattern.iter().cycle()) {
                *dst = *src;
            }
        }
        // SAFETY: the buffer is valid for its length. A full socket drops
        // the frame, as a full tap queue would.
        unsafe {
            libc::send(
                self.socket.as_raw_fd(),
                frame.as_ptr().cast(),
                frame.len(),
                libc::MSG_DONTWAIT,
            )
        };
        Some(())
    }

    fn after_notify(&mut self, _guest: &mut Guest) {
        self.drain();
    }
}

/// virtio-rng with its 256-entry queue.
pub fn rng_queue(data: &[u8]) -> Reached {
    let mut input = Input::new(data);
    let Some(mut guest) = Guest::start(Box::new(Rng::new()), &mut input) else {
        return Reached::default();
    };
    Reached {
        used: guest.run(&mut input, &mut NoActions),
        host_frames: 0,
    }
}

/// A device without actions of its own.
struct NoActions;

impl DeviceActions for NoActions {
    fn act(&mut self, _guest: &mut Guest, _input: &mut Input) -> Option<()> {
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::XorShift;

    /// Builds inputs for [`Guest`] by hand.
    #[derive(Default)]
    struct Script(Vec<u8>);

    impl Script {
        /// Device byte(s), then transport and feature mask (all offered).
        fn new(device_cfg: u8, own_thread: bool) -> Script {
            let mut s = Script(vec![device_cfg, u8::from(own_thread)]);
            s.0.extend_from_slice(&u32::MAX.to_le_bytes());
            s
        }
        fn push(&mut self, bytes: &[u8]) -> &mut Self {
            self.0.extend_from_slice(bytes);
            self
        }
        /// A chain of (address, length, writable) in queue `q`.
        fn chain(&mut self, q: u8, descs: &[(u32, u16, bool)]) -> &mut Self {
            self.push(&[
                0,
                q,
                u8::try_from(descs.len()).expect("a short test chain") - 1,
            ]);
            for &(addr, len, write) in descs {
                self.push(&addr.to_le_bytes())
                    .push(&len.to_le_bytes())
                    .push(&[u8::from(write)]);
            }
            self
        }
        fn notify(&mut self, q: u8) -> &mut Self {
            self.push(&[7, q])
        }
    }

    #[test]
    fn blk_requests_run_on_the_io_threads_and_complete() {
        for own_thread in [false, true] {
            // 64 KiB clusters, 8 I/O threads.
            let mut s = Script::new(0x77, own_thread);
            for i in 0..4u32 {
                let header = 0x2_0000 + i * 0x100;
                // Device action: an OUT header at `header`, sector i * 8.
                s.push(&[8]).push(&header.to_le_bytes()).push(&[1]);
                s.push(&(i * 8).to_le_bytes());
                s.chain(
                    0,
                    &[
                        (header, 16, false),
                        (0x4_0000 + i * 0x1000, 4096, false),
                        (0x3_0000 + i, 1, true),
                    ],
                );
            }
            s.notify(0);
            let reached = blk_concurrent(&s.0);
            assert_eq!(reached.used, [4], "own thread: {own_thread}");
        }
    }

    #[test]
    fn net_frames_reach_the_host_and_the_guest() {
        for own_thread in [false, true] {
            let mut s = Script::new(0, own_thread);
            // Transmit: one 60-byte frame (its header all zero).
            s.chain(1, &[(0x2_0000, 60, false)]).notify(1);
            // Receive: a 100-byte frame from the host, one guest buffer.
            s.push(&[8]).push(&100u16.to_le_bytes()).push(&[1, 0xab]);
            s.chain(0, &[(0x3_0000, 2048, true)]).notify(0);
            let reached = net_queues(&s.0);
            assert_eq!(reached.host_frames, 1, "own thread: {own_thread}");
            assert_eq!(reached.used, [1, 1], "own thread: {own_thread}");
        }
    }

    #[test]
    fn rng_fills_a_buffer() {
        let mut s = Script::new(0, false);
        // Script::new's device byte is the transport byte of rng_queue.
        s.0.remove(0);
        s.chain(0, &[(0x2_0000, 64, true)]).notify(0);
        assert_eq!(rng_queue(&s.0).used, [1]);
    }

    #[test]
    fn device_entry_points_survive_random_bytes() {
        let mut rng = XorShift::new(16);
        for _ in 0..60 {
            let len = (rng.next() % 0x1000) as usize;
            let data: Vec<u8> = (0..len).map(|_| rng.next().to_le_bytes()[0]).collect();
            blk_concurrent(&data);
            net_queues(&data);
            rng_queue(&data);
        }
    }
}
