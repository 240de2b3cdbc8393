//! The qcow2 header: parse and validate the first cluster, serialize new ones.
//!
//! Layout facts come from the qcow2 specification (docs/interop/qcow2.txt in
//! QEMU). Everything here works on a byte slice, so a hostile header can only
//! produce an error: every offset and count is checked before it is used.

use int_cast::usize_to_u64;
use int_cast::{u32_to_usize, u64_to_usize};
use std::fmt;

pub const MAGIC: u32 = 0x5146_49fb; // "QFI\xfb"
pub(crate) const V2_HEADER_LEN: u32 = 72;
pub(crate) const V3_HEADER_LEN: u32 = 104;
/// Header length QEMU writes for v3 (includes the compression type byte and padding).
pub(crate) const V3_HEADER_LEN_WITH_COMPRESSION: u32 = 112;

pub(crate) const MIN_CLUSTER_BITS: u32 = 9;
pub(crate) const MAX_CLUSTER_BITS: u32 = 21;
/// Largest L1 table QEMU accepts (32 MiB); bounds our memory too.
pub(crate) const MAX_L1_BYTES: u64 = 32 << 20;
/// Largest refcount table QEMU accepts (8 MiB).
pub(crate) const MAX_REFTABLE_BYTES: u64 = 8 << 20;
/// QEMU refuses backing file names longer than this.
pub(crate) const MAX_BACKING_NAME: u32 = 1023;

pub(crate) const EXT_END: u32 = 0;
pub(crate) const EXT_BACKING_FORMAT: u32 = 0xe279_2aca;
pub(crate) const EXT_FEATURE_NAMES: u32 = 0x6803_f857;
pub const EXT_BITMAPS: u32 = 0x2385_2875;
pub(crate) const EXT_CRYPTO: u32 = 0x0537_be77;
pub(crate) const EXT_DATA_FILE: u32 = 0x4441_5441;

pub(crate) const INCOMPAT_DIRTY: u64 = 1 << 0;
pub(crate) const INCOMPAT_CORRUPT: u64 = 1 << 1;
pub(crate) const INCOMPAT_DATA_FILE: u64 = 1 << 2;
pub(crate) const INCOMPAT_COMPRESSION: u64 = 1 << 3;
pub const INCOMPAT_EXTL2: u64 = 1 << 4;
/// Incompatible bits this engine implements.
pub(crate) const INCOMPAT_SUPPORTED: u64 = INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_COMPRESSION;

pub(crate) const COMPAT_LAZY_REFCOUNTS: u64 = 1 << 0;

pub const AUTOCLEAR_BITMAPS: u64 = 1 << 0;
pub const AUTOCLEAR_DATA_FILE_RAW: u64 = 1 << 1;

// Field offsets inside the header, for in-place updates.
pub(crate) const OFF_L1_SIZE: u64 = 36;
pub const OFF_L1_TABLE_OFFSET: u64 = 40;
pub(crate) const OFF_REFTABLE_OFFSET: u64 = 48;
pub(crate) const OFF_INCOMPAT: u64 = 72;
pub(crate) const OFF_AUTOCLEAR: u64 = 88;

/// Why a header was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("not a qcow2 image (bad magic)")]
    BadMagic,
    #[error("image is truncated: header needs {0} bytes")]
    Truncated(u64),
    #[error("unsupported qcow2 version {0} (only 2 and 3)")]
    Version(u32),
    #[error("invalid header: {0}")]
    Invalid(String),
    #[error("unsupported feature: {0}")]
    Unsupported(String),
}

fn invalid(msg: impl Into<String>) -> HeaderError {
    HeaderError::Invalid(msg.into())
}

/// Compression algorithm for compressed clusters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressionType {
    Zlib,
    Zstd,
}

impl fmt::Display for CompressionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CompressionType::Zlib => "zlib",
            CompressionType::Zstd => "zstd",
        })
    }
}

/// One entry of the feature name table extension.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FeatureName {
    /// 0 = incompatible, 1 = compatible, 2 = autoclear.
    pub kind: u8,
    pub bit: u8,
    pub name: String,
}

/// A header extension this engine does not interpret, kept byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawExtension {
    pub kind: u32,
    pub data: Vec<u8>,
}

/// A parsed and validated qcow2 header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u32,
    pub backing_file_offset: u64,
    pub backing_file_size: u32,
    pub cluster_bits: u32,
    pub size: u64,
    pub crypt_method: u32,
    pub l1_size: u32,
    pub l1_table_offset: u64,
    pub refcount_table_offset: u64,
    pub refcount_table_clusters: u32,
    pub nb_snapshots: u32,
    pub snapshots_offset: u64,
    pub incompatible_features: u64,
    pub compatible_features: u64,
    pub autoclear_features: u64,
    pub refcount_order: u32,
    pub header_length: u32,
    pub compression_type: CompressionType,
    pub backing_file: Option<String>,
    pub backing_format: Option<String>,
    pub feature_names: Vec<FeatureName>,
    pub data_file: Option<String>,
    /// Extensions kept as they are (bitmaps, unknown ones).
    pub other_extensions: Vec<RawExtension>,
}

fn be32(buf: &[u8], off: usize) -> Result<u32, HeaderError> {
    buf.get(off..off + 4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or(HeaderError::Truncated(usize_to_u64(off) + 4))
}

fn be64(buf: &[u8], off: usize) -> Result<u64, HeaderError> {
    let hi = u64::from(be32(buf, off)?);
    let lo = u64::from(be32(buf, off + 4)?);
    Ok(hi << 32 | lo)
}

/// Bytes covered by one L2 table, given the cluster size.
pub(crate) fn l2_coverage(cluster_bits: u32) -> u64 {
    // An L2 table is one cluster of 8-byte entries, each mapping one cluster.
    (1u64 << (cluster_bits - 3)) << cluster_bits
}

/// Number of L1 entries needed for a disk of `size` bytes.
pub(crate) fn l1_entries_for(size: u64, cluster_bits: u32) -> u64 {
    size.div_ceil(l2_coverage(cluster_bits))
}

/// Reads the cluster size from the first bytes of an image, so the caller
/// knows how much to read before calling [`Header::parse`].
pub(crate) fn peek_cluster_bits(buf: &[u8]) -> Result<u32, HeaderError> {
    if be32(buf, 0)? != MAGIC {
        return Err(HeaderError::BadMagic);
    }
    let bits = be32(buf, 20)?;
    if !(MIN_CLUSTER_BITS..=MAX_CLUSTER_BITS).contains(&bits) {
        return Err(invalid(format!(
            "cluster_bits {bits} outside {MIN_CLUSTER_BITS}..={MAX_CLUSTER_BITS}"
        )));
    }
    Ok(bits)
}

impl Header {
    pub fn cluster_size(&self) -> u64 {
        1 << self.cluster_bits
    }

    pub fn refcount_bits(&self) -> u32 {
        1 << self.refcount_order
    }

    pub fn lazy_refcounts(&self) -> bool {
        self.compatible_features & COMPAT_LAZY_REFCOUNTS != 0
    }

    pub fn is_dirty(&self) -> bool {
        self.incompatible_features & INCOMPAT_DIRTY != 0
    }

    pub fn is_corrupt(&self) -> bool {
        self.incompatible_features & INCOMPAT_CORRUPT != 0
    }

    /// Parses the header from the image's first cluster (`cluster0` may be
    /// shorter when the file is). Checks everything that can be checked
    /// without the file: field ranges, alignment, the extension chain, the
    /// backing name's position and features we do not implement.
    pub fn parse(cluster0: &[u8]) -> Result<Header, HeaderError> {
        let cluster_bits = peek_cluster_bits(cluster0)?;
        let cluster_size = 1u64 << cluster_bits;
        let version = be32(cluster0, 4)?;
        if version != 2 && version != 3 {
            return Err(HeaderError::Version(version));
        }
        let mut h = Header {
            version,
            backing_file_offset: be64(cluster0, 8)?,
            backing_file_size: be32(cluster0, 16)?,
            cluster_bits,
            size: be64(cluster0, 24)?,
            crypt_method: be32(cluster0, 32)?,
            l1_size: be32(cluster0, 36)?,
            l1_table_offset: be64(cluster0, 40)?,
            refcount_table_offset: be64(cluster0, 48)?,
            refcount_table_clusters: be32(cluster0, 56)?,
            nb_snapshots: be32(cluster0, 60)?,
            snapshots_offset: be64(cluster0, 64)?,
            incompatible_features: 0,
            compatible_features: 0,
            autoclear_features: 0,
            refcount_order: 4,
            header_length: V2_HEADER_LEN,
            compression_type: CompressionType::Zlib,
            backing_file: None,
            backing_format: None,
            feature_names: Vec::new(),
            data_file: None,
            other_extensions: Vec::new(),
        };
        if version == 3 {
            h.incompatible_features = be64(cluster0, 72)?;
            h.compatible_features = be64(cluster0, 80)?;
            h.autoclear_features = be64(cluster0, 88)?;
            h.refcount_order = be32(cluster0, 96)?;
            h.header_length = be32(cluster0, 100)?;
            if h.header_length < V3_HEADER_LEN {
                return Err(invalid(format!("header_length {} < 104", h.header_length)));
            }
            if u64::from(h.header_length) > cluster_size {
                return Err(invalid("header_length larger than a cluster"));
            }
            if h.header_length > V3_HEADER_LEN {
                let byte = *cluster0.get(104).ok_or(HeaderError::Truncated(105))?;
                h.compression_type = match byte {
                    0 => CompressionType::Zlib,
                    1 => CompressionType::Zstd,
                    other => {
                        return Err(HeaderError::Unsupported(format!(
                            "compression type {other}"
                        )));
                    }
                };
            }
            if (h.compression_type != CompressionType::Zlib)
                != (h.incompatible_features & INCOMPAT_COMPRESSION != 0)
            {
                return Err(invalid(
                    "compression type and its incompatible feature bit disagree",
                ));
            }
        }
        if h.refcount_order > 6 {
            return Err(invalid(format!(
                "refcount_order {} (refcounts wider than 64 bits)",
                h.refcount_order
            )));
        }
        h.parse_extensions(cluster0)?;
        h.parse_backing_name(cluster0)?;
        h.validate_fields()?;
        Ok(h)
    }

    fn parse_extensions(&mut self, cluster0: &[u8]) -> Result<(), HeaderError> {
        let cluster_size = u64_to_usize(self.cluster_size());
        let mut off = u32_to_usize(self.header_length);
        loop {
            // The extension area ends at the end of the first cluster.
            if off + 8 > cluster_size {
                return Err(invalid("header extensions run past the first cluster"));
            }
            let kind = be32(cluster0, off)?;
            let len = u32_to_usize(be32(cluster0, off + 4)?);
            if kind == EXT_END {
                return Ok(());
            }
            let start = off + 8;
            let end = start
                .checked_add(len)
                .filter(|&e| e <= cluster_size)
                .ok_or_else(|| invalid("header extension runs past the first cluster"))?;
            let data = cluster0
                .get(start..end)
                .ok_or(HeaderError::Truncated(usize_to_u64(end)))?;
            match kind {
                EXT_BACKING_FORMAT => {
                    let fmt = std::str::from_utf8(data)
                        .map_err(|_| invalid("backing format is not UTF-8"))?;
                    self.backing_format = Some(fmt.trim_end_matches('\0').to_string());
                }
                EXT_FEATURE_NAMES => {
                    for entry in data.chunks_exact(48) {
                        let name_bytes = &entry[2..];
                        let name_len = name_bytes.iter().position(|&b| b == 0).unwrap_or(46);
                        self.feature_names.push(FeatureName {
                            kind: entry[0],
                            bit: entry[1],
                            name: String::from_utf8_lossy(&name_bytes[..name_len]).into_owned(),
                        });
                    }
                }
                EXT_DATA_FILE => {
                    self.data_file = Some(String::from_utf8_lossy(data).into_owned());
                }
                EXT_CRYPTO => {
                    return Err(HeaderError::Unsupported(
                        "encryption (full disk encryption header)".into(),
                    ));
                }
                _ => self.other_extensions.push(RawExtension {
                    kind,
                    data: data.to_vec(),
                }),
            }
            // Extension data is padded to 8 bytes.
            off = start + len.div_ceil(8) * 8;
        }
    }

    fn parse_backing_name(&mut self, cluster0: &[u8]) -> Result<(), HeaderError> {
        if self.backing_file_offset == 0 {
            if self.backing_file_size != 0 {
                return Err(invalid("backing file size set without an offset"));
            }
            return Ok(());
        }
        if self.backing_file_size == 0 || self.backing_file_size > MAX_BACKING_NAME {
            return Err(invalid(format!(
                "backing file name length {} outside 1..={MAX_BACKING_NAME}",
                self.backing_file_size
            )));
        }
        let end = self
            .backing_file_offset
            .checked_add(u64::from(self.backing_file_size))
            .filter(|&e| e <= self.cluster_size())
            .ok_or_else(|| invalid("backing file name lies outside the first cluster"))?;
        let start = u64_to_usize(self.backing_file_offset);
        let name = cluster0
            .get(start..u64_to_usize(end))
            .ok_or(HeaderError::Truncated(end))?;
        let name =
            std::str::from_utf8(name).map_err(|_| invalid("backing file name is not UTF-8"))?;
        if name.contains('\0') {
            return Err(invalid("backing file name contains a NUL byte"));
        }
        self.backing_file = Some(name.to_string());
        Ok(())
    }

    fn validate_fields(&self) -> Result<(), HeaderError> {
        let cs = self.cluster_size();
        if self.crypt_method != 0 {
            return Err(HeaderError::Unsupported(format!(
                "encryption (crypt_method {})",
                self.crypt_method
            )));
        }
        let unknown = self.incompatible_features & !INCOMPAT_SUPPORTED;
        if unknown != 0 {
            return Err(HeaderError::Unsupported(
                self.describe_incompatible(unknown),
            ));
        }
        if self.version == 2 && self.refcount_order != 4 {
            return Err(invalid("version 2 images have 16-bit refcounts"));
        }
        if self.data_file.is_some() {
            return Err(HeaderError::Unsupported("external data file".into()));
        }
        let l1_needed = l1_entries_for(self.size, self.cluster_bits);
        if u64::from(self.l1_size) < l1_needed {
            return Err(invalid(format!(
                "L1 table has {} entries, disk size {} needs {l1_needed}",
                self.l1_size, self.size
            )));
        }
        if u64::from(self.l1_size) * 8 > MAX_L1_BYTES {
            return Err(invalid(format!(
                "L1 table of {} entries is larger than 32 MiB",
                self.l1_size
            )));
        }
        if self.l1_size > 0
            && (self.l1_table_offset == 0 || !self.l1_table_offset.is_multiple_of(cs))
        {
            return Err(invalid("L1 table offset is not cluster aligned"));
        }
        if self.refcount_table_offset == 0 || !self.refcount_table_offset.is_multiple_of(cs) {
            return Err(invalid("refcount table offset is not cluster aligned"));
        }
        if self.refcount_table_clusters == 0 {
            return Err(invalid("refcount table has no clusters"));
        }
        if u64::from(self.refcount_table_clusters) * cs > MAX_REFTABLE_BYTES {
            return Err(invalid("refcount table larger than 8 MiB"));
        }
        if self.nb_snapshots > 65536 {
            return Err(invalid("too many snapshots"));
        }
        if self.nb_snapshots > 0 && !self.snapshots_offset.is_multiple_of(cs) {
            return Err(invalid("snapshot table offset is not cluster aligned"));
        }
        // Tables must not overlap the header cluster or each other.
        let l1_bytes = u64::from(self.l1_size) * 8;
        let rt_bytes = u64::from(self.refcount_table_clusters) * cs;
        let l1 = (self.l1_table_offset, l1_bytes.div_ceil(cs) * cs);
        let rt = (self.refcount_table_offset, rt_bytes);
        let overlaps = |a: (u64, u64), b: (u64, u64)| {
            a.1 > 0 && b.1 > 0 && a.0 < b.0.saturating_add(b.1) && b.0 < a.0.saturating_add(a.1)
        };
        if overlaps(l1, (0, cs)) || overlaps(rt, (0, cs)) {
            return Err(invalid("a metadata table overlaps the header"));
        }
        if overlaps(l1, rt) {
            return Err(invalid("the L1 table overlaps the refcount table"));
        }
        if self.backing_file.is_some() && self.backing_file_offset < u64::from(self.header_length) {
            return Err(invalid("backing file name overlaps the header"));
        }
        Ok(())
    }

    /// Names the given incompatible bits, from the image's own feature table.
    fn describe_incompatible(&self, bits: u64) -> String {
        let mut names = Vec::new();
        for bit in 0..64u8 {
            if bits & (1 << bit) == 0 {
                continue;
            }
            let known = match 1u64 << bit {
                INCOMPAT_DATA_FILE => Some("external data file"),
                INCOMPAT_EXTL2 => Some("extended L2 entries"),
                _ => None,
            };
            let from_table = self
                .feature_names
                .iter()
                .find(|f| f.kind == 0 && f.bit == bit)
                .map(|f| f.name.clone());
            names.push(match (known, from_table) {
                (Some(k), _) => k.to_string(),
                (None, Some(n)) => n,
                (None, None) => format!("unknown incompatible feature bit {bit}"),
            });
        }
        names.join(", ")
    }

    /// Serializes the header, its extensions and the backing name into a
    /// buffer of one cluster. Offsets of the backing name are recomputed.
    pub(crate) fn to_cluster(&self) -> Result<Vec<u8>, HeaderError> {
        let cs = u64_to_usize(self.cluster_size());
        let mut out = vec![0u8; cs];
        let put32 =
            |b: &mut [u8], off: usize, v: u32| b[off..off + 4].copy_from_slice(&v.to_be_bytes());
        let put64 =
            |b: &mut [u8], off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_be_bytes());
        let header_len_field = if self.version == 2 {
            V2_HEADER_LEN
        } else {
            self.header_length.max(V3_HEADER_LEN)
        };
        let header_len = u32_to_usize(header_len_field);
        if header_len > cs {
            return Err(invalid("header longer than a cluster"));
        }
        let mut ext = Vec::new();
        let mut push_ext = |kind: u32, data: &[u8]| {
            let len = u32::try_from(data.len())
                .map_err(|_| invalid(format!("header extension {kind:#x} too long")))?;
            ext.extend_from_slice(&kind.to_be_bytes());
            ext.extend_from_slice(&len.to_be_bytes());
            ext.extend_from_slice(data);
            ext.resize(ext.len().div_ceil(8) * 8, 0);
            Ok::<(), HeaderError>(())
        };
        if let Some(fmt) = &self.backing_format {
            push_ext(EXT_BACKING_FORMAT, fmt.as_bytes())?;
        }
        if !self.feature_names.is_empty() {
            let mut table = Vec::new();
            for f in &self.feature_names {
                let mut entry = [0u8; 48];
                entry[0] = f.kind;
                entry[1] = f.bit;
                let n = f.name.as_bytes();
                let n = &n[..n.len().min(46)];
                entry[2..2 + n.len()].copy_from_slice(n);
                table.extend_from_slice(&entry);
            }
            push_ext(EXT_FEATURE_NAMES, &table)?;
        }
        for e in &self.other_extensions {
            push_ext(e.kind, &e.data)?;
        }
        ext.extend_from_slice(&[0u8; 8]); // end marker
        let backing = self.backing_file.as_deref().unwrap_or("").as_bytes();
        let backing_off = header_len + ext.len();
        if backing.len() > u32_to_usize(MAX_BACKING_NAME) || backing_off + backing.len() > cs {
            return Err(invalid(
                "header, extensions and backing name do not fit in a cluster",
            ));
        }
        out[header_len..backing_off].copy_from_slice(&ext);
        out[backing_off..backing_off + backing.len()].copy_from_slice(backing);

        put32(&mut out, 0, MAGIC);
        put32(&mut out, 4, self.version);
        if backing.is_empty() {
            put64(&mut out, 8, 0);
            put32(&mut out, 16, 0);
        } else {
            put64(&mut out, 8, usize_to_u64(backing_off));
            // At most MAX_BACKING_NAME (checked above).
            let len = u32::try_from(backing.len()).map_err(|_| invalid("backing name too long"))?;
            put32(&mut out, 16, len);
        }
        put32(&mut out, 20, self.cluster_bits);
        put64(&mut out, 24, self.size);
        put32(&mut out, 32, self.crypt_method);
        put32(&mut out, 36, self.l1_size);
        put64(&mut out, 40, self.l1_table_offset);
        put64(&mut out, 48, self.refcount_table_offset);
        put32(&mut out, 56, self.refcount_table_clusters);
        put32(&mut out, 60, self.nb_snapshots);
        put64(&mut out, 64, self.snapshots_offset);
        if self.version == 3 {
            put64(&mut out, 72, self.incompatible_features);
            put64(&mut out, 80, self.compatible_features);
            put64(&mut out, 88, self.autoclear_features);
            put32(&mut out, 96, self.refcount_order);
            put32(&mut out, 100, header_len_field);
            if header_len > 104 {
                out[104] = match self.compression_type {
                    CompressionType::Zlib => 0,
                    CompressionType::Zstd => 1,
                };
            }
        }
        Ok(out)
    }
}

/// The feature name table QEMU 7.x writes into new images.
pub(crate) fn default_feature_names() -> Vec<FeatureName> {
    let f = |kind: u8, bit: u8, name: &str| FeatureName {
        kind,
        bit,
        name: name.to_string(),
    };
    vec![
        f(0, 0, "dirty bit"),
        f(0, 1, "corrupt bit"),
        f(0, 2, "external data file"),
        f(0, 3, "compression type"),
        f(0, 4, "extended L2 entries"),
        f(1, 0, "lazy refcounts"),
        f(2, 0, "bitmaps"),
        f(2, 1, "raw external data"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Header {
        Header {
            version: 3,
            backing_file_offset: 0,
            backing_file_size: 0,
            cluster_bits: 16,
            size: 1 << 30,
            crypt_method: 0,
            l1_size: 2,
            l1_table_offset: 3 << 16,
            refcount_table_offset: 1 << 16,
            refcount_table_clusters: 1,
            nb_snapshots: 0,
            snapshots_offset: 0,
            incompatible_features: 0,
            compatible_features: 0,
            autoclear_features: 0,
            refcount_order: 4,
            header_length: V3_HEADER_LEN_WITH_COMPRESSION,
            compression_type: CompressionType::Zlib,
            backing_file: Some("base.raw".into()),
            backing_format: Some("raw".into()),
            feature_names: default_feature_names(),
            data_file: None,
            other_extensions: vec![RawExtension {
                kind: 0x1234_5678,
                data: vec![1, 2, 3],
            }],
        }
    }

    #[test]
    fn roundtrip_keeps_everything() {
        let h = sample();
        let bytes = h.to_cluster().unwrap();
        let mut parsed = Header::parse(&bytes).unwrap();
        // The serializer placed the backing name; the rest must be equal.
        assert_ne!(parsed.backing_file_offset, 0);
        parsed.backing_file_offset = 0;
        parsed.backing_file_size = 0;
        assert_eq!(parsed, h);
    }

    #[test]
    fn refuses_bad_fields() {
        let base = sample().to_cluster().unwrap();
        let with = |off: usize, bytes: &[u8]| {
            let mut b = base.clone();
            b[off..off + bytes.len()].copy_from_slice(bytes);
            Header::parse(&b)
        };
        assert_eq!(with(0, &[0, 0, 0, 0]), Err(HeaderError::BadMagic));
        assert!(matches!(
            with(4, &1u32.to_be_bytes()),
            Err(HeaderError::Version(1))
        ));
        assert!(with(20, &8u32.to_be_bytes()).is_err());
        assert!(with(20, &22u32.to_be_bytes()).is_err());
        assert!(with(96, &7u32.to_be_bytes()).is_err());
        assert!(matches!(
            with(72, &(1u64 << 40).to_be_bytes()),
            Err(HeaderError::Unsupported(_))
        ));
        assert!(matches!(
            with(72, &INCOMPAT_EXTL2.to_be_bytes()),
            Err(HeaderError::Unsupported(_))
        ));
        assert!(matches!(
            with(32, &1u32.to_be_bytes()),
            Err(HeaderError::Unsupported(_))
        ));
        // Size far beyond what the L1 table covers.
        assert!(with(24, &u64::MAX.to_be_bytes()).is_err());
        // Enormous L1.
        assert!(with(36, &u32::MAX.to_be_bytes()).is_err());
        // Backing name beyond the first cluster.
        assert!(with(8, &(65530u64).to_be_bytes()).is_err());
        // L1 overlapping the refcount table.
        assert!(with(40, &(1u64 << 16).to_be_bytes()).is_err());
        // Truncated input never panics.
        for n in 0..base.len().min(600) {
            let _ = Header::parse(&base[..n]);
        }
    }
}
