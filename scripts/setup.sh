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
command -v containerd >/dev/null || need+=(containerd)      # ctr import of built images in tests
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi

if command -v rustup >/dev/null; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

if [ ! -e /dev/kvm ]; then
  echo "setup: /dev/kvm is missing: the VMM tests cannot run on this machine" >&2
  exit 1
fi
