//! The VMI decision table on any VMI and pod the API server could hand us.
#![no_main]

use controller::vmi::decide::{PodView, decide};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // First byte splits the input: a VMI, then a pod.
    let Some((&split, rest)) = data.split_first() else { return };
    let (vmi, pod) = rest.split_at((split as usize).min(rest.len()));
    let Ok(vmi) = serde_json::from_slice::<proto::kubevirt::VirtualMachineInstance>(vmi) else {
        return;
    };
    let pods: Vec<PodView> = serde_json::from_slice::<k8s_openapi::api::core::v1::Pod>(pod)
        .map(|p| vec![PodView::from_pod(&p)])
        .unwrap_or_default();
    let _ = decide(&vmi, &pods, split % 2 == 0);
});
