#!/usr/bin/env bash
# Runs every test of the workspace (unit, KVM, network-namespace, gRPC,
# qemu-img cross-checks, Kubernetes control plane, single-node cluster). Needs root and /dev/kvm.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
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
cargo test --workspace --no-fail-fast -- --test-threads="${TEST_THREADS:-2}"
