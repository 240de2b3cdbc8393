//! Generates the gRPC code for KubeVirt's handler <-> launcher contract and the
//! kubelet's device-plugin API, and keeps the compiled descriptor set, so tests can
//! check every field number.

use std::path::PathBuf;

const PROTOS: &[&str] = &[
    "protos/cmd/v1/cmd.proto",
    "protos/cmd/info/info.proto",
    "protos/notify/v1/notify.proto",
    "protos/notify/info/info.proto",
    "protos/deviceplugin/v1beta1/api.proto",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    for p in PROTOS {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("kubevirt_descriptor.bin"))
        .compile_protos(PROTOS, &["protos"])?;
    Ok(())
}
