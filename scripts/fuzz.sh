#!/usr/bin/env bash
# Runs every cargo-fuzz target of the project (or only the TARGETs named)
# for SECONDS each (default 60), one after the other, and fails on the first
# crash (its input is kept under the target's fuzz/artifacts/).
#   scripts/fuzz.sh [SECONDS [TARGET...]] Needs a nightly toolchain and cargo-fuzz:
#   rustup toolchain install nightly && cargo install cargo-fuzz
# The same entry points also run on deterministic random input in the
# normal test suite; this script is the long, coverage-guided run.
set -euo pipefail

seconds=${1:-60}
shift || true
only=("$@")
root=$(cd "$(dirname "$0")/.." && pwd)
targets=(
    "vmm/block qcow2_header"
    "vmm/block qcow2_ops"
    "vmm/block qcow2_concurrent_ops"
    "vmm/disk-boot boot_disk"
    "vmm/virtio-devices blk_queue"
    "vmm/virtio-devices mmio_registers"
    "vmm/virtio-devices blk_concurrent"
    "vmm/virtio-devices net_queues"
    "vmm/virtio-devices rng_queue"
    "vmm legacy_port_io"
    # A whole stream (a vCPU's state alone is 6.2 KiB) is longer than libFuzzer's
    # default 4 KiB inputs.
    "vmm migration_stream -max_len=65536"
    "netsetup dhcp_answer"
    "proto domain_json"
    "proto vmi_manifest"
    "handler notify_event"
    "controller vmi_decide"
    "controller render_launcher_pod"
)
for entry in "${targets[@]}"; do
    read -r dir target extra <<<"$entry"
    if ((${#only[@]})) && [[ " ${only[*]} " != *" $target "* ]]; then
        continue
    fi
    echo "== $dir: $target ($seconds s)"
    (cd "$root/$dir/fuzz" && cargo +nightly fuzz run "$target" -- \
        -max_total_time="$seconds" -rss_limit_mb=2048 ${extra:-})
done
echo "fuzz.sh: every target ran $seconds s without a crash"
