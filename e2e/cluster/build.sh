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

LABEL="cluster binaries"
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~15 min on 2 cores" "$HERE/k8s" "$HERE/etcd" "$HERE/kwok"

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

for c in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy; do
  go_cache_build "$c" "$HERE/k8s" "" "$K8S_LDFLAGS" "k8s.io/kubernetes/cmd/$c"
done
go_cache_build etcd "$HERE/etcd" "" "-s -w" go.etcd.io/etcd/server/v3
go_cache_build kwok "$HERE/kwok" "" "$KWOK_LDFLAGS" sigs.k8s.io/kwok/cmd/kwok
go_cache_build kwokctl "$HERE/kwok" "" "$KWOK_LDFLAGS" sigs.k8s.io/kwok/cmd/kwokctl

# Smoke-check that every binary runs and reports the version we pinned.
go_cache_check_version kube-apiserver "$K8S_VERSION" --version
go_cache_check_version kubectl "$K8S_VERSION" version --client
go_cache_check_version kubelet "$K8S_VERSION" --version
go_cache_check_version kube-proxy "$K8S_VERSION" --version
go_cache_check_version etcd "${ETCD_VERSION#v}" --version
go_cache_check_version kwokctl "" --version
go_cache_close "${BINARIES[@]}"
