#!/usr/bin/env bash
# Build (or reuse) the metrics pipeline's binaries: prometheus and promtool
# (prometheus/ helper module) and prometheus-adapter (prometheus-adapter/).
# Used by `make metrics-binaries`, `cluster.sh up` (the pipeline beside the
# real node) and the promtool rule tests (tests/chart/test_alert_rules.py).
#
# Same recipe as build.sh: Go modules through the module proxy only, one helper
# module per upstream, -trimpath, CGO off, output cached OUTSIDE the clone keyed
# on the Go version and the helper go.mod/go.sum, built into `<dir>.partial`
# and renamed once complete. Kept apart from build.sh so that bumping one
# never rebuilds the other's (much larger) set.
#
# Prometheus is built WITHOUT its web UI: the React assets need npm and a
# pnpm build (web/ui/build_ui.sh), which we cannot run here, so the
# `builtinassets` tag is left out; the HTTP API (/api/v1/*), /metrics and
# /-/ready work, the UI pages answer with an error. Service discovery is cut to
# Kubernetes (`remove_all_sd,enable_kubernetes_sd`): the scrape config uses
# only kubernetes_sd_configs, and the other SD plugins pull in modules the
# proxy does not serve (hashicorp/nomad/api).
#
# Usage:
#   e2e/cluster/build-metrics.sh              build if needed, print the bin dir last
#   e2e/cluster/build-metrics.sh --print-dir  print the bin dir without building
#
# Environment:
#   LLMOP_CLUSTER_CACHE  cache root (default: ${XDG_CACHE_HOME:-~/.cache}/llmop)
#   LLMOP_GO_BUILD_P     `go build -p` (default 2: shared 2-core machines)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Bump when the build recipe (flags, tags, ldflags) changes, so stale caches are not reused.
RECIPE=1

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"

mod_version() { # mod_version <dir> <module>: the version a helper go.mod pins
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }
                 $1 == "require" && $2 == m && $3 ~ /^v/ { print $3; exit }' "$1/go.mod"
}

PROM_MOD_VERSION="$(mod_version "$HERE/prometheus" github.com/prometheus/prometheus)"
ADAPTER_VERSION="$(mod_version "$HERE/prometheus-adapter" sigs.k8s.io/prometheus-adapter)"
for v in PROM_MOD_VERSION ADAPTER_VERSION; do
  [[ -n "${!v}" ]] || { echo "build-metrics.sh: cannot read $v from the helper go.mod files" >&2; exit 1; }
done
# Go module v0.316.0 is Prometheus release 3.16.0.
PROM_VERSION="${PROM_MOD_VERSION#v0.}"
PROM_VERSION="3.${PROM_VERSION:1:2}.${PROM_VERSION#*.}"
PROM_TAGS="netgo,remove_all_sd,enable_kubernetes_sd"

GO_VERSION="$(go env GOVERSION)"
KEY="$({
  echo "recipe=$RECIPE go=$GO_VERSION $(go env GOOS)/$(go env GOARCH) tags=$PROM_TAGS"
  cat "$HERE"/prometheus/go.mod "$HERE"/prometheus/go.sum \
    "$HERE"/prometheus-adapter/go.mod "$HERE"/prometheus-adapter/go.sum
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/metrics-prometheus-$PROM_VERSION-adapter-$ADAPTER_VERSION-$KEY"

if [[ "${1:-}" == "--print-dir" ]]; then
  echo "$BIN_DIR"
  exit 0
fi

LABEL="metrics binaries"
GO_CACHE_NICE=10
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~18 min on 2 cores" "$HERE/prometheus" "$HERE/prometheus-adapter"

# What Prometheus's promu stamps, so --version and build_info report the real release.
V=github.com/prometheus/common/version
PROM_LDFLAGS="-s -w -X $V.Version=$PROM_VERSION -X $V.Branch=HEAD -X $V.BuildUser=llmop -X $V.Revision=$PROM_MOD_VERSION"
ADAPTER_LDFLAGS="-s -w"

go_cache_build prometheus "$HERE/prometheus" "$PROM_TAGS" "$PROM_LDFLAGS" github.com/prometheus/prometheus/cmd/prometheus
go_cache_build promtool "$HERE/prometheus" "$PROM_TAGS" "$PROM_LDFLAGS" github.com/prometheus/prometheus/cmd/promtool
go_cache_build prometheus-adapter "$HERE/prometheus-adapter" "" "$ADAPTER_LDFLAGS" sigs.k8s.io/prometheus-adapter/cmd/adapter

# Smoke-check that every binary runs and reports the version we pinned.
go_cache_check_version prometheus "version $PROM_VERSION" --version
go_cache_check_version promtool "version $PROM_VERSION" --version
# The adapter has no --version; its --help lists its flags but exits 2 (pflag: help requested).
out="$("$STAGE/prometheus-adapter" --help 2>&1 || true)"
[[ "$out" == *"--prometheus-url"* ]] || { echo "build-metrics.sh: prometheus-adapter --help: $out" >&2; exit 1; }
go_cache_close prometheus promtool prometheus-adapter
