//! `img check`: exit codes as qemu-img: 0 clean, 2 corruptions, 3 leaks only,
//! 1 the check could not run.

use std::path::Path;

use serde_json::json;

use super::required_format;
use block::Format;
use block::qcow2::check::check;

pub(crate) fn run(
    format: Option<&str>,
    output: &str,
    quiet: bool,
    repair: Option<&str>,
    filename: &Path,
) -> anyhow::Result<i32> {
    let format = required_format(format)?;
    if format == Format::Raw {
        println!("This image format does not support checks");
        return Ok(63);
    }
    match repair {
        None => {}
        Some("leaks" | "all") => {
            let before = check(filename)?;
            if before.leaks + before.corruptions > 0 {
                block::qcow2::repair(filename)?;
                if !quiet && output == "human" {
                    println!(
                        "Repaired the refcounts ({} leaked clusters, {} refcount errors before).",
                        before.leaks, before.corruptions
                    );
                }
            }
        }
        Some(other) => anyhow::bail!("-r: expected leaks or all, got {other:?}"),
    }
    let r = match check(filename) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("check: {}: {e}", filename.display());
            return Ok(1);
        }
    };
    match output {
        "json" => {
            let mut v = json!({
                "image-end-offset": r.image_end_offset,
                "total-clusters": r.total_clusters,
                "check-errors": r.check_errors,
                "filename": filename.display().to_string(),
                "format": "qcow2",
            });
            if r.allocated_clusters > 0 {
                v["allocated-clusters"] = json!(r.allocated_clusters);
                v["fragmented-clusters"] = json!(r.fragmented_clusters);
                v["compressed-clusters"] = json!(r.compressed_clusters);
            }
            if r.leaks > 0 {
                v["leaks"] = json!(r.leaks);
            }
            if r.corruptions > 0 {
                v["corruptions"] = json!(r.corruptions);
            }
            println!("{}", serde_json::to_string_pretty(&v)?);
        }
        "human" if !quiet => {
            for m in &r.messages {
                println!("{m}");
            }
            if r.corruptions == 0 && r.leaks == 0 {
                println!("No errors were found on the image.");
            }
            if r.leaks > 0 {
                println!(
                    "\n{} leaked clusters were found on the image.\nThis means waste of disk space, but no harm to data.",
                    r.leaks
                );
            }
            if r.corruptions > 0 {
                println!(
                    "\n{} errors were found on the image.\nData may be corrupted, or further writes to the image may corrupt it.",
                    r.corruptions
                );
            }
            if r.total_clusters > 0 {
                let pct = |n: u64| n as f64 * 100.0 / r.total_clusters as f64;
                println!(
                    "{}/{} = {:.2}% allocated, {:.2}% fragmented, {:.2}% compressed clusters",
                    r.allocated_clusters,
                    r.total_clusters,
                    pct(r.allocated_clusters),
                    if r.allocated_clusters > 0 {
                        r.fragmented_clusters as f64 * 100.0 / r.allocated_clusters as f64
                    } else {
                        0.0
                    },
                    if r.allocated_clusters > 0 {
                        r.compressed_clusters as f64 * 100.0 / r.allocated_clusters as f64
                    } else {
                        0.0
                    },
                );
            }
            println!("Image end offset: {}", r.image_end_offset);
        }
        "human" => {}
        other => anyhow::bail!("--output: expected human or json, got {other:?}"),
    }
    Ok(if r.check_errors > 0 {
        1
    } else if r.corruptions > 0 {
        2
    } else if r.leaks > 0 {
        3
    } else {
        0
    })
}
