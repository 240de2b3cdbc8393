#!/usr/bin/env bash
# Builds (once, then cached) the Kubernetes control plane used by the integration tests:
# kube-apiserver and kube-controller-manager from the k8s.io/kubernetes Go module, and etcd
# from go.etcd.io/etcd/server/v3. No binary downloads: only the Go module proxy is used.
#
# Usage: integration/controlplane/build.sh
#   stdout: one line, the directory holding kube-apiserver, kube-controller-manager and etcd.
#   stderr: progress.
#
# Environment (all optional):
#   KUBE_VERSION                 k8s.io/kubernetes release (default below)
#   ETCD_VERSION                 go.etcd.io/etcd/server/v3 release (default below)
#   KUBEVIRT_RS_CONTROLPLANE_CACHE  cache root
#                                (default ${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/controlplane)
#   CONTROLPLANE_BUILD_JOBS      go build -p value (default 2: the dev machines are shared)
#   CONTROLPLANE_NICE            nice level for the go commands (default 19)
set -euo pipefail

KUBE_VERSION="${KUBE_VERSION:-v1.36.3}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
CACHE_ROOT="${KUBEVIRT_RS_CONTROLPLANE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kubevirt-rs/controlplane}"
JOBS="${CONTROLPLANE_BUILD_JOBS:-2}"
NICE="${CONTROLPLANE_NICE:-19}"

log() { echo "controlplane/build.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

[[ "$KUBE_VERSION" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "KUBE_VERSION must look like v1.Y.Z, got '$KUBE_VERSION'"
KUBE_MINOR="${BASH_REMATCH[1]}"
# Kubernetes publishes every staging module k8s.io/<name> with tag v0.Y.Z for release v1.Y.Z.
STAGING_VERSION="v0.${KUBE_VERSION#v1.}"
[[ "$ETCD_VERSION" =~ ^v3\.6\.[0-9]+$ ]] || die "ETCD_VERSION must be a v3.6.x tag, got '$ETCD_VERSION'"

command -v go >/dev/null || die "the Go toolchain (go) is not on PATH"
command -v flock >/dev/null || die "flock (util-linux) is not on PATH"

VERSION_DIR="$CACHE_ROOT/kubernetes-$KUBE_VERSION-etcd-$ETCD_VERSION"
BIN_DIR="$VERSION_DIR/bin"
STAMP="$BIN_DIR/VERSIONS"
STAMP_CONTENT="kubernetes=$KUBE_VERSION etcd=$ETCD_VERSION"

# The cache is self-contained (its own module and build caches) so it can be measured and
# removed as one directory, and so it does not depend on the user's Go settings.
export GOMODCACHE="$CACHE_ROOT/go/mod"
export GOCACHE="$CACHE_ROOT/go/build"
export GOTOOLCHAIN=local        # never download another toolchain; fail clearly instead
export CGO_ENABLED=0            # upstream builds these three servers without cgo
export GOFLAGS="-buildvcs=false -mod=mod -p=$JOBS"
export GOWORK=off

# True when the cached binaries exist and report the wanted versions.
cached_binaries_match() {
    [[ -f "$STAMP" && "$(cat "$STAMP")" == "$STAMP_CONTENT" ]] || return 1
    local b
    for b in kube-apiserver kube-controller-manager etcd; do
        [[ -x "$BIN_DIR/$b" ]] || return 1
    done
    # Output captured first: `cmd | grep -q` can kill cmd with SIGPIPE, failing under pipefail.
    reports "$BIN_DIR/kube-apiserver" "Kubernetes $KUBE_VERSION" || return 1
    reports "$BIN_DIR/kube-controller-manager" "Kubernetes $KUBE_VERSION" || return 1
    reports "$BIN_DIR/etcd" "etcd Version: ${ETCD_VERSION#v}" || return 1
}

# True when `$1 --version` prints the line $2.
reports() {
    local out
    out="$("$1" --version 2>/dev/null)" || return 1
    grep -qxF "$2" <<<"$out"
}

if cached_binaries_match; then
    log "cached: $BIN_DIR ($STAMP_CONTENT)"
    echo "$BIN_DIR"
    exit 0
fi

mkdir -p "$CACHE_ROOT"
# Several test binaries (or CI and a developer) may ask at once: one builds, the others wait.
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if cached_binaries_match; then
    log "cached (built by a concurrent run): $BIN_DIR"
    echo "$BIN_DIR"
    exit 0
fi

gocmd() { nice -n "$NICE" go "$@"; }

rm -rf "$VERSION_DIR"
mkdir -p "$BIN_DIR"
BUILD_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)"

# ---- kube-apiserver, kube-controller-manager --------------------------------------------
# k8s.io/kubernetes requires its staging modules (k8s.io/api, k8s.io/apiserver, ...) at v0.0.0
# and replaces them with ./staging/src/... — replaces that only apply inside that repository.
# The wrapper module redoes those replaces against the published v0.Y.Z modules. The list is
# read from the release's own go.mod, so a new release needs no edit here.
log "kubernetes $KUBE_VERSION: fetching go.mod"
KUBE_GOMOD="$(gocmd mod download -json "k8s.io/kubernetes@$KUBE_VERSION" \
    | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
[[ -f "$KUBE_GOMOD" ]] || die "go mod download k8s.io/kubernetes@$KUBE_VERSION gave no go.mod"

# `go mod edit -print` normalises the file: block form "<old> => <new>" or "replace <old> => <new>".
mapfile -t STAGING_MODULES < <(gocmd mod edit -print "$KUBE_GOMOD" | awk '
    $1 == "replace" && $3 == "=>" && $4 ~ /^\.\/staging\// { print $2; next }
    $2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }')
[[ " ${STAGING_MODULES[*]} " == *" k8s.io/api "* ]] \
    || die "no staging replaces found in $KUBE_GOMOD (layout changed?)"
log "kubernetes $KUBE_VERSION: ${#STAGING_MODULES[@]} staging modules -> $STAGING_VERSION"

KUBE_WRAPPER="$VERSION_DIR/wrapper-kubernetes"
mkdir -p "$KUBE_WRAPPER"
(
    cd "$KUBE_WRAPPER"
    gocmd mod init kubevirt-rs.invalid/controlplane/kubernetes >/dev/null 2>&1
    edits=(-require="k8s.io/kubernetes@$KUBE_VERSION")
    for m in "${STAGING_MODULES[@]}"; do
        edits+=(-replace="$m=$m@$STAGING_VERSION")
    done
    gocmd mod edit "${edits[@]}"
    log "kubernetes $KUBE_VERSION: resolving modules"
    gocmd get "k8s.io/kubernetes/cmd/kube-apiserver@$KUBE_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@$KUBE_VERSION"
    # Same -X variables as upstream hack/lib/version.sh; the apiserver reports them on /version
    # and derives its binary/emulation version from them.
    ldflags="-s -w"
    for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
        ldflags+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$KUBE_MINOR"
        ldflags+=" -X $pkg.buildDate=$BUILD_DATE -X $pkg.gitTreeState=clean"
    done
    log "kubernetes $KUBE_VERSION: compiling (go build -p $JOBS, nice $NICE)"
    gocmd build -ldflags "$ldflags" -o "$BIN_DIR/" \
        k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
)

# ---- etcd --------------------------------------------------------------------------------
# In etcd 3.6 the module go.etcd.io/etcd/server/v3 has the `etcd` main package at its root.
ETCD_WRAPPER="$VERSION_DIR/wrapper-etcd"
mkdir -p "$ETCD_WRAPPER"
(
    cd "$ETCD_WRAPPER"
    gocmd mod init kubevirt-rs.invalid/controlplane/etcd >/dev/null 2>&1
    gocmd mod edit -require="go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    log "etcd $ETCD_VERSION: resolving modules"
    gocmd get "go.etcd.io/etcd/server/v3@$ETCD_VERSION"
    # version.Version is a constant in the source; only the commit is a variable, and the
    # module proxy does not tell us the commit, so say where the build came from instead.
    ldflags="-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=module-$ETCD_VERSION"
    log "etcd $ETCD_VERSION: compiling"
    gocmd build -ldflags "$ldflags" -o "$BIN_DIR/etcd" go.etcd.io/etcd/server/v3
)

echo "$STAMP_CONTENT" >"$STAMP"
cached_binaries_match || die "built binaries do not report the expected versions ($STAMP_CONTENT)"
log "built: $BIN_DIR ($STAMP_CONTENT)"
echo "$BIN_DIR"
