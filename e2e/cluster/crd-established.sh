#!/usr/bin/env bash
# Wait until every named CRD is Established.
#
# Polled, not `kubectl wait --for=condition=Established`: that fails at once ("error:
# .status.conditions accessor error: <nil> is of the type <nil>") when a CRD that was just
# created has no status yet, which happens when two clusters start at the same moment (make
# test's two sessions).
#
# Usage: crd-established.sh <timeout seconds> <crd/name>... -- <kubectl command...>
set -euo pipefail

timeout="$1"
shift
crds=()
while (($#)) && [[ "$1" != "--" ]]; do
  crds+=("$1")
  shift
done
[[ "${1:-}" == "--" && $# -ge 2 && ${#crds[@]} -ge 1 ]] ||
  { echo "usage: $0 <timeout seconds> <crd/name>... -- <kubectl command...>" >&2; exit 2; }
shift
deadline=$((SECONDS + timeout))
established='{.status.conditions[?(@.type=="Established")].status}'
for crd in "${crds[@]}"; do
  until [[ "$("$@" get "$crd" -o jsonpath="$established" 2>/dev/null || true)" == True ]]; do
    ((SECONDS < deadline)) || { echo "$crd is not Established after ${timeout}s" >&2; exit 1; }
    sleep 0.2
  done
done
