//! `GetDomainStats`: the domain's devices joined with the VM's counters, in
//! KubeVirt's `stats.DomainStats` shape (`proto::domain_stats`).
//!
//! The VM's disks and interfaces are the domain's, in the same order
//! (`to_vm`), so the n-th counter belongs to the n-th device. Process-wide
//! numbers (CPU time, resident memory) are this process's: the VMM runs
//! inside the launcher, as QEMU's are the QEMU process's for libvirt.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use proto::domain::Domain;
use proto::domain_stats::{Block, Cpu, DomainStats, Memory, Net, VCPU_RUNNING, Vcpu};
use vmm::VmStats;
use vmm::stats::CpuTime;

/// What the process as a whole uses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ProcessUsage {
    pub(crate) cpu: Option<CpuTime>,
    pub(crate) rss_kib: Option<u64>,
}

impl ProcessUsage {
    /// This process, now.
    pub(crate) fn current() -> ProcessUsage {
        ProcessUsage {
            cpu: vmm::stats::process_cpu_time(),
            rss_kib: rss_kib(&std::fs::read_to_string("/proc/self/status").unwrap_or_default()),
        }
    }
}

/// `VmRSS` of a `/proc/PID/status` text, in KiB.
fn rss_kib(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The statistics of `domain`; `vm` is `None` when no VM runs (then there
/// are no device or vCPU entries, as libvirt reports none for a domain
/// that is not running).
pub(crate) fn domain_stats(
    domain: &Domain,
    vm: Option<&VmStats>,
    process: ProcessUsage,
) -> DomainStats {
    let spec = &domain.spec;
    let memory_kib = spec
        .memory
        .as_ref()
        .and_then(crate::to_vm::memory_bytes)
        .map(|b| b / 1024);
    let mut stats = DomainStats {
        name: spec.name.clone(),
        uuid: spec.uuid.clone(),
        cpu: process.cpu.map(|t| Cpu {
            time_set: true,
            time: nanos(t.user + t.system),
            user_set: true,
            user: nanos(t.user),
            system_set: true,
            system: nanos(t.system),
        }),
        memory: Some(Memory {
            actual_balloon_set: memory_kib.is_some(),
            actual_balloon: memory_kib.unwrap_or(0),
            rss_set: process.rss_kib.is_some(),
            rss: process.rss_kib.unwrap_or(0),
            ..Memory::default()
        }),
        ..DomainStats::default()
    };
    let Some(vm) = vm else {
        return stats;
    };
    stats.vcpu = vm
        .vcpu_times
        .iter()
        .map(|time| Vcpu {
            state_set: true,
            state: VCPU_RUNNING,
            time_set: time.is_some(),
            time: time.map(nanos).unwrap_or(0),
            ..Vcpu::default()
        })
        .collect();
    let devices = spec.devices.clone().unwrap_or_default();
    stats.block = devices
        .disks
        .iter()
        .zip(&vm.disks)
        .map(|(disk, c)| {
            let path = if disk.source.file.is_empty() {
                &disk.source.dev
            } else {
                &disk.source.file
            };
            let meta = std::fs::metadata(path).ok();
            Block {
                name_set: true,
                name: disk.target.device.clone(),
                alias: disk
                    .alias
                    .as_ref()
                    .map(|a| a.name.clone())
                    .unwrap_or_default(),
                path_set: !path.is_empty(),
                path: path.clone(),
                rd_reqs_set: true,
                rd_reqs: c.rd_reqs,
                rd_bytes_set: true,
                rd_bytes: c.rd_bytes,
                rd_times_set: true,
                rd_times: c.rd_total_ns,
                wr_reqs_set: true,
                wr_reqs: c.wr_reqs,
                wr_bytes_set: true,
                wr_bytes: c.wr_bytes,
                wr_times_set: true,
                wr_times: c.wr_total_ns,
                fl_reqs_set: true,
                fl_reqs: c.fl_reqs,
                fl_times_set: true,
                fl_times: c.fl_total_ns,
                errors_set: true,
                errors: c.errors,
                capacity_set: true,
                capacity: c.capacity,
                // Host bytes the image occupies, and its file size.
                allocation_set: meta.is_some(),
                allocation: meta.as_ref().map(|m| m.blocks() * 512).unwrap_or(0),
                physical_set: meta.is_some(),
                physical: meta.as_ref().map(|m| m.len()).unwrap_or(0),
                ..Block::default()
            }
        })
        .collect();
    stats.net = devices
        .interfaces
        .iter()
        .zip(&vm.nets)
        .map(|(iface, c)| {
            let tap = iface.target.as_ref().map(|t| t.device.clone());
            let alias = iface.alias.as_ref().map(|a| a.name.clone());
            Net {
                name_set: tap.is_some(),
                name: tap.unwrap_or_default(),
                alias_set: alias.is_some(),
                alias: alias.unwrap_or_default(),
                rx_bytes_set: true,
                rx_bytes: c.rx_bytes,
                rx_pkts_set: true,
                rx_pkts: c.rx_pkts,
                rx_errs_set: true,
                rx_errs: c.rx_errs,
                rx_drop_set: true,
                rx_drop: c.rx_drop,
                tx_bytes_set: true,
                tx_bytes: c.tx_bytes,
                tx_pkts_set: true,
                tx_pkts: c.tx_pkts,
                tx_errs_set: true,
                tx_errs: c.tx_errs,
                tx_drop_set: true,
                tx_drop: c.tx_drop,
            }
        })
        .collect();
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use vmm::stats::{BlockCounts, NetCounts};

    #[test]
    fn devices_are_joined_with_their_counters_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("d.qcow2");
        std::fs::write(&image, vec![1u8; 8192]).unwrap();
        let domain = Domain::from_json(&format!(
            r#"{{"Spec":{{"Name":"ns_vmi","UUID":"u-1","Memory":{{"Value":134217728,"Unit":"b"}},
            "OS":{{"Type":{{"OS":"hvm"}},"Kernel":"/k"}},
            "Devices":{{"Disks":[
              {{"Device":"disk","Type":"file","Source":{{"File":"{}"}},"Target":{{"Bus":"virtio","Device":"vda"}},"Alias":{{"Name":"root","UserDefined":true}}}},
              {{"Device":"disk","Type":"block","Source":{{"Dev":"/nonexistent/dev"}},"Target":{{"Bus":"virtio","Device":"vdb"}},"Alias":{{"Name":"data","UserDefined":true}}}}],
              "Interfaces":[{{"Type":"ethernet","Source":{{}},"Target":{{"Device":"tap0","Managed":"no"}},"Alias":{{"Name":"default","UserDefined":true}}}}]}}}}}}"#,
            image.display()
        ))
        .unwrap();
        let vm = VmStats {
            disks: vec![
                BlockCounts {
                    rd_reqs: 5,
                    rd_bytes: 2560,
                    capacity: 1 << 30,
                    ..BlockCounts::default()
                },
                BlockCounts {
                    wr_reqs: 1,
                    errors: 2,
                    ..BlockCounts::default()
                },
            ],
            nets: vec![NetCounts {
                rx_pkts: 3,
                tx_bytes: 99,
                ..NetCounts::default()
            }],
            vcpu_times: vec![Some(Duration::from_millis(20)), None],
        };
        let process = ProcessUsage {
            cpu: Some(CpuTime {
                user: Duration::from_millis(30),
                system: Duration::from_millis(10),
            }),
            rss_kib: Some(4096),
        };
        let stats = domain_stats(&domain, Some(&vm), process);
        assert_eq!(
            (stats.name.as_str(), stats.uuid.as_str()),
            ("ns_vmi", "u-1")
        );
        let cpu = stats.cpu.unwrap();
        assert_eq!(
            (cpu.time, cpu.user, cpu.system),
            (40_000_000, 30_000_000, 10_000_000)
        );
        let memory = stats.memory.unwrap();
        assert_eq!((memory.actual_balloon, memory.rss), (131072, 4096));
        assert_eq!(stats.block.len(), 2);
        let (root, data) = (&stats.block[0], &stats.block[1]);
        assert_eq!((root.name.as_str(), root.alias.as_str()), ("vda", "root"));
        assert_eq!(root.path, image.to_string_lossy());
        assert_eq!(
            (root.rd_reqs, root.rd_bytes, root.capacity),
            (5, 2560, 1 << 30)
        );
        assert!(root.physical_set && root.physical == 8192);
        assert!(root.allocation_set);
        assert_eq!((data.name.as_str(), data.alias.as_str()), ("vdb", "data"));
        assert_eq!((data.wr_reqs, data.errors), (1, 2));
        // A path that cannot be looked at has no sizes, not made-up ones.
        assert!(!data.physical_set && !data.allocation_set);
        assert_eq!(stats.net.len(), 1);
        let net = &stats.net[0];
        assert_eq!((net.name.as_str(), net.alias.as_str()), ("tap0", "default"));
        assert_eq!((net.rx_pkts, net.tx_bytes), (3, 99));
        assert_eq!(stats.vcpu.len(), 2);
        assert!(stats.vcpu[0].time_set && stats.vcpu[0].time == 20_000_000);
        assert!(!stats.vcpu[1].time_set);
        // Without a running VM: no device or vCPU entries.
        let idle = domain_stats(&domain, None, process);
        assert!(idle.block.is_empty() && idle.net.is_empty() && idle.vcpu.is_empty());
        assert_eq!(idle.name, "ns_vmi");
    }

    #[test]
    fn rss_comes_from_the_vmrss_line() {
        let status = "Name:\tvirt-launcher\nVmPeak:\t  99 kB\nVmRSS:\t   12345 kB\nThreads:\t4\n";
        assert_eq!(rss_kib(status), Some(12345));
        assert_eq!(rss_kib("Name:\tx\n"), None);
        assert_eq!(rss_kib("VmRSS:\tlots kB\n"), None);
        assert!(ProcessUsage::current().rss_kib.is_some_and(|kib| kib > 0));
    }
}
