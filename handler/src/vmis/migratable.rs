//! Whether a VMI can live-migrate, and how: the conditions `LiveMigratable` and
//! `StorageLiveMigratable` and `status.migrationMethod`, as KubeVirt v1.9.0's handler computes
//! them on every status update of a VMI it owns (`pkg/virt-handler/vm.go`:
//! `updateLiveMigrationConditions`, `calculateLiveMigrationCondition`,
//! `calculateLiveStorageMigrationCondition`, `checkVolumesForMigration`; the interface rule is
//! `pkg/network/vmispec` `VerifyVMIMigratable`). Pure functions of the VMI (its spec, its
//! annotations, `status.nodeName`, `status.volumeStatus`, `status.migratedVolumes`,
//! `status.topologyHints`) and of what the node offers.
//!
//! What this handler cannot know as v1.9.0's does, and what it assumes instead:
//!
//! - The cluster's configuration (the `KubeVirt` CR) is not read here: no network binding
//!   plugin is known to migrate, and the `VGPULiveMigration` gate counts as off.
//! - The node's host-model CPU ([`NODE_HOST_CPU_MODEL`]): this node's labeller publishes none.
//!
//! One rule is this project's own, checked after all of v1.9.0's ([`shared_writable_disk`]):
//! the launcher cannot hand a writable disk both pods open (a ReadWriteMany PVC, a shared
//! hostDisk) over to the target, so such a VMI is not called migratable.
//! See `handler/docs/migration.md`.

use proto::kubevirt::{Condition, Disk, VirtualMachineInstance};
use serde_json::Value;

/// `VirtualMachineInstanceIsMigratable`.
pub(crate) const LIVE_MIGRATABLE: &str = "LiveMigratable";
/// `VirtualMachineInstanceIsStorageLiveMigratable`.
pub(crate) const STORAGE_LIVE_MIGRATABLE: &str = "StorageLiveMigratable";

/// `status.migrationMethod` when local disks are copied during the migration.
pub(crate) const BLOCK_MIGRATION: &str = "BlockMigration";
/// `status.migrationMethod` when every disk is shared (or read-only).
pub(crate) const LIVE_MIGRATION: &str = "LiveMigration";

/// The host-model CPU this node offers (v1.9.0: `hostCpuModel`, the name its node labeller
/// found in libvirt's domain capabilities and publishes as `host-model-cpu.node.kubevirt.io/<name>`).
/// None: this node's labeller (`handler::node::labeller`) publishes no such label — the
/// launcher's VMM passes the host's CPU through for `host-model` as for `host-passthrough`,
/// and there is no model name that would tell two nodes' CPUs apart. Without the label
/// v1.9.0's migration controller cannot render a host-model VMI's target pod, so host-model
/// VMIs are not migratable (`CPUModeLiveMigratable`), as v1.9.0's handler says on a node
/// whose labeller found no host model.
pub(crate) const NODE_HOST_CPU_MODEL: Option<&str> = None;

/// `kubevirt.io/allow-pod-bridge-network-live-migration`: the bridge binding on the pod
/// network may migrate (its owner accepts that the guest keeps the source pod's address,
/// which the target pod does not have).
pub(crate) const ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION: &str =
    "kubevirt.io/allow-pod-bridge-network-live-migration";

/// The reasons of a `False` condition, as v1.9.0 spells them (`VirtualMachineInstanceReason…`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reason {
    Interface,
    CpuMode,
    HostDevice,
    Sev,
    Tdx,
    SecureExecution,
    PersistentReservation,
    NoTscFrequency,
    HypervPassthrough,
    Disks,
    /// `StorageLiveMigratable`'s one reason, whatever the checks found.
    NotMigratable,
}

impl Reason {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Interface => "InterfaceNotLiveMigratable",
            Reason::CpuMode => "CPUModeLiveMigratable",
            Reason::HostDevice => "HostDeviceNotLiveMigratable",
            Reason::Sev => "SEVNotLiveMigratable",
            Reason::Tdx => "TDXNotLiveMigratable",
            Reason::SecureExecution => "SecureExecutionNotLiveMigratable",
            Reason::PersistentReservation => "PersistentReservationNotLiveMigratable",
            Reason::NoTscFrequency => "NoTSCFrequencyNotLiveMigratable",
            Reason::HypervPassthrough => "HypervPassthroughNotLiveMigratable",
            Reason::Disks => "DisksNotLiveMigratable",
            Reason::NotMigratable => "NotMigratable",
        }
    }
}

/// What the checks say about one VMI.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Migratability {
    /// `LiveMigratable`: `True`, or `False` with the first failing check.
    pub live: Condition,
    /// `StorageLiveMigratable`: the checks without the volumes', every failure named.
    pub storage: Condition,
    /// `status.migrationMethod`: [`BLOCK_MIGRATION`] or [`LIVE_MIGRATION`].
    pub method: &'static str,
}

/// The checks of `vmi` on a node offering `host_cpu_model` (see [`NODE_HOST_CPU_MODEL`]).
pub(crate) fn migratability(
    vmi: &VirtualMachineInstance,
    host_cpu_model: Option<&str>,
) -> Migratability {
    let (block, volumes) = check_volumes(vmi);
    let interface = check_interfaces(vmi);
    let cpu = check_host_model(vmi, host_cpu_model);
    let host_devices = non_migratable_host_devices(vmi);
    let sev_or_tdx = sev_or_tdx(vmi);
    let tsc = tsc_frequency_required(vmi);
    let passthrough = hyperv_passthrough(vmi);

    // `calculateLiveMigrationCondition`: the first failing check, in v1.9.0's order, then
    // this project's own.
    let first = [
        interface.clone().err().map(|m| (Reason::Interface, m)),
        cpu.clone().err().map(|m| (Reason::CpuMode, m)),
        host_devices.map(|m| (Reason::HostDevice, m.to_string())),
        sev_or_tdx.map(|(r, m)| (r, m.to_string())),
        secure_execution(vmi).then(|| {
            (
                Reason::SecureExecution,
                "VMI uses Secure Execution".to_string(),
            )
        }),
        tsc.map(|m| (Reason::NoTscFrequency, m.to_string())),
        passthrough.then(|| {
            (
                Reason::HypervPassthrough,
                "VMI uses hyperv passthrough".to_string(),
            )
        }),
        volumes.err().map(|m| (Reason::Disks, m)),
        shared_writable_disk(vmi).map(|m| (Reason::Disks, m)),
    ]
    .into_iter()
    .flatten()
    .next();
    let live = match first {
        Some((reason, message)) => not_migratable(LIVE_MIGRATABLE, reason, message),
        None => migratable(LIVE_MIGRATABLE),
    };

    // `calculateLiveStorageMigrationCondition`: every failing check but the volumes' (and
    // Secure Execution's), plus persistent reservations, as "<reason>: <message>, ...".
    let failures: Vec<(Reason, String)> = [
        interface.err().map(|m| (Reason::Interface, m)),
        cpu.err().map(|m| (Reason::CpuMode, m)),
        host_devices.map(|m| (Reason::HostDevice, m.to_string())),
        sev_or_tdx.map(|(r, m)| (r, m.to_string())),
        persistent_reservation(vmi).then(|| {
            (
                Reason::PersistentReservation,
                "VMI uses SCSI persistent reservation".to_string(),
            )
        }),
        tsc.map(|m| (Reason::NoTscFrequency, m.to_string())),
        passthrough.then(|| {
            (
                Reason::HypervPassthrough,
                "VMI uses hyperv passthrough".to_string(),
            )
        }),
    ]
    .into_iter()
    .flatten()
    .collect();
    let storage = if failures.is_empty() {
        migratable(STORAGE_LIVE_MIGRATABLE)
    } else {
        let message = failures
            .iter()
            .map(|(reason, message)| format!("{}: {message}", reason.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        not_migratable(STORAGE_LIVE_MIGRATABLE, Reason::NotMigratable, message)
    };

    Migratability {
        live,
        storage,
        method: if block {
            BLOCK_MIGRATION
        } else {
            LIVE_MIGRATION
        },
    }
}

/// v1.9.0's conditions carry no times (`lastProbeTime`/`lastTransitionTime` zero).
fn migratable(kind: &str) -> Condition {
    Condition {
        condition_type: kind.to_string(),
        status: "True".into(),
        ..Default::default()
    }
}

fn not_migratable(kind: &str, reason: Reason, message: String) -> Condition {
    Condition {
        condition_type: kind.to_string(),
        status: "False".into(),
        reason: Some(reason.as_str().to_string()),
        message: Some(message),
        ..Default::default()
    }
}

/// `VerifyVMIMigratable`: the interface on the pod network must be masquerade or passt,
/// bridge with [`ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION`], or a binding plugin that
/// declares migration (none is known here). No interfaces, or no pod network: migratable.
fn check_interfaces(vmi: &VirtualMachineInstance) -> Result<(), String> {
    let interfaces = &vmi.spec.domain.devices.interfaces;
    if interfaces.is_empty() {
        return Ok(());
    }
    let Some(pod_network) = vmi.spec.networks.iter().find(|n| n.pod.is_some()) else {
        return Ok(());
    };
    let Some(primary) = interfaces.iter().find(|i| i.name == pod_network.name) else {
        return Err(format!(
            "no primary interface found for network {}",
            pod_network.name
        ));
    };
    if primary.masquerade.is_some() || primary.passt_binding.is_some() {
        return Ok(());
    }
    let annotated = vmi
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.contains_key(ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION));
    if primary.bridge.is_some() && annotated {
        return Ok(());
    }
    Err("cannot migrate VMI which does not use masquerade or a migratable plugin to connect to the pod network".into())
}

/// `isHostModelMigratable`: a `host-model` CPU needs a host model on the node.
fn check_host_model(
    vmi: &VirtualMachineInstance,
    host_cpu_model: Option<&str>,
) -> Result<(), String> {
    let host_model = vmi
        .spec
        .domain
        .cpu
        .as_ref()
        .is_some_and(|c| c.model.as_deref() == Some("host-model"));
    if host_model && host_cpu_model.is_none_or(str::is_empty) {
        let node = vmi
            .status
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        return Err(format!(
            "the node \"{node}\" does not allow migration with host-model"
        ));
    }
    Ok(())
}

/// The length of a list field in `extra` (absent or not a list: 0).
fn list_len(extra: &proto::kubevirt::Extra, key: &str) -> usize {
    extra.get(key).and_then(Value::as_array).map_or(0, Vec::len)
}

/// `vmiContainsNonMigratablePCIHostDevices` (the `VGPULiveMigration` gate off: the
/// cluster's configuration is not read here).
fn non_migratable_host_devices(vmi: &VirtualMachineInstance) -> Option<&'static str> {
    let devices = &vmi.spec.domain.devices.extra;
    if list_len(devices, "hostDevices") > 0 {
        return Some("VMI specifies non-migratable generic PCI host device");
    }
    match list_len(devices, "gpus") {
        0 => None,
        1 => Some("VMI specifies a GPU but feature gate VGPULiveMigration is not enabled"),
        _ => Some("VMI specifies too many GPUs"),
    }
}

/// `spec.domain.launchSecurity`, when set.
fn launch_security(vmi: &VirtualMachineInstance) -> Option<&Value> {
    vmi.spec
        .domain
        .extra
        .get("launchSecurity")
        .filter(|v| !v.is_null())
}

fn has_key(value: &Value, key: &str) -> bool {
    value.get(key).is_some_and(|v| !v.is_null())
}

/// `IsSEVVMI` (SEV or SEV-SNP), else `IsTDXVMI`.
fn sev_or_tdx(vmi: &VirtualMachineInstance) -> Option<(Reason, &'static str)> {
    let security = launch_security(vmi)?;
    if has_key(security, "sev") || has_key(security, "snp") {
        Some((Reason::Sev, "VMI uses SEV"))
    } else if has_key(security, "tdx") {
        Some((Reason::Tdx, "VMI uses TDX"))
    } else {
        None
    }
}

/// `IsSecureExecutionVMI`: launch security on s390x.
fn secure_execution(vmi: &VirtualMachineInstance) -> bool {
    launch_security(vmi).is_some() && vmi.spec.architecture.as_deref() == Some("s390x")
}

/// `GetTscFrequencyRequirement` = `RequiredForMigration` without TSC topology hints: a
/// Hyper-V reenlightenment guest needs the TSC frequency pinned to migrate (an `invtsc`
/// guest needs it to boot, which is another rule).
fn tsc_frequency_required(vmi: &VirtualMachineInstance) -> Option<&'static str> {
    let invtsc = vmi
        .spec
        .domain
        .cpu
        .as_ref()
        .and_then(|c| c.extra.get("features"))
        .and_then(Value::as_array)
        .is_some_and(|features| {
            features.iter().any(|f| {
                f.get("name").and_then(Value::as_str) == Some("invtsc")
                    && matches!(
                        f.get("policy").and_then(Value::as_str),
                        Some("require" | "force")
                    )
            })
        });
    let reenlightenment = vmi
        .spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.hyperv.as_ref())
        .and_then(|h| h.get("reenlightenment"))
        .and_then(|r| r.get("enabled"))
        .and_then(Value::as_bool)
        == Some(true);
    let hints = vmi
        .status
        .as_ref()
        .and_then(|s| s.extra.get("topologyHints"))
        .and_then(|h| h.get("tscFrequency"))
        .and_then(Value::as_i64)
        .is_some_and(|f| f > 0);
    (!invtsc && reenlightenment && !hints).then_some(
        "HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed on the cluster: guest timers might be inconsistent",
    )
}

/// `features.hypervPassthrough.enabled` (v1.9.0 dereferences `enabled`; unset counts as off).
fn hyperv_passthrough(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec
        .domain
        .features
        .as_ref()
        .and_then(|f| f.extra.get("hypervPassthrough"))
        .and_then(|p| p.get("enabled"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// `HasVMIPersistentReservation`: a LUN disk with `reservation: true`.
fn persistent_reservation(vmi: &VirtualMachineInstance) -> bool {
    vmi.spec.domain.devices.disks.iter().any(|d| {
        d.lun
            .as_ref()
            .and_then(|l| l.get("reservation"))
            .and_then(Value::as_bool)
            == Some(true)
    })
}

/// `isReadOnlyDisk`: a CD-ROM, unless `readonly: false`.
fn is_read_only_cdrom(disk: &Disk) -> bool {
    disk.cdrom
        .as_ref()
        .is_some_and(|c| c.readonly != Some(false))
}

/// What `status.volumeStatus[name].persistentVolumeClaimInfo` says, as v1.9.0's controller
/// records it from the claim: `None` when there is no such entry or no claim info.
fn claim_info<'a>(vmi: &'a VirtualMachineInstance, volume: &str) -> Option<&'a Value> {
    vmi.status
        .as_ref()?
        .volume_status
        .iter()
        .find(|s| s.name == volume)?
        .persistent_volume_claim_info
        .as_ref()
        .filter(|i| !i.is_null())
}

/// `HasSharedAccessMode`: `ReadWriteMany` among the claim's access modes.
fn has_shared_access_mode(info: &Value) -> bool {
    info.get("accessModes")
        .and_then(Value::as_array)
        .is_some_and(|modes| modes.iter().any(|m| m.as_str() == Some("ReadWriteMany")))
}

/// `IsMigratedVolume`: named in `status.migratedVolumes` (a volume migration's source).
fn is_migrated_volume(vmi: &VirtualMachineInstance, volume: &str) -> bool {
    vmi.status
        .as_ref()
        .and_then(|s| s.extra.get("migratedVolumes"))
        .and_then(Value::as_array)
        .is_some_and(|volumes| {
            volumes
                .iter()
                .any(|v| v.get("volumeName").and_then(Value::as_str) == Some(volume))
        })
}

fn pvc_not_shared(claim: &str) -> String {
    format!(
        "cannot migrate VMI: PVC {claim} is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
    )
}

/// `checkVolumesForMigration`: whether the migration copies disks (block migration), and
/// the first volume that cannot migrate. A PVC or DataVolume must be known (its claim info
/// in `status.volumeStatus`) to be ReadWriteMany; a hostDisk must be `shared` (unless it
/// stands for a claim); every other volume (container disk, empty disk, cloud-init,
/// ephemeral, config map, secret, ...) is local and copied, unless a read-only CD-ROM shows
/// it or virtiofs shares it.
fn check_volumes(vmi: &VirtualMachineInstance) -> (bool, Result<(), String>) {
    let mut block = vmi
        .status
        .as_ref()
        .and_then(|s| s.extra.get("migratedVolumes"))
        .and_then(Value::as_array)
        .is_some_and(|v| !v.is_empty());
    let filesystems: Vec<&str> = vmi
        .spec
        .domain
        .devices
        .extra
        .get("filesystems")
        .and_then(Value::as_array)
        .map(|fs| {
            fs.iter()
                .filter_map(|f| f.get("name").and_then(Value::as_str))
                .collect()
        })
        .unwrap_or_default();
    for volume in &vmi.spec.volumes {
        let claim = match (&volume.persistent_volume_claim, &volume.data_volume) {
            (Some(pvc), _) => Some(pvc.claim_name.clone()),
            (None, Some(dv)) => Some(
                dv.get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string(),
            ),
            (None, None) => None,
        };
        if let Some(claim) = claim {
            match claim_info(vmi, &volume.name) {
                None => {
                    return (
                        true,
                        Err(format!(
                            "cannot migrate VMI: Unable to determine if PVC {claim} is shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)"
                        )),
                    );
                }
                Some(info)
                    if !has_shared_access_mode(info) && !is_migrated_volume(vmi, &volume.name) =>
                {
                    return (true, Err(pvc_not_shared(&claim)));
                }
                Some(_) => {}
            }
        } else if let Some(host_disk) = &volume.host_disk {
            // A claim the handler turned into a hostDisk keeps its claim info.
            if let Some(info) = claim_info(vmi, &volume.name) {
                if !has_shared_access_mode(info) && !is_migrated_volume(vmi, &volume.name) {
                    let claim = info
                        .get("claimName")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    return (true, Err(pvc_not_shared(claim)));
                }
                continue;
            }
            if host_disk.shared != Some(true) {
                return (
                    true,
                    Err("cannot migrate VMI with non-shared HostDisk".into()),
                );
            }
        } else {
            if filesystems.contains(&volume.name.as_str()) {
                continue;
            }
            let read_only_cdrom = vmi
                .spec
                .domain
                .devices
                .disks
                .iter()
                .any(|d| d.name == volume.name && is_read_only_cdrom(d));
            if read_only_cdrom {
                continue;
            }
            block = true;
        }
    }
    (block, Ok(()))
}

/// This project's rule, not v1.9.0's: a writable disk on a volume both pods open (a PVC or
/// DataVolume, a hostDisk) cannot migrate with this launcher, which copies local disks
/// inside the migration stream but cannot hand a shared image's lock over to the target
/// (`vmm/src/migration/disks.rs`; the launcher refuses such a migration). v1.9.0 calls a
/// ReadWriteMany claim or a shared hostDisk migratable; here the VMI is not, with
/// `DisksNotLiveMigratable` and this message, so that admission refuses the migration
/// instead of the launcher failing it. Read-only disks stay shared and migrate.
fn shared_writable_disk(vmi: &VirtualMachineInstance) -> Option<String> {
    for volume in &vmi.spec.volumes {
        let what = if let Some(pvc) = &volume.persistent_volume_claim {
            format!("PVC {}", pvc.claim_name)
        } else if let Some(dv) = &volume.data_volume {
            format!(
                "PVC {}",
                dv.get("name").and_then(Value::as_str).unwrap_or_default()
            )
        } else if volume.host_disk.is_some() {
            match claim_info(vmi, &volume.name)
                .and_then(|i| i.get("claimName"))
                .and_then(Value::as_str)
            {
                Some(claim) => format!("PVC {claim}"),
                None => format!("hostDisk {}", volume.name),
            }
        } else {
            continue;
        };
        let written = vmi.spec.domain.devices.disks.iter().any(|d| {
            d.name == volume.name
                && !is_read_only_cdrom(d)
                && d.disk.as_ref().and_then(|t| t.readonly) != Some(true)
        });
        if written {
            return Some(format!(
                "cannot migrate VMI: {what} is shared and writable, and this launcher cannot hand a shared disk over to the migration target (only local disks are copied)"
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A VMI from KubeVirt's JSON: `spec` and `status` merged over a migratable base
    /// (masquerade on the pod network, a container disk, `host-passthrough`, node `n1`).
    fn vmi(patch: Value) -> VirtualMachineInstance {
        let mut base = json!({
            "metadata": {"name": "v", "namespace": "d", "uid": "u"},
            "spec": {
                "domain": {
                    "cpu": {"model": "host-passthrough"},
                    "devices": {
                        "disks": [{"name": "root", "disk": {"bus": "virtio"}}],
                        "interfaces": [{"name": "default", "masquerade": {}}]
                    }
                },
                "networks": [{"name": "default", "pod": {}}],
                "volumes": [{"name": "root", "containerDisk": {"image": "disk"}}]
            },
            "status": {"nodeName": "n1", "phase": "Running"}
        });
        merge(&mut base, patch);
        serde_json::from_value(base).expect("vmi")
    }

    /// RFC 7386 merge (`null` removes).
    fn merge(target: &mut Value, patch: Value) {
        match (target, patch) {
            (Value::Object(t), Value::Object(p)) => {
                for (k, v) in p {
                    if v.is_null() {
                        t.remove(&k);
                    } else {
                        merge(t.entry(k).or_insert(Value::Null), v);
                    }
                }
            }
            (t, p) => *t = p,
        }
    }

    fn summary(c: &Condition) -> (String, Option<String>, Option<String>) {
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    fn live(patch: Value) -> (String, Option<String>, Option<String>) {
        summary(&migratability(&vmi(patch), None).live)
    }

    fn reason_and_message(patch: Value) -> (String, String) {
        let (status, reason, message) = live(patch);
        assert_eq!(status, "False");
        (reason.expect("reason"), message.expect("message"))
    }

    #[test]
    fn masquerade_and_a_container_disk_migrate_by_block_migration() {
        let m = migratability(&vmi(json!({})), None);
        assert_eq!(summary(&m.live), ("True".into(), None, None));
        assert_eq!(summary(&m.storage), ("True".into(), None, None));
        assert_eq!(m.method, BLOCK_MIGRATION);
        assert_eq!(m.live.condition_type, LIVE_MIGRATABLE);
        assert_eq!(m.storage.condition_type, STORAGE_LIVE_MIGRATABLE);
        assert!(m.live.last_probe_time.is_none() && m.live.last_transition_time.is_none());
        // As KubeVirt writes it: type and status only.
        assert_eq!(
            serde_json::to_value(&m.live).expect("json"),
            json!({"type": "LiveMigratable", "status": "True"})
        );
    }

    #[test]
    fn every_reason_of_live_migratable() {
        let interface = "cannot migrate VMI which does not use masquerade or a migratable plugin to connect to the pod network";
        let unknown_pvc = "cannot migrate VMI: Unable to determine if PVC claim is shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)";
        let rwo_pvc = "cannot migrate VMI: PVC claim is not shared, live migration requires that all PVCs must be shared (using ReadWriteMany access mode)";
        let shared_writable = "cannot migrate VMI: PVC claim is shared and writable, and this launcher cannot hand a shared disk over to the migration target (only local disks are copied)";
        let claim_volume =
            json!({"volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "claim"}}]});
        let rwx = json!([{"name": "root", "persistentVolumeClaimInfo": {"claimName": "claim", "accessModes": ["ReadWriteMany"]}}]);
        let rwo = json!([{"name": "root", "persistentVolumeClaimInfo": {"claimName": "claim", "accessModes": ["ReadWriteOnce"]}}]);
        let cases: Vec<(&str, Value, &str, &str)> = vec![
            (
                "bridge on the pod network",
                json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}}}),
                "InterfaceNotLiveMigratable",
                interface,
            ),
            (
                "a binding plugin (none is known to migrate)",
                json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "binding": {"name": "l2bridge"}}]}}}}),
                "InterfaceNotLiveMigratable",
                interface,
            ),
            (
                "SR-IOV on the pod network",
                json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "sriov": {}}]}}}}),
                "InterfaceNotLiveMigratable",
                interface,
            ),
            (
                "no interface for the pod network",
                json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "other", "masquerade": {}}]}}}}),
                "InterfaceNotLiveMigratable",
                "no primary interface found for network default",
            ),
            (
                "host-model without a host model on the node",
                json!({"spec": {"domain": {"cpu": {"model": "host-model"}}}}),
                "CPUModeLiveMigratable",
                "the node \"n1\" does not allow migration with host-model",
            ),
            (
                "a host device",
                json!({"spec": {"domain": {"devices": {"hostDevices": [{"name": "h", "deviceName": "x/y"}]}}}}),
                "HostDeviceNotLiveMigratable",
                "VMI specifies non-migratable generic PCI host device",
            ),
            (
                "one GPU",
                json!({"spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": "x/y"}]}}}}),
                "HostDeviceNotLiveMigratable",
                "VMI specifies a GPU but feature gate VGPULiveMigration is not enabled",
            ),
            (
                "two GPUs",
                json!({"spec": {"domain": {"devices": {"gpus": [{"name": "g", "deviceName": "x/y"}, {"name": "h", "deviceName": "x/y"}]}}}}),
                "HostDeviceNotLiveMigratable",
                "VMI specifies too many GPUs",
            ),
            (
                "SEV",
                json!({"spec": {"domain": {"launchSecurity": {"sev": {}}}}}),
                "SEVNotLiveMigratable",
                "VMI uses SEV",
            ),
            (
                "SEV-SNP",
                json!({"spec": {"domain": {"launchSecurity": {"snp": {}}}}}),
                "SEVNotLiveMigratable",
                "VMI uses SEV",
            ),
            (
                "TDX",
                json!({"spec": {"domain": {"launchSecurity": {"tdx": {}}}}}),
                "TDXNotLiveMigratable",
                "VMI uses TDX",
            ),
            (
                "Secure Execution",
                json!({"spec": {"architecture": "s390x", "domain": {"launchSecurity": {}}}}),
                "SecureExecutionNotLiveMigratable",
                "VMI uses Secure Execution",
            ),
            (
                "Hyper-V reenlightenment without a TSC frequency",
                json!({"spec": {"domain": {"features": {"hyperv": {"reenlightenment": {"enabled": true}}}}}}),
                "NoTSCFrequencyNotLiveMigratable",
                "HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed on the cluster: guest timers might be inconsistent",
            ),
            (
                "Hyper-V passthrough",
                json!({"spec": {"domain": {"features": {"hypervPassthrough": {"enabled": true}}}}}),
                "HypervPassthroughNotLiveMigratable",
                "VMI uses hyperv passthrough",
            ),
            (
                "a PVC without claim info",
                json!({"spec": claim_volume.clone()}),
                "DisksNotLiveMigratable",
                unknown_pvc,
            ),
            (
                "a PVC whose volume status has no claim info",
                json!({"spec": claim_volume.clone(), "status": {"volumeStatus": [{"name": "root", "target": ""}]}}),
                "DisksNotLiveMigratable",
                unknown_pvc,
            ),
            (
                "a DataVolume without claim info",
                json!({"spec": {"volumes": [{"name": "root", "dataVolume": {"name": "claim"}}]}}),
                "DisksNotLiveMigratable",
                unknown_pvc,
            ),
            (
                "a ReadWriteOnce PVC",
                json!({"spec": claim_volume.clone(), "status": {"volumeStatus": rwo.clone()}}),
                "DisksNotLiveMigratable",
                rwo_pvc,
            ),
            (
                "a hostDisk that is not shared",
                json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk"}}]}}),
                "DisksNotLiveMigratable",
                "cannot migrate VMI with non-shared HostDisk",
            ),
            (
                "a claim turned hostDisk, ReadWriteOnce",
                json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk", "shared": true}}]},
                       "status": {"volumeStatus": rwo.clone()}}),
                "DisksNotLiveMigratable",
                rwo_pvc,
            ),
            (
                "a writable ReadWriteMany PVC (this launcher's rule)",
                json!({"spec": claim_volume.clone(), "status": {"volumeStatus": rwx.clone()}}),
                "DisksNotLiveMigratable",
                shared_writable,
            ),
            (
                "a writable shared hostDisk (this launcher's rule)",
                json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk", "shared": true}}]}}),
                "DisksNotLiveMigratable",
                "cannot migrate VMI: hostDisk root is shared and writable, and this launcher cannot hand a shared disk over to the migration target (only local disks are copied)",
            ),
        ];
        for (what, patch, reason, message) in cases {
            assert_eq!(
                reason_and_message(patch),
                (reason.to_string(), message.to_string()),
                "{what}"
            );
        }
    }

    #[test]
    fn what_stays_migratable() {
        let rwx = json!([{"name": "root", "persistentVolumeClaimInfo": {"claimName": "claim", "accessModes": ["ReadWriteOnce", "ReadWriteMany"]}}]);
        let read_only_root = json!([{"name": "root", "disk": {"bus": "virtio", "readonly": true}}]);
        let cases: Vec<(&str, Value)> = vec![
            (
                "bridge with the annotation",
                json!({"metadata": {"annotations": {ALLOW_POD_BRIDGE_MIGRATION_ANNOTATION: ""}},
                       "spec": {"domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}}}),
            ),
            (
                "passt",
                json!({"spec": {"domain": {"devices": {"interfaces": [{"name": "default", "passtBinding": {}}]}}}}),
            ),
            (
                "no interfaces",
                json!({"spec": {"domain": {"devices": {"interfaces": null}}}}),
            ),
            (
                "no pod network",
                json!({"spec": {"networks": [{"name": "default", "multus": {"networkName": "n"}}],
                                "domain": {"devices": {"interfaces": [{"name": "default", "bridge": {}}]}}}}),
            ),
            (
                "host-model on a node with a host model",
                json!({"spec": {"domain": {"cpu": {"model": "host-model"}}}}),
            ),
            (
                "no CPU model (the webhook stores one)",
                json!({"spec": {"domain": {"cpu": null}}}),
            ),
            (
                "dedicated CPUs",
                json!({"spec": {"domain": {"cpu": {"dedicatedCpuPlacement": true}}}}),
            ),
            (
                "reenlightenment with a TSC frequency hint",
                json!({"spec": {"domain": {"features": {"hyperv": {"reenlightenment": {"enabled": true}}}}},
                       "status": {"topologyHints": {"tscFrequency": 2_000_000_000_i64}}}),
            ),
            (
                "reenlightenment with invtsc required (a boot rule, not a migration rule)",
                json!({"spec": {"domain": {"cpu": {"features": [{"name": "invtsc", "policy": "require"}]},
                                           "features": {"hyperv": {"reenlightenment": {"enabled": true}}}}}}),
            ),
            (
                "launch security without SEV or TDX on amd64",
                json!({"spec": {"domain": {"launchSecurity": {}}}}),
            ),
            (
                "a read-only ReadWriteMany PVC",
                json!({"spec": {"domain": {"devices": {"disks": read_only_root.clone()}},
                                "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "claim"}}]},
                       "status": {"volumeStatus": rwx.clone()}}),
            ),
            (
                "a read-only shared hostDisk",
                json!({"spec": {"domain": {"devices": {"disks": read_only_root.clone()}},
                                "volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk", "shared": true}}]}}),
            ),
        ];
        for (what, patch) in cases {
            let host_model = Some("Skylake-Client-IBRS");
            let m = migratability(&vmi(patch), host_model);
            assert_eq!(summary(&m.live), ("True".into(), None, None), "{what}");
        }
    }

    #[test]
    fn the_first_failing_check_wins() {
        // Interface before CPU before host devices before SEV before the disks.
        let (reason, _) = reason_and_message(json!({"spec": {
            "domain": {"cpu": {"model": "host-model"}, "launchSecurity": {"sev": {}},
                       "devices": {"interfaces": [{"name": "default", "bridge": {}}], "gpus": [{"name": "g"}]}},
            "volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk"}}]}}));
        assert_eq!(reason, "InterfaceNotLiveMigratable");
        let (reason, _) = reason_and_message(json!({"spec": {
            "domain": {"launchSecurity": {"sev": {}}},
            "volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk"}}]}}));
        assert_eq!(reason, "SEVNotLiveMigratable");
    }

    #[test]
    fn storage_live_migratable_names_every_failure_but_the_volumes() {
        let all = vmi(json!({"spec": {
            "domain": {"cpu": {"model": "host-model"},
                       "launchSecurity": {"tdx": {}},
                       "features": {"hypervPassthrough": {"enabled": true}},
                       "devices": {"interfaces": [{"name": "default", "bridge": {}}],
                                   "hostDevices": [{"name": "h"}],
                                   "disks": [{"name": "root", "disk": {}},
                                             {"name": "lun", "lun": {"reservation": true}}]}},
            "volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk"}}]}}));
        let m = migratability(&all, None);
        assert_eq!(
            summary(&m.storage),
            (
                "False".into(),
                Some("NotMigratable".into()),
                Some(
                    "InterfaceNotLiveMigratable: cannot migrate VMI which does not use masquerade or a migratable plugin to connect to the pod network, \
                     CPUModeLiveMigratable: the node \"n1\" does not allow migration with host-model, \
                     HostDeviceNotLiveMigratable: VMI specifies non-migratable generic PCI host device, \
                     TDXNotLiveMigratable: VMI uses TDX, \
                     PersistentReservationNotLiveMigratable: VMI uses SCSI persistent reservation, \
                     HypervPassthroughNotLiveMigratable: VMI uses hyperv passthrough"
                        .into()
                )
            )
        );
        // Only the volumes fail: storage migration is possible, live migration is not.
        let disks_only = vmi(json!({"spec": {
            "volumes": [{"name": "root", "hostDisk": {"path": "/d.img", "type": "Disk"}}]}}));
        let m = migratability(&disks_only, None);
        assert_eq!(m.live.reason.as_deref(), Some("DisksNotLiveMigratable"));
        assert_eq!(summary(&m.storage), ("True".into(), None, None));
        // Secure Execution is LiveMigratable's only; reenlightenment is in both.
        let m = migratability(
            &vmi(json!({"spec": {"architecture": "s390x",
                "domain": {"launchSecurity": {}, "features": {"hyperv": {"reenlightenment": {"enabled": true}}}}}})),
            None,
        );
        assert_eq!(
            m.live.reason.as_deref(),
            Some("SecureExecutionNotLiveMigratable")
        );
        assert_eq!(
            m.storage.message.as_deref(),
            Some(
                "NoTSCFrequencyNotLiveMigratable: HyperV Reenlightenment VMIs cannot migrate when TSC Frequency is not exposed on the cluster: guest timers might be inconsistent"
            )
        );
    }

    #[test]
    fn migration_method_follows_the_local_volumes() {
        let method = |patch: Value| migratability(&vmi(patch), None).method;
        let rwx = json!([{"name": "root", "persistentVolumeClaimInfo": {"claimName": "claim", "accessModes": ["ReadWriteMany"]}}]);
        let pvc_only = json!({"spec": {"volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "claim"}}]},
                              "status": {"volumeStatus": rwx.clone()}});
        assert_eq!(
            method(pvc_only.clone()),
            LIVE_MIGRATION,
            "shared claims only"
        );
        assert_eq!(
            method(
                json!({"spec": {"volumes": [{"name": "root", "hostDisk": {"path": "/d", "type": "Disk", "shared": true}}]}})
            ),
            LIVE_MIGRATION,
            "a shared hostDisk"
        );
        let mut with = pvc_only.clone();
        merge(
            &mut with,
            json!({"status": {"migratedVolumes": [{"volumeName": "root"}]}}),
        );
        assert_eq!(method(with), BLOCK_MIGRATION, "a volume migration copies");
        for (what, volume) in [
            (
                "container disk",
                json!({"name": "x", "containerDisk": {"image": "i"}}),
            ),
            (
                "empty disk",
                json!({"name": "x", "emptyDisk": {"capacity": "1Gi"}}),
            ),
            (
                "cloud-init",
                json!({"name": "x", "cloudInitNoCloud": {"userData": "#cloud-config"}}),
            ),
            (
                "config drive",
                json!({"name": "x", "cloudInitConfigDrive": {"userData": "#cloud-config"}}),
            ),
            (
                "ephemeral",
                json!({"name": "x", "ephemeral": {"persistentVolumeClaim": {"claimName": "c"}}}),
            ),
            (
                "secret",
                json!({"name": "x", "secret": {"secretName": "s"}}),
            ),
            (
                "config map",
                json!({"name": "x", "configMap": {"name": "c"}}),
            ),
        ] {
            let mut v = pvc_only.clone();
            merge(
                &mut v,
                json!({"spec": {"volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "claim"}}, volume]}}),
            );
            assert_eq!(method(v), BLOCK_MIGRATION, "{what}");
        }
        // A local volume behind a read-only CD-ROM, or shared by virtiofs, is not copied.
        for (what, devices) in [
            (
                "read-only CD-ROM",
                json!({"disks": [{"name": "root", "disk": {}}, {"name": "x", "cdrom": {}}]}),
            ),
            (
                "virtiofs",
                json!({"filesystems": [{"name": "x", "virtiofs": {}}]}),
            ),
        ] {
            let mut v = pvc_only.clone();
            merge(
                &mut v,
                json!({"spec": {"domain": {"devices": devices},
                                "volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "claim"}},
                                            {"name": "x", "secret": {"secretName": "s"}}]}}),
            );
            assert_eq!(method(v), LIVE_MIGRATION, "{what}");
        }
        // A claim that cannot migrate makes it block migration, as v1.9.0 returns it.
        assert_eq!(
            method(
                json!({"spec": {"volumes": [{"name": "root", "persistentVolumeClaim": {"claimName": "claim"}}]}})
            ),
            BLOCK_MIGRATION
        );
    }
}
