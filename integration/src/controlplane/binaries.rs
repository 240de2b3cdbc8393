//! Finding the etcd / kube-apiserver / kube-controller-manager binaries.
//!
//! They are built from Go modules by `integration/controlplane/build.sh`, which caches them
//! outside the repository; calling it again is cheap (it only checks `--version`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};

/// Set to a directory holding the three binaries to skip the build script entirely.
pub const BIN_DIR_ENV: &str = "KUBEVIRT_RS_CONTROLPLANE_BIN_DIR";

/// Paths of the control-plane executables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    pub etcd: PathBuf,
    pub kube_apiserver: PathBuf,
    pub kube_controller_manager: PathBuf,
}

impl Binaries {
    /// The binaries inside `dir`, checked to exist and be executable files.
    pub fn in_dir(dir: &Path) -> Result<Self> {
        let binaries = Self {
            etcd: dir.join("etcd"),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
        };
        for path in [
            &binaries.etcd,
            &binaries.kube_apiserver,
            &binaries.kube_controller_manager,
        ] {
            let meta = std::fs::metadata(path)
                .with_context(|| format!("control-plane binary {} is missing", path.display()))?;
            if !meta.is_file()
                || std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 == 0
            {
                bail!("{} is not an executable file", path.display());
            }
        }
        Ok(binaries)
    }

    /// The binaries from [`BIN_DIR_ENV`] if set, else from the (cached) build script.
    ///
    /// The build runs at most once per process; its outcome (including failure) is remembered
    /// so parallel tests do not each wait for a failing build.
    pub fn locate() -> Result<Self> {
        static LOCATED: OnceLock<std::result::Result<Binaries, String>> = OnceLock::new();
        LOCATED
            .get_or_init(|| Self::locate_uncached().map_err(|e| format!("{e:#}")))
            .clone()
            .map_err(|e| anyhow!(e))
    }

    fn locate_uncached() -> Result<Self> {
        if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
            return Self::in_dir(Path::new(&dir))
                .with_context(|| format!("{BIN_DIR_ENV}={}", Path::new(&dir).display()));
        }
        let script = build_script();
        let hint = format!(
            "the control plane binaries could not be built; build them with `{}` \
             (needs Go >= 1.26 and the Go module proxy; it caches under \
             ${{XDG_CACHE_HOME:-$HOME/.cache}}/kubevirt-rs/controlplane) \
             or point {BIN_DIR_ENV} at a directory holding etcd, kube-apiserver and \
             kube-controller-manager",
            script.display()
        );
        // stderr is inherited: a cold build takes a long time and its progress should show.
        let output = Command::new(&script)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .output()
            .with_context(|| format!("running {}", script.display()))
            .context(hint.clone())?;
        if !output.status.success() {
            bail!("{} exited with {}: {hint}", script.display(), output.status);
        }
        let stdout = String::from_utf8_lossy(&output.stdout);
        let dir = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .ok_or_else(|| anyhow!("{} printed no directory: {hint}", script.display()))?;
        Self::in_dir(Path::new(dir.trim())).context(hint)
    }
}

/// `integration/controlplane/build.sh` in this checkout.
pub fn build_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("controlplane/build.sh")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_dir_reports_the_missing_binary() {
        let dir = std::env::temp_dir().join(format!("cp-bin-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let err = Binaries::in_dir(&dir).unwrap_err();
        assert!(format!("{err:#}").contains("etcd"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn in_dir_rejects_non_executable_files() {
        let dir = std::env::temp_dir().join(format!("cp-bin-test-x-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["etcd", "kube-apiserver", "kube-controller-manager"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let err = Binaries::in_dir(&dir).unwrap_err();
        assert!(format!("{err:#}").contains("not an executable"), "{err:#}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
