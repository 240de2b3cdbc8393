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
# delete what it made: the VM, the deployment (unless it was there before) and the cluster
# (unless it was up before).
#
# The first run builds the cluster's Go binaries (about 25 min on a 2-core machine, then
# cached in ~/.cache/kubevirt-rs) and the release programs (about 40 min on 2 busy cores, the
# launcher image's link-time-optimised ones included; later runs rebuild only what changed).
# A warm run takes about 2 minutes.
#
# Environment: KEEP_CLUSTER=1 keeps the cluster (and the VM) up and prints the KUBECONFIG= and
# KUBECTL= lines; PROFILE (release, the default, or dev: the images the end-to-end tests build,
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
log "step 1/6: images (bash images/build.sh --profile $PROFILE: static, stripped programs; see above for how long)"
kubevirt_images

# ---- the node ------------------------------------------------------------------------------
if bash scripts/cluster.sh status >/dev/null 2>&1; then
    log "step 2/6: the node is already up: using it (it stays up afterwards)"
else
    log "step 2/6: the node (scripts/cluster.sh up; the first run builds the Go binaries)"
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
log "step 3/6: ctr images import (${IMAGES[*]}), kubectl apply -f images/deploy/"
kubevirt_deploy
log "virt-controller, virt-api and virt-handler are running; the node is schedulable:"
kubectl get node -o custom-columns='NODE:.metadata.name,KVM:.status.allocatable.devices\.kubevirt\.io/kvm,TUN:.status.allocatable.devices\.kubevirt\.io/tun,VHOST-NET:.status.allocatable.devices\.kubevirt\.io/vhost-net' >&2

# ---- the VM --------------------------------------------------------------------------------
log "step 4/6: kubectl apply -f images/examples/vm-testguest.yaml"
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
log "step 5/6: the guest's serial console (kubectl logs $pod -c guest-console-log)"
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

# ---- the end -------------------------------------------------------------------------------
if [[ "$KEEP_CLUSTER" == 1 ]]; then
    log "step 6/6: KEEP_CLUSTER=1: the cluster, KubeVirt and the VM stay up"
    echo "KUBECONFIG=$KUBECONFIG_PATH"
    echo "KUBECTL=$KUBECTL"
    log "remove everything with: sudo bash scripts/cluster.sh down"
else
    log "step 6/6: removing everything"
fi
