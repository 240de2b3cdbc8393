#!/usr/bin/env bash
# A real Kubernetes cluster on this machine, for the tests and the demo: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd (with Debian's runc), kubelet and
# kube-proxy (nftables mode), all built from Go modules by integration/controlplane/build.sh;
# pod networking by Debian's CNI bridge plugin. One node by default; `--nodes 2` adds a second
# node (its own network and mount namespaces, cgroup subtree, containerd, kubelet and
# kube-proxy) for tests that need a pod really elsewhere (live migration).
#
# Usage (as root):
#   scripts/cluster.sh up [--nodes 1|2] [--owner-pid PID]
#                                            start (or reuse) the cluster; prints KUBECONFIG=,
#                                            KUBECTL= and VIRTCTL=<path> on stdout
#   scripts/cluster.sh down                  remove everything `up` made (both nodes)
#   scripts/cluster.sh status                what runs (exit 0: up and Ready, 1: partly, 3: down)
#   scripts/cluster.sh restart-kubelet       stop node 1's kubelet (SIGTERM) and start it again,
#                                            as a node's service manager would; pods keep running
#                                            (node 2's kubelet is left alone)
#
# `up --owner-pid PID` ties the cluster to process PID (a test binary): once every owner has
# exited, a watchdog takes the cluster down. A cluster brought up without an owner stays until
# `down`. `up` on a healthy cluster only prints those lines (and adds the owner, if the
# cluster has owners); on a broken or half-started one it runs `down` first. A failed `up`
# cleans up after itself. `--nodes` is a minimum: `up --nodes 2` on a healthy one-node cluster
# adds node 2 (node 1 and the control plane keep running; a failure removes node 2 alone),
# and `up` on a two-node cluster keeps node 2.
#
# Environment (all optional):
#   KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE  OCI archive of the sandbox image to import instead of
#                                      building it with images/build.sh (node 2 added to a
#                                      running cluster without it gets node 1's copy)
#   KUBEVIRT_RS_CLUSTER_READY_TIMEOUT  seconds to wait for each component (default 240)
#
# Progress goes to stderr, one line per step with the elapsed time. See integration/README.md
# for the design (addresses, namespaces, files, what `down` removes and why).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SELF="$REPO/scripts/cluster.sh"

# ---- fixed names and addresses -------------------------------------------------------------
# Everything the cluster writes lives under STATE, except what Kubernetes hard-codes or KubeVirt
# expects at its usual place (KUBELET_ROOT, /var/log/containers, /var/lib/cni) — see `down`.
STATE=/var/lib/kubevirt-rs-cluster
# KubeVirt's virt-handler DaemonSet mounts /var/lib/kubelet (pods, device-plugins): keep it there.
KUBELET_ROOT=/var/lib/kubelet
CONTAINER_LOGS_DIR=/var/log/containers # kubelet hard-codes it
CNI_CACHE_DIR=/var/lib/cni             # libcni's default cache, not configurable through CRI
NODE_NAME=kubevirt-rs-node             # fixed: tests and manifests can name it
BRIDGE=kvrs0                           # the pods' bridge, created by `up` (not by the plugin)
CNI_NETWORK=kubevirt-rs
# Not 10.244.0.0/16: the handler's standalone mode gives its pods 10.244.<n>.0/24 on the host.
POD_CIDR=10.217.0.0/16
NODE_IP=10.217.0.1 # on the bridge: the apiserver, the kubelet and pods' gateway
SERVICE_CIDR=10.96.0.0/16
APISERVER_PORT=6443
ETCD_CLIENT=127.0.0.1:2379
ETCD_PEER=127.0.0.1:2380
CGROUP_NAME=kubevirt-rs # kubelet's cgroupRoot, and the parent of the daemons' cgroup
PAUSE_IMAGE=localhost/kubevirt-rs/pause:3.10
READY_TIMEOUT="${KUBEVIRT_RS_CLUSTER_READY_TIMEOUT:-240}"
RUNC=/usr/sbin/runc
CNI_BIN_DIR=/usr/lib/cni
MARKER=.kubevirt-rs-cluster # in directories `up` created outside STATE

# Node 2 (`up --nodes 2`): the host is node 1; node 2's containerd, kubelet and kube-proxy run
# in a network namespace and a mount namespace of their own (held by bind mounts of their nsfs
# files under NODE2_DIR/ns, as `ip netns` holds one under /run/netns), so its pods are really
# elsewhere: other addresses, their own view of the node paths (KUBELET_ROOT, /run,
# CONTAINER_LOGS_DIR, CNI_CACHE_DIR are bind mounts of node-2 directories there), their own
# cgroup subtree. The PID namespace stays shared (virt-handler reads /proc/<pid>/root).
NODE2_NAME=kubevirt-rs-node-2
NODE2_DIR="$STATE/node-2" # every file of node 2
NODE2_POD_CIDR=10.218.0.0/16
NODE2_IP=10.218.0.1 # on node 2's bridge (also named $BRIDGE, in its netns): kubelet, gateway
# The veth pair between the host (node 1) and node 2's netns. Routes go through it "via" the
# other node's IP (onlink), with static neighbour entries, so it needs no addresses of its own
# and no ARP (whatever arp_ignore the machine has).
NODE2_VETH=kvrs0-node2 # the host's end
NODE2_UPLINK=kvrs-uplink # node 2's end
NODE2_VETH_MAC=02:6b:76:72:73:01
NODE2_UPLINK_MAC=02:6b:76:72:73:02
NODE2_CGROUP="$CGROUP_NAME/node-2" # node 2's kubelet cgroupRoot, parent of its daemons' cgroup

# Daemons in start order; `down` stops them in reverse.
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)
NODE2_DAEMONS=(node-2-containerd node-2-kubelet node-2-kube-proxy)

# The node the per-node steps (containerd, kubelet, kube-proxy) work on; `use_node 1|2` sets:
# N_NAME, N_IP, N_POD_CIDR, N_DIR (its files; node 1's are STATE itself, as always), N_PREFIX
# (of its daemons' names), N_CGROUP (its kubelet's cgroupRoot) and N_ENTER (the command prefix
# that runs a program in its namespaces; empty for node 1, the host).
use_node() {
    case $1 in
    1)
        N_NAME=$NODE_NAME N_IP=$NODE_IP N_POD_CIDR=$POD_CIDR N_DIR=$STATE N_PREFIX=""
        N_CGROUP=$CGROUP_NAME N_ENTER=()
        ;;
    2)
        N_NAME=$NODE2_NAME N_IP=$NODE2_IP N_POD_CIDR=$NODE2_POD_CIDR N_DIR=$NODE2_DIR
        N_PREFIX=node-2- N_CGROUP=$NODE2_CGROUP
        N_ENTER=(nsenter "--net=$NODE2_DIR/ns/net" "--mount=$NODE2_DIR/ns/mnt" --)
        ;;
    *) die "use_node: no node $1" ;;
    esac
}
use_node 1

STARTED_AT="$(date +%s%N)"
log() {
    local now elapsed
    now="$(date +%s%N)"
    elapsed=$(((now - STARTED_AT) / 1000000))
    printf 'cluster.sh [%4d.%01ds] %s\n' $((elapsed / 1000)) $((elapsed % 1000 / 100)) "$*" >&2
}
die() {
    log "error: $*"
    exit 1
}

# ---- small helpers -----------------------------------------------------------------------

# The cgroup (below a hierarchy's root) daemon $1 runs in: node 2's have their own.
daemon_cgroup() {
    if [[ "$1" == node-2-* ]]; then echo "/$NODE2_CGROUP/daemons"; else echo "/$CGROUP_NAME/daemons"; fi
}

# The recorded pid of daemon $1 (or of the watchdog), if that process still runs and is still
# ours: a pid file that outlived its process must not make `down` signal whoever got the pid.
pid_of() {
    local pid
    pid="$(cat "$STATE/pids/$1" 2>/dev/null)" || return 0
    [[ "$pid" =~ ^[0-9]+$ ]] || return 0
    if [[ "$1" == watchdog ]]; then
        grep -aqs -- "__watch" "/proc/$pid/cmdline" || return 0
    else
        grep -qsE ":$(daemon_cgroup "$1")\$" "/proc/$pid/cgroup" || return 0
    fi
    echo "$pid"
}
alive() { [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null; }

# The end of a daemon's log, for error messages.
log_tail() { tail -n "${2:-25}" "$STATE/log/$1.log" 2>/dev/null | sed "s/^/    $1| /" >&2 || true; }

# A failed `up` removes its state directory: its daemons' logs are copied out first (a
# daemon that died at once may have left nothing but its log to say why).
# Only the last failure's are kept (tests make `up` fail on purpose).
keep_logs_of_failed_up() {
    local kept=/var/tmp/kubevirt-rs-cluster-failed-up
    rm -rf --one-file-system "$kept"
    [[ -d "$STATE/log" ]] && cp -r "$STATE/log" "$kept" 2>/dev/null &&
        log "up failed: the daemons' logs are kept in $kept"
    return 0
}

# --cache-dir: kubectl would otherwise create ~/.kube/cache.
kubectl_admin() {
    "$BIN/kubectl" --kubeconfig "$STATE/kubeconfig/admin.kubeconfig" \
        --cache-dir "$STATE/kubectl-cache" "$@"
}
# ctr on the current node's containerd (use_node); its socket is reachable from the host.
ctr_k8s() { "$BIN/ctr" --address "$N_DIR/containerd.sock" --namespace k8s.io "$@"; }

# Polls `$2...` until it succeeds; fails naming $1 after READY_TIMEOUT seconds. Also fails as
# soon as one of the daemons started so far has exited.
wait_for() {
    local what="$1" deadline=$((SECONDS + READY_TIMEOUT))
    shift
    until "$@" >/dev/null 2>&1; do
        check_daemons_alive
        ((SECONDS < deadline)) || die "$what: not ready within ${READY_TIMEOUT}s"
        sleep 0.5
    done
}

check_daemons_alive() {
    local name pid
    for name in "${DAEMONS[@]}" "${NODE2_DAEMONS[@]}"; do
        [[ -f "$STATE/pids/$name" ]] || continue
        pid="$(pid_of "$name")"
        if ! alive "$pid"; then
            log_tail "$name" 40
            die "$name (pid $(cat "$STATE/pids/$name")) exited; its log: $STATE/log/$name.log"
        fi
    done
}

# Mount points of cgroup hierarchies (v1 controllers, the named systemd one, the v2 one).
cgroup_mounts() { awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts; }

# The hierarchy that tracks every process of the cluster: the daemons are started in
# <it>/kubevirt-rs/daemons (shims inherit containerd's cgroup) and the kubelet puts pods under
# <it>/kubevirt-rs/kubepods. The pids controller (v1) or the unified hierarchy (v2 only).
tracking_hierarchy() {
    if awk '$2 == "/sys/fs/cgroup/pids" && $3 == "cgroup" { found = 1 } END { exit !found }' /proc/self/mounts; then
        echo /sys/fs/cgroup/pids
    elif awk '$2 == "/sys/fs/cgroup" && $3 == "cgroup2" { found = 1 } END { exit !found }' /proc/self/mounts; then
        echo /sys/fs/cgroup
    else
        die "no pids cgroup hierarchy at /sys/fs/cgroup/pids (v1) or /sys/fs/cgroup (v2)"
    fi
}

# Every process in the cluster's cgroup subtree (or in the subtree $1 below a hierarchy's root,
# e.g. node 2's).
cluster_pids() {
    local root
    root="$(tracking_hierarchy)/${1:-$CGROUP_NAME}"
    [[ -d "$root" ]] || return 0
    find "$root" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un
}

# Mount points at or below $1 (deepest first), decoded from /proc/self/mountinfo's octal escapes.
mounts_under() {
    local prefix="$1"
    awk -v p="$prefix" '{
        m = $5
        while (match(m, /\\[0-7][0-7][0-7]/)) {
            c = substr(m, RSTART + 1, 3)
            m = substr(m, 1, RSTART - 1) sprintf("%c", (substr(c,1,1)*64 + substr(c,2,1)*8 + substr(c,3,1))) substr(m, RSTART + 4)
        }
        if (m == p || index(m, p "/") == 1) print length(m) "\t" m
    }' /proc/self/mountinfo | sort -rn | cut -f2-
}

# 10.217.0.0/16 -> "start end" as integers.
cidr_range() {
    local ip="${1%/*}" bits="${1#*/}" a b c d
    IFS=. read -r a b c d <<<"$ip"
    local n=$(((a << 24) | (b << 16) | (c << 8) | d)) size=$((1 << (32 - bits)))
    echo "$((n & ~(size - 1) & 0xffffffff)) $(((n & ~(size - 1) & 0xffffffff) + size - 1))"
}

# Fails if an existing IPv4 route (other than the default one and our bridge's) overlaps $1.
check_no_route_overlap() {
    local cidr="$1" lo hi dst rlo rhi dev
    read -r lo hi < <(cidr_range "$cidr")
    while read -r dst dev; do
        [[ "$dst" == default || "$dev" == "$BRIDGE" ]] && continue
        [[ "$dst" == */* ]] || dst="$dst/32"
        read -r rlo rhi < <(cidr_range "$dst")
        if ((rlo <= hi && lo <= rhi)); then
            die "$cidr overlaps the route to $dst on $dev of this machine; the cluster needs it free"
        fi
    done < <(ip -4 route show table all type unicast | awk '{ dev = ""; for (i = 1; i < NF; i++) if ($i == "dev") dev = $(i + 1); print $1, dev }')
}

# ---- status --------------------------------------------------------------------------------

# 0: every daemon runs and the node is Ready; 1: something of a cluster exists; 3: nothing.
cluster_state() {
    local anything=0 all=1 name
    [[ -d "$STATE" ]] && anything=1
    ip link show "$BRIDGE" >/dev/null 2>&1 && anything=1
    [[ -n "$(cluster_pids)" ]] && anything=1
    ((anything)) || return 3
    for name in "${DAEMONS[@]}"; do
        alive "$(pid_of "$name")" || all=0
    done
    ((all)) || return 1
    [[ -f "$STATE/bin-dir" ]] || return 1
    BIN="$(cat "$STATE/bin-dir")"
    [[ "$(kubectl_admin get node "$NODE_NAME" \
        -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]] || return 1
    return 0
}

# Node 2 alone: 0: its daemons run and it is Ready; 1: something of it exists; 3: nothing.
# Needs BIN (cluster_state sets it) for the Ready check.
node2_state() {
    local anything=0 name
    [[ -d "$NODE2_DIR" ]] && anything=1
    ip link show "$NODE2_VETH" >/dev/null 2>&1 && anything=1
    [[ -n "$(cluster_pids "$NODE2_CGROUP")" ]] && anything=1
    ((anything)) || return 3
    for name in "${NODE2_DAEMONS[@]}"; do
        alive "$(pid_of "$name")" || return 1
    done
    [[ -n "${BIN:-}" ]] || return 1
    [[ "$(kubectl_admin get node "$NODE2_NAME" \
        -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]] || return 1
    return 0
}

cmd_status() {
    local state=0 node2=3 name pid names=("${DAEMONS[@]}")
    cluster_state || state=$?
    if ((state != 3)); then
        node2=0
        node2_state || node2=$?
    fi
    # Node 2 half there makes the cluster partly up.
    if ((state == 0 && node2 == 1)); then state=1; fi
    if ((node2 != 3)); then names+=("${NODE2_DAEMONS[@]}"); fi
    case $state in
    0) echo "cluster: up, node $NODE_NAME Ready$(if ((node2 == 0)); then echo ", node $NODE2_NAME Ready"; fi)" ;;
    1) echo "cluster: partly up (run \`$0 down\` or \`$0 up\`)" ;;
    3) echo "cluster: down" ;;
    esac
    if ((state != 3)); then
        for name in "${names[@]}" watchdog; do
            pid="$(pid_of "$name")"
            if alive "$pid"; then echo "$name: running (pid $pid)"; else echo "$name: not running"; fi
        done
        echo "processes in the cluster's cgroups: $(cluster_pids | wc -l)"
        if ((node2 == 0)); then
            echo "node $NODE2_NAME: Ready; network and mount namespaces $NODE2_DIR/ns/{net,mnt}"
        elif ((node2 == 1)); then
            echo "node $NODE2_NAME: partly up (\`$0 up\` removes it, \`$0 up --nodes 2\` replaces it)"
        fi
        if ((node2 != 3)); then
            echo "processes in node 2's cgroups: $(cluster_pids "$NODE2_CGROUP" | wc -l)"
        fi
        if [[ -f "$STATE/owners" ]]; then
            echo "owners: $(tr '\n' ' ' <"$STATE/owners")"
        else
            echo "owners: none (stays up until \`$0 down\`)"
        fi
        if ((state == 0)); then
            echo "KUBECONFIG=$STATE/kubeconfig/admin.kubeconfig"
            echo "KUBECTL=$BIN/kubectl"
            echo "VIRTCTL=$BIN/virtctl"
        fi
    fi
    return "$state"
}

# ---- down ----------------------------------------------------------------------------------

# Removes everything `up` made. Safe when nothing runs and after a half-finished `up`.
teardown() {
    log "down: stopping the daemons"
    local watchdog name pid
    watchdog="$(pid_of watchdog)"
    if alive "$watchdog" && ((watchdog != $$ && watchdog != BASHPID)); then
        kill "$watchdog" 2>/dev/null || true
    fi
    # The daemons get 10 s to exit, etcd (10 s more) last (the apiserver's shutdown hangs without it); then
    # every process left in the cluster's cgroups (daemons, containerd's shims, the containers:
    # nothing of them is worth a graceful stop) is killed.
    local deadline pids group
    for group in "${NODE2_DAEMONS[*]} ${DAEMONS[*]/etcd/}" etcd; do
        deadline=$((SECONDS + 10))
        for name in $group; do
            pid="$(pid_of "$name")"
            if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
        done
        for name in $group; do
            pid="$(pid_of "$name")"
            while alive "$pid" && ((SECONDS < deadline)); do
                sleep 0.2
            done
        done
    done
    local lingering=()
    for name in "${NODE2_DAEMONS[@]}" "${DAEMONS[@]}"; do
        if alive "$(pid_of "$name")"; then lingering+=("$name"); fi
    done
    if ((${#lingering[@]})); then log "down: ${lingering[*]} did not exit in time; killing"; fi
    deadline=$((SECONDS + 30))
    while pids="$(cluster_pids)" && [[ -n "$pids" ]]; do
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        ((SECONDS < deadline)) || die "down: processes that do not die: ${pids//$'\n'/ }"
        sleep 0.2
    done

    # Node 2's network (its uplink, with the host's route), namespaces, cgroups and files.
    node2_remove

    # Mounts: container root filesystems, image volumes, sandbox /dev/shm, network namespaces
    # (under STATE), pod volumes and the shared bind mount of KUBELET_ROOT. Deepest first; a
    # busy one is detached lazily so the directories below can go.
    log "down: unmounting"
    local mount_point
    for prefix in "$STATE" "$KUBELET_ROOT"; do
        while read -r mount_point; do
            [[ -n "$mount_point" ]] || continue
            umount "$mount_point" 2>/dev/null || umount -l "$mount_point" ||
                die "down: cannot unmount $mount_point"
        done < <(mounts_under "$prefix")
    done

    # With the namespaces gone the pods' veths are gone too; remove any left on our bridge.
    log "down: removing the network"
    local link
    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        for link in $(ip -o link show master "$BRIDGE" | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
            ip link delete "$link" 2>/dev/null || true
        done
        ip link delete "$BRIDGE"
    fi
    # kube-proxy's tables (nftables mode). No other rules exist: the bridge plugin runs
    # without ipMasq, portmap is not configured, and kubelet and kube-proxy run without
    # iptables on their PATH (see start_kubelet).
    local family
    for family in ip ip6; do
        if nft list table "$family" kube-proxy >/dev/null 2>&1; then
            nft delete table "$family" kube-proxy
        fi
    done
    # libcni's cached results of our sandboxes (files named <network>-<sandbox id>-<ifname>,
    # for our network and containerd's built-in loopback one): all of it if `up` created the
    # directory, else only the entries of sandboxes our containerd knew.
    if [[ -f "$CNI_CACHE_DIR/$MARKER" ]]; then
        rm -rf --one-file-system "$CNI_CACHE_DIR"
    elif [[ -d "$CNI_CACHE_DIR/results" ]]; then
        find "$CNI_CACHE_DIR/results" -name "$CNI_NETWORK-*" -delete 2>/dev/null || true
        local sandbox
        for sandbox in "$STATE"/containerd/root/io.containerd.grpc.v1.cri/sandboxes/*; do
            [[ -d "$sandbox" ]] || continue
            find "$CNI_CACHE_DIR/results" -name "*-${sandbox##*/}-*" -delete 2>/dev/null || true
        done
    fi

    log "down: removing cgroups and files"
    local hierarchy
    while read -r hierarchy; do
        [[ -d "$hierarchy/$CGROUP_NAME" ]] || continue
        find "$hierarchy/$CGROUP_NAME" -depth -type d -exec rmdir {} + 2>/dev/null || true
        [[ ! -d "$hierarchy/$CGROUP_NAME" ]] || die "down: cannot remove cgroup $hierarchy/$CGROUP_NAME"
    done < <(cgroup_mounts)

    if [[ -d "$CONTAINER_LOGS_DIR" ]]; then
        find "$CONTAINER_LOGS_DIR" -maxdepth 1 -type l -lname "$STATE/*" -delete
        if [[ -f "$CONTAINER_LOGS_DIR/$MARKER" ]]; then
            rm -f "$CONTAINER_LOGS_DIR/$MARKER"
            rmdir "$CONTAINER_LOGS_DIR" 2>/dev/null || true
        fi
    fi
    # Only directories `up` created (marked), and never across a mount still there.
    local dir
    for dir in "$KUBELET_ROOT" "$STATE"; do
        [[ -d "$dir" ]] || continue
        [[ "$dir" == "$STATE" || -f "$dir/$MARKER" ]] || continue
        [[ -z "$(mounts_under "$dir")" ]] || die "down: mounts remain under $dir"
        rm -rf --one-file-system "$dir"
    done
    log "down: done"
}

# Removes node 2 alone, the rest of the cluster running on: its daemons and every process in
# its cgroup subtree (its pods), its Node object, then what node2_remove removes. Used when
# adding node 2 to a running cluster fails, and for a broken node 2 found by `up`.
node2_down() {
    log "node 2: stopping its daemons"
    local name pid pids deadline=$((SECONDS + 10))
    for name in "${NODE2_DAEMONS[@]}"; do
        pid="$(pid_of "$name")"
        if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
    done
    for name in "${NODE2_DAEMONS[@]}"; do
        pid="$(pid_of "$name")"
        while alive "$pid" && ((SECONDS < deadline)); do
            sleep 0.2
        done
    done
    deadline=$((SECONDS + 30))
    while pids="$(cluster_pids "$NODE2_CGROUP")" && [[ -n "$pids" ]]; do
        # shellcheck disable=SC2086
        kill -KILL $pids 2>/dev/null || true
        ((SECONDS < deadline)) || die "node 2: processes that do not die: ${pids//$'\n'/ }"
        sleep 0.2
    done
    # Its pods are deleted by the pod garbage collector once the node is gone.
    if [[ -n "${BIN:-}" ]]; then
        kubectl_admin delete node "$NODE2_NAME" --ignore-not-found --wait=false --request-timeout=10s \
            >/dev/null 2>&1 || log "node 2: could not delete its Node object (the apiserver is down?)"
    fi
    node2_remove
    log "node 2: removed"
}

# Node 2's traces once its processes are gone (node2_down, teardown): the veth pair (the host's
# route goes with it), the bind mounts holding its namespaces (the last references: its
# network namespace, with its bridge, routes and kube-proxy's nftables tables, and its mount
# namespace, with every mount its containerd and kubelet made, go with them), its cgroups and
# its directory. Safe when node 2 never existed.
node2_remove() {
    if ip link show "$NODE2_VETH" >/dev/null 2>&1; then
        ip link delete "$NODE2_VETH"
    fi
    local mount_point
    while read -r mount_point; do
        [[ -n "$mount_point" ]] || continue
        umount "$mount_point" 2>/dev/null || umount -l "$mount_point" ||
            die "down: cannot unmount $mount_point"
    done < <(mounts_under "$NODE2_DIR")
    local hierarchy
    while read -r hierarchy; do
        [[ -d "$hierarchy/$NODE2_CGROUP" ]] || continue
        find "$hierarchy/$NODE2_CGROUP" -depth -type d -exec rmdir {} + 2>/dev/null || true
        [[ ! -d "$hierarchy/$NODE2_CGROUP" ]] || die "down: cannot remove cgroup $hierarchy/$NODE2_CGROUP"
    done < <(cgroup_mounts)
    if [[ -d "$NODE2_DIR" ]]; then
        rm -rf --one-file-system "$NODE2_DIR"
    fi
    rm -f "$STATE"/pids/node-2-*
}

# ---- up ------------------------------------------------------------------------------------

preflight() {
    [[ "$(id -u)" == 0 ]] || die "must run as root"
    local tool
    for tool in ip ss nft openssl unshare nsenter setsid flock mount umount; do
        command -v "$tool" >/dev/null || die "$tool is not installed (scripts/setup.sh installs it)"
    done
    [[ -x "$RUNC" ]] || die "$RUNC is missing: install Debian's runc (scripts/setup.sh does)"
    for tool in bridge host-local loopback; do
        [[ -x "$CNI_BIN_DIR/$tool" ]] ||
            die "$CNI_BIN_DIR/$tool is missing: install containernetworking-plugins (scripts/setup.sh does)"
    done
    check_no_route_overlap "$POD_CIDR"
    check_no_route_overlap "$SERVICE_CIDR"
    local port
    for port in "${ETCD_CLIENT##*:}" "${ETCD_PEER##*:}" 10248 10249 10256; do
        # Output captured first: `cmd | grep -q` under pipefail fails when grep's early exit
        # kills cmd with SIGPIPE.
        if [[ -n "$(ss -Htln "sport = :$port")" ]]; then
            die "TCP port $port is in use on this machine; the cluster needs it"
        fi
    done
    if [[ -e "$KUBELET_ROOT" && ! -f "$KUBELET_ROOT/$MARKER" ]] &&
        [[ -n "$(ls -A "$KUBELET_ROOT" 2>/dev/null)" ]]; then
        die "$KUBELET_ROOT exists and was not made by this script (another kubelet?)"
    fi
}

build_binaries() {
    log "binaries: integration/controlplane/build.sh (cached after the first build)"
    BIN="$(bash "$REPO/integration/controlplane/build.sh")" || die "building the binaries failed"
    [[ -x "$BIN/kubelet" && -x "$BIN/containerd" ]] || die "build.sh gave no binaries in '$BIN'"
}

pause_archive() {
    if [[ -n "${KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE:-}" ]]; then
        [[ -f "$KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE" ]] ||
            die "KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE=$KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE does not exist"
        PAUSE_ARCHIVE="$KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE"
        return
    fi
    local script="$REPO/images/build.sh"
    [[ -f "$script" ]] || die "$script does not exist: it builds the sandbox image ($PAUSE_IMAGE);
    set KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE to an OCI archive of it instead"
    log "sandbox image: images/build.sh pause"
    mkdir -p "$STATE/images"
    bash "$script" --out "$STATE/images" pause >&2 || die "images/build.sh pause failed"
    PAUSE_ARCHIVE="$STATE/images/pause.tar"
    [[ -f "$PAUSE_ARCHIVE" ]] || die "images/build.sh wrote no $PAUSE_ARCHIVE"
}

# Starts "$2..." as daemon $1: own session, output to its log, in the cluster's cgroup (its
# node's: daemon_cgroup; so `down` finds it and everything it forks), pid recorded.
start_daemon() {
    local name="$1"
    shift
    log "starting $name"
    # A background job of a non-interactive shell is no process-group leader, so setsid does
    # not fork: $! is the daemon's pid.
    # fd 9 (the lock) is closed: a daemon must not hold it for the rest of its life.
    # shellcheck disable=SC2016 # expanded by the inner bash
    setsid bash -c 'echo $$ >"$0" && exec "$@"' "$(tracking_hierarchy)$(daemon_cgroup "$name")/cgroup.procs" "$@" \
        </dev/null >>"$STATE/log/$name.log" 2>&1 9<&- &
    echo $! >"$STATE/pids/$name"
}

prepare_host() {
    mkdir -p "$STATE"/{pids,log,pki,kubeconfig,config,etcd,cni/net.d,cni/ipam,pod-logs,s}
    chmod 700 "$STATE"

    # cgroups: kubelet's cgroupRoot in every hierarchy, the daemons' cgroup in the tracking one.
    local hierarchy
    while read -r hierarchy; do
        mkdir -p "$hierarchy/$CGROUP_NAME"
        # A new cpuset cgroup starts empty; no task can join it until cpus and mems are set.
        if [[ -f "$hierarchy/cpuset.cpus" && ! -f "$hierarchy/cgroup.controllers" ]]; then
            cat "$hierarchy/cpuset.cpus" >"$hierarchy/$CGROUP_NAME/cpuset.cpus"
            cat "$hierarchy/cpuset.mems" >"$hierarchy/$CGROUP_NAME/cpuset.mems"
        fi
    done < <(cgroup_mounts)
    DAEMON_CGROUP="$(tracking_hierarchy)/$CGROUP_NAME/daemons"
    mkdir -p "$DAEMON_CGROUP"

    # The bridge exists before anything starts: the apiserver and the kubelet bind to NODE_IP.
    # Forwarding is switched on for this interface only (service traffic from a pod to another
    # pod enters and leaves through it), never globally; no ICMP redirects for DNATed packets.
    log "network: bridge $BRIDGE with $NODE_IP/${POD_CIDR#*/}"
    ip link add "$BRIDGE" type bridge
    ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    echo 1 >"/proc/sys/net/ipv4/conf/$BRIDGE/forwarding"
    echo 0 >"/proc/sys/net/ipv4/conf/$BRIDGE/send_redirects"

    # Kubelet's root: a shared mount of its own, so that pods may mount (parts of) it with
    # HostToContainer or Bidirectional propagation (KubeVirt's handler does); / is private here.
    if [[ ! -d "$KUBELET_ROOT" ]]; then
        mkdir -p "$KUBELET_ROOT"
    fi
    touch "$KUBELET_ROOT/$MARKER"
    mount --bind "$KUBELET_ROOT" "$KUBELET_ROOT"
    mount --make-rshared "$KUBELET_ROOT"

    if [[ ! -d "$CONTAINER_LOGS_DIR" ]]; then
        mkdir -p "$CONTAINER_LOGS_DIR"
        touch "$CONTAINER_LOGS_DIR/$MARKER"
    fi
    if [[ ! -d "$CNI_CACHE_DIR" ]]; then
        mkdir -p "$CNI_CACHE_DIR"
        touch "$CNI_CACHE_DIR/$MARKER"
    fi
}

# A throw-away CA, the apiserver's serving certificate, the apiserver's client certificate for
# the kubelet, the service-account key, one static token per component, and the front proxy's
# own CA and client certificate (the aggregation layer: the apiserver proxies
# subresources.kubevirt.io to virt-api with that certificate and the X-Remote-* headers; a CA of
# its own, as Kubernetes advises, so no other client certificate can assert those headers).
write_pki_and_kubeconfigs() {
    log "certificates and kubeconfigs"
    local pki="$STATE/pki"
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$pki/ca.key" -subj "/CN=kubevirt-rs-cluster-ca" -days 3650 \
        -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" -out "$pki/ca.crt" 2>/dev/null
    # sign NAME SUBJECT EXTENSIONS
    sign() {
        openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$1.key" 2>/dev/null
        openssl req -new -key "$pki/$1.key" -subj "$2" 2>/dev/null |
            openssl x509 -req -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -days 3650 \
                -set_serial "0x$(openssl rand -hex 16)" -extfile <(printf '%s\n' "$3") \
                -out "$pki/$1.crt" 2>/dev/null
    }
    local first_service_ip="${SERVICE_CIDR%.*/*}.1"
    sign apiserver "/CN=kube-apiserver" "$(printf '%s\n' \
        "subjectAltName=IP:$NODE_IP,IP:$first_service_ip,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
        "extendedKeyUsage=serverAuth" "keyUsage=critical,digitalSignature")"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" \
        "$(printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature")"
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/front-proxy-ca.key" 2>/dev/null
    openssl req -x509 -new -key "$pki/front-proxy-ca.key" -subj "/CN=kubevirt-rs-front-proxy-ca" \
        -days 3650 -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
        -out "$pki/front-proxy-ca.crt" 2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/front-proxy-client.key" 2>/dev/null
    openssl req -new -key "$pki/front-proxy-client.key" -subj "/CN=front-proxy-client" 2>/dev/null |
        openssl x509 -req -CA "$pki/front-proxy-ca.crt" -CAkey "$pki/front-proxy-ca.key" -days 3650 \
            -set_serial "0x$(openssl rand -hex 16)" -out "$pki/front-proxy-client.crt" \
            -extfile <(printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature") \
            2>/dev/null
    openssl ecparam -name prime256v1 -genkey -noout -out "$pki/service-account.key" 2>/dev/null
    openssl ec -in "$pki/service-account.key" -pubout -out "$pki/service-account.pub" 2>/dev/null

    # token,user,uid,"group1,group2" — the users the default RBAC bindings know.
    local who user groups token
    : >"$pki/tokens.csv"
    for who in admin kubelet kube-controller-manager kube-scheduler kube-proxy; do
        case $who in
        admin) user=kubevirt-rs-admin groups=system:masters ;;
        kubelet) user="system:node:$NODE_NAME" groups=system:nodes ;;
        *) user="system:$who" groups="" ;;
        esac
        token="$(openssl rand -hex 16)"
        echo "$token,$user,$user,\"$groups\"" >>"$pki/tokens.csv"
        cat >"$STATE/kubeconfig/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubevirt-rs
  cluster:
    server: https://$NODE_IP:$APISERVER_PORT
    certificate-authority: $pki/ca.crt
users:
- name: $who
  user:
    token: $token
contexts:
- name: kubevirt-rs
  context:
    cluster: kubevirt-rs
    user: $who
current-context: kubevirt-rs
EOF
    done
    chmod 600 "$pki"/*.key "$pki/tokens.csv" "$STATE"/kubeconfig/*
}

start_control_plane() {
    start_daemon etcd "$BIN/etcd" --name=default --data-dir="$STATE/etcd" \
        --listen-client-urls="http://$ETCD_CLIENT" --advertise-client-urls="http://$ETCD_CLIENT" \
        --listen-peer-urls="http://$ETCD_PEER" --initial-advertise-peer-urls="http://$ETCD_PEER" \
        --initial-cluster="default=http://$ETCD_PEER" --listen-metrics-urls= \
        --unsafe-no-fsync=true --log-level=warn

    local pki="$STATE/pki"
    start_daemon kube-apiserver "$BIN/kube-apiserver" \
        --advertise-address="$NODE_IP" --bind-address="$NODE_IP" --secure-port="$APISERVER_PORT" \
        --etcd-servers="http://$ETCD_CLIENT" \
        --service-cluster-ip-range="$SERVICE_CIDR" \
        --allow-privileged=true \
        --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
        --token-auth-file="$pki/tokens.csv" --client-ca-file="$pki/ca.crt" \
        --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
        --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types=InternalIP \
        --service-account-issuer=https://kubernetes.default.svc.cluster.local \
        --service-account-key-file="$pki/service-account.pub" \
        --service-account-signing-key-file="$pki/service-account.key" \
        --cert-dir="$pki/apiserver-generated" --profiling=false \
        --requestheader-client-ca-file="$pki/front-proxy-ca.crt" \
        --requestheader-allowed-names=front-proxy-client \
        --requestheader-username-headers=X-Remote-User \
        --requestheader-group-headers=X-Remote-Group \
        --requestheader-extra-headers-prefix=X-Remote-Extra- \
        --proxy-client-cert-file="$pki/front-proxy-client.crt" \
        --proxy-client-key-file="$pki/front-proxy-client.key" \
        --enable-aggregator-routing=true
    wait_for "kube-apiserver /readyz" kubectl_admin get --raw /readyz

    # No serving port for either: nothing scrapes or probes them, and no port can clash.
    start_daemon kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig="$STATE/kubeconfig/kube-controller-manager.kubeconfig" \
        --use-service-account-credentials=true --root-ca-file="$pki/ca.crt" \
        --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$POD_CIDR" \
        --leader-elect=false --secure-port=0 --profiling=false
    start_daemon kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig="$STATE/kubeconfig/kube-scheduler.kubeconfig" \
        --leader-elect=false --secure-port=0 --profiling=false
}

# The current node's containerd (use_node) with its CNI configuration; imports the sandbox image.
start_containerd() {
    # containerd 2.x, configuration version 3. Its defaults point at /run/containerd,
    # /var/lib/containerd, /opt/containerd, /run/containerd/s and /var/run/netns; every one is
    # moved under STATE (node 2's under NODE2_DIR), so nothing collides with a system
    # containerd or with the other node's.
    cat >"$N_DIR/config/containerd.toml" <<EOF
version = 3
root = "$N_DIR/containerd/root"
state = "$N_DIR/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri"]

[grpc]
  address = "$N_DIR/containerd.sock"
[ttrpc]
  address = "$N_DIR/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = "$N_DIR/containerd/opt"
  [plugins.'io.containerd.shim.v1.manager']
    socket_dir = "$N_DIR/s"
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "overlayfs"
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "$PAUSE_IMAGE"
  [plugins.'io.containerd.cri.v1.runtime']
    # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails in runc ("can't get
    # final child's PID from pipe: EOF") when it tries to lower oom_score_adj.
    restrict_oom_score_adj = true
    netns_mounts_under_state_dir = true
    cdi_spec_dirs = []
    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = "runc"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        # Absolute: a shim found on PATH might be another containerd's (Debian's 1.6 shim
        # does not understand 2.x's bootstrap protocol).
        runtime_path = "$BIN/containerd-shim-runc-v2"
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
          BinaryName = "$RUNC"
          Root = "$N_DIR/runc"
          SystemdCgroup = false
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["$CNI_BIN_DIR"]
      conf_dir = "$N_DIR/cni/net.d"
      max_conf_num = 1
EOF
    # The pods' network: Debian's bridge + host-local + loopback plugins on our bridge (node
    # 2's in its netns). No ipMasq (it needs iptables, and there is no outside network to
    # reach) and no isGateway: `up` owns the bridge and its address, so the plugin changes no
    # global sysctl.
    cat >"$N_DIR/cni/net.d/10-$CNI_NETWORK.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$N_DIR/cni/ipam",
        "ranges": [[{"subnet": "$N_POD_CIDR", "rangeStart": "${N_IP%.*}.10", "gateway": "$N_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "loopback"}
  ]
}
EOF
    start_daemon "${N_PREFIX}containerd" "${N_ENTER[@]}" \
        env PATH="$BIN:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin" \
        "$BIN/containerd" --config "$N_DIR/config/containerd.toml"
    wait_for "${N_PREFIX}containerd" "$BIN/ctr" --address "$N_DIR/containerd.sock" version

    log "sandbox image: importing $PAUSE_ARCHIVE${N_PREFIX:+ into node 2}"
    import_archive "$PAUSE_ARCHIVE"
    # Not `ctr ... | grep -q`: grep's early exit can kill ctr with SIGPIPE, which fails the
    # pipeline under pipefail (seen: "holds no image named" with the name in the list).
    local images
    images="$(ctr_k8s images ls -q)" || die "ctr images ls failed"
    grep -qxF "$PAUSE_IMAGE" <<<"$images" ||
        die "$PAUSE_ARCHIVE holds no image named $PAUSE_IMAGE (it has: $(tr '\n' ' ' <<<"$images"))"
}

# Imports an OCI (or Docker) archive into the k8s.io namespace of the current node's containerd,
# unpacked for the CRI's snapshotter, so pods can use its images without pulling.
import_archive() {
    ctr_k8s images import --snapshotter overlayfs "$1" >&2 ||
        die "ctr images import $1 failed"
}

# The current node's kubelet (use_node), waited for until its node is Ready.
start_kubelet() {
    cat >"$N_DIR/config/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# Measured here: cgroup v1 (hybrid), PID 1 is not systemd, no swap.
cgroupDriver: cgroupfs
cgroupRoot: /$N_CGROUP
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$N_DIR/containerd.sock
address: $N_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $STATE/pki/ca.crt
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $N_DIR/pod-logs
volumePluginDir: $N_DIR/kubelet-plugins/volume/exec
# A shared, busy disk: no evictions or image garbage collection because other users fill it
# (pods are evicted only when the disk is all but full).
evictionHard:
  memory.available: 100Mi
  nodefs.available: 100Mi
  imagefs.available: 100Mi
  nodefs.inodesFree: 1%
  imagefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# As a real node has them: Kubernetes' default pod limit (100 VMIs and the system pods fit),
# and resources kept from the pods' allocatable share for the kubelet and containerd
# (kubeReserved: GKE's CPU share for two cores) and for the rest of the machine
# (systemReserved: here the control plane runs beside the node).
maxPods: 110
kubeReserved:
  cpu: 70m
  memory: 1Gi
systemReserved:
  cpu: 200m
  memory: 2Gi
EOF
    # The kernel settings kubelet insists on (vm.overcommit_memory=1, kernel.panic=10,
    # kernel.panic_on_oops=1, ...) would change the whole machine. kubelet runs in a mount
    # namespace of its own in which each differing /proc/sys file is covered by a read-only
    # file holding the wanted value, so it finds them set and writes nothing. Propagation is
    # left unchanged: KUBELET_ROOT is a shared mount, so pod volumes still appear on the host.
    mkdir -p "$N_DIR/kubelet-sysctls" "$STATE/path"
    # Without iptables on its PATH kubelet skips its KUBE-IPTABLES-HINT and KUBE-FIREWALL
    # chains (only iptables-mode kube-proxy needs them); kube-proxy gets `nft` alone.
    ln -sf "$(command -v nft)" "$STATE/path/nft"
    local setting wanted
    local masks=()
    for setting in vm/overcommit_memory=1 vm/panic_on_oom=0 kernel/panic=10 \
        kernel/panic_on_oops=1 kernel/keys/root_maxkeys=1000000 kernel/keys/root_maxbytes=25000000; do
        wanted="${setting#*=}"
        setting="${setting%=*}"
        [[ "$(cat "/proc/sys/$setting")" == "$wanted" ]] && continue
        echo "$wanted" >"$N_DIR/kubelet-sysctls/${setting//\//.}"
        masks+=("$N_DIR/kubelet-sysctls/${setting//\//.}" "/proc/sys/$setting")
    done
    # Under a supervisor that starts it again when it dies, as a node's service manager does
    # (kubeadm's unit: Restart=always): the kubelet's device manager can panic when a device
    # plugin deregisters while a pod is being admitted (a virt-handler restart in a burst;
    # kubernetes/kubernetes#119560 and others), and a node whose kubelet stays dead is lost.
    # Node 2's enters node 2's namespaces first: its mask namespace is a child of node 2's
    # mount namespace, where KUBELET_ROOT is node 2's (shared there, so its pod volumes reach
    # node 2's containerd).
    start_daemon "${N_PREFIX}kubelet" bash "$SELF" __respawn "${N_PREFIX}kubelet" -- "${N_ENTER[@]}" \
        env PATH=/usr/local/bin:/usr/bin:/bin \
        unshare --mount --propagation unchanged \
        bash "$SELF" __exec-with-masks "${masks[@]}" -- \
        "$BIN/kubelet" --config="$N_DIR/config/kubelet.yaml" \
        --kubeconfig="$N_DIR/kubeconfig/kubelet.kubeconfig" \
        --root-dir="$KUBELET_ROOT" --hostname-override="$N_NAME" --node-ip="$N_IP"
    wait_for "node $N_NAME registered" kubectl_admin get node "$N_NAME"
    wait_for "node $N_NAME Ready" kubectl_admin wait --for=condition=Ready \
        "node/$N_NAME" --timeout=5s
    # Ready is not yet schedulable: the node lifecycle controller takes the
    # `node.kubernetes.io/not-ready` taint off a moment later.
    wait_for "node $N_NAME's not-ready taint gone" node_not_ready_taint_gone "$N_NAME"
}

node_not_ready_taint_gone() {
    local taints
    taints="$(kubectl_admin get node "$1" \
        -o 'jsonpath={.spec.taints[?(@.key=="node.kubernetes.io/not-ready")].key}')" || return 1
    [[ -z "$taints" ]]
}

# The current node's kube-proxy (use_node; node 2's in its netns, for its pods' Service
# traffic), waited for until its rules for the `kubernetes` Service are in place.
start_kube_proxy() {
    cat >"$N_DIR/config/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: $N_DIR/kubeconfig/kube-proxy.kubeconfig
hostnameOverride: $N_NAME
clusterCIDR: $N_POD_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
nodePortAddresses: ["$N_IP/32"]
# Zero: leave the machine's conntrack sysctls as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOF
    start_daemon "${N_PREFIX}kube-proxy" "${N_ENTER[@]}" env PATH="$STATE/path:/usr/bin:/bin" \
        "$BIN/kube-proxy" --config="$N_DIR/config/kube-proxy.yaml"
    local first_service_ip="${SERVICE_CIDR%.*/*}.1"
    wait_for "${N_PREFIX}kube-proxy rules for the kubernetes service" \
        kube_proxy_has_rule_for "$first_service_ip"
}

# Whether the current node's kube-proxy table names $1. Not `nft ... | grep -q`: grep's early
# exit can kill nft with SIGPIPE, which fails the pipeline under pipefail.
kube_proxy_has_rule_for() {
    local table
    table="$("${N_ENTER[@]}" nft list table ip kube-proxy 2>/dev/null)" || return 1
    grep -qF "$1" <<<"$table"
}

# ---- node 2 --------------------------------------------------------------------------------

# Node 2's directories, cgroups, namespaces and network. Runs after prepare_host (node 2's
# mount points are the ones node 1 uses).
prepare_node2() {
    log "node 2: namespaces, mounts, cgroups; $NODE2_IP/${NODE2_POD_CIDR#*/} on its $BRIDGE, $NODE2_VETH to the host"
    mkdir -p "$NODE2_DIR"/{ns,sys,config,pki,kubeconfig,cni/net.d,cni/ipam,pod-logs,s} \
        "$NODE2_DIR"/{kubelet,run/lock,log-containers,cni-cache}
    chmod 700 "$NODE2_DIR"
    # Node 2's /run: what a machine's /run has that anything here might use.
    chmod 1777 "$NODE2_DIR/run/lock"
    ln -s /dev/shm "$NODE2_DIR/run/shm"

    # Its own subtree below the cluster's (so `down` finds everything in it), in every
    # hierarchy: its kubelet's cgroupRoot, and its daemons' cgroup in the tracking one.
    local hierarchy
    while read -r hierarchy; do
        mkdir -p "$hierarchy/$NODE2_CGROUP"
        if [[ -f "$hierarchy/cpuset.cpus" && ! -f "$hierarchy/cgroup.controllers" ]]; then
            cat "$hierarchy/$CGROUP_NAME/cpuset.cpus" >"$hierarchy/$NODE2_CGROUP/cpuset.cpus"
            cat "$hierarchy/$CGROUP_NAME/cpuset.mems" >"$hierarchy/$NODE2_CGROUP/cpuset.mems"
        fi
    done < <(cgroup_mounts)
    mkdir -p "$(tracking_hierarchy)/$NODE2_CGROUP/daemons"

    # The namespaces, held by bind mounts of their nsfs files. The directory is a private mount
    # of its own: unshare refuses to bind a mount namespace below a shared mount (a loop), and
    # nothing mounted there must propagate anywhere.
    mount --bind "$NODE2_DIR/ns" "$NODE2_DIR/ns"
    mount --make-private "$NODE2_DIR/ns"
    touch "$NODE2_DIR/ns/net" "$NODE2_DIR/ns/mnt"
    # Everything private in the new mount namespace: a mount there must not reach the host
    # (node 1's KUBELET_ROOT is shared), nor one of the host's reach node 2.
    unshare --net="$NODE2_DIR/ns/net" --mount="$NODE2_DIR/ns/mnt" --propagation private \
        bash "$SELF" __node2-mounts

    # The link: a veth pair, no addresses on it; each side routes to the other node "via" that
    # node's IP (onlink), found by a static neighbour entry. Node 2's default route is the
    # host, as node 1's pods' is: it reaches node 1, its pods and the apiserver, and Service
    # addresses have a route (kube-proxy DNATs them in node 2's netns).
    local n2=(nsenter "--net=$NODE2_DIR/ns/net" --)
    ip link add "$NODE2_VETH" address "$NODE2_VETH_MAC" type veth \
        peer name "$NODE2_UPLINK" address "$NODE2_UPLINK_MAC" netns "$NODE2_DIR/ns/net"
    "${n2[@]}" ip link set lo up
    "${n2[@]}" ip link add "$BRIDGE" type bridge
    "${n2[@]}" ip addr add "$NODE2_IP/${NODE2_POD_CIDR#*/}" dev "$BRIDGE"
    "${n2[@]}" ip link set "$BRIDGE" up
    "${n2[@]}" ip link set "$NODE2_UPLINK" up
    ip link set "$NODE2_VETH" up
    ip neigh replace "$NODE2_IP" lladdr "$NODE2_UPLINK_MAC" dev "$NODE2_VETH" nud permanent
    "${n2[@]}" ip neigh replace "$NODE_IP" lladdr "$NODE2_VETH_MAC" dev "$NODE2_UPLINK" nud permanent
    ip route add "$NODE2_POD_CIDR" via "$NODE2_IP" dev "$NODE2_VETH" onlink src "$NODE_IP"
    "${n2[@]}" ip route add default via "$NODE_IP" dev "$NODE2_UPLINK" onlink src "$NODE2_IP"
    # Forwarding as on node 1: per interface, on the ones packets to be forwarded come in
    # through (the host's end of the link; node 2's bridge and uplink, in its own netns).
    echo 1 >"/proc/sys/net/ipv4/conf/$NODE2_VETH/forwarding"
    echo 0 >"/proc/sys/net/ipv4/conf/$NODE2_VETH/send_redirects"
    # shellcheck disable=SC2016 # expanded by the inner bash
    "${n2[@]}" bash -c 'for dev; do
            echo 1 >"/proc/sys/net/ipv4/conf/$dev/forwarding"
            echo 0 >"/proc/sys/net/ipv4/conf/$dev/send_redirects"
        done' - "$BRIDGE" "$NODE2_UPLINK"
}

# Node 2's kubelet and kube-proxy credentials: client certificates from the cluster's CA (the
# apiserver's static tokens are read once at its start, and node 2 may join a running
# cluster), as the users the default RBAC bindings know.
write_node2_credentials() {
    local pki="$NODE2_DIR/pki" who subject
    for who in kubelet kube-proxy; do
        case $who in
        kubelet) subject="/O=system:nodes/CN=system:node:$NODE2_NAME" ;;
        kube-proxy) subject="/CN=system:kube-proxy" ;;
        esac
        openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$who.key" 2>/dev/null
        openssl req -new -key "$pki/$who.key" -subj "$subject" 2>/dev/null |
            openssl x509 -req -CA "$STATE/pki/ca.crt" -CAkey "$STATE/pki/ca.key" -days 3650 \
                -set_serial "0x$(openssl rand -hex 16)" -out "$pki/$who.crt" \
                -extfile <(printf '%s\n' "extendedKeyUsage=clientAuth" "keyUsage=critical,digitalSignature") \
                2>/dev/null
        cat >"$NODE2_DIR/kubeconfig/$who.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kubevirt-rs
  cluster:
    server: https://$NODE_IP:$APISERVER_PORT
    certificate-authority: $STATE/pki/ca.crt
users:
- name: $who
  user:
    client-certificate: $pki/$who.crt
    client-key: $pki/$who.key
contexts:
- name: kubevirt-rs
  context:
    cluster: kubevirt-rs
    user: $who
current-context: kubevirt-rs
EOF
    done
    chmod 600 "$pki"/*.key "$NODE2_DIR"/kubeconfig/*
}

# Brings node 2 up beside a running node 1 and control plane: Ready, kube-proxy's rules in place.
up_node2() {
    check_no_route_overlap "$NODE2_POD_CIDR"
    prepare_node2
    write_node2_credentials
    # The sandbox image: the archive node 1 got, or (node 2 joining a running cluster without
    # one) node 1's copy, rather than building it again.
    if [[ -z "${PAUSE_ARCHIVE:-}" && -n "${KUBEVIRT_RS_CLUSTER_PAUSE_ARCHIVE:-}" ]]; then
        pause_archive
    elif [[ -z "${PAUSE_ARCHIVE:-}" ]]; then
        PAUSE_ARCHIVE="$NODE2_DIR/pause.tar"
        ctr_k8s images export "$PAUSE_ARCHIVE" "$PAUSE_IMAGE" >&2 ||
            die "exporting $PAUSE_IMAGE from node 1's containerd failed"
    fi
    use_node 2
    start_containerd
    start_kubelet
    start_kube_proxy
    use_node 1
    log "node 2: $NODE2_NAME Ready"
}

# Internal: `__node2-mounts`, run by `unshare` in node 2's new network and mount namespaces
# (every mount private): node 2's view of the machine.
cmd_node2_mounts() {
    # The copies of node 1's mounts (its pods' root file systems, network namespaces and
    # volumes) would pin them until node 2 goes: dropped.
    local prefix mount_point
    for prefix in "$STATE" "$KUBELET_ROOT"; do
        while read -r mount_point; do
            [[ -n "$mount_point" ]] || continue
            umount -l "$mount_point"
        done < <(mounts_under "$prefix")
    done
    # A sysfs of this network namespace (/sys/class/net shows node 2's links, as `ip netns
    # exec` arranges), with the cgroup hierarchies moved over.
    mount -t sysfs sysfs "$NODE2_DIR/sys"
    if [[ -n "$(mounts_under /sys/fs/cgroup)" ]]; then
        mount --move /sys/fs/cgroup "$NODE2_DIR/sys/fs/cgroup"
    fi
    umount -l /sys
    mount --move "$NODE2_DIR/sys" /sys
    # Node 2's own node paths: the kubelet's root (shared here, for pods' mount propagation,
    # as node 1's is on the host), /run (KubeVirt's /var/run/kubevirt and
    # /var/run/kubevirt-private among it), pod-log links, libcni's cache.
    mount --bind "$NODE2_DIR/kubelet" "$KUBELET_ROOT"
    mount --make-rshared "$KUBELET_ROOT"
    mount --bind "$NODE2_DIR/run" /run
    mount --bind "$NODE2_DIR/log-containers" "$CONTAINER_LOGS_DIR"
    mount --bind "$NODE2_DIR/cni-cache" "$CNI_CACHE_DIR"
}

# Pods need the `default` service account (ServiceAccount admission) in their namespace.
wait_for_service_accounts() {
    wait_for "service account default/default" kubectl_admin get serviceaccount default -n default
}

# Keeps the cluster while any owner process lives; then takes it down.
start_watchdog() {
    local watchdog
    watchdog="$(pid_of watchdog)"
    alive "$watchdog" && return
    setsid bash "$SELF" __watch </dev/null >>"$STATE/log/watchdog.log" 2>&1 9<&- &
    echo $! >"$STATE/pids/watchdog"
}

add_owner() {
    local owner="$1"
    if ! [[ "$owner" =~ ^[0-9]+$ ]] || ! alive "$owner"; then
        die "--owner-pid $owner: no such process"
    fi
    echo "$owner" >>"$STATE/owners"
    start_watchdog
}

print_environment() {
    echo "KUBECONFIG=$STATE/kubeconfig/admin.kubeconfig"
    echo "KUBECTL=$BIN/kubectl"
    echo "VIRTCTL=$BIN/virtctl"
}

cmd_up() {
    local owner="" nodes=1
    while (($#)); do
        case $1 in
        --owner-pid)
            owner="${2:-}"
            shift 2 || die "--owner-pid needs a pid"
            ;;
        --nodes)
            nodes="${2:-}"
            shift 2 || die "--nodes needs a number"
            [[ "$nodes" == [12] ]] || die "--nodes $nodes: 1 or 2"
            ;;
        *) die "up: unknown argument $1" ;;
        esac
    done
    lock
    local state=0
    cluster_state || state=$?
    if ((state == 0)); then
        log "already up"
        # Node 2: a half-started or broken one goes; asked for and missing, it is added (a
        # failure removes it alone: node 1 keeps running for its owners).
        local node2=0
        node2_state || node2=$?
        if ((node2 == 1)); then
            log "node 2 is broken or half-started: removing it"
            node2_down
            node2=3
        fi
        if ((nodes == 2 && node2 == 3)); then
            [[ "$(id -u)" == 0 ]] || die "must run as root"
            trap 'rc=$?; if ((rc != 0)); then log "adding node 2 failed: removing it"; node2_down || true; fi' EXIT
            up_node2
            trap - EXIT
        fi
        if [[ -n "$owner" && -f "$STATE/owners" ]]; then
            add_owner "$owner"
        elif [[ -z "$owner" ]]; then
            rm -f "$STATE/owners" # brought up by hand now: stays until `down`
        fi
        print_environment
        return
    fi
    if ((state == 1)); then
        log "a broken or half-started cluster exists: taking it down first"
        teardown
    fi
    [[ "$(id -u)" == 0 ]] || die "must run as root"
    build_binaries
    preflight

    # From here on, a failure takes down whatever was started.
    trap 'rc=$?; if ((rc != 0)); then keep_logs_of_failed_up; log "up failed: cleaning up"; teardown || true; fi' EXIT
    prepare_host
    echo "$BIN" >"$STATE/bin-dir"
    pause_archive
    write_pki_and_kubeconfigs
    start_control_plane
    start_containerd
    start_kubelet
    start_kube_proxy
    wait_for_service_accounts
    if ((nodes == 2)); then
        up_node2
    fi
    if [[ -n "$owner" ]]; then
        add_owner "$owner"
    fi
    trap - EXIT
    log "up: node $NODE_NAME Ready$(if ((nodes == 2)); then echo ", node $NODE2_NAME Ready"; fi)"
    print_environment
}

cmd_down() {
    [[ "$(id -u)" == 0 ]] || die "must run as root"
    lock
    teardown
}

# The kubelet stops and starts again with the same configuration (what a node's service
# manager does on an upgrade or a crash): containers keep running, and on start it wipes its
# device-plugin directory, so every device plugin has to register again.
cmd_restart_kubelet() {
    [[ "$(id -u)" == 0 ]] || die "must run as root"
    lock
    local state=0 pid
    cluster_state || state=$?
    ((state == 0)) || die "restart-kubelet: the cluster is not up (\`$0 status\`)"
    pid="$(pid_of kubelet)"
    log "restart-kubelet: stopping the kubelet (pid $pid)"
    kill "$pid"
    local deadline=$((SECONDS + 30))
    while alive "$pid"; do
        ((SECONDS < deadline)) || { kill -KILL "$pid" 2>/dev/null || true; break; }
        sleep 0.2
    done
    start_kubelet
    log "restart-kubelet: node $NODE_NAME Ready"
}

# One `up`/`down` at a time, across checkouts: the lock is the parent directory of STATE (a
# directory every checkout agrees on, and nothing to clean up afterwards).
lock() {
    exec 9<"$(dirname "$STATE")"
    flock 9
}

# The watchdog: polls the owners; once none has been alive for a grace period (so the next test
# binary of a `cargo test` run can take the cluster over), takes the cluster down. A manual `up`
# removes the owners file: then the cluster stays and the watchdog exits.
any_owner_alive() {
    local owner
    while read -r owner; do
        alive "$owner" && return 0
    done <"$STATE/owners"
    return 1
}

cmd_watch() {
    local grace=10 orphaned_since=""
    log "watchdog: pid $$"
    while sleep 1; do
        if [[ ! -f "$STATE/owners" ]]; then
            log "watchdog: no owners file (cluster down or kept by hand); exiting"
            return
        fi
        if any_owner_alive; then
            orphaned_since=""
            continue
        fi
        orphaned_since="${orphaned_since:-$SECONDS}"
        ((SECONDS - orphaned_since >= grace)) || continue
        lock
        # Re-checked under the lock: an `up --owner-pid` may have added an owner meanwhile.
        if [[ -f "$STATE/owners" ]] && ! any_owner_alive; then
            log "watchdog: every owner has exited; taking the cluster down"
            teardown
            return
        fi
        exec 9<&-
        orphaned_since=""
    done
}

# Internal: `__respawn NAME -- COMMAND...` runs COMMAND and starts it again 2 s after it ends,
# until SIGTERM (passed on to COMMAND, then waited for).
cmd_respawn() {
    local name="$1" child="" status stopping=0
    shift 2
    trap 'stopping=1; [[ -n "$child" ]] && kill -TERM "$child" 2>/dev/null' TERM INT
    while true; do
        "$@" &
        child=$!
        # `wait` returns early when a trapped signal arrives: wait until the child is gone.
        # (`set -e` would end this supervisor with the child's failure: the status is taken
        # in a list, which errexit leaves alone.)
        while true; do
            wait "$child" && status=0 || status=$?
            alive "$child" || break
        done
        ((stopping)) && exit 0
        log "$name exited with status $status; starting it again in 2 s (as a service manager would)"
        sleep 2 &
        wait $! || true
        ((stopping)) && exit 0
    done
}

# Internal: `__exec-with-masks FILE TARGET ... -- COMMAND...` bind-mounts each FILE read-only
# over TARGET (in the caller's private mount namespace) and execs COMMAND.
cmd_exec_with_masks() {
    while [[ "$1" != -- ]]; do
        mount --bind "$1" "$2"
        mount -o remount,bind,ro "$2"
        shift 2
    done
    shift
    exec "$@"
}

case "${1:-}" in
up)
    shift
    cmd_up "$@"
    ;;
down) cmd_down ;;
status) cmd_status ;;
restart-kubelet) cmd_restart_kubelet ;;
__watch) cmd_watch ;;
__respawn)
    shift
    cmd_respawn "$@"
    ;;
__exec-with-masks)
    shift
    cmd_exec_with_masks "$@"
    ;;
__node2-mounts) cmd_node2_mounts ;;
*)
    echo "usage: $0 up [--nodes 1|2] [--owner-pid PID] | down | status | restart-kubelet (node 1's)" >&2
    exit 2
    ;;
esac
