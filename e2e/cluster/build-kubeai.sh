#!/usr/bin/env bash
# Build (or reuse) KubeAI v0.22.1's manager for `make bench-vs-kubeai`: the binary as shipped
# (`kubeai-manager`), the same source with its Model controller given 16 workers
# (`kubeai-manager-c16`, a one-line patch the bench labels as patched), and the Model CRD
# (`config/kubeai.org_models.yaml`; the chart's copy is Helm-templated). Not a test
# prerequisite: only the side-by-side benchmark runs KubeAI.
#
# Source: the Go module github.com/kubeai-project/kubeai@v0.22.1 through the Go module proxy;
# where the proxy refuses it (it did on this project's machines on 2026-11-29), KUBEAI_SRC names a
# checkout of the v0.22.1 tag (commit f442a2cd), whose Chart.yaml must say appVersion v0.22.1.
# Its dependencies always come from the proxy, pinned by its own go.sum. Same cache recipe as
# build.sh (go-cache.sh): -trimpath, CGO off, built into `<dir>.partial` under the machine-wide
# build lock, keyed on the Go version, this recipe, the patch and the source's go.mod/go.sum.
#
# Usage:
#   e2e/cluster/build-kubeai.sh              build if needed, print the bin dir last
#
# Environment:
#   KUBEAI_SRC           a v0.22.1 checkout, used when the module proxy refuses the module
#   LLMOP_CLUSTER_CACHE  cache root (default: ${XDG_CACHE_HOME:-~/.cache}/llmop)
#   LLMOP_GO_BUILD_P     `go build -p` (default 2: shared 2-core machines)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# Bump when the build recipe (flags, patch, copied files) changes, so stale caches are not reused.
RECIPE=1

export GOTOOLCHAIN=local
export CGO_ENABLED=0
export GOFLAGS="-mod=readonly -buildvcs=false"

KUBEAI_MOD=github.com/kubeai-project/kubeai
KUBEAI_VERSION=v0.22.1
CONTROLLER=internal/modelcontroller/model_controller.go

LABEL="kubeai manager"
SRC=""
if json="$(go mod download -json "$KUBEAI_MOD@$KUBEAI_VERSION" 2>/dev/null)"; then
  SRC="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
fi
if [[ -z "$SRC" ]]; then
  if [[ -z "${KUBEAI_SRC:-}" ]]; then
    cat >&2 <<EOF
$LABEL: the Go module proxy does not serve $KUBEAI_MOD@$KUBEAI_VERSION here.
  Set KUBEAI_SRC to a checkout of KubeAI's $KUBEAI_VERSION tag (commit f442a2cd) and run again;
  its dependencies still come from the module proxy.
EOF
    exit 2
  fi
  SRC="$(cd "$KUBEAI_SRC" && pwd)"
  chart="$(cat "$SRC/charts/kubeai/Chart.yaml" 2>/dev/null || true)"
  [[ "$chart" == *"appVersion: \"$KUBEAI_VERSION\""* ]] || {
    echo "$LABEL: $SRC/charts/kubeai/Chart.yaml does not say appVersion \"$KUBEAI_VERSION\"" >&2
    exit 2
  }
  echo "$LABEL: the module proxy refused $KUBEAI_MOD@$KUBEAI_VERSION; building $SRC" >&2
fi

# The 16-worker patch: controller-runtime's default is one Model reconcile at a time, each
# sleeping 3 s after it creates a pod (../shared/reference/kubeai-bench.md).
PATCH_FROM='return ctrl.NewControllerManagedBy(mgr).'
PATCH_TO='return ctrl.NewControllerManagedBy(mgr).WithOptions(controller.Options{MaxConcurrentReconciles: 16}).'
PATCH_IMPORT='"sigs.k8s.io/controller-runtime/pkg/controller"'

GO_VERSION="$(go env GOVERSION)"
KEY="$({
  echo "recipe=$RECIPE go=$GO_VERSION $(go env GOOS)/$(go env GOARCH) $PATCH_TO"
  cat "$SRC/go.mod" "$SRC/go.sum" "$SRC/$CONTROLLER"
} | sha256sum | cut -c1-12)"
CACHE_ROOT="${LLMOP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/llmop}"
BIN_DIR="$CACHE_ROOT/kubeai-$KUBEAI_VERSION-$KEY"

GO_CACHE_NICE=10
# shellcheck source=e2e/cluster/go-cache.sh
source "$HERE/go-cache.sh"
go_cache_open "~6-8 min on 2 cores" "$SRC"

# A writable copy: the module cache is read-only, and the patch edits one file.
cp -r "$SRC" "$STAGE/src"
chmod -R u+w "$STAGE/src"
go_cache_build kubeai-manager "$STAGE/src" "" "-s -w" ./cmd

controller_go="$STAGE/src/$CONTROLLER"
source_text="$(cat "$controller_go")"
[[ "$source_text" == *"$PATCH_FROM"* ]] || {
  echo "$LABEL: $CONTROLLER no longer contains '$PATCH_FROM'" >&2
  exit 1
}
sed -i "s|$PATCH_FROM|$PATCH_TO|; s|^\t\"sigs.k8s.io/controller-runtime/pkg/client\"$|\t$PATCH_IMPORT\n&|" "$controller_go"
patched="$(cat "$controller_go")"
[[ "$patched" == *"$PATCH_TO"* && "$patched" == *"$PATCH_IMPORT"* ]] || {
  echo "$LABEL: the 16-worker patch did not apply to $CONTROLLER" >&2
  exit 1
}
go_cache_build kubeai-manager-c16 "$STAGE/src" "" "-s -w" ./cmd

mkdir -p "$STAGE/config"
cp "$SRC/manifests/crds/kubeai.org_models.yaml" "$STAGE/config/"
chmod u+w "$STAGE/config/kubeai.org_models.yaml"
rm -rf "$STAGE/src"
go_cache_close kubeai-manager kubeai-manager-c16 config
