//! Running work inside another network namespace.
//!
//! `setns(CLONE_NEWNET)` changes the namespace of the calling *thread* only, and a thread
//! that switched cannot be trusted to go back cleanly (a failed switch back would leave a
//! pool thread in the pod's namespace). So the work runs on a fresh thread that enters the
//! namespace, runs the closure and ends; the caller's thread never changes namespace.

use std::fs::File;
use std::path::{Path, PathBuf};

use nix::sched::{CloneFlags, setns};

/// Which network namespace to enter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetnsTarget {
    /// A namespace file, e.g. `/var/run/netns/NAME` or `/proc/PID/ns/net`.
    Path(PathBuf),
    /// The namespace of a process, through `/proc/PID/ns/net`.
    Pid(u32),
}

impl NetnsTarget {
    /// The namespace file this target names.
    pub fn path(&self) -> PathBuf {
        match self {
            NetnsTarget::Path(path) => path.clone(),
            NetnsTarget::Pid(pid) => PathBuf::from(format!("/proc/{pid}/ns/net")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    #[error("cannot open network namespace {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot enter network namespace {path}: {source}")]
    Enter { path: PathBuf, source: nix::Error },
    #[error("cannot start the namespace worker thread: {0}")]
    Spawn(std::io::Error),
    #[error("the namespace worker thread panicked")]
    WorkerPanicked,
}

/// Runs `work` on a dedicated thread that has entered the network namespace `target`,
/// and returns its result. Sockets opened by `work` belong to that namespace and stay
/// usable after it returns.
pub fn run_in<T, F>(target: &NetnsTarget, work: F) -> Result<T, NetnsError>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let path = target.path();
    // Open in the caller's thread so relative paths and /proc/self/... resolve as the caller means.
    let ns_file = File::open(&path).map_err(|source| NetnsError::Open {
        path: path.clone(),
        source,
    })?;
    let worker = std::thread::Builder::new()
        .name("netsetup-netns".into())
        .spawn(move || -> Result<T, NetnsError> {
            enter(&ns_file, &path)?;
            Ok(work())
        })
        .map_err(NetnsError::Spawn)?;
    worker.join().map_err(|_| NetnsError::WorkerPanicked)?
}

fn enter(ns_file: &File, path: &Path) -> Result<(), NetnsError> {
    setns(ns_file, CloneFlags::CLONE_NEWNET).map_err(|source| NetnsError::Enter {
        path: path.to_path_buf(),
        source,
    })
}
