# Sourced by scripts/cluster-demo.sh and scripts/density.sh (after `cd` to the repository,
# with LOG_NAME set): `log` and `die` (stderr, with the elapsed time), the checks and settings
# both share (root; PROFILE and IMAGES_DIR as images/build.sh takes them, KEEP_CLUSTER, IMAGES,
# TIMEOUT, STATE), and this project's KubeVirt on the test cluster in three steps the caller
# logs and orders:
#
#   kubevirt_images   images/build.sh --profile $PROFILE --out $IMAGES_DIR
#   kubevirt_node     scripts/cluster.sh up (reused if up); sets KUBECONFIG_PATH, KUBECTL, VIRTCTL, CTR,
#                     brought_up (1: this run brought the node up), deployed_before (1: the
#                     components were deployed already) and defines `kubectl`
#   kubevirt_deploy   imports $IMAGES into the nodes' containerds, applies images/deploy/ and
#                     the KubeVirt CR, waits for the three components, virt-api's webhooks,
#                     the CR's phase Deployed and the node's kubevirt.io/schedulable label

STARTED_AT="$(date +%s%N)"
log() {
    local now elapsed
    now="$(date +%s%N)"
    elapsed=$(((now - STARTED_AT) / 1000000))
    printf '%s [%4d.%01ds] %s\n' "$LOG_NAME" $((elapsed / 1000)) $((elapsed % 1000 / 100)) "$*" >&2
}
die() {
    log "error: $*"
    exit 1
}

[[ "$(id -u)" == 0 ]] || die "must run as root (the cluster's daemons, containerd, the kubelet)"
KEEP_CLUSTER="${KEEP_CLUSTER:-0}"
PROFILE="${PROFILE:-release}"
case "$PROFILE" in
    release) IMAGES_DIR="${IMAGES_DIR:-${CARGO_TARGET_DIR:-target}/images}" ;;
    dev) IMAGES_DIR="${IMAGES_DIR:-${CARGO_TARGET_DIR:-target}/e2e-images}" ;;
    *) die "PROFILE is release or dev, not $PROFILE" ;;
esac
IMAGES=(virt-controller virt-api virt-handler virt-launcher test-guest-kernel test-disk)
TIMEOUT=300
STATE=/var/lib/kubevirt-rs-cluster

kubevirt_images() {
    CARGO_INCREMENTAL=0 bash images/build.sh --profile "$PROFILE" --out "$IMAGES_DIR" >&2 ||
        die "images/build.sh failed"
}

kubevirt_node() {
    brought_up=0
    bash scripts/cluster.sh status >/dev/null 2>&1 || brought_up=1
    local environment
    environment="$(KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE="$IMAGES_DIR/pause.tar" bash scripts/cluster.sh up)" ||
        die "scripts/cluster.sh up failed"
    KUBECONFIG_PATH="$(sed -n 's/^KUBECONFIG=//p' <<<"$environment")"
    KUBECTL="$(sed -n 's/^KUBECTL=//p' <<<"$environment")"
    VIRTCTL="$(sed -n 's/^VIRTCTL=//p' <<<"$environment")"
    CTR="$(dirname "$KUBECTL")/ctr"
    deployed_before=0
    if kubectl -n kubevirt get daemonset virt-handler >/dev/null 2>&1; then
        deployed_before=1
    fi
}

kubectl() { "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" --cache-dir "$STATE/kubectl-cache" "$@"; }
virtctl() { "$VIRTCTL" --kubeconfig "$KUBECONFIG_PATH" "$@"; }

kubevirt_deploy() {
    local image socket deadline
    # Every node's containerd: node 2's too when the cluster has it (`cluster.sh up --nodes 2`).
    for socket in "$STATE/containerd.sock" "$STATE/node-2/containerd.sock"; do
        # Node 2 only when the cluster has it; node 1's containerd must be there.
        [[ -S "$socket" || "$socket" == "$STATE/containerd.sock" ]] || continue
        for image in "${IMAGES[@]}"; do
            "$CTR" --address "$socket" --namespace k8s.io \
                images import --snapshotter overlayfs "$IMAGES_DIR/$image.tar" >/dev/null 2>&1 ||
                die "importing $IMAGES_DIR/$image.tar into the containerd at $socket failed"
        done
    done
    kubectl apply -f images/deploy/ >&2
    # The KubeVirt CR once its CRD is served (kubectl cannot map it in the same apply).
    kubectl wait crd/kubevirts.kubevirt.io --for condition=established --timeout=60s >/dev/null
    kubectl apply -f images/deploy/cr/ >&2
    if ((deployed_before)); then
        # Pods of images that were there before the import: start them on the new ones.
        kubectl -n kubevirt rollout restart deployment/virt-controller deployment/virt-api \
            daemonset/virt-handler >&2
    fi
    kubectl -n kubevirt rollout status deployment/virt-controller --timeout="${TIMEOUT}s" >&2 ||
        die "virt-controller did not become available"
    kubectl -n kubevirt rollout status daemonset/virt-handler --timeout="${TIMEOUT}s" >&2 ||
        die "virt-handler did not become ready"
    # virt-api's webhooks (failurePolicy Fail) refuse every VM and VMI until a replica is ready
    # and reachable through its Service: wait for the Deployment, then for a server-side dry
    # run of the example VM to pass the webhooks.
    kubectl -n kubevirt rollout status deployment/virt-api --timeout="${TIMEOUT}s" >&2 ||
        die "virt-api did not become available"
    kubectl -n kubevirt wait deployment/virt-api --for=condition=Available --timeout="${TIMEOUT}s" \
        >/dev/null || die "virt-api did not become available"
    deadline=$((SECONDS + TIMEOUT))
    until kubectl apply --dry-run=server -f images/examples/vm-testguest.yaml >/dev/null 2>&1; do
        ((SECONDS < deadline)) ||
            die "virt-api's webhooks never answered: $(kubectl apply --dry-run=server -f images/examples/vm-testguest.yaml 2>&1)"
        sleep 1
    done
    kubectl -n kubevirt wait kv/kubevirt --for=jsonpath='{.status.phase}'=Deployed \
        --timeout="${TIMEOUT}s" >/dev/null || die "the KubeVirt CR never reached phase Deployed"
    kubectl -n kubevirt get kv >&2
    kubectl wait node --all --for=jsonpath='{.metadata.labels.kubevirt\.io/schedulable}'=true \
        --timeout="${TIMEOUT}s" >/dev/null || die "the node was never labelled kubevirt.io/schedulable=true"
}
