//! The host cache mode of each disk, decided as KubeVirt's
//! `SetDriverCacheMode` does (`pkg/virt-launcher/virtwrap/converter/converter.go`):
//! a disk with no `cache` gets `none` (O_DIRECT) when its file, and its
//! backing file, sit on a file system that supports direct I/O, and
//! `writethrough` otherwise; an explicit `none` where direct I/O does not
//! work is refused; `writethrough` and `writeback` are kept. Runs after the
//! disks are materialized, so the files it probes exist.

use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use proto::domain::Disk;

use super::DiskError;

/// Whether `path` can be opened with `O_DIRECT` (`Ok(false)` when the file
/// system answers EINVAL, as tmpfs did before Linux 6.6). A missing file is
/// created for the probe and removed again, as KubeVirt's checker does.
pub(crate) fn supports_direct_io(path: &Path) -> io::Result<bool> {
    let existed = path.exists();
    let open = |flags: i32| {
        std::fs::OpenOptions::new()
            .read(true)
            .write(!existed)
            .create(!existed)
            .mode(0o600)
            .custom_flags(flags)
            .open(path)
    };
    let result = match open(libc::O_DIRECT) {
        Ok(_) => Ok(true),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => open(0).map(|_| false),
        Err(e) => Err(e),
    };
    if !existed {
        let _ = std::fs::remove_file(path);
    }
    result
}

/// Sets `driver.cache` of every disk; `check` says whether a path supports
/// direct I/O ([`supports_direct_io`] outside tests).
pub(crate) fn set_driver_cache_modes(
    disks: &mut [Disk],
    check: impl Fn(&Path) -> io::Result<bool>,
) -> Result<(), DiskError> {
    for (i, disk) in disks.iter_mut().enumerate() {
        let path = if disk.source.file.is_empty() {
            disk.source.dev.clone()
        } else {
            disk.source.file.clone()
        };
        let backing = disk
            .backing_store
            .as_ref()
            .and_then(|b| b.source.as_ref())
            .map(|s| s.file.clone())
            .filter(|f| !f.is_empty());
        let Some(driver) = disk.driver.as_mut() else {
            continue;
        };
        let mode = driver.cache.as_str();
        if !mode.is_empty() && mode != "none" {
            continue;
        }
        // A failed probe counts as "no direct I/O", as in KubeVirt.
        let probe = |p: &str| match check(Path::new(p)) {
            Ok(supported) => supported,
            Err(e) => {
                tracing::warn!("direct I/O check failed for {p}: {e}");
                false
            }
        };
        let direct = probe(&path) && backing.as_deref().is_none_or(probe);
        driver.cache = match (mode, direct) {
            (_, true) => "none",
            ("", false) => "writethrough",
            (_, false) => {
                return Err(DiskError::Unsupported {
                    field: format!("spec.domain.devices.disks[{i}].cache"),
                    reason: format!(
                        "Unable to use 'none' cache mode, file system where {path} is stored does not support direct I/O"
                    ),
                });
            }
        }
        .to_string();
        tracing::info!("driver cache mode for {path} set to {}", driver.cache);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::{BackingStore, DiskDriver, DiskSource};

    fn disk(file: &str, cache: &str, backing: Option<&str>) -> Disk {
        Disk {
            source: DiskSource {
                file: file.into(),
                ..Default::default()
            },
            driver: Some(DiskDriver {
                cache: cache.into(),
                ..Default::default()
            }),
            backing_store: backing.map(|b| BackingStore {
                source: Some(DiskSource {
                    file: b.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Direct I/O works everywhere except under /slow.
    fn check(p: &Path) -> io::Result<bool> {
        if p.starts_with("/broken") {
            return Err(io::Error::other("probe failed"));
        }
        Ok(!p.starts_with("/slow"))
    }

    fn modes(disks: &[Disk]) -> Vec<&str> {
        disks
            .iter()
            .map(|d| d.driver.as_ref().unwrap().cache.as_str())
            .collect()
    }

    #[test]
    fn unset_modes_follow_the_file_system_of_the_disk_and_its_backing_file() {
        let mut disks = vec![
            disk("/fast/a", "", None),
            disk("/slow/b", "", None),
            disk("/fast/c", "", Some("/slow/base")),
            disk("/fast/d", "", Some("/fast/base")),
            disk("/broken/e", "", None),
            disk("/slow/f", "writeback", None),
            disk("/slow/g", "writethrough", None),
            disk("/fast/h", "none", None),
        ];
        set_driver_cache_modes(&mut disks, check).unwrap();
        assert_eq!(
            modes(&disks),
            [
                "none",
                "writethrough",
                "writethrough",
                "none",
                "writethrough",
                "writeback",
                "writethrough",
                "none"
            ]
        );
    }

    #[test]
    fn an_explicit_none_without_direct_io_is_refused_with_the_field() {
        let mut disks = vec![disk("/fast/a", "", None), disk("/slow/b", "none", None)];
        let err = set_driver_cache_modes(&mut disks, check).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("spec.domain.devices.disks[1].cache:"),
            "{text}"
        );
        assert!(text.contains("/slow/b"), "{text}");
    }

    #[test]
    fn the_real_probe_answers_for_existing_and_missing_files_and_cleans_up() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("disk.img");
        std::fs::write(&existing, [0u8; 4096]).unwrap();
        // ext4 and tmpfs (Linux 6.6 and later) both take O_DIRECT here;
        // what matters is an answer, not an error, and no litter.
        supports_direct_io(&existing).unwrap();
        let missing = dir.path().join("not-yet.img");
        supports_direct_io(&missing).unwrap();
        assert!(!missing.exists(), "the probe file is removed");
        assert!(supports_direct_io(&dir.path().join("no/such/dir/x")).is_err());
    }
}
