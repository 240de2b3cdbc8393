//! Any VMI the API server could hand us (JSON bytes) renders or is refused, never panics.
#![no_main]

use controller::template::{RenderContext, TemplateConfig, render_launcher_pod};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(vmi) = serde_json::from_slice::<proto::kubevirt::VirtualMachineInstance>(data) else {
        return;
    };
    let context = RenderContext {
        qemu_timeout_jitter_seconds: data.len() as u32,
        ..Default::default()
    };
    let _ = render_launcher_pod(&vmi, &TemplateConfig::default(), &context);
});
