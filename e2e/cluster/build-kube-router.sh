#!/usr/bin/env bash
# Build (or reuse) kube-router (github.com/cloudnativelabs/kube-router/v2, `kube-router/` helper
# module), run by the e2e tests with only its NetworkPolicy controller on (`--run-firewall`, no
# routing, no service proxy): kube-proxy enforces no NetworkPolicy, and this one works beside the
# real node's bridge CNI with what its kernel has (iptables, ipset, physdev; tests/support/
# netpol_enforcer.py). kube-network-policies, the SIG's own, needs nftables' `queue`, which the
# machine's kernel lacks (CONFIG_NFT_QUEUE unset).
#
# v2.1.0 because it is the only release the Go module proxy serves here. It is a test tool on a
# throwaway local node, never shipped: the reported flaws of that release do not reach users.
# Same recipe as build-lws.sh: Go modules through the proxy only, -trimpath, CGO off, output
# cached OUTSIDE the clone keyed on the Go version, the recipe and the helper go.mod/go.sum,
# built into `<dir>.partial` and renamed once complete (go-cache.sh).
#
# Usage:
#   e2e/cluster/build-kube-router.sh              build if needed, print the bin dir last
#   e2e/cluster/build-kube-router.sh --print-dir  print the bin dir without building
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

MOD=github.com/cloudnativelabs/kube-router/v2
VERSION="$(awk -v m="$MOD" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$HERE/kube-router/go.mod")"
[[ -n "$VERSION" ]] || { echo "build-kube-router.sh: cannot read the $MOD version from kube-router/go.mod" >&2; exit 1; }

KEY="$({
  echo "recipe=$RECIPE go=$(go env GOVERSION) $(go env GOOS)/$(go env GOARCH)"
  cat "$HERE"/kube-router/go.mod "$HERE"/kube-router/go.sum
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/kube-router-$VERSION-$KEY"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

LABEL="kube-router binary"
GO_CACHE_NICE=10
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~1-2 min on 2 cores" "$HERE/kube-router"

# What the upstream Makefile stamps, so `kube-router --version` names the release.
V=github.com/cloudnativelabs/kube-router/v2/pkg/version
LDFLAGS="-s -w -X $V.Version=$VERSION -X $V.BuildDate=module-proxy"
go_cache_build kube-router "$HERE/kube-router" "" "$LDFLAGS" "$MOD/cmd/kube-router"
go_cache_check_version kube-router "$VERSION" --version
go_cache_close kube-router
