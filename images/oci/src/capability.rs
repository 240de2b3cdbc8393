//! File capabilities as the kernel stores them: the `security.capability` extended attribute
//! holding a `struct vfs_cap_data` (revision 2, `include/uapi/linux/capability.h`).
//!
//! Written by hand: the value is 20 fixed bytes, and no maintained crate encodes it without
//! writing it to a file (libcap's `cap_set_file` needs the file on a file system, while here it
//! goes into a tar header). The `caps` crate supplies the capability names and numbers.

use std::str::FromStr;

/// The extended attribute the kernel reads file capabilities from.
pub const XATTR: &str = "security.capability";

const VFS_CAP_REVISION_2: u32 = 0x0200_0000;
const VFS_CAP_FLAGS_EFFECTIVE: u32 = 0x0000_0001;

/// Encodes `setcap` notation (`cap_net_bind_service+ep`, `cap_a,cap_b=eip`) as a revision-2
/// `vfs_cap_data`: magic and effective flag, then (permitted, inheritable) for capabilities
/// 0–31 and 32–63, each a little-endian u32.
pub fn vfs_cap_data(text: &str) -> Result<Vec<u8>, String> {
    let (names, flags) = text
        .split_once(['+', '='])
        .ok_or_else(|| format!("capabilities {text:?}: expected NAMES+FLAGS, e.g. cap_chown+ep"))?;
    let mut mask = 0u64;
    for name in names.split(',') {
        let capability = caps::Capability::from_str(&name.trim().to_ascii_uppercase())
            .map_err(|_| format!("unknown capability {name:?}"))?;
        mask |= 1u64 << capability.index();
    }
    let (mut effective, mut permitted, mut inheritable) = (false, 0u64, 0u64);
    for flag in flags.chars() {
        match flag {
            'e' => effective = true,
            'p' => permitted = mask,
            'i' => inheritable = mask,
            other => return Err(format!("capabilities {text:?}: unknown flag {other:?}")),
        }
    }
    if permitted == 0 && inheritable == 0 {
        return Err(format!(
            "capabilities {text:?}: give `p` or `i` (an effective bit alone grants nothing)"
        ));
    }
    let magic = VFS_CAP_REVISION_2
        | if effective {
            VFS_CAP_FLAGS_EFFECTIVE
        } else {
            0
        };
    let mut value = Vec::with_capacity(20);
    value.extend_from_slice(&magic.to_le_bytes());
    for half in [0, 32] {
        value.extend_from_slice(&((permitted >> half) as u32).to_le_bytes());
        value.extend_from_slice(&((inheritable >> half) as u32).to_le_bytes());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn net_bind_service_ep_is_the_kernel_layout() {
        // CAP_NET_BIND_SERVICE is capability 10.
        let value = vfs_cap_data("cap_net_bind_service+ep").unwrap();
        assert_eq!(
            value,
            [
                0x01, 0, 0, 0x02, // revision 2 | effective
                0x00, 0x04, 0, 0, // permitted 0-31: bit 10
                0, 0, 0, 0, // inheritable 0-31
                0, 0, 0, 0, // permitted 32-63
                0, 0, 0, 0, // inheritable 32-63
            ]
        );
    }

    #[test]
    fn high_capabilities_and_inheritable_go_to_their_words() {
        // CAP_CHECKPOINT_RESTORE is 40, CAP_CHOWN is 0.
        let value = vfs_cap_data("cap_chown,cap_checkpoint_restore=pi").unwrap();
        assert_eq!(&value[0..4], &0x0200_0000u32.to_le_bytes());
        assert_eq!(&value[4..8], &1u32.to_le_bytes());
        assert_eq!(&value[8..12], &1u32.to_le_bytes());
        assert_eq!(&value[12..16], &(1u32 << 8).to_le_bytes());
        assert_eq!(&value[16..20], &(1u32 << 8).to_le_bytes());
    }

    #[test]
    fn bad_notation_is_refused() {
        for text in [
            "cap_net_bind_service",
            "cap_nope+ep",
            "cap_chown+x",
            "cap_chown+e",
        ] {
            assert!(vfs_cap_data(text).is_err(), "{text}");
        }
    }

    /// libcap reads what we encode: set it on a real file and ask `getcap` (needs root for
    /// `security.*` attributes, and `getcap` from libcap2-bin).
    #[test]
    fn getcap_reads_the_encoding() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tool");
        std::fs::write(&file, b"x").unwrap();
        let value = vfs_cap_data("cap_net_bind_service+ep").unwrap();
        let path = std::ffi::CString::new(file.as_os_str().as_encoded_bytes()).unwrap();
        let name = std::ffi::CString::new(XATTR).unwrap();
        // SAFETY: valid NUL-terminated strings and a buffer of the given length.
        let rc = unsafe {
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0,
            )
        };
        assert_eq!(
            rc,
            0,
            "setxattr security.capability (needs root): {}",
            std::io::Error::last_os_error()
        );
        let getcap = crate::test_support::tool("getcap");
        let out = std::process::Command::new(getcap)
            .arg(&file)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.trim_end().ends_with("cap_net_bind_service=ep"),
            "getcap says {text:?}"
        );
    }
}
