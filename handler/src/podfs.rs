//! Reaching into pods without leaving them.
//!
//! Everything under a pod's volumes and its root is written by the pod, so a path that
//! is looked up there, checked, then used again by name can be switched to a symlink in
//! between. Each lookup here is one `openat2` call that resolves the whole path in the
//! kernel under a rule, and the result is a file descriptor: later uses go through it
//! (`/proc/self/fd/N`, `*at` calls), never through the name again. As KubeVirt's
//! `pkg/safepath`, with openat2 (Linux 5.6) doing the walk.
//!
//! - [`open_beneath`]: under the kubelet's pods directory, no symlink at all (the
//!   launcher socket, the unresponsive marker).
//! - [`open_in_root`]: inside a launcher's root (`/proc/<pid>/root`), following links as
//!   the pod sees them but never above its root (the pod's `/var/run` → `/run`).
//! - [`PinnedSocket`]: a launcher socket held by an `O_PATH` descriptor, for dialling,
//!   `SO_PEERCRED` and reconnects that all reach the same socket.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use nix::sys::stat::{Mode, SFlag, fstat};

fn relative(path: &Path) -> PathBuf {
    path.components()
        .filter(|c| !matches!(c, Component::RootDir | Component::CurDir))
        .collect()
}

/// An io error of `errno`'s kind with `message`.
fn with_context(errno: nix::errno::Errno, message: String) -> std::io::Error {
    std::io::Error::new(std::io::Error::from(errno).kind(), message)
}

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| with_context(e, format!("{}: {e}", dir.display())))
}

/// How often a lookup is tried again when `openat2` answers EAGAIN.
const EAGAIN_RETRIES: usize = 64;

/// `openat2`, tried again on EAGAIN: with `RESOLVE_BENEATH` or `RESOLVE_IN_ROOT` the kernel
/// answers EAGAIN when a mount or rename anywhere on the host raced the walk (it cannot then
/// vouch that `..` stayed inside), and asks the caller to retry (openat2(2)). A node starting
/// many pods mounts all the time: a hundred pods started at once made one lookup fail, and
/// that VMI's launcher went without its notify pipe.
fn openat2_retrying(dir: &OwnedFd, path: &Path, how: OpenHow) -> nix::Result<OwnedFd> {
    let mut result = openat2(dir, path, how);
    for _ in 0..EAGAIN_RETRIES {
        if !matches!(result, Err(nix::errno::Errno::EAGAIN)) {
            break;
        }
        std::thread::yield_now();
        result = openat2(dir, path, how);
    }
    result
}

fn open_with(
    base: &Path,
    path: &Path,
    flags: OFlag,
    resolve: ResolveFlag,
) -> std::io::Result<OwnedFd> {
    let dir = open_dir(base)?;
    let inner = relative(path);
    let mut how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(resolve);
    // openat2 refuses a mode unless it creates.
    if flags.contains(OFlag::O_CREAT) {
        how = how.mode(Mode::from_bits_truncate(0o600));
    }
    openat2_retrying(&dir, &inner, how).map_err(|e| {
        let what = match e {
            nix::errno::Errno::ELOOP => "a symlink on the way",
            nix::errno::Errno::EXDEV => "it leads out of its directory",
            _ => "",
        };
        with_context(
            e,
            format!(
                "{} (in {}): {e}{}{what}",
                inner.display(),
                base.display(),
                if what.is_empty() { "" } else { ": " }
            ),
        )
    })
}

/// Opens `path` (relative to `base`, or absolute as seen from it) below `base`, refusing
/// any symlink and anything that leaves `base`.
pub(crate) fn open_beneath(base: &Path, path: &Path, flags: OFlag) -> std::io::Result<OwnedFd> {
    open_with(
        base,
        path,
        flags,
        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS,
    )
}

/// Opens `path` as a process whose root is `root` sees it: absolute links restart at
/// `root`, `..` stops there, `/proc` magic links are refused.
pub(crate) fn open_in_root(root: &Path, path: &Path, flags: OFlag) -> std::io::Result<OwnedFd> {
    open_with(
        root,
        path,
        flags,
        ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    )
}

/// The same with no symlink at all (KubeVirt's `JoinNoFollow` on a launcher root).
pub(crate) fn open_in_root_no_symlinks(
    root: &Path,
    path: &Path,
    flags: OFlag,
) -> std::io::Result<OwnedFd> {
    open_with(
        root,
        path,
        flags,
        ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_SYMLINKS,
    )
}

/// `/proc/self/fd/<fd>`: the file `fd` holds, as a path the kernel resolves to exactly it.
pub(crate) fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Whether `path` exists as an entry itself (a symlink is not followed).
pub(crate) fn entry_exists(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Creates `name` (a marker file) below `base` without following any link; an existing
/// entry is left as it is.
pub(crate) fn touch_beneath(base: &Path, path: &Path) -> std::io::Result<()> {
    open_beneath(
        base,
        path,
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK,
    )
    .map(drop)
}

/// A unix socket held by an `O_PATH` descriptor: every connection made through it
/// reaches the socket that was opened, whatever happens to its name afterwards.
#[derive(Debug)]
pub(crate) struct PinnedSocket {
    fd: OwnedFd,
    path: PathBuf,
}

impl PinnedSocket {
    /// Opens the socket at `path` under `pods_dir` without following any link.
    pub fn open(pods_dir: &Path, path: &Path) -> std::io::Result<Self> {
        let inner = path.strip_prefix(pods_dir).map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} is not under the pods directory {}",
                    path.display(),
                    pods_dir.display()
                ),
            )
        })?;
        let fd = open_beneath(pods_dir, inner, OFlag::O_PATH | OFlag::O_NOFOLLOW)?;
        let stat = fstat(&fd).map_err(std::io::Error::from)?;
        if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFSOCK {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{} is not a socket", path.display()),
            ));
        }
        Ok(PinnedSocket {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// The socket's name when it was opened (for messages and records).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn dial_path(&self) -> PathBuf {
        fd_path(&self.fd)
    }

    pub fn connect(&self) -> std::io::Result<std::os::unix::net::UnixStream> {
        std::os::unix::net::UnixStream::connect(self.dial_path())
    }

    pub async fn connect_async(&self) -> std::io::Result<tokio::net::UnixStream> {
        tokio::net::UnixStream::connect(self.dial_path()).await
    }
}

/// The peer PID of a connected unix stream.
pub(crate) fn peer_pid_of(stream: &std::os::unix::net::UnixStream) -> std::io::Result<u32> {
    let creds = getsockopt(stream, PeerCredentials).map_err(std::io::Error::from)?;
    match u32::try_from(creds.pid()) {
        Ok(0) => Err(std::io::Error::other(
            "the socket's owner PID is 0: it runs in a PID namespace this handler cannot see \
             (the handler must run in the host PID namespace, hostPID)",
        )),
        Ok(pid) => Ok(pid),
        Err(_) => Err(std::io::Error::other(format!(
            "invalid peer pid {}",
            creds.pid()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A walk through `..` (here `var/run` → `../run`, as in many images) while the host
    /// mounts and unmounts all the time, as a node starting a hundred pods does: the kernel
    /// answers some walks EAGAIN; every lookup must still succeed. (Without the retries
    /// this failed within a few thousand lookups on the 2-core build machine.)
    #[test]
    fn lookups_survive_a_host_busy_mounting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("run/kubevirt")).expect("mkdir");
        std::fs::create_dir_all(root.join("var")).expect("mkdir");
        std::os::unix::fs::symlink("../run", root.join("var/run")).expect("symlink");
        std::fs::write(root.join("run/kubevirt/x"), b"pod").expect("write");
        let target = dir.path().join("mnt");
        std::fs::create_dir(&target).expect("mkdir");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mounter = std::thread::spawn({
            let (stop, target) = (stop.clone(), target.clone());
            move || {
                let mut mounts = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    nix::mount::mount(
                        Some("tmpfs"),
                        &target,
                        Some("tmpfs"),
                        nix::mount::MsFlags::empty(),
                        None::<&str>,
                    )
                    .expect("mount a tmpfs (the tests run as root)");
                    nix::mount::umount(&target).expect("umount");
                    mounts += 1;
                }
                mounts
            }
        });
        let started = std::time::Instant::now();
        let mut lookups = 0u32;
        let failure = loop {
            if lookups >= 20_000 || started.elapsed() > std::time::Duration::from_secs(10) {
                break None;
            }
            lookups += 1;
            if let Err(e) = open_in_root(&root, Path::new("var/run/kubevirt/x"), OFlag::O_RDONLY) {
                break Some(e);
            }
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mounts = mounter.join().expect("the mounter");
        assert!(
            failure.is_none(),
            "lookup {lookups} failed ({mounts} mounts): {failure:?}"
        );
        assert!(mounts > 100, "the host hardly mounted: {mounts}");
    }

    #[test]
    fn beneath_refuses_links_and_escapes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("pods");
        std::fs::create_dir_all(base.join("p1/sockets")).expect("mkdir");
        std::fs::write(dir.path().join("outside"), b"x").expect("write");
        std::fs::write(base.join("p1/sockets/file"), b"x").expect("write");
        assert!(open_beneath(&base, Path::new("p1/sockets/file"), OFlag::O_RDONLY).is_ok());
        assert!(open_beneath(&base, Path::new("/p1/sockets/file"), OFlag::O_RDONLY).is_ok());
        std::os::unix::fs::symlink("file", base.join("p1/sockets/link")).expect("symlink");
        let err = open_beneath(&base, Path::new("p1/sockets/link"), OFlag::O_RDONLY)
            .expect_err("a link, even to a neighbour");
        assert!(err.to_string().contains("symlink"), "{err}");
        assert!(open_beneath(&base, Path::new("p1/../../outside"), OFlag::O_RDONLY).is_err());
        std::os::unix::fs::symlink(dir.path(), base.join("p2")).expect("symlink");
        assert!(open_beneath(&base, Path::new("p2/outside"), OFlag::O_RDONLY).is_err());
    }

    #[test]
    fn in_root_follows_links_as_the_pod_sees_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        std::fs::create_dir_all(root.join("run/kubevirt")).expect("mkdir");
        std::fs::create_dir_all(root.join("var")).expect("mkdir");
        std::os::unix::fs::symlink("/run", root.join("var/run")).expect("symlink");
        std::fs::write(root.join("run/kubevirt/x"), b"pod").expect("write");
        // Outside the root, at the place an absolute link would reach from the host.
        std::fs::create_dir_all(dir.path().join("etc")).expect("mkdir");
        std::fs::write(dir.path().join("etc/passwd"), b"host").expect("write");
        let fd = open_in_root(&root, Path::new("/var/run/kubevirt/x"), OFlag::O_RDONLY)
            .expect("through /var/run -> /run inside the root");
        let inode = std::fs::metadata(root.join("run/kubevirt/x"))
            .expect("x")
            .ino();
        assert_eq!(fstat(&fd).expect("fstat").st_ino, inode);
        // A planted link to "/.." and an absolute escape stay inside.
        std::os::unix::fs::symlink("/../../etc", root.join("run/kubevirt/up")).expect("symlink");
        assert!(
            open_in_root(&root, Path::new("/run/kubevirt/up/passwd"), OFlag::O_RDONLY).is_err()
        );
        std::fs::create_dir_all(root.join("etc")).expect("mkdir");
        std::fs::write(root.join("etc/passwd"), b"pod").expect("write");
        let fd = open_in_root(&root, Path::new("/run/kubevirt/up/passwd"), OFlag::O_RDONLY)
            .expect("the pod's own /etc/passwd");
        let pods = std::fs::metadata(root.join("etc/passwd"))
            .expect("passwd")
            .ino();
        assert_eq!(fstat(&fd).expect("fstat").st_ino, pods);
        assert!(
            open_in_root_no_symlinks(&root, Path::new("/var/run/kubevirt/x"), OFlag::O_RDONLY)
                .is_err()
        );
    }

    #[test]
    fn a_pinned_socket_keeps_reaching_the_socket_it_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        let sockets = pods.join("uid/volumes/kubernetes.io~empty-dir/sockets");
        std::fs::create_dir_all(&sockets).expect("mkdir");
        let path = sockets.join("launcher-sock");
        let _listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let pinned = PinnedSocket::open(&pods, &path).expect("pinned");
        assert_eq!(
            peer_pid_of(&pinned.connect().expect("connect")).expect("peer"),
            std::process::id()
        );
        // The name now leads elsewhere: the pinned socket still reaches the listener.
        let other = dir.path().join("other.sock");
        let _other = std::os::unix::net::UnixListener::bind(&other).expect("bind other");
        std::fs::rename(&path, sockets.join("moved")).expect("rename");
        std::os::unix::fs::symlink(&other, &path).expect("symlink");
        assert!(pinned.connect().is_ok());
        // Opening anew refuses the link, and a regular file is no socket.
        assert!(PinnedSocket::open(&pods, &path).is_err());
        std::fs::remove_file(&path).expect("rm");
        std::fs::write(&path, b"").expect("file");
        assert!(PinnedSocket::open(&pods, &path).is_err());
        assert!(PinnedSocket::open(&pods, &other).is_err(), "not under pods");
    }

    #[test]
    fn markers_are_created_without_following_links() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pods = dir.path().join("pods");
        std::fs::create_dir_all(pods.join("p/sockets")).expect("mkdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"keep").expect("write");
        std::os::unix::fs::symlink(&victim, pods.join("p/sockets/marker")).expect("symlink");
        assert!(touch_beneath(&pods, Path::new("p/sockets/marker")).is_err());
        assert_eq!(std::fs::read(&victim).expect("victim"), b"keep");
        touch_beneath(&pods, Path::new("p/sockets/new")).expect("create");
        assert!(entry_exists(&pods.join("p/sockets/new")));
        touch_beneath(&pods, Path::new("p/sockets/new")).expect("exists already");
    }
}
