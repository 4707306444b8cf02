#!/usr/bin/env bash
# Build (or reuse) the LeaderWorkerSet controller manager (sigs.k8s.io/lws, `lws/` helper
# module) and copy out what running it beside a local API server needs: the CRD YAML
# (LeaderWorkerSet and DisaggregatedSet, whose controller the same manager runs) and the
# webhook manifests. Used by `make lws-binaries` (a prerequisite of `make test`), `make dev`
# and `cluster.sh up`, which starts it with ../lws/lws.sh.
#
# v0.9.0 because it is the newest release the Go module proxy serves here (v0.10.0's zip is
# refused). Same recipe as build.sh: Go modules through the proxy only, -trimpath, CGO off,
# output cached OUTSIDE the clone keyed on the Go version, the recipe and the helper
# go.mod/go.sum, built into `<dir>.partial` and renamed once complete (go-cache.sh).
#
# Usage:
#   e2e/cluster/build-lws.sh              build if needed, print the bin dir last
#   e2e/cluster/build-lws.sh --print-dir  print the bin dir without building
#
# Environment:
#   LLMOP_CLUSTER_CACHE  cache root (default: ${XDG_CACHE_HOME:-~/.cache}/llmop)
#   LLMOP_GO_BUILD_P     `go build -p` (default 2: shared 2-core machines)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Bump when the build recipe (flags, copied files) changes, so stale caches are not reused.
RECIPE=1

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"

LWS_MOD=sigs.k8s.io/lws
LWS_VERSION="$(awk -v m="$LWS_MOD" '$1 == m && $2 ~ /^v/ { print $2; exit }
  $1 == "require" && $2 == m && $3 ~ /^v/ { print $3; exit }' "$HERE/lws/go.mod")"
[[ -n "$LWS_VERSION" ]] || { echo "build-lws.sh: cannot read the $LWS_MOD version from lws/go.mod" >&2; exit 1; }

GO_VERSION="$(go env GOVERSION)"
KEY="$({
  echo "recipe=$RECIPE go=$GO_VERSION $(go env GOOS)/$(go env GOARCH)"
  cat "$HERE"/lws/go.mod "$HERE"/lws/go.sum
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/lws-$LWS_VERSION-$KEY"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

LABEL="lws binaries"
GO_CACHE_NICE=10
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~3-4 min on 2 cores" "$HERE/lws"

# What the upstream Makefile stamps, so --version and the startup log name the release.
V=sigs.k8s.io/lws/pkg/version
LDFLAGS="-s -w -X $V.GitVersion=$LWS_VERSION -X $V.GitCommit=$LWS_VERSION -X $V.BuildDate=module-proxy"
go_cache_build lws-manager "$HERE/lws" "" "$LDFLAGS" "$LWS_MOD/cmd"
go_cache_check_version lws-manager "Version: $LWS_VERSION" --version

# The manifests come from the same module version as the binary: `go list` names its directory.
MOD_DIR="$(cd "$HERE/lws" && go list -m -f '{{.Dir}}' "$LWS_MOD")"
mkdir -p "$STAGE/config"
for f in config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml \
  config/crd/bases/disaggregatedset.x-k8s.io_disaggregatedsets.yaml \
  config/webhook/manifests.yaml config/webhook/mutating-patch.yaml config/webhook/validating-patch.yaml; do
  cp "$MOD_DIR/$f" "$STAGE/config/${f##*/}"
done
chmod u+w "$STAGE"/config/*
go_cache_close lws-manager config
