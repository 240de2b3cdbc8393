//! `img info`.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::Context;
use serde_json::json;

use super::required_format;
use super::size::human;
use block::Format;
use block::qcow2::{backing, check::read_image_header, header};

pub(crate) fn run(format: Option<&str>, output: &str, filename: &Path) -> anyhow::Result<i32> {
    let format = required_format(format)?;
    let meta = std::fs::metadata(filename).with_context(|| format!("{}", filename.display()))?;
    let actual = meta.blocks() * 512;
    let mut info = json!({
        "filename": filename.display().to_string(),
        "format": format.name(),
        "actual-size": actual,
        "dirty-flag": false,
    });
    let mut human_extra = Vec::new();
    match format {
        Format::Raw => {
            let disk = block::open_disk(filename, Format::Raw, true)?;
            info["virtual-size"] = json!(disk.size());
        }
        Format::Qcow2 => {
            let h = read_image_header(filename)?;
            info["virtual-size"] = json!(h.size);
            info["cluster-size"] = json!(h.cluster_size());
            info["dirty-flag"] = json!(h.is_dirty());
            let compat = if h.version == 2 { "0.10" } else { "1.1" };
            let mut data = json!({
                "compat": compat,
                "compression-type": h.compression_type.to_string(),
                "lazy-refcounts": h.lazy_refcounts(),
                "refcount-bits": h.refcount_bits(),
                "corrupt": h.is_corrupt(),
                "extended-l2": h.incompatible_features & header::INCOMPAT_EXTL2 != 0,
            });
            if h.version == 2 {
                data =
                    json!({"compat": compat, "compression-type": h.compression_type.to_string()});
            }
            human_extra.push(format!("cluster_size: {}", h.cluster_size()));
            if let Some(b) = &h.backing_file {
                let full = backing::resolve(filename, b);
                info["backing-filename"] = json!(b);
                info["full-backing-filename"] = json!(full.display().to_string());
                human_extra.push(format!(
                    "backing file: {b} (actual path: {})",
                    full.display()
                ));
                if let Some(f) = &h.backing_format {
                    info["backing-filename-format"] = json!(f);
                    human_extra.push(format!("backing file format: {f}"));
                }
            }
            human_extra.push("Format specific information:".into());
            if let Some(obj) = data.as_object() {
                for (k, v) in obj {
                    human_extra.push(format!(
                        "    {}: {}",
                        k.replace('-', " "),
                        v.to_string().trim_matches('"')
                    ));
                }
            }
            info["format-specific"] = json!({"type": "qcow2", "data": data});
        }
    }
    match output {
        "json" => println!("{}", serde_json::to_string_pretty(&info)?),
        "human" => {
            let vsize = info["virtual-size"].as_u64().unwrap_or(0);
            println!("image: {}", filename.display());
            println!("file format: {}", format.name());
            println!("virtual size: {} ({vsize} bytes)", human(vsize));
            println!("disk size: {}", human(actual));
            for l in human_extra {
                println!("{l}");
            }
        }
        other => anyhow::bail!("--output: expected human or json, got {other:?}"),
    }
    Ok(0)
}
