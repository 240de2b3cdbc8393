//! What a seccomp filter adds to each system call of a VMM thread (not a
//! test): the same call a million times on a thread without a filter and on
//! one with the thread kind's filter (as the VMM installs it), interleaved
//! rounds, nanoseconds per call. The calls fail at once (a bad descriptor),
//! so the difference is the filter's own cost. Multiply by the system calls
//! a request makes (`strace -c`) for its cost per request.
//!
//! Also what the sandbox adds to start-up: compiling every filter
//! (`Sandbox::new`, once per VM) and entering the sandbox (per thread:
//! credentials, no_new_privs, Landlock, the filter).
//!
//! Run: `cargo bench -p vmm --bench seccomp` (SECCOMP_BENCH_ROUNDS, default 7).

use std::time::Instant;

use vmm::sandbox::{Sandbox, SandboxConfig, SeccompMode, ThreadKind};

const CALLS: u32 = 1_000_000;
const KVM_RUN: libc::c_ulong = 0xae80;

/// The call a thread of `kind` makes most: KVM_RUN for a vCPU, a read for
/// the others (eventfds, disk).
fn hot_call(kind: ThreadKind) {
    // SAFETY: both calls get an invalid descriptor and fail with EBADF.
    unsafe {
        match kind {
            ThreadKind::Vcpu => {
                libc::ioctl(-1, KVM_RUN, 0);
            }
            ThreadKind::BlockIo | ThreadKind::VirtioBlock => {
                libc::pread(-1, std::ptr::null_mut(), 0, 0);
            }
            _ => {
                libc::read(-1, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Nanoseconds per call on a fresh thread, filtered or not.
fn measure(kind: ThreadKind, filter: Option<seccompiler::BpfProgram>) -> f64 {
    std::thread::spawn(move || {
        if let Some(program) = filter {
            seccompiler::apply_filter(&program).expect("install the filter");
        }
        let start = Instant::now();
        for _ in 0..CALLS {
            hot_call(kind);
        }
        start.elapsed().as_nanos() as f64 / f64::from(CALLS)
    })
    .join()
    .expect("bench thread")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Microseconds to enter the full sandbox of a vCPU thread, on a fresh
/// thread.
fn enter_us(sandbox: &std::sync::Arc<Sandbox>) -> f64 {
    let sandbox = sandbox.clone();
    std::thread::spawn(move || {
        let start = Instant::now();
        sandbox.enter(ThreadKind::Vcpu).expect("enter the sandbox");
        start.elapsed().as_nanos() as f64 / 1e3
    })
    .join()
    .expect("bench thread")
}

fn main() {
    let rounds: usize = std::env::var("SECCOMP_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(7);
    let config = SandboxConfig {
        seccomp: SeccompMode::Trap,
        ..SandboxConfig::disabled()
    };
    let sandbox = Sandbox::new(config, Vec::new()).expect("filters");
    println!(
        "seccomp cost per system call, median of {rounds} interleaved rounds of {CALLS} calls"
    );
    println!(
        "{:<14} {:>12} {:>12} {:>10} {:>8}",
        "thread kind", "no filter ns", "filter ns", "cost ns", "BPF len"
    );
    for kind in [
        ThreadKind::Vcpu,
        ThreadKind::VirtioBlock,
        ThreadKind::BlockIo,
        ThreadKind::VirtioNet,
    ] {
        let program = sandbox.filter(kind).expect("a filter").clone();
        let (mut bare, mut filtered) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            bare.push(measure(kind, None));
            filtered.push(measure(kind, Some(program.clone())));
        }
        let (b, f) = (median(bare), median(filtered));
        println!(
            "{:<14} {:>12.1} {:>12.1} {:>10.1} {:>8}",
            format!("{kind:?}"),
            b,
            f,
            f - b,
            program.len()
        );
    }
    let (mut compile, mut enter) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let start = Instant::now();
        let full = Sandbox::new(SandboxConfig::default(), Vec::new()).expect("filters");
        compile.push(start.elapsed().as_nanos() as f64 / 1e3);
        enter.push(enter_us(&full));
    }
    println!(
        "start-up: compiling every filter {:.1} us (once per VM), entering a vCPU thread's sandbox {:.1} us (per thread), medians",
        median(compile),
        median(enter)
    );
}
