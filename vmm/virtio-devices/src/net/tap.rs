//! Opening an existing tap interface for a virtio-net device.
//!
//! The interface is created beforehand (by `netsetup` or a test); the VMM
//! attaches to it by name with `TUNSETIFF`. Frames carry a 12-byte
//! `virtio_net_hdr_v1` in front (`IFF_VNET_HDR`, header size set to 12), the
//! same layout virtio 1.0 uses in the rings, so frames move without
//! reformatting. Offloads are off: the host stack finishes checksums and
//! segmentation before a frame reaches us.
//!
//! Hand-written because the rust-vmm stack has no tap crate (Cloud
//! Hypervisor's `net_util` is not published); the ioctls are `libc`'s.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt;

/// Size of `virtio_net_hdr_v1` (with `num_buffers`), used by VERSION_1 devices.
pub(crate) const VNET_HDR_LEN: usize = 12;

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("tap name {0:?} is empty, too long (max 15 bytes) or contains NUL")]
    BadName(String),
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(io::Error),
    #[error("{op} on tap {name} failed: {source}")]
    Ioctl {
        op: &'static str,
        name: String,
        #[source]
        source: io::Error,
    },
}

/// An open tap queue, non-blocking.
#[derive(Debug)]
pub(crate) struct Tap {
    file: File,
    name: String,
}

impl Tap {
    /// Attaches to the existing or new tap `name` in the caller's network
    /// namespace.
    pub(crate) fn open(name: &str) -> Result<Tap, TapError> {
        if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.contains('\0') {
            return Err(TapError::BadName(name.to_string()));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
            .open("/dev/net/tun")
            .map_err(TapError::OpenTun)?;
        let tap = Tap {
            file,
            name: name.to_string(),
        };
        // SAFETY: ifreq is plain old data; all-zero is a valid value.
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
            *dst = libc::c_char::from_ne_bytes([*src]);
        }
        ifr.ifr_ifru.ifru_flags = const {
            int_cast::c_short_of_c_int(libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR)
        };
        // SAFETY: TUNSETIFF reads and writes the ifreq, which outlives the call.
        let rc = unsafe { libc::ioctl(tap.file.as_raw_fd(), libc::TUNSETIFF, &mut ifr) };
        tap.check("TUNSETIFF", rc)?;
        let hdr_len = const { int_cast::c_int_of_usize(VNET_HDR_LEN) };
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer.
        let rc = unsafe { libc::ioctl(tap.file.as_raw_fd(), libc::TUNSETVNETHDRSZ, &hdr_len) };
        tap.check("TUNSETVNETHDRSZ", rc)?;
        // SAFETY: TUNSETOFFLOAD takes the offload flags by value; 0 = none.
        let rc =
            unsafe { libc::ioctl(tap.file.as_raw_fd(), libc::TUNSETOFFLOAD, 0 as libc::c_uint) };
        tap.check("TUNSETOFFLOAD", rc)?;
        Ok(tap)
    }

    /// A stand-in for a tap: any non-blocking packet descriptor (one read
    /// or write per frame, such as a `SOCK_SEQPACKET` socket). The fuzz
    /// targets use one end of a socket pair, so they need no root.
    #[cfg(feature = "testing")]
    pub(crate) fn stand_in(fd: std::os::fd::OwnedFd, name: &str) -> Tap {
        Tap {
            file: File::from(fd),
            name: name.to_string(),
        }
    }

    fn check(&self, op: &'static str, rc: libc::c_int) -> Result<(), TapError> {
        if rc < 0 {
            return Err(TapError::Ioctl {
                op,
                name: self.name.clone(),
                source: io::Error::last_os_error(),
            });
        }
        Ok(())
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Reads one frame (header included). `WouldBlock` when none is queued.
    pub(crate) fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.file).read(buf)
    }

    /// Writes one frame (header included) as a single packet.
    pub(crate) fn write_frame(&self, frame: &[u8]) -> io::Result<()> {
        // A tap write is one packet, all or nothing.
        (&self.file).write(frame).map(|_| ())
    }
}

impl AsFd for Tap {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}
