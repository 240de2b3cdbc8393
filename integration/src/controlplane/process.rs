//! Child processes that cannot outlive the test binary.
//!
//! Three mechanisms, because each covers a different way the test binary ends:
//! - `Drop` of the owner kills the process group (normal end and unwinding panics);
//! - an `atexit` handler kills what is still registered (process-global instances, which are
//!   never dropped, and `std::process::exit` from the test harness);
//! - `PR_SET_PDEATHSIG(SIGKILL)` makes the kernel kill the child if the test binary dies
//!   without running either (SIGKILL, abort).
//!
//! The parent-death signal fires when the *thread* that forked the child exits, not the
//! process. Test threads end as soon as their test does, so every child is forked from one
//! dedicated thread that lives as long as the process.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

/// A running child with its own process group and a log file for stdout and stderr.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    /// The child's pid, which is also its process group id.
    pgid: libc::pid_t,
    log_path: PathBuf,
    cleanup_id: u64,
}

impl ManagedProcess {
    /// Spawns `command` (stdout and stderr appended to `log_path`) from the spawner thread.
    pub fn spawn(name: &str, mut command: Command, log_path: &Path) -> Result<Self> {
        let log = File::create(log_path)
            .with_context(|| format!("creating log file {}", log_path.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let parent = libc::pid_t::try_from(std::process::id()).context("own pid")?;
        // SAFETY: the closure runs between fork and exec and only calls async-signal-safe
        // functions (prctl, getppid) without allocating.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent may have died before the prctl took effect.
                if libc::getppid() != parent {
                    return Err(io::Error::other("parent exited before exec"));
                }
                Ok(())
            });
        }
        let child =
            spawn_from_long_lived_thread(command).with_context(|| format!("starting {name}"))?;
        let pgid = libc::pid_t::try_from(child.id()).context("child pid")?;
        let cleanup_id = register_for_exit_cleanup(Cleanup::Process(pgid));
        Ok(Self {
            name: name.to_owned(),
            child,
            pgid,
            log_path: log_path.to_owned(),
            cleanup_id,
        })
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The exit status if the process has ended.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The last `max_bytes` of the log, for error messages.
    pub fn log_tail(&self, max_bytes: u64) -> String {
        log_tail(&self.log_path, max_bytes)
    }

    /// Kills the whole process group and reaps the child.
    ///
    /// SIGKILL rather than SIGTERM: the data is thrown away, so a graceful shutdown would only
    /// cost time.
    pub fn kill(&mut self) {
        if self.exit_status().is_none() {
            kill_group(self.pgid);
        }
        let _ = self.child.wait();
        unregister_exit_cleanup(self.cleanup_id);
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Reads the end of a log file (lossy UTF-8); a description of the error if it cannot.
pub fn log_tail(path: &Path, max_bytes: u64) -> String {
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(max_bytes)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    read().unwrap_or_else(|e| format!("<cannot read {}: {e}>", path.display()))
}

fn kill_group(pgid: libc::pid_t) {
    // SAFETY: plain syscall; the group id is the pid of a child we have not reaped yet, so it
    // cannot have been reused by an unrelated process group.
    unsafe {
        libc::kill(-pgid, libc::SIGKILL);
    }
}

// ---- the spawner thread ----------------------------------------------------------------

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

fn spawn_from_long_lived_thread(command: Command) -> Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("controlplane-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .expect("spawning a thread at test start-up");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((command, reply_tx))
        .map_err(|_| anyhow!("the spawner thread has gone"))?;
    Ok(reply_rx
        .recv()
        .map_err(|_| anyhow!("the spawner thread has gone"))??)
}

// ---- cleanup at process exit -------------------------------------------------------------

#[derive(Debug)]
enum Cleanup {
    Process(libc::pid_t),
    Directory(PathBuf),
}

static EXIT_CLEANUPS: Mutex<BTreeMap<u64, Cleanup>> = Mutex::new(BTreeMap::new());

fn register_for_exit_cleanup(item: Cleanup) -> u64 {
    static NEXT_ID: AtomicU64 = AtomicU64::new(1);
    static ATEXIT: OnceLock<()> = OnceLock::new();
    ATEXIT.get_or_init(|| {
        // SAFETY: registers a plain `extern "C" fn()`; failure only loses the at-exit cleanup,
        // which PDEATHSIG still backs up for the processes.
        unsafe {
            libc::atexit(run_exit_cleanups);
        }
    });
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    EXIT_CLEANUPS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(id, item);
    id
}

fn unregister_exit_cleanup(id: u64) {
    EXIT_CLEANUPS
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .remove(&id);
}

/// Registers a directory to be removed at process exit (after the processes are killed).
/// Returns an id for [`forget_directory`].
pub fn remove_directory_at_exit(dir: &Path) -> u64 {
    register_for_exit_cleanup(Cleanup::Directory(dir.to_owned()))
}

/// Forgets a registration made by [`remove_directory_at_exit`].
pub fn forget_directory(id: u64) {
    unregister_exit_cleanup(id);
}

extern "C" fn run_exit_cleanups() {
    // try_lock: a thread stopped mid-update must not hang the exit; PDEATHSIG still applies.
    let Ok(mut items) = EXIT_CLEANUPS.try_lock() else {
        return;
    };
    let items = std::mem::take(&mut *items);
    let mut pids = Vec::new();
    for item in items.values() {
        if let Cleanup::Process(pid) = item {
            kill_group(*pid);
            pids.push(*pid);
        }
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in pids {
        // Reap so the directories below are no longer being written.
        while Instant::now() < deadline {
            let mut status = 0;
            // SAFETY: non-blocking waitpid on our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r != 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    for item in items.values() {
        if let Cleanup::Directory(dir) = item {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn killed_process_group_takes_grandchildren_along() {
        let dir = std::env::temp_dir().join(format!("cp-proc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut command = Command::new("sh");
        // The grandchild `sleep` shares the group; killing the group must end it too.
        command.args(["-c", "sleep 600 & echo $! ; wait"]);
        let mut process = ManagedProcess::spawn("sh", command, &dir.join("sh.log")).unwrap();
        let grandchild = {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let tail = process.log_tail(64);
                if let Ok(pid) = tail.trim().parse::<libc::pid_t>() {
                    break pid;
                }
                assert!(Instant::now() < deadline, "no pid in log: {tail:?}");
                std::thread::sleep(Duration::from_millis(10));
            }
        };
        assert!(process.exit_status().is_none());
        process.kill();
        assert!(process.exit_status().is_some());
        let deadline = Instant::now() + Duration::from_secs(10);
        // The grandchild is reparented (not our child), so poll for it to disappear.
        while Path::new(&format!("/proc/{grandchild}")).exists() {
            let stat =
                std::fs::read_to_string(format!("/proc/{grandchild}/stat")).unwrap_or_default();
            if stat.split_whitespace().nth(2) == Some("Z") {
                break; // a zombie waiting for its new parent is dead
            }
            assert!(
                Instant::now() < deadline,
                "grandchild {grandchild} survived"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn log_tail_of_missing_file_is_an_explanation() {
        let text = log_tail(Path::new("/nonexistent/cp.log"), 100);
        assert!(text.contains("cannot read"), "{text}");
    }
}
