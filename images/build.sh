#!/usr/bin/env bash
# Builds the project's container images as OCI archives, without a container daemon:
#
#   bash images/build.sh [--out DIR] [--profile P] [NAME...]   (default target/images, release)
#   ctr -n k8s.io images import DIR/NAME.tar          (on the node; no registry needed)
#
# --profile dev builds the same programs, static and stripped, with the dev profile (no
# optimisation; the end-to-end tests use it, as a release build would double their cost).
# NAME is a spec in images/specs/ (virt-controller, virt-api, virt-handler, virt-launcher, pause,
# test-guest-kernel, test-disk). Steps: two builds of every program the images need (the pod's,
# then the node's and the cluster's),
# linked statically (the images hold no C library; glibc 2.36 resolves users and hosts from
# /etc without NSS modules); each program stripped into DIR/stage with its debug info kept
# apart in DIR/debug/<program>.debug (found through .gnu_debuglink); the test guest and the
# test VM's bootable disk written with `vmm`; then `oci-image` writes DIR/NAME.tar per spec
# and DIR/images.txt lists name, digest, compressed and unpacked bytes.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
out=target/images
profile=release
names=()
while [[ $# -gt 0 ]]; do
    case $1 in
        --out) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; out=$2; shift 2 ;;
        --out=*) out=${1#--out=}; shift ;;
        --profile) [[ $# -ge 2 ]] || { usage >&2; exit 2; }; profile=$2; shift 2 ;;
        --profile=*) profile=${1#--profile=}; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "build.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
        *) names+=("$1"); shift ;;
    esac
done
all=(virt-controller virt-api virt-handler virt-launcher pause test-guest-kernel test-disk)
# What the test guest on the test disk checks (the cluster tests expect each to pass).
TEST_DISK_CHECKS=serial,bootparams,idt,mem,smbios,rtc,virtio-blk,virtio-rng
[[ ${#names[@]} -gt 0 ]] || names=("${all[@]}")

for name in "${names[@]}"; do
    [[ -f images/specs/$name.yaml ]] || {
        echo "build.sh: no image $name (images/specs/ has: ${all[*]})" >&2
        exit 2
    }
done

# Every program of every image, as "package:binary", in two builds, each always of the same
# programs whatever NAMEs were asked for: cargo unifies dependency features over the packages
# of one build, so building a subset could link a program differently and change its image's
# digest. The pod's programs (one launcher pod per VM) and `vmm` are one build, with the
# `lean` profile in release (fat LTO, optimised for size but for the data path: Cargo.toml);
# the node's and the cluster's programs the other.
pod_programs=(virt-launcher:virt-launcher virt-launcher:virt-launcher-monitor
    virt-launcher:virt-tail virt-launcher:container-disk)
node_programs=(controller:virt-controller virt-api:virt-api virt-handler:virt-handler pause:pause)
# What the images hold; `vmm` (writes the test guest and the test disk) and `oci-image`
# (writes the archives) only run here.
programs=("${pod_programs[@]}" "${node_programs[@]}")

triple=x86_64-unknown-linux-gnu
target=${CARGO_TARGET_DIR:-target}
case $profile in
    release) pod_profile=lean node_profile=release ;;
    dev) pod_profile=dev node_profile=dev ;;
    *) echo "build.sh: --profile is release or dev, not $profile" >&2; exit 2 ;;
esac
# Where cargo puts a profile's programs.
profile_dir() { [[ $1 == dev ]] && echo "$target/$triple/debug" || echo "$target/$triple/$1"; }
pod_dir=$(profile_dir "$pod_profile")
node_dir=$(profile_dir "$node_profile")
# The directory holding `package:binary`'s program.
bindir_of() {
    local p
    for p in "${pod_programs[@]}"; do [[ $p == "$1" ]] && { echo "$pod_dir"; return; }; done
    echo "$node_dir"
}
# --target keeps RUSTFLAGS off build scripts and proc macros (those cannot be static).
# pack-relative-relocs: the relative relocations of a static-pie program as a bitmap (DT_RELR,
# glibc 2.36) instead of 24 bytes each, which every start reads (0.6 MiB of the launcher's
# resident memory; vmm/launcher/docs/memory.md).
# The lean build links through vmm/cli/text-order/linker.sh, which packs the functions a VM's
# boot runs at the start of `vmm`'s and `virt-launcher`'s text (and fails on a stale list).
build_static() {
    local cargo_profile=$1 build=() program rustflags
    shift
    for program in "$@"; do
        build+=(-p "${program%%:*}" --bin "${program#*:}")
    done
    rustflags="-C target-feature=+crt-static -C link-arg=-Wl,-z,pack-relative-relocs"
    if [[ $cargo_profile == lean ]]; then
        rustflags+=" -C linker=$PWD/vmm/cli/text-order/linker.sh"
        # Cargo does not know the wrapper reads the list: relink when the list is newer.
        for program in vmm virt-launcher; do
            if [[ -e "$pod_dir/$program" && ( vmm/cli/text-order/boot.order -nt "$pod_dir/$program" ||
                vmm/cli/text-order/linker.sh -nt "$pod_dir/$program" ) ]]; then
                rm -f "$pod_dir/$program" "$pod_dir/deps/${program//-/_}"-????????????????
            fi
        done
    fi
    echo "== cargo build --profile $cargo_profile (static): ${*#*:}"
    CARGO_INCREMENTAL=0 RUSTFLAGS="$rustflags" \
        cargo build --profile "$cargo_profile" --locked --target "$triple" "${build[@]}"
}
build_static "$pod_profile" "${pod_programs[@]}" vmm-cli:vmm
if [[ $pod_profile == lean ]]; then
    bash vmm/cli/text-order/generate.sh --check "$pod_dir/vmm"
    bash vmm/cli/text-order/generate.sh --check "$pod_dir/virt-launcher"
fi
build_static "$node_profile" "${node_programs[@]}" oci-image:oci-image

# Each step runs only when its inputs are newer than what it wrote last time (the outputs
# are the same bytes anyway): a second build costs cargo's check and a few stat calls, not
# the stripping and compressing of every program again.
stage=$out/stage
debug=$out/debug
lines=$out/lines
mkdir -p "$stage" "$debug" "$lines"
for program in "${programs[@]}"; do
    bin=${program#*:}
    bindir=$(bindir_of "$program")
    [[ "$stage/$bin" -nt "$bindir/$bin" ]] && continue
    # The debug link records the file's name and CRC; gdb looks for it next to the program,
    # in .debug/ there, or under /usr/lib/debug.
    objcopy --only-keep-debug "$bindir/$bin" "$debug/$bin.debug"
    objcopy --strip-all --add-gnu-debuglink="$debug/$bin.debug" "$bindir/$bin" "$stage/$bin"
done
if [[ ! "$stage/guest.elf" -nt "$pod_dir/vmm" ]]; then
    "$pod_dir/vmm" test-guest --output "$stage/guest.elf"
fi
# The test VM's boot disk: the test guest behind GRUB's configuration, on a Debian-style
# disk; the command line of its boot entry names the checks the guest runs.
if [[ ! "$stage/disk.raw" -nt "$pod_dir/vmm" || images/build.sh -nt "$stage/disk.raw" ]]; then
    rm -f "$stage/disk.raw"
    "$pod_dir/vmm" test-guest --disk "$stage/disk.raw" --layout debian \
        --cmdline "console=ttyS0 checks=$TEST_DISK_CHECKS exit=halt wait=3600"
fi

list=$out/images.txt
: > "$list.new"
for name in "${names[@]}"; do
    archive=$out/$name.tar
    if [[ -f "$archive" && -f "$lines/$name" ]] &&
        [[ -z "$(find "$stage" "images/specs/$name.yaml" "$node_dir/oci-image" -newer "$archive" -print -quit)" ]]; then
        cat "$lines/$name" >> "$list.new" # up to date
        continue
    fi
    "$node_dir/oci-image" "images/specs/$name.yaml" --from "$stage" --out "$archive" > "$lines/$name"
    tee -a "$list.new" < "$lines/$name"
done
mv "$list.new" "$list"
echo "== $out:"
awk '{ printf "  %-45s %s  %7.1f MiB compressed  %7.1f MiB unpacked\n", $1, substr($2, 1, 19), $3 / 1048576, $4 / 1048576 }' "$list"
