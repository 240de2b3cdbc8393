//! Creating images with the defaults and options of `qemu-img create -f qcow2`.

use int_cast::u64_to_usize;
use std::path::Path;

use super::header::{self, CompressionType, Header};
use super::{BackingPolicy, Qcow2Image, Qcow2Options, backing, corrupt, refcount};
use crate::{DiskError, DiskResult, Format, OpenOptions, OpenedFile, open_disk_with};

/// Options of `qemu-img create -f qcow2`; `Default` gives QEMU's defaults.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    /// Disk size in bytes (rounded up to 512). `None`: the backing file's size.
    pub size: Option<u64>,
    pub cluster_size: u64,
    /// Backing file name as it is stored in the image (relative names are
    /// relative to the new image's directory).
    pub backing_file: Option<String>,
    /// Required with `backing_file`: we never guess formats.
    pub backing_format: Option<Format>,
    /// How the backing file's own chain is opened to check it (and to
    /// take its size). Default: the backing file may name none.
    pub backing_policy: BackingPolicy,
    /// The backing file, already opened by the caller: its size and check go through it,
    /// and `backing_file` is only the name the image records (never looked up here).
    pub backing_opened: Option<OpenedFile>,
    pub lazy_refcounts: bool,
    pub refcount_bits: u32,
    /// `compat=0.10` (version 2) instead of `1.1` (version 3).
    pub compat_v2: bool,
    pub compression_type: CompressionType,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            size: None,
            cluster_size: 64 << 10,
            backing_file: None,
            backing_format: None,
            backing_policy: BackingPolicy::Forbid,
            backing_opened: None,
            lazy_refcounts: false,
            refcount_bits: 16,
            compat_v2: false,
            compression_type: CompressionType::Zlib,
        }
    }
}

fn bad(msg: impl Into<String>) -> DiskError {
    DiskError::UnsupportedImage(msg.into())
}

/// Creates (or truncates and re-creates) a qcow2 image at `path`.
pub fn create(path: &Path, opts: &CreateOptions) -> DiskResult<()> {
    let cs = opts.cluster_size;
    if !cs.is_power_of_two() || !(512..=2 << 20).contains(&cs) {
        return Err(bad(format!(
            "cluster size {cs}: must be a power of two between 512 and 2M"
        )));
    }
    let cluster_bits = cs.trailing_zeros();
    if !opts.refcount_bits.is_power_of_two() || opts.refcount_bits > 64 {
        return Err(bad(format!(
            "refcount_bits {}: must be a power of two up to 64",
            opts.refcount_bits
        )));
    }
    if opts.compat_v2 && (opts.refcount_bits != 16 || opts.lazy_refcounts) {
        return Err(bad(
            "compat=0.10 supports neither lazy refcounts nor refcount_bits other than 16",
        ));
    }
    if opts.compat_v2 && opts.compression_type != CompressionType::Zlib {
        return Err(bad("compat=0.10 supports only zlib compression"));
    }
    let open_backing = |name: &str, format: Format| {
        let backing = match &opts.backing_opened {
            Some(file) => file.path(),
            None => backing::resolve(path, name),
        };
        let opts = OpenOptions {
            read_only: true,
            direct: false,
            backing: opts.backing_policy.clone(),
        };
        open_disk_with(&backing, format, opts)
    };
    let size = match (opts.size, &opts.backing_file) {
        (Some(s), _) => s,
        (None, Some(name)) => {
            let fmt = opts
                .backing_format
                .ok_or_else(|| bad("backing file given without its format (-F)"))?;
            open_backing(name, fmt)?.size()
        }
        (None, None) => return Err(bad("image size is required without a backing file")),
    };
    let size = size
        .checked_next_multiple_of(512)
        .ok_or_else(|| bad("image size too large"))?;
    if opts.backing_file.is_some() {
        let fmt = opts
            .backing_format
            .ok_or_else(|| bad("backing file given without its format (-F)"))?;
        if opts.size.is_some() {
            // Refuse a broken chain now rather than at the first read.
            let name = opts.backing_file.as_deref().unwrap_or_default();
            open_backing(name, fmt)?;
        }
    }
    let l1_entries = header::l1_entries_for(size, cluster_bits);
    if l1_entries * 8 > header::MAX_L1_BYTES {
        return Err(bad(format!(
            "image size {size} too large for cluster size {cs}"
        )));
    }

    let version = if opts.compat_v2 { 2 } else { 3 };
    let mut h = Header {
        version,
        backing_file_offset: 0,
        backing_file_size: 0,
        cluster_bits,
        size: 0,
        crypt_method: 0,
        l1_size: 0,
        l1_table_offset: 0,
        refcount_table_offset: cs,
        refcount_table_clusters: 1,
        nb_snapshots: 0,
        snapshots_offset: 0,
        incompatible_features: if opts.compression_type == CompressionType::Zstd {
            header::INCOMPAT_COMPRESSION
        } else {
            0
        },
        compatible_features: if opts.lazy_refcounts {
            header::COMPAT_LAZY_REFCOUNTS
        } else {
            0
        },
        autoclear_features: 0,
        refcount_order: opts.refcount_bits.trailing_zeros(),
        header_length: if opts.compat_v2 {
            header::V2_HEADER_LEN
        } else {
            header::V3_HEADER_LEN_WITH_COMPRESSION
        },
        compression_type: opts.compression_type,
        backing_file: opts.backing_file.clone(),
        backing_format: opts.backing_format.map(|f| f.name().to_string()),
        // As QEMU: small clusters leave no room for the 392-byte table
        // next to a backing file name.
        feature_names: if cs > 4096 && !opts.compat_v2 {
            header::default_feature_names()
        } else {
            Vec::new()
        },
        data_file: None,
        other_extensions: Vec::new(),
    };
    let header_cluster = h.to_cluster().map_err(|e| bad(e.to_string()))?;
    // Cluster 1: refcount table pointing at cluster 2, the first refcount
    // block, which counts clusters 0..=2.
    let mut reftable = vec![0u8; u64_to_usize(cs)];
    reftable[..8].copy_from_slice(&(2 * cs).to_be_bytes());
    let mut block = vec![0u8; u64_to_usize(cs)];
    for c in 0..3 {
        refcount::set(&mut block, h.refcount_order, c, 1);
    }
    {
        use std::os::unix::fs::FileExt;
        // Locked before it is emptied, as QEMU's `create` does: an image in
        // use (a VM's overlay) is refused, not truncated under its user.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        crate::lock::lock(&f, path, crate::lock::Access::of(true))?;
        f.set_len(0)?;
        f.write_all_at(&header_cluster, 0)?;
        f.write_all_at(&reftable, cs)?;
        f.write_all_at(&block, 2 * cs)?;
        f.sync_all()?;
    }
    h.size = size;
    let mut img = Qcow2Image::open_alone(path, Qcow2Options::default())?;
    img.set_size_and_l1(size, l1_entries)?;
    img.close()
}

impl Qcow2Image {
    /// Allocates a zeroed L1 table for `entries` entries and points the
    /// header at it together with the new disk size. For new images only
    /// (the old L1 must be empty).
    fn set_size_and_l1(&mut self, size: u64, entries: u64) -> DiskResult<()> {
        if self.header.l1_size != 0 {
            return Err(corrupt("L1 table already exists"));
        }
        // The header's l1_size field is 32 bits.
        let l1_size = u32::try_from(entries)
            .map_err(|_| corrupt(format!("an L1 table of {entries} entries")))?;
        let cs = self.cluster_size;
        let mut l1_off = 0;
        if entries > 0 {
            let clusters = (entries * 8).div_ceil(cs);
            l1_off = self.alloc_clusters(clusters)?;
            self.write_refcounts()?;
            // Like QEMU, write the entries only (the rest of the cluster
            // reads as zeroes past the end of the file).
            let zeros = vec![0u8; u64_to_usize(entries * 8)];
            self.file.write_meta(&zeros, l1_off)?;
            self.sync()?;
        }
        let mut l1_fields = [0u8; 12];
        l1_fields[..4].copy_from_slice(&l1_size.to_be_bytes());
        l1_fields[4..].copy_from_slice(&l1_off.to_be_bytes());
        self.file.write_meta(&l1_fields, header::OFF_L1_SIZE)?;
        self.file.write_meta(&size.to_be_bytes(), 24)?;
        self.sync()?;
        self.header.size = size;
        self.header.l1_size = l1_size;
        self.header.l1_table_offset = l1_off;
        self.l1 = vec![0; u64_to_usize(entries)];
        Ok(())
    }
}
