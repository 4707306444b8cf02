#!/usr/bin/env bash
# Build (or reuse) the real node's cluster DNS: CoreDNS (github.com/coredns/coredns) with the
# kubernetes plugin and nothing that forwards (`coredns/` helper module: its own main.go picks
# the plugins). node.sh runs it beside the kubelet, which hands its address to every pod, so
# names such as a LeaderWorkerSet's $(LWS_LEADER_ADDRESS) resolve as on any real cluster.
#
# Same recipe as build.sh: Go modules through the proxy only, -trimpath, CGO off, output cached
# OUTSIDE the clone keyed on the Go version, the recipe and the helper module's files, built into
# `<dir>.partial` and renamed once complete (go-cache.sh).
#
# Usage:
#   e2e/cluster/build-dns.sh              build if needed, print the bin dir last
#   e2e/cluster/build-dns.sh --print-dir  print the bin dir without building
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

DNS_MOD=github.com/coredns/coredns
DNS_VERSION="$(awk -v m="$DNS_MOD" '$1 == m && $2 ~ /^v/ { print $2; exit }
  $1 == "require" && $2 == m && $3 ~ /^v/ { print $3; exit }' "$HERE/coredns/go.mod")"
[[ -n "$DNS_VERSION" ]] || { echo "build-dns.sh: cannot read the $DNS_MOD version from coredns/go.mod" >&2; exit 1; }

GO_VERSION="$(go env GOVERSION)"
KEY="$({
  echo "recipe=$RECIPE go=$GO_VERSION $(go env GOOS)/$(go env GOARCH)"
  cat "$HERE"/coredns/go.mod "$HERE"/coredns/go.sum "$HERE"/coredns/main.go
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/coredns-$DNS_VERSION-$KEY"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

LABEL="dns binaries"
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~3 min on 2 cores" "$HERE/coredns"

# What CoreDNS's Makefile stamps, so -version names the release.
LDFLAGS="-s -w -X $DNS_MOD/coremain.GitCommit=$DNS_VERSION"
go_cache_build coredns "$HERE/coredns" "" "$LDFLAGS" .
go_cache_check_version coredns "CoreDNS-${DNS_VERSION#v}" -version
# One plugin a line (with a `dns.` prefix in some releases); kubernetes must be there, forward
# must not (its absence is what keeps every other name on this machine).
out="$("$STAGE/coredns" -plugins 2>&1)"
plugins=$'\n'"$(sed -E 's/^[[:space:]]*(dns[.])?//; s/[[:space:]]*$//' <<<"$out")"$'\n'
[[ "$plugins" == *$'\n'kubernetes$'\n'* && "$plugins" != *$'\n'forward$'\n'* ]] || {
  echo "build-dns.sh: coredns -plugins should list kubernetes and no forward: $out" >&2
  exit 1
}
go_cache_close coredns
