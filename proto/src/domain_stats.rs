//! `stats.DomainStats` (`pkg/virt-launcher/virtwrap/stats/types.go`, v1.9.0):
//! the JSON `GetDomainStats` returns, from which KubeVirt's handler makes the
//! `kubevirt_vmi_*` metrics.
//!
//! The Go structs have no JSON tags: keys are the Go field names. Each value
//! comes with a `...Set` flag saying whether it was measured; a reader must
//! ignore values whose flag is false. Parts we never measure (migration job,
//! dirty rate, guest load, CPU map) are left out, which a Go reader sees as
//! their zero values.

use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct DomainStats {
    pub name: String,
    #[serde(rename = "UUID")]
    pub uuid: String,
    pub cpu: Option<Cpu>,
    pub memory: Option<Memory>,
    pub vcpu: Vec<Vcpu>,
    pub net: Vec<Net>,
    pub block: Vec<Block>,
    #[serde(rename = "CPUMapSet")]
    pub cpu_map_set: bool,
}

/// Times in nanoseconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Cpu {
    pub time_set: bool,
    pub time: u64,
    pub user_set: bool,
    pub user: u64,
    pub system_set: bool,
    pub system: u64,
}

/// Sizes in KiB.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Memory {
    pub unused_set: bool,
    pub unused: u64,
    pub cached_set: bool,
    pub cached: u64,
    pub available_set: bool,
    pub available: u64,
    pub actual_balloon_set: bool,
    pub actual_balloon: u64,
    #[serde(rename = "RSSSet")]
    pub rss_set: bool,
    #[serde(rename = "RSS")]
    pub rss: u64,
    pub swap_in_set: bool,
    pub swap_in: u64,
    pub swap_out_set: bool,
    pub swap_out: u64,
    pub major_fault_set: bool,
    pub major_fault: u64,
    pub minor_fault_set: bool,
    pub minor_fault: u64,
    pub usable_set: bool,
    pub usable: u64,
    pub total_set: bool,
    pub total: u64,
}

/// `VCPURunning`.
pub const VCPU_RUNNING: i32 = 1;

/// One vCPU; times in nanoseconds.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Vcpu {
    pub state_set: bool,
    pub state: i32,
    pub time_set: bool,
    pub time: u64,
    pub wait_set: bool,
    pub wait: u64,
    pub delay_set: bool,
    pub delay: u64,
}

/// One interface, from the guest's side (`Rx` = received by the guest).
/// `Name` is the host device (the tap), `Alias` the VMI's interface name.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Net {
    pub name_set: bool,
    pub name: String,
    pub alias_set: bool,
    pub alias: String,
    pub rx_bytes_set: bool,
    pub rx_bytes: u64,
    pub rx_pkts_set: bool,
    pub rx_pkts: u64,
    pub rx_errs_set: bool,
    pub rx_errs: u64,
    pub rx_drop_set: bool,
    pub rx_drop: u64,
    pub tx_bytes_set: bool,
    pub tx_bytes: u64,
    pub tx_pkts_set: bool,
    pub tx_pkts: u64,
    pub tx_errs_set: bool,
    pub tx_errs: u64,
    pub tx_drop_set: bool,
    pub tx_drop: u64,
}

/// One disk. `Name` is the guest device (`vda`), `Alias` the VMI's disk name
/// (no flag of its own in KubeVirt's struct); times in nanoseconds, sizes in
/// bytes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "PascalCase", default)]
pub struct Block {
    pub name_set: bool,
    pub name: String,
    pub alias: String,
    pub backing_index_set: bool,
    pub backing_index: u32,
    pub path_set: bool,
    pub path: String,
    pub rd_reqs_set: bool,
    pub rd_reqs: u64,
    pub rd_bytes_set: bool,
    pub rd_bytes: u64,
    pub rd_times_set: bool,
    pub rd_times: u64,
    pub wr_reqs_set: bool,
    pub wr_reqs: u64,
    pub wr_bytes_set: bool,
    pub wr_bytes: u64,
    pub wr_times_set: bool,
    pub wr_times: u64,
    pub fl_reqs_set: bool,
    pub fl_reqs: u64,
    pub fl_times_set: bool,
    pub fl_times: u64,
    pub errors_set: bool,
    pub errors: u64,
    pub allocation_set: bool,
    pub allocation: u64,
    pub capacity_set: bool,
    pub capacity: u64,
    pub physical_set: bool,
    pub physical: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys<T: Serialize>(value: &T) -> Vec<String> {
        match serde_json::to_value(value).unwrap() {
            serde_json::Value::Object(map) => map.keys().cloned().collect(),
            other => panic!("not an object: {other}"),
        }
    }

    fn sorted(names: &str) -> Vec<String> {
        let mut v: Vec<String> = names.split_whitespace().map(String::from).collect();
        v.sort();
        v
    }

    /// The keys are KubeVirt's Go field names, letter for letter.
    #[test]
    fn keys_are_kubevirts_field_names() {
        assert_eq!(
            keys(&DomainStats::default()),
            sorted("Name UUID Cpu Memory Vcpu Net Block CPUMapSet")
        );
        assert_eq!(
            keys(&Cpu::default()),
            sorted("TimeSet Time UserSet User SystemSet System")
        );
        assert_eq!(
            keys(&Memory::default()),
            sorted(
                "UnusedSet Unused CachedSet Cached AvailableSet Available ActualBalloonSet \
                 ActualBalloon RSSSet RSS SwapInSet SwapIn SwapOutSet SwapOut MajorFaultSet \
                 MajorFault MinorFaultSet MinorFault UsableSet Usable TotalSet Total"
            )
        );
        assert_eq!(
            keys(&Vcpu::default()),
            sorted("StateSet State TimeSet Time WaitSet Wait DelaySet Delay")
        );
        assert_eq!(
            keys(&Net::default()),
            sorted(
                "NameSet Name AliasSet Alias RxBytesSet RxBytes RxPktsSet RxPkts RxErrsSet \
                 RxErrs RxDropSet RxDrop TxBytesSet TxBytes TxPktsSet TxPkts TxErrsSet TxErrs \
                 TxDropSet TxDrop"
            )
        );
        assert_eq!(
            keys(&Block::default()),
            sorted(
                "NameSet Name Alias BackingIndexSet BackingIndex PathSet Path RdReqsSet RdReqs \
                 RdBytesSet RdBytes RdTimesSet RdTimes WrReqsSet WrReqs WrBytesSet WrBytes \
                 WrTimesSet WrTimes FlReqsSet FlReqs FlTimesSet FlTimes ErrorsSet Errors \
                 AllocationSet Allocation CapacitySet Capacity PhysicalSet Physical"
            )
        );
    }

    #[test]
    fn stats_round_trip() {
        let stats = DomainStats {
            name: "default_vmi".into(),
            uuid: "5d307ca9-b3ef-428c-8861-06e72d69f223".into(),
            cpu: Some(Cpu {
                time_set: true,
                time: 3,
                ..Cpu::default()
            }),
            vcpu: vec![Vcpu {
                state_set: true,
                state: VCPU_RUNNING,
                ..Vcpu::default()
            }],
            block: vec![Block {
                name_set: true,
                name: "vda".into(),
                alias: "containerdisk".into(),
                rd_reqs_set: true,
                rd_reqs: u64::MAX,
                ..Block::default()
            }],
            ..DomainStats::default()
        };
        let json = serde_json::to_string(&stats).unwrap();
        assert!(json.contains(r#""RdReqs":18446744073709551615"#), "{json}");
        assert_eq!(serde_json::from_str::<DomainStats>(&json).unwrap(), stats);
    }
}
