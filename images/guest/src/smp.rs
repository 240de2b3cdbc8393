//! Secondary vCPUs: each one checks in and halts; the boot vCPU counts them.

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// vCPUs that reached `ap_main`.
static CHECKED_IN: AtomicU32 = AtomicU32::new(0);
/// One bit per APIC id that checked in (ids below 64).
static SEEN_IDS: AtomicU64 = AtomicU64::new(0);

/// Entered by every vCPU but the boot one, on its own stack (see start.rs).
/// Returning parks the vCPU (`cli; hlt`).
#[unsafe(no_mangle)]
extern "C" fn ap_main(apic_id: u32, _rsi: u64) {
    if apic_id < 64 {
        SEEN_IDS.fetch_or(1 << apic_id, Ordering::SeqCst);
    }
    CHECKED_IN.fetch_add(1, Ordering::SeqCst);
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

/// Waits up to `timeout_ms` for `expected - 1` secondary vCPUs; returns
/// (secondaries seen, bit mask of their APIC ids).
pub fn wait_for_secondaries(expected: u32, timeout_ms: u32) -> (u32, u64) {
    let want = expected.saturating_sub(1);
    for _ in 0..timeout_ms {
        if CHECKED_IN.load(Ordering::SeqCst) >= want {
            break;
        }
        crate::irq::sleep_ms(1);
    }
    (
        CHECKED_IN.load(Ordering::SeqCst),
        SEEN_IDS.load(Ordering::SeqCst),
    )
}
