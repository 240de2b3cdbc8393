//! Domain → the VMM's configuration. The domain is what the handler sees;
//! this is the one place that decides what the VMM actually gets from it.

use proto::domain::Domain;
use std::path::PathBuf;
use vmm::{DiskCache, DiskConfig, DiskFormat, KernelSource, NetConfig, SerialTarget, VmConfig};

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ToVmError {
    #[error("domain has no {0}")]
    Missing(&'static str),
    #[error("disk {0}: format {1:?} is not raw or qcow2")]
    DiskFormat(String, String),
    #[error("disk {0}: {1}")]
    DiskCache(String, String),
    #[error("interface {0}: MAC {1:?} is invalid")]
    Mac(String, String),
    #[error("{0} vCPUs is more than the VMM supports")]
    TooManyVcpus(u32),
}

/// Builds the VMM configuration; `serial` overrides the console target
/// (tests); by default it is the domain's console socket.
pub fn vm_config(domain: &Domain) -> Result<VmConfig, ToVmError> {
    let spec = &domain.spec;
    let os = spec.os.as_ref().ok_or(ToVmError::Missing("OS"))?;
    if os.kernel.is_empty() {
        return Err(ToVmError::Missing("kernel (OS.Kernel)"));
    }
    let mut config = VmConfig::new(KernelSource::Path(PathBuf::from(&os.kernel)));
    config.initrd = (!os.initrd.is_empty()).then(|| PathBuf::from(&os.initrd));
    // The VMM appends the virtio-mmio device announcements itself.
    config.cmdline = if os.kernel_args.is_empty() {
        vmm::config::DEFAULT_CMDLINE.to_string()
    } else {
        os.kernel_args.clone()
    };
    let memory = spec.memory.as_ref().ok_or(ToVmError::Missing("Memory"))?;
    config.memory_mib = memory.value.div_ceil(1 << 20);
    let vcpus = spec.vcpu.as_ref().map(|v| v.cpus).unwrap_or(1);
    config.vcpus = u8::try_from(vcpus)
        .ok()
        .filter(|v| *v >= 1 && *v <= vmm::config::MAX_VCPUS)
        .ok_or(ToVmError::TooManyVcpus(vcpus))?;
    let devices = spec.devices.clone().unwrap_or_default();
    for disk in &devices.disks {
        let name = disk
            .alias
            .as_ref()
            .map(|a| a.name.clone())
            .unwrap_or_default();
        let driver_type = disk
            .driver
            .as_ref()
            .map(|d| d.r#type.as_str())
            .unwrap_or("raw");
        let format = match driver_type {
            "raw" => DiskFormat::Raw,
            "qcow2" => DiskFormat::Qcow2,
            other => return Err(ToVmError::DiskFormat(name, other.to_string())),
        };
        let path = if disk.source.file.is_empty() {
            &disk.source.dev
        } else {
            &disk.source.file
        };
        // Unset until the launcher has probed for direct I/O
        // (`disks::cache_mode`); KubeVirt's first choice is `none`.
        let cache = match disk.driver.as_ref().map(|d| d.cache.as_str()) {
            None | Some("") => DiskCache::None,
            Some(mode) => mode
                .parse()
                .map_err(|e| ToVmError::DiskCache(name.clone(), e))?,
        };
        config.disks.push(DiskConfig {
            path: PathBuf::from(path),
            format,
            read_only: disk.read_only.is_some(),
            cache,
        });
    }
    for iface in &devices.interfaces {
        let name = iface
            .alias
            .as_ref()
            .map(|a| a.name.clone())
            .unwrap_or_default();
        let tap = iface
            .target
            .as_ref()
            .map(|t| t.device.clone())
            .ok_or(ToVmError::Missing("interface target"))?;
        let mac = match &iface.mac {
            Some(m) => Some(
                vmm::config::parse_mac(&m.mac)
                    .ok_or_else(|| ToVmError::Mac(name, m.mac.clone()))?,
            ),
            None => None,
        };
        config.nets.push(NetConfig { tap, mac });
    }
    config.rng = devices.rng.is_some();
    config.serial = match devices
        .serials
        .first()
        .and_then(|s| s.source.as_ref())
        .map(|s| s.path.clone())
    {
        Some(path) if !path.is_empty() => SerialTarget::UnixSocket(PathBuf::from(path)),
        _ => SerialTarget::Null,
    };
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::domain::Domain;

    #[test]
    fn domain_maps_onto_the_vmm() {
        let text = r#"{"ObjectMeta":{"name":"a","namespace":"b"},"Spec":{
            "Memory":{"Value":134217728,"Unit":"b"},"VCPU":{"Placement":"static","CPUs":2},
            "OS":{"Type":{"OS":"hvm"},"Kernel":"/k","KernelArgs":"console=ttyS0 checks=blk"},
            "Devices":{"Disks":[{"Device":"disk","Type":"file","Source":{"File":"/d.qcow2"},"Target":{"Bus":"virtio","Device":"vda"},
                "Driver":{"Name":"qemu","Type":"qcow2"},"Alias":{"Name":"d","UserDefined":true}}],
              "Interfaces":[{"Type":"ethernet","Source":{},"Target":{"Device":"tap0","Managed":"no"},"MAC":{"MAC":"0a:58:0a:f4:00:1b"}}],
              "Rng":{"Model":"virtio-non-transitional"},
              "Serials":[{"Type":"unix","Source":{"Mode":"bind","Path":"/s"}}]}}}"#;
        let config = vm_config(&Domain::from_json(text).unwrap()).unwrap();
        assert_eq!(config.memory_mib, 128);
        assert_eq!(config.vcpus, 2);
        assert_eq!(config.cmdline, "console=ttyS0 checks=blk");
        assert_eq!(config.disks[0].format, DiskFormat::Qcow2);
        assert_eq!(config.nets[0].tap, "tap0");
        assert_eq!(config.nets[0].mac, Some([0x0a, 0x58, 0x0a, 0xf4, 0, 0x1b]));
        assert!(config.rng);
        assert!(
            matches!(config.serial, SerialTarget::UnixSocket(ref p) if p == std::path::Path::new("/s"))
        );
    }

    fn disk_with_cache(cache: &str) -> Domain {
        Domain::from_json(&format!(
            r#"{{"Spec":{{"Memory":{{"Value":1048576,"Unit":"b"}},"OS":{{"Type":{{"OS":"hvm"}},"Kernel":"/k"}},
            "Devices":{{"Disks":[{{"Device":"disk","Type":"file","Source":{{"File":"/x"}},"Alias":{{"Name":"d","UserDefined":true}},
            "Driver":{{"Name":"qemu","Type":"raw","Cache":"{cache}"}}}}]}}}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn cache_modes_map_onto_the_vmm_and_unknown_ones_are_refused() {
        for (mode, cache) in [
            ("", DiskCache::None),
            ("none", DiskCache::None),
            ("writethrough", DiskCache::WriteThrough),
            ("writeback", DiskCache::WriteBack),
        ] {
            let config = vm_config(&disk_with_cache(mode)).unwrap();
            assert_eq!(config.disks[0].cache, cache, "{mode:?}");
        }
        let err = vm_config(&disk_with_cache("unsafe")).unwrap_err();
        assert!(matches!(err, ToVmError::DiskCache(_, _)), "{err}");
        assert!(err.to_string().contains("unsafe"), "{err}");
    }

    #[test]
    fn incomplete_domains_are_errors() {
        let no_os = Domain::from_json(r#"{"Spec":{"Memory":{"Value":1,"Unit":"b"}}}"#).unwrap();
        assert_eq!(vm_config(&no_os).unwrap_err(), ToVmError::Missing("OS"));
        let bad_format = Domain::from_json(r#"{"Spec":{"Memory":{"Value":1048576,"Unit":"b"},"OS":{"Type":{"OS":"hvm"},"Kernel":"/k"},
            "Devices":{"Disks":[{"Device":"disk","Type":"file","Source":{"File":"/x"},"Driver":{"Name":"qemu","Type":"vmdk"}}]}}}"#).unwrap();
        assert!(matches!(
            vm_config(&bad_format),
            Err(ToVmError::DiskFormat(_, _))
        ));
    }
}
