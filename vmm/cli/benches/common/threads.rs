//! CPU time of a process's threads, by thread name, for the block
//! benchmarks (`blk`, `guest_io`).

use std::collections::HashMap;

/// CPU nanoseconds per thread name (several threads may share one), from
/// `/proc/<pid>/task/*/schedstat`; empty once the process is gone.
pub fn thread_cpu(pid: u32) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let path = task.path();
        let comm = std::fs::read_to_string(path.join("comm")).unwrap_or_default();
        let ns = std::fs::read_to_string(path.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0);
        *out.entry(comm.trim().to_string()).or_default() += ns;
    }
    out
}

/// CPU nanoseconds between two readings, summed over the threads whose
/// name `is_in` accepts and over the others: (accepted, others).
pub fn split_delta(
    before: &HashMap<String, u64>,
    after: &HashMap<String, u64>,
    is_in: impl Fn(&str) -> bool,
) -> (u64, u64) {
    let (mut inside, mut outside) = (0, 0);
    for (name, &ns) in after {
        let d = ns.saturating_sub(before.get(name).copied().unwrap_or(0));
        if is_in(name) {
            inside += d;
        } else {
            outside += d;
        }
    }
    (inside, outside)
}
