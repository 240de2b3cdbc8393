//! How the launcher confines itself and its VMM.
//!
//! - The process (its tokio runtime: the cmd gRPC server, notify client,
//!   DHCP server, console log, disk and VM set-up) runs under a seccomp
//!   denylist installed first thing in `main` ([`vmm::sandbox::apply_host_denylist`]:
//!   no exec, fork (`clone` only for threads, `clone3` answered `ENOSYS`), ptrace,
//!   mounts, namespaces, module loading, bpf, ...).
//! - The VMM's threads (vCPUs, device threads, block I/O threads, console
//!   threads) each enter the VMM's sandbox ([`vmm::sandbox`]): in a root
//!   launcher (a root VMI) they first switch to KubeVirt's unprivileged
//!   `qemu` user (107), then no_new_privs, Landlock and their own seccomp
//!   allowlist.
//!
//! Two environment variables (not flags: KubeVirt's launcher flags stay as
//! they are) change it for debugging: `VMM_SECCOMP=none|log|trap` (default
//! `trap`) and `VMM_LANDLOCK=on|off` (default `on`).

use proto::kubevirt::well_known::NON_ROOT_UID;
use vmm::{Credentials, SandboxConfig, SeccompMode};

/// `none`, `log` or `trap`: what a system call outside a filter does.
pub(crate) const SECCOMP_ENV: &str = "VMM_SECCOMP";
/// `on` or `off`: Landlock for the VMM's threads.
pub(crate) const LANDLOCK_ENV: &str = "VMM_LANDLOCK";

/// The sandbox settings from the environment; an unknown value is an error.
pub fn from_env() -> Result<SandboxConfig, String> {
    let seccomp = match std::env::var(SECCOMP_ENV) {
        Ok(v) => v
            .parse::<SeccompMode>()
            .map_err(|e| format!("{SECCOMP_ENV}: {e}"))?,
        Err(_) => SeccompMode::default(),
    };
    let landlock = match std::env::var(LANDLOCK_ENV).as_deref() {
        Ok("on") | Err(_) => true,
        Ok("off") => false,
        Ok(other) => return Err(format!("{LANDLOCK_ENV}: expected on or off, got {other:?}")),
    };
    // KubeVirt's non-root launcher runs as this user; a root launcher's VMM
    // threads do too.
    let unprivileged = Some(Credentials {
        uid: NON_ROOT_UID,
        gid: NON_ROOT_UID,
    });
    Ok(SandboxConfig::new(seccomp, landlock, unprivileged))
}
