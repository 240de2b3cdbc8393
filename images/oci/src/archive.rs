//! The OCI image layout (`oci-layout`, `index.json`, `blobs/sha256/…`) as one tar archive,
//! the form `ctr images import` and `skopeo copy oci-archive:` read.
//!
//! The JSON documents are built with the `oci-spec` types and written with sorted keys (the
//! types keep annotations and labels in hash maps, whose order varies from run to run).

use crate::error::Error;
use crate::layer::{self, Layer};
use crate::spec::{Entry, ImageSpec};
use oci_spec::image::{
    ANNOTATION_REF_NAME, Arch, ConfigBuilder, Descriptor, DescriptorBuilder, Digest,
    ImageConfigurationBuilder, ImageIndexBuilder, ImageManifestBuilder, MediaType, Os,
    PlatformBuilder, RootFsBuilder,
};
use std::collections::HashMap;
use std::io::Write;
use std::str::FromStr;

/// containerd's annotation for the full image name (`images.AnnotationImageName`).
pub const CONTAINERD_IMAGE_NAME: &str = "io.containerd.image.name";

/// What was built, for the caller's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub name: String,
    /// `sha256:<hex>` of the manifest: the image's digest (`ctr images ls`, `crictl images`).
    pub manifest_digest: String,
    /// Sum of the blob sizes (what a registry would transfer).
    pub compressed_size: u64,
    /// Sum of the regular files' sizes once unpacked.
    pub unpacked_size: u64,
}

/// Serializes with object keys sorted at every level, so hash-map fields of the `oci-spec`
/// types come out the same every time. serde_json's `Value` map is a `BTreeMap` unless the
/// `preserve_order` feature is on somewhere in the build; sort explicitly either way.
fn canonical_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, Error> {
    fn sorted(value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let mut entries: Vec<(String, serde_json::Value)> = map.into_iter().collect();
                entries.sort_by(|a, b| a.0.cmp(&b.0));
                serde_json::Value::Object(
                    entries.into_iter().map(|(k, v)| (k, sorted(v))).collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.into_iter().map(sorted).collect())
            }
            other => other,
        }
    }
    let value = serde_json::to_value(value).map_err(|e| Error::Spec(e.to_string()))?;
    serde_json::to_vec(&sorted(value)).map_err(|e| Error::Spec(e.to_string()))
}

fn descriptor(media_type: MediaType, data_digest: &str, size: u64) -> Result<Descriptor, Error> {
    Ok(Descriptor::new(
        media_type,
        size,
        Digest::from_str(data_digest)?,
    ))
}

/// The blobs and `index.json` of one image.
pub struct Image {
    pub layer: Layer,
    pub config: Vec<u8>,
    pub manifest: Vec<u8>,
    pub index: Vec<u8>,
    pub summary: Summary,
}

/// Builds the image of `spec` from its resolved `entries` (a single layer).
pub fn build_image(spec: &ImageSpec, entries: &[Entry]) -> Result<Image, Error> {
    let layer =
        layer::build(entries).map_err(|e| Error::Spec(format!("writing the layer: {e}")))?;
    let runtime = &spec.config;
    let mut config = ConfigBuilder::default();
    if let Some(user) = &runtime.user {
        config = config.user(user.clone());
    }
    if let Some(entrypoint) = &runtime.entrypoint {
        config = config.entrypoint(entrypoint.clone());
    }
    if let Some(cmd) = &runtime.cmd {
        config = config.cmd(cmd.clone());
    }
    if let Some(env) = &runtime.env {
        config = config.env(env.clone());
    }
    if let Some(dir) = &runtime.working_dir {
        config = config.working_dir(dir.clone());
    }
    if let Some(signal) = &runtime.stop_signal {
        config = config.stop_signal(signal.clone());
    }
    if !runtime.labels.is_empty() {
        config = config.labels(
            runtime
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<HashMap<_, _>>(),
        );
    }
    let image_config = ImageConfigurationBuilder::default()
        .architecture(Arch::Amd64)
        .os(Os::Linux)
        .config(config.build()?)
        .rootfs(
            RootFsBuilder::default()
                .typ("layers")
                .diff_ids(vec![layer.diff_id.clone()])
                .build()?,
        )
        .build()?;
    let config_json = canonical_json(&image_config)?;
    let config_digest = layer::sha256(&config_json);

    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(descriptor(
            MediaType::ImageConfig,
            &config_digest,
            config_json.len() as u64,
        )?)
        .layers(vec![descriptor(
            MediaType::ImageLayerGzip,
            &layer.digest,
            layer.compressed.len() as u64,
        )?])
        .build()?;
    let manifest_json = canonical_json(&manifest)?;
    let manifest_digest = layer::sha256(&manifest_json);

    let annotations = HashMap::from([
        (ANNOTATION_REF_NAME.to_string(), spec.name.clone()),
        (CONTAINERD_IMAGE_NAME.to_string(), spec.name.clone()),
    ]);
    let index = ImageIndexBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageIndex)
        .manifests(vec![
            DescriptorBuilder::default()
                .media_type(MediaType::ImageManifest)
                .digest(Digest::from_str(&manifest_digest)?)
                .size(manifest_json.len() as u64)
                .annotations(annotations)
                .platform(
                    PlatformBuilder::default()
                        .architecture(Arch::Amd64)
                        .os(Os::Linux)
                        .build()?,
                )
                .build()?,
        ])
        .build()?;
    let index_json = canonical_json(&index)?;

    let summary = Summary {
        name: spec.name.clone(),
        manifest_digest,
        compressed_size: layer.compressed.len() as u64
            + config_json.len() as u64
            + manifest_json.len() as u64,
        unpacked_size: layer.content_size,
    };
    Ok(Image {
        layer,
        config: config_json,
        manifest: manifest_json,
        index: index_json,
        summary,
    })
}

/// Writes the image as an OCI layout tar archive (entries sorted, time stamps 0).
pub fn write_archive<W: Write>(image: &Image, out: W) -> std::io::Result<W> {
    let blob_path = |digest: &str| format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    let mut files: Vec<(String, &[u8])> = vec![
        (
            "oci-layout".into(),
            br#"{"imageLayoutVersion":"1.0.0"}"#.as_slice(),
        ),
        ("index.json".into(), image.index.as_slice()),
        (
            blob_path(&image.summary.manifest_digest),
            image.manifest.as_slice(),
        ),
        (
            blob_path(&layer::sha256(&image.config)),
            image.config.as_slice(),
        ),
        (
            blob_path(&image.layer.digest),
            image.layer.compressed.as_slice(),
        ),
    ];
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files.dedup_by(|a, b| a.0 == b.0);
    let mut tar = tar::Builder::new(out);
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut h = layer::header(tar::EntryType::Directory, 0o755, 0, 0, 0);
        tar.append_data(&mut h, dir, std::io::empty())?;
    }
    for (path, data) in files {
        let mut h = layer::header(tar::EntryType::Regular, 0o644, 0, 0, data.len() as u64);
        tar.append_data(&mut h, path, data)?;
    }
    tar.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
    use std::collections::BTreeMap;
    use std::io::Read;

    const SPEC: &str = r##"
name: localhost/kubevirt-rs/example:devel
config:
  user: "107"
  entrypoint: [/usr/bin/tool]
  env: [PATH=/usr/bin]
  labels: {b: "2", a: "1"}
entries:
  - {path: /usr/bin/tool, text: "#!/bin/true\n", mode: "0755", capabilities: cap_net_bind_service+ep}
  - {path: /etc/passwd, text: "qemu:x:107:107::/:/sbin/nologin\n"}
"##;

    fn image() -> Image {
        let spec = ImageSpec::from_yaml(SPEC).unwrap();
        let entries = spec.resolve(std::path::Path::new("/nonexistent")).unwrap();
        build_image(&spec, &entries).unwrap()
    }

    fn archive_files(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
        let mut archive = tar::Archive::new(bytes);
        let mut files = BTreeMap::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            if entry.header().entry_type().is_dir() {
                continue;
            }
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            files.insert(path, data);
        }
        files
    }

    #[test]
    fn documents_parse_as_oci_types_and_digests_match_content() {
        let bytes = write_archive(&image(), Vec::new()).unwrap();
        let files = archive_files(&bytes);
        assert_eq!(files["oci-layout"], br#"{"imageLayoutVersion":"1.0.0"}"#);
        let blob = |digest: &Digest| {
            let data = files
                .get(&format!("blobs/sha256/{}", digest.digest()))
                .unwrap_or_else(|| panic!("blob {digest} is in the archive"))
                .clone();
            assert_eq!(
                layer::sha256(&data),
                digest.to_string(),
                "content has its digest"
            );
            data
        };

        let index = ImageIndex::from_reader(files["index.json"].as_slice()).unwrap();
        assert_eq!(index.schema_version(), 2);
        let [manifest_descriptor] = index.manifests().as_slice() else {
            panic!("one manifest")
        };
        assert_eq!(manifest_descriptor.media_type(), &MediaType::ImageManifest);
        let annotations = manifest_descriptor.annotations().clone().unwrap();
        assert_eq!(
            annotations[ANNOTATION_REF_NAME],
            "localhost/kubevirt-rs/example:devel"
        );
        assert_eq!(
            annotations[CONTAINERD_IMAGE_NAME],
            "localhost/kubevirt-rs/example:devel"
        );
        let platform = manifest_descriptor.platform().clone().unwrap();
        assert_eq!(
            (platform.architecture(), platform.os()),
            (&Arch::Amd64, &Os::Linux)
        );

        let manifest_bytes = blob(manifest_descriptor.digest());
        assert_eq!(manifest_bytes.len() as u64, manifest_descriptor.size());
        let manifest = ImageManifest::from_reader(manifest_bytes.as_slice()).unwrap();
        assert_eq!(manifest.config().media_type(), &MediaType::ImageConfig);
        let config_bytes = blob(manifest.config().digest());
        assert_eq!(config_bytes.len() as u64, manifest.config().size());
        let config = ImageConfiguration::from_reader(config_bytes.as_slice()).unwrap();
        let runtime = config.config().clone().unwrap();
        assert_eq!(runtime.user().as_deref(), Some("107"));
        assert_eq!(
            runtime.entrypoint().clone().unwrap(),
            vec!["/usr/bin/tool".to_string()]
        );
        assert_eq!(runtime.labels().clone().unwrap()["a"], "1");

        let [layer_descriptor] = manifest.layers().as_slice() else {
            panic!("one layer")
        };
        assert_eq!(layer_descriptor.media_type(), &MediaType::ImageLayerGzip);
        let layer_bytes = blob(layer_descriptor.digest());
        assert_eq!(layer_bytes.len() as u64, layer_descriptor.size());
        let mut tar = Vec::new();
        flate2::read::GzDecoder::new(layer_bytes.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        assert_eq!(config.rootfs().diff_ids(), &vec![layer::sha256(&tar)]);

        // Nothing else is in the archive.
        assert_eq!(files.len(), 5, "{:?}", files.keys());
    }

    #[test]
    fn json_keys_are_sorted_so_output_is_stable() {
        let image = image();
        for document in [&image.index, &image.manifest, &image.config] {
            let text = String::from_utf8(document.clone()).unwrap();
            let value: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(canonical_json(&value).unwrap(), *document, "{text}");
        }
        let index = String::from_utf8(image.index).unwrap();
        let containerd = index.find(CONTAINERD_IMAGE_NAME).unwrap();
        let ref_name = index.find(ANNOTATION_REF_NAME).unwrap();
        assert!(containerd < ref_name, "{index}");
    }

    #[test]
    fn the_same_spec_gives_the_same_archive() {
        let first = write_archive(&image(), Vec::new()).unwrap();
        for _ in 0..3 {
            assert_eq!(write_archive(&image(), Vec::new()).unwrap(), first);
        }
        assert_eq!(image().summary, image().summary);
    }

    #[test]
    fn a_changed_file_changes_the_digest() {
        let spec = ImageSpec::from_yaml(&SPEC.replace("/sbin/nologin", "/bin/sh")).unwrap();
        let entries = spec.resolve(std::path::Path::new("/nonexistent")).unwrap();
        let changed = build_image(&spec, &entries).unwrap();
        assert_ne!(
            changed.summary.manifest_digest,
            image().summary.manifest_digest
        );
    }
}
