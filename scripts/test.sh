#!/usr/bin/env bash
# Runs every test of the workspace (unit, KVM, network-namespace, gRPC,
# qemu-img cross-checks, Kubernetes control plane, single-node cluster). Needs root and /dev/kvm.
#
# A first run on a fresh machine takes long, and says so as it goes: the Debian packages, the
# Go binaries (about 15-25 minutes of compiling once, then cached in ~/.cache/kubevirt-rs),
# the test build (about 15 minutes on 2 cores, then incremental), then the tests themselves
# (about 20-30 minutes: real VMs, namespaces, an API server, a kubelet).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/progress.sh
step "set-up: Debian packages and tools (scripts/setup.sh)"
bash scripts/setup.sh
step "building the Go binaries (first run only: ~15-25 min) while cargo builds the tests"
# The Go binaries (control plane, kubelet, containerd, ...) are built from Go modules once and
# cached; a cold build runs while cargo compiles the tests (it is niced, and the two overlap
# on machines with more cores).
go_log="$(mktemp)"
bash integration/controlplane/build.sh >"$go_log" 2>&1 &
go_build=$!
cargo test --workspace --no-run
# The project's images for the end-to-end tests on the cluster (integration/tests/cluster_e2e.rs):
# the same static, stripped programs as the release images, built with the dev profile (the
# tests would build them on first use too).
CARGO_INCREMENTAL=0 bash images/build.sh --profile dev --out "${CARGO_TARGET_DIR:-target}/e2e-images"
if ! wait "$go_build"; then
    cat "$go_log" >&2
    rm -f "$go_log"
    echo "test.sh: integration/controlplane/build.sh failed" >&2
    exit 1
fi
tail -n 1 "$go_log" >&2
rm -f "$go_log"
step "running every test"
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}"
step "done"
