//! Opening a volume's disk file once, without leaving the volume.
//!
//! A PVC's files and a host directory are written by others (the tenant's other pods, the
//! node), so a name there can be a link out of the volume, or become one between two
//! lookups. Each such file is looked up once, by `openat2` below its volume's directory
//! (`RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS`: a link that stays inside the volume still
//! works), its type checked with `fstat`, and the descriptor is handed on
//! ([`block::OpenedFile`]): nothing opens the file by its name again. The handler's
//! the handler's `podfs` does the same for its lookups in pods (a crate the launcher does not
//! link); KubeVirt's `pkg/safepath` is the model of both.
//!
//! The volume's directory itself is the launcher's own layout (`vmi-disks/<volume>`, `/dev`)
//! and is opened as any path of the launcher's.

use std::os::fd::OwnedFd;
use std::path::Path;

use block::OpenedFile;
use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag, fstat};

/// What a volume's disk must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    File,
    BlockDevice,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::File => "a regular file",
            Kind::BlockDevice => "a block device",
        }
    }
}

/// Links inside the volume are followed; anything leaving it, `/proc` magic links included,
/// is refused.
pub(crate) const IN_VOLUME: ResolveFlag =
    ResolveFlag::RESOLVE_BENEATH.union(ResolveFlag::RESOLVE_NO_MAGICLINKS);
/// No link at all (`/dev/<volume>`: the runtime makes the device node itself).
pub(crate) const NO_LINKS: ResolveFlag =
    ResolveFlag::RESOLVE_BENEATH.union(ResolveFlag::RESOLVE_NO_SYMLINKS);

/// Why a lookup failed, in words (the errno alone says little here).
fn explain(e: Errno) -> std::io::Error {
    let what = match e {
        Errno::EXDEV => ": it leads out of its volume",
        Errno::ELOOP => ": a link on the way, or too many",
        _ => "",
    };
    std::io::Error::new(std::io::Error::from(e).kind(), format!("{e}{what}"))
}

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    nix::fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(std::io::Error::from)
}

/// `name` below `dir` under `resolve`, `O_PATH` (no device is opened before its type is
/// known), of kind `kind`.
pub(crate) fn open(
    dir: &Path,
    name: &Path,
    resolve: ResolveFlag,
    kind: Kind,
) -> std::io::Result<OpenedFile> {
    let fd = open_path(&open_dir(dir)?, name, resolve).map_err(explain)?;
    check_kind(&fd, kind)?;
    Ok(OpenedFile::new(fd, dir.join(name)))
}

fn open_path(dir: &OwnedFd, name: &Path, resolve: ResolveFlag) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(resolve);
    openat2_retrying(dir, name, how)
}

/// `openat2`, tried again (64 times at most) on EAGAIN: with `RESOLVE_BENEATH` the kernel
/// answers EAGAIN when a mount or rename anywhere on the host raced the walk and asks the
/// caller to retry (openat2(2)); a node starting many pods mounts all the time. (The
/// handler's `podfs` does the same for its lookups.)
fn openat2_retrying(dir: &OwnedFd, name: &Path, how: OpenHow) -> nix::Result<OwnedFd> {
    let mut result = openat2(dir, name, how);
    for _ in 0..64 {
        if !matches!(result, Err(Errno::EAGAIN)) {
            break;
        }
        std::thread::yield_now();
        result = openat2(dir, name, how);
    }
    result
}

fn check_kind(fd: &OwnedFd, kind: Kind) -> std::io::Result<()> {
    let st = fstat(fd)?;
    let found = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
    let ok = match kind {
        Kind::File => found == SFlag::S_IFREG,
        Kind::BlockDevice => found == SFlag::S_IFBLK,
    };
    if ok {
        return Ok(());
    }
    let is = match found {
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        _ => "something else",
    };
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidInput,
        format!("it is {is}, not {}", kind.name()),
    ))
}

/// Opens the regular file `name` below `dir`, or creates it (`O_EXCL`: never through a link)
/// as a sparse file of `size` bytes.
pub(crate) fn open_or_create(dir: &Path, name: &Path, size: u64) -> std::io::Result<OpenedFile> {
    let dir_fd = open_dir(dir)?;
    // Twice at most: a file that appears between the two calls is opened the second time.
    for _ in 0..2 {
        match open_path(&dir_fd, name, IN_VOLUME) {
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(explain(e)),
            Ok(fd) => {
                check_kind(&fd, Kind::File)?;
                return Ok(OpenedFile::new(fd, dir.join(name)));
            }
        }
        let how = OpenHow::new()
            .flags(OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_CLOEXEC)
            .mode(Mode::from_bits_truncate(0o666))
            .resolve(IN_VOLUME);
        match openat2_retrying(&dir_fd, name, how) {
            Ok(fd) => {
                let file = std::fs::File::from(fd);
                file.set_len(size)?;
                return Ok(OpenedFile::new(file.into(), dir.join(name)));
            }
            // A dangling link is an existing name: opened again, it is refused.
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(explain(e)),
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AlreadyExists,
        "it exists but cannot be opened (a link to nowhere?)",
    ))
}
