#!/usr/bin/env bash
# Linker wrapper for the `lean` build (images/build.sh sets it with `-C linker=`): links as
# `cc` would, and for `vmm` and `virt-launcher` first packs the functions a VM's boot runs at
# the start of `.text` (LLD's `--symbol-ordering-file`; README.md here says why).
#
# `boot.order` names those functions without the hashes that Rust's symbol names carry
# (`hashless.sed`: they change with the toolchain, the lock file, flags and features, and
# made a list of full names go stale silently). Here, at link time, each name is matched
# against the symbols the objects being linked define, and every symbol with that name goes
# into the linker's list, in the list's order. A list that matches too little of a `vmm`
# (the program it is made from) fails the link, so a stale list stops the build instead of
# being ignored.
#
# Its name must not look like a linker's to rustc (`link`, `ld`, `*-gcc`, …): rustc then
# keeps the target's linker flavor and passes what it passes to `cc` (self-contained LLD).
# TEXT_ORDER=off links without the list (for side-by-side measurements).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cc=cc
[[ ${TEXT_ORDER:-on} == off ]] && exec "$cc" "$@"

# The arguments, with rustc's response files (`@file`, one argument per line) read.
args=()
for a in "$@"; do
    if [[ $a == @* && -f ${a#@} ]]; then
        mapfile -t more <"${a#@}"
        args+=("${more[@]}")
    else
        args+=("$a")
    fi
done
out=
for ((i = 0; i + 1 < ${#args[@]}; i++)); do
    [[ ${args[i]} == -o ]] && out=${args[i + 1]}
done
# cargo links `deps/<name>-<hash>`, with the name's dashes as underscores.
program=$(basename "$out")
program=${program%-*}
case $program in
    vmm | virt_launcher) ;;
    *) exec "$cc" "$@" ;;
esac

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
objects=()
for a in "${args[@]}"; do
    [[ $a == *.o || $a == *.rlib ]] && [[ -f $a ]] && objects+=("$a")
done
# Defined functions: "hashless-name<TAB>name". nm fails on archive members it cannot read
# (LLVM bitcode); what it could read is matched (a `vmm` matching too little fails below).
{ nm --defined-only "${objects[@]}" 2>/dev/null || true; } |
    awk '$2 ~ /^[tTwWi]$/ { print $3 }' | sort -u >"$work/names"
sed -E -f "$here/hashless.sed" "$work/names" | paste - "$work/names" >"$work/defined"
grep -v '^#' "$here/boot.order" | grep . >"$work/listed"
# Rust names (`_ZN…`, `_R…`) are matched without their hashes; C names (the static C
# library's, which is linked by `-lc`, not named here) go to the linker as they are.
awk -F '\t' 'NR == FNR { by[$1] = by[$1] $2 "\n"; next }
    !/^_(ZN|R)/ { print; next }
    { rust++ }
    ($0 in by) && !seen[$0]++ { printf "%s", by[$0]; found++ }
    END { print found + 0, rust + 0 > "/dev/stderr" }' "$work/defined" "$work/listed" \
    >"$work/order" 2>"$work/found"
read -r found listed <"$work/found"
echo "text order: $found of $listed listed Rust functions found in $program" >&2
# Made from `vmm`'s boot: most names must be there. The launcher runs the same VMM code
# under another front end (gRPC instead of a command line), so it matches fewer.
if [[ $program == vmm ]] && ((found * 10 < listed * 9)); then
    echo "linker.sh: the text order list is stale ($found of $listed names found in vmm):" \
        "regenerate it (vmm/cli/text-order/README.md)" >&2
    exit 1
fi
"$cc" "$@" -Wl,--symbol-ordering-file="$work/order" -Wl,--no-warn-symbol-ordering
