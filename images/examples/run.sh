#!/usr/bin/env bash
# Boots the test guest as a KubeVirt VMI on this machine, without Kubernetes:
# builds virt-handler, the launcher and the vmm CLI, writes a bootable disk (laid out as
# Debian's cloud images are, GRUB's configuration naming the test guest as its kernel), then
# runs `virt-handler standalone` on vmi-testguest.yaml, a VMI that names no kernel: the
# launcher boots the disk's default GRUB entry. The handler creates the VMI's pod (network
# namespace, veth, directories), starts the launcher in it as user 107, drives the VMI to
# Running, prints the serial console, and once the guest reports its checks it shuts the VM
# down gracefully and removes everything it created.
#
# Needs root and /dev/kvm. Environment:
#   KEEP_RUNNING=1   keep the VM running after the checks (stop with Ctrl-C)
#   KERNEL_BOOT=1    run vmi-testguest-kernel-boot.yaml instead: the guest by direct kernel
#                    boot (firmware.kernelBoot), the disk a data disk
#   WORK=DIR         where the guest, the disk and the status file go (default: a temp dir)
set -euo pipefail
cd "$(dirname "$0")/../.."
repo=$(pwd)
. scripts/progress.sh

if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: run as root (network namespaces, mounts, /dev/kvm)" >&2
    exit 1
fi
[[ -e /dev/kvm ]] || { echo "run.sh: /dev/kvm is missing" >&2; exit 1; }

target=${CARGO_TARGET_DIR:-$repo/target}
step "building virt-handler, virt-launcher, vmm (first run: ~10-15 min on 2 cores, then seconds)"
cargo build -p virt-handler -p virt-launcher -p vmm-cli --bins

work=${WORK:-$(mktemp -d /tmp/kubevirt-demo.XXXXXX)}
mkdir -p "$work"
chmod 0755 "$work"
step "preparing images in $work"
"$target/debug/vmm" test-guest --output "$work/guest.elf"
# The container disk (raw): the guest behind GRUB's configuration, the checks on the entry's
# command line. The launcher puts a qcow2 overlay over it.
rm -f "$work/disk.raw"
"$target/debug/vmm" test-guest --disk "$work/disk.raw" --layout debian \
    --cmdline "console=ttyS0 checks=serial,bootparams,idt,mem,smbios,rtc,virtio-blk,virtio-rng exit=halt wait=600"
chmod 0644 "$work/guest.elf" "$work/disk.raw"
manifest=vmi-testguest.yaml
[[ ${KERNEL_BOOT:-0} == 1 ]] && manifest=vmi-testguest-kernel-boot.yaml
cp "images/examples/$manifest" "$work/"

stop=(--stop-after-console "DONE passed=")
[[ ${KEEP_RUNNING:-0} == 1 ]] && stop=()

step "running virt-handler standalone"
log="$work/handler.out"
set +e
# The handler logs one line per decision on stderr; RUST_LOG=info shows them.
RUST_LOG=${RUST_LOG:-warn} "$target/debug/virt-handler" standalone "$work/$manifest" \
    --state-dir "$work/state" \
    --image "localhost/test-guest:latest=$work/guest.elf" \
    --image "localhost/test-disk:latest=$work/disk.raw" \
    "${stop[@]}" | tee "$log"
rc=${PIPESTATUS[0]}
set -e

step "status written to $work/state/status/"
if [[ $rc -ne 0 ]]; then
    echo "run.sh: virt-handler failed ($rc)" >&2
    exit "$rc"
fi
grep -q 'phase Scheduled -> Running' "$log" || { echo "run.sh: the VMI never reached Running" >&2; exit 1; }
grep -Eq 'console: DONE passed=[0-9]+ failed=0' "$log" || { echo "run.sh: the guest's checks did not all pass" >&2; exit 1; }
echo "== OK: the VMI ran and the guest's checks passed"
