//! What the VMM benchmarks share: their settings from the environment, which
//! `vmm` binaries to compare, how to run Firecracker beside them, how resident memory and the first `KVM_RUN`
//! are measured.

#![allow(dead_code)] // each benchmark uses a different subset

pub mod env;
pub mod firecracker;
pub mod kvm_run_trace;
pub mod rss;
pub mod threads;

/// CLOCK_MONOTONIC in nanoseconds (the clock `vmm run` stamps with
/// `VMM_TIMINGS=1` and perf's `-k CLOCK_MONOTONIC`).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec.cast_unsigned() * 1_000_000_000 + ts.tv_nsec.cast_unsigned()
}

/// The median of some values (NaN when there are none).
pub fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| !v.is_nan());
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

/// A `vmm` binary and extra `run` arguments, under a label.
pub struct Variant {
    pub label: String,
    pub binary: String,
    pub extra_args: Vec<String>,
}

/// From `BENCH_VARIANTS="label=/path/to/vmm [args...];label2=..."`, or this
/// build's `vmm` alone. Runs of the variants are interleaved, so that a
/// change in the machine's load hits all of them alike.
pub fn variants(this_build: &str) -> Vec<Variant> {
    let Ok(spec) = std::env::var("BENCH_VARIANTS") else {
        return vec![Variant {
            label: "this build".into(),
            binary: this_build.into(),
            extra_args: Vec::new(),
        }];
    };
    spec.split(';')
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            let (label, rest) = v
                .split_once('=')
                .expect("BENCH_VARIANTS entries are label=binary [args]");
            let mut words = rest.split_whitespace().map(str::to_string);
            let binary = words.next().expect("a binary after label=");
            Variant {
                label: label.trim().into(),
                binary,
                extra_args: words.collect(),
            }
        })
        .collect()
}

/// Sorted summary: min, median, p90, max.
pub fn summary(name: &str, unit: &str, mut values: Vec<f64>) {
    values.sort_by(|a, b| a.total_cmp(b));
    if values.is_empty() {
        return;
    }
    // Float to integer has no From/TryFrom: the rounded position lies in 0..len for q in 0..=1.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let at = |q: f64| values[((values.len() - 1) as f64 * q).round() as usize];
    println!(
        "{name:<34} min {:>9.2}  median {:>9.2}  p90 {:>9.2}  max {:>9.2} {unit}",
        at(0.0),
        at(0.5),
        at(0.9),
        at(1.0)
    );
}
