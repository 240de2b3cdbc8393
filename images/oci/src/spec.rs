//! The image spec: a YAML file naming the image, its runtime configuration and every entry of
//! its single layer.
//!
//! ```yaml
//! name: localhost/kubevirt-rs/virt-launcher:devel
//! config:
//!   entrypoint: [/usr/bin/virt-launcher]
//!   user: "107"
//! entries:
//!   - path: /usr/bin/virt-launcher-monitor
//!     from: virt-launcher-monitor          # relative to the builder's --from directory
//!     mode: "0755"
//!     capabilities: cap_net_bind_service+ep
//!   - path: /etc/group
//!     text: "qemu:x:107:\n"
//!   - path: /var/run
//!     symlink: ../run
//!   - path: /disk
//!     dir: true
//!     uid: 107
//!     gid: 107
//! ```
//!
//! Exactly one of `from`, `text`, `symlink` and `dir` says what an entry is. Modes are octal
//! strings (YAML would read `0755` as the decimal 755). Parent directories that are not listed
//! are added as `0755 root:root`.

use crate::capability;
use crate::error::Error;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Component, Path};

/// An image as the spec file describes it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// The full image reference, e.g. `localhost/kubevirt-rs/pause:3.10`.
    pub name: String,
    #[serde(default)]
    pub config: RuntimeConfig,
    pub entries: Vec<EntrySpec>,
}

/// What a container runtime uses when the pod does not say (`config` of the OCI image
/// configuration).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct RuntimeConfig {
    pub user: Option<String>,
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    pub env: Option<Vec<String>>,
    pub working_dir: Option<String>,
    pub stop_signal: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// One entry as written in the spec.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntrySpec {
    pub path: String,
    /// A file copied from the builder's source directory.
    pub from: Option<String>,
    /// A file with this content.
    pub text: Option<String>,
    /// A symbolic link to this target (stored as written).
    pub symlink: Option<String>,
    /// A directory.
    #[serde(default)]
    pub dir: bool,
    /// Octal permission bits, e.g. `"0755"`.
    pub mode: Option<String>,
    #[serde(default)]
    pub uid: u64,
    #[serde(default)]
    pub gid: u64,
    /// File capabilities in `setcap` notation, e.g. `cap_net_bind_service+ep`.
    pub capabilities: Option<String>,
}

/// What an entry of the layer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File(Vec<u8>),
    Dir,
    Symlink(String),
}

/// One entry of the layer, resolved and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Relative to the image root, without a leading `/` (`usr/bin/pause`).
    pub path: String,
    pub kind: Kind,
    pub mode: u32,
    pub uid: u64,
    pub gid: u64,
    /// Extended attributes, e.g. `security.capability`.
    pub xattrs: BTreeMap<String, Vec<u8>>,
}

impl ImageSpec {
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        let spec: Self = serde_yaml::from_str(text).map_err(|e| Error::Spec(e.to_string()))?;
        spec.check_name()?;
        Ok(spec)
    }

    /// The name must be a full reference already (registry, repository and tag): the kubelet
    /// asks containerd for the normalized form (`pause` means `docker.io/library/pause:latest`),
    /// so an archive under a short name would never be found.
    fn check_name(&self) -> Result<(), Error> {
        let reference = oci_spec::distribution::Reference::try_from(self.name.as_str())
            .map_err(|e| Error::Spec(format!("name {:?}: {e}", self.name)))?;
        if reference.whole() != self.name {
            return Err(Error::Spec(format!(
                "name {:?} is not a full reference: write {:?}",
                self.name,
                reference.whole()
            )));
        }
        Ok(())
    }

    /// The entries of the layer, parents included, sorted by path (a parent sorts before its
    /// children), with `from` files read from `sources`.
    pub fn resolve(&self, sources: &Path) -> Result<Vec<Entry>, Error> {
        let mut entries: BTreeMap<String, Entry> = BTreeMap::new();
        for spec in &self.entries {
            let entry = spec.resolve(sources)?;
            if entries.contains_key(&entry.path) {
                return Err(Error::Spec(format!("{} is listed twice", spec.path)));
            }
            entries.insert(entry.path.clone(), entry);
        }
        let paths: Vec<String> = entries.keys().cloned().collect();
        for path in paths {
            let mut parent = Path::new(&path).parent();
            while let Some(dir) = parent.filter(|p| !p.as_os_str().is_empty()) {
                let dir_path = dir.to_string_lossy().into_owned();
                match entries.get(&dir_path) {
                    Some(existing) if existing.kind != Kind::Dir => {
                        return Err(Error::Spec(format!(
                            "/{dir_path} holds /{path} but is not a directory"
                        )));
                    }
                    Some(_) => {}
                    None => {
                        entries.insert(
                            dir_path.clone(),
                            Entry {
                                path: dir_path,
                                kind: Kind::Dir,
                                mode: 0o755,
                                uid: 0,
                                gid: 0,
                                xattrs: BTreeMap::new(),
                            },
                        );
                    }
                }
                parent = dir.parent();
            }
        }
        let entries: Vec<Entry> = entries.into_values().collect();
        crate::elf::check_interpreters(&entries)?;
        Ok(entries)
    }
}

impl EntrySpec {
    fn resolve(&self, sources: &Path) -> Result<Entry, Error> {
        let path = normalized(&self.path)?;
        let spec_error = |what: &str| Error::Spec(format!("{}: {what}", self.path));
        let kinds = [
            self.from.is_some(),
            self.text.is_some(),
            self.symlink.is_some(),
            self.dir,
        ];
        if kinds.iter().filter(|k| **k).count() != 1 {
            return Err(spec_error(
                "give exactly one of `from`, `text`, `symlink`, `dir`",
            ));
        }
        let kind = if let Some(from) = &self.from {
            let source = sources.join(from);
            let data = std::fs::read(&source).map_err(|e| Error::Io {
                path: source.clone(),
                source: e,
            })?;
            Kind::File(data)
        } else if let Some(text) = &self.text {
            Kind::File(text.clone().into_bytes())
        } else if let Some(target) = &self.symlink {
            if target.is_empty() || target.contains('\0') {
                return Err(spec_error("a symlink needs a target without NUL bytes"));
            }
            Kind::Symlink(target.clone())
        } else {
            Kind::Dir
        };
        let default_mode = match kind {
            Kind::File(_) => 0o644,
            Kind::Dir => 0o755,
            Kind::Symlink(_) => 0o777,
        };
        let mode = match &self.mode {
            Some(text) => u32::from_str_radix(text, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| spec_error(&format!("mode {text:?} is not an octal mode")))?,
            None => default_mode,
        };
        let mut xattrs = BTreeMap::new();
        if let Some(caps) = &self.capabilities {
            if !matches!(kind, Kind::File(_)) {
                return Err(spec_error("only regular files carry capabilities"));
            }
            let value = capability::vfs_cap_data(caps).map_err(|e| spec_error(&e))?;
            xattrs.insert(capability::XATTR.to_string(), value);
        }
        Ok(Entry {
            path,
            kind,
            mode,
            uid: self.uid,
            gid: self.gid,
            xattrs,
        })
    }
}

/// `/usr/bin/x` → `usr/bin/x`; refuses relative paths, `.`/`..` parts and the root itself.
fn normalized(path: &str) -> Result<String, Error> {
    let refuse = |why: &str| Error::Spec(format!("path {path:?} {why}"));
    if !path.starts_with('/') {
        return Err(refuse("must be absolute"));
    }
    if path.contains('\0') {
        return Err(refuse("contains a NUL byte"));
    }
    let mut parts = Vec::new();
    for component in Path::new(path).components() {
        match component {
            Component::RootDir => {}
            Component::Normal(part) => parts.push(part.to_string_lossy().into_owned()),
            _ => return Err(refuse("must not contain `.` or `..`")),
        }
    }
    if parts.is_empty() {
        return Err(refuse("names the root, which is always there"));
    }
    let joined = parts.join("/");
    if format!("/{joined}") != path.trim_end_matches('/') {
        return Err(refuse("is not in normal form (doubled or trailing `/`)"));
    }
    Ok(joined)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(entries: &str) -> ImageSpec {
        ImageSpec::from_yaml(&format!("name: localhost/x/y:z\nentries:\n{entries}")).unwrap()
    }

    #[test]
    fn parents_are_added_and_entries_sorted() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bin"), b"\x7fELF-not-really").unwrap();
        let entries = spec(
            "  - {path: /usr/bin/tool, from: bin, mode: \"0755\"}\n  - {path: /etc/passwd, text: \"root:x:0:0::/:/x\\n\"}\n  - {path: /var/run, symlink: ../run}\n",
        )
        .resolve(dir.path())
        .unwrap();
        let paths: Vec<&str> = entries.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "etc",
                "etc/passwd",
                "usr",
                "usr/bin",
                "usr/bin/tool",
                "var",
                "var/run"
            ]
        );
        assert_eq!(entries[4].mode, 0o755);
        assert_eq!(entries[1].mode, 0o644);
        assert_eq!(entries[0].kind, Kind::Dir);
        assert_eq!(entries[6].kind, Kind::Symlink("../run".into()));
    }

    #[test]
    fn bad_entries_are_refused_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        for (entries, reason) in [
            ("  - {path: usr/x, text: a}\n", "must be absolute"),
            ("  - {path: /a/../b, text: a}\n", "`..`"),
            ("  - {path: /a//b, text: a}\n", "normal form"),
            ("  - {path: /, dir: true}\n", "root"),
            ("  - {path: /a, text: a, dir: true}\n", "exactly one"),
            ("  - {path: /a}\n", "exactly one"),
            ("  - {path: /a, text: a, mode: \"999\"}\n", "octal"),
            ("  - {path: /a, text: a, mode: \"17777\"}\n", "octal"),
            (
                "  - {path: /a, text: a}\n  - {path: /a, text: b}\n",
                "twice",
            ),
            (
                "  - {path: /a, text: a}\n  - {path: /a/b, text: b}\n",
                "not a directory",
            ),
            (
                "  - {path: /a, dir: true, capabilities: cap_chown+ep}\n",
                "regular files",
            ),
            (
                "  - {path: /a, text: a, capabilities: cap_nonsense+ep}\n",
                "cap_nonsense",
            ),
            ("  - {path: /a, from: missing}\n", "missing"),
        ] {
            let error = spec(entries).resolve(dir.path()).unwrap_err().to_string();
            assert!(error.contains(reason), "{entries}: {error}");
        }
        let unknown = ImageSpec::from_yaml("name: a\nentries: []\nlayers: 2\n").unwrap_err();
        assert!(unknown.to_string().contains("layers"), "{unknown}");
    }

    #[test]
    fn names_must_be_full_references() {
        for good in [
            "localhost/kubevirt-rs/pause:3.10",
            "localhost/kubevirt-rs/virt-launcher:devel",
            "quay.io/kubevirt/virt-launcher:v1.9.0",
        ] {
            ImageSpec::from_yaml(&format!("name: {good}\nentries: []\n")).expect(good);
        }
        for (bad, reason) in [
            ("pause", "docker.io/library/pause:latest"),
            (
                "localhost/kubevirt-rs/pause",
                "localhost/kubevirt-rs/pause:latest",
            ),
            ("localhost/x:", "invalid"),
            ("a b:c", "invalid"),
        ] {
            let error = ImageSpec::from_yaml(&format!("name: \"{bad}\"\nentries: []\n"))
                .unwrap_err()
                .to_string();
            assert!(error.to_lowercase().contains(reason), "{bad}: {error}");
        }
    }
}
