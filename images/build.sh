#!/usr/bin/env bash
# Builds the project's container images as OCI archives, without a container daemon:
#
#   bash images/build.sh [--out DIR] [NAME...]      (default DIR target/images, all images)
#   ctr -n k8s.io images import DIR/NAME.tar          (on the node; no registry needed)
#
# NAME is a spec in images/specs/ (virt-controller, virt-handler, virt-launcher, pause,
# test-guest-kernel, test-disk). Steps: one release build of every program the images need,
# linked statically (the images hold no C library; glibc 2.36 resolves users and hosts from
# /etc without NSS modules); each program stripped into DIR/stage with its debug info kept
# apart in DIR/debug/<program>.debug (found through .gnu_debuglink); the test guest and a
# 64 MiB qcow2 base disk written with `vmm`; then `oci-image` writes DIR/NAME.tar per spec
# and DIR/images.txt lists name, digest, compressed and unpacked bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; }
out=target/images
names=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "build.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) names+=("$1"); shift ;;
    esac
done
all=(virt-controller virt-handler virt-launcher pause test-guest-kernel test-disk)
[[ ${#names[@]} -gt 0 ]] || names=("${all[@]}")

for name in "${names[@]}"; do
    [[ -f images/specs/$name.yaml ]] || {
        echo "build.sh: no image $name (images/specs/ has: ${all[*]})" >&2
        exit 2
    }
done

# Every program of every image, as "package:binary", built together whatever NAMEs were
# asked for: cargo unifies dependency features over the packages of one build, so building a
# subset could link a program differently and change its image's digest.
programs=(controller:virt-controller handler:virt-handler
    virt-launcher:virt-launcher virt-launcher:virt-launcher-monitor
    virt-launcher:virt-tail virt-launcher:container-disk pause:pause)

triple=x86_64-unknown-linux-gnu
target=${CARGO_TARGET_DIR:-target}
release=$target/$triple/release
# --target keeps RUSTFLAGS off build scripts and proc macros (those cannot be static).
build=(-p oci-image --bin oci-image -p vmm --bin vmm)
for program in "${programs[@]}"; do
    build+=(-p "${program%%:*}" --bin "${program#*:}")
done
echo "== cargo build --release (static): ${programs[*]#*:} oci-image vmm"
CARGO_INCREMENTAL=0 RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked --target "$triple" "${build[@]}"

stage=$out/stage
debug=$out/debug
mkdir -p "$stage" "$debug"
for program in "${programs[@]}"; do
    bin=${program#*:}
    # The debug link records the file's name and CRC; gdb looks for it next to the program,
    # in .debug/ there, or under /usr/lib/debug.
    objcopy --only-keep-debug "$release/$bin" "$debug/$bin.debug"
    objcopy --strip-all --add-gnu-debuglink="$debug/$bin.debug" "$release/$bin" "$stage/$bin"
done
"$release/vmm" test-guest --output "$stage/guest.elf"
rm -f "$stage/disk.qcow2"
"$release/vmm" img create -q -f qcow2 "$stage/disk.qcow2" 64M

list=$out/images.txt
: > "$list.new"
for name in "${names[@]}"; do
    "$release/oci-image" "images/specs/$name.yaml" --from "$stage" --out "$out/$name.tar" \
        | tee -a "$list.new"
done
mv "$list.new" "$list"
echo "== $out:"
awk '{ printf "  %-45s %s  %7.1f MiB compressed  %7.1f MiB unpacked\n", $1, substr($2, 1, 19), $3 / 1048576, $4 / 1048576 }' "$list"
