//! One image layer: a tar stream of the entries, gzip-compressed, with both digests.
//!
//! Deterministic by construction: entries in path order, every time stamp 0, numeric owners
//! only (no user or group names), gzip header without a name or time. The same entries give
//! the same bytes, so the same image digest.

use crate::spec::{Entry, Kind};
use flate2::Compression;
use flate2::write::GzEncoder;
use sha2::{Digest, Sha256};
use std::io::{self, Write};

/// A built layer.
pub struct Layer {
    /// The gzip-compressed tar stream (the blob).
    pub compressed: Vec<u8>,
    /// `sha256:<hex>` of the blob.
    pub digest: String,
    /// `sha256:<hex>` of the uncompressed tar stream (the config's `rootfs.diff_ids`).
    pub diff_id: String,
    /// Size of the uncompressed tar stream.
    pub tar_size: u64,
    /// Sum of the sizes of the regular files (what the layer takes once unpacked).
    pub content_size: u64,
}

/// `sha256:<hex>` of `data`.
pub fn sha256(data: &[u8]) -> String {
    format!("sha256:{}", hex(&Sha256::digest(data)))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes and counts what passes through on the way to `inner`.
struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A tar header with the fields every entry shares: owner, mode, time 0, no names.
pub(crate) fn header(
    kind: tar::EntryType,
    mode: u32,
    uid: u64,
    gid: u64,
    size: u64,
) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_mtime(0);
    header.set_size(size);
    header
}

/// Writes the entries as a tar stream into `out`.
pub(crate) fn write_tar<W: Write>(entries: &[Entry], out: W) -> io::Result<W> {
    let mut tar = tar::Builder::new(out);
    for entry in entries {
        if !entry.xattrs.is_empty() {
            let records: Vec<(String, &[u8])> = entry
                .xattrs
                .iter()
                .map(|(name, value)| (format!("SCHILY.xattr.{name}"), value.as_slice()))
                .collect();
            tar.append_pax_extensions(records.iter().map(|(k, v)| (k.as_str(), *v)))?;
        }
        match &entry.kind {
            Kind::File(data) => {
                let mut h = header(
                    tar::EntryType::Regular,
                    entry.mode,
                    entry.uid,
                    entry.gid,
                    data.len() as u64,
                );
                tar.append_data(&mut h, &entry.path, data.as_slice())?;
            }
            Kind::Dir => {
                let mut h = header(
                    tar::EntryType::Directory,
                    entry.mode,
                    entry.uid,
                    entry.gid,
                    0,
                );
                tar.append_data(&mut h, format!("{}/", entry.path), io::empty())?;
            }
            Kind::Symlink(target) => {
                let mut h = header(tar::EntryType::Symlink, entry.mode, entry.uid, entry.gid, 0);
                tar.append_link(&mut h, &entry.path, target)?;
            }
        }
    }
    tar.into_inner()
}

/// Builds the layer of `entries` (already sorted, parents first: `ImageSpec::resolve`).
pub fn build(entries: &[Entry]) -> io::Result<Layer> {
    let gzip = GzEncoder::new(
        Hashing {
            inner: Vec::new(),
            hasher: Sha256::new(),
            size: 0,
        },
        Compression::best(),
    );
    let tar_side = write_tar(
        entries,
        Hashing {
            inner: gzip,
            hasher: Sha256::new(),
            size: 0,
        },
    )?;
    let diff_id = format!("sha256:{}", hex(&tar_side.hasher.finalize()));
    let tar_size = tar_side.size;
    let blob_side = tar_side.inner.finish()?;
    let digest = format!("sha256:{}", hex(&blob_side.hasher.finalize()));
    let content_size = entries
        .iter()
        .map(|e| match &e.kind {
            Kind::File(data) => data.len() as u64,
            _ => 0,
        })
        .sum();
    Ok(Layer {
        compressed: blob_side.inner,
        digest,
        diff_id,
        tar_size,
        content_size,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ImageSpec;
    use flate2::read::GzDecoder;
    use std::io::Read;

    fn entries() -> Vec<Entry> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("tool"), b"#!/bin/true\n").unwrap();
        ImageSpec::from_yaml(concat!(
            "name: localhost/a/b:c\nentries:\n",
            "  - {path: /usr/bin/tool, from: tool, mode: \"0755\", capabilities: cap_net_bind_service+ep}\n",
            "  - {path: /disk, dir: true, uid: 107, gid: 107, mode: \"0750\"}\n",
            "  - {path: /disk/base.img, text: data, uid: 107, gid: 107, mode: \"0440\"}\n",
            "  - {path: /var/run, symlink: ../run}\n",
        ))
        .unwrap()
        .resolve(dir.path())
        .unwrap()
    }

    fn unpack(layer: &Layer) -> Vec<u8> {
        let mut tar = Vec::new();
        GzDecoder::new(layer.compressed.as_slice())
            .read_to_end(&mut tar)
            .unwrap();
        tar
    }

    #[test]
    fn digests_are_of_the_blob_and_of_the_tar() {
        let layer = build(&entries()).unwrap();
        assert_eq!(layer.digest, sha256(&layer.compressed));
        let tar = unpack(&layer);
        assert_eq!(layer.diff_id, sha256(&tar));
        assert_eq!(layer.tar_size, tar.len() as u64);
        assert_eq!(layer.content_size, 12 + 4);
    }

    /// One tar entry as a reader sees it.
    #[derive(Debug, PartialEq)]
    struct Seen {
        path: String,
        kind: tar::EntryType,
        mode: u32,
        owner: (u64, u64),
        link: Option<String>,
        data: Vec<u8>,
        capability: Option<Vec<u8>>,
    }

    fn seen(path: &str, kind: tar::EntryType, mode: u32, owner: (u64, u64)) -> Seen {
        Seen {
            path: path.into(),
            kind,
            mode,
            owner,
            link: None,
            data: Vec::new(),
            capability: None,
        }
    }

    #[test]
    fn the_tar_holds_each_entry_as_declared() {
        let layer = build(&entries()).unwrap();
        let tar = unpack(&layer);
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut entries = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            let h = entry.header().clone();
            assert_eq!(h.mtime().unwrap(), 0, "{path}");
            assert_eq!(h.username().unwrap(), Some(""), "{path}: no user names");
            let capability = entry.pax_extensions().unwrap().and_then(|mut pax| {
                pax.find(|r| {
                    r.as_ref().unwrap().key().unwrap() == "SCHILY.xattr.security.capability"
                })
                .map(|r| r.unwrap().value_bytes().to_vec())
            });
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            entries.push(Seen {
                link: h
                    .link_name()
                    .unwrap()
                    .map(|l| l.to_string_lossy().into_owned()),
                data,
                capability,
                ..seen(
                    &path,
                    h.entry_type(),
                    h.mode().unwrap(),
                    (h.uid().unwrap(), h.gid().unwrap()),
                )
            });
        }
        use tar::EntryType::{Directory as D, Regular as F, Symlink as L};
        let cap = crate::capability::vfs_cap_data("cap_net_bind_service+ep").unwrap();
        let expected = vec![
            seen("disk/", D, 0o750, (107, 107)),
            Seen {
                data: b"data".to_vec(),
                ..seen("disk/base.img", F, 0o440, (107, 107))
            },
            seen("usr/", D, 0o755, (0, 0)),
            seen("usr/bin/", D, 0o755, (0, 0)),
            Seen {
                data: b"#!/bin/true\n".to_vec(),
                capability: Some(cap),
                ..seen("usr/bin/tool", F, 0o755, (0, 0))
            },
            seen("var/", D, 0o755, (0, 0)),
            Seen {
                link: Some("../run".into()),
                ..seen("var/run", L, 0o777, (0, 0))
            },
        ];
        assert_eq!(entries, expected);
    }

    #[test]
    fn the_same_entries_give_the_same_bytes() {
        let first = build(&entries()).unwrap();
        let second = build(&entries()).unwrap();
        assert_eq!(first.compressed, second.compressed);
        assert_eq!(first.digest, second.digest);
    }

    #[test]
    fn long_paths_survive() {
        let long = format!("/{}/file", "d".repeat(150));
        let entries = ImageSpec::from_yaml(&format!(
            "name: localhost/a/b:c\nentries:\n  - {{path: {long}, text: x}}\n"
        ))
        .unwrap()
        .resolve(std::path::Path::new("/nonexistent"))
        .unwrap();
        let layer = build(&entries).unwrap();
        let tar = unpack(&layer);
        let mut archive = tar::Archive::new(tar.as_slice());
        let paths: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(paths.last().unwrap(), &long[1..]);
    }
}
