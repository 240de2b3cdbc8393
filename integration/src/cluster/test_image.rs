//! Small single-layer OCI image archives made in memory, for tests that need an image with
//! known files (a pod command, an image volume's contents) on a machine without a registry.
//!
//! The archive is an OCI image layout in a tar file (`oci-layout`, `index.json`,
//! `blobs/sha256/…`) with one uncompressed layer; `ctr images import` (see
//! [`super::Cluster::import_image`]) reads it. The image is named by the
//! `io.containerd.image.name` annotation (containerd's convention), with the tag also in
//! `org.opencontainers.image.ref.name` (the OCI convention).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::json;
use sha2::{Digest, Sha256};

/// Where Debian's `busybox-static` installs its statically linked busybox.
pub const HOST_BUSYBOX: &str = "/bin/busybox";

/// An image under construction: files and an entrypoint.
#[derive(Debug, Clone)]
pub struct TestImage {
    name: String,
    files: Vec<(String, Vec<u8>, u32)>,
    entrypoint: Vec<String>,
}

impl TestImage {
    /// An empty image named `name` (a full reference, e.g. `localhost/kubevirt-rs-test/x:1`).
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            files: Vec::new(),
            entrypoint: Vec::new(),
        }
    }

    /// The image's reference.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds a regular file at `path` (absolute inside the image) with `mode`.
    pub fn file(mut self, path: &str, contents: impl Into<Vec<u8>>, mode: u32) -> Self {
        self.files.push((
            path.trim_start_matches('/').to_owned(),
            contents.into(),
            mode,
        ));
        self
    }

    /// Adds the host's static busybox as `/bin/busybox` (run applets as
    /// `["/bin/busybox", "sh", "-c", …]`). Fails if it is missing or dynamically linked: a
    /// dynamic binary would not run in an image without the host's libraries.
    pub fn with_busybox(self) -> Result<Self> {
        let binary = std::fs::read(HOST_BUSYBOX).with_context(|| {
            format!(
                "reading {HOST_BUSYBOX} (install Debian's busybox-static; scripts/setup.sh does)"
            )
        })?;
        if has_program_interpreter(&binary) {
            bail!("{HOST_BUSYBOX} is dynamically linked; install Debian's busybox-static");
        }
        Ok(self.file("/bin/busybox", binary, 0o755))
    }

    /// The command the image runs when a pod gives none.
    pub fn entrypoint(mut self, command: &[&str]) -> Self {
        self.entrypoint = command.iter().map(|&s| s.to_owned()).collect();
        self
    }

    /// Writes the OCI archive to `path`.
    pub fn write_archive(&self, path: &Path) -> Result<()> {
        let layer = self.layer_tar()?;
        let layer_digest = sha256_digest(&layer);
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": self.entrypoint},
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": sha256_digest(&config),
                "size": config.len(),
            },
            "layers": [{
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer.len(),
            }],
        }))?;
        let tag = self
            .name
            .rsplit_once(':')
            .filter(|(_, tag)| !tag.contains('/'))
            .map_or("latest", |(_, tag)| tag);
        let index = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": sha256_digest(&manifest),
                "size": manifest.len(),
                "annotations": {
                    "io.containerd.image.name": self.name,
                    "org.opencontainers.image.ref.name": tag,
                },
            }],
        }))?;

        let file =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut archive = tar::Builder::new(file);
        append(
            &mut archive,
            "oci-layout",
            br#"{"imageLayoutVersion":"1.0.0"}"#,
            0o644,
        )?;
        append(&mut archive, "index.json", &index, 0o644)?;
        for blob in [&layer, &config, &manifest] {
            let name = format!("blobs/sha256/{}", hex_sha256(blob));
            append(&mut archive, &name, blob, 0o644)?;
        }
        archive
            .into_inner()
            .and_then(|file| file.sync_all())
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The layer: every parent directory as an entry of its own, then the files.
    fn layer_tar(&self) -> Result<Vec<u8>> {
        let mut directories = BTreeSet::new();
        for (path, _, _) in &self.files {
            let mut parent = Path::new(path).parent();
            while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
                directories.insert(dir.to_owned());
                parent = dir.parent();
            }
        }
        let mut layer = tar::Builder::new(Vec::new());
        for dir in &directories {
            let mut header = tar::Header::new_ustar();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            header.set_mtime(0);
            layer.append_data(&mut header, dir, std::io::empty())?;
        }
        for (path, contents, mode) in &self.files {
            append(&mut layer, path, contents, *mode)?;
        }
        Ok(layer.into_inner()?)
    }
}

fn append<W: std::io::Write>(
    archive: &mut tar::Builder<W>,
    path: &str,
    contents: &[u8],
    mode: u32,
) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(mode);
    header.set_size(contents.len() as u64);
    header.set_mtime(0);
    archive
        .append_data(&mut header, path, contents)
        .with_context(|| format!("adding {path} to an archive"))
}

fn hex_sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex_sha256(bytes))
}

/// True if the ELF file has a PT_INTERP program header (is dynamically linked). Three header
/// fields read by hand: an ELF parser crate would be a dependency for one check.
fn has_program_interpreter(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let read_u16 = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let read_u32 = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let read_u64 = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
    };
    // 64-bit little-endian ELF only (the one target this project builds for).
    if elf.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (read_u64(0x20), read_u16(0x36), read_u16(0x38))
    else {
        return false;
    };
    (0..usize::from(phnum)).any(|i| {
        usize::try_from(phoff)
            .ok()
            .and_then(|off| off.checked_add(i * usize::from(phentsize)))
            .and_then(read_u32)
            == Some(PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(archive: &[u8]) -> Vec<(String, Vec<u8>)> {
        let mut archive = tar::Archive::new(archive);
        archive
            .entries()
            .unwrap()
            .map(|entry| {
                let mut entry = entry.unwrap();
                let path = entry.path().unwrap().to_string_lossy().into_owned();
                let mut contents = Vec::new();
                std::io::Read::read_to_end(&mut entry, &mut contents).unwrap();
                (path, contents)
            })
            .collect()
    }

    #[test]
    fn archive_is_an_oci_layout_whose_digests_match() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.tar");
        TestImage::new("localhost/test/data:7")
            .file("/data/hello.txt", "hello\n", 0o644)
            .entrypoint(&["/bin/true"])
            .write_archive(&path)
            .unwrap();
        let outer = entries(&std::fs::read(&path).unwrap());
        let blob = |digest: &str| {
            let name = format!("blobs/sha256/{}", digest.strip_prefix("sha256:").unwrap());
            let (_, contents) = outer.iter().find(|(p, _)| *p == name).unwrap();
            // Recomputed here rather than with the module's helper, which is under test.
            let recomputed: String = Sha256::digest(contents)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            assert_eq!(
                format!("sha256:{recomputed}"),
                digest,
                "{name} is stored under its digest"
            );
            contents.clone()
        };
        let index: serde_json::Value =
            serde_json::from_slice(&outer.iter().find(|(p, _)| p == "index.json").unwrap().1)
                .unwrap();
        let descriptor = &index["manifests"][0];
        assert_eq!(
            descriptor["annotations"]["io.containerd.image.name"],
            "localhost/test/data:7"
        );
        assert_eq!(
            descriptor["annotations"]["org.opencontainers.image.ref.name"],
            "7"
        );
        let manifest: serde_json::Value =
            serde_json::from_slice(&blob(descriptor["digest"].as_str().unwrap())).unwrap();
        let config: serde_json::Value =
            serde_json::from_slice(&blob(manifest["config"]["digest"].as_str().unwrap())).unwrap();
        let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap();
        assert_eq!(config["rootfs"]["diff_ids"][0], layer_digest);
        assert_eq!(config["config"]["Entrypoint"][0], "/bin/true");
        let layer = entries(&blob(layer_digest));
        let names: Vec<&str> = layer.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(names, ["data", "data/hello.txt"]);
        assert_eq!(layer[1].1, b"hello\n");
    }

    #[test]
    fn untagged_names_get_latest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image.tar");
        TestImage::new("localhost:5000/test/data")
            .write_archive(&path)
            .unwrap();
        let outer = entries(&std::fs::read(&path).unwrap());
        let index = &outer.iter().find(|(p, _)| p == "index.json").unwrap().1;
        let index: serde_json::Value = serde_json::from_slice(index).unwrap();
        assert_eq!(
            index["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"],
            "latest"
        );
    }

    #[test]
    fn static_and_dynamic_binaries_are_told_apart() {
        let dynamic = std::fs::read("/bin/sh").unwrap();
        assert!(has_program_interpreter(&dynamic), "/bin/sh is dynamic");
        assert!(!has_program_interpreter(b"not an elf file"));
        assert!(
            !has_program_interpreter(&dynamic[..0x30]),
            "truncated header"
        );
    }
}
