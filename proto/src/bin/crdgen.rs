//! Writes the CRD manifests: `crdgen DIR` (one YAML file per CRD), or to
//! stdout without an argument.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args_os().nth(1).map(PathBuf::from);
    for (file, crd) in proto::crd::all() {
        let yaml = proto::crd::to_yaml(&crd)?;
        match &dir {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join(file), yaml)?;
                eprintln!("wrote {}", dir.join(file).display());
            }
            None => print!("{yaml}"),
        }
    }
    Ok(())
}
