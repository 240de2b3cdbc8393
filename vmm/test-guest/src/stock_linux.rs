//! Debian's stock kernel and the initramfs `scripts/stock-linux.sh` builds, for the
//! stock-kernel tests of the VMM command and of the launcher.

use std::path::PathBuf;

/// The packaged kernel and the initramfs (built, cached, by the script
/// `scripts/setup.sh` runs; run here too if the cache is missing).
pub fn artifacts() -> (PathBuf, PathBuf) {
    let dir = std::env::var_os("STOCK_LINUX_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| {
                    PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache")
                });
            cache.join("kubevirt-rs/stock-linux")
        });
    let (kernel, initrd) = (dir.join("vmlinuz"), dir.join("initramfs.gz"));
    if !kernel.exists() || !initrd.exists() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/stock-linux.sh");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .env("STOCK_LINUX_DIR", &dir)
            .status()
            .expect("run scripts/stock-linux.sh");
        assert!(status.success(), "scripts/stock-linux.sh failed");
    }
    (kernel, initrd)
}
