#!/usr/bin/env bash
# Writes boot.order: the functions `vmm run` executes when it boots the test guest the way
# the boot benchmark does, for the linker to put next to each other (linker.sh), as names
# without their hashes (hashless.sed).
#
#   bash vmm/cli/text-order/generate.sh [VMM]       # regenerate from VMM (built as below)
#   bash vmm/cli/text-order/generate.sh --add-faults VMM  # then: relink, repeat until none
#   bash vmm/cli/text-order/generate.sh --check VMM # how many listed Rust functions VMM defines
#
# VMM defaults to the static `lean` build, as images/build.sh builds it:
#   CARGO_INCREMENTAL=0 RUSTFLAGS="-C target-feature=+crt-static \
#     -C link-arg=-Wl,-z,pack-relative-relocs -C linker=$PWD/vmm/cli/text-order/linker.sh" \
#     cargo build --profile lean --locked --target x86_64-unknown-linux-gnu -p vmm-cli
# (--add-faults needs the list linked in, which linker.sh does.)
# Needs valgrind (callgrind counts every function run), /dev/kvm and root (the VM runs).
# The list holds names without the hashes of the crates' build settings, so a toolchain, lock
# file or feature change leaves it valid; renamed or new functions make it match less, and
# linker.sh fails a `vmm` link that matches less than 90% of its Rust names.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
order=$here/boot.order
hashless() { sed -E -f "$here/hashless.sed"; }

defined_functions_unsorted() { nm --defined-only "$1" | awk '$2 ~ /^[tTwWi]$/ { print $3 }'; }
defined_functions() { defined_functions_unsorted "$1" | sort -u; }

if [[ ${1:-} == --add-faults ]]; then
    bin=${2:?usage: generate.sh --add-faults VMM}
    command -v perf >/dev/null || { echo "generate.sh: needs perf" >&2; exit 1; }
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$bin" test-guest --output "$work/guest.elf"
    perf record -q -o "$work/perf.data" -e exceptions:page_fault_user -- "$bin" run \
        --kernel "$work/guest.elf" --memory 128 --vcpus 1 \
        --cmdline 'checks=serial,smp exit=poweroff' --serial stdout >"$work/log" 2>&1
    perf script -i "$work/perf.data" -F trace >"$work/faults" 2>/dev/null
    nm --defined-only -n -S "$bin" | awk 'NF == 4 && $3 ~ /^[tTwWi]$/ { print $1, $2, $4 }' >"$work/symbols"
    entry=$(readelf -h "$bin" | awk '/Entry point/ { print $4 }')
    defined_functions "$bin" >"$work/names"
    hashless <"$work/names" | paste - "$work/names" >"$work/hashless"
    python3 - "$work/faults" "$work/symbols" "$entry" "$order" "$work/hashless" <<'PY'
import bisect, re, sys
faults, symbols, entry, order = sys.argv[1], sys.argv[2], int(sys.argv[3], 16), sys.argv[4]
syms = [(int(a, 16), int(size, 16), n) for a, size, n in (l.split() for l in open(symbols))]
addrs = [a for a, _, _ in syms]
listed = set(l.strip() for l in open(order) if l.strip())
# Full name -> name without hashes (hashless.sed), as the list holds them.
hashless = {full: short for short, full in (l.split("\t") for l in open(sys.argv[5]).read().splitlines())}
rows = [tuple(int(x, 16) for x in m.groups()) for m in
        (re.search(r"address=(0x[0-9a-f]+) ip=(0x[0-9a-f]+) error_code=(0x[0-9a-f]+)", l) for l in open(faults)) if m]
# A static-pie program's first fault fetches its entry point: that gives the load address.
base = rows[0][0] - entry
added = []
for address, _, error in rows:
    at = address - base
    i = bisect.bisect_right(addrs, at) - 1
    if error & 0x10 and i >= 0 and at < syms[i][0] + syms[i][1]:  # fetched from a function
        name = hashless.get(syms[i][2], syms[i][2])
        if name not in listed:
            listed.add(name)
            added.append(name)
with open(order, "a") as f:
    f.writelines(n + "\n" for n in added)
print(f"added {len(added)} functions to {order}: relink and repeat until none are added")
PY
    exit 0
fi
if [[ ${1:-} == --check ]]; then
    bin=${2:?usage: generate.sh --check VMM}
    listed=$(grep -E '^_(ZN|R)' "$order" | sort -u)
    found=$(defined_functions "$bin" | hashless | sort -u | comm -12 - <(echo "$listed") | wc -l)
    echo "text order: $found of $(echo "$listed" | grep -c .) listed Rust functions are defined in $bin"
    exit 0
fi

bin=${1:-$root/target/x86_64-unknown-linux-gnu/lean/vmm}
[[ -x $bin ]] || { echo "generate.sh: no program $bin (build it first, see the top of this file)" >&2; exit 1; }
command -v valgrind >/dev/null || { echo "generate.sh: needs valgrind (apt-get install valgrind)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The VMM's threads drop root before the process ends, when callgrind writes its file.
chmod 1777 "$work"
install -m 666 /dev/null "$work/callgrind.out"
"$bin" test-guest --output "$work/guest.elf"
# No seccomp filters (valgrind 3.19 cannot make the seccomp system call) and no Landlock
# (valgrind writes its file where the VMM's threads may not): the sandbox's functions, which
# compile and install the filters at every start, are added by name below.
if ! valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/callgrind.out" \
    "$bin" run --kernel "$work/guest.elf" --memory 128 --vcpus 1 \
    --cmdline 'checks=serial,smp exit=poweroff' --serial stdout --seccomp none --landlock off \
    >"$work/log" 2>&1; then
    cat "$work/log" >&2
    exit 1
fi
# Every function callgrind saw (fn= and cfn= lines name each once in full, later by number;
# a 'N suffix marks a recursion level), in order of first mention, if the program defines it.
grep -oE '^c?fn=\([0-9]+\) .+' "$work/callgrind.out" | sed -E "s/^c?fn=\([0-9]+\) //; s/'[0-9]+\$//" |
    awk '!seen[$0]++' >"$work/seen"
defined_functions_unsorted "$bin" | c++filt | paste - <(defined_functions_unsorted "$bin") |
    awk -F '\t' '$1 ~ /(vmm::sandbox::|seccompiler::)/ { print $2 }' >>"$work/seen"
{
    echo "# The functions a boot of the test guest runs (\`vmm run\`), in the order first run, as"
    echo "# symbol names without their hashes (hashless.sed); linker.sh matches them at link time."
    echo "# Made by generate.sh (README.md)."
    awk 'NR == FNR { defined[$1] = 1; next } ($0 in defined)' <(defined_functions "$bin") "$work/seen" |
        hashless | awk '!listed[$0]++'
} >"$order"
echo "wrote $order: $(grep -vc '^#' "$order") functions"
