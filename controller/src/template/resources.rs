//! The compute container's requests and limits (`renderresources.go`), rules in v1.9.0's order:
//! ephemeral storage, device-plugin resources, memory request, CPU, hugepages or memory
//! overhead, memory encryption devices.

use super::{
    EPHEMERAL_STORAGE_OVERHEAD, TemplateConfig, TemplateError, has_virtio_interface,
    is_cpu_dedicated, topology_vcpus, vcpus_for_request,
};
use crate::quantity::{Format, Qty};
use k8s_openapi::api::core::v1::ResourceRequirements;
use proto::kubevirt::{Quantity, VirtualMachineInstance};
use std::collections::BTreeMap;

type Resources = BTreeMap<String, Qty>;

pub(super) fn render(
    vmi: &VirtualMachineInstance,
    config: &TemplateConfig,
    overhead: Qty,
) -> Result<ResourceRequirements, TemplateError> {
    let domain = &vmi.spec.domain;
    let parse_all = |map: Option<&BTreeMap<String, Quantity>>, side: &str| {
        map.into_iter()
            .flatten()
            .map(|(name, q)| {
                Qty::parse(q).map(|qty| (name.clone(), qty)).map_err(|e| {
                    TemplateError::Invalid(format!("spec.domain.resources.{side}.{name}: {e}"))
                })
            })
            .collect::<Result<Resources, _>>()
    };
    let mut vm_requests = parse_all(
        domain.resources.as_ref().and_then(|r| r.requests.as_ref()),
        "requests",
    )?;
    let mut vm_limits = parse_all(
        domain.resources.as_ref().and_then(|r| r.limits.as_ref()),
        "limits",
    )?;
    let mut calculated_requests = Resources::new();
    let mut calculated_limits = Resources::new();

    // Ephemeral storage for the launcher's own files.
    let storage = Qty::parse(&Quantity(EPHEMERAL_STORAGE_OVERHEAD.into()))
        .map_err(|e| TemplateError::Invalid(e.to_string()))?;
    let requested = vm_requests
        .get("ephemeral-storage")
        .copied()
        .unwrap_or(Qty::ZERO);
    vm_requests.insert("ephemeral-storage".into(), requested.plus(storage));
    if let Some(limit) = vm_limits.get_mut("ephemeral-storage") {
        *limit = limit.plus(storage);
    }

    // Device plugins served by the handler. Extended resources go in limits; the kubelet
    // copies them to requests.
    let one = Qty {
        milli: 1000,
        format: Format::DecimalSi,
    };
    let devices = &domain.devices;
    if !devices.interfaces.is_empty() || devices.autoattach_pod_interface != Some(false) {
        vm_limits.insert("devices.kubevirt.io/tun".into(), one);
    }
    if has_virtio_interface(vmi) && !config.allow_emulation && config.request_vhost_net {
        vm_limits.insert("devices.kubevirt.io/vhost-net".into(), one);
    }
    if !config.allow_emulation {
        vm_limits.insert(format!("devices.kubevirt.io/{}", config.hypervisor), one);
    }
    if devices.autoattach_vsock == Some(true) {
        vm_limits.insert("devices.kubevirt.io/vhost-vsock".into(), one);
    }

    // Memory request: the request, else the limit, else the guest memory (over-committed).
    if let Some(limit) = vm_limits.get("memory").copied()
        && !limit.is_zero()
        && vm_requests.get("memory").is_none_or(Qty::is_zero)
    {
        vm_requests.insert("memory".into(), limit);
    }
    if !vm_requests.contains_key("memory")
        && let Some(guest) = domain.memory.as_ref().and_then(|m| m.guest.as_ref())
    {
        let guest = Qty::parse(guest)
            .map_err(|e| TemplateError::Invalid(format!("spec.domain.memory.guest: {e}")))?;
        if guest.value() > 0 {
            let request = if config.memory_overcommit == 100 {
                guest
            } else if config.memory_overcommit == 0 {
                return Err(TemplateError::Invalid("memory overcommit of 0%".into()));
            } else {
                let bytes = guest.value() * 100 / u128::from(config.memory_overcommit);
                Qty {
                    milli: bytes * 1000,
                    format: guest.format,
                }
            };
            vm_requests.insert("memory".into(), request);
        }
    }

    let io_threads = domain
        .extra
        .get("ioThreads")
        .and_then(|t| t.get("supplementalPoolThreadCount"))
        .and_then(|c| c.as_u64())
        .unwrap_or(0);
    if is_cpu_dedicated(vmi) {
        // Dedicated CPUs: whole cores, requests equal to limits, memory limit = request.
        let vcpus = domain.cpu.as_ref().map_or(0, topology_vcpus);
        let whole = |n: u64| Qty {
            milli: u128::from(n) * 1000,
            format: Format::BinarySi,
        };
        if vcpus != 0 {
            vm_limits.insert("cpu".into(), whole(vcpus + io_threads));
            vm_requests.insert("cpu".into(), whole(vcpus + io_threads));
        } else {
            for map in [&mut vm_limits, &mut vm_requests] {
                if let Some(cpu) = map.get_mut("cpu") {
                    *cpu = cpu.plus(whole(io_threads));
                }
            }
        }
        if domain.cpu.as_ref().and_then(|c| c.isolate_emulator_thread) == Some(true) {
            let limit = vm_limits.get("cpu").copied().unwrap_or(Qty::ZERO);
            vm_limits.insert("cpu".into(), limit.plus(whole(1)));
            if let Some(request) = vm_requests.get_mut("cpu") {
                *request = request.plus(whole(1));
            }
        }
        if let Some(memory) = vm_requests.get("memory").copied() {
            vm_limits.insert("memory".into(), memory);
        }
    } else {
        // vCPUs / cpuAllocationRatio, written below one core as milli-units ("100m").
        let total = vcpus_for_request(vmi) + io_threads;
        if total != 0 && config.cpu_allocation_ratio > 0 {
            let milli = u128::from(total) * 1000 / u128::from(config.cpu_allocation_ratio);
            calculated_requests.insert(
                "cpu".into(),
                Qty {
                    milli,
                    format: Format::DecimalSi,
                },
            );
        }
    }

    let hugepages = domain
        .memory
        .as_ref()
        .and_then(|m| m.hugepages.as_ref())
        .filter(|h| !h.is_null());
    if let Some(hugepages) = hugepages {
        // `WithHugePages`: the guest memory comes from hugepages (at most the guest size);
        // the memory request keeps the overhead and what the request has beyond the guest.
        let page_size = hugepages
            .get("pageSize")
            .and_then(|p| p.as_str())
            .ok_or_else(|| {
                TemplateError::Invalid("spec.domain.memory.hugepages.pageSize".into())
            })?;
        let guest = domain
            .memory
            .as_ref()
            .and_then(|m| m.guest.as_ref())
            .map(|g| {
                Qty::parse(g)
                    .map_err(|e| TemplateError::Invalid(format!("spec.domain.memory.guest: {e}")))
            })
            .transpose()?;
        let requested = vm_requests.get("memory").copied().unwrap_or(Qty::ZERO);
        let limited = vm_limits.get("memory").copied();
        let mut from_hugepages = requested;
        let mut request_rest = Qty::ZERO;
        let mut limit_rest = Qty::ZERO;
        if let Some(guest) = guest {
            if requested.value() > guest.value() {
                from_hugepages = guest;
                request_rest = Qty::ZERO.plus(requested).minus(guest);
            }
            if let Some(limit) = limited
                && limit.value() > guest.value()
            {
                limit_rest = Qty::ZERO.plus(limit).minus(guest);
            }
        }
        let resource = format!("hugepages-{page_size}");
        calculated_requests.insert(resource.clone(), from_hugepages);
        calculated_limits.insert(resource, from_hugepages);
        vm_requests.insert("memory".into(), request_rest.plus(overhead));
        if limited.is_some() {
            vm_limits.insert("memory".into(), limit_rest.plus(overhead));
        }
    } else {
        // The overhead goes on top of the request (unless the guest overhead is
        // overcommitted) and on any memory limit.
        let overcommit_overhead = domain
            .resources
            .as_ref()
            .and_then(|r| r.overcommit_guest_overhead)
            .unwrap_or(false);
        let request = vm_requests.get("memory").copied().unwrap_or(Qty::ZERO);
        vm_requests.insert(
            "memory".into(),
            if overcommit_overhead {
                request
            } else {
                request.plus(overhead)
            },
        );
        if let Some(limit) = vm_limits.get_mut("memory") {
            *limit = limit.plus(overhead);
        }
    }

    // Memory encryption needs the device plugin's device, in requests and limits alike.
    let security = super::scheduling::launch_security(vmi);
    let has = |kind: &str| security.is_some_and(|s| s.get(kind).is_some_and(|v| !v.is_null()));
    for (present, device) in [
        (has("sev") || has("snp"), "devices.kubevirt.io/sev"),
        (has("tdx"), "devices.kubevirt.io/tdx"),
    ] {
        if present {
            for map in [&mut calculated_requests, &mut calculated_limits] {
                let count = map.get(device).copied().unwrap_or(Qty::ZERO);
                map.insert(device.into(), count.plus(one));
            }
        }
    }

    let merge = |calculated: Resources, vm: Resources| {
        let mut all = calculated;
        all.extend(vm);
        all.into_iter()
            .map(|(k, v)| (k, v.to_quantity()))
            .collect::<BTreeMap<_, _>>()
    };
    Ok(ResourceRequirements {
        limits: Some(merge(calculated_limits, vm_limits)),
        requests: Some(merge(calculated_requests, vm_requests)),
        ..Default::default()
    })
}
