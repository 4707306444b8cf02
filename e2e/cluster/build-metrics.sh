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

complete() { [[ -f "$BIN_DIR/.complete" ]]; }

if complete; then
  echo "metrics binaries: reusing $BIN_DIR" >&2
  echo "$BIN_DIR"
  exit 0
fi

mkdir -p "$CACHE_ROOT"
# One builder at a time (the same lock as build.sh: two Go builds on 2 cores only slow each other).
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
if complete; then
  echo "metrics binaries: reusing $BIN_DIR (built by a concurrent run)" >&2
  echo "$BIN_DIR"
  exit 0
fi

STAGE="$BIN_DIR.partial"
rm -rf "$STAGE"
mkdir -p "$STAGE"
P="${LLMOP_GO_BUILD_P:-2}"
TIMES="$STAGE/build-times.txt"
echo "# $GO_VERSION, go build -p $P, $(nproc) cores, $(date -u +%FT%TZ)" >"$TIMES"
echo "metrics binaries: building into $BIN_DIR (a cold build takes ~10 min on 2 cores)" >&2

build() { # build <name> <helper dir> <tags> <ldflags> <package>
  local name="$1" dir="$2" tags="$3" ldflags="$4" pkg="$5" start end
  start=$(date +%s)
  echo "metrics binaries: go build $name ($pkg)" >&2
  (cd "$dir" && nice -n 10 go build -p "$P" -trimpath -tags "$tags" -ldflags "$ldflags" -o "$STAGE/$name" "$pkg")
  end=$(date +%s)
  echo "$name $((end - start))s" >>"$TIMES"
  echo "metrics binaries: $name done in $((end - start))s" >&2
}

# What Prometheus's promu stamps, so --version and build_info report the real release.
V=github.com/prometheus/common/version
PROM_LDFLAGS="-s -w -X $V.Version=$PROM_VERSION -X $V.Branch=HEAD -X $V.BuildUser=llmop -X $V.Revision=$PROM_MOD_VERSION"
ADAPTER_LDFLAGS="-s -w"

TOTAL_START=$(date +%s)
build prometheus "$HERE/prometheus" "$PROM_TAGS" "$PROM_LDFLAGS" github.com/prometheus/prometheus/cmd/prometheus
build promtool "$HERE/prometheus" "$PROM_TAGS" "$PROM_LDFLAGS" github.com/prometheus/prometheus/cmd/promtool
build prometheus-adapter "$HERE/prometheus-adapter" "" "$ADAPTER_LDFLAGS" sigs.k8s.io/prometheus-adapter/cmd/adapter
echo "total $(($(date +%s) - TOTAL_START))s" >>"$TIMES"

# Smoke-check: output captured first (no `cmd | grep -q` under pipefail).
check_version() { # check_version <binary> <expected substring> [args...]
  local bin="$1" want="$2" out
  shift 2
  out="$("$STAGE/$bin" "$@" 2>&1)" || { echo "build-metrics.sh: $bin $* failed: $out" >&2; exit 1; }
  [[ "$out" == *"$want"* ]] || { echo "build-metrics.sh: $bin reports '$out', expected $want" >&2; exit 1; }
}
check_version prometheus "version $PROM_VERSION" --version
check_version promtool "version $PROM_VERSION" --version
# The adapter has no --version; its --help lists its flags but exits 2 (pflag: help requested).
out="$("$STAGE/prometheus-adapter" --help 2>&1 || true)"
[[ "$out" == *"--prometheus-url"* ]] || { echo "build-metrics.sh: prometheus-adapter --help: $out" >&2; exit 1; }
(cd "$STAGE" && du -sh prometheus promtool prometheus-adapter) >>"$TIMES"

touch "$STAGE/.complete"
rm -rf "$BIN_DIR"
mv "$STAGE" "$BIN_DIR"
cat "$BIN_DIR/build-times.txt" >&2
echo "$BIN_DIR"
