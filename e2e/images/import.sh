#!/usr/bin/env bash
# Import llmop images into a containerd, for the e2e real node (and anyone with a containerd).
# Builds what is missing first (a cache hit costs well under a second per image), then runs
# `ctr -n k8s.io images import` for each image not already present with the same digest, so it
# is idempotent. Images keep the names pods use by default (ghcr.io/llmop/*:<version>,
# localhost/pause:3.10): with imagePullPolicy IfNotPresent or Never nothing is pulled.
#
# Usage: e2e/images/import.sh SOCKET IMAGE...
#   SOCKET  containerd's socket, e.g. /run/llmop-node/containerd/containerd.sock
#   IMAGE   operator | router | engine-sim | engine | engine-cpu | pause | redis | all
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 SOCKET IMAGE...   (IMAGE: operator router engine-sim engine engine-cpu pause redis all)" >&2
  exit 2
fi
socket="$1"
shift
exec python3 "$(dirname "${BASH_SOURCE[0]}")/images.py" import --address "$socket" "$@"
