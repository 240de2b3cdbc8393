#!/usr/bin/env bash
# KubeVirt's user story on a real single-node cluster, with this project's images:
#
#   sudo bash scripts/cluster-demo.sh                  # bring up, run the VM, tear down
#   sudo KEEP_CLUSTER=1 bash scripts/cluster-demo.sh   # leave the cluster and the VM running
#   sudo PROFILE=dev bash scripts/cluster-demo.sh      # the tests' unoptimised images (faster build)
#
# Steps: the images (images/build.sh: static, stripped release programs), the node
# (scripts/cluster.sh up), the images imported with ctr into the node's containerd,
# `kubectl apply -f images/deploy/` (CRDs, virt-controller, virt-api, virt-handler) and `-f
# images/deploy/cr/` (the KubeVirt CR; wait for its phase Deployed and for virt-api's
# webhooks to answer: they refuse every VM until then), `kubectl apply -f
# images/examples/vm-testguest.yaml`, wait for the VM Ready and its VMI Running, print the
# guest's `TEST ... PASS` lines from `kubectl logs <launcher pod> -c guest-console-log`, then
# KubeVirt v1.9.0's virtctl through virt-api (`version`, `pause` and `unpause` of the VMI,
# `restart` of the VM), then delete what it made: the VM, the deployment (unless it was there
# before) and the cluster (unless it was up before).
#
# The first run builds the cluster's Go binaries (about 25 min on a 2-core machine, then
# cached in ~/.cache/kubevirt-rs) and the release programs (about 40 min on 2 busy cores, the
# launcher image's link-time-optimised ones included; later runs rebuild only what changed).
# A warm run takes about 2 minutes.
#
# Environment: KEEP_CLUSTER=1 keeps the cluster (and the VM) up and prints the KUBECONFIG=,
# KUBECTL= and VIRTCTL= lines; PROFILE (release, the default, or dev: the images the end-to-end tests build,
# in target/e2e-images) is images/build.sh's --profile; IMAGES_DIR (default target/images, or
# target/e2e-images with PROFILE=dev) is where it writes.
set -euo pipefail
cd "$(dirname "$0")/.."

LOG_NAME=cluster-demo
# shellcheck source=scripts/kubevirt-up.sh
source scripts/kubevirt-up.sh
VM=testguest
NAMESPACE=default

# ---- the images ----------------------------------------------------------------------------
log "step 1/7: images (bash images/build.sh --profile $PROFILE: static, stripped programs; see above for how long)"
kubevirt_images

# ---- the node ------------------------------------------------------------------------------
if bash scripts/cluster.sh status >/dev/null 2>&1; then
    log "step 2/7: the node is already up: using it (it stays up afterwards)"
else
    log "step 2/7: the node (scripts/cluster.sh up; the first run builds the Go binaries)"
fi
kubevirt_node

cleanup() {
    local rc=$?
    if [[ "$KEEP_CLUSTER" == 1 ]]; then
        ((rc == 0)) || log "failed; KEEP_CLUSTER=1: everything is left as it is"
        return
    fi
    if ((brought_up)); then
        log "clean-up: scripts/cluster.sh down (the VM and everything else go with the node)"
        bash scripts/cluster.sh down || true
    else
        log "clean-up: the VM$( ((deployed_before)) || echo ', the deployment')"
        kubectl delete -f images/examples/vm-testguest.yaml --ignore-not-found --wait=true \
            --timeout=120s >/dev/null 2>&1 || true
        if ((!deployed_before)); then
            kubectl delete -f images/deploy/ --ignore-not-found --wait=true --timeout=120s \
                >/dev/null 2>&1 || true
        fi
    fi
    log "done$( ((rc == 0)) || echo " (failed with $rc)")"
}
trap cleanup EXIT

# ---- KubeVirt (ours) -----------------------------------------------------------------------
log "step 3/7: ctr images import (${IMAGES[*]}), kubectl apply -f images/deploy/"
kubevirt_deploy
log "virt-controller, virt-api and virt-handler are running; the node is schedulable:"
kubectl get node -o custom-columns='NODE:.metadata.name,KVM:.status.allocatable.devices\.kubevirt\.io/kvm,TUN:.status.allocatable.devices\.kubevirt\.io/tun,VHOST-NET:.status.allocatable.devices\.kubevirt\.io/vhost-net' >&2

# ---- the VM --------------------------------------------------------------------------------
log "step 4/7: kubectl apply -f images/examples/vm-testguest.yaml"
kubectl apply -f images/examples/vm-testguest.yaml >&2
kubectl -n "$NAMESPACE" wait vm/$VM --for=condition=Ready --timeout="${TIMEOUT}s" >/dev/null ||
    die "VM $VM not Ready within ${TIMEOUT}s: $(kubectl -n "$NAMESPACE" get vmi $VM -o yaml 2>&1 | tail -40)"
kubectl -n "$NAMESPACE" wait vmi/$VM --for=jsonpath='{.status.phase}'=Running \
    --timeout="${TIMEOUT}s" >/dev/null || die "VMI $VM not Running"
log "VM $VM Ready, VMI Running:"
kubectl -n "$NAMESPACE" get vm,vmi >&2
pod="$(kubectl -n "$NAMESPACE" get pods -l "kubevirt.io=virt-launcher,vm.kubevirt.io/name=$VM" \
    -o jsonpath='{.items[0].metadata.name}')"
[[ -n "$pod" ]] || die "no launcher pod for $VM"

# ---- the guest's console -------------------------------------------------------------------
log "step 5/7: the guest's serial console (kubectl logs $pod -c guest-console-log)"
deadline=$((SECONDS + TIMEOUT))
# The log captured first: `kubectl logs | grep -q` under pipefail fails when grep's early exit
# kills kubectl with SIGPIPE.
until grep -q '^DONE ' <<<"$(kubectl -n "$NAMESPACE" logs "$pod" -c guest-console-log 2>/dev/null)"; do
    ((SECONDS < deadline)) || die "the guest printed no DONE line within ${TIMEOUT}s"
    sleep 1
done
console="$(kubectl -n "$NAMESPACE" logs "$pod" -c guest-console-log)"
grep -E '^(TEST|DONE) ' <<<"$console"
grep -q '^DONE passed=[0-9]* failed=0' <<<"$console" || die "a guest check failed"

# ---- virtctl -------------------------------------------------------------------------------
log "step 6/7: virtctl (KubeVirt v1.9.0's) through virt-api: version, pause, unpause, restart"
kubectl wait apiservice/v1.subresources.kubevirt.io --for=condition=Available --timeout="${TIMEOUT}s" >/dev/null ||
    die "the APIService v1.subresources.kubevirt.io is not Available"
virtctl version >&2
# The handler's endpoint for virt-api waits for its certificates (virt-api writes them at its
# start; the kubelet passes them on within a minute or so).
deadline=$((SECONDS + TIMEOUT))
until virtctl -n "$NAMESPACE" pause vmi "$VM" >&2; do
    ((SECONDS < deadline)) || die "virtctl pause vmi $VM kept failing"
    sleep 5
done
kubectl -n "$NAMESPACE" wait vmi/$VM --for=condition=Paused --timeout=60s >/dev/null ||
    die "the VMI did not report Paused"
kubectl -n "$NAMESPACE" get vmi $VM \
    -o custom-columns='VMI:.metadata.name,PAUSED:.status.conditions[?(@.type=="Paused")].reason,READY:.status.conditions[?(@.type=="Ready")].status' >&2
virtctl -n "$NAMESPACE" unpause vmi "$VM" >&2
kubectl -n "$NAMESPACE" wait vmi/$VM --for=condition=Ready --timeout=60s >/dev/null ||
    die "the VMI did not come back Ready after unpause"
old_uid="$(kubectl -n "$NAMESPACE" get vmi "$VM" -o jsonpath='{.metadata.uid}')"
virtctl -n "$NAMESPACE" restart "$VM" >&2
deadline=$((SECONDS + TIMEOUT))
until [[ "$(kubectl -n "$NAMESPACE" get vmi "$VM" -o jsonpath='{.metadata.uid} {.status.phase}' 2>/dev/null)" =~ ^([^ ]+)\ Running$ &&
    "${BASH_REMATCH[1]}" != "$old_uid" ]]; do
    ((SECONDS < deadline)) || die "the VM did not run again after virtctl restart"
    sleep 1
done
kubectl -n "$NAMESPACE" get vm,vmi >&2

# ---- the end -------------------------------------------------------------------------------
if [[ "$KEEP_CLUSTER" == 1 ]]; then
    log "step 7/7: KEEP_CLUSTER=1: the cluster, KubeVirt and the VM stay up"
    echo "KUBECONFIG=$KUBECONFIG_PATH"
    echo "KUBECTL=$KUBECTL"
    echo "VIRTCTL=$VIRTCTL"
    log "try: \$VIRTCTL --kubeconfig \$KUBECONFIG -n $NAMESPACE {pause,unpause} vmi $VM | {stop,start,restart} $VM | soft-reboot $VM | reset $VM"
    log "remove everything with: sudo bash scripts/cluster.sh down"
else
    log "step 7/7: removing everything"
fi
