#!/usr/bin/env bash
# Runs the built images (images/build.sh) in a private containerd, without Kubernetes:
#
#   sudo bash images/smoke.sh [DIR]          (default DIR target/images)
#
# Imports every DIR/*.tar with `ctr images import`, then runs, as the launcher pod would:
# container-disk --no-op from the launcher image and from the test-disk and test-guest-kernel
# images (the launcher image bind-mounted at /container-disk-binary, as the pod's image volume
# is); each program's --help in its own image; pause ended by SIGTERM (status 0); virt-tail on
# a console log; and getcap on the unpacked monitor. containerd gets its own root, state and
# socket under a temporary directory and is stopped at the end. Needs root, containerd, ctr
# and runc; containerd and ctr come from integration/controlplane/build.sh (the test cluster's
# build, cached), or from CONTAINERD_BIN=DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
images=${1:-target/images}
bin=${CONTAINERD_BIN:-$(bash "$(dirname "$0")/../integration/controlplane/build.sh")}
PATH=$bin:$PATH:/usr/sbin:/sbin
ctr_bin=$(command -v ctr)
[[ $(id -u) -eq 0 ]] || { echo "smoke.sh: run as root" >&2; exit 1; }
ls "$images"/*.tar >/dev/null || { echo "smoke.sh: no archives in $images (run images/build.sh)" >&2; exit 1; }

dir=$(mktemp -d /var/tmp/kubevirt-rs-smoke.XXXXXX)
cleanup() {
    [[ -n ${cpid:-} ]] && kill "$cpid" 2>/dev/null && wait "$cpid" 2>/dev/null
    rm -rf "$dir"
}
trap cleanup EXIT
cat > "$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
EOF
containerd --config "$dir/config.toml" > "$dir/containerd.log" 2>&1 &
cpid=$!
ctr() { "$ctr_bin" --address "$dir/containerd.sock" --namespace k8s.io "$@"; }
for _ in $(seq 150); do ctr version > /dev/null 2>&1 && break; sleep 0.2; done
ctr version | sed -n 's/^ *Version: */containerd /p' | tail -1

fail() { echo "FAIL: $*" >&2; exit 1; }
for archive in "$images"/*.tar; do
    ctr images import "$archive" > /dev/null || fail "import $archive"
done
ctr images ls | awk 'NR > 1 { print "  " $1, $3 }'

R=localhost/kubevirt-rs
n=0
run() {   # run IMAGE ARGS... (extra ctr options in $opts)
    n=$((n + 1))
    timeout 60 "$ctr_bin" --address "$dir/containerd.sock" --namespace k8s.io \
        run --rm ${opts[@]+"${opts[@]}"} "$1" "smoke-$n" "${@:2}"
}
opts=()
run $R/virt-launcher:devel /usr/bin/container-disk --no-op || fail "container-disk --no-op"
launcher_root=
for fs in "$dir"/root/io.containerd.snapshotter.v1.overlayfs/snapshots/*/fs; do
    [[ -e $fs/usr/bin/virt-launcher-monitor ]] && launcher_root=$fs
done
[[ -n $launcher_root ]] || fail "the launcher image's layer is not unpacked"
opts=(--mount "type=bind,src=$launcher_root,dst=/container-disk-binary,options=rbind:ro")
for image in test-disk test-guest-kernel; do
    run $R/$image:devel /container-disk-binary/usr/bin/container-disk --no-op \
        || fail "container-disk --no-op in $image"
done
echo "ok: container-disk --no-op in virt-launcher, test-disk, test-guest-kernel"
opts=()
for pair in virt-controller:virt-controller virt-api:virt-api virt-handler:virt-handler \
    virt-launcher:virt-launcher virt-launcher:virt-launcher-monitor virt-launcher:virt-tail; do
    run "$R/${pair%%:*}:devel" "/usr/bin/${pair#*:}" --help > /dev/null || fail "${pair#*:} --help"
done
echo "ok: --help of each program in its image"

(ctr run --rm $R/pause:3.10 smoke-pause > /dev/null 2>&1; echo $? > "$dir/pause.rc") &
pause_job=$!
for _ in $(seq 100); do ctr task ls | grep -q "smoke-pause.*RUNNING" && break; sleep 0.1; done
ctr task kill --signal SIGTERM smoke-pause
wait "$pause_job"
[[ $(cat "$dir/pause.rc") == 0 ]] || fail "pause exited $(cat "$dir/pause.rc") on SIGTERM"
echo "ok: pause exits 0 on SIGTERM"

mkdir -p "$dir/private"
printf 'TEST serial PASS\nDONE passed=1 failed=0\n' > "$dir/private/virt-serial0-log"
# virt-tail follows until it is stopped; this file (its termination marker) ends it at once.
: > "$dir/private/virt-serial0-log-sigTerm-done"
chmod -R a+rX "$dir/private"
opts=(--mount "type=bind,src=$dir/private,dst=/var/run/kubevirt-private/uid,options=rbind:ro")
out=$(run $R/virt-launcher:devel /usr/bin/virt-tail \
    --logfile /var/run/kubevirt-private/uid/virt-serial0-log 2> /dev/null || true)
[[ $out == $'TEST serial PASS\nDONE passed=1 failed=0' ]] || fail "virt-tail printed: $out"
echo "ok: virt-tail in the launcher image (user 107) streams the console log"

caps=$(getcap "$launcher_root/usr/bin/virt-launcher-monitor")
[[ $caps == *cap_net_bind_service=ep ]] || fail "monitor capability: $caps"
echo "ok: unpacked monitor has cap_net_bind_service=ep"
echo "smoke: all checks passed"
