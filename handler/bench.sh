#!/usr/bin/env bash
# Benchmark of virt-handler in standalone mode: time from "VMI scheduled" (admitted with
# phase Scheduled and its pod created) to "Running" written, and the handler's resident
# memory with N VMIs running. Usage: sudo bash handler/bench.sh [N...]   (default: 1 20)
# Each VMI boots the test guest (images/examples/vmi-testguest.yaml).
# PROFILE=release builds and runs release binaries (default: debug); HANDLER=PATH runs
# another virt-handler binary with the launcher and VMM of PROFILE (comparing builds);
# BUILD=0 skips the build.
# HANDLER_LOG sets the handler's RUST_LOG (default: warn); with KEEP=1 the work directory
# (the handler's stdout and log) stays, e.g.
#   PROFILE=release HANDLER_LOG=virt_handler=debug KEEP=1 bash handler/bench.sh 1
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "bench.sh: run as root" >&2; exit 1; }
target=${CARGO_TARGET_DIR:-$(pwd)/target}
profile=${PROFILE:-debug}
case $profile in
    debug) cargo_profile=() ;;
    release) cargo_profile=(--release) ;;
    *) echo "bench.sh: PROFILE is debug or release" >&2; exit 1 ;;
esac
[[ ${BUILD:-1} == 0 ]] || cargo build "${cargo_profile[@]}" -p virt-handler -p virt-launcher -p vmm-cli --bins >&2
bin="$target/$profile"
handler=${HANDLER:-$bin/virt-handler}
counts=("$@")
[[ ${#counts[@]} -gt 0 ]] || counts=(1 20)

for n in "${counts[@]}"; do
    work=$(mktemp -d /tmp/handler-bench.XXXXXX)
    chmod 0755 "$work"
    "$bin/vmm" test-guest --output "$work/guest.elf"
    truncate -s 16M "$work/base.raw"
    chmod 0644 "$work/guest.elf" "$work/base.raw"
    manifests=()
    for i in $(seq 1 "$n"); do
        sed -e "s/name: testguest/name: bench-$i/" images/examples/vmi-testguest.yaml > "$work/bench-$i.yaml"
        manifests+=("$work/bench-$i.yaml")
    done
    out="$work/out.txt"
    RUST_LOG=${HANDLER_LOG:-warn} "$handler" standalone "${manifests[@]}" \
        --state-dir "$work/state" --launcher "$bin/virt-launcher-monitor" \
        --image "localhost/test-guest:latest=$work/guest.elf" \
        --image "localhost/test-disk:latest=$work/base.raw" > "$out" 2> "$work/err.txt" &
    pid=$!
    deadline=$((SECONDS + 300))
    # VMIs whose console showed DONE (a console client the launcher hung up for falling
    # behind reconnects and gets the output again: a VMI may show it twice).
    until [[ $(grep -o '^\[[^]]*\] console: DONE passed=' "$out" | sort -u | wc -l || true) -ge $n ]]; do
        if (( SECONDS > deadline )) || ! kill -0 "$pid" 2>/dev/null; then
            echo "bench.sh: $n VMIs did not all run their checks; see $work" >&2
            kill -INT "$pid" 2>/dev/null || true
            exit 1
        fi
        sleep 0.5
    done
    rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    hwm_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status")
    kill -INT "$pid"
    wait "$pid" || true
    times=$(grep -o 'phase Scheduled -> Running ([0-9.]* s' "$out" | awk '{print substr($5, 2)}' | sort -n)
    count=$(echo "$times" | grep -c . || true)
    median=$(echo "$times" | awk '{a[NR]=$1} END {if (NR % 2) print a[(NR+1)/2]; else printf "%.3f\n", (a[NR/2]+a[NR/2+1])/2}')
    echo "$profile VMIs=$n running=$count scheduled->Running: min=$(echo "$times" | head -1)s median=${median}s max=$(echo "$times" | tail -1)s handler RSS=${rss_kb} KiB (peak ${hwm_kb} KiB) load=$(cut -d' ' -f1-3 /proc/loadavg)"
    if [[ ${KEEP:-0} == 1 ]]; then
        echo "kept $work" >&2
    else
        rm -rf "$work"
    fi
done
