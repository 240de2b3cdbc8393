//! Landlock for a VMM thread: no file system access (the thread works on
//! descriptors opened at start-up, which Landlock leaves alone), no TCP,
//! no connecting to abstract unix sockets. Control threads may remove
//! files in the directories given (the console socket's).
//!
//! Best effort: each right the running kernel does not know is dropped; a
//! kernel without Landlock (or with it disabled) leaves the thread to its
//! other layers, which is logged once. Signal scoping is not asked for:
//! before Linux 6.14, threads of one process in different Landlock domains
//! could not signal each other, and the VMM kicks vCPU threads with a
//! signal.

use std::io;
use std::path::PathBuf;
use std::sync::Once;

use landlock::{
    ABI, Access, AccessFs, AccessNet, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope,
};

/// The newest Landlock ABI this code asks for.
const ABI_WANTED: ABI = ABI::V6;

pub(super) fn restrict_thread(removable_in: &[PathBuf]) -> io::Result<()> {
    let status = build(removable_in).map_err(|e| io::Error::other(format!("landlock: {e}")))?;
    if status == RulesetStatus::NotEnforced {
        static LOGGED: Once = Once::new();
        LOGGED.call_once(|| {
            tracing::warn!(
                "Landlock is not available in this kernel: VMM threads keep file access \
                 (still non-root, no_new_privs and seccomp-filtered)"
            );
        });
    }
    Ok(())
}

fn build(removable_in: &[PathBuf]) -> Result<RulesetStatus, landlock::RulesetError> {
    let mut ruleset = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI_WANTED))?
        .handle_access(AccessNet::from_all(ABI_WANTED))?
        .scope(Scope::AbstractUnixSocket)?
        .create()?;
    for dir in removable_in {
        // A directory that cannot be opened gets no rule: the file stays.
        if let Ok(fd) = PathFd::new(dir) {
            ruleset = ruleset.add_rule(PathBeneath::new(fd, AccessFs::RemoveFile))?;
        }
    }
    Ok(ruleset.restrict_self()?.ruleset)
}
