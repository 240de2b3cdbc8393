//! The project's own images for the cluster tests: `images/build.sh --profile dev`, the same
//! specs and static, stripped programs as the release images, built unoptimised (a release
//! build of every program would add about as much CPU time as the whole test build).
//!
//! Built once per test process into `<target dir>/e2e-images`; a second build is cargo's
//! no-op check plus the archives written again (identical bytes). `scripts/test.sh` builds
//! them before the tests run, so the tests find cargo's work done.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, anyhow, bail};

/// The images `images/build.sh` writes (the sandbox image `pause` included).
pub const PROJECT_IMAGES: [&str; 7] = [
    "virt-controller",
    "virt-api",
    "virt-handler",
    "virt-launcher",
    "pause",
    "test-guest-kernel",
    "test-disk",
];

/// The archives of [`PROJECT_IMAGES`], built by `images/build.sh --profile dev`.
#[derive(Debug, Clone)]
pub struct ProjectImages {
    dir: PathBuf,
}

impl ProjectImages {
    /// The OCI archive of image `name` (one of [`PROJECT_IMAGES`]).
    pub fn archive(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.tar"))
    }

    /// Where the archives are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Builds the project's images once per process (see the module doc) and returns where they
/// are. Blocking: minutes on a cold target directory, seconds afterwards.
pub fn project_images() -> Result<ProjectImages> {
    static BUILT: OnceLock<std::result::Result<ProjectImages, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!(e))
}

fn build() -> Result<ProjectImages> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = target_dir()?.join("e2e-images");
    let script = repo.join("images/build.sh");
    eprintln!(
        "building the project's images: bash {} --profile dev --out {}",
        script.display(),
        dir.display()
    );
    let mut command = Command::new("bash");
    // Without the variables cargo sets for the running test (`CARGO_MANIFEST_DIR`,
    // `CARGO_PKG_NAME`, ...): build scripts that watch them (ring's does) would otherwise see
    // them change between this build and one from a shell, and rebuild half the tree.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if set_by_cargo_for_the_test(&name) {
            command.env_remove(name.as_ref());
        }
    }
    let output = command
        .arg(&script)
        .args(["--profile", "dev", "--out"])
        .arg(&dir)
        .current_dir(&repo)
        .env("CARGO_INCREMENTAL", "0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !output.status.success() {
        bail!(
            "bash {} --profile dev --out {} exited with {}",
            script.display(),
            dir.display(),
            output.status
        );
    }
    let images = ProjectImages { dir };
    for name in PROJECT_IMAGES {
        let archive = images.archive(name);
        if !archive.is_file() {
            bail!("images/build.sh wrote no {}", archive.display());
        }
    }
    Ok(images)
}

/// The variables cargo sets for the crate it runs (its "environment variables Cargo sets for
/// crates"), as opposed to the user's cargo configuration (`CARGO_HOME`, `CARGO_TARGET_DIR`).
fn set_by_cargo_for_the_test(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_MANIFEST_")
        || name.starts_with("CARGO_BIN_")
        || matches!(
            name,
            "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR"
        )
}

/// The cargo target directory this test binary was built in (`<target>/debug/deps/<binary>`),
/// so the images land next to it whatever `CARGO_TARGET_DIR` says.
fn target_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the test binary")?;
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .ok_or_else(|| anyhow!("{} is not in <target>/debug/deps", exe.display()))
}
