#!/usr/bin/env bash
# Runs every test of the workspace (unit, KVM, network-namespace, gRPC,
# qemu-img cross-checks, Kubernetes control plane). Needs root and /dev/kvm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The control plane (kube-apiserver, etcd) is built from Go modules once and cached.
bash integration/controlplane/build.sh
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}"
