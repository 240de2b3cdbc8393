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
/// `ifr_flags` (a C `short`) for creating the tap, and for re-attaching without
/// `IFF_TUN_EXCL`.
const IFR_FLAGS_EXCLUSIVE: libc::c_short = ifr_flags(TAP_CREATE_FLAGS);
const IFR_FLAGS_SHARED: libc::c_short = ifr_flags(TAP_CREATE_FLAGS & !libc::IFF_TUN_EXCL);

/// The 16 flag bits of `flags` as the `short` `ifreq` carries them (`IFF_TUN_EXCL` is
/// 0x8000, the sign bit). Runs in const items only: flags wider than 16 bits fail the build.
const fn ifr_flags(flags: libc::c_int) -> libc::c_short {
    match flags.to_le_bytes() {
        [low, high, 0, 0] => libc::c_short::from_le_bytes([low, high]),
        _ => panic!("ifreq flags are 16 bits"),
    }
}

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
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    ifr.ifr_ifru.ifru_flags = if exclusive {
        IFR_FLAGS_EXCLUSIVE
    } else {
        IFR_FLAGS_SHARED
    };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifr_flags_keep_all_16_bits() {
        // IFF_TAP 0x0002 | IFF_TUN_EXCL 0x8000 (a short's sign bit) | IFF_ONE_QUEUE 0x2000.
        assert_eq!(IFR_FLAGS_EXCLUSIVE.cast_unsigned(), 0xa002);
        assert_eq!(IFR_FLAGS_SHARED.cast_unsigned(), 0x2002);
    }
}
