//! What can go wrong while building an image.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The spec is wrong (bad path, mode, capability, missing interpreter…).
    #[error("{0}")]
    Spec(String),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// An OCI document did not pass the `oci-spec` types' checks.
    #[error("OCI document: {0}")]
    Oci(#[from] oci_spec::OciSpecError),
}
