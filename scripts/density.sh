#!/usr/bin/env bash
# KubeVirt's density benchmark (v1.9.0 `tests/performance/density.go`) on this project's node:
#
#   sudo bash scripts/density.sh [N] [--shape kubevirt|density]
#
# N VMIs created 100 ms apart in the namespace `density`, waited for until all are Running (5
# minutes at most), measured, deleted, and waited for until nothing of them is left (pods,
# launcher processes, pod cgroups, mounts). scripts/density.py prints the table: creation ->
# Running P50/P95/max, where the seconds go (controller, scheduler, kubelet, handler and
# launcher), API requests by verb and resource, CPU seconds and peak RSS of virt-controller and
# virt-handler, node memory per VMI, memory requested per pod, the clean-up time; its last line
# is the summary `density: <running>/<N> Running, p50 <s> s, p95 <s> s, ...`. Exit status 0 only
# when all N reached Running and nothing was left behind.
#
# Shapes (the VMI of KubeVirt's perf-scale job: 90Mi requested and limited, masquerade on the
# pod network; the project's test disk, booted from the disk, in place of cirros):
#   kubevirt  100m CPU requested and limited, as KubeVirt's job; N defaults to as many as the
#             node's allocatable CPU admits beside what is already requested
#   density   (the default) no explicit CPU: each VMI requests 1/cpuAllocationRatio of a CPU;
#             for the run the KubeVirt CR's cpuAllocationRatio is set to 100 (restored
#             afterwards) so that 100 one-vCPU VMIs fit two cores' allocatable CPU; N = 100
#
# The images (PROFILE=release, the default, as the cluster demo; PROFILE=dev for the tests'
# unoptimised ones), the node and the deployment come as in scripts/cluster-demo.sh: a node that
# is up is used and stays up; one brought up here is taken down at the end unless
# KEEP_CLUSTER=1. DENSITY_JSON=FILE also writes the measurements as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."

LOG_NAME=density
# shellcheck source=scripts/kubevirt-up.sh
source scripts/kubevirt-up.sh

COUNT=""
SHAPE=density
while (($#)); do
    case "$1" in
        --shape)
            SHAPE="${2:-}"
            shift 2 || die "--shape needs kubevirt or density"
            ;;
        --shape=*)
            SHAPE="${1#--shape=}"
            shift
            ;;
        [0-9]*)
            COUNT="$1"
            shift
            ;;
        *) die "usage: scripts/density.sh [N] [--shape kubevirt|density]" ;;
    esac
done
[[ "$SHAPE" == kubevirt || "$SHAPE" == density ]] || die "--shape is kubevirt or density, not $SHAPE"
DENSITY_RATIO=100

log "images (images/build.sh --profile $PROFILE)"
kubevirt_images
log "the node (scripts/cluster.sh up; reused if up)"
kubevirt_node

ratio_before=""
cleanup() {
    local rc=$?
    if ((rc != 0)); then
        # A run that stopped half-way leaves its VMIs: remove them (the next run would too).
        kubectl delete namespace density --ignore-not-found --wait=false >/dev/null 2>&1 || true
    fi
    if [[ -n "$ratio_before" ]]; then
        kubectl -n kubevirt patch kv kubevirt --type merge -p \
            "{\"spec\":{\"configuration\":{\"developerConfiguration\":{\"cpuAllocationRatio\":$ratio_before}}}}" \
            >/dev/null 2>&1 || true
    fi
    if ((brought_up)) && [[ "$KEEP_CLUSTER" != 1 ]]; then
        log "clean-up: scripts/cluster.sh down"
        bash scripts/cluster.sh down || true
    fi
    exit "$rc"
}
trap cleanup EXIT

log "KubeVirt (ours): import, apply, wait"
kubevirt_deploy

if [[ "$SHAPE" == density ]]; then
    ratio_before="$(kubectl -n kubevirt get kv kubevirt \
        -o jsonpath='{.spec.configuration.developerConfiguration.cpuAllocationRatio}')"
    ratio_before="${ratio_before:-null}"
    log "cpuAllocationRatio $DENSITY_RATIO for the run (was ${ratio_before/null/unset: 10})"
    kubectl -n kubevirt patch kv kubevirt --type merge -p \
        "{\"spec\":{\"configuration\":{\"developerConfiguration\":{\"cpuAllocationRatio\":$DENSITY_RATIO}}}}" >&2
    COUNT="${COUNT:-100}"
elif [[ -z "$COUNT" ]]; then
    # As many 100m VMIs as the node's allocatable CPU admits beside the requests of the pods
    # already on it. The VMI asks for Guaranteed QoS (requests equal to limits), so its pod's
    # console sidecar asks 15m too: 115m per pod.
    allocatable="$(kubectl get node -o jsonpath='{.items[0].status.allocatable.cpu}')"
    case "$allocatable" in
        *m) allocatable="${allocatable%m}" ;;
        *) allocatable=$((allocatable * 1000)) ;;
    esac
    requested=0
    while read -r cpu; do
        case "$cpu" in
            "") ;;
            *m) requested=$((requested + ${cpu%m})) ;;
            *) requested=$((requested + cpu * 1000)) ;;
        esac
    done < <(kubectl get pods -A --field-selector status.phase=Running \
        -o jsonpath='{range .items[*].spec.containers[*]}{.resources.requests.cpu}{"\n"}{end}')
    COUNT=$(((allocatable - requested) / 115))
    log "allocatable CPU ${allocatable}m, requested ${requested}m: N = $COUNT"
fi
((COUNT > 0)) || die "N must be positive"
# KubeVirt's components settle (the CR's new configuration reaches virt-controller's watch).
sleep 2

server="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.server}')"
token="$(kubectl config view --raw -o jsonpath='{.users[0].user.token}')"
ca="$(kubectl config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority}')"
log "scripts/density.py: $COUNT VMIs, $SHAPE shape"
python3 scripts/density.py --server "$server" --token "$token" --ca "$ca" --count "$COUNT" \
    --shape "$SHAPE" --image localhost/kubevirt-rs/test-disk:devel \
    ${DENSITY_JSON:+--json "$DENSITY_JSON"}
