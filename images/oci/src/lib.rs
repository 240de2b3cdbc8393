//! Builds OCI image-layout archives without a container daemon.
//!
//! An image is described by a YAML spec ([`spec::ImageSpec`]): its name, its runtime
//! configuration and each file, directory and symlink of its one layer, with owners, modes
//! and file capabilities. [`build`] turns it into a tar archive holding `oci-layout`,
//! `index.json` and the blobs, which `ctr -n k8s.io images import` loads under the spec's
//! name. The output depends only on the spec and the source files (sorted entries, time
//! stamps 0), so the same inputs give the same image digest.

pub mod archive;
mod capability;
mod elf;
pub mod error;
pub mod layer;
pub mod spec;

pub use archive::Summary;
pub use error::Error;
pub use spec::ImageSpec;

use std::path::Path;

/// Builds the image of `spec`, reading `from` entries below `sources`, and writes the archive
/// to `out`.
pub fn build(spec: &ImageSpec, sources: &Path, out: &Path) -> Result<Summary, Error> {
    let entries = spec.resolve(sources)?;
    let image = archive::build_image(spec, &entries)?;
    let io = |source| Error::Io {
        path: out.to_path_buf(),
        source,
    };
    // Written next to the target and renamed, so a failed build leaves no half archive.
    let partial = out.with_extension("tar.partial");
    let file = std::fs::File::create(&partial).map_err(io)?;
    let writer = archive::write_archive(&image, std::io::BufWriter::new(file)).map_err(io)?;
    writer
        .into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    std::fs::rename(&partial, out).map_err(io)?;
    Ok(image.summary)
}

#[cfg(test)]
mod test_support {
    use std::path::PathBuf;

    /// A program from $PATH or the sbin directories (tests run as root, but sudo trims PATH).
    pub fn tool(name: &str) -> PathBuf {
        let path = std::env::var("PATH").unwrap_or_default();
        path.split(':')
            .chain(["/usr/sbin", "/sbin"])
            .map(|dir| PathBuf::from(dir).join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} is not installed (scripts/setup.sh installs it)"))
    }
}
