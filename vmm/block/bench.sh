#!/usr/bin/env bash
# Side-by-side benchmark: our `img bench` against `qemu-img bench`, on the
# same kind of files, in one run.
#
# Every case gets a fresh qcow2 overlay (64 KiB clusters) over a raw base, a
# qcow2 base and a compressed qcow2 base (`qemu-img convert -c` of base64
# text, as container disk images often are), for sequential and random ("-S" with a large odd stride, which
# qemu-img bench wraps around the disk) 4 KiB and 64 KiB reads and writes,
# with cache=none (O_DIRECT) and cache=writeback.
#
# Usage: vmm/block/bench.sh [WORKDIR]   (env: BASE_MB, DEPTHS, REPEAT, MAX_REQUESTS)
# Every case runs at each queue depth in DEPTHS (default "1 64"; 64 is
# qemu-img bench's default), both tools at the same depth.
# Each case runs REPEAT times per tool, alternating, and keeps the best run:
# shared machines are noisy.
# Our side runs `vmm img` (the vmm-cli crate's driver of the block engines).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/var/tmp/qcow2-bench}
base_mb=${BASE_MB:-256}
depths=${DEPTHS:-${DEPTH:-1 64}}
repeat=${REPEAT:-3}
max_requests=${MAX_REQUESTS:-8192}
qemu_img=${QEMU_IMG:-/usr/bin/qemu-img}

[ -x "$qemu_img" ] || { echo "qemu-img missing: apt-get install -y qemu-utils" >&2; exit 1; }
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
(cd "$root" && cargo build --quiet --release -p vmm-cli --bin vmm)
vmm="$CARGO_TARGET_DIR/release/vmm"

mkdir -p "$work"
cd "$work"
if [ ! -f base.raw ] || [ "$(stat -c %s base.raw)" -ne $((base_mb << 20)) ]; then
    head -c $((base_mb << 20)) /dev/urandom > base.raw
fi
[ -f base.qcow2 ] || "$qemu_img" convert -f raw -O qcow2 base.raw base.qcow2
if [ ! -f base.qcow2c ]; then
    # Compressible (about 3:4), unlike base.raw.
    # (base64 ends on SIGPIPE when head has enough: not a failure.)
    (base64 -w 76 /dev/urandom || true) | head -c $((base_mb << 20)) > text.raw
    "$qemu_img" convert -c -f raw -O qcow2 text.raw base.qcow2c
    rm -f text.raw
fi

size_bytes=$((base_mb << 20))
# Run one tool on a fresh overlay; print the seconds it reports.
run_case() { # tool base_fmt cache rw req_size stride count depth
    local tool=$1 bfmt=$2 cache=$3 rw=$4 rs=$5 stride=$6 count=$7 depth=$8
    rm -f ov.qcow2
    "$qemu_img" create -q -f qcow2 -b "base.$bfmt" -F "${bfmt%c}" ov.qcow2
    sync
    local args=(bench -f qcow2 -t "$cache" -d "$depth" -c "$count" -s "$rs" -S "$stride")
    [ "$rw" = write ] && args+=(-w)
    local out
    if [ "$tool" = qemu ]; then
        out=$("$qemu_img" "${args[@]}" ov.qcow2)
    else
        out=$("$vmm" img "${args[@]}" ov.qcow2)
    fi
    sed -n 's/^Run completed in \([0-9.]*\) seconds.*/\1/p' <<<"$out"
}

header=$(printf '%-6s %-10s %-5s %-4s %-6s' base cache op size pattern)
for depth in $depths; do
    header+=$(printf ' %10s %10s %6s' "QEMU d$depth" "ours d$depth" ratio)
done
echo "$header   (MB/s)"
for bfmt in raw qcow2 qcow2c; do
    for cache in none writeback; do
        for rw in read write; do
            for rs in 4096 65536; do
                for pattern in seq rand; do
                    if [ "$pattern" = seq ]; then stride=$rs; else stride=$((rs * 7919)); fi
                    # Enough requests to cover the disk once, at most max_requests.
                    count=$((size_bytes / rs)); [ $count -gt "$max_requests" ] && count=$max_requests
                    line=$(printf '%-6s %-10s %-5s %-4s %-6s' "$bfmt" "$cache" "$rw" "$((rs / 1024))k" "$pattern")
                    for depth in $depths; do
                        tq=999999; to=999999
                        for _ in $(seq "$repeat"); do
                            t=$(run_case qemu "$bfmt" "$cache" "$rw" "$rs" "$stride" "$count" "$depth")
                            tq=$(awk -v a="$tq" -v b="$t" 'BEGIN{print (b < a) ? b : a}')
                            t=$(run_case ours "$bfmt" "$cache" "$rw" "$rs" "$stride" "$count" "$depth")
                            to=$(awk -v a="$to" -v b="$t" 'BEGIN{print (b < a) ? b : a}')
                        done
                        mbq=$(awk -v c="$count" -v s="$rs" -v t="$tq" 'BEGIN{printf "%.1f", c*s/t/1048576}')
                        mbo=$(awk -v c="$count" -v s="$rs" -v t="$to" 'BEGIN{printf "%.1f", c*s/t/1048576}')
                        ratio=$(awk -v a="$tq" -v b="$to" 'BEGIN{printf "%.2f", a/b}')
                        line+=$(printf ' %10s %10s %6s' "$mbq" "$mbo" "$ratio")
                    done
                    echo "$line"
                done
            done
        done
    done
done
rm -f ov.qcow2
