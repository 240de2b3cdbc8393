//! Cloud-init data disks: KubeVirt's NoCloud (`cidata`) and ConfigDrive (`config-2`) ISO images.
//!
//! Follows `pkg/cloud-init/cloud-init.go` of KubeVirt v1.9.0:
//! - user data comes from the volume's `secretRef` secret (mounted by the controller at
//!   `<secrets dir>/<volume>/userdata` and `.../userData`), else `userData`, else the base64-decoded
//!   `userDataBase64`; network data likewise (`networkDataSecretRef`, `networkData`,
//!   `networkDataBase64`). One of the two is required.
//! - meta data is compact JSON in Go's `encoding/json` form (struct field order, `omitempty`, sorted
//!   map keys, HTML-safe escaping), because the guest sees these exact bytes.
//! - the image is written to `<iso>.staging` and renamed over `<iso>`, so a reader never sees half an image.
//!
//! The image itself is laid out by `hadris-iso` (ISO9660 + Joliet + Rock Ridge, like KubeVirt's
//! `xorrisofs -joliet -rock`). hadris-iso 2.5.0 stamps directory records and volume descriptors
//! with the wall clock and has no option to fix them, so [`pin_timestamps_and_pad`] rewrites those
//! dates to the Unix epoch afterwards: the same input then gives a byte-identical image.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::io::{self, Cursor, Read, Write};
use std::path::{Path, PathBuf};

use crate::paths::PathName;
use base64::Engine as _;
use hadris_iso::joliet::JolietLevel;
use hadris_iso::read::PathSeparator;
use hadris_iso::rrip::RripOptions;
use hadris_iso::write::options::{BaseIsoLevel, CreationFeatures, IsoFormatOptions};
use hadris_iso::write::{InputEntry, InputMetadata, InputTree, IsoImageWriter};
use proto::kubevirt::{CloudInitSource, VirtualMachineInstance};
use serde_json::Value;

/// Volume id cloud-init looks for on a NoCloud disk.
pub(crate) const NOCLOUD_VOLUME_ID: &str = "cidata";
/// Volume id cloud-init looks for on an OpenStack config drive.
pub(crate) const CONFIG_DRIVE_VOLUME_ID: &str = "config-2";
/// Largest user data, network data, secret file or public key accepted.
///
/// KubeVirt's admission webhook limits inline data to 2048 bytes and Kubernetes limits a secret
/// to 1 MiB; the launcher re-checks with a generous cap so a bad mount cannot make it read
/// an unbounded file into memory.
pub const MAX_INPUT_BYTES: usize = 16 << 20;

/// Which cloud-init data source a volume asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataSource {
    /// `cloudInitNoCloud`: volume `cidata` with `user-data`, `meta-data`, `network-config`.
    NoCloud,
    /// `cloudInitConfigDrive`: volume `config-2` with `openstack/latest/{user_data,meta_data.json,network_data.json}`.
    ConfigDrive,
}

impl DataSource {
    /// File name of the image inside `<base>/<namespace>/<vmi>/`.
    pub(crate) fn iso_file_name(self) -> &'static str {
        match self {
            DataSource::NoCloud => "noCloud.iso",
            DataSource::ConfigDrive => "configdrive.iso",
        }
    }
}

/// The three files of a cloud-init disk, as the guest will read them.
///
/// For a config drive `meta_data` is `meta_data.json` and `network_config` is `network_data.json`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudInitData {
    pub user_data: Vec<u8>,
    pub meta_data: Vec<u8>,
    /// Present only when the volume has network data (KubeVirt omits the file otherwise).
    pub network_config: Option<Vec<u8>>,
}

/// A cloud-init disk image written for a VMI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudInitDisk {
    /// Name of the VMI volume (and disk) it backs.
    pub volume_name: String,
    pub source: DataSource,
    /// The raw ISO image the VMM attaches.
    pub iso_path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum CloudInitError {
    #[error(
        "cloud-init volume {volume:?}: userDataBase64, userData, networkDataBase64 or networkData \
         is required for a cloud-init data source{}",
        unreadable_note(unreadable_secrets)
    )]
    MissingData {
        volume: String,
        /// Secret files that were referenced but could not be read.
        unreadable_secrets: Vec<PathBuf>,
    },
    #[error(
        "cloud-init volume {volume:?}: no cloud-init data-source found: none of the referenced secret files \
         could be read (tried {})",
        display_paths(tried)
    )]
    NoSecretData { volume: String, tried: Vec<PathBuf> },
    #[error("cloud-init volume {volume:?}: {field} is not valid base64: {source}")]
    InvalidBase64 {
        volume: String,
        field: &'static str,
        #[source]
        source: base64::DecodeError,
    },
    #[error("{what} is larger than the {limit}-byte limit")]
    TooLarge { what: String, limit: usize },
    #[error("invalid name {name:?} for {what}: it must be a single path component")]
    InvalidName { what: &'static str, name: String },
    #[error("the VMI has no metadata.name")]
    MissingVmiName,
    #[error("spec.accessCredentials is malformed: {0}")]
    InvalidAccessCredentials(String),
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("building the ISO9660 image: {0}")]
    IsoBuild(String),
}

fn unreadable_note(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        String::new()
    } else {
        format!(
            " (referenced secret files not readable: {})",
            display_paths(paths)
        )
    }
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn io_error(action: &'static str, path: &Path, source: io::Error) -> CloudInitError {
    CloudInitError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// NoCloud files for the `cloudInitNoCloud` volume `volume_name` of `vmi`.
///
/// `secrets_dir` is where the pod mounts cloud-init secrets (`Paths::secrets_dir`,
/// `/var/run/kubevirt-private/secret` in a real pod).
pub fn nocloud_data(
    vmi: &VirtualMachineInstance,
    volume_name: &str,
    source: &CloudInitSource,
    secrets_dir: &Path,
) -> Result<CloudInitData, CloudInitError> {
    let (user_data, network_data) = user_and_network_data(volume_name, source, secrets_dir)?;
    let keys = public_keys(vmi, "noCloud", secrets_dir)?;
    let meta = GoJsonObject::new()
        .string_omitempty("instance-type", &instance_type(vmi))
        .string("instance-id", &instance_id(vmi))
        .string_omitempty("local-hostname", &local_hostname(vmi)?)
        .string_map_omitempty("public-keys", &keys)
        .finish();
    Ok(CloudInitData {
        user_data,
        meta_data: meta.into_bytes(),
        network_config: network_data,
    })
}

/// ConfigDrive files for the `cloudInitConfigDrive` volume `volume_name` of `vmi`.
///
/// `meta_data.json` carries no `devices` list: that needs tagged host devices, which this launcher
/// does not pass through.
pub fn config_drive_data(
    vmi: &VirtualMachineInstance,
    volume_name: &str,
    source: &CloudInitSource,
    secrets_dir: &Path,
) -> Result<CloudInitData, CloudInitError> {
    let (user_data, network_data) = user_and_network_data(volume_name, source, secrets_dir)?;
    let keys = public_keys(vmi, "configDrive", secrets_dir)?;
    let name = vmi_name(vmi)?;
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    // KubeVirt never fills `local_hostname` for config drives; `hostname` carries it.
    let meta = GoJsonObject::new()
        .string_omitempty("instance_type", &instance_type(vmi))
        .string("instance_id", &format!("{name}.{namespace}"))
        .string_omitempty("hostname", &local_hostname(vmi)?)
        .string_omitempty("uuid", &instance_id(vmi))
        .string_map_omitempty("public_keys", &keys)
        .finish();
    Ok(CloudInitData {
        user_data,
        meta_data: meta.into_bytes(),
        network_config: network_data,
    })
}

/// Writes the NoCloud image (`cidata`: `user-data`, `meta-data`, `network-config` when present).
pub fn write_nocloud_iso(data: &CloudInitData, iso_path: &Path) -> Result<(), CloudInitError> {
    check_sizes(data)?;
    let mut entries = vec![
        iso_file("user-data", &data.user_data),
        iso_file("meta-data", &data.meta_data),
    ];
    if let Some(network) = &data.network_config {
        entries.push(iso_file("network-config", network));
    }
    let image = build_iso_image(NOCLOUD_VOLUME_ID, entries)?;
    write_atomically(&image, iso_path)
}

/// Writes the ConfigDrive image (`config-2`: `openstack/latest/{meta_data.json,user_data,network_data.json}`).
pub fn write_config_drive_iso(data: &CloudInitData, iso_path: &Path) -> Result<(), CloudInitError> {
    check_sizes(data)?;
    let mut latest = vec![
        iso_file("meta_data.json", &data.meta_data),
        iso_file("user_data", &data.user_data),
    ];
    if let Some(network) = &data.network_config {
        latest.push(iso_file("network_data.json", network));
    }
    let tree = vec![iso_dir("openstack", vec![iso_dir("latest", latest)])];
    let image = build_iso_image(CONFIG_DRIVE_VOLUME_ID, tree)?;
    write_atomically(&image, iso_path)
}

/// `<cloud_init_dir>/<namespace>/<vmi>/{noCloud,configdrive}.iso`.
pub fn iso_path(
    cloud_init_dir: &Path,
    source: DataSource,
    namespace: &PathName,
    vmi_name: &PathName,
) -> PathBuf {
    cloud_init_dir
        .join(namespace)
        .join(vmi_name)
        .join(source.iso_file_name())
}

/// Builds the image of the VMI's cloud-init volume, if it has one.
///
/// Like KubeVirt, only the first `cloudInitNoCloud`/`cloudInitConfigDrive` volume counts.
/// Returns `None` when the VMI has no cloud-init volume.
pub fn prepare_cloud_init_disk(
    vmi: &VirtualMachineInstance,
    secrets_dir: &Path,
    cloud_init_dir: &Path,
) -> Result<Option<CloudInitDisk>, CloudInitError> {
    let found = vmi.spec.volumes.iter().find_map(|volume| {
        if let Some(source) = &volume.cloud_init_no_cloud {
            Some((volume, source, DataSource::NoCloud))
        } else {
            volume
                .cloud_init_config_drive
                .as_ref()
                .map(|source| (volume, source, DataSource::ConfigDrive))
        }
    });
    let Some((volume, source, kind)) = found else {
        return Ok(None);
    };
    let name = vmi_name(vmi)?;
    let namespace = vmi.metadata.namespace.as_deref().unwrap_or_default();
    let name = check_path_component("the VMI name", name)?;
    let namespace = check_path_component("the VMI namespace", namespace)?;
    let path = iso_path(cloud_init_dir, kind, &namespace, &name);
    match kind {
        DataSource::NoCloud => {
            let data = nocloud_data(vmi, &volume.name, source, secrets_dir)?;
            write_nocloud_iso(&data, &path)?;
        }
        DataSource::ConfigDrive => {
            let data = config_drive_data(vmi, &volume.name, source, secrets_dir)?;
            write_config_drive_iso(&data, &path)?;
        }
    }
    Ok(Some(CloudInitDisk {
        volume_name: volume.name.clone(),
        source: kind,
        iso_path: path,
    }))
}

// ---------------------------------------------------------------------------------------------
// User and network data

/// Resolves user and network data with KubeVirt's precedence: a non-empty secret file, then the
/// inline field, then the base64 field.
fn user_and_network_data(
    volume_name: &str,
    source: &CloudInitSource,
    secrets_dir: &Path,
) -> Result<(Vec<u8>, Option<Vec<u8>>), CloudInitError> {
    let volume = PathName::volume(volume_name).map_err(|_| CloudInitError::InvalidName {
        what: "a cloud-init volume",
        name: volume_name.to_string(),
    })?;
    let secret_dir = secrets_dir.join(&volume);

    let user_secret = match source.secret_ref {
        Some(_) => Some(read_first_secret_file(
            &secret_dir,
            &["userdata", "userData"],
        )?),
        None => None,
    };
    let network_secret = match source.network_data_secret_ref {
        Some(_) => Some(read_first_secret_file(
            &secret_dir,
            &["networkdata", "networkData"],
        )?),
        None => None,
    };
    // KubeVirt gives up only when every referenced secret is unreadable: a secret shared by
    // `secretRef` and `networkDataSecretRef` may well hold only `userdata`.
    if let (Some(Err(user_tried)), Some(Err(network_tried))) = (&user_secret, &network_secret) {
        return Err(CloudInitError::NoSecretData {
            volume: volume_name.to_string(),
            tried: user_tried.iter().chain(network_tried).cloned().collect(),
        });
    }
    let mut unreadable = Vec::new();
    let mut from_secret = |secret: Option<Result<Vec<u8>, Vec<PathBuf>>>| match secret {
        Some(Ok(data)) if !data.is_empty() => Some(data),
        Some(Err(tried)) => {
            unreadable.extend(tried);
            None
        }
        _ => None,
    };
    let user_from_secret = from_secret(user_secret);
    let network_from_secret = from_secret(network_secret);

    let user_data = match user_from_secret {
        Some(data) => data,
        None => raw_or_base64(
            volume_name,
            source.user_data.as_deref(),
            source.user_data_base64.as_deref(),
            "userDataBase64",
        )?,
    };
    let network_data = match network_from_secret {
        Some(data) => data,
        None => raw_or_base64(
            volume_name,
            source.network_data.as_deref(),
            source.network_data_base64.as_deref(),
            "networkDataBase64",
        )?,
    };
    if user_data.is_empty() && network_data.is_empty() {
        return Err(CloudInitError::MissingData {
            volume: volume_name.to_string(),
            unreadable_secrets: unreadable,
        });
    }
    let network_data = (!network_data.is_empty()).then_some(network_data);
    Ok((user_data, network_data))
}

/// The inline value when non-empty, else the decoded base64 value, else empty.
fn raw_or_base64(
    volume_name: &str,
    raw: Option<&str>,
    base64_text: Option<&str>,
    base64_field: &'static str,
) -> Result<Vec<u8>, CloudInitError> {
    if let Some(raw) = raw.filter(|r| !r.is_empty()) {
        check_len(raw.len(), || {
            format!("inline data of cloud-init volume {volume_name:?}")
        })?;
        return Ok(raw.as_bytes().to_vec());
    }
    let Some(text) = base64_text.filter(|t| !t.is_empty()) else {
        return Ok(Vec::new());
    };
    // Go's base64.StdEncoding skips line breaks, requires padding and ignores non-zero
    // trailing bits; decode the same set of inputs.
    let compact: Vec<u8> = text
        .bytes()
        .filter(|b| *b != b'\n' && *b != b'\r')
        .collect();
    check_len(compact.len() / 4 * 3, || {
        format!("{base64_field} of cloud-init volume {volume_name:?}")
    })?;
    const GO_STD_ENCODING: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_allow_trailing_bits(true)
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::RequireCanonical),
    );
    GO_STD_ENCODING
        .decode(&compact)
        .map_err(|source| CloudInitError::InvalidBase64 {
            volume: volume_name.to_string(),
            field: base64_field,
            source,
        })
}

/// Reads the first readable file of `names` in `dir`; on failure, the paths that were tried.
/// A file over [`MAX_INPUT_BYTES`] is an error of its own, not a miss.
fn read_first_secret_file(
    dir: &Path,
    names: &[&str],
) -> Result<Result<Vec<u8>, Vec<PathBuf>>, CloudInitError> {
    let mut tried = Vec::new();
    for name in names {
        let path = dir.join(name);
        match read_capped(&path) {
            Ok(data) => return Ok(Ok(data)),
            Err(CloudInitError::Io { .. }) => tried.push(path),
            Err(other) => return Err(other),
        }
    }
    Ok(Err(tried))
}

/// Reads a whole file, refusing one over [`MAX_INPUT_BYTES`] without reading it all.
fn read_capped(path: &Path) -> Result<Vec<u8>, CloudInitError> {
    let file = fs::File::open(path).map_err(|e| io_error("opening", path, e))?;
    let mut data = Vec::new();
    // One byte more than the cap tells "exactly at the cap" from "over it".
    file.take(MAX_INPUT_BYTES as u64 + 1)
        .read_to_end(&mut data)
        .map_err(|e| io_error("reading", path, e))?;
    check_len(data.len(), || path.display().to_string())?;
    Ok(data)
}

fn check_len(len: usize, what: impl FnOnce() -> String) -> Result<(), CloudInitError> {
    if len > MAX_INPUT_BYTES {
        return Err(CloudInitError::TooLarge {
            what: what(),
            limit: MAX_INPUT_BYTES,
        });
    }
    Ok(())
}

/// Names from the VMI end up as path components: refuse anything that could leave the directory.
/// `name` as one file name in a directory of the pod ([`PathName::component`]).
fn check_path_component(what: &'static str, name: &str) -> Result<PathName, CloudInitError> {
    PathName::component(what, name).map_err(|_| CloudInitError::InvalidName {
        what,
        name: name.to_string(),
    })
}

// ---------------------------------------------------------------------------------------------
// Meta data

fn vmi_name(vmi: &VirtualMachineInstance) -> Result<&str, CloudInitError> {
    vmi.metadata
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .ok_or(CloudInitError::MissingVmiName)
}

/// The cluster instancetype annotation wins over the namespaced one.
fn instance_type(vmi: &VirtualMachineInstance) -> String {
    let annotations = vmi.metadata.annotations.as_ref();
    let get = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
            .cloned()
    };
    get("kubevirt.io/cluster-instancetype-name")
        .or_else(|| get("kubevirt.io/instancetype-name"))
        .unwrap_or_default()
}

/// `spec.domain.firmware.uuid`, else a fresh random UUID.
///
/// KubeVirt's API server always fills `firmware.uuid`; where it is missing KubeVirt would write
/// an empty id for a VMI that has a `firmware` block, which cloud-init cannot track, so a random
/// one is used in both cases.
fn instance_id(vmi: &VirtualMachineInstance) -> String {
    vmi.spec
        .domain
        .firmware
        .as_ref()
        .and_then(|f| f.uuid.clone())
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| uuid::Uuid::new_v4().to_string())
}

/// `spec.hostname`, else the VMI name up to its first dot, cut to a 63-byte DNS label.
fn local_hostname(vmi: &VirtualMachineInstance) -> Result<String, CloudInitError> {
    if let Some(hostname) = vmi.spec.hostname.as_deref().filter(|h| !h.is_empty()) {
        return Ok(hostname.to_string());
    }
    let name = vmi_name(vmi)?;
    let label = name.split('.').next().unwrap_or_default();
    let mut end = label.len().min(63);
    // Kubernetes names are ASCII; stay on a character boundary anyway.
    while !label.is_char_boundary(end) {
        end -= 1;
    }
    Ok(label[..end].to_string())
}

/// SSH public keys of the access credentials propagated through `method` (`noCloud` or
/// `configDrive`), numbered "0", "1", ... in credential order and file-name order.
fn public_keys(
    vmi: &VirtualMachineInstance,
    method: &str,
    secrets_dir: &Path,
) -> Result<BTreeMap<String, String>, CloudInitError> {
    let mut keys = BTreeMap::new();
    let Some(credentials) = vmi.spec.extra.get("accessCredentials") else {
        return Ok(keys);
    };
    let credentials = match credentials {
        Value::Array(items) => items.as_slice(),
        Value::Null => &[],
        _ => {
            return Err(CloudInitError::InvalidAccessCredentials(
                "not a list".to_string(),
            ));
        }
    };
    for credential in credentials {
        let Some(ssh) = credential.get("sshPublicKey").filter(|v| !v.is_null()) else {
            continue;
        };
        let propagated = ssh
            .get("propagationMethod")
            .and_then(|m| m.get(method))
            .is_some_and(|v| !v.is_null());
        if !propagated {
            continue;
        }
        let secret_name = match ssh.pointer("/source/secret/secretName") {
            None | Some(Value::Null) => continue,
            Some(Value::String(name)) if name.is_empty() => continue,
            Some(Value::String(name)) => name,
            Some(_) => {
                return Err(CloudInitError::InvalidAccessCredentials(
                    "sshPublicKey.source.secret.secretName is not a string".to_string(),
                ));
            }
        };
        let secret = check_path_component("an access credential secret", secret_name)?;
        let dir = secrets_dir.join(format!("{secret}-access-cred"));
        let mut files = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| io_error("listing", &dir, e))? {
            let entry = entry.map_err(|e| io_error("listing", &dir, e))?;
            let file_name = entry.file_name().to_string_lossy().into_owned();
            // `..data` and `..<timestamp>` are the secret volume's own bookkeeping.
            if file_name.starts_with("..") {
                continue;
            }
            let file_type = entry
                .file_type()
                .map_err(|e| io_error("inspecting", &entry.path(), e))?;
            if file_type.is_dir() {
                continue;
            }
            files.push((file_name, entry.path()));
        }
        files.sort();
        for (_, path) in files {
            let data = read_capped(&path)?;
            if data.is_empty() {
                continue;
            }
            keys.insert(
                keys.len().to_string(),
                String::from_utf8_lossy(&data).into_owned(),
            );
        }
    }
    Ok(keys)
}

/// A JSON object written the way Go's `encoding/json` marshals a struct: fields in declaration
/// order, no spaces, `<`, `>`, `&`, U+2028 and U+2029 escaped, map keys sorted.
struct GoJsonObject {
    out: String,
}

impl GoJsonObject {
    fn new() -> Self {
        Self {
            out: String::from("{"),
        }
    }

    fn key(&mut self, key: &str) {
        if self.out.len() > 1 {
            self.out.push(',');
        }
        go_json_string(&mut self.out, key);
        self.out.push(':');
    }

    fn string(mut self, key: &str, value: &str) -> Self {
        self.key(key);
        go_json_string(&mut self.out, value);
        self
    }

    fn string_omitempty(self, key: &str, value: &str) -> Self {
        if value.is_empty() {
            self
        } else {
            self.string(key, value)
        }
    }

    /// A `map[string]string`: Go sorts the keys byte-wise, as `BTreeMap<String, _>` iterates.
    fn string_map_omitempty(mut self, key: &str, map: &BTreeMap<String, String>) -> Self {
        if map.is_empty() {
            return self;
        }
        self.key(key);
        let mut inner = GoJsonObject::new();
        for (k, v) in map {
            inner = inner.string(k, v);
        }
        self.out.push_str(&inner.finish());
        self
    }

    fn finish(mut self) -> String {
        self.out.push('}');
        self.out
    }
}

fn go_json_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

// ---------------------------------------------------------------------------------------------
// ISO image

/// Fixed POSIX metadata: the image must not depend on who or when built it.
const ISO_FILE_METADATA: InputMetadata = InputMetadata {
    mode: Some(0o644),
    uid: Some(0),
    gid: Some(0),
    created: None,
    modified: None,
    accessed: None,
};
const ISO_DIR_METADATA: InputMetadata = InputMetadata {
    mode: Some(0o755),
    ..ISO_FILE_METADATA
};

fn iso_file(name: &str, contents: &[u8]) -> InputEntry {
    InputEntry::file(name, contents.to_vec()).with_metadata(ISO_FILE_METADATA)
}

fn iso_dir(name: &str, children: Vec<InputEntry>) -> InputEntry {
    InputEntry::directory(name, children).with_metadata(ISO_DIR_METADATA)
}

fn check_sizes(data: &CloudInitData) -> Result<(), CloudInitError> {
    check_len(data.user_data.len(), || "user data".to_string())?;
    check_len(data.meta_data.len(), || "meta data".to_string())?;
    if let Some(network) = &data.network_config {
        check_len(network.len(), || "network data".to_string())?;
    }
    Ok(())
}

fn build_iso_image(volume_id: &str, entries: Vec<InputEntry>) -> Result<Vec<u8>, CloudInitError> {
    let options = IsoFormatOptions {
        volume_name: volume_id.to_string(),
        system_id: None,
        volume_set_id: None,
        publisher_id: None,
        preparer_id: None,
        application_id: None,
        sector_size: SECTOR_SIZE,
        path_separator: PathSeparator::ForwardSlash,
        // Keep the lower-case volume id: cloud-init matches `cidata`/`config-2` as written
        // (xorrisofs stores it as given too).
        strict_charset: false,
        features: CreationFeatures {
            filenames: BaseIsoLevel::Level1 {
                supports_lowercase: false,
                supports_rrip: true,
            },
            long_filenames: false,
            joliet: Some(JolietLevel::Level3),
            // No TF (timestamp) entries: they would carry the build time.
            rock_ridge: Some(RripOptions {
                preserve_timestamps: false,
                ..RripOptions::default()
            }),
            el_torito: None,
            hybrid_boot: None,
        },
    };
    let tree = InputTree::new(PathSeparator::ForwardSlash, entries);
    let mut image = IsoImageWriter::create(Cursor::new(Vec::new()), tree, options)
        .map_err(|e| CloudInitError::IsoBuild(e.to_string()))?
        .into_inner();
    pin_timestamps_and_pad(&mut image).map_err(CloudInitError::IsoBuild)?;
    Ok(image)
}

const SECTOR_SIZE: usize = 2048;
/// Images are padded to whole MiB, as `xorrisofs -partition_cyl_align on` does for KubeVirt
/// (64 heads x 32 sectors x 512 bytes per cylinder).
const IMAGE_ALIGNMENT: usize = 1 << 20;
/// 1970-01-01 00:00:00 UTC in a directory record (years since 1900, month, day, h, m, s, UTC offset).
const PINNED_RECORD_TIME: [u8; 7] = [70, 1, 1, 0, 0, 0, 0];
/// 1970-01-01 00:00:00.00 UTC in a volume descriptor (16 digits, then the UTC offset).
const PINNED_VOLUME_TIME: &[u8; 17] = b"1970010100000000\0";

// ECMA-119 offsets used below.
const DESCRIPTOR_SET_START: usize = 16;
const DESCRIPTOR_TYPE_PRIMARY: u8 = 1;
const DESCRIPTOR_TYPE_SUPPLEMENTARY: u8 = 2;
const DESCRIPTOR_TYPE_TERMINATOR: u8 = 255;
const DESCRIPTOR_VOLUME_SPACE_SIZE: usize = 80;
const DESCRIPTOR_ROOT_RECORD: usize = 156;
const DESCRIPTOR_CREATION_TIME: usize = 813;
const DESCRIPTOR_MODIFICATION_TIME: usize = 830;
const RECORD_EXTENT: usize = 2;
const RECORD_DATA_LENGTH: usize = 10;
const RECORD_TIME: usize = 18;
const RECORD_FLAGS: usize = 25;
const RECORD_NAME_LENGTH: usize = 32;
const RECORD_NAME: usize = 33;
const RECORD_FLAG_DIRECTORY: u8 = 0x02;
/// Guards against a descriptor set without a terminator.
const MAX_DESCRIPTORS: usize = 32;

/// Rewrites every creation/modification date of the volume descriptors and every directory
/// record date of every hierarchy (ISO9660 and Joliet) to the Unix epoch, pads the image to
/// [`IMAGE_ALIGNMENT`] and records the padded size in the descriptors.
///
/// Errors (never panics) if the image is not laid out as ECMA-119 says.
fn pin_timestamps_and_pad(image: &mut Vec<u8>) -> Result<(), String> {
    let padded_len = image.len().div_ceil(IMAGE_ALIGNMENT) * IMAGE_ALIGNMENT;
    image.resize(padded_len, 0);
    let sectors = u32::try_from(padded_len / SECTOR_SIZE)
        .map_err(|_| "image too large for ISO9660".to_string())?;

    let mut roots = Vec::new();
    let mut terminated = false;
    for index in 0..MAX_DESCRIPTORS {
        let start = (DESCRIPTOR_SET_START + index) * SECTOR_SIZE;
        let descriptor = image
            .get_mut(start..start + SECTOR_SIZE)
            .ok_or_else(|| format!("volume descriptor {index} lies past the end of the image"))?;
        if &descriptor[1..6] != b"CD001" {
            return Err(format!(
                "volume descriptor {index} lacks the CD001 identifier"
            ));
        }
        match descriptor[0] {
            DESCRIPTOR_TYPE_TERMINATOR => {
                terminated = true;
                break;
            }
            DESCRIPTOR_TYPE_PRIMARY | DESCRIPTOR_TYPE_SUPPLEMENTARY => {
                put_both_endian_u32(&mut descriptor[DESCRIPTOR_VOLUME_SPACE_SIZE..], sectors);
                descriptor[DESCRIPTOR_CREATION_TIME..DESCRIPTOR_CREATION_TIME + 17]
                    .copy_from_slice(PINNED_VOLUME_TIME);
                descriptor[DESCRIPTOR_MODIFICATION_TIME..DESCRIPTOR_MODIFICATION_TIME + 17]
                    .copy_from_slice(PINNED_VOLUME_TIME);
                let root = &mut descriptor[DESCRIPTOR_ROOT_RECORD..DESCRIPTOR_ROOT_RECORD + 34];
                root[RECORD_TIME..RECORD_TIME + 7].copy_from_slice(&PINNED_RECORD_TIME);
                roots.push((
                    le_u32(root, RECORD_EXTENT)?,
                    le_u32(root, RECORD_DATA_LENGTH)?,
                ));
            }
            _ => {}
        }
    }
    if !terminated {
        return Err("no volume descriptor set terminator".to_string());
    }

    // Depth-first over directory extents; `visited` stops cycles in a damaged tree.
    let mut pending = roots;
    let mut visited = HashSet::new();
    while let Some((extent, length)) = pending.pop() {
        if !visited.insert(extent) {
            continue;
        }
        let start = usize::try_from(extent)
            .ok()
            .and_then(|e| e.checked_mul(SECTOR_SIZE))
            .ok_or_else(|| format!("directory extent {extent} out of range"))?;
        let end = start
            .checked_add(int_cast::u32_to_usize(length))
            .filter(|end| *end <= image.len())
            .ok_or_else(|| {
                format!("directory at sector {extent} runs past the end of the image")
            })?;
        let mut pos = start;
        while pos < end {
            let record_len = usize::from(image[pos]);
            if record_len == 0 {
                // Records never straddle sectors; the rest of this sector is padding.
                pos = (pos / SECTOR_SIZE + 1) * SECTOR_SIZE;
                continue;
            }
            let record = image
                .get_mut(pos..pos + record_len)
                .filter(|r| r.len() > RECORD_NAME && pos + record_len <= end)
                .ok_or_else(|| format!("malformed directory record at byte {pos}"))?;
            record[RECORD_TIME..RECORD_TIME + 7].copy_from_slice(&PINNED_RECORD_TIME);
            let name_len = usize::from(record[RECORD_NAME_LENGTH]);
            let name = record
                .get(RECORD_NAME..RECORD_NAME + name_len)
                .ok_or_else(|| {
                    format!("directory record name overruns the record at byte {pos}")
                })?;
            let is_self_or_parent = name == [0] || name == [1];
            if record[RECORD_FLAGS] & RECORD_FLAG_DIRECTORY != 0 && !is_self_or_parent {
                pending.push((
                    le_u32(record, RECORD_EXTENT)?,
                    le_u32(record, RECORD_DATA_LENGTH)?,
                ));
            }
            pos += record_len;
        }
    }
    Ok(())
}

fn le_u32(bytes: &[u8], offset: usize) -> Result<u32, String> {
    bytes
        .get(offset..offset + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| format!("truncated field at offset {offset}"))
}

/// ECMA-119 "both-byte orders" field: little-endian then big-endian.
fn put_both_endian_u32(field: &mut [u8], value: u32) {
    field[..4].copy_from_slice(&value.to_le_bytes());
    field[4..8].copy_from_slice(&value.to_be_bytes());
}

/// Writes `<iso_path>.staging`, flushes it, then renames it over `iso_path`.
fn write_atomically(image: &[u8], iso_path: &Path) -> Result<(), CloudInitError> {
    let mut staging = iso_path.as_os_str().to_owned();
    staging.push(".staging");
    let staging = PathBuf::from(staging);
    if let Some(parent) = iso_path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(|e| io_error("creating directory", parent, e))?;
    }
    match fs::remove_file(&staging) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_error("removing stale", &staging, e)),
    }
    let result = (|| {
        let mut file = fs::File::create(&staging).map_err(|e| io_error("creating", &staging, e))?;
        file.write_all(image)
            .and_then(|()| file.sync_all())
            .map_err(|e| io_error("writing", &staging, e))?;
        fs::rename(&staging, iso_path).map_err(|e| io_error("renaming into place", &staging, e))
    })();
    if result.is_err() {
        // Best effort: a half-written staging file is useless to anyone.
        let _ = fs::remove_file(&staging);
    }
    result
}
