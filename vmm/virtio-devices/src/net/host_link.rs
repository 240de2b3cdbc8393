//! The host side of a tap, for the VMM's self-test peer and the device
//! tests: bringing the link up, and a raw `AF_PACKET` socket on it (the far
//! end of the wire). One ioctl and one socket: no netlink connection needed.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// All frames (`ETH_P_ALL`), for [`packet_socket`] (the test tap).
#[cfg(feature = "testing")]
pub(crate) const ALL_FRAMES: u16 = int_cast::u16_of_c_int(libc::ETH_P_ALL);

/// A socket that sends and receives frames of `ethertype` (host order) on
/// link `ifname`.
pub fn packet_socket(ifname: &str, ethertype: u16) -> io::Result<OwnedFd> {
    let cname = CString::new(ifname)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in link name"))?;
    // SAFETY: the string is NUL-terminated.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let protocol = ethertype.to_be();
    // SAFETY: plain socket(2).
    let raw = unsafe {
        libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            i32::from(protocol),
        )
    };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh socket we own.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_ll is plain data.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = const { int_cast::u16_of_c_int(libc::AF_PACKET) };
    addr.sll_protocol = protocol;
    addr.sll_ifindex = i32::try_from(index)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "link index out of range"))?;
    // SAFETY: addr is a valid sockaddr_ll of the size we pass.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            const { int_cast::u32_of_usize(std::mem::size_of::<libc::sockaddr_ll>()) },
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sets link `ifname` up (`IFF_UP`).
pub fn set_up(ifname: &str) -> io::Result<()> {
    // SAFETY: plain socket(2).
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh socket we own.
    let sock = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifreq is plain data; all-zero is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if ifname.is_empty() || ifname.len() >= ifr.ifr_name.len() || ifname.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    for (dst, src) in ifr.ifr_name.iter_mut().zip(ifname.as_bytes()) {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    // SAFETY: SIOCGIFFLAGS/SIOCSIFFLAGS read and write the ifreq, which lives
    // across both calls.
    unsafe {
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) < 0 {
            return Err(io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= const { int_cast::c_short_of_c_int(libc::IFF_UP) };
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_link_names_are_errors() {
        assert_eq!(
            packet_socket("no\0such", ALL_FRAMES).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert!(packet_socket("nosuchlink0", ALL_FRAMES).is_err());
        for bad in ["", "a-name-far-too-long", "nul\0"] {
            assert_eq!(
                set_up(bad).unwrap_err().kind(),
                io::ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
        assert!(set_up("nosuchlink0").is_err());
    }
}
