#!/usr/bin/env bash
# Builds (once, then cached) the Kubernetes binaries used by the integration tests and by
# scripts/cluster.sh: from the k8s.io/kubernetes Go module kube-apiserver,
# kube-controller-manager, kube-scheduler, kube-proxy, kubelet and kubectl; etcd from
# go.etcd.io/etcd/server/v3; containerd, containerd-shim-runc-v2 and ctr from
# github.com/containerd/containerd/v2; virtctl from kubevirt.io/kubevirt (see build_virtctl). No
# binary downloads: only the Go module proxy is used.
#
# Usage: integration/controlplane/build.sh
#   stdout: one line, the directory holding all the binaries.
#   stderr: progress.
#
# Environment (all optional):
#   KUBE_VERSION                 k8s.io/kubernetes release (default below)
#   ETCD_VERSION                 go.etcd.io/etcd/server/v3 release (default below)
#   CONTAINERD_VERSION           github.com/containerd/containerd/v2 release (default below)
#   KUBEVIRT_VERSION             kubevirt.io/kubevirt release for virtctl (default below)
#   KUBEVIRT_RS_CONTROLPLANE_CACHE  cache root
#                                (default ${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/controlplane)
#   CONTROLPLANE_BUILD_JOBS      go build -p value (default 2: the dev machines are shared)
#   CONTROLPLANE_NICE            nice level for the go commands (default 19)
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
# 2.3 is a containerd line recommended for Kubernetes 1.36 (its RELEASES.md), has CRI image
# volumes (since 2.1), a configurable shim socket directory, and still supports cgroup v1.
CONTAINERD_VERSION="${CONTAINERD_VERSION:-v2.3.7}"
KUBEVIRT_VERSION="${KUBEVIRT_VERSION:-v1.9.0}"
CACHE_ROOT="${KUBEVIRT_RS_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/controlplane}"
JOBS="${CONTROLPLANE_BUILD_JOBS:-2}"
NICE="${CONTROLPLANE_NICE:-19}"

# Bump LAYOUT when the set of binaries or how they are built changes: the directory name
# changes with it, so an older cache (or an older checkout sharing the cache) keeps its own
# directory instead of both rebuilding each other's in turn.
LAYOUT=2
VERSION_DIR="$CACHE_ROOT/layout$LAYOUT-kubernetes-$KUBE_VERSION-etcd-$ETCD_VERSION-containerd-$CONTAINERD_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$BIN_DIR/VERSIONS"
STAMP_CONTENT="layout=$LAYOUT kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION containerd=$CONTAINERD_VERSION"
# virtctl has a stamp of its own: adding it (or a new KubeVirt release) leaves the cached
# Kubernetes, etcd and containerd binaries alone. Bump VIRTCTL_LAYOUT when main.go or the
# stand-ins in integration/controlplane/virtctl change.
VIRTCTL_LAYOUT=1
VIRTCTL_STAMP="$BIN_DIR/VIRTCTL_VERSION"
VIRTCTL_STAMP_CONTENT="virtctl-layout=$VIRTCTL_LAYOUT kubevirt=$KUBEVIRT_VERSION"
VIRTCTL_SOURCE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/virtctl"
# The k8s.io/kubernetes commands built (all with one `go build`, so shared packages compile once).
KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet kubectl)

log() { echo "controlplane/build.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

# True when the command "$2..." prints the line $1. The output is captured first:
# `cmd | grep -q` can kill cmd with SIGPIPE, which fails the pipeline under pipefail.
reports() {
    local line="$1" out
    shift
    out="$("$@" 2>/dev/null)" || return 1
    grep -qxF "$line" <<<"$out"
}

# True when the cached binaries exist and report the wanted versions.
cached_binaries_match() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] || return 1
    local cmd
    for cmd in "${KUBE_COMMANDS[@]}"; do
        [[ "$cmd" == kubectl ]] && continue
        reports "Kubernetes $KUBE_VERSION" "$BIN_DIR/$cmd" --version || return 1
    done
    reports "Client Version: $KUBE_VERSION" "$BIN_DIR/kubectl" version --client || return 1
    reports "etcd Version: ${ETCD_VERSION#v}" "$BIN_DIR/etcd" --version || return 1
    local containerd_line="containerd github.com/containerd/containerd/v2 $CONTAINERD_VERSION"
    containerd_line+=" module-$CONTAINERD_VERSION"
    reports "$containerd_line" "$BIN_DIR/containerd" --version || return 1
    reports "ctr github.com/containerd/containerd/v2 $CONTAINERD_VERSION" \
        "$BIN_DIR/ctr" --version || return 1
    reports "  Version:  $CONTAINERD_VERSION" "$BIN_DIR/containerd-shim-runc-v2" -v || return 1
}

cached_virtctl_matches() {
    [[ -f "$VIRTCTL_STAMP" && "$(cat "$VIRTCTL_STAMP")" == "$VIRTCTL_STAMP_CONTENT" ]] || return 1
    local out
    out="$("$BIN_DIR/virtctl" version --client 2>/dev/null)" || return 1
    [[ "$out" == *"GitVersion:\"$KUBEVIRT_VERSION\""* ]]
}

gocmd() { nice -n "$NICE" go "$@"; }

check_tools() {
    # The official Go tarball installs to /usr/local/go without touching PATH.
    if ! command -v go >/dev/null && [[ -x /usr/local/go/bin/go ]]; then
        PATH="/usr/local/go/bin:$PATH"
    fi
    command -v go >/dev/null || die "the Go toolchain (go >= 1.26) is not on PATH"
    # GOTOOLCHAIN=local (below) forbids fetching another toolchain, so check the floor here:
    # k8s.io/kubernetes v1.36 and etcd v3.6.16 declare `go 1.26.0`.
    local go_version
    go_version="$(go env GOVERSION)"
    [[ "$go_version" =~ ^go1\.([0-9]+) ]] && ((BASH_REMATCH[1] >= 26)) ||
        die "Go >= 1.26 is needed, found $go_version"
    command -v flock >/dev/null || die "flock (util-linux) is not on PATH"
}

go_environment() {
    # Self-contained module and build caches: measurable and removable as one directory, and
    # independent of the user's Go settings.
    export GOMODCACHE="$CACHE_ROOT/go/mod"
    export GOCACHE="$CACHE_ROOT/go/build"
    export GOTOOLCHAIN=local # never download another toolchain; fail clearly instead
    export CGO_ENABLED=0     # upstream builds these servers, kubelet and the shim without cgo
    export GOFLAGS="-buildvcs=false -mod=mod -p=$JOBS"
    export GOWORK=off
}

# The k8s.io/kubernetes commands (KUBE_COMMANDS).
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0
# and replaces them with ./staging/src/... — replaces that only apply inside that repository.
# The wrapper module redoes those replaces against the published v0.Y.Z modules. The list is
# read from the release's own go.mod, so a new release needs no edit here.
build_kubernetes() {
    [[ "$KUBE_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] ||
        die "KUBE_VERSION must look like v1.Y.Z, got '$KUBE_VERSION'"
    local minor="${BASH_REMATCH[1]}"
    # Kubernetes publishes every staging module k8s.io/<name> as v0.Y.Z for release v1.Y.Z.
    local staging_version="v0.${KUBE_VERSION#v1.}"

    log "kubernetes $KUBE_VERSION: fetching go.mod"
    local gomod
    gomod="$(gocmd mod download -json "k8s.io/kubernetes@$KUBE_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$gomod" ]] || die "go mod download k8s.io/kubernetes@$KUBE_VERSION gave no go.mod"

    # `go mod edit -print` normalises the file: block form "<old> => <new>", or
    # "replace <old> => <new>".
    local staging_modules
    mapfile -t staging_modules < <(gocmd mod edit -print "$gomod" | awk '
        $1 == "replace" && $3 == "=>" && $4 ~ /^\.\/staging\// { print $2; next }
        $2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }')
    [[ " ${staging_modules[*]} " == *" k8s.io/api "* ]] ||
        die "no staging replaces found in $gomod (layout changed?)"
    log "kubernetes $KUBE_VERSION: ${#staging_modules[@]} staging modules -> $staging_version"

    local wrapper="$VERSION_DIR/wrapper-kubernetes"
    mkdir -p "$wrapper"
    cd "$wrapper"
    gocmd mod init kubevirt-rs.invalid/controlplane/kubernetes 2>/dev/null
    local edits=(-require="k8s.io/kubernetes@$KUBE_VERSION") m
    for m in "${staging_modules[@]}"; do
        edits+=(-replace="$m=$m@$staging_version")
    done
    gocmd mod edit "${edits[@]}"
    local packages=() cmd
    for cmd in "${KUBE_COMMANDS[@]}"; do
        packages+=("k8s.io/kubernetes/cmd/$cmd")
    done
    log "kubernetes $KUBE_VERSION: resolving modules"
    gocmd get "${packages[@]/%/@$KUBE_VERSION}"

    # The -X variables of upstream's hack/lib/version.sh: the apiserver reports them on
    # /version and derives its binary (and default emulation) version from them.
    local ldflags="-s -w" pkg
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        ldflags+=" -X $pkg.buildDate=$BUILD_DATE -X $pkg.gitTreeState=clean"
    done
    log "kubernetes $KUBE_VERSION: compiling ${KUBE_COMMANDS[*]} (go build -p $JOBS, nice $NICE)"
    gocmd build -ldflags "$ldflags" -o "$BIN_DIR/" "${packages[@]}"
    log "kubernetes $KUBE_VERSION: done"
}

# etcd: in 3.6 the module go.etcd.io/etcd/server/v3 has the `etcd` main package at its root.
build_etcd() {
    [[ "$ETCD_VERSION" =~ ^v3\.6\.[0-9]+$ ]] ||
        die "ETCD_VERSION must be a v3.6.x tag, got '$ETCD_VERSION'"
    local wrapper="$VERSION_DIR/wrapper-etcd"
    mkdir -p "$wrapper"
    cd "$wrapper"
    gocmd mod init kubevirt-rs.invalid/controlplane/etcd 2>/dev/null
    gocmd mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    log "etcd $ETCD_VERSION: resolving modules"
    gocmd get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    # version.Version is a constant in the source; only the commit is a variable, and the
    # module proxy does not say which commit a tag is, so name the source instead.
    local ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION"
    log "etcd $ETCD_VERSION: compiling"
    gocmd build -ldflags "$ldflags" -o "$BIN_DIR/etcd" go.etcd.io/etcd/server/v3
    log "etcd $ETCD_VERSION: done"
}

# containerd, its runc shim and ctr, with the tags and version variables of containerd's
# Makefile. Without cgo the btrfs snapshotter drops out by itself (its file needs cgo);
# devmapper, zfs and tracing are left out by tag: the cluster uses the overlayfs snapshotter.
build_containerd() {
    [[ "$CONTAINERD_VERSION" =~ ^v2\.[0-9]+\.[0-9]+$ ]] ||
        die "CONTAINERD_VERSION must be a v2.x.y tag, got '$CONTAINERD_VERSION'"
    local module=github.com/containerd/containerd/v2
    local wrapper="$VERSION_DIR/wrapper-containerd"
    mkdir -p "$wrapper"
    cd "$wrapper"
    gocmd mod init kubevirt-rs.invalid/controlplane/containerd 2>/dev/null
    gocmd mod edit -require="$module@$CONTAINERD_VERSION"
    log "containerd $CONTAINERD_VERSION: resolving modules"
    gocmd get "$module/cmd/containerd@$CONTAINERD_VERSION" \
        "$module/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" "$module/cmd/ctr@$CONTAINERD_VERSION"
    local ldflags="-s -w -X $module/version.Version=$CONTAINERD_VERSION"
    ldflags+=" -X $module/version.Revision=module-$CONTAINERD_VERSION -X $module/version.Package=$module"
    log "containerd $CONTAINERD_VERSION: compiling"
    gocmd build -tags "urfave_cli_no_docs no_btrfs no_devmapper no_zfs no_tracing" \
        -ldflags "$ldflags" -o "$BIN_DIR/" "$module/cmd/containerd" "$module/cmd/ctr"
    # The shim, as upstream builds it: no gRPC server (it speaks ttrpc), static.
    gocmd build -tags "urfave_cli_no_docs no_grpc" -ldflags "$ldflags" \
        -o "$BIN_DIR/containerd-shim-runc-v2" "$module/cmd/containerd-shim-runc-v2"
    log "containerd $CONTAINERD_VERSION: done"
}

# virtctl, KubeVirt's command line, for the tests and the demo. kubevirt.io/kubevirt requires its
# staging modules (kubevirt.io/api, kubevirt.io/client-go) at v0.0.0 and replaces them with
# ./staging/...; they are published at the release's version, so the wrapper module redoes the
# replaces against those (and copies the release's other replaces: pinned k8s.io modules).
# integration/controlplane/virtctl/main.go is the root command without `template` and
# `vmexport`, and two modules the proxy does not serve get build-time stand-ins (its README).
build_virtctl() {
    [[ "$KUBEVIRT_VERSION" =~ ^v1\.[0-9]+\.[0-9]+$ ]] ||
        die "KUBEVIRT_VERSION must look like v1.Y.Z, got '$KUBEVIRT_VERSION'"
    log "virtctl $KUBEVIRT_VERSION: fetching go.mod"
    local gomod
    gomod="$(gocmd mod download -json "kubevirt.io/kubevirt@$KUBEVIRT_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
    [[ -f "$gomod" ]] || die "go mod download kubevirt.io/kubevirt@$KUBEVIRT_VERSION gave no go.mod"

    local wrapper="$CACHE_ROOT/wrapper-virtctl-$KUBEVIRT_VERSION"
    rm -rf "$wrapper"
    mkdir -p "$wrapper"
    cd "$wrapper"
    cp "$VIRTCTL_SOURCE/main.go" .
    gocmd mod init kubevirt-rs.invalid/controlplane/virtctl 2>/dev/null
    local edits=(-require="kubevirt.io/kubevirt@$KUBEVIRT_VERSION") old new version
    # `go mod edit -print` lines: "<old> => <new> [<version>]" (block) or "replace <old> => …".
    while read -r old new version; do
        if [[ "$new" == ./staging/* ]]; then
            edits+=(-replace="$old=$old@$KUBEVIRT_VERSION")
        elif [[ -n "$version" ]]; then
            edits+=(-replace="$old=$new@$version")
        fi
    done < <(gocmd mod edit -print "$gomod" | awk '
        $1 == "replace" && $3 == "=>" { print $2, $4, $5; next }
        $2 == "=>" { print $1, $3, $4 }')
    [[ " ${edits[*]} " == *" -replace=kubevirt.io/client-go=kubevirt.io/client-go@"* ]] ||
        die "no staging replaces found in $gomod (layout changed?)"
    local m
    for m in virt-template-api virt-template-client-go; do
        edits+=(-replace="kubevirt.io/$m=$VIRTCTL_SOURCE/unserved/$m")
    done
    gocmd mod edit "${edits[@]}"
    local pkg=kubevirt.io/client-go/version
    local ldflags="-s -w -X $pkg.gitVersion=$KUBEVIRT_VERSION -X $pkg.gitTreeState=clean"
    ldflags+=" -X $pkg.gitCommit=module-$KUBEVIRT_VERSION -X $pkg.buildDate=$BUILD_DATE"
    log "virtctl $KUBEVIRT_VERSION: resolving modules and compiling"
    gocmd build -ldflags "$ldflags" -o "$BIN_DIR/virtctl" .
    echo "$VIRTCTL_STAMP_CONTENT" >"$VIRTCTL_STAMP"
    log "virtctl $KUBEVIRT_VERSION: done"
}

# Runs the builds given as function names side by side (each one is a `go build -p JOBS`; on
# a machine with more cores they overlap, and the long links of one fill the idle cores of
# another). Output goes to stderr as it comes; fails if any of them failed.
build_in_parallel() {
    local pids=() build failed=0
    for build in "$@"; do
        ("$build") &
        pids+=($!)
    done
    local pid
    for pid in "${pids[@]}"; do
        wait "$pid" || failed=1
    done
    ((failed == 0)) || die "a build failed (see the messages above)"
}

main() {
    if cached_binaries_match && cached_virtctl_matches; then
        log "cached: $BIN_DIR ($STAMP_CONTENT $VIRTCTL_STAMP_CONTENT)"
        echo "$BIN_DIR"
        return
    fi
    check_tools
    go_environment

    mkdir -p "$CACHE_ROOT"
    # Several test binaries (or CI and a developer) may ask at once: one builds, others wait.
    exec 9>"$CACHE_ROOT/.build.lock"
    flock 9
    BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    if cached_binaries_match; then
        log "cached: $BIN_DIR ($STAMP_CONTENT)"
    else
        rm -rf "$VERSION_DIR"
        mkdir -p "$BIN_DIR"
        build_in_parallel build_kubernetes build_etcd build_containerd
        echo "$STAMP_CONTENT" >"$STAMP"
        cached_binaries_match ||
            die "built binaries do not report the expected versions ($STAMP_CONTENT)"
        log "built: $BIN_DIR ($STAMP_CONTENT)"
    fi
    if ! cached_virtctl_matches; then
        (build_virtctl) || die "the virtctl build failed (see the messages above)"
        cached_virtctl_matches || die "virtctl does not report $KUBEVIRT_VERSION"
    fi
    echo "$BIN_DIR"
}

# Everything runs from main, so bash has parsed the whole file before it starts: editing the
# script during a (long) build cannot change what the running build executes.
main "$@"
