//! Creating the persistent tap device through `/dev/net/tun`.
//!
//! The kernel refuses tun/tap creation over rtnetlink ("not supported"), so this is the
//! one place that uses the tun ioctls, like KubeVirt's `virt-chroot create-tap`. The device
//! is created in the network namespace of the calling thread.

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;

/// Flags KubeVirt uses for a single-queue tap: `IFF_TAP` + `TUNTAP_DEFAULTS`
/// (`IFF_TUN_EXCL | IFF_ONE_QUEUE`). No `IFF_NO_PI`: whoever opens the tap (the VMM) sets
/// its own per-open flags.
pub(crate) const TAP_CREATE_FLAGS: libc::c_int =
    libc::IFF_TAP | libc::IFF_TUN_EXCL | libc::IFF_ONE_QUEUE;

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error("cannot open /dev/net/tun: {0}")]
    OpenTun(std::io::Error),
    #[error("tap name {0:?} is empty or longer than 15 bytes")]
    BadName(String),
    #[error("{op} on tap {name} failed: {source}")]
    Ioctl {
        op: &'static str,
        name: String,
        source: std::io::Error,
    },
}

/// Creates (or, with `exclusive == false`, re-attaches to) tap `name`, makes it persistent
/// and owned by `uid`/`gid`. The file descriptor is closed on return; the device stays.
pub fn create_persistent_tap(
    name: &str,
    uid: u32,
    gid: u32,
    exclusive: bool,
) -> Result<(), TapError> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ {
        return Err(TapError::BadName(name.to_string()));
    }
    let tun = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")
        .map_err(TapError::OpenTun)?;
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = *src as libc::c_char;
    }
    let flags = if exclusive {
        TAP_CREATE_FLAGS
    } else {
        TAP_CREATE_FLAGS & !libc::IFF_TUN_EXCL
    };
    ifr.ifr_ifru.ifru_flags = flags as libc::c_short;
    let fd = tun.as_raw_fd();
    let ioctl = |op: &'static str, request, arg: libc::c_ulong| {
        // SAFETY: fd is an open /dev/net/tun; each request takes an integer argument.
        let rc = unsafe { libc::ioctl(fd, request, arg) };
        if rc < 0 {
            Err(TapError::Ioctl {
                op,
                name: name.to_string(),
                source: std::io::Error::last_os_error(),
            })
        } else {
            Ok(())
        }
    };
    // SAFETY: TUNSETIFF reads and writes the ifreq that lives for the whole call.
    let rc = unsafe { libc::ioctl(fd, libc::TUNSETIFF, &mut ifr as *mut libc::ifreq) };
    if rc < 0 {
        return Err(TapError::Ioctl {
            op: "TUNSETIFF",
            name: name.to_string(),
            source: std::io::Error::last_os_error(),
        });
    }
    ioctl("TUNSETOWNER", libc::TUNSETOWNER, uid.into())?;
    ioctl("TUNSETGROUP", libc::TUNSETGROUP, gid.into())?;
    ioctl("TUNSETPERSIST", libc::TUNSETPERSIST, 1)?;
    Ok(())
}
