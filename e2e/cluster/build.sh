#!/usr/bin/env bash
# Build (or reuse) the local control-plane binaries used by `make cluster-up`
# and the pytest `kube_cluster` fixture: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl (k8s/), etcd (etcd/) and kwok + kwokctl (kwok/).
#
# Everything is compiled from Go modules through the module proxy; there is no
# Docker and no prebuilt release download on the machines we run on.  The
# binaries land in a cache directory OUTSIDE the clone, keyed on the Go
# version, the pinned versions and a hash of the helper modules, so a second
# run (or a second clone) reuses them in well under a second.
#
# Usage:
#   e2e/cluster/build.sh            build if needed, print the bin dir last
#   e2e/cluster/build.sh --print-dir  print the bin dir without building
#
# Environment:
#   LLMOP_CLUSTER_CACHE  cache root (default: ${XDG_CACHE_HOME:-~/.cache}/llmop)
#   LLMOP_GO_BUILD_P     `go build -p` (default 2: shared 2-core machines)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Bump when the build recipe (flags, ldflags) changes, so stale caches are not reused.
RECIPE=1

export GOTOOLCHAIN=local # fail loudly instead of fetching another Go toolchain
export CGO_ENABLED=0     # static binaries, no C toolchain needed (as upstream releases)
# readonly: the committed go.mod/go.sum are complete; never rewrite them in the tree.
export GOFLAGS="-mod=readonly -buildvcs=false"

mod_version() { # mod_version <dir> <module>: the version a helper go.mod pins
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$1/go.mod"
}

K8S_VERSION="$(mod_version "$HERE/k8s" k8s.io/kubernetes)"
ETCD_VERSION="$(mod_version "$HERE/etcd" go.etcd.io/etcd/server/v3)"
KWOK_VERSION="$(mod_version "$HERE/kwok" sigs.k8s.io/kwok)"
for v in K8S_VERSION ETCD_VERSION KWOK_VERSION; do
  [[ -n "${!v}" ]] || { echo "build.sh: cannot read $v from the helper go.mod files" >&2; exit 1; }
done

GO_VERSION="$(go env GOVERSION)"
KEY="$({
  echo "recipe=$RECIPE go=$GO_VERSION $(go env GOOS)/$(go env GOARCH)"
  cat "$HERE"/k8s/go.mod "$HERE"/k8s/go.sum "$HERE"/etcd/go.mod "$HERE"/etcd/go.sum \
    "$HERE"/kwok/go.mod "$HERE"/kwok/go.sum
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION-$KEY"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd kwok kwokctl)

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

complete() { [[ -f "$BIN_DIR/.complete" ]]; }

if complete; then
  echo "cluster binaries: reusing $BIN_DIR" >&2
  echo "$BIN_DIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# One builder at a time: `make test` and a pytest session may both get here.
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if complete; then
  echo "cluster binaries: reusing $BIN_DIR (built by a concurrent run)" >&2
  echo "$BIN_DIR"
  exit 0
fi

STAGE="$BIN_DIR.partial"
rm -rf "$STAGE"
mkdir -p "$STAGE"
P="${LLMOP_GO_BUILD_P:-2}"
TIMES="$STAGE/build-times.txt"
echo "# $GO_VERSION, go build -p $P, $(nproc) cores, $(date -u +%FT%TZ)" >"$TIMES"

echo "cluster binaries: building into $BIN_DIR (a cold build takes ~15 min on 2 cores)" >&2

build() { # build <name> <helper dir> <ldflags> <package>
  local name="$1" dir="$2" ldflags="$3" pkg="$4" start end
  start=$(date +%s)
  echo "cluster binaries: go build $name ($pkg)" >&2
  (cd "$dir" && go build -p "$P" -trimpath -ldflags "$ldflags" -o "$STAGE/$name" "$pkg")
  end=$(date +%s)
  echo "$name $((end - start))s" >>"$TIMES"
  echo "cluster binaries: $name done in $((end - start))s" >&2
}

MAJOR="${K8S_VERSION#v}" MAJOR="${MAJOR%%.*}"
MINOR="${K8S_VERSION#v*.}" MINOR="${MINOR%%.*}"
# What k8s's hack/lib/version.sh stamps, so /version reports the real release.
K8S_LDFLAGS="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  K8S_LDFLAGS+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=$MAJOR -X $pkg.gitMinor=$MINOR"
  K8S_LDFLAGS+=" -X $pkg.gitTreeState=clean"
done
# kwokctl picks component flags by Kubernetes version; stamp the one we built.
KWOK_LDFLAGS="-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=${KWOK_VERSION#v}"
KWOK_LDFLAGS+=" -X sigs.k8s.io/kwok/pkg/consts.KubeVersion=${K8S_VERSION#v}"

TOTAL_START=$(date +%s)
for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
  build "$c" "$HERE/k8s" "$K8S_LDFLAGS" "k8s.io/kubernetes/cmd/$c"
done
build etcd "$HERE/etcd" "-s -w" go.etcd.io/etcd/server/v3
build kwok "$HERE/kwok" "$KWOK_LDFLAGS" sigs.k8s.io/kwok/cmd/kwok
build kwokctl "$HERE/kwok" "$KWOK_LDFLAGS" sigs.k8s.io/kwok/cmd/kwokctl
echo "total $(($(date +%s) - TOTAL_START))s" >>"$TIMES"

# Smoke-check that every binary runs and reports the version we pinned. Output is captured
# first: `cmd | grep -q` under pipefail fails at random when grep exits before the writer
# (SIGPIPE, exit 141).
check_version() { # check_version <binary> <expected substring> [args...]
  local bin="$1" want="$2" out
  shift 2
  out="$("$STAGE/$bin" "$@" 2>&1)" || { echo "build.sh: $bin $* failed: $out" >&2; exit 1; }
  [[ "$out" == *"$want"* ]] || { echo "build.sh: $bin reports '$out', expected $want" >&2; exit 1; }
}
check_version kube-apiserver "$K8S_VERSION" --version
check_version kubectl "$K8S_VERSION" version --client
check_version kubelet "$K8S_VERSION" --version
check_version kube-proxy "$K8S_VERSION" --version
check_version etcd "${ETCD_VERSION#v}" --version
check_version kwokctl "" --version
(cd "$STAGE" && du -sh "${BINARIES[@]}") >>"$TIMES"

touch "$STAGE/.complete"
rm -rf "$BIN_DIR"
mv "$STAGE" "$BIN_DIR"
cat "$BIN_DIR/build-times.txt" >&2
echo "$BIN_DIR"
