//! Secondary vCPUs: each one checks in and halts; the boot vCPU counts them.
//!
//! A VMM either starts them at the entry point itself (Firecracker-style
//! direct start) or leaves them waiting for INIT/SIPI, as hardware and Linux
//! do. The `smp` check handles both: it waits briefly for direct starters,
//! then starts the rest through the real-mode trampoline. An AP that gets
//! started twice just checks in again, so vCPUs are counted by APIC id.

use core::sync::atomic::{AtomicU64, Ordering};

/// One bit per APIC id that checked in (ids below 64).
static SEEN_IDS: AtomicU64 = AtomicU64::new(0);

/// Entered by every vCPU but the boot one, on its own stack (see start.rs).
/// Returning parks the vCPU (`cli; hlt`).
#[unsafe(no_mangle)]
extern "C" fn ap_main(apic_id: u32, _rsi: u64) {
    if apic_id < 64 {
        SEEN_IDS.fetch_or(1 << apic_id, Ordering::SeqCst);
    }
}

/// vCPUs the platform says it has: CPUID leaf 1 EBX[23:16] when the HTT
/// flag is set, else 1.
pub fn expected_from_cpuid() -> u32 {
    let (_, ebx, _, edx) = crate::io::cpuid(1, 0);
    if edx & (1 << 28) != 0 {
        ((ebx >> 16) & 0xff).max(1)
    } else {
        1
    }
}

/// Secondary vCPUs seen so far: (count, bit mask of their APIC ids).
fn seen() -> (u32, u64) {
    let ids = SEEN_IDS.load(Ordering::SeqCst);
    (ids.count_ones(), ids)
}

/// Waits up to `timeout_ms` for `expected - 1` secondary vCPUs; returns
/// (secondaries seen, bit mask of their APIC ids).
pub fn wait_for_secondaries(expected: u32, timeout_ms: u32) -> (u32, u64) {
    let want = expected.saturating_sub(1);
    for _ in 0..timeout_ms {
        if seen().0 >= want {
            break;
        }
        crate::irq::sleep_ms(1);
    }
    seen()
}
