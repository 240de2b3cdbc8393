//! `container-disk`: the helper KubeVirt v1.9.0 runs inside container-disk and kernel-boot
//! images (`cmd/container-disk-v2alpha/main.c`).
//!
//! With the ImageVolume feature gate (on by default in v1.9.0, and the only mode this
//! project's controller renders) the disk image is a Kubernetes image volume, and the pod
//! still runs `/container-disk-binary/usr/bin/container-disk --no-op` once as an init container
//! in the disk image, with the launcher image mounted at `/container-disk-binary`: that only
//! makes the kubelet pull the image and report its digest. `--no-op` exits 0 at once.
//!
//! Without the gate KubeVirt runs it with `--copy-path <dir>/disk_<i>` as a long-running
//! container: it binds `<copy-path>.sock` so virt-handler can find the container's root file
//! system, and exits when that socket is removed. That mode is not implemented here and is
//! refused with a clear error.
//!
//! The binary runs from a foreign image that holds no C library, so it must be linked
//! statically (`images/build.sh` builds it with `-C target-feature=+crt-static`).

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "container-disk",
    about = "KubeVirt's container-disk helper: only --no-op (the ImageVolume mode) is supported"
)]
struct Args {
    /// Exit 0 at once (the init container that makes the kubelet resolve an image volume).
    #[arg(long)]
    no_op: bool,
    /// Bind `<PATH>.sock` and wait until it is removed (only without the ImageVolume feature
    /// gate; not supported here).
    #[arg(long, value_name = "PATH")]
    copy_path: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    // As in KubeVirt's, `--no-op` wins over everything else.
    if args.no_op {
        return ExitCode::SUCCESS;
    }
    match args.copy_path {
        Some(path) => eprintln!(
            "container-disk: --copy-path {path}: serving container disks over a socket is not \
             supported by this project (it needs the ImageVolume feature gate, which mounts \
             disks as image volumes); run with --no-op"
        ),
        None => eprintln!("container-disk: nothing to do: give --no-op"),
    }
    ExitCode::from(1)
}
