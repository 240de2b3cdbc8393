#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build and test the project.
# Idempotent: skips what is already there.
set -euo pipefail

need=()
command -v protoc >/dev/null || need+=(protobuf-compiler)   # tonic/prost code generation
command -v qemu-img >/dev/null || need+=(qemu-utils)        # qcow2 cross-checks (tests only)
command -v nft >/dev/null || need+=(nftables)               # observing rules in tests only
command -v ip >/dev/null || need+=(iproute2)                # observing links in tests only
command -v objdump >/dev/null || need+=(binutils)           # test guest has no SSE
command -v isoinfo >/dev/null || need+=(genisoimage)        # reading cloud-init ISOs in tests
command -v xorriso >/dev/null || need+=(xorriso)            # reading cloud-init ISOs in tests
command -v bsdtar >/dev/null || need+=(libarchive-tools)    # reading cloud-init ISOs in tests
command -v setcap >/dev/null || PATH=$PATH:/usr/sbin command -v setcap >/dev/null \
  || need+=(libcap2-bin)                                     # file capability of the monitor in tests
command -v python3 >/dev/null || need+=(python3)            # a second gRPC client in tests
command -v cpio >/dev/null || need+=(cpio)                  # the stock-kernel tests' initramfs
for tool in bzip2 xz lzma lzop lz4 zstd; do                   # bzImage payloads as Linux's build packs them (tests)
  command -v $tool >/dev/null || case $tool in
    xz|lzma) need+=(xz-utils) ;; *) need+=($tool) ;; esac
done
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
[ -x /usr/sbin/runc ] || need+=(runc)                       # the test cluster's OCI runtime
[ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins) # the test cluster's pod network
dpkg -s busybox-static >/dev/null 2>&1 || need+=(busybox-static) # static busybox in test images
command -v openssl >/dev/null || need+=(openssl)            # the test cluster's certificates
# Boot disk images as distributions lay them out (test_guest::disks, the test disk image).
[ -x /usr/sbin/sgdisk ] || need+=(gdisk)                    # GPT
[ -x /sbin/sfdisk ] || [ -x /usr/sbin/sfdisk ] || need+=(fdisk) # MBR
[ -x /sbin/mkfs.ext4 ] || [ -x /usr/sbin/mkfs.ext4 ] || need+=(e2fsprogs) # ext4 filled with -d
[ -x /sbin/mkfs.vfat ] || [ -x /usr/sbin/mkfs.vfat ] || need+=(dosfstools) # EFI system partitions
command -v mcopy >/dev/null || need+=(mtools)               # files into FAT images
[ -x /sbin/mkfs.btrfs ] || [ -x /usr/sbin/mkfs.btrfs ] || need+=(btrfs-progs) # root filesystems
[ -x /sbin/mkfs.xfs ] || [ -x /usr/sbin/mkfs.xfs ] || need+=(xfsprogs) # a boot loader cannot read
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

# The launcher's tests call it from a second, independent gRPC implementation:
# Python grpcio (gRPC's C core), from PyPI into a private virtual environment.
grpc_venv=${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/grpc-venv
if ! "$grpc_venv/bin/python3" -c 'import grpc, grpc_tools' 2>/dev/null; then
  echo "setup: installing grpcio and grpcio-tools into $grpc_venv"
  python3 -m venv "$grpc_venv"
  "$grpc_venv/bin/python3" -m pip install --quiet 'grpcio==1.85.3' 'grpcio-tools==1.85.1'
fi

if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

# Debian's stock kernel and busybox, and the initramfs the stock-kernel
# tests boot (cached; see the script).
bash "$(dirname "$0")/stock-linux.sh"

if [ ! -e /dev/kvm ]; then
  echo "setup: /dev/kvm is missing: the VMM tests cannot run on this machine" >&2
  exit 1
fi
