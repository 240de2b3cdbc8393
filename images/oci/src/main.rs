//! `oci-image`: writes the OCI archive of an image spec.

use clap::Parser;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "oci-image",
    about = "Builds an OCI image-layout archive (for `ctr images import`) from a YAML image spec"
)]
struct Args {
    /// The image spec (YAML).
    spec: PathBuf,
    /// Directory the spec's `from:` entries are relative to.
    #[arg(long, default_value = ".")]
    from: PathBuf,
    /// The archive to write.
    #[arg(long)]
    out: PathBuf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let run = || -> Result<oci_image::Summary, oci_image::Error> {
        let text = std::fs::read_to_string(&args.spec).map_err(|source| oci_image::Error::Io {
            path: args.spec.clone(),
            source,
        })?;
        let spec = oci_image::ImageSpec::from_yaml(&text)
            .map_err(|e| oci_image::Error::Spec(format!("{}: {e}", args.spec.display())))?;
        oci_image::build(&spec, &args.from, &args.out)
    };
    match run() {
        Ok(summary) => {
            // One line per image: name, digest, compressed and unpacked bytes.
            println!(
                "{} {} {} {}",
                summary.name,
                summary.manifest_digest,
                summary.compressed_size,
                summary.unpacked_size
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("oci-image: {e}");
            ExitCode::FAILURE
        }
    }
}
