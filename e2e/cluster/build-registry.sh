#!/usr/bin/env bash
# Build (or reuse) the loopback OCI registry of `make bench-coldstart` (`registry/`: a small main
# around github.com/google/go-containerregistry's registry package, plus a `push` of an OCI
# archive). The real node's containerd pulls from it over plain HTTP, so a start can pay a real
# image pull on a machine that reaches no registry. Not a test prerequisite: only the cold-start
# bench runs it.
#
# Same recipe as build.sh: Go modules through the proxy only, -trimpath, CGO off, output cached
# OUTSIDE the clone keyed on the Go version, the recipe and the helper module's files, built into
# `<dir>.partial` and renamed once complete (go-cache.sh).
#
# Usage:
#   e2e/cluster/build-registry.sh              build if needed, print the bin dir last
#   e2e/cluster/build-registry.sh --print-dir  print the bin dir without building
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

GO_VERSION="$(go env GOVERSION)"
KEY="$({
  echo "recipe=$RECIPE go=$GO_VERSION $(go env GOOS)/$(go env GOARCH)"
  cat "$HERE"/registry/go.mod "$HERE"/registry/go.sum "$HERE"/registry/main.go
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/registry-$KEY"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

LABEL="registry binary"
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~1 min on 2 cores" "$HERE/registry"
go_cache_build registry "$HERE/registry" "" "-s -w" .
go_cache_check_version registry "go-containerregistry" version
go_cache_close registry
